"""A run's files read in one pass for a picture: the spans the outcome readers need, whole, and of
every other span inside a rollout only its part of the time split (a few integers).

A picture of 100,000 rollouts must not hold their two million spans: :func:`read_run_input`
decodes only the run, train step, consumed, rollout, episode and outcome spans (what
``_read.outcomes`` and ``_read.training`` read, a few per rollout) and hands each of the others
that is a part of an episode's time (a model call, a tool call, a seed session, a step, a verify)
to :class:`~gymtrace._read.timesplit.EpisodeTimes` as ``(part, start, end)``, reading no more of it
than its identity and kind. A span that reads oddly is decoded whole, so the decoder names what is
wrong with it. Of a live marker only its trace is noted: a rollout that only live markers know
(``lost`` or still open: its trace has markers and no rollout span) is judged from every span of
its trace, so those traces are read again, whole, in a second pass (a finished run has none).
"""

from __future__ import annotations

import gc
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gymtrace import _constants as c
from gymtrace._model.numbers import read_int
from gymtrace._model.spandata import BadTraceData, SpanData, TraceFileError, decode_otlp_json
from gymtrace._model.tracefiles import Warn, line_cut_short, open_lines
from gymtrace._model.tracefiles import trace_files as _trace_files
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


def trace_files(paths: Iterable[str | Path]) -> list[Path]:
    """Each path's files (its segments), or the trace files of a directory (``GYMTRACE_FILE=DIR/``),
    by the one naming rule (``tracefiles.trace_files``)."""
    return list(dict.fromkeys(f for path in paths for f in _trace_files(path)))


def _requests(path: Path, warn: Warn | None) -> Iterator[tuple[int, Any]]:
    """Each line of a file of OTLP/JSON lines (plain or compressed), parsed, with its number; a
    last line or block a killed writer cut short is told to ``warn`` and skipped."""
    with open_lines(path, warn=warn) as lines:
        for number, raw in enumerate(lines, 1):
            unfinished = not raw.endswith(b"\n")
            raw = raw.strip()
            if not raw:
                continue
            try:
                yield number, json.loads(raw)  # bytes: json finds their encoding (UTF-8) itself
            except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, or nested too deep
                if unfinished and warn is not None:
                    warn(line_cut_short(path, number))
                    return
                raise TraceFileError(f"{path}:{number}: not an OTLP/JSON trace request ({exc})") from exc


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


def _decoded(resource: Any, spans: list[Any], path: Path, number: int) -> Iterator[SpanData]:
    try:
        yield from decode_otlp_json(
            {"resourceSpans": [{"resource": resource, "scopeSpans": [{"spans": spans}]}]}
        )
    except BadTraceData as exc:
        raise TraceFileError(f"{path}:{number}: not a trace gymtrace can read: {exc}") from exc


def _raw_spans(request: Any, path: Path, number: int) -> Iterator[tuple[Any, Any]]:
    """(resource, raw span) of each span of one request; a request of the wrong shape is decoded
    whole, so the decoder's message names the field."""
    try:
        for resource_spans in request["resourceSpans"]:
            for scope_spans in resource_spans.get("scopeSpans") or ():
                for span in scope_spans.get("spans") or ():
                    yield resource_spans.get("resource") or {}, span
    except (TypeError, KeyError, AttributeError):
        try:
            list(decode_otlp_json(request))
        except BadTraceData as exc:
            raise TraceFileError(f"{path}:{number}: not a trace gymtrace can read: {exc}") from exc
        raise TraceFileError(f"{path}:{number}: not a trace gymtrace can read") from None


def picture_filter(found: RunInput, run_id: str | None) -> Callable[[Mapping[str, Any]], bool]:
    """The decision per raw span (an OTLP/JSON span object): True to decode it whole; False when
    it is of another run, or when its part of the time split went to ``found.times`` (all of it
    a picture needs). Run IDs seen go to ``found.runs``. The shape of a streaming reader's ``keep``."""

    def keep(raw: Mapping[str, Any]) -> bool:
        try:
            attributes = _watched(raw)
            run = attributes.get(c.RUN_ID)
            run = run if isinstance(run, str) else None
            kind = attributes.get(c.KIND)
            if kind in _RUN_KINDS:
                found.runs.add(run)
            if run_id is not None and run is not None and run != run_id:
                return False
            if kind == c.KIND_LIVE:
                found.marker_traces.add(str(raw["traceId"]).lower())
                return False
            rollout = attributes.get(c.ROLLOUT_ID)
            if (
                kind in _WHOLE
                or not isinstance(rollout, str)
                or (read_int(attributes.get(c.RAY_TASK_ATTEMPT)) or 0) >= 1
            ):
                return True
            trace_id = str(raw["traceId"]).lower()
            found.times.add_attributes(
                trace_id, attributes, int(raw["startTimeUnixNano"]), int(raw["endTimeUnixNano"])
            )
            return False
        except (TypeError, KeyError, AttributeError, ValueError):
            return True  # the decoder says what is wrong, or reads it

    return keep


def _kept(path: Path, keep: Callable[[Mapping[str, Any]], bool], warn: Warn | None) -> Iterator[SpanData]:
    """The spans of a file that ``keep`` keeps, decoded a resource's at a time (its attributes
    once, not once a span)."""
    for number, request in _requests(path, warn):
        resource: Any = None
        pending: list[Any] = []
        for found, raw in _raw_spans(request, path, number):
            if found is not resource:
                if pending:
                    yield from _decoded(resource, pending, path, number)
                resource, pending = found, []
            if keep(raw):
                pending.append(raw)
        if pending:
            yield from _decoded(resource, pending, path, number)


@contextmanager
def _gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off while the files are parsed: parsing makes millions of
    objects and no cycle, and each collection walks every object held so far (with a run's spans
    held, it made the parse nine times slower). Issue 45's reader pauses it the same way."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def read_run_input(
    paths: Iterable[str | Path], *, run_id: str | None = None, warn: Warn | None = None
) -> RunInput:
    """The spans a picture of run ``run_id`` (of every run when None) needs from ``paths``, and
    the parts of its episodes' time (see the module doc). ``warn``: what a killed writer cut short
    is skipped and told, once a file."""
    files = trace_files(paths)
    found = RunInput()
    keep = picture_filter(found, run_id)
    told: set[str] = set()

    def once(message: str) -> None:  # the second pass reads the same files
        if warn is not None and message not in told:
            told.add(message)
            warn(message)

    tell = once if warn is not None else None
    with _gc_paused():
        for path in files:
            for span in _kept(path, keep, tell):
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
            span for span in _kept(path, keep, warn) if (span.trace_id, span.span_id) not in have
        )
