"""The demo's traces in the REAL Jaeger web UI (jaeger-ui v1.76.0), driven by headless Chromium.

What a person does: search by ``gym.rollout.id``, open the retried rollout, see the span tree and the
episode's tags, follow the rollout's reference to its run. Screenshots of every page land in
``test-artifacts/jaeger-ui/`` (git-ignored) for a human to look at.

Needs ``../shared/jaeger-ui`` (the prebuilt UI beside the project, as CI has it) and Debian's
``chromium`` (``scripts/test`` installs it); skips with the reason where either is missing.
"""

from __future__ import annotations

import json
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from browser import Browser, find_chromium
from child_process import run_gymtrace
from gymtrace import _constants as c
from pipeline import JAEGER_BIN, OTELCOL_BIN, REPO_ROOT, Pipeline, span_tags

UI_ASSETS = REPO_ROOT.parent / "shared" / "jaeger-ui"
ARTIFACTS = REPO_ROOT / "test-artifacts" / "jaeger-ui"
SERVICE = "gymtrace-demo"

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def ui_pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    """A pipeline whose Jaeger serves the real UI, with production sampling (share 10 %)."""
    if not (UI_ASSETS / "index.html").is_file():
        pytest.skip(f"the prebuilt Jaeger UI is not at {UI_ASSETS} (see its NOTICE.md)")
    for binary in (JAEGER_BIN, OTELCOL_BIN):
        if not binary.is_file():
            pytest.fail(f"{binary} is missing: run `collector/build --otelcol`", pytrace=False)
    with Pipeline(
        decision_wait="30s",
        decision_wait_after_root="1s",
        sample_percent=10,
        workdir=tmp_path_factory.mktemp("ui-pipeline"),
        extra_env={"GYMTRACE_JAEGER_UI_ASSETS": str(UI_ASSETS)},
    ) as p:
        yield p


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    executable = find_chromium()
    if executable is None:
        pytest.skip("no Chromium on PATH: `apt-get install chromium` (scripts/test does it as root)")
    with Browser(executable, height=1400) as b:
        yield b


# The JavaScript that reads the trace view: one (depth, operation) per row; depth is the number of
# indent guides Jaeger UI draws left of the span name.
ROWS_JS = """
Array.from(document.querySelectorAll('.span-row')).map(row => [
  row.querySelectorAll('.SpanTreeOffset--indentGuide').length,
  (row.querySelector('.endpoint-name') || {}).innerText || ''
])
"""


def _click_row(browser: Browser, operation: str, nth: int = 0) -> None:
    browser.evaluate(
        "Array.from(document.querySelectorAll('.span-name'))"
        f".filter(e => e.querySelector('.endpoint-name').innerText === {json.dumps(operation)})"
        f"[{nth}].click()"
    )


def test_the_real_ui_finds_the_retried_rollout_shows_its_tree_and_leads_to_its_run(
    ui_pipeline: Pipeline, browser: Browser, tmp_path: Path
) -> None:
    t0 = time.monotonic()
    run_id = f"ui-{uuid.uuid4().hex[:8]}"
    rollout_id = f"{run_id}/arith-001/r1"  # the demo's retried rollout: attempt 0 fails, 1 succeeds
    run_gymtrace(
        "demo", "--quiet", "--endpoint", ui_pipeline.otlp_grpc_endpoint, "--run-id", run_id, "--file",
        str(tmp_path / "demo.jsonl"), check=True,
    )  # fmt: skip
    (trace,) = ui_pipeline.wait_for_traces(SERVICE, {c.ROLLOUT_ID: rollout_id}, timeout=60)
    ui_pipeline.wait_for_traces(SERVICE, {c.RUN_ID: run_id, c.KIND: c.KIND_RUN}, timeout=60)
    shots = ARTIFACTS / run_id

    # 1. Search page, as a person fills it in: service + tag.
    query = {"service": SERVICE, "tags": json.dumps({c.ROLLOUT_ID: rollout_id}), "lookback": "1h"}
    browser.open(f"{ui_pipeline.query_url}/search?{urllib.parse.urlencode(query)}")
    browser.wait_for("document.querySelectorAll('.ResultItem').length === 1", what="one search result")
    result = browser.evaluate("document.querySelector('.ResultItem').innerText")
    assert "gym.rollout" in result and f"{len(trace['spans'])} Spans" in result, result
    browser.screenshot(shots / "1-search.png")

    # 2. The trace view, opened from the result: the rollout's whole tree, nested.
    browser.evaluate("document.querySelector('.ResultItem a').click()")
    browser.wait_for(f"document.querySelectorAll('.span-row').length === {len(trace['spans'])}", what="rows")
    assert browser.evaluate("location.pathname").endswith(trace["traceID"])
    rows = [(depth, name) for depth, name in browser.evaluate(ROWS_JS)]
    browser.screenshot(shots / "2-trace.png")
    assert rows[0] == (1, "gym.rollout")
    episodes = [i for i, (_, name) in enumerate(rows) if name == "gym.episode"]
    assert len(episodes) == 2 and all(rows[i][0] == 2 for i in episodes)  # attempts 0 and 1
    for start in episodes:
        below = rows[start + 1 : next((i for i in episodes if i > start), len(rows))]
        agent = next(i for i, (_, name) in enumerate(below) if name.startswith("invoke_agent"))
        assert below[agent][0] == 3
        assert (4, "gym.turn") in below and (5, "gym.step") in below
        leaves = {name.split()[0] for depth, name in below if depth == 6}
        assert leaves >= {"chat", "execute_tool"}, below

    # 3. The second episode's details: its tags show the attempt.
    _click_row(browser, "gym.episode", 1)
    browser.wait_for("!!document.querySelector('.detail-row')", what="span details")
    details = browser.evaluate("document.querySelector('.detail-row').innerText")
    assert "gym.episode.attempt=1" in details.replace(" ", ""), details
    browser.screenshot(shots / "3-episode-tags.png")
    _click_row(browser, "gym.episode", 1)  # close it again

    # 4. The rollout's reference leads to the run's trace (always kept by the Collector).
    _click_row(browser, "gym.rollout")
    browser.wait_for("!!document.querySelector('.detail-row .AccordianReferences--header')", what="refs")
    browser.evaluate("document.querySelector('.detail-row .AccordianReferences--header').click()")
    href = browser.wait_for(
        "(document.querySelector('.detail-row .ReferencesList a') || {}).href", what="the run reference"
    )
    browser.screenshot(shots / "4-run-reference.png")
    browser.open(href)  # the UI opens it in a new tab; the same URL in this one
    browser.wait_for("document.querySelectorAll('.span-row').length === 1", what="the run trace")
    assert [name for _, name in browser.evaluate(ROWS_JS)] == ["gym.run"]
    # The reference's uiFind highlights the run span; open its details unless the UI already did.
    if not browser.evaluate("!!document.querySelector('.detail-row')"):
        _click_row(browser, "gym.run")
    browser.wait_for("!!document.querySelector('.detail-row')", what="run details")
    run_details = browser.evaluate("document.querySelector('.detail-row').innerText").replace(" ", "")
    assert f"gym.run.id={run_id}" in run_details
    browser.screenshot(shots / "5-run.png")

    # 5. From the run to its rollouts in one search (the documented one): its gym.run.id tag.
    query = {
        "service": SERVICE,
        "tags": json.dumps({c.RUN_ID: run_id, c.KIND: c.KIND_ROLLOUT}),
        "lookback": "1h",
    }
    browser.open(f"{ui_pipeline.query_url}/search?{urllib.parse.urlencode(query)}")
    browser.wait_for("document.querySelectorAll('.ResultItem').length >= 3", what="the run's rollouts")
    titles = browser.evaluate(
        "Array.from(document.querySelectorAll('.ResultItem')).map(e => e.innerText.split('\\n')[1])"
    )
    assert titles and all("gym.rollout" in t for t in titles), titles  # kept ones: 3 + the 10 % share
    browser.screenshot(shots / "6-run-rollouts.png")
    (rollout_span,) = [s for s in trace["spans"] if span_tags(s).get(c.KIND) == c.KIND_ROLLOUT]
    assert span_tags(rollout_span)[c.RUN_ID] == run_id
    print(f"\nbrowser test: {time.monotonic() - t0:.1f}s, screenshots in {shots}")
