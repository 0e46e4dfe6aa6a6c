"""A late outcome record through the real Collector (tail sampling) into Jaeger, read back by
``gymtrace rollouts --jaeger`` and ``gymtrace stats --jaeger``."""

from __future__ import annotations

import json
import uuid

from child_process import run_gymtrace, run_python
from gymtrace import _constants as c
from pipeline import Pipeline

_HARNESS = """
import gymtrace

class EnvironmentLost(ConnectionError):
    pass

gymtrace.configure(service_name={service!r}, endpoint={endpoint!r}, protocol="grpc", file=False)
with gymtrace.run(run_id={run_id!r}):
    with gymtrace.rollout(rollout_id="r-failed", task_id="t", repeat=0):
        for attempt in gymtrace.attempts(1, retry_on=EnvironmentLost, reraise=False):
            with attempt:
                raise EnvironmentLost("environment server went away")
    with gymtrace.rollout(rollout_id="r-late", task_id="t", repeat=1) as rollout:
        with gymtrace.episode():
            pass  # the solver; the scorer runs in a later phase
# The later phase scores r-late after its rollout span ended: gymtrace writes an outcome record.
gymtrace.record_reward(1.0, scope=rollout)
gymtrace.shutdown()
"""


def test_rollouts_and_stats_read_the_final_outcome_from_jaeger(pipeline: Pipeline) -> None:
    run_id = f"e2e-outcomes-{uuid.uuid4().hex[:8]}"
    service = f"outcomes-{uuid.uuid4().hex[:6]}"
    code = _HARNESS.format(service=service, endpoint=pipeline.otlp_grpc_endpoint, run_id=run_id)
    out = run_python(code=code)
    assert out.returncode == 0, out.stderr
    # Both rollouts are kept by tail sampling (a failed episode; an unscored root), with every
    # span: the late record is in the kept trace of its rollout.
    pipeline.wait_for_traces(
        service,
        {c.RUN_ID: run_id},
        predicate=lambda traces: sum(len(t["spans"]) for t in traces) >= 5,
        timeout=60,
    )
    rows = run_gymtrace("rollouts", "--jaeger", pipeline.query_url, "--run", run_id, "--json", check=True)
    found = {r["rollout_id"]: r for r in map(json.loads, rows.stdout.splitlines())}
    assert {k: (r["outcome"], r["reward"], r["attempts"]) for k, r in found.items()} == {
        "r-failed": ("unscored", None, 1),
        "r-late": ("scored", 1.0, 1),
    }
    assert found["r-late"]["source"] == "late" and found["r-late"]["services"] == [service]
    stats = run_gymtrace("stats", "--jaeger", pipeline.query_url, "--run", run_id, "--json", check=True)
    read = json.loads(stats.stdout)
    # The time split is this machine's: its parts are named and the shares add up to the whole.
    split, share = read.pop("time_split"), read.pop("time_share")
    p50, p99 = read.pop("rollout_seconds_p50"), read.pop("rollout_seconds_p99")
    assert set(split) == set(share) == {"model", "tool", "env", "verify", "other"}, (split, share)
    assert abs(sum(share.values()) - 1.0) < 1e-6 and 0 < p50 <= p99, (share, p50, p99)
    assert read == {
        "run_id": run_id,
        "scored": 1,
        "unscored": 1,
        "pending": 0,
        "inputs": 1,
        "mean_reward": 1.0,
        # One definition of pass@k (issue 31): over the scored repeat only, the unscored one beside it.
        "pass_at_k": {"t": {"k": 1, "n": 1, "passed": 1, "unscored": 1, "value": 1.0}},
        "task_means": {"t": 1.0},
        "rollouts_with_detail": 2,  # head sampling dropped none
    }
    tree = run_gymtrace("tree", "--jaeger", pipeline.query_url, "--rollout", "r-late", "--service", service)
    assert "gym.outcome [outcome]" in tree.stdout and "=> final: outcome=scored" in tree.stdout
