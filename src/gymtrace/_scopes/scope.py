"""The scope engine: one object that is a context manager and a decorator, for every gym level.

A :class:`Scope` is a level (see ``_levels.LEVELS``) with its arguments. Each activation (a ``with``
block or one call of a decorated function) creates an :class:`~gymtrace._scopes.frame.ActiveScope` holding
the span, the identity and the level's state, and puts it in the OpenTelemetry context. The engine
knows nothing of any particular level: it validates arguments, asks the level to prepare the span,
starts it, attaches it, and at the end hands the outcome to the level and ends the span, exactly like
``opentelemetry.trace.use_span``.

Wrappers are chosen once, at decoration time, by the kind of callable (function, coroutine function,
generator function, async generator function), and the disabled path (no tracer) calls the function
directly.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import sys
from collections.abc import Awaitable, Callable, Mapping
from threading import get_ident
from time import time_ns
from types import TracebackType
from typing import Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from gymtrace import _constants as c
from gymtrace._live import markers as _live
from gymtrace._model.errors import GymTraceError, HierarchyViolationError, contain, contract_problem, guard
from gymtrace._model.failures import qualified_name, record_error
from gymtrace._scopes import steps as _steps
from gymtrace._scopes.frame import DISABLED_FRAME, FRAME_KEY, ActiveScope
from gymtrace._scopes.levels import LEVELS, NUMBERING_OWNERS, allowed
from gymtrace._scopes.tracing import SPAN_CONTEXT_KEY, active_tracer, attach, current_context, detach, reset

F = TypeVar("F", bound=Callable[..., Any])

# Cancellation and interruption end a span without an error status (like use_span).
CANCELLATION = (asyncio.CancelledError, KeyboardInterrupt, SystemExit)

# A `with` block finds its own activation at exit in the OpenTelemetry context it attached: the
# current frame (FRAME_KEY) is its own in the normal, nested case, which costs one lookup instead of
# a with-stack kept beside the context (a context variable set per block made `with` ~10 % dearer
# than the decorator). One case needs more: a block entered while nothing records, nested in a
# recording block of the same shared Scope (`with step():` inside `with step():`, tracing switched
# off in between), attaches nothing, so the frame current at its exit is the outer block's. Such a
# block is pushed here, (scope, the frame it shadows, the entries below), so that its exit cannot
# end that frame. Empty (None) in every context unless tracing changes while blocks are open.
_SHADOWS: contextvars.ContextVar[tuple[Any, ActiveScope, Any] | None] = contextvars.ContextVar(
    "gymtrace.shadowed_with_blocks", default=None
)
# Set the first time any context shadows a frame; until then an exit need not read _SHADOWS.
_shadowed = False


def _finished(value: Any) -> asyncio.Future[Any]:
    """A future that already holds ``value``: awaiting it returns the value without suspending, in
    any event loop (or none), which is all the disabled ``async with`` needs. Its loop is closed at
    once: a finished future never schedules anything on it."""
    loop = asyncio.new_event_loop()
    try:
        future: asyncio.Future[Any] = loop.create_future()
        future.set_result(value)
        return future
    finally:
        loop.close()


_ENTERED_DISABLED: asyncio.Future[ActiveScope] = _finished(DISABLED_FRAME)
_EXITED: asyncio.Future[None] = _finished(None)

# Every activation whose span has started and not ended, so that a process being stopped can end
# them as interrupted instead of losing them (see _lifecycle). Insertion order: outermost first.
_OPEN: dict[int, ActiveScope] = {}
# The heartbeat thread tells from this table which spans of a rollout ended since its last beat.
_live.open_scopes = _OPEN

# Where gymtrace failed, per level, made once: these paths run for every span and catch their own
# failures (errors.contain) rather than enter a guard.
_STARTING = {kind: f"starting gymtrace.{kind}" for kind in LEVELS}
_ENDING = {kind: f"ending gymtrace.{kind}" for kind in LEVELS}


def forget_open_scopes() -> None:
    """In a forked child: the open scopes are the parent's, which ends and exports them."""
    _OPEN.clear()


def end_open_scopes(reason: str) -> int:
    """End every open gym span, innermost first, marked ``gym.interrupted``. Returns how many."""
    ended = 0
    for frame in reversed(list(_OPEN.values())):
        if _OPEN.pop(id(frame), None) is None:
            continue  # its own code ended it meanwhile
        try:
            # The process is ending: a failure here must not stop the others from ending.
            with guard(f"ending open spans at {reason}", may_raise=False):
                frame.cancelled = True
                frame.span.set_attribute(c.INTERRUPTED, True)
                finish = frame.level.finish if frame.level is not None else None
                if finish is not None:
                    finish(frame)
                if frame.step_stats is not None:
                    _steps.write_owner(frame)
        finally:
            frame.ended = True
            frame.span.end()
            ended += 1
    return ended


def _rebuilt_scope(
    kind: str, arguments: dict[str, Any], span_kind: Any, reward_from: Any, source: Any
) -> Scope:
    """A pickled :class:`Scope`, unpickled: the same level and arguments, no activation."""
    return Scope(kind, arguments, span_kind=span_kind, reward_from=reward_from, source=source)


class Scope:
    """A gym level with its arguments. Use it as ``with``/``async with`` or as a decorator."""

    __slots__ = (
        "_arguments",
        "_dynamic",
        "_level",
        "_reward_from",
        "_source",
        "_span_kind",
        "_static",
        "_timeout",
        "_timers",
        "kind",
    )

    def __init__(
        self,
        kind: str,
        arguments: Mapping[str, Any],
        *,
        span_kind: SpanKind | None = None,
        reward_from: str | Callable[[Any], Any] | None = None,
        source: tuple[str, Any] | None = None,
    ) -> None:
        self.kind = kind
        self._arguments = arguments
        self._span_kind = span_kind
        self._reward_from = reward_from
        # For episodes: (relation, previous episode or carrier); relation is retry or restore.
        self._source = source
        self._static: dict[str, Any] | None = None
        # An episode's timeout= (validated by gymtrace.episode()): an async body is cancelled after
        # it, whether or not anything records; the timers of open `async with` blocks, per task.
        timeout = arguments.get("timeout") if kind == c.KIND_EPISODE else None
        self._timeout: float | None = None
        self._timers: dict[object, list[_live.deadline]] | None = None
        if isinstance(timeout, (int, float)):
            self._timeout, self._timers = float(timeout), {}
        # Free when off: while nothing records, the arguments are kept as given and
        # checked at the first activation that records; building a scope cost ~0.9 µs a `with`.
        if active_tracer() is not None:
            self._resolve()

    def __reduce__(self) -> tuple[Any, ...]:
        """A scope pickles as what it describes (its level and arguments): unpickled elsewhere it
        opens activations of its own, as a decorator does in a pool worker. An open activation is
        never carried by it: continue that with its carrier (``ActiveScope.carrier()``), which
        pickling an ``ActiveScope`` (as a ``continue_from=`` source, say) says."""
        return _rebuilt_scope, (
            self.kind,
            dict(self._arguments),
            self._span_kind,
            self._reward_from,
            self._source,
        )

    def _resolve(self) -> dict[str, Any]:
        """The level, the span kind, the static values (validated) and the identity callables."""
        static = self._static
        if static is not None:
            return static
        level = self._level = LEVELS[self.kind]
        if self._span_kind is None:
            self._span_kind = level.span_kind
        given: dict[str, Any] = {}
        dynamic: list[tuple[str, Callable[..., Any]]] = []
        for name, value in self._arguments.items():
            if name in level.arguments and callable(value):
                dynamic.append((name, value))
            elif value is not None:
                given[name] = value
        self._dynamic = tuple(dynamic)
        static = self._static = level.validate(given)
        return static

    def with_default(self, name: str, value: Any) -> Scope:
        """This scope with argument ``name`` set to ``value`` unless it was given (statically or as
        a callable)."""
        if self._arguments.get(name) is not None or value is None:
            return self
        return Scope(
            self.kind,
            {**self._arguments, name: value},
            span_kind=self._span_kind,
            reward_from=self._reward_from,
            source=self._source,
        )

    # -- activation ------------------------------------------------------------------------------

    def _values(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        values = dict(self._resolve())
        resolved: dict[str, Any] = {}
        for name, fn in self._dynamic:
            # A failing identity callable must not break the call it describes.
            with guard(f"gymtrace.{self.kind}({name}=<callable>)"):
                resolved[name] = fn(*args, **kwargs)
        values.update(self._level.validate(resolved))
        return values

    def start(
        self,
        tracer: trace.Tracer,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        site: object = None,
    ) -> ActiveScope | None:
        """Start the span and build its context. ``None`` if gymtrace itself failed."""
        try:
            parent_context = current_context()
            # Only gymtrace stores under FRAME_KEY (a key with a random suffix), and only frames:
            # no isinstance check (with the one in __exit__, ~560 of ~70,000 instructions a span).
            parent: ActiveScope | None = parent_context.get(FRAME_KEY)  # type: ignore[assignment]
            static = self._static if self._static is not None else self._resolve()
            level = self._level
            # Most scopes have no identity callables; skip the call for them.
            values = self._values(args, kwargs or {}) if self._dynamic else static
            kept = None
            if _steps.aggregating and self.kind == c.KIND_STEP and parent is not None:
                owner = parent.nearest(*NUMBERING_OWNERS)
                if owner is not None:
                    # The aggregate step policy: a step that is not sampled gets no span, only
                    # its timing, and runs in its parent's context.
                    stats = owner.step_stats or _steps.stats_for(owner)
                    number = owner.take_number(c.KIND_STEP, values.get("number"))
                    if not stats.wants_span():
                        frame = ActiveScope(self.kind, parent, self, None)
                        frame.context = parent_context
                        frame.step_timing = (stats, number, time_ns(), False)
                        return frame
                    values = {**values, "number": number}
                    kept = (stats, number)
            frame = ActiveScope(self.kind, parent, self, level)
            name, attributes, links, start_context = level.prepare(
                frame, values, parent_context, self._source
            )
            # A scope of another process did not send its level: anything may open below it.
            if parent is not None and not parent.remote and not allowed(parent.kind, self.kind):
                attributes[c.HIERARCHY_VIOLATION] = f"{self.kind} inside {parent.kind}"
                _report_violation(self.kind, parent.kind, site)
            span = tracer.start_span(
                name,
                context=start_context,
                kind=self._span_kind or level.span_kind,
                attributes=attributes,
                links=links,
            )
            frame.span = span
            _OPEN[id(frame)] = frame
            if kept is not None:
                frame.step_timing = (kept[0], kept[1], time_ns(), True)
                if not kept[0].everything:
                    span.set_attribute(c.STEP_KEPT, c.STEP_KEPT_FIRST)
            if SPAN_CONTEXT_KEY is not None:
                # Same context as the two calls below, with one copy of the parent instead of four.
                frame.context = otel_context.Context(
                    parent_context, **{SPAN_CONTEXT_KEY: span, FRAME_KEY: frame}
                )
            else:
                frame.context = otel_context.set_value(
                    FRAME_KEY, frame, trace.set_span_in_context(span, parent_context)
                )
            return frame
        except Exception as error:  # noqa: BLE001 - gymtrace's own failure: errors.contain decides
            contain(_STARTING[self.kind], error)
            return None

    def finish(self, frame: ActiveScope, exc: BaseException | None, result: Any = None) -> None:
        """The level's outcome, then the span's end, like ``opentelemetry.trace.use_span``: an
        ``Exception`` is recorded with an ERROR status; cancellation, ``KeyboardInterrupt`` and
        ``GeneratorExit`` (a consumer's early ``break``) are not errors. The span always ends."""
        timing = frame.step_timing
        if timing is not None and frame.level is None:
            # A step the aggregate policy did not sample: counted, and a span after all if it raised.
            try:
                _steps.end_unsampled(frame, timing, exc)
            except Exception as error:  # noqa: BLE001 - gymtrace's own failure: errors.contain decides
                contain(_ENDING[self.kind], error, may_raise=exc is None)
            return
        if _OPEN.pop(id(frame), None) is None:
            return  # already ended as interrupted when the process was stopped
        span = frame.span
        level = self._level
        try:
            if exc is None:
                if self._reward_from is not None:
                    self._take_reward(frame, result)
            elif isinstance(exc, Exception):
                if level.failed is not None:
                    level.failed(frame, exc)
            elif isinstance(exc, CANCELLATION):
                frame.cancelled = True
                if not isinstance(exc, asyncio.CancelledError):  # KeyboardInterrupt, SystemExit
                    span.set_attribute(c.INTERRUPTED, True)
            elif isinstance(exc, GeneratorExit):
                # A generator closed before its end: an early `break`, or dropped and collected.
                # Not an error (dd-trace-py#8714), but the span must say its work did not finish.
                span.set_attribute(c.INTERRUPTED, True)
            if level.finish is not None:
                level.finish(frame)
            if timing is not None:
                timing[0].record(timing[1], timing[2], time_ns(), True, isinstance(exc, Exception))
            if frame.step_stats is not None:
                _steps.write_owner(frame)
            # Last, so the exception's description wins over the level's own failure status.
            if isinstance(exc, Exception) and span.is_recording():
                record_error(span, exc)
        except Exception as error:  # noqa: BLE001 - gymtrace's own failure: errors.contain decides
            contain(_ENDING[self.kind], error, may_raise=exc is None)
        finally:
            frame.ended = True
            # The frame's context holds the frame: dropped here, the two are freed by reference
            # counting instead of waiting, with every span's objects, for the cyclic collector.
            frame.context = None
            span.end()

    def _take_reward(self, frame: ActiveScope, result: Any) -> None:
        """``verify(reward_from=...)``: the reward from the decorated function's return value."""
        source = self._reward_from
        try:
            if callable(source):
                value = source(result)
            elif isinstance(result, Mapping):
                value = result.get(source)
            else:
                value = getattr(result, str(source), None)
        except Exception as exc:  # noqa: BLE001 - the user's callable failed: their error, reported as such
            if frame.span.is_recording():
                record_error(frame.span, exc)
            contract_problem(
                ("reward_from", self.kind, type(exc)),
                GymTraceError(
                    f"gymtrace.{self.kind}(reward_from=...) raised {qualified_name(type(exc))}: {exc!s:.200};"
                    " no reward was recorded"
                ),
            )
            return
        if value is not None:
            frame.record_reward(value)

    # -- context manager ------------------------------------------------------------------------

    def __enter__(self) -> ActiveScope:
        tracer = active_tracer()
        if tracer is None:
            if _OPEN:  # something records somewhere: this block may need to shadow it
                self._shadow()
            return DISABLED_FRAME
        frame = self.start(tracer)
        if frame is None:  # gymtrace itself failed; the block runs untraced
            self._shadow()
            return DISABLED_FRAME
        if frame.level is None:
            # A step the aggregate policy does not sample runs in its parent's context: no attach.
            parent = frame.parent
            assert parent is not None
            parent.unsampled = (frame, parent.unsampled)
        else:
            frame.token = attach(frame.context)  # type: ignore[arg-type]
            frame.thread = get_ident()
        return frame

    def _shadow(self) -> None:
        """Entered without recording: shadow the current frame if it is this Scope's own."""
        frame = current_context().get(FRAME_KEY)
        if isinstance(frame, ActiveScope) and frame.owner is self and frame.token is not None:
            global _shadowed
            _shadowed = True
            _SHADOWS.set((self, frame, _SHADOWS.get()))

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not _OPEN and not _steps.aggregating:
            return  # nothing records anywhere (no span, no unsampled step): this block entered nothing
        # An ActiveScope or None, as in start().
        frame: ActiveScope | None = current_context().get(FRAME_KEY)  # type: ignore[assignment]
        if frame is not None:
            token = frame.token
            if frame.owner is self and token is not None and frame.unsampled is None and not _shadowed:
                # Blocks exited in order, in the context they entered: the current frame is this
                # block's own (the general search below answers the same, a few lookups later).
                frame.token = None
                try:
                    reset(token)  # detach() without its frame: this runs on every `with` exit
                except Exception:  # noqa: BLE001 - a token detach() must report (it logs, never raises)
                    detach(token)
                self.finish(frame, exc)
                return
            pending = frame.unsampled
            if pending is not None and pending[0].owner is self:
                frame.unsampled = pending[1]
                self.finish(pending[0], exc)
                return
            # Normally the current frame itself. If not, a block exited before one it encloses: its
            # context is reset to the one it entered from (the enclosed blocks, exited later, end
            # without detaching).
            candidate: ActiveScope | None = frame
            while candidate is not None:
                token = candidate.token
                if candidate.owner is self and token is not None:
                    shadows = _SHADOWS.get()
                    if shadows is not None and shadows[1] is candidate:
                        # This block entered nothing; the frame is an outer block's.
                        _SHADOWS.set(shadows[2])
                        return
                    candidate.token = None
                    detach(token)
                    self.finish(candidate, exc)
                    return
                candidate = candidate.parent
        self._exit_elsewhere(exc)

    def _exit_elsewhere(self, exc: BaseException | None) -> None:
        """``__exit__`` in another context than ``__enter__`` (an ``ExitStack`` handed across asyncio
        tasks or threads): the entering context's token cannot be detached here, but the span is
        still ended, and nothing is raised into user code."""
        mine = [f for f in reversed(list(_OPEN.values())) if f.owner is self and f.token is not None]
        # One object entered by several threads (a shared bare `gymtrace.episode()`): this thread's
        # own activation, or the only one; never guess among other threads' (issue 25).
        here = [f for f in mine if f.thread == get_ident()]
        frame = here[0] if here else mine[0] if len(mine) == 1 else None
        if frame is None:
            if mine:
                contract_problem(
                    ("exit elsewhere, ambiguous", self.kind),
                    GymTraceError(
                        f"gymtrace.{self.kind}() was exited in a thread that did not enter it while"
                        f" {len(mine)} threads have it open (one scope object shared by several"
                        " threads); no span was ended here: each ends when its own thread exits it,"
                        " else as interrupted at exit. Fix: create the scope inside each thread"
                    ),
                )
            return  # tracing was off when it was entered, or the span already ended
        contract_problem(
            ("exit elsewhere", self.kind),
            GymTraceError(
                f"gymtrace.{self.kind}() was exited in another context than the one it was entered in"
                " (an ExitStack or a context manager handed to another task or thread), or after a"
                " block that encloses it; its span is ended, but the context it entered may keep it"
                " as current"
            ),
        )
        frame.token = None
        self.finish(frame, exc)

    # Plain methods returning awaitables, not coroutines: with nothing recording, a coroutine pair
    # alone costs what the whole disabled `async with` may (benchmarks/perf.py, forms), so the
    # disabled path hands back futures that finished at import, which `await` reads at once.
    def __aenter__(self) -> Awaitable[ActiveScope]:
        if self._timeout is not None:
            return self._timed_aenter(self._timeout)
        if active_tracer() is None and not _OPEN:
            return _ENTERED_DISABLED
        return self._aenter()

    def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Awaitable[None]:
        if self._timeout is not None:
            return self._timed_aexit(exc_type, exc, tb)
        if not _OPEN and not _steps.aggregating:
            return _EXITED
        return self._aexit(exc_type, exc, tb)

    async def _timed_aenter(self, seconds: float) -> ActiveScope:
        """``async with gymtrace.episode(timeout=S)``: the body is cancelled after S seconds."""
        timer = _live.deadline(seconds)
        await timer.__aenter__()
        try:
            entered = self.__enter__()
        except BaseException as refused:
            # A refused enter (strict mode: a hierarchy violation) has no body and no __aexit__ to
            # disarm the timer: left armed, it would cancel whatever this task awaits next (issue 31).
            await timer.__aexit__(type(refused), refused, refused.__traceback__)
            raise
        assert self._timers is not None  # made with the timeout
        self._timers.setdefault(asyncio.current_task(), []).append(timer)
        return entered

    async def _timed_aexit(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        task = asyncio.current_task()
        assert self._timers is not None  # made with the timeout
        timers = self._timers.get(task)
        timer = timers.pop() if timers else None
        if not timers:
            self._timers.pop(task, None)
        if timer is not None:
            try:
                await timer.__aexit__(exc_type, exc, tb)
            except TimeoutError as timed_out:
                # The cancellation was the timeout's: the episode failed with kind `timeout`.
                self.__exit__(TimeoutError, timed_out, timed_out.__traceback__)
                raise
        self.__exit__(exc_type, exc, tb)

    async def _aenter(self) -> ActiveScope:
        return self.__enter__()

    async def _aexit(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)

    # -- decorator ------------------------------------------------------------------------------

    def __call__(self, func: F) -> F:
        return decorate(self, func)

    def __repr__(self) -> str:
        return f"<gymtrace.{self.kind} scope>"


def _report_violation(kind: str, parent_kind: str, site: object) -> None:
    if site is None:
        # A `with` block: the site is the user's line that opened it. Walk out of gymtrace's frames.
        frame = sys._getframe(1)
        while frame.f_back is not None and frame.f_globals.get("__name__", "").startswith("gymtrace."):
            frame = frame.f_back
        where = f"{frame.f_code.co_filename}:{frame.f_lineno}"
        key: object = where
    else:
        where = f"{getattr(site, '__module__', '?')}.{getattr(site, '__qualname__', site)}"
        key = site
    contract_problem(
        ("hierarchy", key, kind, parent_kind),
        HierarchyViolationError(
            f"{kind} opened inside {parent_kind} at {where}: gym levels nest run > rollout > episode >"
            " seed_session/verify > agent_invocation > turn > step > model_call/tool_call"
        ),
    )


# -- decoration ---------------------------------------------------------------------------------------


def decorate(scope: Scope, func: F) -> F:
    """Wrap ``func`` once, choosing the wrapper for its kind at decoration time."""
    if isinstance(func, (staticmethod, classmethod)):
        return type(func)(decorate(scope, func.__func__))
    if not callable(func):
        raise TypeError(f"gymtrace.{scope.kind} decorates callables, got {type(func).__name__}")
    if scope.kind == c.KIND_TOOL_CALL:
        # A decorated tool is named after its function unless told otherwise.
        scope = scope.with_default("tool_name", getattr(func, "__name__", None))
    if scope._timeout is not None and inspect.iscoroutinefunction(func):
        # The timer inside the span: a body cancelled by it ends the span failed, kind `timeout`.
        wrapper: Callable[..., Any] = _coroutine_wrapper(scope, _timed(func, scope._timeout))
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


def _function_wrapper(scope: Scope, func: Callable[..., Any]) -> Callable[..., Any]:
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


def _coroutine_wrapper(scope: Scope, func: Callable[..., Any]) -> Callable[..., Any]:
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


def _generator_wrapper(scope: Scope, func: Callable[..., Any]) -> Callable[..., Any]:
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


def _async_generator_wrapper(scope: Scope, func: Callable[..., Any]) -> Callable[..., Any]:
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
