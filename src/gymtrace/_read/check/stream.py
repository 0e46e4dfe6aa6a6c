"""``gymtrace check`` over trace files in bounded memory.

Every span is read; a span is held with only the attributes some rule reads (:data:`CHECK_KEYS`),
without events or links, unless a rollout-level rule reads it (``_read.source.summary_span``). Up to
:data:`HELD_SPANS` spans the checker runs over all at once (``check_spans``); past that, each trace
is checked by the tree rules (``_TREE_RULES``) and let go once its root is read (a span ends after
its children), and the rollout-level rules run at the end over the spans held for them. A trace
open while more than :data:`HELD_SPANS` spans are held is :class:`SpreadTooThin`.

From ``PARALLEL_BYTES`` on, one writer's files (a file and its rotated segments, one stream) are
split with a forked process, at a line of a plain file or a member of a compressed one; the
traces the cut runs through are checked again whole, and where the halves cannot be joined exactly
the second half is read again here. Several writers' files are merged by time in one process.
After two processes, the rules over whole rollouts are run by a forked process while this one
decides the outcomes and the training (at 100,000 rollouts, ~3 s each that ran one after the other).
"""

from __future__ import annotations

import heapq
import itertools
from array import array
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gymtrace import _constants as c
from gymtrace._model.spandata import (
    SpanData,
    TraceFileError,
    decode_held,
    decode_lean,
    is_marker,
    iter_file_spans,
    normalize,
)
from gymtrace._model.tracefiles import Part, Warn, first_segment, trace_files_of
from gymtrace._read.check import EXAMPLES, _limit, problems_of
from gymtrace._read.check.notes import (
    awaiting_outcomes,
    lost_notes,
    missing_service_note,
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
    plainly_clean,
)
from gymtrace._read.check.training import check_training, is_training, training_of
from gymtrace._read.outcomes import SOURCE_LIVE, RolloutOutcome, dedupe, final_outcomes
from gymtrace._read.source import (
    PARALLEL_BYTES,
    apart,
    aside,
    gc_paused,
    give,
    ignore_warning,
    second_share,
    split_for_two,
    summary_reducer,
    summary_span,
)
from gymtrace._read.training import Training

# Spans held at most (half of them by each of two processes): ~1 KB each as the checker decodes
# them, so ~100 MB.
HELD_SPANS = 100_000
# The second process keeps the traces first read among its first this many spans until the halves
# are joined: the traces the cut runs through are among them unless one of them paused that long.
EARLY_SPANS = 20_000
# Of the traces it reads to their roots after its last check over the limit, it keeps too those
# whose root started before its first span ended: one writer's file is written in the order its
# spans end, so a trace with a span before the cut started before then. Give or take this: a thread
# that took a span's end time may queue it after another thread's later one (a switch of the
# interpreter lock is 5 ms). A trace cut and missed costs the second half's read again, never a
# wrong verdict.
CUT_MARGIN_NS = 100_000_000

# The attributes a rule reads of a span the rollout-level rules do not read (a step, a model call,
# a tool call...): its kind and identity, what nesting, numbering and the notes judge. Any other
# attribute of such a span, and its events and links, are never decoded.
CHECK_KEYS = frozenset(
    {
        c.KIND,
        c.ROLLOUT_ID,
        c.NEMO_GYM_ROLLOUT_ID,
        c.EPISODE_ATTEMPT,
        c.RAY_TASK_ATTEMPT,
        c.HIERARCHY_VIOLATION,
        c.REWARD,
        c.TURN_NUMBER,
        c.STEP_NUMBER,
        c.GROUP_ID,
        c.LIVE_SERVER,
        c.STEP_SERVERS,
    }
)


def decode_for_check(raw: Mapping[str, Any], service: str, instance: str) -> SpanData:
    """A raw span as the checker holds it: whole if a rollout-level rule reads it (held to the end,
    so decoded from a copy: ``decode_held``), else with :data:`CHECK_KEYS` only."""
    span = decode_lean(raw, service, instance, CHECK_KEYS)
    if not summary_span(span):
        return span
    # Events only where a rule reads them: a reward event outside any rollout.
    return decode_held(raw, service, instance, events=not isinstance(span.attributes.get(c.ROLLOUT_ID), str))


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


# The kinds whose spans carry no rollout identity by design (None: not a gym span).
_NEVER_OUTSIDE = frozenset({None, c.KIND_RUN, c.KIND_TRAIN_STEP, c.KIND_CONSUMED})


def _outside(span: SpanData) -> bool:
    attributes = span.attributes
    return attributes.get(c.KIND) not in _NEVER_OUTSIDE and attributes.get(c.ROLLOUT_ID).__class__ is not str


def _rollout_level(summary: list[SpanData]) -> tuple[list[SpanData], list[SpanData]]:
    """What the rollout-level rules and the notes read: the spans without live markers, and each of
    them once."""
    raw = normalize(summary)
    return raw, dedupe(raw)


def _outcomes(summary: list[SpanData], data: list[SpanData]) -> tuple[list[RolloutOutcome], Training | None]:
    """The final outcomes (lost ones too) and the training of the spans ``summary``, ``data`` being
    :func:`_rollout_level`'s."""
    outcomes = final_outcomes(summary, data=data)
    training = (
        training_of(data, [o for o in outcomes if o.source != SOURCE_LIVE]) if is_training(data) else None
    )
    return outcomes, training


def _whole(spans: list[SpanData], limit: int | None) -> Verdict:
    """The input checked at once, as :func:`check_spans`."""
    raw, data = _rollout_level(spans)
    outcomes, training = _outcomes(spans, data)
    return Verdict(
        problems=_limit(problems_of(raw, data, training), limit),
        spans=len(spans),
        rollouts=len(outcomes),
        awaiting=awaiting_outcomes(spans, outcomes),
        outside=sum(1 for s in spans if _outside(s)),
        notes=[
            *rerun_notes(spans, outcomes),
            *lost_notes(spans, outcomes),
            *missing_service_notes(spans),
            *training_notes(data, training),
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


@dataclass
class _Trace:
    """One trace checked: what the tree rules found in it (None: nothing, the common case), the
    notes about it and the spans of it the rollout-level rules read: every copy (``summary``), and
    those read for the first time, without live markers (``data``: most often the same list). A
    trace the second process checked early, which may have spans before the cut, keeps its spans
    (all of them, and those checked: not read before) until the halves are joined."""

    trace_id: str
    problems: list[list[Problem]] | None
    missing: str | None
    summary: list[SpanData]
    data: list[SpanData]
    spans: list[SpanData] | None = None
    fresh: list[SpanData] | None = None


def _key(span: SpanData) -> int:
    # Compared across the two processes of a check: a forked one hashes text with the same seed.
    return hash((span.trace_id, span.span_id))


def _fresh(spans: list[SpanData], seen: set[int]) -> tuple[list[SpanData], int]:
    """The spans not seen before (their keys added to ``seen``), and how many were copies."""
    fresh: list[SpanData] = []
    duplicated = 0
    for span in spans:
        if is_marker(span):  # as normalize() folds them away, without a copy of the list
            continue
        key = _key(span)
        if key in seen:
            duplicated += 1
            continue
        seen.add(key)
        fresh.append(span)
    return fresh, duplicated


def _judge(trace_id: str, spans: list[SpanData], fresh: list[SpanData], keep: bool) -> _Trace:
    problems = None
    # Most traces break no rule, which one pass shows (a third of the rules' time, at 100,000
    # rollouts 2-3 s of CPU less); the rules judge any other.
    if not plainly_clean(fresh):
        index = SpanIndex(fresh)
        problems = [rule(index) for rule in _TREE_RULES]
    summary = [s for s in spans if summary_span(s)]
    return _Trace(
        trace_id,
        problems if problems is not None and any(problems) else None,
        missing_service_note(spans),
        summary,
        # As many fresh as read: no copy and no marker, so each span of the summary is new.
        summary if len(fresh) == len(spans) else [s for s in fresh if summary_span(s)],
        spans if keep else None,
        fresh if keep else None,
    )


class _ByTrace:
    """The trace-by-trace check: what each trace checked found, in the order their roots were read."""

    def __init__(self) -> None:
        self.traces: list[_Trace] = []
        self.seen: set[int] = set()
        self.duplicated = 0

    def __getstate__(self) -> tuple[list[_Trace], bytes, int]:
        # The second process hands this back pickled: a key per span read (~800,000 at 100,000
        # rollouts) goes as one run of 64-bit integers, not a set pickled key by key (0.3 s).
        return self.traces, array("q", self.seen).tobytes(), self.duplicated

    def __setstate__(self, state: tuple[list[_Trace], bytes, int]) -> None:
        self.traces, keys, self.duplicated = state
        packed = array("q")
        packed.frombytes(keys)
        self.seen = set(packed)

    def check(self, trace_id: str, spans: list[SpanData], keep: bool = False) -> None:
        fresh, duplicated = _fresh(spans, self.seen)
        self.duplicated += duplicated
        self.traces.append(_judge(trace_id, spans, fresh, keep))

    def verdict(self, spans: int, outside: int, limit: int | None, *, fork: bool = False) -> Verdict:
        """The verdict on every trace checked; ``fork``: the rules over whole rollouts are run by a
        forked process (``source.aside``) while this one decides the outcomes and the training."""
        summary = [s for trace in self.traces for s in trace.summary]
        # What _rollout_level gives, from what each trace's check read once (no dedupe of 10^5
        # rollouts' spans again: the traces are checked in the order read, each span's first copy
        # in the first of them).
        raw = normalize(summary)
        data = [s for trace in self.traces for s in trace.data]
        tree: list[list[Problem]] = [[] for _ in _TREE_RULES]
        for trace in self.traces:
            if trace.problems is not None:
                for found, more in zip(tree, trace.problems, strict=True):
                    found += more
        kinds, identity, rewards, records, links, numbering = tree
        duplicated = self.duplicated

        def by_rollout() -> tuple[list[Problem], list[Problem]]:
            return check_shared_run_ids(raw, data, duplicated=duplicated), check_rollouts(SpanIndex(data))

        with aside(by_rollout, fork) as later:
            outcomes, training = _outcomes(summary, data)
            training_problems = check_training(data, training)
            notes = [
                *rerun_notes(summary, outcomes),
                *lost_notes(summary, outcomes),
                *(trace.missing for trace in self.traces if trace.missing is not None),
                *training_notes(data, training),
            ]
            awaiting = awaiting_outcomes(summary, outcomes)
            shared, rollouts = later()
        problems = [
            *shared,
            *kinds,
            *identity,
            *rewards,
            *records,
            *rollouts,
            *links,
            *numbering,
            *training_problems,
        ]
        return Verdict(
            problems=_limit(problems, limit),
            spans=spans,
            rollouts=len(outcomes),
            awaiting=awaiting,
            outside=outside,
            notes=notes,
        )


class _Stream:
    """Spans read in order: held whole while they fit (``whole``), else trace by trace.

    ``early``: the traces first read among the first ``early`` spans keep their spans when checked
    (the second process: those may have spans before the cut)."""

    def __init__(self, held: int, *, whole: bool = True, early: int = 0) -> None:
        self.held = held
        self.early = early
        self.in_order: list[SpanData] | None = [] if whole else None
        self.by_trace: _ByTrace | None = None if whole else _ByTrace()
        self.open: dict[str, list[SpanData]] = {}
        self.count = self.outside = self.holding = 0
        # The traces whose root is read, each with when its first root read started.
        self._rooted: dict[str, int] = {}
        self._early: set[str] = set()

    def read(self, spans: Iterable[SpanData]) -> None:
        held, early, open_traces, rooted = self.held, self.early, self.open, self._rooted
        # The counts in local names while the loop runs (~10^6 spans), written back when it stops.
        count, outside, holding = self.count, self.outside, self.holding
        try:
            for span in spans:
                count += 1
                outside += _outside(span)
                holding += 1
                trace_id = span.trace_id
                trace = open_traces.get(trace_id)
                if trace is None:
                    trace = open_traces[trace_id] = []
                    if count <= early:
                        self._early.add(trace_id)
                trace.append(span)
                if span.parent_id is None and trace_id not in rooted:
                    rooted[trace_id] = span.start_ns
                if self.in_order is not None:
                    self.in_order.append(span)
                if holding <= held:
                    continue
                self.in_order = None
                self.holding = holding
                self.check_rooted()
                holding = self.holding
                if holding > held:
                    raise _too_thin(open_traces, count, held)
        finally:
            self.count, self.outside, self.holding = count, outside, holding

    def check_rooted(self, started_by: int = -1) -> None:
        """Check every trace whose root is read, and let go of its spans; those of a trace first
        read early, or whose root started by ``started_by`` (ns), are kept."""
        by_trace = self.by_trace = self.by_trace or _ByTrace()
        for rooted_id, started in self._rooted.items():
            trace = self.open.pop(rooted_id)
            self.holding -= len(trace)
            by_trace.check(rooted_id, trace, keep=started <= started_by or rooted_id in self._early)
        self._rooted.clear()

    def verdict(self, limit: int | None, *, fork: bool = False) -> Verdict:
        """The verdict on every span read (``fork``: as :meth:`_ByTrace.verdict`)."""
        if self.in_order is not None:
            return _whole(self.in_order, limit)
        assert self.by_trace is not None
        for trace_id, trace in self.open.items():
            self.by_trace.check(trace_id, trace)
        self.open.clear()
        # Every span is checked: its key (one per span read) goes before the rollout-level rules
        # allocate theirs (~120 MB at 100,000 rollouts, where the verdict was the peak).
        self.by_trace.seen = set()
        return self.by_trace.verdict(self.count, self.outside, limit, fork=fork)


def check_files(
    paths: Iterable[str | Path],
    *,
    warn: Warn | None = None,
    held: int = HELD_SPANS,
    limit: int | None = EXAMPLES,
    parallel_from: int = PARALLEL_BYTES,
) -> Verdict:
    """Check the spans of every file (or directory) of ``paths`` in one streaming pass, holding at
    most ``held`` spans (see the module docstring); one writer's files of ``parallel_from`` bytes or
    more are checked by two processes."""
    files = trace_files_of(paths, warn)
    writers = _by_writer(files)
    with gc_paused():
        # Two processes only for one writer's files: the files of several (a run's processes) are
        # merged by time, which a cut cannot split.
        two = split_for_two(files, parallel_from, second_share()) if len(writers) == 1 else None
        if two is not None:
            context, split = two
            try:
                # Checked by a process of its own, which leaves without freeing what it read.
                return apart(lambda give: _check_halves(split, context, give, held, limit), context, warn)
            except SpreadTooThin:
                pass  # a trace that fits in ``held`` spans but not in half of them: one process
        stream = _Stream(held)
        stream.read(_merged(writers, warn))
        return stream.verdict(limit)


def _by_writer(files: list[Path]) -> list[list[Path]]:
    """``files`` grouped by the file they were configured as (a file and its rotated segments, in
    the order :func:`~gymtrace._model.tracefiles.trace_files` lists them: the order written)."""
    writers: dict[Path, list[Path]] = {}
    for file in files:
        writers.setdefault(first_segment(file), []).append(file)
    return list(writers.values())


def _spans(parts: list[tuple[Path, Part]], warn: Warn | None) -> Iterator[SpanData]:
    # The native reader, when installed, makes each line's spans as decode_for_check does.
    reducer = summary_reducer(check=CHECK_KEYS)
    for path, part in parts:
        yield from iter_file_spans(path, warn=warn, part=part, decode=decode_for_check, reducer=reducer)


def _merged(writers: list[list[Path]], warn: Warn | None) -> Iterator[SpanData]:
    """The spans of each writer's files, one segment after another; of several writers (the
    processes of one run, ``GYMTRACE_FILE=DIR/``), merged by when each span ended, so that a trace
    spread over processes reaches its root span after its children in every file."""
    streams = [_spans([(file, None) for file in files], warn) for files in writers]
    if len(streams) == 1:
        return streams[0]
    return heapq.merge(*streams, key=lambda span: span.end_ns)


# -- two processes ------------------------------------------------------------------------------------


def _read_second(parts: list[tuple[Path, Part]], held: int) -> tuple[_Stream, list[str], Exception | None]:
    """The second half, in the forked process: trace by trace from its first span, the traces
    first read among its first :data:`EARLY_SPANS` kept (the cut may run through them)."""
    stream = _Stream(held, whole=False, early=min(held, EARLY_SPANS))
    warnings: list[str] = []
    try:
        with gc_paused():
            spans = _spans(parts, warnings.append)
            first = next(spans, None)
            stream.read(itertools.chain(() if first is None else (first,), spans))
            # What is left is checked here, beside the first half's read, rather than sent back to
            # be checked there; kept, as if left open, a trace that began before this half's first
            # span ended (:data:`CUT_MARGIN_NS`): it may have spans before the cut.
            stream.check_rooted(started_by=-1 if first is None else first.end_ns + CUT_MARGIN_NS)
    except (TraceFileError, OSError) as exc:
        return stream, warnings, exc
    return stream, warnings, None


def _check_halves(
    split: tuple[list[tuple[Path, Part]], list[tuple[Path, Part]]],
    context: Any,
    warn: Warn | None,
    held: int,
    limit: int | None,
) -> tuple[Verdict, _Stream]:
    """Two processes, each holding at most half of ``held`` spans (what the second holds when it
    ends comes to this one); warnings are given once the halves are read (a trace spread too thin
    for half of ``held`` is read again by one process, which gives them). The verdict, and what it
    was made from."""
    first, second = split
    held = max(1, held // 2)
    stream = _Stream(held, whole=False)
    mine: list[str] = []
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        later = pool.submit(_read_second, second, held)
        try:
            stream.read(_spans(first, mine.append))
        except SpreadTooThin:
            later.cancel()
            raise
        except BaseException:
            later.cancel()
            give(mine, warn)
            raise
        other, warnings, error = later.result()
    if isinstance(error, SpreadTooThin):
        raise error
    give(mine + warnings, warn)
    if error is not None:
        raise error
    if not _join(stream, other):
        # The halves do not join exactly: read the second again, here, after the first (its
        # warnings were given).
        stream.read(_spans(second, ignore_warning))
    # An input this big has rollout-level rules worth a second core too.
    return stream.verdict(limit, fork=True), stream


def _join(stream: _Stream, other: _Stream) -> bool:
    """Join the second half's check (``other``) to the first's (``stream``), as if one process had
    read on: the traces open at the cut whose roots the second half read are checked again with
    their spans from both halves. False, leaving ``stream`` as it was, when that cannot be done
    exactly: a span read in both halves (a file appended to itself: which copy is the first decides
    what is reported), or a trace open at the cut that the second half checked without keeping it."""
    mine, theirs = stream.by_trace, other.by_trace
    assert mine is not None and theirs is not None
    if not _read_once(stream, other):
        return False
    crossing = [trace for trace in theirs.traces if trace.trace_id in stream.open]
    if any(trace.spans is None for trace in crossing):
        return False
    for n, trace in enumerate(theirs.traces):
        if trace.trace_id in stream.open:
            assert trace.spans is not None and trace.fresh is not None
            spans = stream.open.pop(trace.trace_id)
            seen: set[int] = set()
            fresh, duplicated = _fresh(spans, seen)
            mine.duplicated += duplicated
            theirs.traces[n] = _judge(trace.trace_id, spans + trace.spans, fresh + trace.fresh, False)
            stream.holding -= len(spans)
            mine.seen |= seen
        else:
            trace.spans = trace.fresh = None
    mine.traces += theirs.traces
    mine.seen |= theirs.seen
    mine.duplicated += theirs.duplicated
    for trace_id, spans in other.open.items():
        stream.open.setdefault(trace_id, []).extend(spans)
    # What came from the second process now lives here: its copies go before the verdict's work.
    theirs.traces, theirs.seen = [], set()
    other.open.clear()
    stream.count += other.count
    stream.outside += other.outside
    stream.holding += other.holding
    return True


def _read_once(stream: _Stream, other: _Stream) -> bool:
    """No span read by both halves: their spans checked (``seen``) and open, compared without a
    union of either (each ``seen`` holds a key per span of its half: copies of them were the
    reader's peak memory at 100,000 rollouts)."""
    mine, theirs = stream.by_trace, other.by_trace
    assert mine is not None and theirs is not None
    open_before = {_key(s) for spans in stream.open.values() for s in spans}
    open_after = {_key(s) for spans in other.open.values() for s in spans}
    return (
        open_before.isdisjoint(open_after)
        and open_before.isdisjoint(theirs.seen)
        and mine.seen.isdisjoint(open_after)
        and mine.seen.isdisjoint(theirs.seen)
    )


def _too_thin(open_traces: dict[str, list[SpanData]], count: int, held: int) -> SpreadTooThin:
    trace_id, spans = max(open_traces.items(), key=lambda item: len(item[1]))
    return SpreadTooThin(
        f"trace {trace_id} is spread too thin to check: {len(spans)} of its spans are read and its"
        f" root span is not, after {count} spans ({len(open_traces)} traces open, {held} spans held"
        " at most). Its root may be in a file not given (give every process's file, or the"
        " directory), or the run is one trace (trace per run): check it in parts, by file"
    )
