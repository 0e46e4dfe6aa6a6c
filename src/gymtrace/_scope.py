"""The scope object behind every gym level: one object that is a context manager and a decorator.

A :class:`Scope` describes a level (``run``, ``rollout``, ..., ``tool_call``) and its arguments. Each
activation (a ``with`` block or one call of a decorated function) creates an :class:`ActiveScope`:
the span, the gym identity every span below it inherits, and the per-level state (attempt and turn
counters, reward, failure). Both live in the OpenTelemetry context under one private key, so
anything that carries the OpenTelemetry context (``contextvars.copy_context()``, asyncio tasks)
carries the gym identity too.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import math
import os
import sys
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from gymtrace import _constants as c
from gymtrace._environment import GYMTRACE_TRACE_PER
from gymtrace._errors import (
    GymTraceError,
    HierarchyViolationError,
    InvalidArgumentError,
    contract_problem,
    internal_error,
)
from gymtrace._tracing import SPAN_CONTEXT_KEY, active_tracer

F = TypeVar("F", bound=Callable[..., Any])

FRAME_KEY = otel_context.create_key("gymtrace.frame")

# Outermost first. A level may open only below a level of lower rank (levels may be skipped);
# seed_session and verify are phases of an episode and share a rank.
_RANK = {
    c.KIND_RUN: 0,
    c.KIND_ROLLOUT: 1,
    c.KIND_EPISODE: 2,
    c.KIND_SEED_SESSION: 3,
    c.KIND_VERIFY: 3,
    c.KIND_AGENT_INVOCATION: 4,
    c.KIND_TURN: 5,
    c.KIND_STEP: 6,
    c.KIND_MODEL_CALL: 7,
    c.KIND_TOOL_CALL: 7,
}
# Allowed exceptions to the rank order: a tool call can spawn a subagent, call a model (an LLM
# tool) or call another tool (a composite tool).
_ALSO_ALLOWED_UNDER = {
    c.KIND_TOOL_CALL: frozenset({c.KIND_AGENT_INVOCATION, c.KIND_MODEL_CALL, c.KIND_TOOL_CALL}),
}

_CANCELLATION = (asyncio.CancelledError, KeyboardInterrupt, SystemExit)

_trace_per_run = os.environ.get(GYMTRACE_TRACE_PER, "rollout").strip().lower() == "run"


def set_trace_per(value: str) -> None:
    """``"rollout"`` (default): each rollout is its own trace. ``"run"``: one trace per run."""
    global _trace_per_run
    if value not in ("rollout", "run"):
        raise InvalidArgumentError(f"trace_per must be 'rollout' or 'run', got {value!r}")
    _trace_per_run = value == "run"


_counter_lock = threading.Lock()

# The `with` blocks open in this context, innermost last: (scope, activation, context token). One
# context variable for all scopes: a Scope object shared by concurrent tasks or threads gets one
# stack per context, and no per-Scope variable accumulates in long-lived contexts.
_WITH_BLOCKS: contextvars.ContextVar[tuple[tuple[Scope, ActiveScope, object], ...]] = contextvars.ContextVar(
    "gymtrace.with_blocks", default=()
)

# Every activation whose span has started and not ended, so that a process being stopped can end
# them as interrupted instead of losing them (see _lifecycle). Insertion order: outermost first.
_OPEN: dict[int, ActiveScope] = {}


def end_open_scopes(reason: str) -> int:
    """End every open gym span, innermost first, marked ``gym.interrupted``. Returns how many."""
    ended = 0
    for frame in reversed(list(_OPEN.values())):
        if _OPEN.pop(id(frame), None) is None:
            continue  # its own code ended it meanwhile
        try:
            frame.cancelled = True
            frame.span.set_attribute(c.INTERRUPTED, True)
            _FINISH[frame.kind](frame)
            frame.span.end()
            ended += 1
        except Exception as exc:  # noqa: BLE001 - the process is ending; keep ending the others
            internal_error(f"ending open spans at {reason}", exc, may_raise=False)
    return ended


class ActiveScope:
    """One activation of a gym scope: its span, its identity and its outcome state.

    ``with gymtrace.episode() as ep:`` binds ``ep`` to one; decorated functions reach theirs with
    :func:`gymtrace.current_scope`.
    """

    __slots__ = (
        "_episodes",
        "_last_episode",
        "_next_attempt",
        "_next_step",
        "_next_turn",
        "attempt",
        "cancelled",
        "context",
        "failure",
        "identity",
        "kind",
        "parent",
        "parent_span_context",
        "restored",
        "reward",
        "span",
    )

    def __init__(self, kind: str, parent: ActiveScope | None) -> None:
        self.kind = kind
        self.parent = parent
        self.span: trace.Span = trace.INVALID_SPAN
        self.identity: dict[str, str | int] = parent.identity if parent is not None else {}
        self.context: otel_context.Context | None = None
        self._next_turn = 1
        self._next_step = 1
        self._next_attempt = 0
        self._episodes = 0
        self._last_episode: ActiveScope | None = None
        self.attempt: int | None = None
        self.reward: float | None = None
        self.failure: tuple[str, bool, str | None] | None = None
        self.cancelled = False
        self.restored = False
        # An episode continued from a carrier: the rollout span it belongs to (in another process).
        self.parent_span_context: trace.SpanContext | None = None

    # -- reading -------------------------------------------------------------------------------

    @property
    def trace_id(self) -> str:
        return trace.format_trace_id(self.span.get_span_context().trace_id)

    @property
    def span_id(self) -> str:
        return trace.format_span_id(self.span.get_span_context().span_id)

    def nearest(self, *kinds: str) -> ActiveScope | None:
        frame: ActiveScope | None = self
        while frame is not None:
            if frame.kind in kinds:
                return frame
            frame = frame.parent
        return None

    # -- writing -------------------------------------------------------------------------------

    def set_attribute(self, key: str, value: Any) -> None:
        """Set an attribute on this scope's span (never raises)."""
        try:
            self.span.set_attribute(key, value)
        except Exception as exc:  # noqa: BLE001 - telemetry must not break the caller
            internal_error("ActiveScope.set_attribute", exc)

    def record_reward(self, value: float) -> None:
        from gymtrace._record import record_reward

        record_reward(value, scope=self)

    def record_failure(
        self,
        kind: str = c.FAILURE_INFRASTRUCTURE,
        *,
        retryable: bool | None = None,
        exception: BaseException | None = None,
        message: str | None = None,
    ) -> None:
        from gymtrace._record import record_failure

        record_failure(kind, retryable=retryable, exception=exception, message=message, scope=self)

    def carrier(self) -> dict[str, Any]:
        """A small JSON-safe dict from which another process, possibly hours later, opens the next
        attempt of this rollout: ``gymtrace.episode(continue_from=carrier)`` (a retry) or
        ``gymtrace.episode(restored_from=carrier)`` (a checkpoint restore)."""
        from gymtrace._record import make_carrier

        return make_carrier(self)

    def record_usage(
        self,
        *,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        response_model: str | None = None,
        cached_input_tokens: int | None = None,
        response_id: str | None = None,
        finish_reasons: Sequence[str] | None = None,
        time_to_first_token: float | None = None,
    ) -> None:
        from gymtrace._record import record_usage

        record_usage(
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            response_model=response_model,
            cached_input_tokens=cached_input_tokens,
            response_id=response_id,
            finish_reasons=finish_reasons,
            time_to_first_token=time_to_first_token,
            scope=self,
        )

    def record_content(self, input: object = None, output: object = None) -> None:
        """Record prompts/messages or tool arguments/results on this scope; off by default
        (see :func:`gymtrace.record_content`)."""
        from gymtrace._content import record_content

        record_content(input, output, scope=self)

    def _take_number(self, kind: str, explicit: int | None) -> int:
        with _counter_lock:
            if kind == c.KIND_TURN:
                number = self._next_turn if explicit is None else explicit
                self._next_turn = max(self._next_turn, number + 1)
            else:
                number = self._next_step if explicit is None else explicit
                self._next_step = max(self._next_step, number + 1)
        return number

    def __repr__(self) -> str:
        return f"<ActiveScope {self.kind} {self.identity}>"


def current_frame() -> ActiveScope | None:
    value = otel_context.get_current().get(FRAME_KEY)
    return value if isinstance(value, ActiveScope) else None


# -- argument checks ------------------------------------------------------------------------------


def _bad(scope_kind: str, argument: str, problem: str) -> None:
    contract_problem(
        ("argument", scope_kind, argument, problem),
        InvalidArgumentError(f"gymtrace.{scope_kind}(): argument {argument!r} {problem}"),
    )


MAX_ID_LENGTH = 256


def check_id(scope_kind: str, argument: str, value: object) -> str | None:
    """A valid identifier string, or None (after a warning, or an error in strict mode)."""
    if value is None:
        return None
    if not isinstance(value, str):
        _bad(scope_kind, argument, f"must be a string, got {type(value).__name__} {value!r:.80}")
        return None
    if not value:
        _bad(scope_kind, argument, "must not be empty")
        return None
    # IDs travel in baggage and are searched in Jaeger: short, printable, one line. The same bound
    # applies to IDs arriving from other processes (gymtrace.propagation).
    if len(value) > MAX_ID_LENGTH:
        _bad(scope_kind, argument, f"must be at most {MAX_ID_LENGTH} characters, got {len(value)}")
        return None
    if not value.isprintable():
        _bad(scope_kind, argument, f"must be printable text without control characters, got {value[:40]!r}")
        return None
    return value


def check_index(scope_kind: str, argument: str, value: object, minimum: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        _bad(scope_kind, argument, f"must be an int >= {minimum}, got {type(value).__name__} {value!r:.80}")
        return None
    if value < minimum:
        _bad(scope_kind, argument, f"must be >= {minimum}, got {value}")
        return None
    return value


def check_reward(argument: str, value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _bad("record_reward", argument, f"must be a real number, got {type(value).__name__} {value!r:.80}")
        return None
    number = float(value)
    if not math.isfinite(number):
        _bad("record_reward", argument, f"must be finite, got {number}")
        return None
    return number


def episode_id(rollout_id: str, attempt: int) -> str:
    return rollout_id if attempt == 0 else f"{rollout_id}-a{attempt}"


# -- the scope ------------------------------------------------------------------------------------

# Per-kind arguments that may be given as a callable applied to the decorated function's arguments.
_RESOLVABLE = frozenset(
    {
        "run_id",
        "rollout_id",
        "task_id",
        "repeat",
        "attempt",
        "agent_name",
        "invocation_id",
        "number",
        "model",
        "provider",
        "tool_name",
        "call_id",
        "attributes",
    }
)


class Scope:
    """A gym level with its arguments. Use it as ``with``/``async with`` or as a decorator."""

    __slots__ = ("_dynamic", "_reward_from", "_source", "_span_kind", "_static", "kind")

    def __init__(
        self,
        kind: str,
        arguments: Mapping[str, Any],
        *,
        span_kind: SpanKind = SpanKind.INTERNAL,
        reward_from: str | Callable[[Any], Any] | None = None,
        source: tuple[str, Any] | None = None,
    ) -> None:
        self.kind = kind
        static: dict[str, Any] = {}
        dynamic: list[tuple[str, Callable[..., Any]]] = []
        for name, value in arguments.items():
            if name in _RESOLVABLE and callable(value):
                dynamic.append((name, value))
            elif value is not None:
                static[name] = value
        self._static = _validated(kind, static)
        self._dynamic = tuple(dynamic)
        self._reward_from = reward_from
        # For episodes: (relation, previous episode or carrier); relation is retry or restore.
        self._source = source
        self._span_kind = span_kind

    # -- activation ------------------------------------------------------------------------------

    def _values(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        if not self._dynamic:
            return self._static
        values = dict(self._static)
        resolved: dict[str, Any] = {}
        for name, fn in self._dynamic:
            try:
                resolved[name] = fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - a failing identity callable must not break the call
                internal_error(f"gymtrace.{self.kind}({name}=<callable>)", exc)
        values.update(_validated(self.kind, resolved))
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
            parent_context = otel_context.get_current()
            parent = parent_context.get(FRAME_KEY)
            if not isinstance(parent, ActiveScope):
                parent = None
            frame = ActiveScope(self.kind, parent)
            # Most scopes have no identity callables; skip the call for them.
            values = self._values(args, kwargs or {}) if self._dynamic else self._static
            name, attributes, links, start_context = _PREPARE[self.kind](self, frame, values, parent_context)
            if parent is not None and not _allowed(parent.kind, self.kind):
                attributes[c.HIERARCHY_VIOLATION] = f"{self.kind} inside {parent.kind}"
                _report_violation(self.kind, parent.kind, site)
            span = tracer.start_span(
                name, context=start_context, kind=self._span_kind, attributes=attributes, links=links
            )
            frame.span = span
            _OPEN[id(frame)] = frame
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
        except GymTraceError:
            raise
        except Exception as exc:  # noqa: BLE001 - telemetry must not break the caller
            internal_error(f"starting gymtrace.{self.kind}", exc)
            return None

    def finish(self, frame: ActiveScope, exc: BaseException | None, result: Any = None) -> None:
        """End the span like ``opentelemetry.trace.use_span`` does, then the level's outcome."""
        try:
            span = frame.span
            if _OPEN.pop(id(frame), None) is None:
                return  # already ended as interrupted when the process was stopped
            if exc is None:
                if self._reward_from is not None:
                    _reward_from_result(self, frame, result)
            elif isinstance(exc, Exception):
                if frame.kind == c.KIND_EPISODE and frame.failure is None:
                    kind = c.FAILURE_TIMEOUT if isinstance(exc, TimeoutError) else c.FAILURE_ERROR
                    frame.failure = (kind, kind == c.FAILURE_TIMEOUT, None)
            elif isinstance(exc, _CANCELLATION):
                frame.cancelled = True
                if not isinstance(exc, asyncio.CancelledError):  # KeyboardInterrupt, SystemExit
                    span.set_attribute(c.INTERRUPTED, True)
            # GeneratorExit: the consumer stopped early (a `break`), which is not an error.
            finisher = _FINISH[frame.kind]
            if finisher is not _finish_nothing:  # most levels: save the call
                finisher(frame)
            # Last, so the exception's description wins over the level's own failure status.
            if isinstance(exc, Exception) and span.is_recording():
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
                span.set_attribute(c.ERROR_TYPE, _qualified_name(type(exc)))
            span.end()
        except Exception as internal:  # noqa: BLE001 - telemetry must not break the caller
            internal_error(f"ending gymtrace.{self.kind}", internal, may_raise=exc is None)

    # -- context manager ------------------------------------------------------------------------

    def __enter__(self) -> ActiveScope:
        tracer = active_tracer()
        frame = self.start(tracer) if tracer is not None else None
        if frame is None:
            frame = _DISABLED_FRAME
            token: object = None
        else:
            token = otel_context.attach(frame.context)  # type: ignore[arg-type]
        _WITH_BLOCKS.set((*_WITH_BLOCKS.get(), (self, frame, token)))
        return frame

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stack = _WITH_BLOCKS.get()
        # Normally the innermost entry; searched so that a Scope exited out of order still finds
        # its own activation.
        index = next(i for i in range(len(stack) - 1, -1, -1) if stack[i][0] is self)
        _, frame, token = stack[index]
        _WITH_BLOCKS.set(stack[:index] + stack[index + 1 :])
        if token is not None:
            otel_context.detach(token)  # type: ignore[arg-type]
            self.finish(frame, exc)

    async def __aenter__(self) -> ActiveScope:
        return self.__enter__()

    async def __aexit__(
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


# A stand-in handed to `with ... as s` while tracing is off, so user code that calls
# s.record_reward() or reads s.identity keeps working at no cost.
_DISABLED_FRAME = ActiveScope("disabled", None)


def _qualified_name(cls: type) -> str:
    module = cls.__module__
    return cls.__qualname__ if module in ("builtins", "__main__") else f"{module}.{cls.__qualname__}"


def _allowed(parent_kind: str, kind: str) -> bool:
    parent_rank = _RANK.get(parent_kind)
    if parent_rank is None:  # a level in another process: its kind did not travel
        return True
    if _RANK[kind] > parent_rank:
        return True
    return kind in _ALSO_ALLOWED_UNDER.get(parent_kind, ())


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


def _validated(kind: str, values: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in values.items():
        if name in (
            "run_id",
            "rollout_id",
            "task_id",
            "agent_name",
            "invocation_id",
            "model",
            "provider",
            "tool_name",
            "call_id",
        ):
            value = check_id(kind, name, value)
        elif name in ("repeat", "attempt"):
            value = check_index(kind, name, value, 0)
        elif name == "number":
            value = check_index(kind, name, value, 1)
        elif name == "attributes":
            if not isinstance(value, Mapping):
                _bad(kind, name, f"must be a mapping, got {type(value).__name__}")
                value = None
            else:
                value = dict(value)
        if value is not None:
            out[name] = value
    return out


# -- per-kind span preparation ----------------------------------------------------------------------

_Prepared = tuple[str, dict[str, Any], "list[Link] | None", otel_context.Context]


def _base(frame: ActiveScope, values: dict[str, Any]) -> dict[str, Any]:
    attributes = {**frame.identity, c.KIND: frame.kind}
    extra = values.get("attributes")
    if extra:
        for key, value in extra.items():
            attributes.setdefault(key, value)
    return attributes


def _prepare_run(
    scope: Scope, frame: ActiveScope, values: dict[str, Any], ctx: otel_context.Context
) -> _Prepared:
    run_id = values.get("run_id") or f"run-{uuid.uuid4().hex[:12]}"
    frame.identity = {c.RUN_ID: run_id}
    return c.SPAN_RUN, _base(frame, values), None, ctx


def _prepare_rollout(
    scope: Scope, frame: ActiveScope, values: dict[str, Any], ctx: otel_context.Context
) -> _Prepared:
    identity = {k: v for k, v in frame.identity.items() if k == c.RUN_ID}
    identity[c.ROLLOUT_ID] = values.get("rollout_id") or uuid.uuid4().hex
    if "task_id" in values:
        identity[c.TASK_ID] = values["task_id"]
    if "repeat" in values:
        identity[c.ROLLOUT_REPEAT] = values["repeat"]
    frame.identity = identity
    links = None
    start_context = ctx
    run = frame.parent.nearest(c.KIND_RUN) if frame.parent is not None else None
    if run is not None and not _trace_per_run:
        # One trace per rollout: the rollout is a trace root that links to its run. A root span in
        # the run's trace would be invisible until the run ends (hours) and lost on a crash.
        links = [Link(run.span.get_span_context(), {c.LINK_RELATION: c.RELATION_RUN})]
        start_context = trace.set_span_in_context(trace.INVALID_SPAN, ctx)
    return c.SPAN_ROLLOUT, _base(frame, values), links, start_context


def _prepare_episode(
    scope: Scope, frame: ActiveScope, values: dict[str, Any], ctx: otel_context.Context
) -> _Prepared:
    from gymtrace._record import prepare_episode

    return prepare_episode(scope._source, frame, values, ctx)


def _prepare_phase(name: str) -> Callable[..., _Prepared]:
    def prepare(
        scope: Scope, frame: ActiveScope, values: dict[str, Any], ctx: otel_context.Context
    ) -> _Prepared:
        return name, _base(frame, values), None, ctx

    return prepare


def _prepare_genai(
    operation: str, subject_argument: str, subject_attribute: str, id_argument: str, id_attribute: str
) -> Callable[..., _Prepared]:
    """GenAI spans are named "{operation} {subject}" (the agent, model or tool name)."""

    def prepare(
        scope: Scope, frame: ActiveScope, values: dict[str, Any], ctx: otel_context.Context
    ) -> _Prepared:
        attributes = _base(frame, values)
        attributes[c.GEN_AI_OPERATION_NAME] = operation
        subject = values.get(subject_argument)
        if subject is not None:
            attributes[subject_attribute] = subject
        if id_argument in values:
            attributes[id_attribute] = values[id_argument]
        return (f"{operation} {subject}" if subject else operation), attributes, None, ctx

    return prepare


def _prepare_numbered(kind: str, span_name: str, attribute: str) -> Callable[..., _Prepared]:
    def prepare(
        scope: Scope, frame: ActiveScope, values: dict[str, Any], ctx: otel_context.Context
    ) -> _Prepared:
        attributes = _base(frame, values)
        owner = (
            frame.parent.nearest(c.KIND_AGENT_INVOCATION, c.KIND_EPISODE, c.KIND_ROLLOUT, c.KIND_RUN)
            if frame.parent
            else None
        )
        explicit = values.get("number")
        attributes[attribute] = owner._take_number(kind, explicit) if owner is not None else (explicit or 1)
        return span_name, attributes, None, ctx

    return prepare


_PREPARE: dict[str, Callable[..., _Prepared]] = {
    c.KIND_RUN: _prepare_run,
    c.KIND_ROLLOUT: _prepare_rollout,
    c.KIND_EPISODE: _prepare_episode,
    c.KIND_SEED_SESSION: _prepare_phase(c.SPAN_SEED_SESSION),
    c.KIND_VERIFY: _prepare_phase(c.SPAN_VERIFY),
    c.KIND_AGENT_INVOCATION: _prepare_genai(
        c.OPERATION_INVOKE_AGENT, "agent_name", c.GEN_AI_AGENT_NAME, "invocation_id", c.GEN_AI_AGENT_ID
    ),
    c.KIND_TURN: _prepare_numbered(c.KIND_TURN, c.SPAN_TURN, c.TURN_NUMBER),
    c.KIND_STEP: _prepare_numbered(c.KIND_STEP, c.SPAN_STEP, c.STEP_NUMBER),
    # The model call's second argument is the provider, not an ID; same shape all the same.
    c.KIND_MODEL_CALL: _prepare_genai(
        c.OPERATION_CHAT, "model", c.GEN_AI_REQUEST_MODEL, "provider", c.GEN_AI_PROVIDER_NAME
    ),
    c.KIND_TOOL_CALL: _prepare_genai(
        c.OPERATION_EXECUTE_TOOL, "tool_name", c.GEN_AI_TOOL_NAME, "call_id", c.GEN_AI_TOOL_CALL_ID
    ),
}


def _finish_nothing(frame: ActiveScope) -> None:
    return None


def _finish_episode(frame: ActiveScope) -> None:
    from gymtrace._record import finish_episode

    finish_episode(frame)


def _finish_rollout(frame: ActiveScope) -> None:
    from gymtrace._record import finish_rollout

    finish_rollout(frame)


def _finish_verify(frame: ActiveScope) -> None:
    if frame.reward is not None:
        frame.span.set_attribute(c.REWARD, frame.reward)


_FINISH: dict[str, Callable[[ActiveScope], None]] = {kind: _finish_nothing for kind in c.ALL_KINDS}
_FINISH[c.KIND_EPISODE] = _finish_episode
_FINISH[c.KIND_ROLLOUT] = _finish_rollout
_FINISH[c.KIND_VERIFY] = _finish_verify


def _reward_from_result(scope: Scope, frame: ActiveScope, result: Any) -> None:
    from gymtrace._record import record_reward

    source = scope._reward_from
    if callable(source):
        value = source(result)
    elif isinstance(result, Mapping):
        value = result.get(source)
    else:
        value = getattr(result, str(source), None)
    if value is not None:
        record_reward(value, scope=frame)


# -- decoration ---------------------------------------------------------------------------------------


def decorate(scope: Scope, func: F) -> F:
    """Wrap ``func`` once, choosing the wrapper for its kind at decoration time."""
    if isinstance(func, (staticmethod, classmethod)):
        return type(func)(decorate(scope, func.__func__))
    if not callable(func):
        raise TypeError(f"gymtrace.{scope.kind} decorates callables, got {type(func).__name__}")
    if (
        scope.kind == c.KIND_TOOL_CALL
        and "tool_name" not in scope._static
        and not any(name == "tool_name" for name, _ in scope._dynamic)
    ):
        # A decorated tool is named after its function unless told otherwise.
        scope = Scope(
            scope.kind,
            {**scope._static, **dict(scope._dynamic), "tool_name": getattr(func, "__name__", None)},
            span_kind=scope._span_kind,
        )
    if inspect.isasyncgenfunction(func):
        wrapper: Callable[..., Any] = _async_generator_wrapper(scope, func)
    elif inspect.isgeneratorfunction(func):
        wrapper = _generator_wrapper(scope, func)
    elif inspect.iscoroutinefunction(func):
        wrapper = _coroutine_wrapper(scope, func)
    else:
        wrapper = _function_wrapper(scope, func)
    return functools.update_wrapper(wrapper, func)  # type: ignore[return-value]


def _function_wrapper(scope: Scope, func: Callable[..., Any]) -> Callable[..., Any]:
    start, finish = scope.start, scope.finish
    attach, detach = otel_context.attach, otel_context.detach

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
    attach, detach = otel_context.attach, otel_context.detach

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
    attach, detach, get_current = otel_context.attach, otel_context.detach, otel_context.get_current

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
    attach, detach, get_current = otel_context.attach, otel_context.detach, otel_context.get_current

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
                        detach(token)  # type: ignore[arg-type]
                try:
                    to_send = yield item
                except GeneratorExit:
                    if body_context is not None:
                        token = attach(body_context)
                    try:
                        await agen.aclose()
                    finally:
                        if body_context is not None:
                            detach(token)  # type: ignore[arg-type]
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
