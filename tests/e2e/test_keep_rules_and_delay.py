"""What the Collector keeps and how soon, and what ``gymtrace tree --jaeger`` reads back.

Spans are written with the plain OpenTelemetry SDK in the shapes gymtrace produces (so the rules
are tested on their own): the run trace, outcome records (``gym.outcome`` spans) saying unscored or
retried, and a link whose relation only Jaeger's v3 API reports.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace as trace_api
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from child_process import run_gymtrace
from gymtrace import _constants as c
from gymtrace._read.jaeger import JaegerClient
from pipeline import JAEGER_BIN, OTELCOL_BIN, Pipeline

KIND_OUTCOME = c.KIND_OUTCOME
SPAN_OUTCOME = c.SPAN_OUTCOME


def _provider(pipeline: Pipeline, service: str) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    exporter = OTLPSpanExporter(endpoint=pipeline.otlp_grpc_endpoint, insecure=True, timeout=10)
    # The export delay gymtrace uses (500 ms), so measured delays are what users see.
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=500))
    return provider


def _rollout_with_record(
    tracer: trace_api.Tracer,
    rollout_id: str,
    *,
    record: dict[str, object] | None,
    root: dict[str, object] | None = None,
    task: dict[str, object] | None = None,
) -> str:
    """A clean, scored rollout (kept by no rollout rule) and optionally an outcome record in its
    trace, linked to the episode it concludes; the trace ID in hex."""
    identity = {c.RUN_ID: "keep-rules", c.TASK_ID: "t", c.ROLLOUT_ID: rollout_id, c.ROLLOUT_REPEAT: 0}
    with tracer.start_as_current_span(
        "gym.rollout",
        attributes={
            **identity,
            c.KIND: "rollout",
            c.ROLLOUT_OUTCOME: "scored",
            c.ROLLOUT_ATTEMPTS: 1,
            **(root or {}),
        },
    ) as rollout:
        with tracer.start_as_current_span(
            "gym.episode", attributes={**identity, c.KIND: "episode", c.EPISODE_ATTEMPT: 0}
        ) as episode:
            if task is not None:
                with tracer.start_as_current_span("ray.task play", attributes={**identity, **task}):  # type: ignore[arg-type]
                    pass
        if record is not None:
            link = trace_api.Link(episode.get_span_context(), {c.LINK_RELATION: c.RELATION_OUTCOME})
            attributes = {**identity, c.KIND: KIND_OUTCOME, c.EPISODE_ATTEMPT: 0, **record}
            with tracer.start_as_current_span(SPAN_OUTCOME, links=[link], attributes=attributes):  # type: ignore[arg-type]
                pass
    return format(rollout.get_span_context().trace_id, "032x")


def test_outcome_records_saying_unscored_or_retried_keep_their_rollout(pipeline: Pipeline) -> None:
    service = f"keep-{uuid.uuid4().hex[:8]}"
    provider = _provider(pipeline, service)
    tracer = provider.get_tracer("gymtrace.e2e")
    unscored = _rollout_with_record(
        tracer, "r-unscored", record={c.ROLLOUT_OUTCOME: "unscored", c.ROLLOUT_ATTEMPTS: 1}
    )
    retried = _rollout_with_record(
        tracer, "r-retried", record={c.ROLLOUT_OUTCOME: "scored", c.REWARD: 1.0, c.ROLLOUT_ATTEMPTS: 2}
    )
    scored = _rollout_with_record(
        tracer, "r-scored", record={c.ROLLOUT_OUTCOME: "scored", c.REWARD: 1.0, c.ROLLOUT_ATTEMPTS: 1}
    )
    plain = _rollout_with_record(tracer, "r-plain", record=None)
    # Issue 25: a rollout awaiting its outcome from another process, and one in which Ray re-ran a
    # task, are kept too (the record that concludes the first must find its trace).
    pending = _rollout_with_record(tracer, "r-pending", record=None, root={c.ROLLOUT_OUTCOME: "pending"})
    rerun = _rollout_with_record(tracer, "r-rerun", record=None, task={c.RAY_TASK_ATTEMPT: 1})
    provider.shutdown()
    kept = pipeline.wait_for_traces(service, count=4, timeout=30)
    time.sleep(4)  # past the drop decisions of the other two (decision_wait 2s + a tick)
    stored = {t["traceID"].rjust(32, "0"): len(t["spans"]) for t in pipeline.find_traces(service)}
    assert stored == {unscored: 3, retried: 3, pending: 2, rerun: 3}, (kept, scored, plain)

    # The reader takes the link relation from Jaeger's v3 API: an outcome link is not a "retry".
    tree = run_gymtrace("tree", "--jaeger", pipeline.query_url, "--trace", unscored, check=True).stdout
    assert "gym.outcome" in tree and "<-outcome" in tree and "<-retry" not in tree, tree
    spans = JaegerClient(pipeline.query_url).trace(unscored)
    (record,) = [s for s in spans if s.name == SPAN_OUTCOME]
    assert [link.attributes[c.LINK_RELATION] for link in record.links] == ["outcome"]


@pytest.fixture(scope="module")
def default_pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    """The Collector with its production timing (decision_wait 30m, 5s after the root)."""
    for binary in (JAEGER_BIN, OTELCOL_BIN):
        if not binary.is_file():
            pytest.fail(f"{binary} is missing: run `collector/build --otelcol`", pytrace=False)
    with Pipeline(
        decision_wait="30m", sample_percent=10, workdir=tmp_path_factory.mktemp("default-timing")
    ) as p:
        yield p


@pytest.mark.e2e
def test_with_default_settings_a_rollout_is_searchable_seconds_after_it_ends(
    default_pipeline: Pipeline, tmp_path: Path
) -> None:
    """The measured delay (rollout span end -> found by a gym.rollout.id search) is printed; the
    assertion is only that the root, not the 30 min decision_wait, triggered the decision."""
    service = f"delay-{uuid.uuid4().hex[:8]}"
    provider = _provider(default_pipeline, service)
    tracer = provider.get_tracer("gymtrace.e2e")
    delays = []
    for i in range(3):
        rollout_id = f"r-delay-{i}"
        identity = {c.RUN_ID: "delay", c.TASK_ID: "t", c.ROLLOUT_ID: rollout_id, c.ROLLOUT_REPEAT: 0}
        with tracer.start_as_current_span(
            "gym.rollout", attributes={**identity, c.KIND: "rollout", c.ROLLOUT_OUTCOME: "unscored"}
        ):
            with tracer.start_as_current_span("gym.episode", attributes={**identity, c.KIND: "episode"}):
                time.sleep(0.2)
        ended = time.monotonic()
        default_pipeline.wait_for_traces(service, {c.ROLLOUT_ID: rollout_id}, timeout=120, interval=0.1)
        delays.append(time.monotonic() - ended)
    provider.shutdown()
    print(
        f"\nrollout end -> searchable in Jaeger, default settings: {', '.join(f'{d:.1f}s' for d in delays)}"
    )
    assert max(delays) < 60, delays  # decided on the root (5 s), not after decision_wait (30 min)
