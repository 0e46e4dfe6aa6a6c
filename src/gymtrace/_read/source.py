"""Trace files read in one streaming pass, keeping only the spans a reader needs.

``gymtrace rollouts``, ``stats`` and ``compare`` answer from a few of a rollout's spans: roots,
outcome records and episodes, run spans, train steps, consumed records, Ray's re-runs and live
markers. :func:`read_summary_spans` decodes only those; of the rest it takes, as the file streams
by, a model call's output tokens (:class:`TokenTotals`) and a span's part of its episode's time split
(:class:`~gymtrace._read.timesplit.EpisodeTimes`). Memory grows with the rollouts, not the spans.

A span is dropped only when it carries a rollout ID (never a run span or an ancestor the readers
walk up through) and its kind is none the readers read. A rollout only live markers know, and one
with an attempt a killed process left (``lost_attempts``), are judged from every span of its trace,
read whole in a second pass.
"""

from __future__ import annotations

import gc
import multiprocessing
import operator
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from gymtrace import _constants as c
from gymtrace._model.numbers import read_int
from gymtrace._model.spandata import (
    NOT_PLAIN,
    SpanData,
    TraceFileError,
    decode_any_value,
    decode_held,
    decode_reduced,
    is_marker,
    iter_file_spans,
    native_span_builder,
    nemo_gym_identity,
    pack_spans,
    pack_values,
    parses_fast,
    plain_value,
    raw_attributes,
    unpack_spans,
    unpack_values,
)
from gymtrace._model.tracefiles import Part, Warn, compression_of, member_start, trace_files_of
from gymtrace._read.native import native_module
from gymtrace._read.timesplit import (
    EpisodeTimes,
    TimeSplit,
    pack_splits,
    part_of,
    part_tables,
    rollout_splits,
    splits_by_rollout,
    unpack_splits,
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
_T = TypeVar("_T")


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

    def forget(self, trace_id: str, span_id: str, tokens: int, run_id: object, version: object) -> None:
        """Take back a span's tokens: it is read whole after all (a trace read again in a second
        pass), so the readers count them from the span."""
        try:
            key = int(trace_id, 16) << 64 | int(span_id, 16)
        except ValueError:
            key = hash((trace_id, span_id))
        if key not in self._seen:
            return  # not counted here, or taken back already (the span's copy)
        self._seen.discard(key)
        self.by_trace[trace_id] -= tokens
        if version is not None:
            vkey = (run_id if isinstance(run_id, str) else None, str(version))
            self.by_version[vkey] -= tokens


def _end_key(trace_id: str, rollout_id: str) -> int:
    """The key of :class:`Ends` (``summary_filter`` computes it inline): a hash, as small as a key
    gets (two keys that collide only make a trace read again whole, never a different answer)."""
    return hash((trace_id, rollout_id))


@dataclass
class Ends:
    """Per (trace, rollout ID) of the spans a reader dropped, the earliest end: what tells whether
    one of them may be an attempt a killed process left (``_read.outcomes.lost_attempts``: it ended
    before its rollout's root started), and so whether its trace must be read whole."""

    earliest: dict[int, int] = field(default_factory=dict)

    def add(self, trace_id: str, rollout_id: str, end: int) -> None:
        key = _end_key(trace_id, rollout_id)
        found = self.earliest.get(key)
        if found is None or end < found:
            self.earliest[key] = end

    def merge(self, other: Ends) -> None:
        for key, end in other.earliest.items():
            found = self.earliest.get(key)
            if found is None or end < found:
                self.earliest[key] = end

    def cut_traces(self, kept: Iterable[SpanData]) -> set[str]:
        """The traces in which a span of a rollout (dropped, or among ``kept``) ended at or before
        the start of that rollout's root: read whole, so ``lost_attempts`` judges them from every
        span, as when nothing is dropped."""
        ends = Ends(dict(self.earliest))
        roots: dict[tuple[str, str], int] = {}
        for span in kept:
            rollout_id = span.attributes.get(c.ROLLOUT_ID)
            if rollout_id.__class__ is not str or is_marker(span):
                continue
            ends.add(span.trace_id, rollout_id, span.end_ns)
            if span.attributes.get(c.KIND) == c.KIND_ROLLOUT:
                key = (span.trace_id, rollout_id)
                roots[key] = max(roots.get(key, span.start_ns), span.start_ns)
        earliest = ends.earliest
        return {
            trace_id
            for (trace_id, rollout_id), start in roots.items()
            if earliest.get(_end_key(trace_id, rollout_id), start + 1) <= start
        }


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


# A span's times are nanoseconds below 2^64 (the decoder names any other; the time split holds them
# in arrays of unsigned 64-bit integers).
_TIME_END = 1 << 64


def _nanoseconds(value: object) -> int | None:
    """A span's time as the decoder reads it when it is plain: ASCII digits (as gymtrace writes
    int64) or a JSON integer, below 2^64; None for anything else (the span is decoded: read, or
    named)."""
    if isinstance(value, str):
        number = int(value) if value.isdigit() and value.isascii() else None
    else:
        number = value if type(value) is int else None  # not a bool
    return number if number is not None and 0 <= number < _TIME_END else None


# The attributes whose values the filter reads besides the kind and the rollout ID, in its order.
_VALUE_KEYS = (
    c.RAY_TASK_ATTEMPT,
    c.GEN_AI_USAGE_OUTPUT_TOKENS,
    c.RUN_ID,
    c.POLICY_VERSION,
    c.GEN_AI_OPERATION_NAME,
    c.EPISODE_ATTEMPT,
)
# The most span shapes (lists of attribute keys) the filter remembers where to look in.
_PLANS = 4096
_UNSEEN: Any = object()


def _plan(keys: tuple[Any, ...]) -> tuple[int, ...] | None:
    """Where :func:`summary_filter` finds what it reads in a span whose attribute keys are
    ``keys``: the index of each key (-1: absent), and whether the rollout ID is NeMo Gym's own key;
    None for a span it keeps without looking (a key twice: the decoder reads the last; no rollout
    ID)."""
    if len(set(keys)) != len(keys):
        return None
    if c.ROLLOUT_ID in keys:
        rollout, nemo = keys.index(c.ROLLOUT_ID), 0
    elif c.NEMO_GYM_ROLLOUT_ID in keys:
        rollout, nemo = keys.index(c.NEMO_GYM_ROLLOUT_ID), 1
    else:
        return None
    at = {key: index for index, key in enumerate(keys)}
    return (
        at.get(c.KIND, -1),
        rollout,
        nemo,
        *(at.get(key, -1) for key in _VALUE_KEYS),
    )


def summary_filter(
    tokens: TokenTotals, times: EpisodeTimes | None = None, ends: Ends | None = None
) -> Callable[[Mapping[str, Any]], bool]:
    """The ``keep`` of :func:`iter_otlp_json_lines` for the summary readers: True for a span they
    read; a dropped span's output tokens go to ``tokens``, its part of the time split (a model or
    tool call, a seed session, a step, a verify) to ``times``, its end to ``ends``.

    It runs on every span of the input, so it reads no more than it must: the attribute keys,
    listed in C, then the values of a few of them. A value that is not
    plain sends the span to the decoder, which reads it or names what is wrong: keeping a span is
    always right (the readers read what they need from it), dropping one only when it is sure."""

    earliest = ends.earliest if ends is not None else None
    # Where the few attributes the filter reads sit, per list of keys: a run's spans come in a
    # handful of shapes, so each span's keys are looked up once (a dict lookup of their tuple)
    # instead of searched for one by one. Bounded: input of many shapes is read, only slower.
    plans: dict[tuple[Any, ...], tuple[int, ...] | None] = {}

    def keep(raw: Mapping[str, Any]) -> bool:
        # Inlined: this runs on millions of spans, and each call or decoded value costs.
        items = raw.get("attributes")
        if items.__class__ is not list:
            return True
        try:
            keys = tuple(map(_KEY, items))
            plan = plans.get(keys, _UNSEEN)
        except (TypeError, KeyError):  # an item that is no object or has no key; a key not text
            return True  # decoded, so the decoder names what is wrong
        if plan is _UNSEEN:
            plan = _plan(keys)
            if len(plans) < _PLANS:
                plans[keys] = plan
        if plan is None:
            return True  # read whole (a key twice, or no rollout ID)
        at_kind, at_rollout, nemo, at_ray, at_tokens, at_run, at_version, at_operation, at_attempt = plan
        if at_kind >= 0:
            value = items[at_kind].get("value")
            if value.__class__ is not dict:
                return True
            kind = value.get("stringValue")
            if kind.__class__ is not str or kind in _READ_KINDS:
                return True  # read, or a kind that is not plain: the decoder reads it
        else:
            kind = None
        value = items[at_rollout].get("value")
        if value.__class__ is not dict:
            return True
        rollout_id = value.get("stringValue")
        if rollout_id.__class__ is not str or (nemo and not rollout_id):
            return True  # a rollout ID that is not plain; "" names no NeMo Gym rollout
        if at_ray >= 0:
            attempt = plain_value(items[at_ray].get("value"))
            if attempt is NOT_PLAIN or (read_int(attempt) or 0) >= 1:
                return True
        # Dropped. Everything that may yet keep it is read before anything is counted: a span kept
        # is counted from its decoded self.
        trace_id, end = raw.get("traceId"), raw.get("endTimeUnixNano")
        if end.__class__ is str and end.isdigit() and end.isascii():  # _nanoseconds, inlined
            end = int(end)
        elif end.__class__ is not int:
            return True  # decoded: the decoder reads it, or names what is wrong
        if not 0 <= end < _TIME_END:
            return True
        if trace_id.__class__ is not str:
            return True
        count: int | None = None
        span_id: Any = None
        if at_tokens >= 0:
            plain = plain_value(items[at_tokens].get("value"))
            if plain is NOT_PLAIN:
                return True
            count = read_int(plain)
            if count:
                span_id = raw.get("spanId")
                run_id = plain_value(items[at_run].get("value")) if at_run >= 0 else None
                version = plain_value(items[at_version].get("value")) if at_version >= 0 else None
                if span_id.__class__ is not str or run_id is NOT_PLAIN or version is NOT_PLAIN:
                    return True
        if kind is None and at_operation >= 0:
            operation = plain_value(items[at_operation].get("value"))
            if operation is NOT_PLAIN:
                return True
            part = part_of(None, operation)
        else:
            part = part_of(kind, None)
        trace_id = trace_id.lower()
        attempt = None
        if nemo:
            rollout_id, attempt = nemo_gym_identity(rollout_id)
        if part is not None:
            start = _nanoseconds(raw.get("startTimeUnixNano"))
            if start is None:
                return True
            if at_attempt >= 0:
                held = items[at_attempt].get("value")
                number = held.get("intValue") if held.__class__ is dict and len(held) == 1 else None
                if number.__class__ is str and number.isdigit() and number.isascii():
                    attempt = int(number)  # the common case, as plain_value reads it
                else:
                    attempt = plain_value(held)
                    if attempt is NOT_PLAIN:
                        return True
                    attempt = read_int(attempt)
            if attempt is not None and times is not None:
                times.add((trace_id, rollout_id, attempt), part, start, end)
        if earliest is not None:  # Ends.add, inlined
            key = hash((trace_id, rollout_id))
            found = earliest.get(key)
            if found is None or end < found:
                earliest[key] = end
        if count:
            tokens.add(trace_id, span_id.lower(), count, run_id, version)
        return False

    return keep


@dataclass
class Summary:
    """What :func:`read_summary_spans` read: the spans kept, the dropped spans' tokens, and the
    parts of every episode's time (the kept spans' too: ``rollout_splits(..., times=)``)."""

    spans: list[SpanData]
    tokens: TokenTotals
    times: EpisodeTimes = field(default_factory=EpisodeTimes)


# From this many bytes on, a second process reads half of the input (below it, starting one costs
# more than it saves).
PARALLEL_BYTES = 48 << 20


@dataclass
class _Read:
    """What one process read of its parts: the spans kept, what the filter took of the dropped
    ones, the warnings in order, and the error that stopped it."""

    spans: list[SpanData]
    tokens: TokenTotals
    times: EpisodeTimes
    ends: Ends
    warnings: list[str]
    error: Exception | None = None


def summary_reducer(check: frozenset[str] | None = None) -> Any:
    """The native reader's ``Reducer`` of :func:`summary_filter` (its keys, kinds and parts given
    from here), or None without it (:func:`~gymtrace._read.native.native_module`). With ``check``
    (the attribute keys ``gymtrace check`` reads of a span :func:`summary_span` does not take),
    ``gymtrace check``'s: it drops no span and makes each as the checker decodes it, those of the
    summary readers' kinds whole."""
    native = native_module()
    if native is None:
        return None
    keys = (c.ROLLOUT_ID, c.NEMO_GYM_ROLLOUT_ID, c.KIND, *_VALUE_KEYS)
    by_kind, by_operation = part_tables()
    return native.Reducer(
        keys,
        set(_READ_KINDS),
        by_kind,
        by_operation,
        native_span_builder(),
        check=None if check is None else set(check),
    )


def _read_parts(parts: list[tuple[Path, Part]], entries: bool) -> _Read:
    found = _Read([], TokenTotals(entries={} if entries else None), EpisodeTimes(), Ends(), [])
    keep = summary_filter(found.tokens, found.times, found.ends)
    reducer = summary_reducer()
    try:
        with gc_paused():
            for path, part in parts:
                found.spans.extend(
                    iter_file_spans(
                        path,
                        warn=found.warnings.append,
                        keep=keep,
                        part=part,
                        decode=decode_held if reducer is None else decode_reduced,
                        reducer=reducer,
                    )
                )
                if reducer is not None:  # file by file: what it holds meanwhile stays small
                    _take_reduced(reducer, found)
    except (TraceFileError, OSError) as exc:
        found.error = exc
    return found


def _take_reduced(reducer: Any, found: _Read) -> None:
    """What the native reader took of the spans it dropped, into what the Python filter took."""
    found.times.merge(EpisodeTimes.unpacked(reducer.times()))
    for (trace_id, rollout_id), end in reducer.ends().items():
        found.ends.add(trace_id, rollout_id, end)
    for entry in reducer.tokens():
        found.tokens.add(*entry)


def halves(
    files: list[Path], second_share: float = 0.5
) -> tuple[list[tuple[Path, Part]], list[tuple[Path, Part]]] | None:
    """The files as two lists of parts, in order, each part whole lines, the second holding about
    ``second_share`` of the bytes (a half by default); None when there are no two such lists.

    The file the target byte is in is cut where the second part's share begins: a plain one at the
    end of the line the target byte is in, a compressed one where its next gzip member (zstd frame)
    begins (gymtrace writes an export a member: :func:`~gymtrace._model.tracefiles.member_start`).
    A compressed file with no member there (one compressed whole) is not cut: the files are split
    whole, at the file boundary nearest the target, if the smaller part holds a third of the bytes
    or more; else there are no halves, and one process reads them all."""
    sizes = [f.stat().st_size for f in files]
    target = sum(sizes) - int(sum(sizes) * second_share)
    first: list[tuple[Path, Part]] = []
    second: list[tuple[Path, Part]] = []
    offset = 0
    for file, size in zip(files, sizes, strict=True):
        if offset + size <= target:
            first.append((file, None))
        elif offset >= target:
            second.append((file, None))
        else:
            cut = _cut(file, target - offset)
            if cut is None:
                return _whole_files(files, sizes, target)
            first.append((file, (0, cut)))
            if cut < size:
                second.append((file, (cut, size)))
        offset += size
    return first, second


def _cut(file: Path, at: int) -> int | None:
    """Where a part of ``file`` that holds byte ``at`` can end (see :func:`halves`)."""
    if compression_of(file) is not None:
        return member_start(file, at)
    with open(file, "rb") as f:
        f.seek(at)
        return at + len(f.readline())  # the end of the line the target is in


def _whole_files(
    files: list[Path], sizes: list[int], target: int
) -> tuple[list[tuple[Path, Part]], list[tuple[Path, Part]]] | None:
    ends = [sum(sizes[: i + 1]) for i in range(len(files) - 1)]
    if not ends:
        return None
    cut = min(range(len(ends)), key=lambda i: abs(ends[i] - target))
    if min(ends[cut], sum(sizes) - ends[cut]) * 3 < sum(sizes):
        return None
    return [(f, None) for f in files[: cut + 1]], [(f, None) for f in files[cut + 1 :]]


def fork_context() -> Any:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    if cores < 2 or "fork" not in multiprocessing.get_all_start_methods():
        return None
    return multiprocessing.get_context("fork")


@contextmanager
def aside(work: Callable[[], _T], fork: bool) -> Iterator[Callable[[], _T]]:
    """``work`` done by a forked process while this one goes on (when ``fork`` and a second core is
    there), its result fetched by the function this yields; else done here when that function is
    called. The forked process reads what this one holds as it was at the fork, without a copy;
    what ``work`` returns comes back pickled. When the process cannot hand a result back (``work``
    raised, or it was killed), the work is done here, so any error is raised where it would have
    been without the fork. On leaving the block, the process is ended if it is still there."""
    context = fork_context() if fork else None
    if context is None:
        yield work
        return
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_work_aside, args=(work, send), daemon=True)
    try:
        process.start()
    except OSError:  # no process to be had (a limit): here, then
        receive.close()
        send.close()
        yield work
        return
    send.close()

    def result() -> _T:
        try:
            done, value = receive.recv()
        except (EOFError, OSError):  # gone without an answer
            done, value = False, None
        process.join()
        return value if done else work()

    try:
        yield result
    finally:
        receive.close()
        if process.is_alive():
            process.terminate()
        process.join()


def _work_aside(work: Callable[[], Any], send: Any) -> None:
    """In the forked process: ``work``'s result sent back as (True, result), or (False, None) when
    it raised or its result cannot be pickled; the process that forked does it again, and raises."""
    try:
        answer = (True, work())
    except BaseException:  # noqa: BLE001 - the process that forked does it again, and raises it
        answer = (False, None)
    _send_last(send, answer, (False, None))


def _send_last(send: Any, message: tuple[Any, ...], instead: tuple[Any, ...]) -> None:
    """``message`` sent, or ``instead`` when it cannot be pickled (nothing of it was written:
    ``send`` pickles first); then the end of the pipe closed."""
    try:
        send.send(message)
    except Exception:  # noqa: BLE001 - not picklable: the process that forked does the work again
        send.send(instead)
    send.close()


def apart(work: Callable[[Warn], tuple[_T, object]], context: Any, warn: Warn | None) -> _T:
    """What ``work`` answers (the first of the two it returns), worked out by a process forked from
    ``context``, which then leaves without freeing what the answer was made from (the second): the
    system takes back a process's memory at once, where freeing 10^6 objects one by one takes ~0.45 s
    at the end of a check of 100,000 rollouts. ``work`` gives its warnings to the function it is
    passed; they are given to ``warn`` here, before the answer is returned or its error raised (a
    :class:`TraceFileError` or an ``OSError`` comes back). When the process cannot hand back an
    answer (another error, or it was killed), the work is done here, so any error is raised where it
    would have been."""
    receive, send = context.Pipe(duplex=False)
    # Not a daemon: the work forks processes of its own.
    process = context.Process(target=_work_apart, args=(work, send))
    try:
        process.start()
    except OSError:  # no process to be had (a limit): here, then
        receive.close()
        send.close()
        return work(warn or ignore_warning)[0]
    send.close()
    done: bool = False
    answer: Any = None
    warnings: list[str] = []
    try:
        with suppress(EOFError, OSError):  # gone without an answer
            done, answer, warnings = receive.recv()
    finally:
        receive.close()
        if process.is_alive() and not done:  # interrupted: it goes too
            process.terminate()
        process.join()
    if not done and answer is None:
        return work(warn or ignore_warning)[0]
    give(warnings, warn)
    if not done:
        raise answer
    return answer  # type: ignore[no-any-return]


def give(warnings: Iterable[str], warn: Warn | None) -> None:
    """Each of ``warnings`` to ``warn``, if given."""
    if warn is not None:
        for message in warnings:
            warn(message)


def ignore_warning(message: str) -> None:
    """A warning nobody is told of."""


def _work_apart(work: Callable[[Warn], tuple[Any, object]], send: Any) -> None:
    """In the forked process: (True, the answer, the warnings) sent back, or (False, the error, the
    warnings) for a :class:`TraceFileError` or ``OSError``, or (False, None, []) for any other error
    or an answer that cannot be pickled (the process that forked does the work again, and raises);
    then the process leaves at once, without freeing what ``work`` held."""
    warnings: list[str] = []
    try:
        # What the answer was made from stays referenced until the process leaves, freeing nothing.
        answer, _held = work(warnings.append)
        message: tuple[bool, Any, list[str]] = (True, answer, warnings)
    except (TraceFileError, OSError) as exc:
        message = (False, exc, warnings)
    except BaseException:  # noqa: BLE001 - the process that forked does it again, and raises it
        message = (False, None, [])
    _send_last(send, message, (False, None, []))
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)


# From this many spans kept by a summary reader on (~25,000 rollouts, where working out the time
# split takes ~0.4 s), the split is worked out by a forked process beside the outcome rule.
ASIDE_SPANS = 50_000


@contextmanager
def time_splits(
    summary: Summary, *, wanted: bool = True
) -> Iterator[Callable[[Iterable[Any]], dict[int, TimeSplit | None]]]:
    """What ``rollout_splits`` gives for the outcomes passed to the function this yields, worked out
    (from :data:`ASIDE_SPANS` kept spans on, when ``wanted``) by a forked process while this one
    decides them: at 100,000 rollouts ~1.7 s beside the outcome rule's ~3.3 s."""
    if not wanted or len(summary.spans) < ASIDE_SPANS:
        yield lambda outcomes: rollout_splits(summary.spans, outcomes, summary.times)
        return
    with aside(lambda: pack_splits(splits_by_rollout(summary.spans, summary.times)), fork=True) as later:
        yield lambda outcomes: rollout_splits(summary.spans, outcomes, by_rollout=unpack_splits(later()))


def split_for_two(
    files: list[Path], parallel_from: int, second_share: float = 0.5
) -> tuple[Any, tuple[list[tuple[Path, Part]], list[tuple[Path, Part]]]] | None:
    """The fork context and the two :func:`halves` of ``files`` (``second_share`` of the bytes in
    the second) when they hold ``parallel_from`` bytes or more (on disk) and a second process can
    read the second meanwhile; else None."""
    if sum(f.stat().st_size for f in files) < parallel_from:
        return None
    context = fork_context()
    split = halves(files, second_share) if context is not None else None
    return None if split is None else (context, split)


# The share of the input the second process reads, by what reads the spans: less than half, since
# the second process then packs what it kept for the trip back, and the first unpacks it only after
# its own part. That trip costs about the same whatever read the spans (at 100,000 rollouts, 1.5 s
# and 0.8 s; the checker's, 1.6 s and 0.8 s), so the slower the reading the nearer the share is to
# half: ~13 s a half with the native reader, ~20 s with orjson alone and ~40 s with the standard
# library's json (the plain install, whose first process finished 3.6 s after the second at 0.47).
SECOND_SHARE = {"native": 0.47, "orjson": 0.48, "json": 0.49}


def second_share() -> float:
    """:data:`SECOND_SHARE` of the reader this process reads with."""
    if native_module() is not None:
        return SECOND_SHARE["native"]
    return SECOND_SHARE["orjson" if parses_fast() else "json"]


def _read_second(parts: list[tuple[Path, Part]]) -> tuple[bytes, bytes, list[str], Exception | None]:
    """:func:`_read_parts` in the second process, what it found packed for the trip back in
    ``marshal``'s C (spans: :func:`~gymtrace._model.spandata.pack_spans`), not pickled object by
    object: the tokens it took as entries, the time split's intervals, the earliest ends."""
    found = _read_parts(parts, entries=True)
    rest = pack_values((found.tokens.entries, found.times.packed(), found.ends.earliest))
    return pack_spans(found.spans), rest, found.warnings, found.error


def _unpack_second(result: tuple[bytes, bytes, list[str], Exception | None]) -> _Read:
    spans, rest, warnings, error = result
    _, (entries, intervals, earliest) = unpack_values(rest)
    tokens = TokenTotals(entries=entries)
    return _Read(
        unpack_spans(spans), tokens, EpisodeTimes.unpacked(intervals), Ends(earliest), warnings, error
    )


def _read_all(files: list[Path], parallel_from: int) -> _Read:
    """One streaming pass over ``files``; an input of ``parallel_from`` bytes or more (on disk) is
    split in two :func:`halves`, the second read by a forked process meanwhile (both cores of a
    small machine), the results joined in order."""
    two = split_for_two(files, parallel_from, second_share())
    if two is None:
        return _read_parts([(f, None) for f in files], entries=False)
    context, (first, second) = two
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        later = pool.submit(_read_second, second)
        found = _read_parts(first, entries=True)
        if found.error is not None:
            later.cancel()
            return found
        more = _unpack_second(later.result())
    for key, entry in (more.tokens.entries or {}).items():
        found.tokens.add_keyed(key, *entry)
    found.times.merge(more.times)
    found.ends.merge(more.ends)
    found.spans += more.spans
    found.warnings += more.warnings
    found.error = more.error
    return found


def read_summary_spans(
    paths: Iterable[str | Path], warn: Warn | None = None, *, parallel_from: int | None = None
) -> Summary:
    """The spans the summary readers need from every file (or directory) of ``paths``; from
    ``parallel_from`` bytes on (default :data:`PARALLEL_BYTES`), read by two processes."""
    files = trace_files_of(paths, warn)
    found = _read_all(files, PARALLEL_BYTES if parallel_from is None else parallel_from)
    give(found.warnings, warn)
    if found.error is not None:
        raise found.error
    spans, tokens, times = found.spans, found.tokens, found.times
    times.add_spans(spans)  # a span kept for an odd value or a Ray re-run may be a part too
    live = {s.trace_id for s in spans if s.attributes.get(c.KIND) == c.KIND_LIVE}
    if live:
        # A rollout with live markers and no end is judged ("lost"?) from all of its trace.
        live -= {s.trace_id for s in spans if s.attributes.get(c.KIND) == c.KIND_ROLLOUT}
    whole = live | found.ends.cut_traces(spans)
    if whole:
        again = summary_filter(TokenTotals())

        def dropped_of_whole(raw: Mapping[str, Any]) -> bool:
            trace_id = raw.get("traceId")
            return isinstance(trace_id, str) and trace_id.lower() in whole and not again(raw)

        with gc_paused():
            # What the first pass read past (a cut-short tail) was told by it.
            more = [
                span
                for path in files
                for span in iter_file_spans(path, warn=lambda _: None, keep=dropped_of_whole)
            ]
        for span in more:  # counted from the spans now (their parts are in ``times`` already)
            _forget_tokens(tokens, span)
        spans += more
    return Summary(spans, tokens, times)


def _forget_tokens(tokens: TokenTotals, span: SpanData) -> None:
    count = read_int(span.attributes.get(c.GEN_AI_USAGE_OUTPUT_TOKENS))
    if count:
        attributes = span.attributes
        tokens.forget(
            span.trace_id, span.span_id, count, attributes.get(c.RUN_ID), attributes.get(c.POLICY_VERSION)
        )


def summary_of_traces(traces: Iterable[list[SpanData]]) -> Summary:
    """What :func:`read_summary_spans` keeps, from whole traces given one at a time (Jaeger's
    search, page by page): the spans the summary readers read, the tokens and the time split's
    parts of the others; every span of a trace with live markers and no rollout root, or with an
    attempt a killed process left (each is judged from all of them)."""
    tokens = TokenTotals()
    times = EpisodeTimes()
    kept: list[SpanData] = []
    for trace in traces:
        times.add_spans(trace)
        kinds = {span.attributes.get(c.KIND) for span in trace}
        if (c.KIND_LIVE in kinds and c.KIND_ROLLOUT not in kinds) or Ends().cut_traces(trace):
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
    return Summary(kept, tokens, times)


def traces_matching(files: Iterable[Path], key: str, value: str, warn: Warn | None = None) -> set[str]:
    """The trace IDs that hold a span whose ``key`` attribute is ``value`` (a first pass over trace
    files :func:`~gymtrace._model.tracefiles.trace_files` listed)."""
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
        for path in files:
            for _ in iter_file_spans(path, warn=warn, keep=look):
                pass
    return found


def spans_of_traces(files: Iterable[Path], traces: set[str], warn: Warn | None = None) -> list[SpanData]:
    """Every span of the given traces in trace files :func:`~gymtrace._model.tracefiles.trace_files`
    listed (a second pass)."""

    def keep(raw: Mapping[str, Any]) -> bool:
        trace_id = raw.get("traceId")
        return not isinstance(trace_id, str) or trace_id.lower() in traces

    with gc_paused():
        found = [span for path in files for span in iter_file_spans(path, warn=warn, keep=keep)]
    return found
