"""The export stage: the one span processor of the provider gymtrace creates that exports, and
what the provider calls for every span.

The SDK cannot remove a span processor from a provider, and the global provider can be set only
once per process, so a later ``configure()`` replaces what this stage delegates to instead. Its
per-span calls (``on_start``, ``_on_ending``, ``on_end``) are bound once per configuration, as
instance attributes: gymtrace's own queues are skipped at start and ending, and a single queue's
``on_end`` is called with no loop of the stage's in between. In a bare ``os.fork()`` child it
exports each rollout as it ends (:meth:`ExportStage.flush_each_rollout`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from gymtrace import _constants as c
from gymtrace._otel_private.provider import ending_hook
from gymtrace._sdk.export import BatchExporter
from gymtrace._sdk.export_auto import AutoExporter
from gymtrace._sdk.export_process import ProcessExporter

logger = logging.getLogger("gymtrace")

# gymtrace's own export queues: they do nothing when a span starts or is ending.
_QUEUES = (AutoExporter, BatchExporter, ProcessExporter)


class ExportStage:
    """The exporting processors of the provider gymtrace set, replaceable by a later configure().

    The SDK cannot remove a span processor from a provider, and the global provider can be set only
    once per process, so reconfiguring swaps what this stage delegates to.
    """

    def __init__(self) -> None:
        self._processors: tuple[Any, ...] = ()
        self._lock = threading.Lock()
        # In a child of a bare os.fork(): each rollout's spans are exported before its end returns
        # (see flush_each_rollout). Never in the process that called configure(): its binding,
        # and so its per-span and per-rollout cost, is the same whether this exists or not.
        self._flush_rollouts = False
        self._bind()

    def replace(self, processors: Sequence[Any]) -> None:
        with self._lock:
            old, self._processors = self._processors, tuple(processors)
            self._bind()
        for processor in old:
            processor.shutdown()

    def _bind(self) -> None:
        # Called for every span, so bound once per configuration: gymtrace's queues do nothing at
        # start or ending (skipped), and a single queue's on_end is called without this stage's
        # loop in between. Instance attributes, so the provider's lookup finds them first.
        processors = self._processors
        starts = tuple(p.on_start for p in processors if not isinstance(p, _QUEUES))
        endings = tuple(e for p in processors if not isinstance(p, _QUEUES) and (e := ending_hook(p)))
        ends = tuple(p.on_end for p in processors)
        self.on_start = self._fan_start(starts) if starts else _ignore_start
        self._on_ending = self._fan(endings) if endings else _ignore
        on_end = ends[0] if len(ends) == 1 else self._fan(ends)
        self.on_end = self._flushing(on_end) if self._flush_rollouts and ends else on_end

    def flush_each_rollout(self, on: bool) -> None:
        """In a child of a bare ``os.fork()``, which usually ends with ``os._exit()`` and so runs no
        exit hook: every rollout (and every span with no parent in this process) is exported
        before its end returns, bounded by the flush timeout. A ``multiprocessing`` child turns
        this off again: its exit hook flushes (_lifecycle)."""
        with self._lock:
            self._flush_rollouts = on
            self._bind()

    def _flushing(self, on_end: Callable[[Any], None]) -> Callable[[Any], None]:
        def end(span: Any) -> None:
            on_end(span)
            parent = span.parent
            if span.name == c.SPAN_ROLLOUT or parent is None or parent.is_remote:
                self._flush_forked_child()

        return end

    def _flush_forked_child(self) -> None:
        late = [p for p in self._processors if not p.force_flush(int(p.shutdown_timeout * 1000))]
        if late:
            # An exporter that cannot keep up (a Collector away) must not hold up every rollout:
            # said once, then this child's spans wait for its exit, as anywhere else.
            logger.warning(
                "gymtrace: a forked child's flush at the end of a rollout did not finish within"
                " GYMTRACE_FLUSH_TIMEOUT (%s); its spans are no longer flushed per rollout, so"
                " call gymtrace.force_flush() before os._exit()",
                ", ".join(str(getattr(p, "name", type(p).__name__)) for p in late),
            )
            self.flush_each_rollout(False)

    @staticmethod
    def _fan(calls: tuple[Callable[[Any], None], ...]) -> Callable[[Any], None]:
        def fan(span: Any) -> None:
            for call in calls:
                call(span)

        return fan

    @staticmethod
    def _fan_start(calls: tuple[Callable[..., None], ...]) -> Callable[..., None]:
        def fan(span: Any, parent_context: Any = None) -> None:
            for call in calls:
                call(span, parent_context=parent_context)

        return fan

    def rebind(self) -> None:
        """Bind again: a processor's ``on_end`` changed (an AutoExporter moved to its process)."""
        with self._lock:
            self._bind()

    def processors(self) -> tuple[Any, ...]:
        return self._processors

    def shutdown(self) -> None:
        self.replace(())

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return all(p.force_flush(timeout_millis) for p in self._processors)


def _ignore(span: Any) -> None:
    return None


def _ignore_start(span: Any, parent_context: Any = None) -> None:
    return None
