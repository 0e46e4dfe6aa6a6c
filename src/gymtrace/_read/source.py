"""Trace files read in one streaming pass, keeping only the spans a reader needs.

A training run's file holds ~18 spans per rollout; ``gymtrace rollouts``, ``stats`` and ``compare``
answer from a few of them: the rollout roots, outcome records and episodes (the outcome rule), the
run spans, train steps and consumed records (the training figures), Ray's re-run tasks and the live
markers. :func:`read_summary_spans` decodes only those and drops the rest unread: its steps, turns,
model and tool calls, whose one figure the readers take (a model call's output tokens) is summed
as the file streams by (:class:`TokenTotals`). Memory grows with the rollouts, not with the spans.

A span is dropped only when it carries a rollout ID (so it is inside a rollout: never a run span
or an ancestor the readers walk up through) and its kind is none the readers read. What
``gymtrace live`` would call ``lost`` (a rollout with live markers and no end) is judged from every
span of its trace, so those traces are read whole in a second pass.
"""

from __future__ import annotations

import gc
import multiprocessing
import operator
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gymtrace import _constants as c
from gymtrace._model.numbers import read_int
from gymtrace._model.spandata import (
    NOT_PLAIN,
    Part,
    SpanData,
    TraceFileError,
    Warn,
    decode_any_value,
    decode_held,
    iter_otlp_json_lines,
    plain_value,
    raw_attributes,
    trace_files,
)

# The kinds the summary readers read whole.
_READ_KINDS = frozenset(
    {
        c.KIND_ROLLOUT,
        c.KIND_OUTCOME,
        c.KIND_EPISODE,
        c.KIND_RUN,
        c.KIND_TRAIN_STEP,
        c.KIND_CONSUMED,
        c.KIND_LIVE,
    }
)
_KEY = operator.itemgetter("key")


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off while a file is parsed: parsing makes millions of objects
    and no cycle, and each collection would walk every object held so far (it tripled the time
    of ``orjson.loads`` in a reader holding 10k rollouts)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@dataclass
class TokenTotals:
    """Output tokens of the dropped spans inside rollouts: per trace, and per (run, policy version).

    Counted once per span (a file appended to itself holds every span twice)."""

    by_trace: dict[str, int] = field(default_factory=dict)
    by_version: dict[tuple[str | None, str], int] = field(default_factory=dict)
    # Each span counted, by key; with ``entries`` (a part read in another process) also what it
    # counted, so that the parts merge without counting a span twice.
    _seen: set[int] = field(default_factory=set)
    entries: dict[int, tuple[str, int, object, object]] | None = None

    def add(self, trace_id: str, span_id: str, tokens: int, run_id: object, version: object) -> None:
        try:
            key = int(trace_id, 16) << 64 | int(span_id, 16)
        except ValueError:
            key = hash((trace_id, span_id))
        self.add_keyed(key, trace_id, tokens, run_id, version)

    def add_keyed(self, key: int, trace_id: str, tokens: int, run_id: object, version: object) -> None:
        if key in self._seen:
            return
        self._seen.add(key)
        if self.entries is not None:
            self.entries[key] = (trace_id, tokens, run_id, version)
        self.by_trace[trace_id] = self.by_trace.get(trace_id, 0) + tokens
        if version is not None:
            run = run_id if isinstance(run_id, str) else None
            vkey = (run, str(version))
            self.by_version[vkey] = self.by_version.get(vkey, 0) + tokens


def _rollout_id(attributes: Mapping[str, Any]) -> object:
    if c.ROLLOUT_ID in attributes:
        return attributes[c.ROLLOUT_ID]
    nemo = attributes.get(c.NEMO_GYM_ROLLOUT_ID)
    return nemo if isinstance(nemo, str) and nemo else None


def summary_span(span: SpanData) -> bool:
    """Whether the summary readers read ``span`` (what :func:`summary_filter` keeps, decoded)."""
    attributes = span.attributes
    if attributes.get(c.KIND) in _READ_KINDS or not isinstance(attributes.get(c.ROLLOUT_ID), str):
        return True
    return (read_int(attributes.get(c.RAY_TASK_ATTEMPT)) or 0) >= 1


def summary_filter(tokens: TokenTotals) -> Callable[[Mapping[str, Any]], bool]:
    """The ``keep`` of :func:`iter_otlp_json_lines` for the summary readers: True for a span they
    read; a dropped span's output tokens go to ``tokens``.

    It runs on every span of the input, so it reads no more than it must: the attribute keys,
    listed in C, then the values of a few of them. A value that is not
    plain sends the span to the decoder, which reads it or names what is wrong: keeping a span is
    always right (the readers read what they need from it), dropping one only when it is sure."""

    def keep(raw: Mapping[str, Any]) -> bool:
        # Inlined: this runs on millions of spans, and each call or decoded value costs. The keys
        # are listed in C, and a value is looked up only for the few keys present.
        items = raw.get("attributes")
        if items.__class__ is not list:
            return True
        try:
            keys = list(map(_KEY, items))
            if len(set(keys)) != len(keys):
                return True  # a key twice: the decoder reads the last
        except (TypeError, KeyError):  # an item that is no object, a key that is not text
            return True  # decoded, so the decoder names what is wrong
        if c.KIND in keys:
            value = items[keys.index(c.KIND)].get("value")
            if value.__class__ is not dict:
                return True
            kind = value.get("stringValue")
            if kind.__class__ is str and kind in _READ_KINDS:
                return True
        if c.ROLLOUT_ID in keys:
            value = items[keys.index(c.ROLLOUT_ID)].get("value")
        elif c.NEMO_GYM_ROLLOUT_ID in keys:
            value = items[keys.index(c.NEMO_GYM_ROLLOUT_ID)].get("value")  # NeMo Gym's own key
            if value.__class__ is not dict or not value.get("stringValue"):
                return True  # "" names no rollout
        else:
            return True
        if value.__class__ is not dict or value.get("stringValue").__class__ is not str:
            return True  # a rollout ID that is not plain
        if c.RAY_TASK_ATTEMPT in keys:
            attempt = plain_value(items[keys.index(c.RAY_TASK_ATTEMPT)].get("value"))
            if attempt is NOT_PLAIN or (read_int(attempt) or 0) >= 1:
                return True
        if c.GEN_AI_USAGE_OUTPUT_TOKENS not in keys:
            return False
        count = plain_value(items[keys.index(c.GEN_AI_USAGE_OUTPUT_TOKENS)].get("value"))
        if count is NOT_PLAIN:
            return True
        count = read_int(count)
        if count:
            trace_id, span_id = raw.get("traceId"), raw.get("spanId")
            run_id, version = (
                plain_value(items[keys.index(key)].get("value")) if key in keys else None
                for key in (c.RUN_ID, c.POLICY_VERSION)
            )
            if (
                trace_id.__class__ is not str
                or span_id.__class__ is not str
                or NOT_PLAIN in (run_id, version)
            ):
                return True  # decoded: the decoder reads it, or names what is wrong
            tokens.add(trace_id.lower(), span_id.lower(), count, run_id, version)
        return False

    return keep


@dataclass
class Summary:
    """What :func:`read_summary_spans` read: the spans kept, and the dropped spans' tokens."""

    spans: list[SpanData]
    tokens: TokenTotals


# From this many bytes on, a second process reads half of the input (below it, starting one costs
# more than it saves).
PARALLEL_BYTES = 48 << 20

# What one process read of its parts: the spans kept, the tokens of the dropped ones, the warnings
# in order, and the error that stopped it.
_Read = tuple[list[SpanData], TokenTotals, list[str], Exception | None]


def _read_parts(parts: list[tuple[Path, Part]], entries: bool) -> _Read:
    tokens = TokenTotals(entries={} if entries else None)
    keep = summary_filter(tokens)
    warnings: list[str] = []
    spans: list[SpanData] = []
    try:
        with gc_paused():
            for path, part in parts:
                spans.extend(
                    iter_otlp_json_lines(path, warn=warnings.append, keep=keep, part=part, decode=decode_held)
                )
    except (TraceFileError, OSError) as exc:
        return spans, tokens, warnings, exc
    return spans, tokens, warnings, None


def halves(files: list[Path]) -> tuple[list[tuple[Path, Part]], list[tuple[Path, Part]]]:
    """The files as two lists of parts of about equal bytes, in order, each part whole lines."""
    sizes = [f.stat().st_size for f in files]
    middle = sum(sizes) // 2
    first: list[tuple[Path, Part]] = []
    second: list[tuple[Path, Part]] = []
    offset = 0
    for file, size in zip(files, sizes, strict=True):
        if offset + size <= middle:
            first.append((file, None))
        elif offset >= middle:
            second.append((file, None))
        else:
            with open(file, "rb") as f:
                f.seek(middle - offset)
                cut = middle - offset + len(f.readline())  # the end of the line the middle is in
            first.append((file, (0, cut)))
            if cut < size:
                second.append((file, (cut, size)))
        offset += size
    return first, second


def fork_context() -> Any:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    if cores < 2 or "fork" not in multiprocessing.get_all_start_methods():
        return None
    return multiprocessing.get_context("fork")


def _read_all(files: list[Path], parallel_from: int) -> _Read:
    """One streaming pass over ``files``; an input of ``parallel_from`` bytes or more is split in
    two halves, the second read by a forked process meanwhile (both cores of a small machine), the
    results joined in order."""
    context = fork_context() if sum(f.stat().st_size for f in files) >= parallel_from else None
    if context is None:
        return _read_parts([(f, None) for f in files], entries=False)
    first, second = halves(files)
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        later = pool.submit(_read_parts, second, True)
        spans, tokens, warnings, error = _read_parts(first, entries=True)
        if error is not None:
            later.cancel()
            return spans, tokens, warnings, error
        more, more_tokens, more_warnings, error = later.result()
    for key, entry in (more_tokens.entries or {}).items():
        tokens.add_keyed(key, *entry)
    return spans + more, tokens, warnings + more_warnings, error


def read_summary_spans(
    paths: Iterable[str | Path], warn: Warn | None = None, *, parallel_from: int = PARALLEL_BYTES
) -> Summary:
    """The spans the summary readers need from every file (or directory) of ``paths``; from
    ``parallel_from`` bytes on, read by two processes."""
    files = list(paths)
    spans, tokens, warnings, error = _read_all(
        [f for path in files for f in trace_files(path, warn)], parallel_from
    )
    for message in warnings:
        if warn is not None:
            warn(message)
    if error is not None:
        raise error
    live = {s.trace_id for s in spans if s.attributes.get(c.KIND) == c.KIND_LIVE}
    if live:
        # A rollout with live markers and no end is judged ("lost"?) from all of its trace.
        live -= {s.trace_id for s in spans if s.attributes.get(c.KIND) == c.KIND_ROLLOUT}
    if live:
        ignored = TokenTotals()
        again = summary_filter(ignored)

        def dropped_of_live(raw: Mapping[str, Any]) -> bool:
            trace_id = raw.get("traceId")
            return isinstance(trace_id, str) and trace_id.lower() in live and not again(raw)

        with gc_paused():
            spans += [span for path in files for span in iter_otlp_json_lines(path, keep=dropped_of_live)]
    return Summary(spans, tokens)


def summary_of_traces(traces: Iterable[list[SpanData]]) -> Summary:
    """What :func:`read_summary_spans` keeps, from whole traces given one at a time (Jaeger's
    search, page by page): the spans the summary readers read, the tokens of the others; every
    span of a trace with live markers and no rollout root (it is judged from all of them)."""
    tokens = TokenTotals()
    kept: list[SpanData] = []
    for trace in traces:
        kinds = {span.attributes.get(c.KIND) for span in trace}
        if c.KIND_LIVE in kinds and c.KIND_ROLLOUT not in kinds:
            kept += trace
            continue
        for span in trace:
            if summary_span(span):
                kept.append(span)
                continue
            count = read_int(span.attributes.get(c.GEN_AI_USAGE_OUTPUT_TOKENS))
            if count:
                attributes = span.attributes
                tokens.add(
                    span.trace_id,
                    span.span_id,
                    count,
                    attributes.get(c.RUN_ID),
                    attributes.get(c.POLICY_VERSION),
                )
    return Summary(kept, tokens)


def traces_matching(paths: Iterable[str | Path], key: str, value: str, warn: Warn | None = None) -> set[str]:
    """The trace IDs that hold a span whose ``key`` attribute is ``value`` (a first pass)."""
    found: set[str] = set()

    def look(raw: Mapping[str, Any]) -> bool:
        attributes = raw_attributes(raw)
        trace_id = raw.get("traceId")
        if attributes is None or not isinstance(trace_id, str):
            return True  # decoded, so the decoder names what is wrong
        try:
            decoded = {k: decode_any_value(v) for k, v in attributes.items() if k in watched}
        except ValueError:
            return True
        found_value = _rollout_id(decoded) if key == c.ROLLOUT_ID else decoded.get(key)
        if found_value == value:
            found.add(trace_id.lower())
        return False

    watched = frozenset({key, c.NEMO_GYM_ROLLOUT_ID} if key == c.ROLLOUT_ID else {key})

    with gc_paused():
        for path in paths:
            for _ in iter_otlp_json_lines(path, warn=warn, keep=look):
                pass
    return found


def spans_of_traces(paths: Iterable[str | Path], traces: set[str]) -> list[SpanData]:
    """Every span of the given traces (a second pass)."""

    def keep(raw: Mapping[str, Any]) -> bool:
        trace_id = raw.get("traceId")
        return not isinstance(trace_id, str) or trace_id.lower() in traces

    with gc_paused():
        found = [span for path in paths for span in iter_otlp_json_lines(path, keep=keep)]
    return found
