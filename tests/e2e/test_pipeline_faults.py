"""The harness's fault controls (kill / start / stall / resume / restart the Collector) on a
pipeline of its own, so the shared session pipeline is never disturbed."""

from __future__ import annotations

import threading
import uuid

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from pipeline import Pipeline


def _send(p: Pipeline, service: str, rollout_id: str) -> bool:
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    exporter = OTLPSpanExporter(endpoint=p.otlp_grpc_endpoint, insecure=True, timeout=30)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    try:
        with provider.get_tracer("e2e").start_as_current_span(
            "gym.rollout", attributes={"gym.kind": "rollout", "gym.rollout.id": rollout_id}
        ):
            pass
        return provider.force_flush(40_000)
    finally:
        provider.shutdown()


def test_kill_stall_resume_restart(pipeline: Pipeline, tmp_path) -> None:
    # `pipeline` only for its checks (binary present, e2e marker); this test runs its own.
    service = f"e2e-faults-{uuid.uuid4().hex[:8]}"
    with Pipeline(decision_wait="1s", sample_percent=100, workdir=tmp_path) as p:
        p.kill_collector()
        assert not p.collector_running
        p.start_collector()
        assert _send(p, service, "after-kill")
        p.wait_for_traces(service, {"gym.rollout.id": "after-kill"})

        # Stalled: the port accepts connections but nothing is read; the export completes
        # only after resume.
        p.stall_collector()
        result: list[bool] = []
        sender = threading.Thread(target=lambda: result.append(_send(p, service, "stalled")))
        sender.start()
        sender.join(2.0)
        assert sender.is_alive(), "export finished while the Collector was stopped"
        p.resume_collector()
        sender.join(40)
        assert result == [True]
        p.wait_for_traces(service, {"gym.rollout.id": "stalled"})

        p.restart_collector()
        assert _send(p, service, "after-restart")
        p.wait_for_traces(service, {"gym.rollout.id": "after-restart"})
    assert not p.collector_running
