"""Rollouts head sampling dropped, through the real Collector (tail sampling) into Jaeger: their
summary spans are kept by the ``rollout-summary`` rule, and ``gymtrace stats --jaeger`` counts them."""

from __future__ import annotations

import json
import uuid

from child_process import run_gymtrace, run_python
from gymtrace import _constants as c
from pipeline import Pipeline

_RUN = """
import gymtrace

gymtrace.configure(service_name={service!r}, endpoint={endpoint!r}, protocol="grpc", file=False)
with gymtrace.run(run_id={run_id!r}):
    for repeat in range(5):
        with gymtrace.rollout(rollout_id=f"r-{{repeat}}", task_id="t", repeat=repeat):
            with gymtrace.episode(), gymtrace.step():
                gymtrace.record_reward(repeat / 4)
gymtrace.shutdown()
"""


def test_the_collector_keeps_the_summary_of_every_rollout_head_sampling_dropped(pipeline: Pipeline) -> None:
    run_id = f"e2e-summaries-{uuid.uuid4().hex[:8]}"
    service = f"summaries-{uuid.uuid4().hex[:6]}"
    code = _RUN.format(service=service, endpoint=pipeline.otlp_grpc_endpoint, run_id=run_id)
    # Ratio 0: every rollout is dropped at the head and leaves only its summary. Each is a clean,
    # scored rollout, which no other rule keeps at the pipeline's share of 0 % of the rest.
    out = run_python(code=code, env={"GYMTRACE_SAMPLE_RATIO": "0"})
    assert out.returncode == 0, out.stderr
    traces = pipeline.wait_for_traces(service, {c.RUN_ID: run_id}, count=6, timeout=60)
    kinds = sorted(
        str(tag["value"]) for t in traces for s in t["spans"] for tag in s["tags"] if tag["key"] == c.KIND
    )
    assert kinds == ["rollout"] * 5 + ["run"], kinds
    rows = run_gymtrace("rollouts", "--jaeger", pipeline.query_url, "--run", run_id, "--json", check=True)
    found = sorted(
        (r["rollout_id"], r["outcome"], r["reward"], r["detail"])
        for r in map(json.loads, rows.stdout.splitlines())
    )
    assert found == [(f"r-{n}", "scored", n / 4, False) for n in range(5)]
    stats = json.loads(
        run_gymtrace("stats", "--jaeger", pipeline.query_url, "--run", run_id, "--json", check=True).stdout
    )
    assert (stats["scored"], stats["mean_reward"], stats["rollouts_with_detail"]) == (5, 0.5, 0), stats
