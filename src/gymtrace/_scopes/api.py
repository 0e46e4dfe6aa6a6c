"""The gym levels as public functions (the ten of an episode, and the train step).

Each returns a :class:`~gymtrace._scopes.scope.Scope` usable as ``with``, ``async with`` and
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
from gymtrace._model.ids import check_timeout
from gymtrace._scopes.active_scope import ActiveScope
from gymtrace._scopes.scope import Scope, decorate

P = ParamSpec("P")
R = TypeVar("R")

# An identity argument: the value itself, or a callable applied to the decorated function's arguments.
Str = str | Callable[..., str] | None
Int = int | Callable[..., int] | None
# A policy version: an int (or an integer-like: numpy, torch scalars) or a str, or a callable.
Version = int | str | Callable[..., int | str] | None
Attributes = Mapping[str, Any] | Callable[..., Mapping[str, Any]] | None


def _build(kind: str, func: Any, example: str, arguments: dict[str, Any], **options: Any) -> Any:
    scope = Scope(kind, arguments, **options)
    if func is None:
        return scope
    if not callable(func) and not isinstance(func, (staticmethod, classmethod)):
        raise TypeError(
            f"gymtrace.{kind}() takes its arguments by keyword, e.g. gymtrace.{kind}({example}=...);"
            f" got a positional {type(func).__name__} {func!r:.60}"
        )
    return decorate(scope, func)


# Free when off: each function below returns its Scope directly for the `with` form,
# without the shared _build, and one shared Scope per level for a call without arguments
# (``with gymtrace.step():``). A Scope holds no activation state (that lives in the context), so
# sharing it is safe; building one per `with` block cost most of a disabled block. One module name
# per level: a dictionary lookup by kind was a tenth of a disabled `async with`.
_BARE_RUN = Scope(c.KIND_RUN, {})
_BARE_ROLLOUT = Scope(c.KIND_ROLLOUT, {})
_BARE_EPISODE = Scope(c.KIND_EPISODE, {})
_BARE_SEED_SESSION = Scope(c.KIND_SEED_SESSION, {})
_BARE_VERIFY = Scope(c.KIND_VERIFY, {})
_BARE_AGENT = Scope(c.KIND_AGENT_INVOCATION, {})
_BARE_TURN = Scope(c.KIND_TURN, {})
_BARE_STEP = Scope(c.KIND_STEP, {})
_BARE_MODEL = Scope(c.KIND_MODEL_CALL, {})
_BARE_TOOL = Scope(c.KIND_TOOL_CALL, {})
_BARE_REMOTE_AGENT = Scope(c.KIND_AGENT_INVOCATION, {}, span_kind=SpanKind.CLIENT)
_BARE_IN_PROCESS_MODEL = Scope(c.KIND_MODEL_CALL, {}, span_kind=SpanKind.INTERNAL)

# The same for a `with` block given plain identity values (``with gymtrace.tool_call(tool_name="search"):``
# in a loop): one shared Scope per level and values, since building one cost ~0.3 µs, most of a
# disabled level. Only str and int values (and None) form a key: equal keys then mean equal values
# of the same type (a bool or a float equal to an int never shares the int's scope), and none of
# them can change. A scope whose arguments fail validation raises before it is stored. Bounded:
# unique IDs (a rollout_id per rollout) only cost a miss, and the cache is cleared when full.
_KEYABLE = frozenset({str, int, type(None)})
_SHARED_MAX = 512
_SHARED_RUN: dict[Any, Scope] = {}
_SHARED_ROLLOUT: dict[Any, Scope] = {}
_SHARED_AGENT: dict[Any, Scope] = {}
_SHARED_STEP: dict[Any, Scope] = {}
_SHARED_TURN: dict[Any, Scope] = {}
_SHARED_MODEL: dict[Any, Scope] = {}
_SHARED_TOOL: dict[Any, Scope] = {}
_CLIENT = SpanKind.CLIENT
_INTERNAL = SpanKind.INTERNAL


def _share(cache: dict[Any, Scope], key: Any, scope: Scope) -> Scope:
    if len(cache) >= _SHARED_MAX:
        cache.clear()
    cache[key] = scope
    return scope


@overload
def run(func: Callable[P, R], /) -> Callable[P, R]: ...
@overload
def run(*, run_id: Str = None, attributes: Attributes = None) -> Scope: ...
def run(func: Any = None, /, *, run_id: Str = None, attributes: Attributes = None) -> Any:
    """One collection or evaluation run (``gym.run``). Without ``run_id`` one is generated."""
    if func is None:
        if attributes is None:
            if run_id is None:
                return _BARE_RUN
            if type(run_id) in _KEYABLE:
                return _SHARED_RUN.get(run_id) or _share(
                    _SHARED_RUN, run_id, Scope(c.KIND_RUN, {"run_id": run_id, "attributes": None})
                )
        return Scope(c.KIND_RUN, {"run_id": run_id, "attributes": attributes})
    return _build(c.KIND_RUN, func, "run_id", {"run_id": run_id, "attributes": attributes})


@overload
def rollout(func: Callable[P, R], /) -> Callable[P, R]: ...
@overload
def rollout(
    *,
    rollout_id: Str = None,
    task_id: Str = None,
    repeat: Int = None,
    group_id: str | int | Callable[..., str | int] | None = None,
    group_size: Int = None,
    train_step: Int = None,
    policy_version: Version = None,
    attributes: Attributes = None,
) -> Scope: ...
def rollout(
    func: Any = None,
    /,
    *,
    rollout_id: Str = None,
    task_id: Str = None,
    repeat: Int = None,
    group_id: str | int | Callable[..., str | int] | None = None,
    group_size: Int = None,
    train_step: Int = None,
    policy_version: Version = None,
    attributes: Attributes = None,
) -> Any:
    """One sample of one task (``gym.rollout``); ``repeat`` is its index within ``num_repeats``.

    By default the rollout span is the root of its own trace, linked to its run.

    In a training run: ``group_id`` and ``group_size`` (``gym.group.id``, ``gym.group.size``) name
    the group of samples of one prompt it belongs to, ``train_step`` (``gym.train.step``) the step
    it is generated for, and ``policy_version`` the weights it is generated with, in place of the
    process's (:func:`gymtrace.set_policy_version`). Each may be a callable of the decorated
    function's arguments, like ``rollout_id``. ``gym.group.id`` and ``gym.policy.version`` are on
    every span below it, in the gym's other processes too.
    """
    training = group_id is not None or group_size is not None or train_step is not None
    if (
        func is None
        and rollout_id is None
        and task_id is None
        and repeat is None
        and attributes is None
        and not training
        and policy_version is None
    ):
        return _BARE_ROLLOUT
    if (
        func is None
        and attributes is None
        and not training
        and policy_version is None
        and type(rollout_id) in _KEYABLE
        and type(task_id) in _KEYABLE
        and type(repeat) in _KEYABLE
    ):
        key = (rollout_id, task_id, repeat)
        return _SHARED_ROLLOUT.get(key) or _share(
            _SHARED_ROLLOUT,
            key,
            Scope(
                c.KIND_ROLLOUT,
                {"rollout_id": rollout_id, "task_id": task_id, "repeat": repeat, "attributes": None},
            ),
        )
    arguments: dict[str, Any] = {
        "rollout_id": rollout_id,
        "task_id": task_id,
        "repeat": repeat,
        "attributes": attributes,
    }
    if training or policy_version is not None:
        arguments.update(
            group_id=group_id, group_size=group_size, train_step=train_step, policy_version=policy_version
        )
    if func is None:
        return Scope(c.KIND_ROLLOUT, arguments)
    return _build(c.KIND_ROLLOUT, func, "rollout_id", arguments)


@overload
def train_step(func: Callable[P, R], /) -> Callable[P, R]: ...
@overload
def train_step(
    *, step: Int = None, policy_version: Version = None, attributes: Attributes = None
) -> Scope: ...
def train_step(
    func: Any = None, /, *, step: Int = None, policy_version: Version = None, attributes: Attributes = None
) -> Any:
    """One trainer step (``gym.train_step``): ``step`` its number (``gym.train.step``; a callable of
    the decorated function's arguments too), ``policy_version`` the weights it starts from (default:
    the process's, :func:`gymtrace.set_policy_version`).

    Like a rollout, it is the root of its own trace, linked to its run. Inside it,
    :func:`gymtrace.consume` records each rollout it consumed (trained on or not), with staleness =
    its policy version minus the rollout's start version.
    """
    return _build(
        c.KIND_TRAIN_STEP,
        func,
        "step",
        {"step": step, "policy_version": policy_version, "attributes": attributes},
    )


@overload
def episode(func: Callable[P, R], /) -> Callable[P, R]: ...
@overload
def episode(
    *,
    attempt: Int = None,
    restored_from: Any = None,
    continue_from: Mapping[str, Any] | ActiveScope | None = None,
    attributes: Attributes = None,
    timeout: float | None = None,
) -> Scope: ...
def episode(
    func: Any = None,
    /,
    *,
    attempt: Int = None,
    restored_from: Any = None,
    continue_from: Mapping[str, Any] | ActiveScope | None = None,
    attributes: Attributes = None,
    timeout: float | None = None,
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

    ``timeout`` (seconds): an async episode (``async with``, or a decorated coroutine function)
    still running after it is cancelled and fails with kind ``timeout`` (retryable, so
    :func:`gymtrace.attempts` starts the next attempt); a sync one cannot be interrupted safely, so
    it gets a ``gym.episode.overdue`` event and ``gymtrace live`` reads it ``stalled``.
    """
    check_timeout("episode", timeout)
    no_source = continue_from is None and (restored_from is None or restored_from is False)
    if func is None and attempt is None and attributes is None and no_source and timeout is None:
        return _BARE_EPISODE
    if restored_from is not None and restored_from is not False:
        source: tuple[str, Any] | None = (c.RELATION_RESTORE, restored_from)
    elif continue_from is not None:
        source = (c.RELATION_RETRY, continue_from)
    else:
        source = None
    return _build(
        c.KIND_EPISODE,
        func,
        "attempt",
        {"attempt": attempt, "attributes": attributes, "timeout": timeout},
        source=source,
    )


@overload
def seed_session(func: Callable[P, R], /) -> Callable[P, R]: ...
@overload
def seed_session(*, attributes: Attributes = None) -> Scope: ...
def seed_session(func: Any = None, /, *, attributes: Attributes = None) -> Any:
    """The environment setup phase of an episode (``gym.seed_session``)."""
    if func is None and attributes is None:
        return _BARE_SEED_SESSION
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
    if func is None and attributes is None and reward_from is None:
        return _BARE_VERIFY
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
    if func is None and agent_name is None and invocation_id is None and attributes is None:
        return _BARE_REMOTE_AGENT if remote else _BARE_AGENT
    span_kind = _CLIENT if remote else _INTERNAL
    if (
        func is None
        and attributes is None
        and type(agent_name) in _KEYABLE
        and type(invocation_id) in _KEYABLE
    ):
        key = (agent_name, invocation_id, not remote)  # a bool: an enum hashes in Python code
        return _SHARED_AGENT.get(key) or _share(
            _SHARED_AGENT,
            key,
            Scope(
                c.KIND_AGENT_INVOCATION,
                {"agent_name": agent_name, "invocation_id": invocation_id, "attributes": None},
                span_kind=span_kind,
            ),
        )
    arguments = {"agent_name": agent_name, "invocation_id": invocation_id, "attributes": attributes}
    if func is None:
        return Scope(c.KIND_AGENT_INVOCATION, arguments, span_kind=span_kind)
    return _build(c.KIND_AGENT_INVOCATION, func, "agent_name", arguments, span_kind=span_kind)


@overload
def turn(func: Callable[P, R], /) -> Callable[P, R]: ...
@overload
def turn(*, number: Int = None, attributes: Attributes = None) -> Scope: ...
def turn(func: Any = None, /, *, number: Int = None, attributes: Attributes = None) -> Any:
    """A harness-reported exchange or decision (``gym.turn``), numbered 1, 2, 3... per invocation."""
    if func is None and number is None and attributes is None:
        return _BARE_TURN
    if func is None and attributes is None and type(number) in _KEYABLE:
        return _SHARED_TURN.get(number) or _share(
            _SHARED_TURN, number, Scope(c.KIND_TURN, {"number": number, "attributes": None})
        )
    return _build(c.KIND_TURN, func, "number", {"number": number, "attributes": attributes})


@overload
def step(func: Callable[P, R], /) -> Callable[P, R]: ...
@overload
def step(*, number: Int = None, attributes: Attributes = None) -> Scope: ...
def step(func: Any = None, /, *, number: Int = None, attributes: Attributes = None) -> Any:
    """One model call plus the tool calls it requests (``gym.step``), numbered per invocation."""
    if func is None and number is None and attributes is None:
        return _BARE_STEP
    if func is None and attributes is None and type(number) in _KEYABLE:
        return _SHARED_STEP.get(number) or _share(
            _SHARED_STEP, number, Scope(c.KIND_STEP, {"number": number, "attributes": None})
        )
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
    if func is None and model is None and provider is None and attributes is None:
        return _BARE_IN_PROCESS_MODEL if in_process else _BARE_MODEL
    span_kind = _INTERNAL if in_process else _CLIENT
    if func is None and attributes is None and type(model) in _KEYABLE and type(provider) in _KEYABLE:
        key = (model, provider, not in_process)
        return _SHARED_MODEL.get(key) or _share(
            _SHARED_MODEL,
            key,
            Scope(
                c.KIND_MODEL_CALL,
                {"model": model, "provider": provider, "attributes": None},
                span_kind=span_kind,
            ),
        )
    arguments = {"model": model, "provider": provider, "attributes": attributes}
    if func is None:
        return Scope(c.KIND_MODEL_CALL, arguments, span_kind=span_kind)
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
    if func is None and tool_name is None and call_id is None and attributes is None:
        return _BARE_TOOL
    if func is None and attributes is None and type(tool_name) in _KEYABLE and type(call_id) in _KEYABLE:
        key = (tool_name, call_id)
        return _SHARED_TOOL.get(key) or _share(
            _SHARED_TOOL,
            key,
            Scope(c.KIND_TOOL_CALL, {"tool_name": tool_name, "call_id": call_id, "attributes": None}),
        )
    arguments = {"tool_name": tool_name, "call_id": call_id, "attributes": attributes}
    if func is None:
        return Scope(c.KIND_TOOL_CALL, arguments)
    return _build(c.KIND_TOOL_CALL, func, "tool_name", arguments)
