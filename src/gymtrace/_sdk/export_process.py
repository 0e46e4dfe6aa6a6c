"""The export queue in an encoder process: the application's process only hands over records.

``GYMTRACE_ENCODER=process`` (or ``configure(encoder="process")``) puts gymtrace's OTLP and file
exporters in a child process; the default, ``auto`` (``_export_auto.py``), moves there when spans
come fast. Why (``benchmarks/perf.py``, the CartPole rows): with the export queue on a thread of
the application's process, a span cost the process ~13 µs more than with no exporter at all, of
which encoding was only ~4 µs; the rest was the export thread itself (it takes the GIL from the
application, and reading and freeing spans on another core drags their memory between the cores'
caches) and the cyclic collector, which ran ten times as often and promoted the queued spans to
the oldest generation (three full collections per 50,000 steps).

Here the span becomes a tuple of plain values when it ends (its trace and span IDs, name, kind,
times, attributes, events, links, status); every ``_BLOCK`` of them are serialised with
``marshal`` and written to a pipe without blocking. The span itself is freed at once, and no
thread of the application's process touches it again. The encoder process (:func:`child_main`)
turns the records back into SDK ``ReadableSpan`` objects and runs the same :class:`BatchExporter`
and exporters the thread mode runs, so every promise of the queue holds there: bounded memory,
counted drops, retries with backoff, the 4 MiB request bound, a flush bounded by
``GYMTRACE_FLUSH_TIMEOUT``. It reports its counts back on a second pipe after every change;
``export_stats()`` adds what the application's side dropped (a pipe that stayed full longer
than the queue bound) and counts what is in the pipe as queued.

Endings: ``force_flush`` (and so the exit hooks and SIGTERM) sends what is pending and waits for
the encoder process to deliver it; ``shutdown`` then stops it. If the application's process dies
without either (SIGKILL, ``os.abort``), the encoder process reads the end of its pipe and still
delivers every record it was sent. If the encoder process dies, what it had not confirmed is
counted as dropped and the queue continues in the application's process, as in thread mode. A
forked child never writes to its parent's encoder: it starts its own at its first span.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import marshal
import os
import select
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from opentelemetry.trace.span import DEFAULT_TRACE_STATE

from gymtrace._model import environment as env
from gymtrace._otel_private import fastpaths as _fastpaths
from gymtrace._sdk.export import BatchExporter, ExportStats, log_totals, remaining_millis
from gymtrace._sdk.export_targets import file_exporter, otlp_exporter
from gymtrace._sdk.otlp import _read, last_object_cache

logger = logging.getLogger("gymtrace")

# Records per frame: a marshal call and a write per this many spans (about 0.3 ms of work).
_BLOCK = 256
_HEADER = 4  # frame length, little-endian
# Longest an application thread waits in one handover for a lagging encoder process.
_BACKPRESSURE_WAIT = 0.1
# Until the encoder process listens (its imports take ~0.3 s, seconds in a fresh virtualenv that
# compiles them first) nothing drains the pipe: frames wait here, up to this many times the queue
# bound. A record in a frame takes ~160 bytes, a span in the thread queue ~1,080 (both measured on
# gymtrace's steps), so this stays within the memory the thread queue's bound allows.
_STARTING_ROOM = 6
_PIPE_SIZE = 1 << 20  # asked of Linux for the span pipe (F_SETPIPE_SZ); the default is 64 KiB
try:
    import fcntl
except ImportError:  # Windows: no non-blocking pipes to select on; the thread queue is used
    fcntl = None  # type: ignore[assignment]
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
# Frame kinds, both directions.
_SPANS, _FLUSH, _SHUTDOWN, _STATS = 0, 1, 2, 3
_SAMPLED = 1  # TraceFlags.SAMPLED
_SHORT = 12  # fields of the short record form
_STAT_FIELDS = ("exported", "dropped_queue_full", "dropped_export_failed", "retries")

_NO_STATS = ExportStats("", 0, 0, 0, 0, 0, 0)  # no fallback queue: nothing to add
_LIVE: weakref.WeakSet[ProcessExporter] = weakref.WeakSet()
# A forked child's copies of its parent's encoder pipes, closed and kept (see _after_fork).
_INHERITED: list[subprocess.Popen[bytes]] = []


def _after_fork_in_child() -> None:
    for exporter in list(_LIVE):
        exporter._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _frame(message: Any) -> bytes:
    data = marshal.dumps(message)
    return len(data).to_bytes(_HEADER, "little") + data


def _state(trace_state: Any) -> tuple[tuple[str, str], ...] | None:
    return tuple(trace_state.items()) if trace_state else None


def _plain(attributes: Any) -> dict[str, Any]:
    return attributes if type(attributes) is dict else dict(attributes or {})


def _record(span: Any, remember: Callable[[Any, Any], None]) -> tuple[Any, ...]:
    """An ended span as plain values (see :meth:`_Rebuilder.span`); its resource and scope by key,
    handed to ``remember``. For any span class; gymtrace's own spans take
    :meth:`ProcessExporter.on_end`'s fast path."""
    (ctx, parent, name, kind, start, end, attributes, dropped_attributes, events, dropped_events, links,
     dropped_links, status, resource, scope) = _read(span)  # fmt: skip
    remember(resource, scope)
    return (
        ctx.trace_id, ctx.span_id, int(ctx.trace_flags), _state(ctx.trace_state),
        None if parent is None else parent.span_id, parent is not None and parent.is_remote,
        name, kind.value, start, end, _plain(attributes), dropped_attributes,
        _event_values(events) if events else (), dropped_events,
        tuple(
            (link.context.trace_id, link.context.span_id, int(link.context.trace_flags), link.context.is_remote,
             _plain(link.attributes), getattr(link.attributes, "dropped", 0))
            for link in links
        ) if links else (),
        dropped_links, *_status_values(status), id(resource), id(scope),
    )  # fmt: skip


def _event_values(events: Any) -> tuple[tuple[Any, ...], ...]:
    """A span's events as (name, timestamp, attributes, dropped attributes)."""
    return tuple(
        (e.name, e.timestamp, _plain(e.attributes), getattr(e.attributes, "dropped", 0)) for e in events
    )


# A status as (code, description).
_status_values = last_object_cache(lambda status: (status.status_code.value, status.description))


# gymtrace's own span class, whose records on_end builds from the fields (the tuple layout of the
# context as _leanspan checked it), and the status its spans share until one is set; any other class goes
# through _record. Set by the first ProcessExporter: _leanspan imports the SDK, and the API-only
# install imports this module.
_FAST: Any = None
_UNSET_STATUS: Any = object()


def _learn_lean_span() -> None:
    global _FAST, _UNSET_STATUS
    from gymtrace._otel_private import leanspan as _leanspan

    _UNSET_STATUS = _leanspan._UNSET_STATUS
    _FAST = _leanspan._LeanSpan if _leanspan._SUPPORTED and _leanspan._CONTEXT_LAYOUT_KNOWN else None


def _records_from_fields_missing() -> list[str]:
    try:
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.trace import SpanContext

        from gymtrace._otel_private import leanspan as _leanspan
    except ImportError:
        return ["opentelemetry-sdk (not installed)"]
    missing = (
        [] if _leanspan._SUPPORTED and _leanspan._CONTEXT_LAYOUT_KNOWN else ["the lean span path (_leanspan)"]
    )
    if not _readable_fields_known(ReadableSpan, SpanContext):
        missing.append(f"ReadableSpan.__init__ fields {', '.join(_READABLE_FIELDS)}")
    return missing


def pipes_available() -> bool:
    """Whether this platform has the non-blocking pipes the encoder process is fed through."""
    return fcntl is not None


class ProcessExporter:
    """A span processor (as :class:`BatchExporter` is) whose queue and exporter run in a child
    process (see :func:`child_main`): the exporter ``target`` describes, behind a
    ``BatchExporter(**queue)``; ``fallback`` makes the same queue in this process."""

    def __init__(
        self, target: dict[str, Any], queue: dict[str, Any], *, fallback: Callable[[], BatchExporter]
    ) -> None:
        self.name = queue["name"]
        self.max_queue_size = queue["max_queue_size"]
        self.shutdown_timeout = queue["shutdown_timeout"]
        self.schedule_delay = queue["schedule_delay"]
        self._config = {"target": target, "queue": queue}
        self._fallback_factory = fallback
        _learn_lean_span()
        self._reset_state()
        with self._lock:
            self._start()  # in the background: its imports take a few hundred milliseconds
        _LIVE.add(self)

    def _reset_state(self) -> None:
        self._lock = threading.RLock()
        self._replied = threading.Condition(self._lock)
        self._wake = threading.Event()
        # Records waiting for a frame. A deque: application threads append without the lock (one
        # atomic call), and the sender pops exactly what it counted.
        self._pending: collections.deque[tuple[Any, ...]] = collections.deque()
        self._last_resource: Any = None
        self._last_scope: Any = None
        self._ready = False  # records go to a running encoder process (on_end's fast path)
        self._resources: dict[int, Any] = {}  # id -> object (held, so an id is never reused)
        self._scopes: dict[int, Any] = {}
        self._sent_resources: set[int] = set()
        self._sent_scopes: set[int] = set()
        self._outbox: collections.deque[tuple[int, bytes]] = collections.deque()  # (spans, frame)
        self._outbox_spans = 0
        self._head_written = 0  # bytes of the outbox's first frame already in the pipe
        # finished = _handed (taken from pending) + len(_pending) + _other (counted by the slow path)
        self._handed = self._other = self._written = 0
        # The encoder process is gone (died, or stopped at shutdown): what was written to its pipe
        # and never confirmed is dropped. Computed when read (stats), never added up at the death:
        # the reply thread may still apply the dead process's last reports, which move spans from
        # dropped to exported, and a count taken at the death counted those twice.
        self._gone = False
        self._dropped_full = self._dropped_failed = 0
        self._child: dict[str, int] = dict.fromkeys(_STAT_FIELDS, 0)
        self._replies: dict[int, bool] = {}
        self._sequence = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._reporting: subprocess.Popen[bytes] | None = None  # whose counts _child holds
        self._heard = False  # the running encoder process reported at least once (it is listening)
        self._reader: threading.Thread | None = None
        self._write_fd = -1
        self._fallback: BatchExporter | None = None
        self._shutdown = False

    @property
    def started(self) -> bool:
        """The encoder process started (rather than the fallback queue in this process)."""
        return self._fallback is None and self._proc is not None

    # -- span processor interface --------------------------------------------------------------

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        return None

    def _on_ending(self, span: Any) -> None:
        return None

    def on_end(self, span: Any) -> None:
        if type(span) is _FAST and self._ready and not span._links:
            # gymtrace's own spans, almost always: the record straight from the fields, no lock
            # (an episode's reward event included).
            trace_id, span_id, _, flags, trace_state, _ = span._context
            if not flags & _SAMPLED:
                return
            parent = span._parent
            attributes = span._attributes
            plain = getattr(attributes, "_dict", None)
            resource, scope = span._resource, span._instrumentation_scope
            if resource is not self._last_resource or scope is not self._last_scope:
                self._remember(resource, scope)
            record: tuple[Any, ...]
            events = span._events
            if (
                not events
                and span._status is _UNSET_STATUS
                and trace_state is DEFAULT_TRACE_STATE
                and type(plain) is dict
                and not attributes.dropped
            ):
                # The short form (see _Rebuilder.span): a sixth less to build and to marshal.
                record = (
                    trace_id, span_id, int(flags), None if parent is None else parent[1],
                    parent is not None and parent[2], span._name, span._kind._value_, span._start_time or 0,
                    span._end_time or 0, plain, id(resource), id(scope),
                )  # fmt: skip
            else:
                record = (
                    trace_id, span_id, int(flags), None if trace_state is DEFAULT_TRACE_STATE else _state(trace_state),
                    None if parent is None else parent[1], parent is not None and parent[2],
                    span._name, span._kind._value_, span._start_time or 0, span._end_time or 0,
                    plain if type(plain) is dict else _plain(attributes), getattr(attributes, "dropped", 0),
                    _event_values(events) if events else (), getattr(events, "dropped", 0), (), 0,
                    *_status_values(span._status), id(resource), id(scope),
                )  # fmt: skip
            pending = self._pending
            pending.append(record)
            if len(pending) >= _BLOCK:
                with self._lock:
                    if len(self._pending) >= _BLOCK and self._ready:  # not sent by another thread
                        self._send(self._take_pending())
            return
        self._on_end_slow(span)

    def _remember(self, resource: Any, scope: Any) -> None:
        self._resources.setdefault(id(resource), resource)
        self._scopes.setdefault(id(scope), scope)
        self._last_resource, self._last_scope = resource, scope

    def _on_end_slow(self, span: Any) -> None:
        """Any other span class, a span with links, or no running encoder process."""
        if not span.context.trace_flags.sampled:
            return
        fallback = self._fallback
        if fallback is not None:
            if self._pending:
                with self._lock:
                    self._rescue_pending()
            fallback.on_end(span)
            return
        with self._lock:
            if self._proc is None and self._fallback is None and not self._shutdown:
                self._start()  # a forked child's first span: its own encoder process
        if self._fallback is not None:
            self._fallback.on_end(span)
            return
        try:
            record = _record(span, self._remember)
        except Exception:
            logger.warning("gymtrace: a span could not be read for export; it is dropped", exc_info=True)
            with self._lock:
                self._other += 1
                self._dropped_failed += 1
            return
        with self._lock:
            if self._shutdown:
                self._other += 1
                self._dropped_failed += 1
                return
            self._pending.append(record)
            if len(self._pending) >= _BLOCK:
                self._send(self._take_pending())

    def _rescue_pending(self) -> None:
        """Records appended by a thread that saw the encoder running just before it died (the fast
        path checks without the lock) go to the fallback queue, not stay pending (lock held)."""
        if self._pending and self._fallback is not None:
            self._replay(self._take_pending())

    def _take_pending(self) -> list[tuple[Any, ...]]:
        """Everything pending now, counted as handed over (lock held)."""
        pending = self._pending
        batch = [pending.popleft() for _ in range(len(pending))]
        self._handed += len(batch)
        return batch

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Hand over everything pending and wait until the encoder process delivered it."""
        deadline = time.monotonic() + timeout_millis / 1000
        fallback = self._fallback
        if fallback is not None:
            with self._lock:
                self._rescue_pending()
            return fallback.force_flush(timeout_millis)
        with self._lock:
            if self._proc is None and not self._pending and not self._outbox:
                return True  # nothing was ever handed over (a forked child that made no span)
            return self._request(_FLUSH, deadline)

    def shutdown(self, timeout_millis: int | None = None, *, report: bool = True) -> None:
        if self._shutdown:
            return
        if timeout_millis is None:
            timeout_millis = int(self.shutdown_timeout * 1000)
        deadline = time.monotonic() + timeout_millis / 1000
        with self._lock:
            self._shutdown = True
            fallback = self._fallback
            self._ready = False
            proc = None
            if fallback is None and (self._proc is not None or self._pending):
                self._request(_SHUTDOWN, deadline)
                proc, self._proc = self._proc, None
        if proc is not None:
            self._stop_child(proc, deadline)
        with self._lock:
            self._rescue_pending()
            # A span that ended on another thread while this one shut down, and frames never
            # written (the deadline passed): counted. What the encoder process never confirmed (it
            # was killed, or the deadline passed) counts as dropped from now on (see _gone).
            self._dropped_failed += len(self._take_pending()) + self._outbox_spans
            self._outbox.clear()
            self._outbox_spans = self._head_written = 0
            self._gone = True
            fallback = self._fallback  # the encoder process may have died meanwhile
        self._wake.set()
        if fallback is not None:
            fallback.shutdown(timeout_millis, report=False)
        if report:
            log_totals(self.stats())

    def stats(self) -> ExportStats:
        with self._lock:
            child = self._child
            extra = self._fallback.stats() if self._fallback is not None else _NO_STATS
            finished = self._handed + len(self._pending) + self._other + extra.finished
            exported = child["exported"] + extra.exported
            full = self._dropped_full + child["dropped_queue_full"] + extra.dropped_queue_full
            failed = self._dropped_failed + child["dropped_export_failed"] + extra.dropped_export_failed
            if self._gone:
                failed += self._unconfirmed()
            return ExportStats(
                exporter=self.name,
                finished=finished,
                exported=exported,
                queued=max(0, finished - exported - full - failed),
                dropped_queue_full=full,
                dropped_export_failed=failed,
                retries=child["retries"] + extra.retries,
            )

    # -- the pipe to the encoder process ---------------------------------------------------------

    def _start(self) -> bool:
        """Start the encoder process (lock held); False (and the fallback in place) if it cannot."""
        if fcntl is None:
            logger.warning("gymtrace: GYMTRACE_ENCODER=process needs POSIX pipes; exporting in this process")
            self._use_fallback()
            return False
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", "from gymtrace._sdk.export_process import child_main; child_main()"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env={
                    **os.environ,
                    # The modules this process imports from wherever it found them (a source
                    # checkout on sys.path, a notebook's added directory).
                    "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
                    # Exporter headers may hold credentials: not in the arguments, which `ps` shows.
                    env.GYMTRACE_ENCODER_CONFIG: json.dumps(self._config),
                },
                # Its own session: a Ctrl-C or a signal to the application's process group must
                # not stop it before the application's exit hooks flushed through it.
                start_new_session=True,
                close_fds=True,
            )
        except OSError:
            logger.warning(
                "gymtrace: the encoder process could not start; exporting in this process", exc_info=True
            )
            self._use_fallback()
            return False
        assert proc.stdin is not None and proc.stdout is not None
        self._proc = self._reporting = proc
        self._heard = False
        self._ready = not self._shutdown
        self._write_fd = proc.stdin.fileno()
        os.set_blocking(self._write_fd, False)
        # Not Linux, or above /proc/sys/fs/pipe-max-size: the default size works too.
        with contextlib.suppress(OSError):
            fcntl.fcntl(self._write_fd, _F_SETPIPE_SZ, _PIPE_SIZE)
        self._reader = threading.Thread(
            target=self._read_replies, args=(proc,), name=f"gymtrace-encoder-replies-{self.name}", daemon=True
        )
        self._reader.start()
        threading.Thread(
            target=self._tick, args=(proc,), name=f"gymtrace-encoder-tick-{self.name}", daemon=True
        ).start()
        return True

    def _send(self, records: list[tuple[Any, ...]]) -> None:
        """Queue one frame of records for the pipe and write what fits (lock held)."""
        if self._proc is None and not self._start():
            self._replay(records)
            return
        resources = [
            (key, dict(r.attributes), getattr(r, "schema_url", "") or "")
            for key, r in list(self._resources.items())  # a snapshot: on_end adds without the lock
            if key not in self._sent_resources and r is not None
        ]
        scopes = [
            (
                key,
                s.name,
                s.version or "",
                getattr(s, "schema_url", "") or "",
                dict(getattr(s, "attributes", None) or {}),
            )
            for key, s in list(self._scopes.items())
            if key not in self._sent_scopes and s is not None
        ]
        self._sent_resources.update(key for key, _, _ in resources)
        self._sent_scopes.update(key for key, *_ in scopes)
        try:
            frame = _frame((_SPANS, resources, scopes, records))
        except ValueError:
            # A value marshal cannot carry (a buggy processor put one in): each record on its own.
            records = self._marshalable(records)  # the rest counted dropped, not also as sent
            frame = _frame((_SPANS, resources, scopes, records))
        self._outbox.append((len(records), frame))
        self._outbox_spans += len(records)
        self._write_outbox()
        # Still starting: nothing reads the pipe yet, so waiting for it gains nothing until the
        # frames reach the (larger) bound; see _STARTING_ROOM.
        bound = self.max_queue_size if self._heard else self.max_queue_size * _STARTING_ROOM
        if self._outbox_spans > (bound // 4 if self._heard else bound):
            # The encoder process is behind: a burst waits a little for the pipe instead of filling
            # the bound (the thread queue hands its worker the GIL for the same reason).
            self._write_while(lambda: self._outbox_spans > bound // 8, time.monotonic() + _BACKPRESSURE_WAIT)
        # Bounded like the thread queue: while the pipe stays full, the oldest whole frames go.
        while self._outbox_spans > bound and len(self._outbox) > 1:
            index = 1 if self._head_written else 0  # a frame partly in the pipe must be finished
            spans, _ = self._outbox[index]
            del self._outbox[index]
            self._outbox_spans -= spans
            self._dropped_full += spans

    def _write_while(self, unfinished: Callable[[], bool], deadline: float) -> bool:
        """Write frames as the pipe drains while ``unfinished()``, until ``deadline`` (lock held,
        released while waiting); whether it finished before the deadline or the encoder's end."""
        while True:
            self._write_outbox()
            if self._proc is None:
                return False
            if not unfinished():
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            fd = self._write_fd
            self._lock.release()
            try:
                select.select([], [fd], [], min(remaining, 0.01))
            except (OSError, ValueError):  # the pipe was closed meanwhile
                return False
            finally:
                self._lock.acquire()

    def _marshalable(self, records: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        kept = []
        for record in records:
            try:
                marshal.dumps(record)
            except ValueError:
                self._dropped_failed += 1
                logger.warning("gymtrace: a span with an attribute value marshal cannot carry is dropped")
                continue
            kept.append(record)
        return kept

    def _write_outbox(self) -> None:
        """Write queued frames until the pipe is full (lock held); never blocks."""
        outbox = self._outbox
        while outbox:
            spans, frame = outbox[0]
            try:
                written = os.write(self._write_fd, memoryview(frame)[self._head_written :])
            except BlockingIOError:
                return
            except OSError:  # BrokenPipeError: the encoder process is gone
                self._encoder_died()
                return
            self._head_written += written
            if self._head_written == len(frame):
                outbox.popleft()
                self._outbox_spans -= spans
                self._written += spans
                self._head_written = 0

    def _tick(self, proc: subprocess.Popen[bytes]) -> None:
        """Every schedule delay: hand over what is pending, so a quiet application's spans leave."""
        while self._proc is proc and not self._shutdown:
            self._wake.wait(self.schedule_delay or 0.05)
            self._wake.clear()
            with self._lock:
                if self._proc is not proc or self._shutdown:
                    return
                if self._pending:
                    self._send(self._take_pending())
                elif self._outbox:
                    self._write_outbox()

    def _request(self, kind: int, deadline: float) -> bool:
        """Send what is pending, then a flush or shutdown request; wait for its answer (lock held)."""
        if self._proc is None and not self._start():
            return self._fallback.force_flush(remaining_millis(deadline)) if self._fallback else False
        if self._pending:
            self._send(self._take_pending())
        if self._proc is None:  # died while sending
            return self._flushed_after_death(kind, deadline)
        self._sequence += 1
        sequence = self._sequence
        remaining = max(0.0, deadline - time.monotonic())
        # The encoder process gets less time than this process waits: its answer must arrive.
        budget = remaining - min(0.5, remaining / 4)
        self._outbox.append((0, _frame((kind, sequence, int(budget * 1000)))))
        # The pipe may be full: write as it drains, until the deadline.
        if not self._write_while(lambda: bool(self._outbox), deadline):
            return self._flushed_after_death(kind, deadline) if self._proc is None else False
        while sequence not in self._replies:
            if self._proc is None:
                return self._flushed_after_death(kind, deadline)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._replied.wait(min(remaining, 0.05))
        return self._replies.pop(sequence)

    def _flushed_after_death(self, kind: int, deadline: float) -> bool:
        """The encoder process died during a flush (lock held): what it had not confirmed is counted
        lost, and the rest went to the fallback queue, which the flush now waits for."""
        if kind != _FLUSH or self._fallback is None:
            return False
        return self._fallback.force_flush(remaining_millis(deadline))

    def _read_replies(self, proc: subprocess.Popen[bytes]) -> None:
        """The encoder process's counts, after every change, and its answers to requests."""
        assert proc.stdout is not None
        # Read from the descriptor, not the buffered file: a thread blocked in a buffered read holds
        # its lock, which a forked child (where this thread does not exist) could never take.
        fd = proc.stdout.fileno()
        try:
            while (message := _read_frame(fd)) is not None:
                with self._lock:
                    if self._reporting is not proc:
                        return  # a replaced encoder process (after a fork or a failure)
                    _, sequence, ok, counts = message
                    self._child = dict(zip(_STAT_FIELDS, counts, strict=True))
                    self._heard = True
                    if sequence:
                        self._replies[sequence] = ok
                    self._replied.notify_all()
        except (OSError, ValueError, EOFError):
            pass
        with self._lock:
            if self._reporting is proc and not self._shutdown:  # it died; shutdown did not stop it
                if self._proc is proc:
                    self._encoder_died()  # not noticed by a write yet
                # Every report it sent is applied now: the count is final.
                logger.warning(
                    "gymtrace: the encoder process of %s exited (code %s); %d spans it held are"
                    " dropped, the rest are exported from this process",
                    self.name,
                    proc.poll(),
                    self._unconfirmed(),
                )
            self._replied.notify_all()
        # Only this thread reads the descriptor, so only it closes it (never while a read waits).
        with contextlib.suppress(OSError, ValueError):
            proc.stdout.close()

    def _encoder_died(self) -> None:
        """The encoder process is gone (lock held): what it had not confirmed is lost."""
        proc = self._proc
        if proc is None:
            return
        # Frames still wholly in the outbox never reached the pipe: they go to the fallback queue
        # below, not lost. A frame partly written is the encoder's (lost with it, as if written).
        unsent = list(self._outbox)[1 if self._head_written else 0 :]
        if self._head_written:
            self._written += self._outbox[0][0]
        self._gone = True  # what it never confirmed is dropped (stats, once its replies are read)
        self._proc = None
        self._ready = False
        if proc.stdin is not None:
            with contextlib.suppress(OSError, ValueError):
                proc.stdin.close()
        self._outbox.clear()
        self._outbox_spans = self._head_written = 0
        self._use_fallback()
        for _, frame in unsent:
            message = marshal.loads(memoryview(frame)[_HEADER:])
            if message[0] == _SPANS:
                self._replay(message[3])  # counted handed when taken from pending: moved to the fallback

    def _use_fallback(self) -> None:
        """Continue in this process with a thread queue (lock held); pending records go to it."""
        self._fallback = self._fallback_factory()
        self._ready = False
        self._replay(self._take_pending())

    def _replay(self, records: list[tuple[Any, ...]]) -> None:
        """Records taken for the encoder process, to the fallback queue instead (lock held)."""
        fallback = self._fallback
        assert fallback is not None
        self._handed -= len(records)  # the fallback counts them from here
        rebuild = _Rebuilder()
        rebuild.resources.update(self._resources)
        rebuild.scopes.update(self._scopes)
        for record in records:
            fallback.on_end(rebuild.span(record))

    def _stop_child(self, proc: subprocess.Popen[bytes], deadline: float) -> None:
        """Close the pipe, wait for the encoder process to exit and for its last report (lock not
        held: the reader thread needs it to apply that report)."""
        if proc.stdin is not None:
            with contextlib.suppress(OSError, ValueError):
                proc.stdin.close()
        try:
            proc.wait(max(0.1, deadline - time.monotonic()) + 1.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader = self._reader
        if reader is not None:
            reader.join(1.0)  # it reads the end of the pipe, applies the last report, closes it

    def _unconfirmed(self) -> int:
        """Spans written to the pipe that the encoder process has not reported (lock held)."""
        child = self._child
        confirmed = child["exported"] + child["dropped_queue_full"] + child["dropped_export_failed"]
        return max(0, self._written - confirmed)

    def _after_fork(self) -> None:
        # The child must never write to the parent's encoder (the parent exports what it queued):
        # it starts empty, and starts its own encoder process at its first span.
        proc = self._proc
        shutdown = self._shutdown
        self._reset_state()
        self._shutdown = shutdown
        if proc is not None:
            # Only this process's copies of the pipes close. Through the unbuffered files (no lock
            # another thread may have held at the fork), and the Popen is kept: collected, its
            # files would close the numbers again, by then perhaps another file's.
            for stream in (proc.stdin, proc.stdout):
                raw = getattr(stream, "raw", None)
                if raw is not None:
                    with contextlib.suppress(OSError, ValueError):
                        raw.close()
            proc.returncode = 0  # not this process's child: never waited for here
            _INHERITED.append(proc)


# -- the encoder process --------------------------------------------------------------------------


_new_object = object.__new__
_new_tuple = tuple.__new__
_NO_STATE: Any = DEFAULT_TRACE_STATE


def _readable_fields_known(readable: Any, span_context: Any) -> bool:
    # The fields ReadableSpan.__init__ sets, as _Rebuilder._short sets them.
    probe = readable(name="probe", context=span_context(1, 2, False), resource=object())
    return sorted(vars(probe)) == sorted(_READABLE_FIELDS)


_READABLE_FIELDS = (
    "_name", "_context", "_kind", "_instrumentation_info", "_instrumentation_scope", "_parent", "_start_time",
    "_end_time", "_attributes", "_events", "_links", "_resource", "_status",
)  # fmt: skip


class _Rebuilder:
    """Records back into SDK ``ReadableSpan`` objects, with shared resources and scopes."""

    def __init__(self) -> None:
        from opentelemetry.sdk.trace import Event, ReadableSpan
        from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags, TraceState
        from opentelemetry.trace.status import Status, StatusCode

        self.resources: dict[int, Any] = {}
        self.scopes: dict[int, Any] = {}
        self._readable = ReadableSpan
        self._event, self._link = Event, Link
        self._context, self._flags, self._state = SpanContext, TraceFlags, TraceState
        self._kinds = {kind.value: kind for kind in SpanKind}
        self._codes = {code.value: code for code in StatusCode}
        self._status, self._unset = Status, Status(StatusCode.UNSET)
        self._flag_objects = {value: TraceFlags(value) for value in range(256)}
        self._last_parent: tuple[Any, ...] = (None, None, None, None)  # trace, span, remote, context
        from gymtrace._otel_private.leanspan import _CONTEXT_LAYOUT_KNOWN

        # Contexts built as tuples (checked by _leanspan) and spans from their fields (checked here).
        self._direct = _CONTEXT_LAYOUT_KNOWN and _readable_fields_known(ReadableSpan, SpanContext)

    def _short(self, record: tuple[Any, ...]) -> Any:
        """The short record (see ProcessExporter.on_end) as a ReadableSpan, its fields set as
        ``ReadableSpan.__init__`` sets them (checked once) and its contexts built as the tuples
        they are: this runs for every span the encoder process receives."""
        (trace_id, span_id, flags, parent_id, parent_remote, name, kind, start, end, attributes, resource,
         scope) = record  # fmt: skip
        trace_flags = self._flag_objects[flags]
        last = self._last_parent
        if parent_id is None:
            parent = None
        elif last[0] == trace_id and last[1] == parent_id and last[2] == parent_remote:
            parent = last[3]  # siblings (the steps of an episode) share their parent's context
        else:
            parent = _new_tuple(
                self._context, (trace_id, parent_id, parent_remote, trace_flags, _NO_STATE, True)
            )
            self._last_parent = (trace_id, parent_id, parent_remote, parent)
        span: Any = _new_object(self._readable)
        span._name = name
        span._context = _new_tuple(self._context, (trace_id, span_id, False, trace_flags, _NO_STATE, True))
        span._kind = self._kinds[kind]
        span._instrumentation_info = None
        span._instrumentation_scope = self.scopes.get(scope)
        span._parent = parent
        span._start_time = start
        span._end_time = end
        span._attributes = attributes
        span._events = ()
        span._links = ()
        span._resource = self.resources.get(resource)
        span._status = self._unset
        return span

    def define(self, resources: list[Any], scopes: list[Any]) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        for key, attributes, schema_url in resources:
            self.resources[key] = Resource(attributes, schema_url or None)
        for key, name, version, schema_url, attributes in scopes:
            self.scopes[key] = InstrumentationScope(
                name, version or None, schema_url or None, attributes or None
            )

    def _bounded(self, attributes: dict[str, Any], dropped: int) -> Any:
        if not dropped:
            return attributes
        from opentelemetry.attributes import BoundedAttributes

        bounded = BoundedAttributes(None, attributes, immutable=True)
        bounded.dropped = dropped
        return bounded

    def span(self, record: tuple[Any, ...]) -> Any:
        if len(record) == _SHORT and self._direct and record[10] in self.resources:
            return self._short(record)
        if len(record) == _SHORT:
            # No trace state, no dropped attributes, no events or links, an unset status.
            trace_id, span_id, flags, parent_id, parent_remote, *rest, attributes, resource, scope = record
            record = (trace_id, span_id, flags, None, parent_id, parent_remote, *rest, attributes, 0, (), 0, (),
                      0, 0, None, resource, scope)  # fmt: skip
        (trace_id, span_id, flags, state, parent_id, parent_remote, name, kind, start, end, attributes,
         dropped_attributes, events, dropped_events, links, dropped_links, code, description, resource,
         scope) = record  # fmt: skip
        trace_flags = self._flags(flags)
        trace_state = self._state(list(state)) if state else None
        context = self._context(trace_id, span_id, False, trace_flags, trace_state)
        parent = (
            None
            if parent_id is None
            else self._context(trace_id, parent_id, parent_remote, trace_flags, trace_state)
        )
        event_objects = _counted(
            [
                self._event(e_name, self._bounded(e_attributes, e_dropped), e_time)
                for e_name, e_time, e_attributes, e_dropped in events
            ],
            dropped_events,
        )
        link_objects = _counted(
            [
                self._link(
                    self._context(l_trace, l_span, l_remote, self._flags(l_flags)),
                    self._bounded(l_attr, l_dropped),
                )
                for l_trace, l_span, l_flags, l_remote, l_attr, l_dropped in links
            ],
            dropped_links,
        )
        status = (
            self._unset if code == 0 and not description else self._status(self._codes[code], description)
        )
        return self._readable(
            name=name,
            context=context,
            parent=parent,
            resource=self.resources.get(resource),
            attributes=self._bounded(attributes, dropped_attributes),
            events=event_objects,
            links=link_objects,
            kind=self._kinds[kind],
            status=status,
            start_time=start,
            end_time=end,
            instrumentation_scope=self.scopes.get(scope),
        )


def _counted(items: list[Any], dropped: int) -> Any:
    """``items`` as the span had them: a BoundedList saying how many were dropped, if any were."""
    if not dropped:
        return items
    from opentelemetry.sdk.util import BoundedList

    bounded = BoundedList.from_seq(len(items), items)
    bounded.dropped = dropped
    return bounded


def build_exporter(target: dict[str, Any]) -> Any:
    """The exporter ``target`` describes (see ``_setup._processors``)."""
    if target["kind"] == "file":
        return file_exporter(target["path"], target["line_spans"])
    return otlp_exporter(target["protocol"], target.get("endpoint"), target.get("headers"))


def child_main() -> None:
    """The encoder process: records from stdin into a :class:`BatchExporter`; counts to stdout."""
    # The application's exit hooks decide when this process stops (shutdown, or the end of the
    # pipe): a Ctrl-C or SIGTERM for the application's process group is not for it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(format="%(message)s", level=logging.WARNING)
    config = json.loads(os.environ.pop(env.GYMTRACE_ENCODER_CONFIG))
    queue = BatchExporter(build_exporter(config["target"]), **config["queue"])
    rebuild = _Rebuilder()
    stdin, out = sys.stdin.fileno(), sys.stdout.buffer
    parent = os.getppid()
    sent: tuple[int, ...] = ()
    shutdown_sequence = 0

    def counts() -> tuple[int, ...]:
        stats = queue.stats()
        return tuple(getattr(stats, name) for name in _STAT_FIELDS)

    def report(sequence: int = 0, ok: bool = True) -> tuple[int, ...]:
        values = counts()
        out.write(_frame((_STATS, sequence, ok, values)))
        out.flush()
        return values

    stop_timeout = queue.shutdown_timeout
    # Ready: the imports are done (a fresh virtualenv compiles them first: seconds). Until this
    # first report arrives, the application's side lets frames wait for the pipe (_STARTING_ROOM).
    sent = report()
    try:
        while True:
            ready, _, _ = select.select([stdin], [], [], 0.1)
            if not ready:
                if os.getppid() != parent:
                    break  # the application's process is gone and something else holds the pipe
                if counts() != sent:
                    sent = report()
                continue
            message = _read_frame(stdin)
            if message is None:
                break  # the application's process closed the pipe, or died: deliver and stop
            kind = message[0]
            if kind == _SPANS:
                _, resources, scopes, records = message
                rebuild.define(resources, scopes)
                for record in records:
                    queue.on_end(rebuild.span(record))
            elif kind == _FLUSH:
                sent = report(message[1], queue.force_flush(message[2]))
            elif kind == _SHUTDOWN:
                shutdown_sequence, stop_timeout = message[1], message[2] / 1000
                break
    finally:
        # Delivered, or counted: the application logs the totals, this process only reports them.
        logging.getLogger("gymtrace").setLevel(logging.ERROR)
        queue.shutdown(int(stop_timeout * 1000))
        with contextlib.suppress(OSError):  # nobody is reading any more
            report(shutdown_sequence)


def _read_frame(fd: int) -> Any:
    """The next message :func:`_frame` wrote to ``fd``, or None at the end of the pipe."""
    header = _read_exactly(fd, _HEADER)
    body = None if header is None else _read_exactly(fd, int.from_bytes(header, "little"))
    return None if body is None else marshal.loads(body)


def _read_exactly(fd: int, size: int) -> bytes | None:
    """``size`` bytes from ``fd`` (unbuffered: ``select`` must see what is unread), or None at
    the end of the pipe."""
    chunks = []
    while size:
        chunk = os.read(fd, size)
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


_fastpaths.register(
    "encoder-process records from span fields",
    __name__,
    ("sdk _Span fields (as _leanspan checks them)", "ReadableSpan.__init__ fields"),
    "records built through the span's properties, spans rebuilt through ReadableSpan(...)",
    _records_from_fields_missing,
)
