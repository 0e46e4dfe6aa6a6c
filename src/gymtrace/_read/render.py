"""Render finished spans as an indented tree, one line per span (used by the CLI and tests)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from gymtrace import _constants as c
from gymtrace._model.spandata import SpanData, normalize
from gymtrace._read.outcomes import final_outcomes
from gymtrace._scopes.levels import LEVELS

_IDENTITY_SHORT = (
    (c.RUN_ID, "run"),
    (c.TASK_ID, "task"),
    (c.ROLLOUT_ID, "rollout"),
    (c.ROLLOUT_REPEAT, "repeat"),
    (c.EPISODE_ATTEMPT, "attempt"),
)
# Attributes shown on every kind of span; each level adds its own (``Level.shown``).
_ALWAYS_SHOWN = ((c.HIERARCHY_VIOLATION, "VIOLATION"), (c.INTERRUPTED, "interrupted"))
_SHOWN = {kind: (*level.shown, *_ALWAYS_SHOWN) for kind, level in LEVELS.items()}
if c.KIND_OUTCOME not in _SHOWN:  # an outcome record is no level (docs/results.md, late and remote outcomes)
    _SHOWN[c.KIND_OUTCOME] = (
        (c.ROLLOUT_OUTCOME, "outcome"),
        (c.ROLLOUT_ATTEMPTS, "attempts"),
        (c.REWARD, "reward"),
        (c.OUTCOME_SOURCE, "source"),
        *_ALWAYS_SHOWN,
    )
# A train step's consumed record: how many rollouts it holds.
_SHOWN.setdefault(c.KIND_CONSUMED, ((c.CONSUMED_COUNT, "rollouts"), *_ALWAYS_SHOWN))
# Another library's span (no gym.kind): whatever of the levels' attributes it carries (token counts
# on a model SDK's chat span).
_FOREIGN_SHOWN = tuple(dict.fromkeys(pair for shown in _SHOWN.values() for pair in shown))


def _duration(ns: int) -> str:
    ms = ns / 1e6
    return f"{ms:.1f}ms" if ms < 1000 else f"{ms / 1000:.2f}s"


def describe(span: SpanData, parent: SpanData | None, *, services: bool) -> str:
    attrs = span.attributes
    kind = attrs.get(c.KIND)
    parts = [span.name, f"[{kind}]" if kind else "", _duration(span.duration_ns)]
    if services and span.service and (parent is None or parent.service != span.service):
        parts.append(f"@{span.service}")
    for key, short in _IDENTITY_SHORT:
        # Identity is shown where it changes, not repeated on every line below.
        if key in attrs and (parent is None or parent.attributes.get(key) != attrs[key]):
            parts.append(f"{short}={attrs[key]}")
    for key, short in _SHOWN.get(str(kind), _FOREIGN_SHOWN):
        if key in attrs:
            value = attrs[key]
            parts.append(f"{short}={value:g}" if isinstance(value, float) else f"{short}={value}")
    if span.status == "ERROR":
        parts.append(f"ERROR({attrs.get(c.ERROR_TYPE) or span.status_message or 'error'})")
    if kind == c.KIND_CONSUMED and span.links:
        # Up to 128 links, one per rollout: a count, not a line of IDs.
        parts.append(f"->{len(span.links)} rollout spans")
        return " ".join(p for p in parts if p)
    for link in span.links:
        relation = link.attributes.get(c.LINK_RELATION, "link")
        parts.append(f"<-{relation} {link.span_id}")
    return " ".join(p for p in parts if p)


def _overridden(spans: list[SpanData]) -> dict[str, str]:
    """For each rollout root whose final outcome an outcome record decided, that final outcome."""
    marks = {}
    for o in final_outcomes(spans):
        if o.root is not None and o.decided_by is not None and o.decided_by is not o.root:
            reward = f" reward={o.reward:g}" if o.reward is not None else ""
            marks[o.root.span_id] = (
                f"=> final: outcome={o.outcome}{reward} attempts={o.attempts}"
                f" (from outcome record {o.decided_by.span_id}, {o.source})"
            )
        if o.root is not None and o.task_reruns:
            # Only the worker's ray.task span knows otherwise: said on the rollout's line.
            rerun = f"=> {_reruns_text(o.task_reruns)}"
            marks[o.root.span_id] = f"{marks[o.root.span_id]} {rerun}" if o.root.span_id in marks else rerun
        if o.root is not None and o.lost_attempts:
            # A killed pass's execution of an attempt the resume ran again: said where the rollout is.
            numbers = ", ".join(map(str, o.lost_attempts))
            lost = (
                f"=> lost attempt{'s' if len(o.lost_attempts) > 1 else ''} {numbers} (its process was"
                " killed; run again under the same number)"
            )
            marks[o.root.span_id] = f"{marks[o.root.span_id]} {lost}" if o.root.span_id in marks else lost
    return marks


def _reruns_text(count: int) -> str:
    return f"Ray re-ran {count} task{'s' if count != 1 else ''} (max_retries: a worker died or raised)"


def render_tree(spans: Iterable[SpanData], *, show_ids: bool = False) -> str:
    spans = sorted(normalize(spans), key=lambda s: (s.start_ns, s.end_ns))
    marks = _overridden(spans)
    by_id = {s.span_id: s for s in spans}
    children: dict[str | None, list[SpanData]] = defaultdict(list)
    for s in spans:
        parent = s.parent_id if s.parent_id in by_id else None
        children[parent].append(s)
    services = len({s.service for s in spans}) > 1
    lines: list[str] = []

    def walk(span: SpanData, depth: int, parent: SpanData | None) -> None:
        line = "  " * depth + describe(span, parent, services=services)
        if span.span_id in marks:
            # The root's own attributes are stale: say what every reader takes as final.
            line += "  " + marks[span.span_id]
        if show_ids:
            line += f"  span={span.span_id}"
        lines.append(line)
        for child in children.get(span.span_id, ()):
            walk(child, depth + 1, span)

    roots = children.get(None, [])
    by_trace: dict[str, list[SpanData]] = defaultdict(list)
    for root in roots:
        by_trace[root.trace_id].append(root)
    for trace_id, trace_roots in by_trace.items():
        lines.append(f"trace {trace_id}")
        for root in trace_roots:
            missing_parent = root.parent_id is not None
            if missing_parent:
                lines.append(f"  (parent {root.parent_id} not in this set)")
            walk(root, 1, None)
    return "\n".join(lines)
