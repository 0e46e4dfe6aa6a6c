"""A run's files read for a picture: what ``rollouts`` and ``stats`` read of them.

:func:`read_run_input` is :func:`~gymtrace._read.source.read_summary_spans` (one streaming pass,
two processes on a large input; the spans the outcome rule and the training figures need, whole,
and of every other span inside a rollout only its part of the time split), with the run IDs the
input holds and, when a run is named, the whole spans of other runs left out. So a picture's
outcomes and figures are those of ``rollouts`` and ``stats`` on the same input.
:func:`run_input_of_traces` reads whole traces (Jaeger's search) the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gymtrace import _constants as c
from gymtrace._model.numbers import read_int
from gymtrace._model.spandata import SpanData
from gymtrace._model.tracefiles import Warn
from gymtrace._read.source import read_summary_spans
from gymtrace._read.timesplit import EpisodeTimes

# The kinds decoded whole: what the outcome rule, the training figures and the pictures read.
_WHOLE = frozenset(
    {
        c.KIND_RUN,
        c.KIND_ROLLOUT,
        c.KIND_EPISODE,
        c.KIND_OUTCOME,
        c.KIND_TRAIN_STEP,
        c.KIND_CONSUMED,
    }
)
# The kinds whose run ID names a run of the input.
_RUN_KINDS = frozenset({c.KIND_RUN, c.KIND_ROLLOUT, c.KIND_TRAIN_STEP})


@dataclass
class RunInput:
    """What :func:`read_run_input` read."""

    spans: list[SpanData] = field(default_factory=list)
    times: EpisodeTimes = field(default_factory=EpisodeTimes)
    # The run IDs the input holds (None: rollouts with no run), whichever run was asked for.
    runs: set[str | None] = field(default_factory=set)
    # The traces that hold live markers (read whole only if their rollout span is missing).
    marker_traces: set[str] = field(default_factory=set)


# What a picture does with a span (:func:`_decide`).
_DROP, _WHOLE_SPAN, _PART, _MARKER = range(4)


def _decide(found: RunInput, run_id: str | None, attributes: Mapping[str, object]) -> int:
    """Of one span, by its attributes: drop it (another run), keep it whole, keep only its part of
    the time split, or note its trace as one with live markers. Run IDs seen go to ``found.runs``."""
    run = attributes.get(c.RUN_ID)
    run = run if isinstance(run, str) else None
    kind = attributes.get(c.KIND)
    if kind in _RUN_KINDS:
        found.runs.add(run)
    if run_id is not None and run is not None and run != run_id:
        return _DROP
    if kind == c.KIND_LIVE:
        return _MARKER
    if (
        kind in _WHOLE
        or not isinstance(attributes.get(c.ROLLOUT_ID), str)
        or (read_int(attributes.get(c.RAY_TASK_ATTEMPT)) or 0) >= 1
    ):
        return _WHOLE_SPAN
    return _PART


def run_input_of_traces(traces: Iterable[list[SpanData]], *, run_id: str | None = None) -> RunInput:
    """What :func:`read_run_input` reads of files, from whole traces given one at a time (Jaeger's
    search, page by page): each trace's spans the picture keeps whole, of the others their part of
    the time split; a trace whose rollout only live markers know, whole."""
    found = RunInput()
    for trace in traces:
        kept: list[SpanData] = []
        markers = False
        for span in trace:
            decision = _decide(found, run_id, span.attributes)
            markers = markers or decision == _MARKER
            if decision == _WHOLE_SPAN:
                if (
                    span.attributes.get(c.ROLLOUT_ID) is not None
                    and span.attributes.get(c.KIND) not in _WHOLE
                ):
                    found.times.add_span(span)  # read whole, as the file reader reads an odd one
                kept.append(span)
            elif decision == _PART:
                found.times.add_span(span)
        if markers and not any(s.attributes.get(c.KIND) == c.KIND_ROLLOUT for s in kept):
            kept = list(trace)
        found.spans += kept
    return found


def read_run_input(
    paths: Iterable[str | Path], *, run_id: str | None = None, warn: Warn | None = None
) -> RunInput:
    """The spans a picture of run ``run_id`` (of every run when None) needs from ``paths``, and
    the parts of its episodes' time (see the module doc). ``warn`` is told what is read past (a
    last line or block a killed writer cut short, a file in a directory that is no trace file),
    once a file."""
    summary = read_summary_spans(paths, warn)
    found = RunInput(times=summary.times)
    for span in summary.spans:
        decision = _decide(found, run_id, span.attributes)
        if decision == _DROP:
            continue  # a whole span of another run
        if decision == _MARKER:
            found.marker_traces.add(span.trace_id)
        found.spans.append(span)  # its part of the split, if any, is in the summary's times
    return found
