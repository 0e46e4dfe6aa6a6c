"""The gym.* metrics: read from an in-memory reader, they equal what `gymtrace stats` reads from the
spans. Each case runs in a child process: the global MeterProvider can be set once per process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from child_process import run_python

# Sets an in-memory reader on the global MeterProvider, runs BODY, and prints every data point with
# the stats gymtrace reads back from the trace file.
PROGRAM = """
import asyncio, json, sys
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
import gymtrace
from gymtrace import propagation
from gymtrace._outcomes import summarise
from gymtrace._spandata import read_otlp_json_lines

reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
gymtrace.configure(file=sys.argv[1], step_metrics=STEP_METRICS)

BODY

gymtrace.force_flush()
points = []
for rm in reader.get_metrics_data().resource_metrics:
    for sm in rm.scope_metrics:
        assert sm.scope.name == "gymtrace", sm.scope.name
        for m in sm.metrics:
            for p in m.data.data_points:
                points.append({
                    "name": m.name, "unit": m.unit, "attributes": dict(p.attributes),
                    "value": getattr(p, "value", None), "count": getattr(p, "count", None),
                    "sum": getattr(p, "sum", None),
                    "exemplar_traces": sorted({format(e.trace_id, "032x") for e in p.exemplars if e.trace_id}),
                })
stats = [s.as_json() for s in summarise(read_otlp_json_lines(sys.argv[1]))]
print(json.dumps({"points": points, "stats": stats}))
"""

RUN = """
with gymtrace.run(run_id="m"):
    # scored at once
    with gymtrace.rollout(rollout_id="scored", task_id="t"), gymtrace.episode():
        with gymtrace.step():
            pass
        gymtrace.record_reward(0.75)
    # unscored: its only episode failed
    with gymtrace.rollout(rollout_id="failed", task_id="t"):
        try:
            with gymtrace.episode():
                raise ValueError("bug")
        except ValueError:
            pass
    # retried after an infrastructure failure, then scored
    with gymtrace.rollout(rollout_id="retried", task_id="t"):
        for attempt in gymtrace.attempts(3):
            with attempt:
                if attempt.number == 0:
                    raise ConnectionError("sandbox died")
                gymtrace.record_reward(0.25)
    # handed to another process (pending at its end), scored there: counted once, there
    with gymtrace.rollout(rollout_id="remote", task_id="t"), gymtrace.episode():
        headers = {}
        propagation.inject(headers, destination=propagation.GYM_INTERNAL, continuation=True)
    with propagation.attach(headers):
        gymtrace.record_reward(1.0)
"""


def _run(tmp_path: Path, body: str, *, step_metrics: bool = False, **env: str) -> dict[str, Any]:
    code = PROGRAM.replace("BODY", body).replace("STEP_METRICS", str(step_metrics))
    out = run_python(str(tmp_path / "traces.jsonl"), code=code, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _points(result: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [p for p in result["points"] if p["name"] == name]


def test_rollout_counters_equal_the_outcomes_stats_reads_and_active_returns_to_zero(tmp_path: Path) -> None:
    result = _run(tmp_path, RUN)
    [stats] = result["stats"]
    completed = {
        p["attributes"]["gym.rollout.outcome"]: p["value"] for p in _points(result, "gym.rollout.completed")
    }
    assert (
        completed
        == {"scored": stats["scored"], "unscored": stats["unscored"]}
        == {"scored": 3, "unscored": 1}
    )
    assert stats.get("pending", 0) == 0  # the remote reward concluded the handed-off rollout
    [reward] = _points(result, "gym.rollout.reward")
    assert reward["unit"] == "1" and reward["attributes"] == {}
    assert reward["count"] == 3 and reward["sum"] == 0.75 + 0.25 + 1.0  # an unscored rollout is never a 0
    assert stats["mean_reward"] == reward["sum"] / reward["count"]
    [active] = _points(result, "gym.rollout.active")
    assert active["value"] == 0 and active["unit"] == "{rollout}"
    assert all(len(p["exemplar_traces"]) >= 1 for p in _points(result, "gym.rollout.completed"))


def test_episode_counter_and_duration_by_outcome_and_failure_kind(tmp_path: Path) -> None:
    result = _run(tmp_path, RUN)
    episodes = {
        (p["attributes"]["gym.episode.outcome"], p["attributes"].get("gym.failure.kind")): p["value"]
        for p in _points(result, "gym.episode.completed")
    }
    assert episodes == {("completed", None): 3, ("failed", "error"): 1, ("failed", "infrastructure"): 1}
    durations = {
        p["attributes"]["gym.episode.outcome"]: p["count"] for p in _points(result, "gym.episode.duration")
    }
    assert durations == {"completed": 3, "failed": 2}
    assert {p["unit"] for p in _points(result, "gym.episode.duration")} == {"s"}
    # Low cardinality: no identity on any point.
    for point in result["points"]:
        assert not any(key in point["attributes"] for key in ("gym.rollout.id", "gym.task.id", "gym.run.id"))


def test_step_duration_only_when_asked_for(tmp_path: Path) -> None:
    body = """
with gymtrace.rollout(rollout_id="r"), gymtrace.episode():
    for _ in range(5):
        with gymtrace.step():
            pass
"""
    assert _points(_run(tmp_path, body), "gym.step.duration") == []
    [steps] = _points(_run(tmp_path, body, step_metrics=True), "gym.step.duration")
    assert steps["count"] == 5 and steps["unit"] == "s"


def test_an_application_meter_provider_is_kept_by_configure(tmp_path: Path) -> None:
    # PROGRAM sets its own provider first; configure() with OTLP must not replace it.
    body = """
gymtrace.configure(endpoint="http://127.0.0.1:9", protocol="http/protobuf", file=sys.argv[1])
assert metrics.get_meter_provider().__class__ is MeterProvider
assert gymtrace._setup._state.meter_provider is None
with gymtrace.rollout(rollout_id="r"):
    gymtrace.record_reward(1.0)
"""
    # Nothing listens at the endpoint: the spans' flush gives up soon, the file has them.
    result = _run(tmp_path, body, GYMTRACE_FLUSH_TIMEOUT="0.5", OTEL_EXPORTER_OTLP_TIMEOUT="1")
    [completed] = _points(result, "gym.rollout.completed")
    assert completed["value"] == 1


def test_configure_sends_the_metrics_over_otlp_to_the_spans_endpoint_when_no_provider_is_set(
    tmp_path: Path,
) -> None:
    import http.server
    import threading

    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2

    received: dict[str, list[bytes]] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            received.setdefault(self.path, []).append(body)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            return None

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        code = f"""
import gymtrace
from opentelemetry import metrics
gymtrace.configure(service_name="metrics-otlp", endpoint="http://127.0.0.1:{server.server_port}",
                   protocol="http/protobuf", file=False)
assert type(metrics.get_meter_provider()).__name__ == "MeterProvider"
with gymtrace.rollout(rollout_id="r"), gymtrace.episode():
    gymtrace.record_reward(0.5)
"""  # the exit hook flushes the spans and the metrics
        out = run_python(code=code, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
    finally:
        server.shutdown()
    assert received.get("/v1/traces")
    names = set()
    for body in received.get("/v1/metrics", []):
        request = metrics_service_pb2.ExportMetricsServiceRequest.FromString(body)
        for rm in request.resource_metrics:
            assert {a.key: a.value.string_value for a in rm.resource.attributes}[
                "service.name"
            ] == "metrics-otlp"
            names |= {m.name for sm in rm.scope_metrics for m in sm.metrics}
    assert {
        "gym.rollout.completed",
        "gym.rollout.reward",
        "gym.episode.completed",
        "gym.episode.duration",
    } <= names
