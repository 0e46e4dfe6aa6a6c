"""Live markers reach Jaeger past the tail sampler: `gymtrace live --jaeger` finds a hung rollout
within seconds while the sampler still holds the rollout's own spans, and a killed process reads
lost. The Collector runs with a two-minute decision wait, so nothing but the markers can be there."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from child_process import clean_env, run_gymtrace
from gymtrace import _constants as c
from pipeline import JAEGER_BIN, OTELCOL_BIN, Pipeline

pytestmark = pytest.mark.e2e

SUPPORT = Path(__file__).resolve().parent.parent / "support"
INTERVAL = 0.5


@pytest.fixture(scope="module")
def held_pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    for binary in (JAEGER_BIN, OTELCOL_BIN):
        if not binary.is_file():
            pytest.fail(f"end-to-end tests need {binary}: run `collector/build --otelcol`", pytrace=False)
    with Pipeline(decision_wait="120s", sample_percent=0, workdir=tmp_path_factory.mktemp("held")) as p:
        yield p


def _live(pipeline: Pipeline) -> dict[str, dict[str, Any]]:
    out = run_gymtrace("live", "--jaeger", pipeline.query_url, "--stalled-after", "2", "--json", check=True)
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    return {row["rollout_id"]: row for row in rows if row["run_id"] == "live-run"}


def _until(predicate: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    value = predicate()
    while not value and time.monotonic() < deadline:
        time.sleep(0.5)
        value = predicate()
    return value


def test_markers_are_searchable_in_jaeger_while_the_sampler_holds_the_rollout(
    held_pipeline: Pipeline,
) -> None:
    env = clean_env(GYMTRACE_HEARTBEAT=str(INTERVAL), OTEL_BSP_SCHEDULE_DELAY="100")
    program = subprocess.Popen(
        [sys.executable, str(SUPPORT / "live_program.py"), held_pipeline.otlp_grpc_endpoint],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert program.stdout is not None and program.stdout.readline().strip() == "ready"
        expected = {"hangs": c.LIVE_STALLED, "busy": c.LIVE_RUNNING}
        rows = _until(
            lambda: (r := _live(held_pipeline)) and {k: v["state"] for k, v in r.items()} == expected and r
        )
        assert rows, held_pipeline.logs()
        assert rows["hangs"]["step"] == 3
        assert rows["busy"]["state"] == c.LIVE_RUNNING and rows["busy"]["step"] > 3
        assert "finishes" not in rows  # ended; its markers, if any, are folded into its trace
        # The sampler still holds every other span of these rollouts: only markers were stored.
        assert held_pipeline.find_traces("live-program", operation=c.SPAN_STEP) == []
    finally:
        program.send_signal(signal.SIGKILL)
        program.wait(timeout=10)
    lost = _until(
        lambda: (r := _live(held_pipeline)) and all(x["state"] == c.LIVE_LOST for x in r.values()) and r
    )
    assert set(lost) == {"hangs", "busy"}
