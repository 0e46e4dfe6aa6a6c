"""Thread and process pools that carry the trace and the gym identity into every task.

Example::

    from concurrent.futures import ProcessPoolExecutor
    from gymtrace.integrations.concurrent import submit, map

    with gymtrace.rollout(rollout_id="r-1"), gymtrace.episode():
        with ProcessPoolExecutor(initializer=gymtrace.configure) as pool:
            future = submit(pool, score, answer)       # runs in the rollout, in the worker
            results = list(map(pool, score, answers))

The same functions are importable from :mod:`gymtrace.propagation`. Standard library only.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future
from typing import Any, Generic, ParamSpec, TypeVar

from opentelemetry import context as otel_context

import gymtrace
from gymtrace.propagation import extract, inject

__all__ = ["ContextCarrier", "carry", "map", "submit"]

_logger = logging.getLogger("gymtrace")

_P = ParamSpec("_P")
_R = TypeVar("_R")


class ContextCarrier(Generic[_P, _R]):
    """``fn`` bound to the trace context and gym identity of the moment it was wrapped.

    In a thread of the same process the worker runs in exactly that context (the gym scopes keep
    counting turns and steps). Pickled into another process (``ProcessPoolExecutor``,
    ``multiprocessing``) it travels as a small carrier of W3C headers and continues the trace from
    it; there the worker must have tracing configured (e.g. ``initializer=gymtrace.configure``),
    and the finished spans are flushed after each call because pool workers exit without running
    exit handlers.
    """

    __slots__ = ("_context", "_headers", "_pid", "fn")

    def __init__(self, fn: Callable[_P, _R], context: otel_context.Context | None = None) -> None:
        self.fn = fn
        self._context: otel_context.Context | None = (
            context if context is not None else otel_context.get_current()
        )
        self._headers: dict[str, str] | None = None
        self._pid = os.getpid()

    def __getstate__(self) -> dict[str, Any]:
        headers = self._headers
        if headers is None and self._context is not None:
            headers = dict(inject({}, self._context))
        return {"fn": self.fn, "headers": headers or {}, "pid": self._pid}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.fn = state["fn"]
        self._headers = state["headers"]
        self._pid = state["pid"]
        self._context = None

    def __call__(self, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        ctx = self._context if self._context is not None else extract(self._headers or {})
        token = otel_context.attach(ctx)
        try:
            return self.fn(*args, **kwargs)
        finally:
            otel_context.detach(token)
            if self._context is None and os.getpid() != self._pid:
                _flush()

    def __repr__(self) -> str:
        return f"<gymtrace.integrations.concurrent.ContextCarrier {self.fn!r}>"


def _flush() -> None:
    # Runs in a `finally`, maybe while the task's own exception propagates: never replace it.
    try:
        gymtrace.force_flush()
    except Exception:
        _logger.warning("gymtrace: flushing the spans of a pool worker failed", exc_info=True)


def carry(fn: Callable[_P, _R], context: otel_context.Context | None = None) -> ContextCarrier[_P, _R]:
    """Bind ``fn`` to the current trace context and gym identity for a thread or process worker.

    ``pool.submit(carry(fn), *args)``; picklable when ``fn`` is.
    """
    return ContextCarrier(fn, context)


def submit(executor: Executor, fn: Callable[_P, _R], /, *args: _P.args, **kwargs: _P.kwargs) -> Future[_R]:
    """``executor.submit(fn, ...)`` with the caller's trace and gym identity carried into the worker.

    Works with ``ThreadPoolExecutor`` and ``ProcessPoolExecutor``.
    """
    return executor.submit(ContextCarrier(fn), *args, **kwargs)


def map(executor: Executor, fn: Callable[..., _R], *iterables: Iterable[Any], **kwargs: Any) -> Iterator[_R]:
    """``executor.map(fn, ...)`` with the caller's trace and gym identity carried into every call."""
    return executor.map(ContextCarrier(fn), *iterables, **kwargs)
