"""The ten gym levels as public functions.

Each returns a :class:`~gymtrace._scope.Scope` usable as ``with``, ``async with`` and
``@scope(...)``, or decorates directly when given a function (``@gymtrace.step``). Arguments are
keyword-only, so the bare and the called decorator can never be confused; any identity argument
may be a callable applied to the decorated function's arguments
(``@gymtrace.rollout(rollout_id=lambda row: row["id"])``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ParamSpec, TypeVar, overload

from opentelemetry.trace import SpanKind

from gymtrace import _constants as c
from gymtrace._frame import ActiveScope
from gymtrace._scope import Scope, decorate

P = ParamSpec("P")
R = TypeVar("R")

# An identity argument: the value itself, or a callable applied to the decorated function's arguments.
Str = str | Callable[..., str] | None
Int = int | Callable[..., int] | None
Attributes = Mapping[str, Any] | Callable[..., Mapping[str, Any]] | None


# One shared Scope per level for calls without arguments (``with gymtrace.step():``): a Scope holds
# no activation state (that lives in the context), so sharing it is safe, and it saves building one
# per `with` block (issue 13: free when off, and the `with` form as cheap as the decorator).
# Keyed by level and the options that are plain values (a span kind, or None).
_BARE: dict[tuple[Any, ...], Scope] = {}


def _build(kind: str, func: Any, example: str, arguments: dict[str, Any], **options: Any) -> Any:
    if func is None and _no_values(arguments) and _plain(options):
        key = (kind, *options.values())
        bare = _BARE.get(key)
        if bare is None:
            bare = _BARE[key] = Scope(kind, {}, **options)
        return bare
    scope = Scope(kind, arguments, **options)
    if func is None:
        return scope
    if not callable(func) and not isinstance(func, (staticmethod, classmethod)):
        raise TypeError(
            f"gymtrace.{kind}() takes its arguments by keyword, e.g. gymtrace.{kind}({example}=...);"
            f" got a positional {type(func).__name__} {func!r:.60}"
        )
    return decorate(scope, func)


def _no_values(arguments: dict[str, Any]) -> bool:
    # A loop, not all(<generator>): this runs on every `with`, and the generator costs ~0.2 µs.
    for value in arguments.values():  # noqa: SIM110
        if value is not None:
            return False
    return True


def _plain(options: dict[str, Any]) -> bool:
    for value in options.values():  # noqa: SIM110 - see _no_values
        if value is not None and type(value) is not SpanKind:
            return False  # a reward_from callable or an episode source: this call's own scope
    return True


@overload
def run(func: Callable[P, R], /) -> Callable[P, R]: ...
@overload
def run(*, run_id: Str = None, attributes: Attributes = None) -> Scope: ...
def run(func: Any = None, /, *, run_id: Str = None, attributes: Attributes = None) -> Any:
    """One collection or evaluation run (``gym.run``). Without ``run_id`` one is generated."""
    return _build(c.KIND_RUN, func, "run_id", {"run_id": run_id, "attributes": attributes})


@overload
def rollout(func: Callable[P, R], /) -> Callable[P, R]: ...
@overload
def rollout(
    *, rollout_id: Str = None, task_id: Str = None, repeat: Int = None, attributes: Attributes = None
) -> Scope: ...
def rollout(
    func: Any = None,
    /,
    *,
    rollout_id: Str = None,
    task_id: Str = None,
    repeat: Int = None,
    attributes: Attributes = None,
) -> Any:
    """One sample of one task (``gym.rollout``); ``repeat`` is its index within ``num_repeats``.

    By default the rollout span is the root of its own trace, linked to its run.
    """
    arguments = {"rollout_id": rollout_id, "task_id": task_id, "repeat": repeat, "attributes": attributes}
    return _build(c.KIND_ROLLOUT, func, "rollout_id", arguments)


@overload
def episode(func: Callable[P, R], /) -> Callable[P, R]: ...
@overload
def episode(
    *,
    attempt: Int = None,
    restored_from: Any = None,
    continue_from: Mapping[str, Any] | ActiveScope | None = None,
    attributes: Attributes = None,
) -> Scope: ...
def episode(
    func: Any = None,
    /,
    *,
    attempt: Int = None,
    restored_from: Any = None,
    continue_from: Mapping[str, Any] | ActiveScope | None = None,
    attributes: Attributes = None,
) -> Any:
    """One execution attempt of a rollout (``gym.episode``), from seed_session through verify.

    ``attempt`` (0-based) defaults to the next attempt within the enclosing rollout, and a new
    episode links to the previous attempt (relation ``retry``).

    ``restored_from`` marks a checkpoint restore: the episode continues the saved session state of
    the episode given (an :class:`ActiveScope`, its :meth:`~ActiveScope.carrier`, or ``True`` for
    the previous episode of this rollout); it gets ``gym.episode.restored=true`` and a link with
    relation ``restore``. It is not an independent sample.

    ``continue_from`` opens the next attempt of a rollout from a carrier taken in another process
    (same rollout, task and run IDs; linked to the previous episode; in the rollout's trace).
    """
    if restored_from is not None and restored_from is not False:
        source: tuple[str, Any] | None = (c.RELATION_RESTORE, restored_from)
    elif continue_from is not None:
        source = (c.RELATION_RETRY, continue_from)
    else:
        source = None
    return _build(
        c.KIND_EPISODE, func, "attempt", {"attempt": attempt, "attributes": attributes}, source=source
    )


@overload
def seed_session(func: Callable[P, R], /) -> Callable[P, R]: ...
@overload
def seed_session(*, attributes: Attributes = None) -> Scope: ...
def seed_session(func: Any = None, /, *, attributes: Attributes = None) -> Any:
    """The environment setup phase of an episode (``gym.seed_session``)."""
    return _build(c.KIND_SEED_SESSION, func, "attributes", {"attributes": attributes})


@overload
def verify(func: Callable[P, R], /) -> Callable[P, R]: ...
@overload
def verify(
    *, reward_from: str | Callable[[Any], Any] | None = None, attributes: Attributes = None
) -> Scope: ...
def verify(
    func: Any = None,
    /,
    *,
    reward_from: str | Callable[[Any], Any] | None = None,
    attributes: Attributes = None,
) -> Any:
    """The scoring phase of an episode (``gym.verify``).

    ``reward_from`` takes the reward from a decorated function's return value: a key of a mapping
    or an attribute name (``reward_from="reward"``), or a callable applied to the return value.
    Otherwise call :func:`gymtrace.record_reward`.
    """
    return _build(c.KIND_VERIFY, func, "reward_from", {"attributes": attributes}, reward_from=reward_from)


@overload
def agent_invocation(func: Callable[P, R], /) -> Callable[P, R]: ...
@overload
def agent_invocation(
    *, agent_name: Str = None, invocation_id: Str = None, remote: bool = False, attributes: Attributes = None
) -> Scope: ...
def agent_invocation(
    func: Any = None,
    /,
    *,
    agent_name: Str = None,
    invocation_id: Str = None,
    remote: bool = False,
    attributes: Attributes = None,
) -> Any:
    """One agent or subagent conversation (``invoke_agent {agent_name}``).

    A subagent is an invocation opened inside the ``tool_call`` that spawned it. ``remote=True``
    makes it a CLIENT span, for an agent that runs behind an API.
    """
    arguments = {"agent_name": agent_name, "invocation_id": invocation_id, "attributes": attributes}
    span_kind = SpanKind.CLIENT if remote else SpanKind.INTERNAL
    return _build(c.KIND_AGENT_INVOCATION, func, "agent_name", arguments, span_kind=span_kind)


@overload
def turn(func: Callable[P, R], /) -> Callable[P, R]: ...
@overload
def turn(*, number: Int = None, attributes: Attributes = None) -> Scope: ...
def turn(func: Any = None, /, *, number: Int = None, attributes: Attributes = None) -> Any:
    """A harness-reported exchange or decision (``gym.turn``), numbered 1, 2, 3... per invocation."""
    return _build(c.KIND_TURN, func, "number", {"number": number, "attributes": attributes})


@overload
def step(func: Callable[P, R], /) -> Callable[P, R]: ...
@overload
def step(*, number: Int = None, attributes: Attributes = None) -> Scope: ...
def step(func: Any = None, /, *, number: Int = None, attributes: Attributes = None) -> Any:
    """One model call plus the tool calls it requests (``gym.step``), numbered per invocation."""
    return _build(c.KIND_STEP, func, "number", {"number": number, "attributes": attributes})


@overload
def model_call(func: Callable[P, R], /) -> Callable[P, R]: ...
@overload
def model_call(
    *, model: Str = None, provider: Str = None, in_process: bool = False, attributes: Attributes = None
) -> Scope: ...
def model_call(
    func: Any = None,
    /,
    *,
    model: Str = None,
    provider: Str = None,
    in_process: bool = False,
    attributes: Attributes = None,
) -> Any:
    """A GenAI inference call (``chat {model}``), a CLIENT span unless ``in_process=True``.

    Record token usage with :func:`gymtrace.record_usage` or ``scope.record_usage(...)``.
    """
    arguments = {"model": model, "provider": provider, "attributes": attributes}
    span_kind = SpanKind.INTERNAL if in_process else SpanKind.CLIENT
    return _build(c.KIND_MODEL_CALL, func, "model", arguments, span_kind=span_kind)


@overload
def tool_call(func: Callable[P, R], /) -> Callable[P, R]: ...
@overload
def tool_call(*, tool_name: Str = None, call_id: Str = None, attributes: Attributes = None) -> Scope: ...
def tool_call(
    func: Any = None, /, *, tool_name: Str = None, call_id: Str = None, attributes: Attributes = None
) -> Any:
    """One tool execution (``execute_tool {tool_name}``), environment tools included.

    A decorated tool is named after its function unless ``tool_name`` says otherwise.
    """
    arguments = {"tool_name": tool_name, "call_id": call_id, "attributes": attributes}
    return _build(c.KIND_TOOL_CALL, func, "tool_name", arguments)
