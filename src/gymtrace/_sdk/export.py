"""The export queue: bounded, off the caller's thread, and honest about what it drops.

``configure()`` puts every exporter behind a :class:`BatchExporter` (not the SDK's), whose rules are:

- the caller pays a lock and a deque append; encoding and I/O run on the worker, which hands an
  exporter that splits its own output (``max_drain``) its whole backlog in one call;
- except that an exporter with a ``queued_form(span)`` (the file's: its encoding of the span) has
  each span encoded as it ends and that queued instead of the span: a queued span keeps a dozen
  containers alive across the cyclic collector's young collections, which fall due per 700
  containers allocated and not freed, so a queue of spans makes a process collect more often, and
  in a server whose heap is large every tenth-or-so of those collections is followed by a full one
  of hundreds of milliseconds (docs/performance.md, NeMo Gym); the text holds none (its tuple one);
- a batch the exporter could not deliver goes back into the queue and is tried again after a backoff;
- a full queue holds the caller while the exporter delivers; a failing or stalled exporter drops the
  oldest instead (:class:`RoomWait`, the encoder process's pipe's rule too); once the queue is a
  quarter full, every 64th ``on_end`` yields the GIL to the worker;
- every span not delivered is counted (``gymtrace.export_stats()``, logged at shutdown).

What was measured and tried: docs/performance.md, "Keeping up at env-step rate".
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gymtrace._model import forks as _forks
from gymtrace._model import settings as _settings

logger = logging.getLogger("gymtrace")

DEFAULT_MAX_QUEUE_SIZE = _settings.DEFAULT_MAX_QUEUE_SIZE
DEFAULT_MAX_BATCH_SIZE = _settings.DEFAULT_MAX_EXPORT_BATCH_SIZE
DEFAULT_SCHEDULE_DELAY = _settings.DEFAULT_SCHEDULE_DELAY
# After a failed export, wait this long (doubling up to the maximum) before the next try.
_BACKOFF_START = 0.25
_BACKOFF_MAX = 5.0
# A span whose export failed this many times is given up (counted as dropped): with the backoff
# and the exporters' own retries that is minutes of outage, and it stops a batch the Collector
# rejects for good from circling forever.
_MAX_TRIES = 20
# A full queue (the thread queue, the encoder process's pipe) holds the caller this long at most,
# once per stall: past it, the oldest spans are dropped (counted) until the exporter delivers
# again (RoomWait).
_ROOM_WAIT = 5.0
# With the queue this deep (see BatchExporter._yield_depth), the application's thread gives the
# GIL away once every this many spans (a mask: every 64th).
_YIELD_EVERY_MASK = 63
_yield_gil = functools.partial(time.sleep, 0)


def wait_until_idle(
    condition: threading.Condition,
    busy: Callable[[], bool],
    deadline: float,
    *,
    nudge: Callable[[], None] | None = None,
) -> bool:
    """With ``condition``'s lock held, wait until ``busy()`` is false (True) or the ``deadline`` of
    ``time.monotonic()`` passes (False): how every flush here waits for its worker thread. It looks
    again every 50 ms even unnotified, and calls ``nudge`` (to wake the worker) after each wait."""
    while busy():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        condition.wait(min(remaining, 0.05))
        if nudge is not None:
            nudge()
    return True


class RoomWait:
    """The one rule for a full queue, the thread queue's and the encoder process's pipe's (issue 47).

    A burst faster than the exporter fills the queue while the exporter is delivering (a worker
    waiting for the GIL, a network export under way, an encoder process behind): dropping then
    loses spans that would have gone out a moment later, so the caller is held until there is room,
    which also hands the worker the GIL, and the burst arrives whole in the queue's memory. Holding
    a caller only makes sense while the exporter delivers: while it fails (an export timed out or
    was refused, the backoff) the spans could not go anywhere, so nothing waits; and one wait per
    stall, at most ``limit`` seconds (``_ROOM_WAIT``): once a wait ran out (a Collector that
    accepts and never answers, an encoder process stopped), none again until the exporter delivers.
    Either way the oldest spans go, counted, as before.
    """

    __slots__ = ("limit", "stalled")

    def __init__(self, limit: float | None = None) -> None:
        # Read when the queue is made, so a benchmark can set the module's constant (0: drop at once).
        self.limit = _ROOM_WAIT if limit is None else limit
        self.stalled = False  # a wait ran out: no wait again until the exporter delivers

    def hold(
        self, full: Callable[[], bool], failing: Callable[[], bool], wait: Callable[[float], object]
    ) -> None:
        """While ``full()`` and not ``failing()``, call ``wait(seconds left)``, which lets the
        exporter's side run (it releases the caller's lock) and returns when there may be room;
        until the limit, when the stall is noted. The caller then drops what still does not fit."""
        if self.stalled or self.limit <= 0 or failing():
            return
        deadline = time.monotonic() + self.limit
        while full() and not failing():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.stalled = True
                return
            wait(remaining)

    def delivered(self) -> None:
        """The exporter delivered (an export succeeded, the pipe took a frame): a full queue waits again."""
        self.stalled = False


# Every exporter queue alive in this process. One fork hook serves them all; a hook per instance
# could never be unregistered and would keep every replaced queue alive.
_LIVE: weakref.WeakSet[BatchExporter] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for exporter in list(_LIVE):
        exporter._after_fork()


_forks.in_child(_after_fork_in_child)


@dataclass(frozen=True)
class ExportStats:
    """Counts since the exporter started. ``dropped`` is every span that will never be delivered."""

    exporter: str
    finished: int  # sampled spans handed to the queue
    exported: int  # delivered (the exporter reported success)
    queued: int  # waiting in the queue now
    dropped_queue_full: int  # pushed out of a full queue (the oldest go first)
    dropped_export_failed: int  # rejected as non-retryable, or still failing at shutdown
    retries: int  # batches put back after a failed export

    @property
    def dropped(self) -> int:
        return self.dropped_queue_full + self.dropped_export_failed


def remaining_millis(deadline: float) -> int:
    """Milliseconds left until ``deadline`` (a ``time.monotonic()`` value), never negative."""
    return max(0, int((deadline - time.monotonic()) * 1000))


def log_totals(stats: ExportStats, flushed: bool = True) -> None:
    """The one line a queue logs at shutdown: a warning if anything was dropped or not flushed."""
    if stats.dropped or not flushed:
        logger.warning(
            "gymtrace: %s exported %d of %d spans; dropped %d (queue full: %d, export failed or"
            " flush timed out: %d)",
            stats.exporter,
            stats.exported,
            stats.finished,
            stats.dropped,
            stats.dropped_queue_full,
            stats.dropped_export_failed,
        )
    else:
        logger.info("gymtrace: %s exported all %d spans", stats.exporter, stats.exported)


class BatchExporter:
    """A span processor (duck-typed, like the SDK's) that batches spans to one exporter."""

    def __init__(
        self,
        exporter: Any,
        *,
        name: str,
        max_queue_size: int = DEFAULT_MAX_QUEUE_SIZE,
        max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
        schedule_delay: float = DEFAULT_SCHEDULE_DELAY,
        shutdown_timeout: float = 5.0,
        max_drain: int | None = None,
        observer: Callable[[], None] | None = None,
        max_wait: float | None = None,
        encode_on_end: bool = True,
    ) -> None:
        self.exporter = exporter
        # The exporter's encoding of one span, run as each span ends (the module docstring);
        # ``encode_on_end=False`` queues spans (the encoder process's queue: its own small heap
        # collects cheaply, and encoding a batch at once on its worker costs it less).
        self._encode: Callable[[Any], Any] | None = (
            getattr(exporter, "queued_form", None) if encode_on_end else None
        )
        self.name = name
        self.max_queue_size = max_queue_size
        self.max_batch_size = min(max_batch_size, max_queue_size)
        # The most spans one export() call is handed. The default is the batch size (the SDK's
        # contract); an exporter that splits its own requests (gymtrace's OTLP and file exporters)
        # is handed everything queued, up to this, so its per-call GIL handoffs are paid per
        # thousands of spans (see the module docstring).
        self.max_drain = max(self.max_batch_size, min(max_drain or self.max_batch_size, max_queue_size))
        self._yield_depth = max(2 * self.max_batch_size, max_queue_size // 4)
        self._room = RoomWait(max_wait)
        self.max_wait = self._room.limit  # seconds a full queue holds the caller (RoomWait)
        self.schedule_delay = schedule_delay
        self.shutdown_timeout = shutdown_timeout
        # Called on the worker thread before it takes each batch, off the application's threads:
        # GYMTRACE_ENCODER=auto watches the span rate there.
        self._observer = observer
        self._queue: collections.deque[Any] = collections.deque()
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._idle = threading.Condition(self._lock)
        self._exporting = 0  # spans in the batch the worker holds right now
        self._abandoned = False  # shutdown gave up waiting for the worker's batch
        self._finished = self._exported = self._dropped_full = self._dropped_failed = self._retries = 0
        self._shutdown = False
        self._backoff = 0.0
        self._tries: dict[int, int] = {}  # id(span) -> failed exports, for spans put back
        self._pid = os.getpid()
        self._thread: threading.Thread | None = None
        self._start_worker()
        _LIVE.add(self)

    # -- span processor interface --------------------------------------------------------------

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        return None

    def _on_ending(self, span: Any) -> None:
        return None

    def on_end(self, span: Any) -> None:
        if not span.context.trace_flags.sampled:
            return
        item = span
        encode = self._encode
        if encode is not None:
            try:
                item = encode(span)
            except Exception:  # noqa: BLE001 - the worker encodes it again, and reports what fails there
                item = span
        with self._lock:
            if self._shutdown:
                # Still a finished span: count it, or finished != exported + dropped + queued.
                self._finished += 1
                self._dropped_failed += 1
                return
            if len(self._queue) >= self.max_queue_size:
                self._wait_for_room()
                if self._shutdown:  # shut down meanwhile: counted as above, never left queued
                    self._finished += 1
                    self._dropped_failed += 1
                    return
            if len(self._queue) >= self.max_queue_size:
                oldest = self._queue.popleft()
                self._dropped_full += 1
                if self._tries:
                    self._tries.pop(id(oldest), None)
            self._queue.append(item)
            self._finished += 1
            depth = len(self._queue)
            # While backing off after a failed export, a full batch is no reason to try again early.
            full_batch = depth >= self.max_batch_size and not self._backoff
            lagging = depth >= self._yield_depth and not self._finished & _YIELD_EVERY_MASK
        # Once set, the event stays set until the worker takes a batch: setting it again on every
        # span while the worker is busy would cost each span a lock and a notify for nothing.
        if full_batch and not self._wake.is_set():
            self._wake.set()
        if lagging:
            # The worker is falling behind: hand it the GIL (see the module docstring).
            _yield_gil()

    def _wait_for_room(self) -> None:
        """The queue is full: hold the caller while the exporter delivers (lock held, released
        while waiting; :class:`RoomWait`). Never on the worker's own thread (an exporter that ends
        spans would wait for itself); the worker is woken, since a full queue is a full batch."""
        worker = self._thread
        if worker is None or not worker.is_alive() or worker.ident == threading.get_ident():
            return
        self._wake.set()
        self._room.hold(
            lambda: len(self._queue) >= self.max_queue_size,
            self._failing,
            # Looked at again every 50 ms: an attempt failing inside the exporter notifies nobody.
            lambda seconds: self._idle.wait(min(seconds, 0.05)),
        )

    def _failing(self) -> bool:
        """The exporter is failing: backing off after a failed export, or (gymtrace's OTLP/gRPC
        exporter) retrying an attempt that failed inside the export under way (lock held)."""
        return bool(self._backoff) or self._shutdown or getattr(self.exporter, "attempt_failed", False)

    def send_soon(self) -> None:
        """Send what is queued now, without waiting for it (live markers: ``_scopes.live``); not
        while backing off from a failed export, which the next try is timed for."""
        if not self._backoff:
            self._wake.set()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Wait until everything queued now was handed to the exporter; False on timeout."""
        deadline = time.monotonic() + timeout_millis / 1000
        with self._lock:
            self._backoff = 0.0  # a flush is a reason to try again now
            self._wake.set()
            return wait_until_idle(
                self._idle, lambda: bool(self._queue or self._exporting), deadline, nudge=self._wake.set
            )

    def shutdown(self, timeout_millis: int | None = None, *, report: bool = True) -> None:
        """Flush within the shutdown timeout (GYMTRACE_FLUSH_TIMEOUT), then stop; what is left is
        counted as dropped and reported in one log line (by the caller when ``report`` is False)."""
        if self._shutdown:
            return
        if timeout_millis is None:
            timeout_millis = int(self.shutdown_timeout * 1000)
        flushed = self.force_flush(timeout_millis)
        with self._lock:
            self._shutdown = True
            self._dropped_failed += len(self._queue)
            self._queue.clear()
        self._wake.set()
        if self._thread is not None:
            # Bounded: a worker stuck in an export to a dead endpoint must not hold up the exit.
            self._thread.join(timeout=1.0)
        with self._lock:
            # A batch the worker still holds will never be delivered now. The worker's own
            # accounting (_settle) skips a batch abandoned here, so it is counted exactly once.
            if self._exporting:
                self._dropped_failed += self._exporting
                self._exporting = 0
                self._abandoned = True
            self._dropped_failed += len(self._queue)
            self._queue.clear()
        try:
            self.exporter.shutdown()
        except Exception:
            logger.warning("gymtrace: exporter %s failed to shut down", self.name, exc_info=True)
        if report:
            log_totals(self.stats(), flushed)

    # -- reading ---------------------------------------------------------------------------------

    def stats(self) -> ExportStats:
        with self._lock:
            return ExportStats(
                exporter=self.name,
                finished=self._finished,
                exported=self._exported,
                queued=len(self._queue) + self._exporting,
                dropped_queue_full=self._dropped_full,
                dropped_export_failed=self._dropped_failed,
                retries=self._retries,
            )

    # -- worker ----------------------------------------------------------------------------------

    def _start_worker(self) -> None:
        self._thread = threading.Thread(target=self._work, name=f"gymtrace-export-{self.name}", daemon=True)
        self._thread.start()

    def _after_fork(self) -> None:
        # The child must not export what the parent queued (the parent does that); it starts empty
        # with its own worker thread and its own counts.
        self._lock = threading.RLock()
        self._idle = threading.Condition(self._lock)
        self._wake = threading.Event()
        self._queue.clear()
        self._tries = {}
        self._exporting = 0
        self._abandoned = False
        self._room.delivered()
        self._finished = self._exported = self._dropped_full = self._dropped_failed = self._retries = 0
        self._pid = os.getpid()
        # The exporter's own lock, when it has one (the file exporter's), may be held by the
        # parent's worker mid-export: a child that waited on it would lose its spans at exit.
        after_fork = getattr(self.exporter, "after_fork_in_child", None)
        if callable(after_fork):
            after_fork()
        if not self._shutdown:
            self._start_worker()

    def _take_batch(self) -> list[Any]:
        with self._lock:
            queue = self._queue
            count = min(self.max_drain, len(queue))
            if count == len(queue):
                # Everything: swap the deque (constant time under the lock the application's
                # threads wait on) rather than pop thousands of spans one by one.
                self._queue = collections.deque()
                batch = list(queue)
            else:
                batch = [queue.popleft() for _ in range(count)]
            self._exporting = count
            if count:
                self._idle.notify_all()  # the queue has room: callers held by RoomWait go on
            return batch

    def _work(self) -> None:
        observer = self._observer
        while True:
            self._wake.wait(self._backoff or self.schedule_delay)
            self._wake.clear()
            if self._shutdown:
                return
            while True:
                if observer is not None:
                    self._observe(observer)
                batch = self._take_batch()
                if not batch:
                    break
                rest = self._export(batch)
                with self._lock:
                    self._settle(batch, rest)
                    self._idle.notify_all()
                if rest:
                    break  # wait out the backoff before the next try
            with self._lock:
                self._idle.notify_all()

    def _observe(self, observer: Callable[[], None]) -> None:
        try:
            observer()
        except Exception:
            logger.warning("gymtrace: exporter %s: internal error", self.name, exc_info=True)

    def _export(self, batch: list[Any]) -> list[Any]:
        """Export one batch; the spans not delivered (empty when all were).

        An exporter with ``export_partial`` (gymtrace's OTLP exporters, which may send a drained
        backlog as several requests) says which spans a failed request left undelivered, so a
        retry never sends the others twice; any other exporter's failure is the whole batch's.
        """
        try:
            partial = getattr(self.exporter, "export_partial", None)
            if partial is not None:
                return list(partial(batch))
            result = self.exporter.export(batch)
            return [] if getattr(result, "name", str(result)) == "SUCCESS" else batch
        except Exception:
            logger.warning(
                "gymtrace: exporter %s raised; the batch will be retried", self.name, exc_info=True
            )
            return batch

    def _settle(self, batch: list[Any], rest: list[Any]) -> None:
        """Count the outcome of one export: ``rest`` are the spans not delivered (lock held)."""
        if self._abandoned:
            return  # shutdown already counted this batch as dropped
        self._exporting = 0
        delivered = len(batch) - len(rest)
        self._exported += delivered
        if self._tries and delivered:
            undelivered = {id(span) for span in rest}
            for span in batch:
                if id(span) not in undelivered:
                    self._tries.pop(id(span), None)
        if not rest:
            self._backoff = 0.0
            self._room.delivered()
            return
        self._backoff = min(_BACKOFF_MAX, max(_BACKOFF_START, self._backoff * 2))
        if self._shutdown:
            # Nobody will take it from the queue again (requeued here after shutdown counted the
            # queue, the spans would vanish from every count).
            self._dropped_failed += len(rest)
            for span in rest:
                self._tries.pop(id(span), None)
        else:
            self._requeue(rest)

    def _requeue(self, batch: list[Any]) -> None:
        """Put a failed batch back at the old end of the queue, within the bound (lock held)."""
        self._retries += 1
        retry = []
        for span in batch:
            tries = self._tries.get(id(span), 0) + 1
            if tries >= _MAX_TRIES:
                self._tries.pop(id(span), None)
                self._dropped_failed += 1
            else:
                self._tries[id(span)] = tries
                retry.append(span)
        room = self.max_queue_size - len(self._queue)
        keep = retry[len(retry) - room :] if room < len(retry) else retry
        for span in retry[: len(retry) - len(keep)]:
            self._tries.pop(id(span), None)
        self._dropped_full += len(retry) - len(keep)
        self._queue.extendleft(reversed(keep))
