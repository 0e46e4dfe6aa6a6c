"""The export queue in an encoder process: the application's process only hands over records.

Used for ``GYMTRACE_ENCODER=process``, and by ``auto`` once spans come fast (``_sdk/export_auto.py``).
A span becomes a tuple of plain values when it ends; every ``_BLOCK`` of them are marshalled and
written to a pipe without blocking, and the application never touches the span again. The encoder
process (``_sdk.export_child.child_main``) rebuilds ``ReadableSpan`` objects and runs the same
:class:`BatchExporter` and exporters, so the queue's promises hold there; its counts come back on a
second pipe, and ``export_stats()`` adds what the application's side dropped (``export.RoomWait``).

Endings: ``force_flush`` sends what is pending and waits for delivery, ``shutdown`` then stops the
encoder. If the application dies, the encoder still delivers every record it was sent; if the
encoder dies, what it had not confirmed is counted as dropped and the queue continues in the
application's process. A forked child never writes to its parent's encoder: it starts its own.
"""

from __future__ import annotations

import collections
import logging
import subprocess
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from gymtrace._model import forks as _forks
from gymtrace._otel_private.records import _BLOCK, LeanSpanRecords, _record, learn_lean_span
from gymtrace._sdk.export import BatchExporter, ExportStats, RoomWait, log_totals, remaining_millis
from gymtrace._sdk.export_child import _FLUSH, _SHUTDOWN, _STAT_FIELDS, _frame, build_exporter, child_main
from gymtrace._sdk.export_pipe import EncoderPipe, pipes_available

__all__ = ["ProcessExporter", "build_exporter", "child_main", "pipes_available"]

logger = logging.getLogger("gymtrace")

_NO_STATS = ExportStats("", 0, 0, 0, 0, 0, 0)  # no fallback queue: nothing to add
_LIVE: weakref.WeakSet[ProcessExporter] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for exporter in list(_LIVE):
        exporter._after_fork()


_forks.in_child(_after_fork_in_child)


class ProcessExporter(LeanSpanRecords, EncoderPipe):
    """A span processor (as :class:`BatchExporter` is) whose queue and exporter run in a child
    process (see :func:`child_main`): the exporter ``target`` describes, behind a
    ``BatchExporter(**queue)``; ``fallback`` makes the same queue in this process.

    Its ``on_end`` for gymtrace's own spans is :class:`LeanSpanRecords`' (it reads the SDK span's
    private fields, so it lives behind the fence in ``gymtrace._otel_private.records``); the
    supervision of the encoder process is :class:`EncoderPipe`'s (``export_pipe``)."""

    def __init__(
        self, target: dict[str, Any], queue: dict[str, Any], *, fallback: Callable[[], BatchExporter]
    ) -> None:
        self.name = queue["name"]
        self.max_queue_size = queue["max_queue_size"]
        self.shutdown_timeout = queue["shutdown_timeout"]
        self.schedule_delay = queue["schedule_delay"]
        # The full queue's wait, resolved here once: the encoder process's queue and this pipe hold
        # the caller alike (export.RoomWait).
        self._max_wait = RoomWait(queue.get("max_wait")).limit
        self._config = {"target": target, "queue": {**queue, "max_wait": self._max_wait}}
        self._fallback_factory = fallback
        learn_lean_span()
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
        # A full pipe holds the caller as a full thread queue does (_wait_for_pipe).
        self._room = RoomWait(self._max_wait)
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

    def send_soon(self) -> None:
        """Hand over what is pending now, without waiting for it (live markers)."""
        self._wake.set()

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
