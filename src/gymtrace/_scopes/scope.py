"""The scope engine: one object that is a context manager and a decorator, for every gym level.

A :class:`Scope` is a level (see ``_scopes.levels.LEVELS``) with its arguments. Each activation (a ``with``
block or one call of a decorated function) creates an :class:`~gymtrace._scopes.active_scope.ActiveScope` holding
the span, the identity and the level's state, and puts it in the OpenTelemetry context. The engine
knows nothing of any particular level: it validates arguments, asks the level to prepare the span,
starts it, attaches it, and at the end hands the outcome to the level and ends the span, exactly like
``opentelemetry.trace.use_span``.

Its other parts are modules of their own: the ``with``/``async with`` machinery
(``_scopes/blocks.py``, bound as its methods), the decorator wrappers chosen once per kind of callable
(``_scopes/decorate.py``), and the table of open spans with the engine's misuse reports
(``_scopes/open_scopes.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from time import time_ns
from typing import Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from gymtrace import _constants as c
from gymtrace._model.errors import GymTraceError, contain, contract_problem, guard
from gymtrace._model.failures import qualified_name, record_error
from gymtrace._scopes import blocks as _blocks
from gymtrace._scopes import live as _live
from gymtrace._scopes import steps as _steps
from gymtrace._scopes.active_scope import SCOPE_KEY, ActiveScope
from gymtrace._scopes.decorate import decorate as decorate
from gymtrace._scopes.levels import LEVELS, allowed
from gymtrace._scopes.open_scopes import ENDING, OPEN, STARTING, report_violation
from gymtrace._scopes.open_scopes import end_open_scopes as end_open_scopes
from gymtrace._scopes.open_scopes import forget_open_scopes as forget_open_scopes
from gymtrace._scopes.tracing import SPAN_CONTEXT_KEY, active_tracer, current_context

F = TypeVar("F", bound=Callable[..., Any])

# Cancellation and interruption end a span without an error status (like use_span).
CANCELLATION = (asyncio.CancelledError, KeyboardInterrupt, SystemExit)


def _rebuilt_scope(
    kind: str, arguments: dict[str, Any], span_kind: Any, reward_from: Any, source: Any
) -> Scope:
    """A pickled :class:`Scope`, unpickled: the same level and arguments, no activation."""
    return Scope(kind, arguments, span_kind=span_kind, reward_from=reward_from, source=source)


class Scope:
    """A gym level with its arguments. Use it as ``with``/``async with`` or as a decorator."""

    __slots__ = (
        "_arguments",
        "_deadline",
        "_dynamic",
        "_level",
        "_reward_from",
        "_source",
        "_span_kind",
        "_static",
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
        # Where an activation comes from: (relation, earlier activation or carrier), as a retried
        # or restored episode's.
        self._source = source
        self._static: dict[str, Any] | None = None
        # The level's deadline argument (an episode's timeout=, validated by its public function):
        # an async body is cancelled after it, whether or not anything records; the timers of open
        # `async with` blocks, per task.
        level = LEVELS.get(kind)
        deadline = level.deadline if level is not None else None
        timeout = arguments.get(deadline) if deadline is not None else None
        self._deadline: float | None = None
        self._timers: dict[object, list[_live.deadline]] | None = None
        if isinstance(timeout, (int, float)):
            self._deadline, self._timers = float(timeout), {}
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
            # Only gymtrace stores under SCOPE_KEY (a key with a random suffix), and only frames:
            # no isinstance check (with the one in __exit__, ~560 of ~70,000 instructions a span).
            parent: ActiveScope | None = parent_context.get(SCOPE_KEY)  # type: ignore[assignment]
            static = self._static if self._static is not None else self._resolve()
            level = self._level
            # Most scopes have no identity callables; skip the call for them.
            values = self._values(args, kwargs or {}) if self._dynamic else static
            kept = None
            if _steps.aggregating and level.sample is not None and parent is not None:
                # A step policy that aggregates: the level decides whether this activation gets a
                # span; one that does not runs in its parent's context, timed and counted.
                unsampled, values, kept = level.sample(self, parent, values, parent_context)
                if unsampled is not None:
                    return unsampled
            frame = ActiveScope(self.kind, parent, self, level)
            name, attributes, links, start_context = level.prepare(
                frame, values, parent_context, self._source
            )
            # A scope of another process did not send its level: anything may open below it.
            if parent is not None and not parent.remote and not allowed(parent.kind, self.kind):
                attributes[c.HIERARCHY_VIOLATION] = f"{self.kind} inside {parent.kind}"
                report_violation(self.kind, parent.kind, site)
            span = tracer.start_span(
                name,
                context=start_context,
                kind=self._span_kind or level.span_kind,
                attributes=attributes,
                links=links,
            )
            frame.span = span
            OPEN[id(frame)] = frame
            if kept is not None:
                frame.step_timing = (kept[0], kept[1], time_ns(), True)
            if SPAN_CONTEXT_KEY is not None:
                # Same context as the two calls below, with one copy of the parent instead of four.
                frame.context = otel_context.Context(
                    parent_context, **{SPAN_CONTEXT_KEY: span, SCOPE_KEY: frame}
                )
            else:
                frame.context = otel_context.set_value(
                    SCOPE_KEY, frame, trace.set_span_in_context(span, parent_context)
                )
            return frame
        except Exception as error:  # noqa: BLE001 - gymtrace's own failure: errors.contain decides
            contain(STARTING[self.kind], error)
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
                contain(ENDING[self.kind], error, may_raise=exc is None)
            return
        if OPEN.pop(id(frame), None) is None:
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
            counter = frame.counter
            if counter is not None and counter.stats is not None:
                _steps.write_owner(frame)
            # Last, so the exception's description wins over the level's own failure status.
            if isinstance(exc, Exception) and span.is_recording():
                record_error(span, exc)
        except Exception as error:  # noqa: BLE001 - gymtrace's own failure: errors.contain decides
            contain(ENDING[self.kind], error, may_raise=exc is None)
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

    # -- context manager (_scopes/blocks.py) ---------------------------------------------------

    __enter__ = _blocks.enter
    __exit__ = _blocks.exit_block
    __aenter__ = _blocks.aenter
    __aexit__ = _blocks.aexit

    # -- decorator ------------------------------------------------------------------------------

    def __call__(self, func: F) -> F:
        return decorate(self, func)

    def __repr__(self) -> str:
        return f"<gymtrace.{self.kind} scope>"
