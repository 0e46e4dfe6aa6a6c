"""Carry a trace and its gym identity across process boundaries.

The W3C ``traceparent``/``tracestate`` headers carry the trace, to every destination. The gym
identity (``gym.rollout.id``, ``gym.episode.attempt``, ...; signed with ``gym.sig`` when
``GYMTRACE_IDENTITY_SECRET`` is set) travels in the W3C ``baggage`` header that :func:`inject`
writes, and only where it may go: a destination inside the gym (loopback, a host of
``GYMTRACE_PROPAGATE_TO``, a server the framework calls its own, or :data:`GYM_INTERNAL` for a
carrier that stays inside by construction). An unknown destination gets none. Beside it go only
the application keys listed in ``GYMTRACE_BAGGAGE_ALLOW``.

Outside gymtrace's own injectors the identity is never OpenTelemetry baggage: a continued context
(:func:`attach`, the middlewares) keeps it in gymtrace's own context entry and removes incoming
``gym.*`` entries from the baggage, so another instrumentation's ``opentelemetry.propagate.inject()``
(httpx, requests, urllib3, aiohttp, grpc clients) has nothing gym to forward to a third party.
Incoming identity is believed as ``GYMTRACE_TRUST_IDENTITY`` says (``all``, ``none``,
``signed``); the caller's other baggage stays in the context for the application. Both go through
``opentelemetry.propagate``, so ``OTEL_PROPAGATORS`` is honoured (leave ``baggage`` in it, or the
identity stays behind).

Example::

    # client side: the identity goes only if url is a gym destination; traceparent always
    headers = gymtrace.propagation.inject({}, destination=url)
    requests.post(url, json=task, headers=headers)

    # server side (or use gymtrace.integrations.asgi.GymTraceMiddleware)
    with gymtrace.propagation.attach(request.headers):
        handle(task)                      # spans here join the client's trace and rollout

    # work that continues this episode elsewhere: ask for the hand-off (see inject())
    headers = gymtrace.propagation.inject({}, destination=url, continuation=True)

    # child process or sandbox (a continuation inside the gym)
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

from gymtrace import _constants as c
from gymtrace._identity import carriers as _carriers
from gymtrace._identity import trust as _trust
from gymtrace._identity.carriers import (
    GETTER,
    carrier_index,
    from_scope_carrier,
    incoming_identity,
    remote_context,
    write_carrier,
)
from gymtrace._model.errors import GymTraceError, contract_problem, guard, internal_error
from gymtrace._scopes import tracing as _tracing
from gymtrace._scopes import training as _training
from gymtrace._scopes.active_scope import (
    CARRIER_FORMAT,
    DISABLED_KIND,
    SCOPE_KEY,
    ActiveScope,
)
from gymtrace._scopes.levels import NUMBERING_OWNERS
from gymtrace._scopes.tracing import current_provider

__all__ = [
    "GYM_INTERNAL",
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

# The gym identity a context carries and this process believes (implemented beside the carriers,
# which the identity processor reads without this public module).
identity_from_context = _carriers.identity_from_context

_P = ParamSpec("_P")
_R = TypeVar("_R")

GYM_INTERNAL = _trust.GYM_INTERNAL
"""The ``destination`` of a carrier that stays inside the gym by construction: a child process's
environment (:func:`env_carrier`), a pool worker's task (:func:`submit`, :func:`map`,
:class:`ContextCarrier`), a Ray task's arguments. Gym identity is written for it; pass it only for
such carriers, never for a request whose URL you do not control."""

# -- identity <-> baggage ---------------------------------------------------------------------------


def _identity_of(ctx: otel_context.Context) -> dict[str, str | int]:
    frame = ctx.get(SCOPE_KEY)
    if isinstance(frame, ActiveScope) and frame.kind != DISABLED_KIND:
        return frame.identity
    return identity_from_context(ctx)


def with_identity(
    context: otel_context.Context | None = None, *, reserve_step: bool = False, destination: object = None
) -> otel_context.Context:
    """``context`` (default: the current one) with the baggage that may go to ``destination``.

    ``destination``: the URL one request goes to (a string or an object whose ``str()`` is one), or
    :data:`GYM_INTERNAL`. For a gym destination (loopback, ``GYMTRACE_PROPAGATE_TO``, servers the
    framework calls its own, :data:`GYM_INTERNAL`) that is the gym identity (signed with
    ``gym.sig`` when ``GYMTRACE_IDENTITY_SECRET`` is set) plus the application baggage keys listed
    in ``GYMTRACE_BAGGAGE_ALLOW``; elsewhere, and for ``None`` (not known), only those keys. Every
    other entry stays behind. Every propagator sends exactly that as ``baggage``: attach this
    context around that one request when another instrumentation injects its headers (as the httpx
    transport does), never around more, because it is the one context in which the identity is
    OpenTelemetry baggage.

    ``reserve_step``: also reserve a step number for work continued there (``gym.step.base``; see
    :func:`inject`'s ``continuation``); only for a gym destination.
    """
    ctx = context if context is not None else otel_context.get_current()
    inside = _trust.may_carry_identity(destination)
    identity = _identity_of(ctx) if inside else {}
    version = _training.version
    if version is not None and c.ROLLOUT_ID in identity:
        # The version a span started here now records: the process's, as the work goes on there.
        identity = {**identity, c.POLICY_VERSION: version}
    step_base = _reserve_step(ctx) if inside and reserve_step else None
    allow = _trust.allowed_baggage()
    kept = {}
    if allow:
        entries = baggage.get_all(ctx)
        # gym.* keys are the identity's: they leave only as identity, never as allowed app keys.
        kept = {k: v for k, v in entries.items() if k in allow and not k.startswith("gym.")}
    ctx = baggage.clear(ctx)
    for key, value in kept.items():
        ctx = baggage.set_baggage(key, value, ctx)
    for key, value in identity.items():
        ctx = baggage.set_baggage(key, str(value), ctx)
    sig = _trust.signature(identity)
    if sig is not None:
        ctx = baggage.set_baggage(_trust.SIGNATURE_KEY, sig, ctx)
    if step_base is not None:
        ctx = baggage.set_baggage(c.STEP_BASE, str(step_base), ctx)
    return ctx


def _reserve_step(ctx: otel_context.Context) -> int | None:
    """The work continued elsewhere gets the next step number of the scope that numbers steps here
    (the episode or agent invocation, also from inside a step, also in a continuation handing on),
    and the steps here number after it; its further steps number in a range of their own
    (``ActiveScope.continue_steps_from``), so one episode's step numbers are unique across
    processes."""
    frame = ctx.get(SCOPE_KEY)
    owner = frame.nearest(*NUMBERING_OWNERS) if isinstance(frame, ActiveScope) else None
    # Inside a step too (a Ray task called from a step), and from a continuation handing on (a task
    # calling a task): whatever the other process numbers must not repeat a number here (issue 25).
    return owner.reserve_step() if owner is not None else None


def inject(
    carrier: MutableMapping[str, str] | None = None,
    context: otel_context.Context | None = None,
    *,
    destination: object = None,
    continuation: bool = False,
) -> MutableMapping[str, str]:
    """Write ``traceparent``, ``tracestate`` and, for a gym destination, the gym identity
    (``baggage``) into ``carrier``.

    Returns the carrier (a new dict when none is given). ``destination``: where the carrier goes,
    the request's URL (a string or an object whose ``str()`` is one) or :data:`GYM_INTERNAL` for a
    carrier that stays inside the gym by construction. The gym identity is written only for a gym
    destination (loopback, ``GYMTRACE_PROPAGATE_TO``, servers the framework calls its own,
    :data:`GYM_INTERNAL`); ``None`` means not known, and gets none. The ``baggage`` written holds
    that identity and the keys of ``GYMTRACE_BAGGAGE_ALLOW``, never other baggage entries of the
    context. ``traceparent`` goes everywhere.

    Injecting changes nothing here: no step number is taken and the rollout's outcome is decided
    as before. ``continuation=True`` says the work goes on there as part of this episode (a worker
    that records steps, a reward or a failure): a step number is reserved for it and written as
    ``gym.step.base`` (its further steps number from ``base * 10000 + 1``, so steps in other
    processes never repeat the caller's numbers nor each other's), and the rollout is handed off
    (one that ends with no outcome of its own reads ``pending``, its outcome expected from there).
    A continuation needs a gym destination; for another one it is reported and nothing is reserved.
    """
    if carrier is None:
        carrier = {}
    with guard("gymtrace.propagation.inject"):
        continued = continuation and _trust.may_carry_identity(destination)
        if continuation and not continued:
            contract_problem(
                ("propagation.inject", "continuation outside the gym"),
                GymTraceError(
                    "gymtrace.propagation.inject(continuation=True) for a destination that is not a gym"
                    f" destination ({destination!r:.80}): no identity goes there, so nothing can"
                    " continue the episode; pass destination=<the gym URL> or GYM_INTERNAL"
                ),
            )
        ctx = with_identity(context, reserve_step=continued, destination=destination)
        if continued:
            frame = (context if context is not None else otel_context.get_current()).get(SCOPE_KEY)
            if isinstance(frame, ActiveScope):
                frame.hand_off()  # the rollout's outcome may now be recorded where this goes
        write_carrier(carrier, ctx)
    return carrier


def extract(
    carrier: Any, context: otel_context.Context | None = None, *, trusted: bool | None = None
) -> otel_context.Context:
    """A context that continues the trace and gym identity described by ``carrier``.

    ``carrier`` is a mapping of HTTP headers or environment variables (any case), a list of
    ``(name, value)`` pairs such as ASGI headers, or an :meth:`ActiveScope.carrier` dict. Repeated
    headers are taken as OpenTelemetry takes them (the first ``traceparent`` and ``baggage``). The
    gym identity is believed as ``GYMTRACE_TRUST_IDENTITY`` says, unless ``trusted=True`` (a
    carrier this application made itself); the caller's other baggage stays in the context for the
    application, and is forwarded only for keys in ``GYMTRACE_BAGGAGE_ALLOW``.
    """
    base = context if context is not None else otel_context.Context()
    try:
        # A worker that was never configured continues its parent's context under its parent's
        # settings (GYMTRACE_PARENT), so what it records is not lost (issue 25).
        _tracing.inherit_parent_settings()
        if isinstance(carrier, Mapping) and carrier.get("format") == CARRIER_FORMAT:
            # A scope carrier is made by this application's own code (ActiveScope.carrier()).
            return from_scope_carrier(carrier, base)
        index = carrier_index(carrier)
        raw = index.get("baggage")
        identity, parsed = incoming_identity(raw[0] if raw else None, trusted=trusted)
        if raw:
            # OpenTelemetry's propagator sees the well-formed application entries only: the gym ones
            # are read above, and nothing it parses can make it log.
            index["baggage"] = [parsed.other] if parsed.other else []
        ctx = propagate.extract(index, context=base, getter=GETTER)
        return remote_context(ctx, identity, parsed.gym.get(c.STEP_BASE))
    except Exception as exc:  # noqa: BLE001 - telemetry must not break the caller
        internal_error("gymtrace.propagation.extract", exc)
        return base


@contextmanager
def attach(carrier: Any, *, trusted: bool | None = None) -> Iterator[otel_context.Context]:
    """Continue the remote trace and gym identity in ``carrier`` for the duration of the block.

    ``carrier`` is what :func:`inject` or :func:`env_carrier` wrote (headers, environment), or an
    :meth:`ActiveScope.carrier` dict. Inside, the caller's episode continues: ``verify()``,
    ``record_reward()``, ``record_failure()``, ``step()`` and ``turn()`` work as in the caller's
    process, and a reward or failure recorded here becomes the rollout's outcome record.

    ``attach(os.environ)`` continues the trace a parent process passed with :func:`env_carrier`;
    the process environment is trusted (whoever sets it controls the process anyway), other
    carriers follow ``GYMTRACE_TRUST_IDENTITY`` unless ``trusted`` says otherwise.
    """
    ctx = extract(carrier, trusted=True if carrier is os.environ and trusted is None else trusted)
    token = otel_context.attach(ctx)
    try:
        yield ctx
    finally:
        otel_context.detach(token)
        flush = _tracing.flush_after_continuation
        if flush is not None:
            with guard("flushing a continued context"):
                flush()


def env_carrier(context: otel_context.Context | None = None, *, continuation: bool = True) -> dict[str, str]:
    """``TRACEPARENT``/``TRACESTATE``/``BAGGAGE`` for a child process's environment.

    Follows the OpenTelemetry environment-variable carrier specification (names upper-cased,
    ``-`` becomes ``_``); the child continues with ``gymtrace.propagation.attach(os.environ)``.
    A child process is inside the gym (:data:`GYM_INTERNAL`): the identity is always written. It
    continues the episode (``continuation=True``, see :func:`inject`): its steps get a range of
    their own and it may record the rollout's outcome. ``continuation=False`` for a child that only
    joins the trace (its spans carry the identity, it records no steps or outcome).
    """
    headers = inject({}, context, destination=GYM_INTERNAL, continuation=continuation)
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
            # Pickled into another process (a pool worker): it continues the episode there.
            headers = dict(inject({}, self._context, destination=GYM_INTERNAL, continuation=True))
        return {"fn": self.fn, "headers": headers or {}, "pid": self._pid}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.fn = state["fn"]
        self._headers = state["headers"]
        self._pid = state["pid"]
        self._context = None

    def __call__(self, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        # The headers were made by this application's own submit(): no trust boundary is crossed.
        ctx = self._context if self._context is not None else extract(self._headers or {}, trusted=True)
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
