"""``gymtrace report``: one self-contained HTML page of a run, beside a baseline run when given.

What it shows, each figure from the code the command-line readers use (so the page and
``gymtrace stats --json`` cannot disagree): the outcome counts and the mean reward
(``_read.stats``), the reward histogram, pass@k (``_read.passk``), the time split as a stacked bar
with the p50 / p99 rollout duration (``_read.timesplit``), the timeline (``timeline.py``), the
slowest rollouts and the failed ones (IDs, attempts, failure kind, trace IDs). With a baseline,
``gymtrace compare``'s verdicts (``_read.compare``, the baseline as A and this run as B: every
delta is this run minus the baseline) stand beside the figure they judge.

The figures are inline SVG and text; the page loads nothing. Every figure's exact value is also in
a ``data-value`` attribute beside its text (``data-figure`` names it), for tests and scrapers.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Iterable, Sequence
from typing import Any

from gymtrace import _constants as c
from gymtrace._read.compare import VERDICT_REFUSED, Comparison
from gymtrace._read.pictures.runview import RolloutRow, RunView
from gymtrace._read.pictures.timeline import PART_COLORS, embed, style
from gymtrace._read.timesplit import PARTS, seconds_text, split_text

# Rows a table of rollouts (of tasks) shows before it says how many more there are.
TABLE_ROWS = 50
TASK_ROWS = 20
HISTOGRAM_BINS = 10


def _e(value: object) -> str:
    return html.escape(str(value))


def _number(value: float | int | None) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _figure(name: str, value: Any, text: str | None = None) -> str:
    """A figure's text, with its exact value in ``data-value`` (JSON)."""
    shown = _number(value) if text is None else text
    return f"<span data-figure=\"{_e(name)}\" data-value='{_e(json.dumps(value))}'>{_e(shown)}</span>"


def _verdict(markup: str, css: str = "") -> str:
    """A compare verdict beside its figure (``markup`` is HTML: escape what goes into it)."""
    return f'<div class="verdict {_e(css)}">{markup}</div>'


# -- figures -----------------------------------------------------------------------------------------


def _outcomes(view: RunView, baseline: RunView | None, comparison: Comparison | None) -> str:
    rows: list[tuple[str, str, Any, Any]] = []

    def figures(v: RunView | None) -> dict[str, Any]:
        if v is None or v.stats is None:
            return {}
        s = v.stats
        return {
            "rollouts": s.rollouts,
            "scored": s.scored,
            "unscored": s.unscored,
            "pending": s.pending,
            "lost": s.lost,
            "episodes": len([b for b in v.bars if b.episode is not None]),
            "retried": sum(1 for b in v.bars if b.attempt > 0),
            "mean_reward": s.mean_reward,
            "inputs": s.inputs,
        }

    mine, theirs = figures(view), figures(baseline)
    labels = {
        "rollouts": "rollouts",
        "scored": "scored",
        "unscored": "unscored (no reward, never a 0)",
        "pending": "pending (outcome expected from another process)",
        "lost": "lost (its process died)",
        "episodes": "episodes",
        "retried": "attempts after the first (retries)",
        "mean_reward": "mean reward (over scored)",
        "inputs": "rewards in the mean",
    }
    for key, label in labels.items():
        rows.append((key, label, mine.get(key), theirs.get(key)))
    head = (
        "<tr><th>outcome</th><th class=num>this run</th>"
        + ("<th class=num>baseline</th>" if baseline else "")
        + "</tr>"
    )
    body = "".join(
        f"<tr><td>{_e(label)}</td><td class=num>{_figure(key, value)}</td>"
        + (f"<td class=num>{_figure('baseline.' + key, other)}</td>" if baseline else "")
        + "</tr>"
        for key, label, value, other in rows
    )
    sharing = (
        f'<p class="note">{view.runs_sharing_id} runs share run ID {_e(view.name)} (a re-run appended to the'
        " same file?); the figures are the first one's, as the first line of gymtrace stats.</p>"
        if view.runs_sharing_id > 1
        else ""
    )
    verdict = ""
    if comparison is not None:
        a, b = comparison.a_unscored_share, comparison.b_unscored_share
        refused = comparison.verdict == VERDICT_REFUSED
        verdict = _verdict(
            f"unscored share: baseline {a:.1%}, this run {b:.1%}"
            + (f" — <b>compare refuses a verdict</b>: {_e(comparison.reason)}" if refused else ""),
            "refused" if refused else "",
        )
    return f"<h2>Outcomes</h2><table>{head}{body}</table>{sharing}{verdict}"


def _bins(values: Sequence[float]) -> tuple[float, float, int]:
    """Equal bins over [0, 1] when every reward is in it (the common case), else over the range."""
    low, high = (min(values), max(values)) if values else (0.0, 1.0)
    if low >= 0.0 and high <= 1.0:
        return 0.0, 1.0, HISTOGRAM_BINS
    if low == high:
        return low - 0.5, high + 0.5, 1
    return low, high, HISTOGRAM_BINS


def _counts(values: Iterable[float], low: float, high: float, bins: int) -> list[int]:
    counts = [0] * bins
    for value in values:
        index = min(bins - 1, max(0, math.floor((value - low) / (high - low) * bins)))
        counts[index] += 1
    return counts


def _scored(view: RunView | None) -> list[float]:
    if view is None:
        return []
    return [
        r.outcome.reward
        for r in view.rollouts
        if r.outcome.outcome == c.OUTCOME_SCORED and r.outcome.reward is not None
    ]


def _histogram(view: RunView, baseline: RunView | None, comparison: Comparison | None) -> str:
    mine, theirs = _scored(view), _scored(baseline)
    low, high, bins = _bins(mine + theirs)
    counts, base = _counts(mine, low, high, bins), _counts(theirs, low, high, bins)
    top = max([*counts, *base, 1])
    width, height, pad = 460, 160, 28
    step = (width - pad) / bins
    shapes = []
    for i in range(bins):
        x = pad + i * step
        h = (height - 20) * counts[i] / top
        lo_edge = low + (high - low) * i / bins
        hi_edge = low + (high - low) * (i + 1) / bins
        label = f"[{lo_edge:.3g}, {hi_edge:.3g}{']' if i == bins - 1 else ')'}: {counts[i]}"
        shapes.append(
            f'<rect class="bar" data-count="{counts[i]}" x="{x + 1:.1f}" y="{height - h:.1f}" width="{step - 2:.1f}"'
            f' height="{h:.1f}" fill="{PART_COLORS[0]}"><title>{_e(label)}</title></rect>'
        )
        if baseline is not None:
            bh = (height - 20) * base[i] / top
            shapes.append(
                f'<rect class="baseline" data-count="{base[i]}" x="{x + 1:.1f}" y="{height - bh:.1f}"'
                f' width="{step - 2:.1f}" height="{bh:.1f}" fill="none" stroke="#222" stroke-dasharray="3 2"/>'
            )
    axis = (
        f'<text x="{pad}" y="{height + 14}" font-size="11">{low:.3g}</text>'
        f'<text x="{width - 24}" y="{height + 14}" font-size="11">{high:.3g}</text>'
        f'<text x="0" y="12" font-size="11">{top}</text>'
    )
    svg = f'<svg class="histogram" width="{width}" height="{height + 18}" role="img">{"".join(shapes)}{axis}</svg>'
    note = f"{len(mine)} scored rewards" + (" (dashed: the baseline's)" if baseline is not None else "")
    verdict = ""
    if comparison is not None:
        ci = comparison.ci95
        verdict = _verdict(
            f"mean reward delta (this run - baseline, mean of per-task deltas):"
            f" {_figure('compare.delta', comparison.delta, '-' if comparison.delta is None else f'{comparison.delta:+.3f}')},"
            f" 95% CI {'n/a' if ci is None else f'[{ci[0]:+.3f}, {ci[1]:+.3f}]'};"
            f" verdict {_figure('compare.verdict', comparison.verdict, comparison.verdict)} ({_e(comparison.reason)})",
            comparison.verdict,
        )
    return f'<div class="figure"><h2>Reward histogram</h2>{svg}<p class="note">{note}</p>{verdict}</div>'


def _pass_at_k(view: RunView, baseline: RunView | None, comparison: Comparison | None) -> str:
    stats = view.stats
    tasks = {p.task_id: p for p in (stats.pass_at_k if stats else ())}
    base = {p.task_id: p for p in (baseline.stats.pass_at_k if baseline and baseline.stats else ())}
    deltas = {t.task_id: t for t in comparison.tasks} if comparison is not None else {}
    names = sorted(set(tasks) | set(base))
    if not names:
        return (
            '<div class="figure"><h2>pass@k</h2><p class="note">No task has more than one repeat.</p></div>'
        )
    flipped = set(comparison.pass_to_fail + comparison.fail_to_pass) if comparison is not None else set()

    def first_shown(name: str) -> tuple[bool, float, float, str]:
        """Flips first, then the largest change, then the lowest pass@k."""
        delta = deltas[name].delta if name in deltas else None
        mine = tasks[name].value if name in tasks else None
        return (
            name not in flipped,
            -abs(delta) if delta is not None else 0.0,
            mine if mine is not None else 2.0,
            name,
        )

    shown = sorted(names, key=first_shown)[:TASK_ROWS]
    by_k: dict[int, list[float]] = {}
    for found in tasks.values():
        if found.value is not None:
            by_k.setdefault(found.k, []).append(found.value)
    means = "; ".join(
        f"pass@{k} {_figure(f'pass_at_k_mean.{k}', math.fsum(v) / len(v), f'{math.fsum(v) / len(v):.4g}')}"
        f" over {len(v)} task{'s' if len(v) != 1 else ''}"
        for k, v in sorted(by_k.items())
    )
    summary = f'<p class="note">Mean per-task pass@k (k = the task\'s scored repeats): {means or "n/a"}.</p>'
    more = (
        f'<p class="note">{len(names) - len(shown)} more tasks not listed (flips, the largest changes'
        " and the lowest pass@k first).</p>"
        if len(names) > len(shown)
        else ""
    )
    head = (
        "<tr><th>task</th><th class=num>pass@k</th><th class=num>passed / scored</th>"
        + ("<th class=num>baseline</th><th class=num>mean Δ</th>" if baseline else "")
        + "</tr>"
    )
    rows = []
    for name in shown:
        p, b = tasks.get(name), base.get(name)
        mine = (
            f"<td class=num>{_figure(f'pass_at_k.{name}', p.value, f'pass@{p.k} {_number(p.value)}')}</td>"
            f"<td class=num>{p.passed}/{p.n}" + (f" (+{p.unscored} unscored)" if p.unscored else "") + "</td>"
            if p
            else "<td class=num>-</td><td class=num>-</td>"
        )
        other = ""
        if baseline is not None:
            delta = deltas[name].delta if name in deltas else None
            other = (
                f"<td class=num>{'-' if b is None else f'pass@{b.k} {_number(b.value)}'}</td>"
                f"<td class=num>{'-' if delta is None else f'{delta:+.3f}'}</td>"
            )
        rows.append(f"<tr><td>{_e(name)}</td>{mine}{other}</tr>")
    verdict = ""
    if comparison is not None:
        verdict = _verdict(
            f"flips at {comparison.threshold:g}: pass→fail {len(comparison.pass_to_fail)}"
            f" {_e(list(comparison.pass_to_fail))}, fail→pass {len(comparison.fail_to_pass)}"
            f" {_e(list(comparison.fail_to_pass))}",
        )
    return (
        f'<div class="figure"><h2>pass@k</h2>{summary}<table class="passk">{head}{"".join(rows)}</table>'
        f"{more}{verdict}</div>"
    )


def _split_bar(split: dict[str, float] | None, label: str, css: str) -> str:
    width, height = 600, 22
    if not split:
        return f'<p class="note">{_e(label)}: no time split (no episode spans)</p>'
    whole = math.fsum(split.values()) or 1.0
    at = 0.0
    rects = []
    for name, color in zip(PARTS, PART_COLORS, strict=True):
        w = width * split[name] / whole
        rects.append(
            f'<rect class="part" data-part="{name}" x="{at:.2f}" y="0" width="{w:.2f}" height="{height}"'
            f' fill="{color}"><title>{name} {seconds_text(split[name])} ({split[name] / whole:.1%})</title></rect>'
        )
        at += w
    return f'<div class="{css}"><div>{_e(label)}</div><svg class="split" width="{width}" height="{height}">{"".join(rects)}</svg></div>'


def _time(view: RunView, baseline: RunView | None) -> str:
    times = view.times
    split = times.get("time_split")
    legend = (
        "".join(
            f'<span class="swatch" style="background:{color}"></span>{name}'
            f" {_figure(f'time_split.{name}', split[name], seconds_text(split[name]))}"
            f" ({(times.get('time_share') or {}).get(name, 0.0):.0%})"
            for name, color in zip(PARTS, PART_COLORS, strict=True)
        )
        if split
        else ""
    )
    rows = [
        _split_bar(split, "this run", "split-run"),
        f'<div class="legend">{legend}</div>',
    ]
    durations = (
        f"rollout duration p50 {_figure('rollout_seconds_p50', times.get('rollout_seconds_p50'), seconds_text(times.get('rollout_seconds_p50')))},"
        f" p99 {_figure('rollout_seconds_p99', times.get('rollout_seconds_p99'), seconds_text(times.get('rollout_seconds_p99')))}"
    )
    if baseline is not None:
        theirs = baseline.times
        rows.append(_split_bar(theirs.get("time_split"), "baseline", "split-baseline"))
        rows.append(
            f'<p class="note">baseline: {_e(split_text(theirs.get("time_split"), theirs.get("time_share")))}</p>'
        )
        changes = []
        for key in ("rollout_seconds_p50", "rollout_seconds_p99"):
            a, b = theirs.get(key), times.get(key)
            if a is not None and b is not None:
                changes.append(
                    f"{key[-3:]} {b - a:+.4g}s ({(b - a) / a:+.0%})" if a else f"{key[-3:]} {b - a:+.4g}s"
                )
        durations += (
            f"; baseline p50 {seconds_text(theirs.get('rollout_seconds_p50'))}, p99"
            f" {seconds_text(theirs.get('rollout_seconds_p99'))}"
        )
        rows.append(
            _plain_verdict(
                "change in rollout duration (this run - baseline): " + (", ".join(changes) or "n/a")
            )
        )
    return (
        '<h2>Where the time went</h2><p class="note">Each rollout\'s episodes cut into model, tool, env'
        " (seed session and environment steps), verify and other (the harness, queueing) as unions of"
        " intervals; where parts overlap the first of model &gt; tool &gt; env &gt; verify takes the"
        f" time. Summed over the run's rollouts.</p>{''.join(rows)}<p>{durations}</p>"
    )


def _plain_verdict(text: str) -> str:
    return _verdict(_e(text))


def _split_cell(row: RolloutRow) -> str:
    if row.split is None:
        return "-"
    seconds = row.split.seconds()
    return ", ".join(f"{name} {seconds_text(seconds[name])}" for name in PARTS if seconds[name] > 0)


def _rollout_table(rows: Sequence[RolloutRow], css: str, *, split: bool) -> str:
    head = (
        "<tr><th>rollout</th><th>task</th><th class=num>attempts</th><th>outcome</th><th>failure kind</th>"
        "<th class=num>reward</th><th class=num>duration</th>"
        + ("<th>split</th>" if split else "")
        + "<th>trace ID</th></tr>"
    )
    body = []
    for row in rows[:TABLE_ROWS]:
        o = row.outcome
        body.append(
            f"<tr><td class=id>{_e(o.rollout_id)}</td><td>{_e(o.task_id or '-')}</td><td class=num>{o.attempts}</td>"
            f"<td>{_e(o.outcome)}</td><td>{_e(row.failure or '-')}</td><td class=num>{_number(o.reward)}</td>"
            f"<td class=num>{seconds_text(row.seconds)}</td>"
            + (f"<td>{_e(_split_cell(row))}</td>" if split else "")
            + f"<td class=id>{_e(o.trace_id)}</td></tr>"
        )
    more = f'<p class="note">and {len(rows) - TABLE_ROWS} more</p>' if len(rows) > TABLE_ROWS else ""
    return f'<table class="{css}">{head}{"".join(body)}</table>{more}'


def _slowest(view: RunView) -> str:
    rows = view.slowest
    return (
        f'<h2>Slowest rollouts</h2><p class="note">The slowest 1 % ({len(rows)} of {len(view.rollouts)}),'
        " outlined in the timeline; their trace IDs open them in Jaeger.</p>"
        + _rollout_table(rows, "slowest", split=True)
    )


def _failed(view: RunView) -> str:
    rows = [r for r in view.rollouts if r.outcome.outcome in (c.OUTCOME_UNSCORED, c.OUTCOME_LOST)]
    retried = sum(
        1 for r in view.rollouts if r.outcome.attempts > 1 and r.outcome.outcome == c.OUTCOME_SCORED
    )
    note = (
        f"{len(rows)} rollout{'s' if len(rows) != 1 else ''} without a reward; {retried} more"
        f" {'were' if retried != 1 else 'was'} scored after a failed attempt."
    )
    return f'<h2>Failed rollouts</h2><p class="note">{note}</p>' + (
        _rollout_table(rows, "failed", split=False) if rows else ""
    )


def report_page(
    view: RunView,
    *,
    source: str,
    baseline: RunView | None = None,
    baseline_source: str = "",
    comparison: Comparison | None = None,
) -> str:
    """The report of ``view`` (read from ``source``), beside ``baseline`` when given."""
    title = f"gymtrace report: {view.name}"
    head = (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>{style()}</head><body>'
        f'<h1>Run {_e(view.name)}</h1><p class="summary">read from {_e(source)}'
        + (f"; baseline run {_e(baseline.name)} from {_e(baseline_source)}" if baseline is not None else "")
        + "</p>"
    )
    if not view.rollouts:
        return (
            head
            + f'<p class="empty" data-figure="empty">Run {_e(view.name)} holds no rollouts in this input:'
            " no rollout span, outcome record or live marker of it was found. Nothing to draw.</p></body></html>"
        )
    timeline = embed(view)
    body = [
        _outcomes(view, baseline, comparison),
        '<div class="figures">',
        _histogram(view, baseline, comparison),
        _pass_at_k(view, baseline, comparison),
        "</div>",
        _time(view, baseline),
        f"<h2>Timeline</h2>{timeline.element}",
        _slowest(view),
        _failed(view),
    ]
    return head + "".join(body) + timeline.data + timeline.script + "</body></html>"
