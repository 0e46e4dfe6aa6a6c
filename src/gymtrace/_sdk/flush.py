"""Draining and stopping what ``configure()`` started: ``force_flush()``, the exit flush,
``shutdown()``, and the counts ``export_stats()`` reports.

Every exit path (``atexit``, SIGTERM, a ``multiprocessing`` child's finalizer, installed by
``_sdk.lifecycle``) ends in :func:`flush_at_exit`, bounded by the ``GYMTRACE_FLUSH_TIMEOUT`` each queue
was built with; what is still queued then is counted and said in one line.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from gymtrace._model import errors as _errors
from gymtrace._model import settings as _settings
from gymtrace._scopes import consumed as _consumed
from gymtrace._scopes import live as _live
from gymtrace._scopes import tracing as _tracing
from gymtrace._scopes.tracing import current_provider
from gymtrace._sdk.children import forget_exported_settings
from gymtrace._sdk.state import _state

logger = logging.getLogger("gymtrace")


def force_flush(timeout_millis: int = 30000) -> bool:
    """Export every finished span now. True when all exporters finished within the timeout.

    Flushes the provider gymtrace's spans go to: inside ``gymtrace.testing.capture_spans()`` its
    private one, else the global one. The ``gym.*`` counters gathered so far are handed to the
    global MeterProvider first (and exported, when it is the one ``configure()`` set).
    """
    with _errors.guard("gymtrace.force_flush(): the gym.consumed records"):
        _consumed.drain(timeout_millis / 1000)
    with _errors.guard("gymtrace.force_flush(): the gym.* metrics"):
        _live.flush_metrics()
        if _state.meter_provider is not None:
            _state.meter_provider.force_flush(timeout_millis)
    provider = current_provider()
    flush = getattr(provider, "force_flush", None)
    return bool(flush(timeout_millis)) if flush is not None else True


def send_soon() -> None:
    """Tell every export queue of the configuration to send what it holds now (not waiting for
    it): the live thread calls this after writing markers, which must outlive a killed process."""
    stage = _state.stage
    if stage is not None:
        for processor in stage.processors():
            nudge = getattr(processor, "send_soon", None)
            if callable(nudge):
                nudge()


_live.send_markers = send_soon


def _backends() -> Any:
    """The MLflow and Phoenix exporters' module if a processor was built with one (``_processors``
    imports it only then), else None: a process that exports elsewhere never imports it."""
    return sys.modules.get("gymtrace._sdk.backends")


def _flush_scores(processor: Any, timeout: float) -> bool:
    backends = _backends()
    return True if backends is None else bool(backends.flush_scores(processor, timeout))


def flush_at_exit() -> None:
    # Each queue flushes within the GYMTRACE_FLUSH_TIMEOUT it was built with (read once, in
    # _processors); an exit is no time to parse the environment again.
    with _errors.guard("the exit flush of the gym.consumed records", may_raise=False):
        _consumed.drain(_settings.active.flush_timeout)
    stage = _state.stage
    if stage is not None:
        late = []
        for processor in stage.processors():
            if not processor.force_flush(int(processor.shutdown_timeout * 1000)) or not _flush_scores(
                processor, processor.shutdown_timeout
            ):
                late.append(
                    f"{getattr(processor, 'name', type(processor).__name__)} ({processor.shutdown_timeout:g} s)"
                )
        if late:
            # One line for the whole exit: what was still queued is lost with this process.
            logger.warning(
                "gymtrace: the exit flush did not finish within GYMTRACE_FLUSH_TIMEOUT: %s; spans still"
                " queued there are lost",
                ", ".join(late),
            )
    with _errors.guard("the exit flush of the gym.* metrics", may_raise=False):
        _live.flush_metrics()
        if _state.meter_provider is not None:
            _state.meter_provider.force_flush(int(_settings.active.flush_timeout * 1000))


def in_multiprocessing_child() -> None:
    stage = _state.stage
    if stage is not None:
        stage.flush_each_rollout(False)  # the multiprocessing exit hook flushes instead


def export_stats() -> list[Any]:
    """Per exporter: spans finished, exported, queued and dropped (with why) since configure().

    Every span that will never be delivered is counted here and logged at shutdown; nothing is
    dropped silently.
    """
    stage = _state.stage
    if stage is None:
        return []
    stats = [p.stats() for p in stage.processors()]
    # A backend's scores (GYMTRACE_BACKEND=mlflow|phoenix) are counted beside its spans.
    backends = _backends()
    if backends is None:
        return stats
    return stats + [s for s in map(backends.score_stats, stage.processors()) if s is not None]


def shutdown() -> None:
    """Flush and stop gymtrace's exporters. A later ``configure()`` starts new ones.

    The global TracerProvider stays (OpenTelemetry allows setting it once per process); until the
    next ``configure()`` its spans are not exported.
    """
    with _errors.guard("gymtrace.shutdown(): the gym.consumed records", may_raise=False):
        _consumed.drain(_settings.active.flush_timeout)
    with _state.lock:
        if _state.stage is not None:
            _state.stage.shutdown()
        _state.configuration = None
        _state.key = None
        _state.inherited = False
        _tracing.flush_after_continuation = None
        forget_exported_settings()
