"""``GYMTRACE_ENCODER=auto`` (the default): the thread queue, until spans come too fast for it.

The export starts on the thread queue (``_sdk/export.py``), whose worker watches the span rate
before each batch it takes; once :data:`UPGRADE_SPANS` spans ended within :data:`UPGRADE_WINDOW`
seconds, it starts an encoder process (``_sdk/export_process.py``) from a thread of its own, and
spans end into its pipe from then on. The thread queue delivers what it already holds and stays, so
nothing is lost or sent twice; the file exporter's whole ``O_APPEND`` writes keep the two writers of
one file from splitting each other's lines.

It never moves where a second process would compete with the application for a single CPU, where
there are no POSIX pipes, or once the encoder process could not start (a warning, then the thread
queue for good). What each costs: docs/performance.md, the encoder process.
"""

from __future__ import annotations

import _thread
import functools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from gymtrace._model import forks as _forks
from gymtrace._sdk.export import BatchExporter, ExportStats, log_totals, remaining_millis
from gymtrace._sdk.export_process import ProcessExporter, build_exporter, pipes_available

logger = logging.getLogger("gymtrace")

# ~5,000 spans a second, sustained for 0.4 s: a fast loop, not a burst at the end of an evaluation.
# At that rate the thread queue costs the application ~6 % of a CPU, and the encoder process pays
# for its start-up (~0.3 s of its own CPU) within seconds.
UPGRADE_SPANS = 2048
UPGRADE_WINDOW = 0.4
_CGROUP_CPU_MAX = "/sys/fs/cgroup/cpu.max"


# Every AutoExporter alive: a child forked while one moved (its lock held by the worker, which
# the child does not have) gets a fresh lock. One fork hook serves them all (see _export._LIVE).
_LIVE: weakref.WeakSet[AutoExporter] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for exporter in list(_LIVE):
        exporter._lock = threading.Lock()
        exporter._starting = False  # a start under way in the parent is the parent's


_forks.in_child(_after_fork_in_child)


def _cpus() -> int:
    """CPUs this process may use: its affinity, bounded by a cgroup v2 quota (a container given one
    CPU of a large machine)."""
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS has no affinity call
        count = os.cpu_count() or 1
    try:
        with open(_CGROUP_CPU_MAX, encoding="ascii") as limits:
            quota, period = limits.read().split()[:2]
        if quota != "max":
            count = min(count, max(1, -(-int(quota) // int(period))))  # rounded up
    except (OSError, ValueError):
        pass  # no cgroup v2 limit readable: the affinity says it
    return count


class AutoExporter:
    """A span processor (as :class:`BatchExporter` is): a thread queue for ``exporter`` that moves
    to a :class:`ProcessExporter` for ``target`` when the span rate calls for it. ``rebind`` is
    called after the move, so that whoever bound :attr:`on_end` binds it again."""

    def __init__(
        self, exporter: Any, target: dict[str, Any], queue: dict[str, Any], rebind: Callable[[], None]
    ) -> None:
        self.name = queue["name"]
        self.max_queue_size = queue["max_queue_size"]
        self.shutdown_timeout = queue["shutdown_timeout"]
        self.schedule_delay = queue["schedule_delay"]
        self._target = target
        self._queue = queue
        self._rebind = rebind
        self._lock = threading.Lock()
        self._process: ProcessExporter | None = None
        self._starting = False  # an encoder process is being started, off the worker
        self._closed = False
        self._eligible = pipes_available() and _cpus() >= 2
        self._mark = (0, time.monotonic())  # (spans finished, when) at the start of the window
        self._thread = BatchExporter(exporter, observer=self._observe, **queue)
        # An instance attribute, so that the stage binds the queue's own on_end: no call in between.
        self.on_end = self._thread.on_end
        _LIVE.add(self)

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        return None

    def _on_ending(self, span: Any) -> None:
        return None

    # The thread queue's settings and exporter (this process's), as a BatchExporter shows them.
    @property
    def exporter(self) -> Any:
        return self._thread.exporter

    @property
    def max_batch_size(self) -> int:
        return self._thread.max_batch_size

    @property
    def max_drain(self) -> int:
        return self._thread.max_drain

    @property
    def encoder(self) -> str:
        """Where spans ending now are encoded: ``"thread"`` or ``"process"``."""
        return "thread" if self._process is None else "process"

    def _observe(self) -> None:
        """On the thread queue's worker, before each batch it takes: move if the window filled fast."""
        if self._process is not None or not self._eligible or self._starting:
            return
        finished = self._thread.stats().finished
        now = time.monotonic()
        count, since = self._mark
        elapsed = now - since
        if finished - count >= UPGRADE_SPANS and elapsed <= UPGRADE_WINDOW:
            with self._lock:
                if self._starting or self._closed:
                    return
                self._starting = True
            # Not on this worker: starting the encoder process (a fork and exec, two threads) took
            # 0.4 s on Python 3.10 against a busy application thread, and the queue this worker
            # drains filled meanwhile (CI: 20,946 of 30,002 spans dropped). The low-level call,
            # because threading.Thread.start() waits until the new thread runs, which took as long.
            _thread.start_new_thread(self._upgrade_apart, ((finished - count) / max(elapsed, 1e-3),))
        elif finished - count >= UPGRADE_SPANS or elapsed > UPGRADE_WINDOW or finished < count:
            self._mark = (finished, now)  # a new window (finished < count: a forked child's fresh counts)

    def _upgrade_apart(self, rate: float) -> None:
        try:
            self._upgrade(rate)
        except Exception:  # never out of a thread of ours: the thread queue stays
            self._eligible = False
            logger.warning(
                "gymtrace: exporter %s: the encoder process could not start", self.name, exc_info=True
            )
        finally:
            self._starting = False

    def _upgrade(self, rate: float) -> None:
        with self._lock:
            if self._closed or self._process is not None:
                return
            process = ProcessExporter(
                self._target,
                self._queue,
                # Should the encoder process die later: a second thread queue with its own exporter.
                fallback=functools.partial(_thread_queue, self._target, self._queue),
            )
            if not process.started:
                self._eligible = False
                process.shutdown(0, report=False)
                return
            self._process = process
            self.on_end = process.on_end
        self._rebind()
        logger.info(
            "gymtrace: exporter %s: %.0f spans/s, encoding moved to an encoder process"
            " (GYMTRACE_ENCODER=thread keeps it in this process)",
            self.name,
            rate,
        )

    def send_soon(self) -> None:
        self._thread.send_soon()
        process = self._process
        if process is not None:
            process.send_soon()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        deadline = time.monotonic() + timeout_millis / 1000
        flushed = self._thread.force_flush(timeout_millis)
        process = self._process
        if process is not None:
            flushed = process.force_flush(remaining_millis(deadline)) and flushed
        return flushed

    def shutdown(self, timeout_millis: int | None = None, *, report: bool = True) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            process = self._process
        if timeout_millis is None:
            timeout_millis = int(self.shutdown_timeout * 1000)
        deadline = time.monotonic() + timeout_millis / 1000
        if process is not None:
            process.shutdown(timeout_millis, report=False)
        self._thread.shutdown(remaining_millis(deadline), report=False)
        if report:
            log_totals(self.stats())

    def stats(self) -> ExportStats:
        stats = self._thread.stats()
        process = self._process
        if process is None:
            return stats
        other = process.stats()
        return ExportStats(
            exporter=self.name,
            finished=stats.finished + other.finished,
            exported=stats.exported + other.exported,
            queued=stats.queued + other.queued,
            dropped_queue_full=stats.dropped_queue_full + other.dropped_queue_full,
            dropped_export_failed=stats.dropped_export_failed + other.dropped_export_failed,
            retries=stats.retries + other.retries,
        )


def _thread_queue(target: dict[str, Any], queue: dict[str, Any]) -> BatchExporter:
    return BatchExporter(build_exporter(target), **queue)
