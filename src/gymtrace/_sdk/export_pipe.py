"""The application's side of the pipe to the encoder process: starting it, writing frames without
blocking, reading its reports, and what happens when it dies or the process forks.

A base class of ``ProcessExporter`` (``export_process``), which holds the span processor's
interface (handing spans over, flush, shutdown, counts); this holds the child's supervision.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import marshal
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gymtrace._model import environment as env
from gymtrace._otel_private.records import _Rebuilder
from gymtrace._sdk.export import BatchExporter, RoomWait
from gymtrace._sdk.export_child import _HEADER, _SPANS, _STAT_FIELDS, _frame, _read_frame

logger = logging.getLogger("gymtrace")

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
# A forked child's copies of its parent's encoder pipes, closed and kept (see _after_fork).
_INHERITED: list[subprocess.Popen[bytes]] = []


def pipes_available() -> bool:
    """Whether this platform has the non-blocking pipes the encoder process is fed through."""
    return fcntl is not None


class EncoderPipe:
    """Supervision of the encoder process, for ``ProcessExporter`` (its state: ``_reset_state``)."""

    if TYPE_CHECKING:  # what ProcessExporter sets in _reset_state, and its methods used here
        name: str
        max_queue_size: int
        schedule_delay: float
        _config: dict[str, Any]
        _fallback_factory: Callable[[], BatchExporter]
        _lock: threading.RLock
        _replied: threading.Condition
        _wake: threading.Event
        _pending: collections.deque[tuple[Any, ...]]
        _ready: bool
        _resources: dict[int, Any]
        _scopes: dict[int, Any]
        _sent_resources: set[int]
        _sent_scopes: set[int]
        _outbox: collections.deque[tuple[int, bytes]]
        _outbox_spans: int
        _head_written: int
        _handed: int
        _written: int
        _gone: bool
        _room: RoomWait
        _dropped_full: int
        _dropped_failed: int
        _child: dict[str, int]
        _replies: dict[int, bool]
        _proc: subprocess.Popen[bytes] | None
        _reporting: subprocess.Popen[bytes] | None
        _heard: bool
        _reader: threading.Thread | None
        _write_fd: int
        _fallback: BatchExporter | None
        _shutdown: bool

        def _reset_state(self) -> None: ...
        def _take_pending(self) -> list[tuple[Any, ...]]: ...

    def _start(self) -> bool:
        """Start the encoder process (lock held); False (and the fallback in place) if it cannot."""
        if fcntl is None:
            logger.warning("gymtrace: GYMTRACE_ENCODER=process needs POSIX pipes; exporting in this process")
            self._use_fallback()
            return False
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", "from gymtrace._sdk.export_child import child_main; child_main()"],
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
        if self._outbox_spans > bound and len(self._outbox) > 1:
            self._wait_for_pipe(bound)
        # Bounded like the thread queue: past the wait, the oldest whole frames go.
        while self._outbox_spans > bound and len(self._outbox) > 1:
            index = 1 if self._head_written else 0  # a frame partly in the pipe must be finished
            spans, _ = self._outbox[index]
            del self._outbox[index]
            self._outbox_spans -= spans
            self._dropped_full += spans

    def _wait_for_pipe(self, bound: int) -> None:
        """The frames are past their bound: hold the caller while the pipe takes them (lock held,
        released while waiting), by the thread queue's rule (:class:`RoomWait`).

        The encoder process reads its pipe whenever its own queue has room, and that queue holds
        the reader only while its exporter delivers (it drops, counted, while the exporter fails),
        so a burst faster than the encoder process runs at its pace and arrives whole. A pipe that
        took nothing for the whole wait (the encoder process stopped or hung) is a stall: whole
        frames go, counted, until it takes one again (``_write_outbox``).
        """

        def over() -> bool:
            return self._outbox_spans > bound and len(self._outbox) > 1

        def gone() -> bool:
            return self._proc is None or self._shutdown

        def wait(seconds: float) -> None:
            self._write_while(over, time.monotonic() + min(seconds, 0.05))

        self._room.hold(over, gone, wait)

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
                self._room.delivered()  # the encoder process reads again: a full pipe waits again

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
