"""``gymtrace check`` over trace files in bounded memory.

Every span is read (the tree rules judge each one), but not every span is held: while the input
fits in :data:`HELD_SPANS` spans, the checker runs over all of it at once, exactly as
:func:`gymtrace._read.check.check_spans`. Past that, it checks trace by trace: a trace is checked
and let go once its root span is read (a span ends after its children, and a process writes its
spans as they end), by the rules that judge the span tree (nesting, identity below, rewards,
outcome records, episode links, numbering); the rules that judge a rollout as a whole (its
attempts and final outcome, runs sharing an ID, training) run at the end over the spans every
reader of outcomes reads (``_read.source``), held for the whole input. A trace that stays open
while more than :data:`HELD_SPANS` spans are held (one trace per run, or a trace whose root is in
a file not given) is spread too thin to check this way: :class:`SpreadTooThin` says which.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from gymtrace import _constants as c
from gymtrace._model.spandata import (
    SpanData,
    TraceFileError,
    Warn,
    iter_otlp_json_lines,
    normalize,
    trace_files,
)
from gymtrace._read.check import EXAMPLES, _limit, check_spans
from gymtrace._read.check.notes import (
    awaiting_outcomes,
    lost_notes,
    missing_service_notes,
    rerun_notes,
    training_notes,
)
from gymtrace._read.check.rollouts import check_rollouts
from gymtrace._read.check.spans import (
    Problem,
    SpanIndex,
    check_episode_links,
    check_identity_below,
    check_kinds_and_nesting,
    check_numbering,
    check_outcome_records,
    check_rewards_inside_rollouts,
    check_shared_run_ids,
)
from gymtrace._read.check.training import check_training
from gymtrace._read.outcomes import dedupe, final_outcomes
from gymtrace._read.source import gc_paused, summary_span

# Spans held at most: ~2.5 KB each, so a few hundred MB.
HELD_SPANS = 100_000


class SpreadTooThin(TraceFileError):
    """A trace still open (no root span read) while the checker holds its limit of spans."""


@dataclass
class Verdict:
    """What ``gymtrace check`` prints."""

    problems: list[str]
    spans: int  # spans read, every line's
    rollouts: int
    awaiting: list[str]
    # Gym spans that carry no rollout identity (a run's own work aside).
    outside: int
    notes: list[str] = field(default_factory=list)


def _outside(span: SpanData) -> bool:
    return span.attributes.get(c.KIND) not in (
        None,
        c.KIND_RUN,
        c.KIND_TRAIN_STEP,
        c.KIND_CONSUMED,
    ) and not isinstance(span.attributes.get(c.ROLLOUT_ID), str)


def _whole(spans: list[SpanData], limit: int | None) -> Verdict:
    """The input checked at once, as :func:`check_spans`."""
    return Verdict(
        problems=check_spans(spans, limit=limit),
        spans=len(spans),
        rollouts=len(final_outcomes(spans)),
        awaiting=awaiting_outcomes(spans),
        outside=sum(1 for s in spans if _outside(s)),
        notes=[
            *rerun_notes(spans),
            *lost_notes(spans),
            *missing_service_notes(spans),
            *training_notes(spans),
        ],
    )


# The rules that judge one trace's span tree, in check_spans' order (check_rollouts runs between
# the fourth and the fifth).
_TREE_RULES = (
    check_kinds_and_nesting,
    check_identity_below,
    check_rewards_inside_rollouts,
    check_outcome_records,
    check_episode_links,
    check_numbering,
)


class _ByTrace:
    """The trace-by-trace check, once the input is past the spans held."""

    def __init__(self) -> None:
        self.tree: list[list[Problem]] = [[] for _ in _TREE_RULES]
        self.summary: list[SpanData] = []  # every copy: a run span read twice is a finding
        self.missing: list[str] = []
        self.seen: set[int] = set()
        self.duplicated = 0

    def check(self, spans: list[SpanData]) -> None:
        fresh = []
        for span in normalize(spans):
            key = hash((span.trace_id, span.span_id))
            if key in self.seen:
                self.duplicated += 1
                continue
            self.seen.add(key)
            fresh.append(span)
        index = SpanIndex(fresh)
        for problems, rule in zip(self.tree, _TREE_RULES, strict=True):
            problems += rule(index)
        self.missing += missing_service_notes(spans)
        self.summary += [s for s in spans if summary_span(s)]

    def verdict(self, spans: int, outside: int, limit: int | None) -> Verdict:
        raw = normalize(self.summary)
        data = dedupe(raw)
        kinds, identity, rewards, records, links, numbering = self.tree
        problems = [
            *check_shared_run_ids(raw, data, duplicated=self.duplicated),
            *kinds,
            *identity,
            *rewards,
            *records,
            *check_rollouts(SpanIndex(data)),
            *links,
            *numbering,
            *check_training(data),
        ]
        return Verdict(
            problems=_limit(problems, limit),
            spans=spans,
            rollouts=len(final_outcomes(self.summary)),
            awaiting=awaiting_outcomes(self.summary),
            outside=outside,
            notes=[
                *rerun_notes(self.summary),
                *lost_notes(self.summary),
                *self.missing,
                *training_notes(self.summary),
            ],
        )


def check_files(
    paths: Iterable[str | Path],
    *,
    warn: Warn | None = None,
    held: int = HELD_SPANS,
    limit: int | None = EXAMPLES,
) -> Verdict:
    """Check the spans of every file (or directory) of ``paths`` in one streaming pass, holding at
    most ``held`` spans (see the module docstring)."""
    files = [file for path in paths for file in trace_files(path, warn)]
    in_order: list[SpanData] | None = []  # the whole input, while it fits
    open_traces: dict[str, list[SpanData]] = {}
    rooted: set[str] = set()
    count = outside = holding = 0
    by_trace: _ByTrace | None = None
    with gc_paused():
        for span in _merged(files, warn):
            count += 1
            outside += _outside(span)
            holding += 1
            open_traces.setdefault(span.trace_id, []).append(span)
            if span.parent_id is None:
                rooted.add(span.trace_id)
            if in_order is not None:
                in_order.append(span)
            if holding <= held:
                continue
            in_order = None
            by_trace = by_trace or _ByTrace()
            for trace_id in rooted:
                trace = open_traces.pop(trace_id)
                holding -= len(trace)
                by_trace.check(trace)
            rooted.clear()
            if holding > held:
                raise _too_thin(open_traces, count, held)
    if in_order is not None:
        return _whole(in_order, limit)
    assert by_trace is not None
    for trace in open_traces.values():
        by_trace.check(trace)
    return by_trace.verdict(count, outside, limit)


def _merged(files: list[Path], warn: Warn | None) -> Iterator[SpanData]:
    """The spans of ``files``, one file's after another's while one file is given; of several (the
    processes of one run, ``GYMTRACE_FILE=DIR/``), merged by when each span ended, so that a trace
    spread over processes reaches its root span after its children in every file."""
    streams = [iter_otlp_json_lines(file, warn=warn) for file in files]
    if len(streams) == 1:
        return streams[0]
    return heapq.merge(*streams, key=lambda span: span.end_ns)


def _too_thin(open_traces: dict[str, list[SpanData]], count: int, held: int) -> SpreadTooThin:
    trace_id, spans = max(open_traces.items(), key=lambda item: len(item[1]))
    return SpreadTooThin(
        f"trace {trace_id} is spread too thin to check: {len(spans)} of its spans are read and its"
        f" root span is not, after {count} spans ({len(open_traces)} traces open, {held} spans held"
        " at most). Its root may be in a file not given (give every process's file, or the"
        " directory), or the run is one trace (trace per run): check it in parts, by file"
    )
