"""A run's files read in one pass for a picture: the spans the outcome readers need, whole, and of
every other span inside a rollout only its part of the time split (a few integers).

:func:`read_run_input` decodes the run, train step, consumed, rollout, episode and outcome spans
whole, and hands each other span that is a part of an episode's time to
:class:`~gymtrace._read.timesplit.EpisodeTimes` as ``(part, start, end)``, reading only its
identity and kind; a span that reads oddly is decoded whole, so the decoder names what is wrong. Of
a live marker only its trace is noted: a rollout only markers know is judged from its whole trace,
read again in a second pass. No lost attempt is looked for (a picture shows none). The lines come
from ``_read.source``'s streaming reader, with :func:`picture_filter` as its ``keep``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gymtrace import _constants as c
from gymtrace._model.numbers import read_int
from gymtrace._model.spandata import SpanData, decode_held, iter_file_spans
from gymtrace._model.tracefiles import Warn, trace_files_of
from gymtrace._read.source import gc_paused
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
_WATCHED = frozenset(
    {c.KIND, c.GEN_AI_OPERATION_NAME, c.ROLLOUT_ID, c.EPISODE_ATTEMPT, c.RUN_ID, c.RAY_TASK_ATTEMPT}
)


@dataclass
class RunInput:
    """What :func:`read_run_input` read."""

    spans: list[SpanData] = field(default_factory=list)
    times: EpisodeTimes = field(default_factory=EpisodeTimes)
    # The run IDs the input holds (None: rollouts with no run), whichever run was asked for.
    runs: set[str | None] = field(default_factory=set)
    # The traces that hold live markers (read whole only if their rollout span is missing).
    marker_traces: set[str] = field(default_factory=set)


def _value(value: Mapping[str, Any]) -> object:
    """An OTLP/JSON AnyValue of the kinds identity and kind take (text, int); else it is read whole."""
    if "stringValue" in value:
        return value["stringValue"]
    if "intValue" in value:
        return int(value["intValue"])
    raise ValueError("an attribute this reader does not take apart")


def _watched(span: Mapping[str, Any]) -> dict[str, object]:
    found: dict[str, object] = {}
    for item in span.get("attributes") or ():
        key = item["key"]
        if key in _WATCHED:
            value = item["value"]
            text = value.get("stringValue")  # the common case, without a call
            found[key] = text if text is not None else _value(value)
    return found


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


def picture_filter(found: RunInput, run_id: str | None) -> Callable[[Mapping[str, Any]], bool]:
    """The decision per raw span (an OTLP/JSON span object): True to decode it whole; False when
    it is of another run, or when its part of the time split went to ``found.times`` (all of it
    a picture needs). Run IDs seen go to ``found.runs``. The shape of a streaming reader's ``keep``."""

    def keep(raw: Mapping[str, Any]) -> bool:
        try:
            attributes = _watched(raw)
            decision = _decide(found, run_id, attributes)
            if decision == _MARKER:
                found.marker_traces.add(str(raw["traceId"]).lower())
            elif decision == _PART:
                trace_id = str(raw["traceId"]).lower()
                found.times.add_attributes(
                    trace_id, attributes, int(raw["startTimeUnixNano"]), int(raw["endTimeUnixNano"])
                )
            return decision == _WHOLE_SPAN
        except (TypeError, KeyError, AttributeError, ValueError):
            return True  # the decoder says what is wrong, or reads it

    return keep


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
    files = trace_files_of(paths, warn)
    found = RunInput()
    keep = picture_filter(found, run_id)
    told: set[str] = set()

    def once(message: str) -> None:  # the second pass reads the same files
        if warn is not None and message not in told:
            told.add(message)
            warn(message)

    tell = once if warn is not None else None
    with gc_paused():
        for path in files:
            for span in iter_file_spans(path, warn=tell, keep=keep, decode=decode_held):
                if (
                    span.attributes.get(c.ROLLOUT_ID) is not None
                    and span.attributes.get(c.KIND) not in _WHOLE
                ):
                    found.times.add_span(span)  # read whole (odd, or NeMo Gym's own rollout ID): its part too
                found.spans.append(span)
        _read_live_traces(files, found, tell)
    return found


def _read_live_traces(files: list[Path], found: RunInput, warn: Warn | None) -> None:
    """Every span of the traces whose rollout only live markers know (see the module doc)."""
    live = found.marker_traces - {
        s.trace_id for s in found.spans if s.attributes.get(c.KIND) == c.KIND_ROLLOUT
    }
    if not live:
        return
    have = {(s.trace_id, s.span_id) for s in found.spans if s.trace_id in live}

    def keep(raw: Mapping[str, Any]) -> bool:
        trace = raw.get("traceId")
        return isinstance(trace, str) and trace.lower() in live

    for path in files:
        found.spans.extend(
            span
            for span in iter_file_spans(path, warn=warn, keep=keep, decode=decode_held)
            if (span.trace_id, span.span_id) not in have
        )
