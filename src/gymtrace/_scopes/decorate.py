"""A Scope as a decorator: one wrapper per kind of callable, chosen once at decoration time.

Functions, coroutine functions, generator functions and async generator functions each get a wrapper
of the same kind (so ``inspect`` still tells them apart for frameworks that check), which starts the
scope's span around each call and, while nothing records, calls the function directly. Apart from the
Scope object because these are the four call protocols, each with its own way of keeping the context
attached only while the body runs.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from gymtrace._scopes import live as _live
from gymtrace._scopes.blocks import ScopeLike
from gymtrace._scopes.levels import LEVELS
from gymtrace._scopes.tracing import active_tracer, attach, current_context, detach

F = TypeVar("F", bound=Callable[..., Any])


def decorate(scope: ScopeLike, func: F) -> F:
    """Wrap ``func`` once, choosing the wrapper for its kind at decoration time."""
    if isinstance(func, (staticmethod, classmethod)):
        return type(func)(decorate(scope, func.__func__))
    if not callable(func):
        raise TypeError(f"gymtrace.{scope.kind} decorates callables, got {type(func).__name__}")
    named = LEVELS[scope.kind].named_after_function
    if named is not None:
        # A decorated tool is named after its function unless told otherwise.
        scope = scope.with_default(named, getattr(func, "__name__", None))
    if scope._deadline is not None and inspect.iscoroutinefunction(func):
        # The timer inside the span: a body cancelled by it ends the span failed, kind `timeout`.
        wrapper: Callable[..., Any] = _coroutine_wrapper(scope, _timed(func, scope._deadline))
    elif inspect.isasyncgenfunction(func):
        wrapper = _async_generator_wrapper(scope, func)
    elif inspect.isgeneratorfunction(func):
        wrapper = _generator_wrapper(scope, func)
    elif inspect.iscoroutinefunction(func):
        wrapper = _coroutine_wrapper(scope, func)
    else:
        wrapper = _function_wrapper(scope, func)
    return functools.update_wrapper(wrapper, func)  # type: ignore[return-value]


def _timed(func: Callable[..., Any], seconds: float) -> Callable[..., Any]:
    @functools.wraps(func)
    async def timed(*args: Any, **kwargs: Any) -> Any:
        async with _live.deadline(seconds):
            return await func(*args, **kwargs)

    return timed


def _function_wrapper(scope: ScopeLike, func: Callable[..., Any]) -> Callable[..., Any]:
    start, finish = scope.start, scope.finish

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        tracer = active_tracer()
        if tracer is None:
            return func(*args, **kwargs)
        frame = start(tracer, args, kwargs, func)
        if frame is None:
            return func(*args, **kwargs)
        token = attach(frame.context)  # type: ignore[arg-type]
        try:
            result = func(*args, **kwargs)
        except BaseException as exc:
            detach(token)
            finish(frame, exc)
            raise
        detach(token)
        finish(frame, None, result)
        return result

    return wrapper


def _coroutine_wrapper(scope: ScopeLike, func: Callable[..., Any]) -> Callable[..., Any]:
    start, finish = scope.start, scope.finish

    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        tracer = active_tracer()
        if tracer is None:
            return await func(*args, **kwargs)
        frame = start(tracer, args, kwargs, func)
        if frame is None:
            return await func(*args, **kwargs)
        token = attach(frame.context)  # type: ignore[arg-type]
        try:
            result = await func(*args, **kwargs)
        except BaseException as exc:
            detach(token)
            finish(frame, exc)
            raise
        detach(token)
        finish(frame, None, result)
        return result

    return wrapper


def _generator_wrapper(scope: ScopeLike, func: Callable[..., Any]) -> Callable[..., Any]:
    # The wrapper is itself a generator function, so inspect.isgeneratorfunction() still holds for
    # frameworks that check it (pytest fixtures, FastAPI dependencies). The span starts at the
    # first next(), when the body starts.
    start, finish = scope.start, scope.finish
    get_current = current_context

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        gen = func(*args, **kwargs)
        tracer = active_tracer()
        frame = start(tracer, args, kwargs, func) if tracer is not None else None
        if frame is None:
            return (yield from gen)
        # The context the body runs in. Attached only while the body runs and detached before
        # every yield, so nothing leaks into the consumer; refreshed at each suspension so a
        # `with` block that spans a yield inside the body resumes inside that block.
        body_context = frame.context
        error: BaseException | None = None
        try:
            to_send: Any = None
            to_throw: BaseException | None = None
            while True:
                token = attach(body_context)  # type: ignore[arg-type]
                try:
                    if to_throw is not None:
                        thrown, to_throw = to_throw, None
                        item = gen.throw(thrown)
                    else:
                        item = gen.send(to_send)
                except StopIteration as stop:
                    return stop.value
                finally:
                    body_context = get_current()
                    detach(token)
                try:
                    to_send = yield item
                except GeneratorExit:
                    token = attach(body_context)
                    try:
                        gen.close()
                    finally:
                        detach(token)
                    raise
                except BaseException as thrown_in:  # noqa: BLE001 - forwarded into the body, like `yield from`
                    to_throw = thrown_in
        except BaseException as exc:
            error = exc
            raise
        finally:
            finish(frame, error)

    return wrapper


def _async_generator_wrapper(scope: ScopeLike, func: Callable[..., Any]) -> Callable[..., Any]:
    # Drives the body with asend/athrow in the consumer's own task: never a task per step, which
    # would put the body outside the consumer's asyncio.timeout(). Async generators cannot
    # `yield from`, so the untraced path runs the same loop without touching the context.
    start, finish = scope.start, scope.finish
    get_current = current_context

    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        agen = func(*args, **kwargs)
        tracer = active_tracer()
        frame = start(tracer, args, kwargs, func) if tracer is not None else None
        body_context = frame.context if frame is not None else None
        token: object = None
        error: BaseException | None = None
        try:
            to_send: Any = None
            to_throw: BaseException | None = None
            while True:
                if body_context is not None:
                    token = attach(body_context)
                try:
                    if to_throw is not None:
                        thrown, to_throw = to_throw, None
                        item = await agen.athrow(thrown)
                    else:
                        item = await agen.asend(to_send)
                except StopAsyncIteration:
                    return
                finally:
                    if body_context is not None:
                        body_context = get_current()
                        detach(token)
                try:
                    to_send = yield item
                except GeneratorExit:
                    if body_context is not None:
                        token = attach(body_context)
                    try:
                        await agen.aclose()
                    finally:
                        if body_context is not None:
                            detach(token)
                    raise
                except BaseException as thrown_in:  # noqa: BLE001 - forwarded into the body, like `yield from`
                    to_throw = thrown_in
        except BaseException as exc:
            error = exc
            raise
        finally:
            if frame is not None:
                finish(frame, error)

    return wrapper
