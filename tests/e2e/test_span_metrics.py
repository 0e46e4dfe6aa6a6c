"""The Collector's span metrics count every span, before tail sampling drops most clean rollouts.

A real gymtrace harness in its own process sends scored and failed rollouts to the session's
pipeline (sample percent 0: only failed, retried and unscored rollouts are kept). The span metrics
on the Prometheus endpoint must equal what the harness made (ground truth); Jaeger, after
sampling, holds only the failed ones, so counts derived from stored traces would be wrong.
"""

from __future__ import annotations

import time
import uuid

import pytest

from child_process import run_python
from gymtrace import _constants as c
from pipeline import Pipeline

pytestmark = pytest.mark.e2e

SCORED = 12
FAILED = 3

_HARNESS = """
import gymtrace

gymtrace.configure(service_name={service!r}, endpoint={endpoint!r}, protocol="grpc", file=False)
with gymtrace.run(run_id={run_id!r}):
    for i in range({scored} + {failed}):
        with gymtrace.rollout(rollout_id=f"r-{{i}}", task_id=f"t-{{i % 4}}", repeat=0):
            try:
                with gymtrace.episode():
                    with gymtrace.step():
                        pass
                    if i >= {scored}:
                        raise ConnectionError("sandbox lost")
                    with gymtrace.verify():
                        gymtrace.record_reward(1.0)
            except ConnectionError:
                pass
gymtrace.shutdown()
"""


def _calls(pipeline: Pipeline, service: str) -> dict[tuple[str, str], float]:
    """Span-metrics call counts of ``service`` by (span name, status code)."""
    counts: dict[tuple[str, str], float] = {}
    for name, labels, value in pipeline.metrics():
        if name.endswith("calls_total") and labels.get("service_name") == service:
            key = (labels.get("span_name", ""), labels.get("status_code", ""))
            counts[key] = counts.get(key, 0.0) + value
    return counts


def test_span_metrics_count_every_span_before_tail_sampling(pipeline: Pipeline) -> None:
    service = f"spanmetrics-{uuid.uuid4().hex[:8]}"
    run_id = f"run-{service}"
    child = run_python(
        code=_HARNESS.format(
            service=service,
            endpoint=pipeline.otlp_grpc_endpoint,
            run_id=run_id,
            scored=SCORED,
            failed=FAILED,
        )
    )
    assert child.returncode == 0, child.stderr

    total = SCORED + FAILED
    expected = {
        (c.SPAN_ROLLOUT, "STATUS_CODE_UNSET"): float(total),
        (c.SPAN_STEP, "STATUS_CODE_UNSET"): float(total),
        (c.SPAN_VERIFY, "STATUS_CODE_UNSET"): float(SCORED),
    }
    deadline = time.monotonic() + 30
    counts: dict[tuple[str, str], float] = {}
    while time.monotonic() < deadline:
        counts = _calls(pipeline, service)
        if all(counts.get(key) == value for key, value in expected.items()):
            break
        time.sleep(0.5)
    for key, value in expected.items():
        assert counts.get(key) == value, (key, counts, pipeline.logs())
    failed_episodes = counts.get((c.SPAN_EPISODE, "STATUS_CODE_ERROR"), 0.0)
    assert failed_episodes == float(FAILED), counts

    # After sampling, Jaeger keeps the failed rollouts and drops the clean ones (sample percent 0):
    # the same count read from stored traces would say FAILED rollouts, not SCORED + FAILED.
    deadline = time.monotonic() + 30
    while len(pipeline.find_traces(service, operation=c.SPAN_ROLLOUT)) < FAILED:
        assert time.monotonic() < deadline, pipeline.logs()
        time.sleep(0.5)
    time.sleep(3)  # past the 2 s decision wait: a clean rollout kept by mistake would be here now
    stored = pipeline.find_traces(service, operation=c.SPAN_ROLLOUT)
    assert len(stored) == FAILED, [t["traceID"] for t in stored]
