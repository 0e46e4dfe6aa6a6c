"""A burst arrives whole (issue 47): 100,000 spans made as fast as the API allows, with the default
settings, into a live Collector, beside processes that keep every CPU busy.

The producer loses nothing (``export_stats()``: nothing dropped, everything exported) and the
Collector's own count of the spans its receiver accepted (``otelcol_receiver_accepted_spans``)
grows by exactly what the producer exported. Nothing here times anything: on a starved machine
the burst takes longer, and must still arrive whole.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from child_process import run_python
from cpu_hog import cpu_contention  # noqa: F401 - a fixture
from pipeline import JAEGER_BIN, OTELCOL_BIN, Pipeline

pytestmark = pytest.mark.e2e

ROLLOUTS, STEPS = 100, 998  # each rollout: its root, one episode, 998 steps: 100,000 spans

PRODUCER = """
import json, sys
import gymtrace

gymtrace.configure(service_name="burst", endpoint=sys.argv[1], protocol="grpc", file=False)
rollouts, steps = int(sys.argv[2]), int(sys.argv[3])
for r in range(rollouts):
    with gymtrace.rollout(rollout_id=f"r-{r}", task_id="t", repeat=r), gymtrace.episode():
        for _ in range(steps):
            with gymtrace.step():
                pass
# Everything handed over, then delivered: the flush waits as long as delivery takes (the default
# flush timeout at exit, 5 s, bounds only the exit; see docs/reliability.md).
flushed = gymtrace.force_flush(timeout_millis=300_000)
[stats] = gymtrace.export_stats()
from gymtrace._sdk import setup as _setup
encoder = getattr(_setup._state.stage.processors()[0], "encoder", "thread")
gymtrace.shutdown()
print(json.dumps({"flushed": flushed, "encoder": encoder, **stats.__dict__}))
"""


@pytest.fixture
def pipeline(tmp_path: Path) -> Iterator[Pipeline]:
    if os.environ.get("GYMTRACE_SKIP_E2E", "") not in ("", "0"):
        pytest.skip("GYMTRACE_SKIP_E2E is set: end-to-end tests skipped on request")
    for binary in (JAEGER_BIN, OTELCOL_BIN):
        if not binary.is_file():
            pytest.fail(f"{binary} is missing: run `collector/build --otelcol`", pytrace=False)
    with Pipeline(decision_wait="2s", sample_percent=100, workdir=tmp_path / "pipeline") as p:
        yield p


@pytest.mark.usefixtures("cpu_contention")
def test_a_burst_of_100000_spans_arrives_whole_beside_busy_cpus(pipeline: Pipeline) -> None:
    before = pipeline.spans_accepted()
    out = run_python(pipeline.otlp_grpc_endpoint, str(ROLLOUTS), str(STEPS), code=PRODUCER, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    stats = json.loads(out.stdout.splitlines()[-1])
    spans = ROLLOUTS * (STEPS + 2)
    assert stats["flushed"], stats
    assert stats["finished"] == spans, stats
    assert stats["dropped_queue_full"] == stats["dropped_export_failed"] == 0, stats
    assert stats["exported"] == spans and stats["queued"] == 0, stats
    # The Collector counted every one of them in (a retried request may count twice: at least).
    deadline = time.monotonic() + 60
    while (accepted := pipeline.spans_accepted() - before) < spans and time.monotonic() < deadline:
        time.sleep(1)
    assert accepted >= spans, f"the Collector accepted {accepted} of {spans}; {stats}"
    print(f"burst: {spans} spans, encoder {stats['encoder']}, Collector accepted {accepted}")
