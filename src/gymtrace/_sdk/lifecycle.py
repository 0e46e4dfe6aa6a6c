"""Process endings: finished spans are exported, open spans are ended as interrupted.

Installed by ``configure()`` when gymtrace owns the provider; flushes bounded by ``GYMTRACE_FLUSH_TIMEOUT``:

- exit, ``sys.exit``, an unhandled exception, SIGINT: an ``atexit`` hook ends the open scopes with
  ``gym.interrupted=true``, then the SDK's exit hook flushes;
- SIGTERM (which skips ``atexit``): with no handler of the application's, end the open scopes, flush
  and die of SIGTERM; with one set before ``configure()``, flush what finished and run it: it decides;
- a ``multiprocessing`` child leaving through ``os._exit``: a ``multiprocessing.util.Finalize``
  (registered after fork, or by the child's own ``configure()``) ends its scopes and flushes.

Nothing of the standard library is replaced; a bare ``os._exit`` outside ``multiprocessing`` loses
only a rollout still open (``_sdk.stage.ExportStage.flush_each_rollout``).
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import multiprocessing.util
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from gymtrace._model import forks as _forks
from gymtrace._scopes.scope import end_open_scopes, forget_open_scopes

logger = logging.getLogger("gymtrace")

_installed = False
_flush: Callable[[], None] = lambda: None  # noqa: E731 - replaced by install()
_in_child: Callable[[], None] = lambda: None  # noqa: E731 - replaced by install()
_previous_sigterm: Any = signal.SIG_DFL
# Handed to multiprocessing.util.register_after_fork, which keeps a weak reference to its object.
_after_fork_owner = type("_AfterForkOwner", (), {})()
# The order in which multiprocessing's exit function runs finalizers, highest first: gymtrace's goes
# last, after the application's own finalizers, which may still end spans.
_EXIT_PRIORITY = -100


def install(flush: Callable[[], None], in_multiprocessing_child: Callable[[], None]) -> None:
    """Install the hooks once per process; ``flush`` exports what is queued, bounded in time;
    ``in_multiprocessing_child`` runs first in a ``multiprocessing`` child forked after this."""
    global _installed, _flush, _in_child, _previous_sigterm
    _flush = flush
    _in_child = in_multiprocessing_child
    if _installed:
        return
    _installed = True
    atexit.register(_at_exit)
    # Resets gymtrace's own state only (the scopes open at the fork are the parent's).
    _forks.in_child(forget_open_scopes)
    # Runs in a multiprocessing child after Process._bootstrap cleared the finalizers it inherited.
    multiprocessing.util.register_after_fork(_after_fork_owner, _in_multiprocessing_child)
    if multiprocessing.parent_process() is not None:
        # A multiprocessing child that configured gymtrace itself (a forkserver worker, or one
        # forked from a parent that did not configure it): its normal exit is os._exit.
        _flush_at_multiprocessing_exit()
    # SIGTERM (what cluster schedulers send) skips atexit, so without a handler every finished span
    # still queued is lost. The handler chains: one the application installed before configure()
    # runs after the flush and decides what SIGTERM means; without one, gymtrace does the default
    # (dies of SIGTERM) after flushing; one installed later simply replaces gymtrace's.
    if threading.current_thread() is threading.main_thread():
        previous = signal.getsignal(signal.SIGTERM)
        if previous is not signal.SIG_IGN and previous is not _on_sigterm:
            _previous_sigterm = previous
            signal.signal(signal.SIGTERM, _on_sigterm)
    else:
        logger.info("gymtrace: configure() ran outside the main thread; no SIGTERM handler installed")


def _end_and_flush(reason: str) -> None:
    try:
        ended = end_open_scopes(reason)
        if ended:
            logger.warning("gymtrace: %s: ended %d open span(s) as interrupted", reason, ended)
        _flush()
    except Exception:
        logger.warning("gymtrace: failed to flush at %s", reason, exc_info=True)


def _at_exit() -> None:
    # The SDK's exit hook (registered earlier, so it runs after this one) flushes the queue.
    try:
        ended = end_open_scopes("exit")
        if ended:
            logger.warning("gymtrace: exit: ended %d open span(s) as interrupted", ended)
    except Exception:
        logger.warning("gymtrace: failed to end open spans at exit", exc_info=True)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    previous = _previous_sigterm
    if callable(previous):
        # The application decides what SIGTERM means (a stop flag, a graceful drain, sys.exit):
        # deliver what has finished, leave open spans to end as the application unwinds (or at
        # exit, as interrupted), then run its handler.
        try:
            _flush()
        except Exception:  # never stand between a signal and its handler
            logger.warning("gymtrace: failed to flush at SIGTERM", exc_info=True)
        previous(signum, frame)
        return
    _end_and_flush("SIGTERM")
    # The default action: terminate by the same signal, so the exit status tells the scheduler.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _in_multiprocessing_child(_: object) -> None:
    _in_child()
    _flush_at_multiprocessing_exit()


def _flush_at_multiprocessing_exit() -> None:
    # Process._bootstrap calls multiprocessing.util._exit_function, which runs this, before the
    # os._exit that ends every fork and forkserver child (CPython 3.10 to 3.13 alike).
    multiprocessing.util.Finalize(
        None, _end_and_flush, args=("multiprocessing child exit",), exitpriority=_EXIT_PRIORITY
    )
