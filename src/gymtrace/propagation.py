"""Carry a trace and its gym identity across process boundaries.

The W3C ``traceparent``/``tracestate`` headers carry the trace; W3C ``baggage`` carries the gym
identity keys (``gym.rollout.id``, ``gym.episode.attempt``, ...) and nothing else, because baggage
travels on every outgoing request, model providers included. Both go through
``opentelemetry.propagate``, so ``OTEL_PROPAGATORS`` is honoured (leave ``baggage`` in it, or the
identity stays behind).

Example::

    # client side
    headers = gymtrace.propagation.inject({})
    requests.post(url, json=task, headers=headers)

    # server side (or use gymtrace.integrations.asgi.GymTraceMiddleware)
    with gymtrace.propagation.attach(request.headers):
        handle(task)                      # spans here join the client's trace and rollout

    # child process or sandbox
    subprocess.run(cmd, env={**os.environ, **gymtrace.propagation.env_carrier()})
    # ...and in the child:  with gymtrace.propagation.attach(os.environ): ...

    # thread and process pools (also gymtrace.integrations.concurrent)
    future = gymtrace.propagation.submit(pool, score, answer)

Nothing here raises into the caller: a broken carrier gives a context without a remote parent,
and identity values that are not short printable text (or small non-negative integers) are dropped.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from concurrent.futures import Executor, Future
from contextlib import contextmanager
from typing import Any, Generic, ParamSpec, TypeVar

from opentelemetry import baggage, propagate, trace
from opentelemetry import context as otel_context
from opentelemetry.propagators.textmap import Getter

from gymtrace import _constants as c
from gymtrace._errors import guard
from gymtrace._frame import CARRIER_FORMAT, DISABLED_KIND, FRAME_KEY, REMOTE_KIND, ActiveScope, read_carrier
from gymtrace._ids import clean_identity, clean_value, episode_id
from gymtrace._levels import NUMBERING_OWNERS
from gymtrace._tracing import current_provider

__all__ = [
    "ContextCarrier",
    "attach",
    "carry",
    "env_carrier",
    "extract",
    "identity_from_context",
    "inject",
    "map",
    "submit",
    "with_identity",
]

_P = ParamSpec("_P")
_R = TypeVar("_R")

# -- identity <-> baggage ---------------------------------------------------------------------------


def identity_from_context(ctx: otel_context.Context | None = None) -> dict[str, str | int]:
    """The gym identity carried in a context's baggage, validated (bad values are dropped)."""
    entries = baggage.get_all(ctx)
    return clean_identity(entries) if entries else {}


def _identity_of(ctx: otel_context.Context) -> dict[str, str | int]:
    frame = ctx.get(FRAME_KEY)
    if isinstance(frame, ActiveScope) and frame.kind != DISABLED_KIND:
        return frame.identity
    return identity_from_context(ctx)


def with_identity(
    context: otel_context.Context | None = None, *, reserve_step: bool = False
) -> otel_context.Context:
    """``context`` (default: the current one) with its baggage replaced by the gym identity.

    Every propagator then sends the identity and nothing else as ``baggage``: attach this context
    around a call that another instrumentation injects headers for.
    """
    ctx = context if context is not None else otel_context.get_current()
    identity = _identity_of(ctx)
    step_base = baggage.get_baggage(c.STEP_BASE, ctx) or (_reserve_step(ctx) if reserve_step else None)
    ctx = baggage.clear(ctx)
    for key, value in identity.items():
        ctx = baggage.set_baggage(key, str(value), ctx)
    if step_base is not None:
        ctx = baggage.set_baggage(c.STEP_BASE, str(step_base), ctx)
    return ctx


def _reserve_step(ctx: otel_context.Context) -> int | None:
    """Called directly at the level that numbers steps (an episode or agent invocation, not inside
    a step): the work continued elsewhere is a step of its own, so it gets the caller's next step
    number, and the caller's later steps number after it. Inside a step nothing is reserved: what runs
    elsewhere is part of that step (a model or tool request)."""
    frame = ctx.get(FRAME_KEY)
    if isinstance(frame, ActiveScope) and not frame.remote and frame.kind in NUMBERING_OWNERS:
        return frame.take_number(c.KIND_STEP, None)
    return None


# -- carriers ---------------------------------------------------------------------------------------


def _folded(name: str) -> str:
    # One spelling for header and environment names: TRACEPARENT, traceparent, X_B3_TRACEID and
    # x-b3-traceid are the same key (specification context/env-carriers.md).
    return name.lower().replace("_", "-")


def _text(value: Any) -> str | None:
    if isinstance(value, str):
        # os.environ turns every byte that is not UTF-8 into a lone surrogate, which the SDK's
        # propagators cannot encode: such a value is garbage, so it is ignored, not raised.
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return None
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("latin-1")
    return None


def _items(carrier: Any) -> Iterable[tuple[Any, Any]]:
    if isinstance(carrier, Mapping):
        multi = getattr(carrier, "multi_items", None)  # starlette Headers keep repeated headers
        if callable(multi):
            return multi()  # type: ignore[no-any-return]
        return carrier.items()
    pairs: Iterable[tuple[Any, Any]] = carrier  # a list of (name, value) pairs (ASGI headers)
    return pairs


def _index(carrier: Any) -> dict[str, str]:
    """Case- and separator-insensitive view of a carrier; repeated headers are joined with ``,``
    as HTTP allows for ``tracestate`` and ``baggage``."""
    index: dict[str, str] = {}
    for key, raw in _items(carrier):
        name = _text(key)
        if name is None:
            continue
        values = raw if isinstance(raw, (list, tuple)) else (raw,)
        for item in values:
            value = _text(item)
            if value is None:
                continue
            folded = _folded(name)
            index[folded] = f"{index[folded]},{value}" if folded in index else value
    return index


class _IndexGetter(Getter[Mapping[str, str]]):
    def get(self, carrier: Mapping[str, str], key: str) -> list[str] | None:
        value = carrier.get(_folded(key))
        return [value] if value is not None else None

    def keys(self, carrier: Mapping[str, str]) -> list[str]:
        return list(carrier)


_GETTER = _IndexGetter()


def inject(
    carrier: MutableMapping[str, str] | None = None,
    context: otel_context.Context | None = None,
    *,
    continuation: bool = True,
) -> MutableMapping[str, str]:
    """Write ``traceparent``, ``tracestate`` and the gym identity (``baggage``) into ``carrier``.

    Returns the carrier (a new dict when none is given). The ``baggage`` written holds the gym
    identity only, never other baggage entries of the context; called directly at an episode or
    agent invocation (outside any step) it also holds ``gym.step.base``, the step number reserved for
    the work continued elsewhere, so steps in other processes never repeat the caller's numbers.
    ``continuation=False`` (what the HTTP helpers use for requests) reserves nothing.
    """
    if carrier is None:
        carrier = {}
    with guard("gymtrace.propagation.inject"):
        propagate.inject(carrier, context=with_identity(context, reserve_step=continuation))
    return carrier


def extract(carrier: Any, context: otel_context.Context | None = None) -> otel_context.Context:
    """A context that continues the trace and gym identity described by ``carrier``.

    ``carrier`` is a mapping of HTTP headers or environment variables (any case), or a list of
    ``(name, value)`` pairs such as ASGI headers. The context's baggage is the validated gym
    identity only; scopes and other libraries' spans started under it inherit that identity.
    """
    base = context if context is not None else otel_context.Context()
    with guard("gymtrace.propagation.extract"):
        if isinstance(carrier, Mapping) and carrier.get("format") == CARRIER_FORMAT:
            return _from_scope_carrier(carrier, base)
        ctx = propagate.extract(_index(carrier), context=base, getter=_GETTER)
        return _with_remote_frame(ctx, identity_from_context(ctx))
    return base


def _with_remote_frame(ctx: otel_context.Context, identity: dict[str, str | int]) -> otel_context.Context:
    """The caller's gym scope, continued here: a frame that stands for the caller's episode (or
    rollout) so that verify(), record_reward(), record_failure(), step() and turn() work as in the
    caller's process. It has no span here; outcomes recorded on it become outcome records."""
    step_base = clean_value(c.EPISODE_ATTEMPT, baggage.get_baggage(c.STEP_BASE, ctx))  # a small int
    ctx = baggage.clear(ctx)
    if not identity:
        return ctx
    for key, value in identity.items():
        ctx = baggage.set_baggage(key, str(value), ctx)
    if c.EPISODE_ATTEMPT in identity:
        kind = c.KIND_EPISODE
    elif c.ROLLOUT_ID in identity:
        kind = c.KIND_ROLLOUT
    else:
        kind = REMOTE_KIND
    frame = ActiveScope(kind, None)
    frame.remote = True
    frame.identity = identity
    frame.span = trace.NonRecordingSpan(trace.get_current_span(ctx).get_span_context())
    attempt = identity.get(c.EPISODE_ATTEMPT)
    if isinstance(attempt, int):
        frame.attempt = attempt
    if isinstance(step_base, int) and step_base > 0:
        frame.take_number(c.KIND_STEP, step_base - 1)  # the next step here is step_base
    return otel_context.set_value(FRAME_KEY, frame, ctx)


def _from_scope_carrier(carrier: Mapping[str, Any], base: otel_context.Context) -> otel_context.Context:
    """A context from :meth:`gymtrace.ActiveScope.carrier`: a later phase scoring the attempt the
    carrier was taken in (or, taken outside an episode, the rollout)."""
    identity, _, rollout_span, episode_span = read_carrier(carrier)
    attempt = carrier.get("attempt")
    if isinstance(attempt, int) and not isinstance(attempt, bool) and attempt >= 0:
        identity[c.EPISODE_ATTEMPT] = attempt
        rollout_id = identity.get(c.ROLLOUT_ID)
        if isinstance(rollout_id, str):
            identity[c.EPISODE_ID] = episode_id(rollout_id, attempt)
    parent = rollout_span if rollout_span is not None else episode_span
    ctx = trace.set_span_in_context(trace.NonRecordingSpan(parent), base) if parent is not None else base
    return _with_remote_frame(ctx, identity)


@contextmanager
def attach(carrier: Any) -> Iterator[otel_context.Context]:
    """Continue the remote trace and gym identity in ``carrier`` for the duration of the block.

    ``carrier`` is what :func:`inject` or :func:`env_carrier` wrote (headers, environment), or an
    :meth:`ActiveScope.carrier` dict. Inside, the caller's episode continues: ``verify()``,
    ``record_reward()``, ``record_failure()``, ``step()`` and ``turn()`` work as in the caller's
    process, and a reward or failure recorded here becomes the rollout's outcome record.

    ``attach(os.environ)`` continues the trace a parent process passed with :func:`env_carrier`.
    """
    ctx = extract(carrier)
    token = otel_context.attach(ctx)
    try:
        yield ctx
    finally:
        otel_context.detach(token)


def env_carrier(context: otel_context.Context | None = None) -> dict[str, str]:
    """``TRACEPARENT``/``TRACESTATE``/``BAGGAGE`` for a child process's environment.

    Follows the OpenTelemetry environment-variable carrier specification (names upper-cased,
    ``-`` becomes ``_``); the child continues with ``gymtrace.propagation.attach(os.environ)``.
    """
    headers = inject({}, context)
    return {key.upper().replace("-", "_"): value for key, value in headers.items()}


# -- thread and process pools ------------------------------------------------------------------------


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
                _flush_quietly()

    def __repr__(self) -> str:
        return f"<gymtrace.propagation.ContextCarrier {self.fn!r}>"


@guard("flushing spans of a pool worker", may_raise=False)
def _flush_quietly() -> None:
    provider: Any = current_provider()
    flush = getattr(provider, "force_flush", None)
    if flush is None:
        flush = getattr(trace.get_tracer_provider(), "force_flush", None)
    if flush is not None:
        flush()


def carry(fn: Callable[_P, _R], context: otel_context.Context | None = None) -> ContextCarrier[_P, _R]:
    """Bind ``fn`` to the current trace context and gym identity for a thread or process worker.

    ``pool.submit(gymtrace.propagation.carry(fn), *args)``; picklable when ``fn`` is.
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
