"""``gymtrace timeline``: a run's episodes on one canvas (HTML), or as Chrome trace-event JSON.

The HTML page is self-contained: the data, the script (``timeline.js`` beside this module) and the
style are inside it; it loads nothing. The data is compact and columnar (a list per field, times in
integer microseconds from the run's first start, strings once in a table), so a run of 100,000
rollouts is a page of a few tens of megabytes that the browser parses in well under a second, and
drawing is one canvas, not an element per bar.

``--format chrome`` writes the Trace Event Format (the JSON object form: ``traceEvents`` and
``displayTimeUnit``) that Perfetto and ``chrome://tracing`` open: a process per lane group (a
worker process, or all rollouts), a thread per lane, a complete event (``ph: X``) per episode with
its rollout, attempt, reward and trace ID as ``args``, and inside it a complete event per stretch of
its time a part took (the time split's segments: where in the episode the model, the tools, the
environment and the scorer had it).
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from typing import Any, TextIO

from gymtrace import _constants as c
from gymtrace._read.pictures.runview import LANES_ROLLOUT, RunView
from gymtrace._read.timesplit import OTHER, PARTS, segments, times_text

# Bar flags (timeline.js reads the same bits).
FAILED, CANCELLED, LOST, RETRY, SLOW, NOSPLIT, RESTORED = (1, 2, 4, 8, 16, 32, 64)
# The colours of the parts (timeline.js and the report's figures draw with the same).
PART_COLORS = ("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#c9c3bd")


def _us(ns: int) -> int:
    return round(ns / 1000)


def _asset(name: str) -> str:
    return resources.files("gymtrace._read.pictures").joinpath(name).read_text(encoding="utf-8")


def timeline_data(view: RunView) -> dict[str, Any]:
    """The compact data ``timeline.js`` draws (see the module doc)."""
    origin = view.start_ns
    tasks: dict[str, int] = {}
    outcomes: dict[str, int] = {}

    def code(table: dict[str, int], value: str) -> int:
        return table.setdefault(value, len(table))

    rollouts: dict[str, list[Any]] = {
        k: [] for k in ("id", "task", "trace", "reward", "outcome", "failure", "attempts")
    }
    for row in view.rollouts:
        o = row.outcome
        rollouts["id"].append(o.rollout_id)
        rollouts["task"].append(code(tasks, o.task_id or "-"))
        rollouts["trace"].append(o.trace_id)
        rollouts["reward"].append(o.reward)
        rollouts["outcome"].append(code(outcomes, o.outcome))
        rollouts["failure"].append(row.failure)
        rollouts["attempts"].append(o.attempts)
    bars: dict[str, list[int]] = {
        k: [] for k in ("lane", "start", "dur", "rollout", "attempt", "flags", "outcome", "split")
    }
    for bar in view.bars:
        start = _us(bar.start_ns - origin)
        bars["lane"].append(bar.lane)
        bars["start"].append(start)
        bars["dur"].append(max(0, _us(bar.end_ns - origin) - start))
        bars["rollout"].append(bar.rollout)
        bars["attempt"].append(bar.attempt)
        said = (
            bar.outcome
            if bar.outcome == c.OUTCOME_LOST
            else f"{bar.outcome} ({bar.failure})"
            if bar.failure
            else bar.outcome
        )
        bars["outcome"].append(code(outcomes, said))
        bars["flags"].append(_flags(view, bar))
        parts = bar.split.parts()[:OTHER] if bar.split is not None else (0, 0, 0, 0)
        bars["split"].extend(_us(ns) for ns in parts)
    return {
        "run": view.name,
        "lanes_by": view.lanes_by,
        "origin_ns": str(origin),
        "span_us": _us(view.end_ns - origin),
        "parts": list(PARTS),
        "lanes": view.lanes,
        "tasks": list(tasks),
        "outcomes": list(outcomes),
        "rollouts": rollouts,
        "bars": bars,
        "bands": [
            [_us(b.start_ns - origin), _us(b.end_ns - origin), _band_label(b.step, b.policy_version)]
            for b in view.bands
        ],
    }


def _band_label(step: int | None, version: Any) -> str:
    return f"step {'?' if step is None else step}" + (f" (policy {version})" if version is not None else "")


def _flags(view: RunView, bar: Any) -> int:
    flags = 0
    if bar.outcome == c.OUTCOME_FAILED:
        flags |= FAILED
    elif bar.outcome == c.OUTCOME_CANCELLED:
        flags |= CANCELLED
    elif bar.outcome == c.OUTCOME_LOST:
        flags |= LOST
    if bar.attempt > 0:
        flags |= RETRY
    if view.rollouts[bar.rollout].slowest:
        flags |= SLOW
    if bar.split is None:
        flags |= NOSPLIT
    if bar.restored:
        flags |= RESTORED
    return flags


def _script_json(value: Any) -> str:
    """JSON that is safe inside a ``<script>`` element (no ``</`` can close it)."""
    return json.dumps(value, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")


@dataclass(frozen=True)
class Embedded:
    """A timeline ready to go into a page: its element, its data element and its script."""

    element: str
    data: str
    script: str


def embed(view: RunView, element_id: str = "timeline") -> Embedded:
    """The pieces of a page that draw ``view``'s timeline (the timeline page and the report use them)."""
    legend = "".join(
        f'<span class="swatch" style="background:{color}"></span>{name} '
        for name, color in zip(PARTS, PART_COLORS, strict=True)
    )
    element = (
        f'<div class="gymtrace-timeline" id="{element_id}" data-source="{element_id}-data">'
        f'<div class="legend">{legend}<span class="swatch plain"></span>no split '
        '<span class="mark failed"></span>failed attempt <span class="mark lost"></span>lost '
        '<span class="mark retry"></span>retry <span class="mark slow"></span>slowest 1 % '
        '<span class="swatch band"></span>train step</div>'
        '<canvas></canvas><div class="tip" hidden></div><p class="status"></p></div>'
    )
    data = (
        f'<script type="application/json" id="{element_id}-data">{_script_json(timeline_data(view))}</script>'
    )
    return Embedded(element, data, f"<script>{_asset('timeline.js')}</script>")


def style() -> str:
    return f"<style>{_asset('page.css')}</style>"


def summary_text(view: RunView) -> str:
    """The timeline's heading: what it draws, and the run's time figures as ``gymtrace stats`` says them."""
    stats = view.stats
    counts = (
        f"{stats.rollouts} rollouts ({stats.scored} scored, {stats.unscored} unscored"
        + (f", {stats.pending} pending" if stats.pending else "")
        + (f", {stats.lost} lost" if stats.lost else "")
        + ")"
        if stats is not None
        else "no rollouts"
    )
    return (
        f"{counts}, {len(view.bars)} bars in {len(view.lanes)} lanes, {len(view.bands)} train steps;"
        f" {times_text(view.times)}"
    )


def timeline_page(view: RunView) -> str:
    """The whole page of ``gymtrace timeline -o run.html``."""
    summary = summary_text(view)
    parts = embed(view)
    lanes = "rollout" if view.lanes_by == LANES_ROLLOUT else "worker process"
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>gymtrace timeline: {html.escape(view.name)}</title>{style()}</head><body>"
        f"<h1>Run {html.escape(view.name)}</h1>"
        f'<p class="summary">{html.escape(summary)}</p>'
        f"<p>A bar per episode, a lane per {lanes}; a bar's colours are its time split in proportion"
        " (where in time each part fell is in the trace: open its trace ID in Jaeger).</p>"
        f"{parts.element}{parts.data}{parts.script}</body></html>"
    )


# -- Chrome trace-event JSON ------------------------------------------------------------------------


def chrome_events(view: RunView) -> Iterator[dict[str, Any]]:
    """The events of the Trace Event Format of ``view`` (see the module doc), one at a time (a
    run of 100,000 rollouts is two million of them); times in microseconds from the run's first
    episode, fractional to the nanosecond."""
    origin = view.start_ns

    def complete(
        name: str, cat: str, start: int, end: int, pid: int, tid: int, **more: Any
    ) -> dict[str, Any]:
        """A complete event (``ph: X``) from ``start`` to ``end`` (ns)."""
        return {
            "ph": "X",
            "name": name,
            "cat": cat,
            "ts": (start - origin) / 1000,
            "dur": (end - start) / 1000,
            "pid": pid,
            "tid": tid,
            **more,
        }

    groups: dict[str, int] = {}
    lane_group: dict[int, int] = {}
    for bar in view.bars:
        if bar.lane in lane_group:
            continue
        label = view.lanes[bar.lane]
        group = "rollouts" if view.lanes_by == LANES_ROLLOUT else label.rsplit(" #", 1)[0]
        if group not in groups:
            groups[group] = len(groups) + 1
            yield {"ph": "M", "name": "process_name", "pid": groups[group], "tid": 0, "args": {"name": group}}
        lane_group[bar.lane] = groups[group]
        yield {
            "ph": "M",
            "name": "thread_name",
            "pid": groups[group],
            "tid": bar.lane + 1,
            "args": {"name": label},
        }
    for bar in view.bars:
        o = view.rollouts[bar.rollout].outcome
        pid, tid = lane_group[bar.lane], bar.lane + 1
        args: dict[str, Any] = {
            "rollout_id": o.rollout_id,
            "task_id": o.task_id,
            "attempt": bar.attempt,
            "episode_outcome": bar.outcome,
            "rollout_outcome": o.outcome,
            "reward": o.reward,
            "trace_id": o.trace_id,
        }
        if bar.failure:
            args["failure_kind"] = bar.failure
        if bar.split is not None:
            args["time_split"] = bar.split.seconds()
        name = f"{o.rollout_id} a{bar.attempt}"
        yield complete(name, "episode", bar.start_ns, bar.end_ns, pid, tid, args=args)
        if bar.split is None or bar.episode is None:
            continue
        intervals, _ = view.episode_times.intervals(bar.episode)
        for part, start, end in segments(bar.start_ns, bar.end_ns, intervals):
            if part != OTHER:
                yield complete(PARTS[part], PARTS[part], start, end, pid, tid)
    if view.bands:
        yield {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "train steps"}}
    for band in view.bands:
        yield complete(
            _band_label(band.step, band.policy_version), "train_step", band.start_ns, band.end_ns, 0, 0
        )


def write_chrome_trace(view: RunView, out: TextIO) -> None:
    """The Trace Event Format's JSON object (``traceEvents``, ``displayTimeUnit``, ``otherData``),
    written as the events are made."""
    other = {"run_id": view.name, "origin_unix_ns": str(view.start_ns)}
    out.write('{"displayTimeUnit":"ms","otherData":' + json.dumps(other) + ',"traceEvents":[')
    for n, event in enumerate(chrome_events(view)):
        out.write(("," if n else "") + json.dumps(event, separators=(",", ":"), allow_nan=False))
    out.write("]}")
