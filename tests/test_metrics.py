"""The gym.* metrics: read from an in-memory reader, they equal what `gymtrace stats` reads from the
spans. Each case runs in a child process: the global MeterProvider can be set once per process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from child_process import run_gymtrace, run_python
from otlp_lines import read_otlp_json_lines

# Sets an in-memory reader on the global MeterProvider, runs BODY, and prints every data point (the
# stats gymtrace reads back from the trace file are `gymtrace stats`'s: _stats).
PROGRAM = """
import asyncio, json, sys
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
import gymtrace
from gymtrace import propagation

reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
gymtrace.configure(file=sys.argv[1], step_metrics=STEP_METRICS)

BODY

if FLUSH:
    gymtrace.force_flush()
points = []
data = reader.get_metrics_data()  # None: no instrument recorded anything
for rm in data.resource_metrics if data is not None else ():
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
gymtrace.force_flush()  # the spans, for the stats read from the file (the metrics were read above)
print(json.dumps({"points": points}))
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


def _run(
    tmp_path: Path, body: str, *, step_metrics: bool = False, flush: bool = True, **env: str
) -> dict[str, Any]:
    code = PROGRAM.replace("BODY", body).replace("STEP_METRICS", str(step_metrics))
    code = code.replace("FLUSH", str(flush))
    out = run_python(str(tmp_path / "traces.jsonl"), code=code, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _stats(*files: Path) -> list[dict[str, Any]]:
    """What `gymtrace stats --json` reads from the trace files: one object per run."""
    out = run_gymtrace("stats", "--json", *map(str, files))
    assert out.returncode in (0, 1), out.stderr  # 1: no rollouts found
    return [json.loads(line) for line in out.stdout.splitlines()]


def _points(result: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [p for p in result["points"] if p["name"] == name]


def test_rollout_counters_equal_the_outcomes_stats_reads_and_active_returns_to_zero(tmp_path: Path) -> None:
    result = _run(tmp_path, RUN)
    [stats] = _stats(tmp_path / "traces.jsonl")
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
assert gymtrace._sdk.setup._state.meter_provider is None
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


def _completed(result: dict[str, Any]) -> dict[str, int]:
    return {
        p["attributes"]["gym.rollout.outcome"]: p["value"] for p in _points(result, "gym.rollout.completed")
    }


def _rewards(result: dict[str, Any]) -> tuple[int, float]:
    found = _points(result, "gym.rollout.reward")
    return (found[0]["count"], found[0]["sum"]) if found else (0, 0.0)


def test_a_rollout_scored_locally_then_by_a_remote_scorer_counts_once_with_the_readers_reward(
    tmp_path: Path,
) -> None:
    body = """
with gymtrace.run(run_id="m"), gymtrace.rollout(rollout_id="twice", task_id="t"), gymtrace.episode() as ep:
    carrier = ep.carrier()
    gymtrace.record_reward(0.5)
# The scorer, given the episode's carrier, records its own reward for the same attempt.
with propagation.attach(carrier), gymtrace.verify():
    gymtrace.record_reward(0.9)
"""
    result = _run(tmp_path, body)
    [stats] = _stats(tmp_path / "traces.jsonl")
    assert _completed(result) == {"scored": 1} and stats["scored"] == 1
    # The readers take the record (it concludes the same attempt, written later): so do the metrics.
    assert _rewards(result) == (1, 0.9) == (stats["inputs"], stats["mean_reward"])


def test_a_final_episode_that_failed_after_a_scored_one_counts_one_unscored_and_no_reward(
    tmp_path: Path,
) -> None:
    body = """
with gymtrace.run(run_id="m"), gymtrace.rollout(rollout_id="lost", task_id="t"):
    with gymtrace.episode() as ep:
        # A scorer in a worker thread of this process scores attempt 0 while it runs.
        with propagation.attach(ep.carrier()), gymtrace.verify():
            gymtrace.record_reward(1.0)
    try:
        with gymtrace.episode():
            raise ConnectionError("sandbox died")
    except ConnectionError:
        pass
"""
    result = _run(tmp_path, body)
    [stats] = _stats(tmp_path / "traces.jsonl")
    assert (stats["scored"], stats["unscored"]) == (0, 1)
    assert _completed(result) == {"unscored": 1}
    assert _rewards(result) == (0, 0.0)


# The NeMo Gym shape across two processes: the driver opens the rollout and POSTs to a resources
# server's /verify with NeMo Gym's identity headers; the server, behind gymtrace's real NeMo Gym
# middleware, records the reward its /verify answered (an outcome record, in its process); the driver
# then records the reward /run returned. Each process has its own MeterProvider, as each NeMo Gym
# server does; the sum over both is what a Collector adds up.
SERVER = """
import json, sys
import uvicorn
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
import gymtrace
from gymtrace.integrations.nemo_gym import NeMoGymServerMiddleware

reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
gymtrace.configure(service_name="resources-server", file=sys.argv[1])


def points():
    gymtrace.force_flush()  # whatever this process would count is handed over, the spans written
    data = reader.get_metrics_data()  # None: no instrument recorded anything
    return [
        {"name": m.name, "attributes": dict(p.attributes), "value": getattr(p, "value", None)}
        for rm in (data.resource_metrics if data is not None else ()) for sm in rm.scope_metrics
        for m in sm.metrics for p in m.data.data_points
    ]


async def resources_server(scope, receive, send):
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    body = {"reward": 1.0} if scope["path"] == "/verify" else points()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": json.dumps(body).encode()})


app = NeMoGymServerMiddleware(resources_server, server_type="resources_servers", server_name="env")
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
"""


def test_the_nemo_gym_shape_verify_record_plus_driver_reward_counts_once_over_both_processes(
    tmp_path: Path,
) -> None:
    import subprocess
    import sys
    import time

    import httpx

    from child_process import clean_env
    from pipeline import free_ports

    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}"
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    server = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "server.jsonl"), str(port)],
        env=clean_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(600):
            try:
                httpx.post(f"{url}/ready", timeout=1)
                break
            except httpx.TransportError:
                assert server.poll() is None, server.stderr.read() if server.stderr else ""
                time.sleep(0.05)
        body = f"""
import httpx
from opentelemetry import propagate
from gymtrace.integrations import nemo_gym
with gymtrace.run(run_id="m"), gymtrace.rollout(rollout_id="ng", task_id="t"), gymtrace.episode():
    headers = nemo_gym.headers()
    propagate.inject(headers)  # traceparent: the server's record joins the rollout's trace
    verified = httpx.post({url + "/verify"!r}, json={{}}, headers=headers).json()
    gymtrace.record_reward(verified["reward"])  # what /run returned
"""
        driver = _completed(_run(tmp_path, body))
        served_points = httpx.post(f"{url}/metric-points", timeout=30).json()
    finally:
        server.terminate()
        server.wait(timeout=30)
    served = {
        p["attributes"]["gym.rollout.outcome"]: p["value"]
        for p in served_points
        if p["name"] == "gym.rollout.completed"
    }
    # The server wrote the outcome record; the readers see one scored rollout over both files.
    spans = [
        *read_otlp_json_lines(tmp_path / "traces.jsonl"),
        *read_otlp_json_lines(tmp_path / "server.jsonl"),
    ]
    assert [
        s.attributes.get("gym.outcome.source") for s in spans if s.attributes.get("gym.kind") == "outcome"
    ]
    [stats] = _stats(tmp_path / "traces.jsonl", tmp_path / "server.jsonl")
    assert (stats["scored"], stats["unscored"], stats["pending"]) == (1, 0, 0)
    total = {k: driver.get(k, 0) + served.get(k, 0) for k in {*driver, *served}}
    assert total == {"scored": 1}, (driver, served)
    assert served == {}  # the owner (the driver) counts it, never the server


def test_a_reader_collecting_right_after_a_run_sees_every_ended_rollout_without_force_flush(
    tmp_path: Path,
) -> None:
    body = """
with gymtrace.run(run_id="m"):
    for i in range(3):
        with gymtrace.rollout(rollout_id=f"r{i}", task_id="t"), gymtrace.episode():
            gymtrace.record_reward(0.5)
"""
    result = _run(tmp_path, body, flush=False)
    assert _completed(result) == {"scored": 3}
    assert _rewards(result) == (3, 1.5)
    [active] = _points(result, "gym.rollout.active")
    assert active["value"] == 0


def test_rollout_active_is_observed_from_the_open_rollouts_at_each_collection(tmp_path: Path) -> None:
    body = """
def active():
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data is not None else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name == "gym.rollout.active":
                    assert not m.data.is_monotonic
                    return [p.value for p in m.data.data_points]
    return []

seen = []
with gymtrace.rollout(rollout_id="a"), gymtrace.episode():
    seen.append(active())
    with gymtrace.rollout(rollout_id="b"):
        seen.append(active())
seen.append(active())
assert seen == [[1], [2], [0]], seen
"""
    _run(tmp_path, body, flush=False)


def test_an_attempt_number_reused_after_a_failure_counts_the_last_recorded_episode_as_the_readers_do(
    tmp_path: Path,
) -> None:
    # Issue 31: of two episodes given attempt 0, the last recorded is the attempt (warned when it
    # opened). The first failed, the second scored: readers, the rollout span and the metrics all
    # say scored 0.5, never "unscored" from the superseded failure.
    body = """
with gymtrace.run(run_id="m"), gymtrace.rollout(rollout_id="reused", task_id="t"):
    try:
        with gymtrace.episode(attempt=0):
            raise ConnectionError("sandbox died")
    except ConnectionError:
        pass
    with gymtrace.episode(attempt=0):
        gymtrace.record_reward(0.5)
"""
    result = _run(tmp_path, body)
    [stats] = _stats(tmp_path / "traces.jsonl")
    assert (stats["scored"], stats["unscored"]) == (1, 0)
    assert _completed(result) == {"scored": 1}
    assert _rewards(result) == (1, 0.5)


TRAINING = """
gymtrace.set_policy_version(0)
with gymtrace.run(run_id="t"):
    keys = []
    for n in range(4):
        with gymtrace.rollout(rollout_id=f"r{n}", group_id="g"), gymtrace.episode():
            keys.append(gymtrace.current().join_keys())
        if n == 1:
            gymtrace.set_policy_version(2)
    with gymtrace.train_step(step=1, policy_version=3):
        gymtrace.consume(keys[0])
        gymtrace.consume(keys[1], outcome="stale")
        gymtrace.consume(keys[2], outcome="filtered", reason="zero_variance_group")
        gymtrace.consume(keys[3])
"""


@pytest.mark.e2e  # a child process: the global MeterProvider can be set once per process
def test_consumed_rollouts_are_counted_by_training_outcome_with_their_staleness(tmp_path: Path) -> None:
    result = _run(tmp_path, TRAINING)
    consumed = {
        p["attributes"]["gym.rollout.training_outcome"]: p["value"]
        for p in _points(result, "gym.rollout.consumed")
    }
    assert consumed == {"trained": 2, "stale": 1, "filtered": 1}
    [staleness] = _points(result, "gym.rollout.staleness")
    # r0, r1 started under version 0, r2 and r3 under 2; the step starts from 3.
    assert staleness["unit"] == "{version}" and staleness["count"] == 4 and staleness["sum"] == 3 + 3 + 1 + 1
    assert all(p["exemplar_traces"] for p in _points(result, "gym.rollout.consumed"))


# The rollouts' owner: opens ROLLOUTS rollouts and hands each off (continued elsewhere), printing the
# carriers. The scorer: writes each rollout's reward from its carrier, as a NeMo Gym resources
# server's /verify does, and prints how many objects the collector tracks before and after.
OWNER = """
import json, sys
import gymtrace
from gymtrace import propagation

gymtrace.configure(file=sys.argv[1])
carriers = []
with gymtrace.run(run_id="m"):
    for i in range(int(sys.argv[2])):
        with gymtrace.rollout(rollout_id=f"r{i}", task_id="t"), gymtrace.episode():
            carrier = {}
            propagation.inject(carrier, destination=propagation.GYM_INTERNAL, continuation=True)
            carriers.append(carrier)
gymtrace.force_flush()
print(json.dumps(carriers))
"""

SCORER = """
import gc, json, sys
import gymtrace
from gymtrace import propagation

gymtrace.configure(file=sys.argv[1])
carriers = json.load(open(sys.argv[2]))

def score(part):
    for carrier in part:
        with propagation.attach(carrier):
            gymtrace.record_reward(1.0)
    gymtrace.force_flush()
    gc.collect()
    return len(gc.get_objects())

warm = len(carriers) // 4
score(carriers[:warm])  # the caches and the exporter's buffers made once
before = score([])
after = score(carriers[warm:])
print(json.dumps({"before": before, "after": after, "scored": len(carriers) - warm}))
"""


def test_a_process_scoring_rollouts_another_process_owns_keeps_nothing_per_rollout(tmp_path: Path) -> None:
    # A NeMo Gym resources server writes an outcome record for every rollout the driver owns and
    # counts: a record kept here waiting for a rollout that never ends here would grow the server's
    # heap by a rollout's facts each time (and every full collection walks them).
    owner = run_python(str(tmp_path / "owner.jsonl"), "2000", code=OWNER, cwd=tmp_path)
    assert owner.returncode == 0, owner.stderr
    (tmp_path / "carriers.json").write_text(owner.stdout.strip().splitlines()[-1])
    scorer = run_python(
        str(tmp_path / "scorer.jsonl"), str(tmp_path / "carriers.json"), code=SCORER, cwd=tmp_path
    )
    assert scorer.returncode == 0, scorer.stderr
    counts = json.loads(scorer.stdout.strip().splitlines()[-1])
    assert counts["scored"] == 1500
    assert counts["after"] - counts["before"] < counts["scored"] // 10, counts
    # Every reward was written, and the readers see each rollout scored over both files.
    [stats] = _stats(tmp_path / "owner.jsonl", tmp_path / "scorer.jsonl")
    assert (stats["scored"], stats["unscored"], stats.get("pending", 0)) == (2000, 0, 0)
