"""``gymtrace report`` and ``gymtrace timeline`` in a real headless Chromium (Debian's): what the
pages draw, counted in the browser, equals what ``gymtrace stats --json`` and ``rollouts --json``
say of the same files; hovering a bar names its rollout. Screenshots land in
``test-artifacts/pictures/`` (git-ignored); docs/report.md shows copies of them.

Skips with the reason where Chromium is missing (``scripts/test`` installs it as root).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from browser import Browser, headless_chromium
from built_runs import BuiltRun
from child_process import run_gymtrace
from gymtrace import _constants as c
from gymtrace._model.spandata import read_otlp_json_lines
from pipeline import REPO_ROOT

pytestmark = pytest.mark.e2e

ARTIFACTS = REPO_ROOT / "test-artifacts" / "pictures"
FIGURES_JS = """
Object.fromEntries(Array.from(document.querySelectorAll('[data-figure]')).map(
  e => [e.dataset.figure, [JSON.parse(e.dataset.value || 'null'), e.textContent]]))
"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    yield from headless_chromium(width=1400, height=1000)


def _json(*argv: str) -> Any:
    out = run_gymtrace(*argv, check=True)
    return [json.loads(line) for line in out.stdout.splitlines()]


def _open(browser: Browser, page: Path) -> dict[str, Any]:
    """Open a page and wait until its timeline is drawn; its figures."""
    browser.open(page.as_uri())
    browser.wait_for(
        "window.gymtraceTimelines && window.gymtraceTimelines.length === 1"
        " && window.gymtraceTimelines[0].figures.draws > 0",
        what="the timeline drawn",
    )
    figures: dict[str, Any] = browser.evaluate("window.gymtraceTimelines[0].figures")
    return figures


def _hover_bar(browser: Browser, index: int) -> str:
    """Move the real mouse onto bar ``index`` of the page's timeline; the tooltip's text."""
    box = browser.evaluate(
        "(() => { const t = window.gymtraceTimelines[0]; t.canvas.scrollIntoView({block: 'center'});"
        f" const r = t.canvas.getBoundingClientRect(), b = t.barBox({index});"
        " return {x: r.left + b.x + Math.min(b.w / 2, 3), y: r.top + b.y + b.h / 2}; })()"
    )
    browser.call("Input.dispatchMouseEvent", type="mouseMoved", x=box["x"], y=box["y"])
    text: str = browser.wait_for(
        "(() => { const tip = document.querySelector('.gymtrace-timeline .tip');"
        " return tip.hidden ? '' : tip.innerText; })()",
        what="the tooltip",
    )
    return text


def _number(value: Any) -> str:
    """How the report writes a figure (``_read.pictures.report._number``)."""
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def test_the_report_draws_the_figures_stats_and_compare_print(browser: Browser, tmp_path: Path) -> None:
    base, new = tmp_path / "base.jsonl", tmp_path / "new.jsonl"
    run_gymtrace("demo", "--quiet", "--file", str(base), "--run-id", "base", cwd=tmp_path, check=True)
    run_gymtrace("demo", "--quiet", "--file", str(new), "--run-id", "new", cwd=tmp_path, check=True)
    page = tmp_path / "report.html"
    run_gymtrace("report", new.name, "--baseline", base.name, "-o", page.name, cwd=tmp_path, check=True)
    (stats,) = _json("stats", str(new), "--json")
    rows = {r["rollout_id"]: r for r in _json("rollouts", str(new), "--json")}
    episodes = [s for s in read_otlp_json_lines(new) if s.attributes.get(c.KIND) == c.KIND_EPISODE]

    drawn = _open(browser, page)
    shots = ARTIFACTS
    browser.screenshot(shots / "report.png")
    figures = browser.evaluate(FIGURES_JS)
    for key in ("scored", "unscored", "pending", "lost", "mean_reward", "inputs", "rollout_seconds_p50"):
        value, text = figures[key]
        assert value == stats.get(key, 0), key
        assert text == (_number(value) if not key.startswith("rollout_seconds") else f"{value:.4g}s"), key
    for part in c.SPLIT_PARTS:
        assert figures[f"time_split.{part}"][0] == stats["time_split"][part]
    for task, body in stats["pass_at_k"].items():
        assert figures[f"pass_at_k.{task}"][0] == body["value"]
    (compared,) = _json("compare", str(base), str(new), "--json")
    assert figures["compare.verdict"][0] == compared["verdict"]

    # The histogram: ten bins holding every scored reward; the baseline's dashed beside them.
    bins = browser.evaluate(
        "Array.from(document.querySelectorAll('svg.histogram rect.bar')).map(r => +r.dataset.count)"
    )
    assert len(bins) == 10 and sum(bins) == stats["scored"]
    # The split bar: five parts, each as wide as its share of the run's time (600 px in all).
    widths = browser.evaluate(
        "Array.from(document.querySelectorAll('.split-run svg.split rect.part')).map(r => r.getBBox().width)"
    )
    total = sum(stats["time_split"].values())
    assert len(widths) == 5
    for width, part in zip(widths, c.SPLIT_PARTS, strict=True):
        assert math.isclose(width, 600 * stats["time_split"][part] / total, abs_tol=0.05), part
    # The tables: a row per failed rollout, and per slowest.
    failed = [r for r in rows.values() if r["outcome"] in ("unscored", "lost")]
    assert browser.evaluate("document.querySelectorAll('table.failed tr').length") == len(failed) + 1

    # The timeline drew a bar per episode, marked the failed ones, the retries and the slowest 1 %.
    assert drawn["bars"] == drawn["drawn"] == len(episodes) == sum(r["attempts"] for r in rows.values())
    assert drawn["failed"] == sum(
        1 for e in episodes if e.attributes.get(c.EPISODE_OUTCOME) in (c.OUTCOME_FAILED, c.OUTCOME_CANCELLED)
    )
    assert drawn["retries"] == sum(1 for e in episodes if e.attributes[c.EPISODE_ATTEMPT] > 0)
    assert drawn["outlined"] == math.ceil(0.01 * len(rows))
    # A pixel shows the part that held most of its time, and the demo's parts take what the machine
    # gives them (a loaded CI machine left verify the most of no pixel): every part painted took
    # time, and the part that took the most is painted. Every part painted on chosen times: below.
    pixels = browser.evaluate("window.gymtraceTimelines[0].countPartPixels()")
    took = [stats["time_split"][part] for part in c.SPLIT_PARTS]
    assert all(took[i] > 0 for i, count in enumerate(pixels[:5]) if count), (pixels, took)
    assert pixels[took.index(max(took))] > 0, (pixels, took)

    # Hovering a retried bar names its rollout, attempt, reward and trace.
    retried = next(r for r in rows.values() if r["attempts"] > 1 and r["outcome"] == "scored")
    index = browser.evaluate(
        "(() => { const d = window.gymtraceTimelines[0].data;"
        f" const r = d.rollouts.id.indexOf({json.dumps(retried['rollout_id'])});"
        " return d.bars.rollout.findIndex((x, i) => x === r && d.bars.attempt[i] === 1); })()"
    )
    tip = _hover_bar(browser, index)
    browser.screenshot(shots / "report-hover.png")
    assert f"rollout: {retried['rollout_id']}" in tip
    assert f"attempt: 1 of {retried['attempts']}" in tip
    assert f"reward: {retried['reward']:g}" in tip
    assert f"trace ID: {retried['trace_id']}" in tip


def test_the_timeline_paints_each_part_of_an_episodes_time_in_its_colour(
    browser: Browser, tmp_path: Path
) -> None:
    run = BuiltRun("parts")
    for n in range(8):  # episodes of 40 ms: env, model, tool and verify 10 ms each, side by side
        start = n * 50_000
        rollout = run.rollout(f"r{n}", repeat=n)
        episode = rollout.episode(start, start + 40_000, reward=1.0)
        for i, kind in enumerate((c.KIND_SEED_SESSION, c.KIND_MODEL_CALL, c.KIND_TOOL_CALL, c.KIND_VERIFY)):
            episode.child(kind, start + i * 10_000, start + (i + 1) * 10_000)
        rollout.end(reward=1.0)
    page = tmp_path / "parts.html"
    run_gymtrace("timeline", str(run.write(tmp_path / "parts.jsonl")), "-o", str(page), check=True)
    _open(browser, page)
    pixels = browser.evaluate("window.gymtraceTimelines[0].countPartPixels()")
    order = {part: i for i, part in enumerate(c.SPLIT_PARTS)}
    painted = [pixels[order[part]] for part in ("model", "tool", "env", "verify")]
    assert all(count > 0 for count in painted), pixels
    assert max(painted) < 2 * min(painted), pixels  # equal times, about equal pixels
    assert pixels[order["other"]] == 0, pixels  # nothing of these episodes is unclaimed


def test_the_timeline_of_a_training_run_draws_its_workers_steps_and_bars(
    browser: Browser, tmp_path: Path
) -> None:
    trace = tmp_path / "train.jsonl"
    run_gymtrace(
        "demo", "--training", "--quiet", "--file", str(trace), "--run-id", "grpo", cwd=tmp_path, check=True
    )
    page = tmp_path / "timeline.html"
    run_gymtrace("timeline", str(trace), "-o", str(page), check=True)
    steps = _json("stats", "--by", "train_step", str(trace), "--json")
    rows = _json("rollouts", str(trace), "--json")
    drawn = _open(browser, page)
    browser.screenshot(ARTIFACTS / "timeline-training.png")
    assert drawn["bands"] == len([s for s in steps if "train_step" in s])
    assert drawn["drawn"] == drawn["bars"] == sum(r["attempts"] for r in rows)
    workers = {service for r in rows for service in r["services"]}
    assert drawn["lanes"] >= len(workers) == 2
    heading = browser.evaluate("document.querySelector('.summary').innerText")
    assert f"{len(rows)} rollouts" in heading and f"{drawn['bands']} train steps" in heading


def test_lanes_beyond_the_screen_share_pixel_rows_until_zoomed_apart(
    browser: Browser, tmp_path: Path
) -> None:
    run = BuiltRun("wide")
    for n in range(3_000):  # durations and model shares scattered (deterministically) across rollouts
        start, took = n * 10, 2_000 + n * 7_919 % 6_000
        rollout = run.rollout(f"r{n}", repeat=n)
        episode = rollout.episode(start, start + took, reward=1.0)
        episode.child(c.KIND_SEED_SESSION, start, start + 300)
        episode.child(c.KIND_MODEL_CALL, start + 300, start + 300 + took * (n % 7 + 2) // 10)
        episode.child(c.KIND_VERIFY, start + took - 200, start + took)
        rollout.end(reward=1.0)
    page = tmp_path / "wide.html"
    run_gymtrace(
        "timeline", str(run.write(tmp_path / "wide.jsonl")), "--lanes", "rollout", "-o", str(page), check=True
    )
    drawn = _open(browser, page)
    assert drawn["lanes"] == drawn["drawn"] == 3_000
    assert drawn["lanesPerRow"] == math.ceil(3_000 / 640)  # 640 pixel rows of lanes at most
    browser.screenshot(ARTIFACTS / "timeline-3000-lanes.png")
    # Shift + wheel over the canvas zooms the lanes: after enough turns, a lane has rows of its own.
    browser.evaluate("window.gymtraceTimelines[0].canvas.scrollIntoView({block: 'center'})")
    box = browser.evaluate("(() => { const r = window.gymtraceTimelines[0].canvas.getBoundingClientRect();"
                           " return {x: r.left + r.width / 2, y: r.top + r.height / 2}; })()")  # fmt: skip
    for _ in range(20):
        browser.call(
            "Input.dispatchMouseEvent",
            type="mouseWheel",
            x=box["x"],
            y=box["y"],
            deltaX=0,
            deltaY=-100,
            modifiers=8,
        )
    zoomed = browser.wait_for(
        "(() => { const f = window.gymtraceTimelines[0].figures; return f.lanesPerRow === 1 ? f : null; })()",
        what="lanes zoomed apart",
    )
    assert zoomed["drawn"] < 3_000  # only the lanes in view
    browser.screenshot(ARTIFACTS / "timeline-3000-lanes-zoomed.png")
