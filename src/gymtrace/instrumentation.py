"""The seam integrations build on: gymtrace's own (``gymtrace.integrations.*``) and yours.

Example: a client instrumentation that sends the gym identity with each request, spans its own
work under the caller's gym scope, and never lets a telemetry bug reach the caller::

    from gymtrace import attributes, instrumentation

    class MyClientInstrumentor:
        def instrument(self, *, tracer_provider=None):
            self._provider = tracer_provider

        def on_request(self, request):
            with instrumentation.guard("myclient request"):
                identity = instrumentation.current_identity()     # {} outside any gym scope
                if identity:
                    request.headers["x-rollout"] = str(identity[attributes.ROLLOUT_ID])
                tracer = instrumentation.get_tracer(self._provider)   # None: tracing is off
                if tracer is not None:
                    with tracer.start_as_current_span("myclient.send") as span:
                        instrumentation.stamp_identity(span, identity)

And a server middleware that continues the caller's gym scope on the span it is handed::

    identity = instrumentation.incoming_identity(request.headers.get("baggage"))
    context = instrumentation.continue_scope(context, identity)    # attach it for the request

What is here, by concern (everything else in gymtrace whose name starts with ``_`` may change in
any release; this module changes only by addition):

- **Identity.** :func:`current_identity`, :func:`innermost_scope` (read); :func:`stamp_identity`,
  :func:`continue_scope` (write); :func:`inject_context` (a context ``propagation.with_identity``
  made, into a request's headers); :func:`note_caller` (a request from a caller outside the gym: its
  rollouts link to the caller's span rather than join its trace); :func:`incoming_identity` and :func:`accept_identity` (what this
  process believes of an identity that arrived, per ``GYMTRACE_TRUST_IDENTITY``);
  :func:`set_identity_fallback` (where a request without gym baggage gets its identity, read by
  :class:`gymtrace.integrations.asgi.GymTraceMiddleware`); :func:`set_identity_aliases` (extra
  attributes the ``IdentitySpanProcessor`` derives from the identity); :func:`hand_off` (the work
  goes on in another process) and :func:`rerun` (this is a re-run of work whose run was lost).
- **Tracers.** :func:`get_tracer` honours an optional ``tracer_provider`` (default: the one gymtrace
  scopes use, normally the global one), which :func:`check_tracer_provider` validates;
  :func:`use_tracer_provider` sends the gymtrace scopes opened inside a block to a given provider,
  :func:`bind_tracer_provider` those opened in a given context; :func:`start_scope` /
  :func:`end_scope` run a gymtrace scope by hand on a chosen tracer (for spans whose end is not a
  block's end: a stream, a hook pair); :func:`rollout_sampled_out` tells whether the sampler drops
  a rollout before it is opened.
- **Errors.** :class:`guard` (context manager and decorator) and :func:`report_error` hand
  gymtrace's own failures to its policy (logged once on the ``gymtrace`` logger and swallowed;
  raised in strict mode); :func:`warn_once` reports a misuse once per key,
  :func:`warn` something about one datum each time; :class:`InvalidArgumentError` is what a bad
  argument to an integration raises.
- **IDs.** :func:`episode_id` (``gym.episode.id`` of a rollout's attempt: the rollout ID, then
  ``{rollout_id}-a{attempt}``) and :func:`deterministic_id` (an ID that every process, pass and
  importer derives alike from the same parts: SHA-256 of the parts joined by NUL, first ``size``
  bytes, never 0), so an integration and an importer of the same records agree on every ID.
- **Reading values.** :func:`read_int` reads an integer out of a library's response or a record
  (a ``bool`` never counts; ``default``, ``minimum`` and ``digits`` say the rest).
- **Step aggregation** (what :class:`gymtrace.integrations.gymnasium.TraceEnv` samples steps with):
  :data:`STEP_POLICIES`, :data:`STEPS_OWNED_ELSEWHERE`, :func:`chosen_step_parameters`,
  :func:`step_policy_inputs`, :func:`step_policy_attributes`, :func:`step_statistics_attributes`,
  :func:`write_step`.

Span and attribute names are in :mod:`gymtrace.attributes`.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import sys
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from typing import Any, TypeVar, cast

from opentelemetry import context as otel_context
from opentelemetry import trace

from gymtrace._constants import KIND_ROLLOUT as _KIND_ROLLOUT
from gymtrace._identity import processor as _processor
from gymtrace._identity import trust as _trust
from gymtrace._identity.carriers import caller_context as _caller_context
from gymtrace._identity.carriers import incoming_identity as _incoming_identity
from gymtrace._identity.carriers import remote_context as _remote_context
from gymtrace._identity.carriers import write_carrier as _write_carrier
from gymtrace._model import errors as _errors
from gymtrace._model.errors import InvalidArgumentError, guard
from gymtrace._model.ids import deterministic_id, episode_id
from gymtrace._model.numbers import read_int
from gymtrace._scopes import steps as _steps
from gymtrace._scopes import tracing as _which
from gymtrace._scopes.active_scope import CARRIER_FORMAT as _CARRIER_FORMAT
from gymtrace._scopes.active_scope import DISABLED_KIND as _DISABLED_KIND
from gymtrace._scopes.active_scope import SCOPE_KEY as _FRAME_KEY
from gymtrace._scopes.active_scope import ActiveScope as _ActiveScope
from gymtrace._scopes.scope import Scope as _Scope

_F = TypeVar("_F", bound=Callable[..., Any])

__all__ = [
    "STEPS_OWNED_ELSEWHERE",
    "STEP_POLICIES",
    "InvalidArgumentError",
    "accept_identity",
    "bind_tracer_provider",
    "check_tracer_provider",
    "chosen_step_parameters",
    "continue_scope",
    "current_identity",
    "deterministic_id",
    "episode_carrier",
    "episode_id",
    "end_scope",
    "get_tracer",
    "gym_destination",
    "guard",
    "hand_off",
    "identity_fallback",
    "incoming_identity",
    "inject_context",
    "innermost_scope",
    "may_carry_identity",
    "misuse",
    "note_caller",
    "pinned_ids",
    "read_int",
    "report_error",
    "rerun",
    "rollout_sampled_out",
    "set_identity_aliases",
    "set_identity_fallback",
    "stamp_identity",
    "start_scope",
    "step_policy_attributes",
    "step_policy_inputs",
    "step_statistics_attributes",
    "use_tracer_provider",
    "warn",
    "warn_once",
    "write_step",
]

# -- identity: read ------------------------------------------------------------------------------------


def innermost_scope(context: otel_context.Context | None = None) -> _ActiveScope | None:
    """The innermost gym scope of ``context`` (default: the current one), including a scope
    continued from another process; ``None`` outside every gym scope or while tracing is off."""
    frame = (context if context is not None else _which.current_context()).get(_FRAME_KEY)
    if not isinstance(frame, _ActiveScope) or frame.kind == _DISABLED_KIND:
        return None
    return frame


def hand_off(context: otel_context.Context | None = None) -> None:
    """Say that the innermost gym scope's work goes on in another process (its headers or a carrier
    were sent there): a rollout that then ends with no outcome of its own reads ``pending``, its
    outcome expected from there, rather than ``unscored``. Nothing outside every gym scope."""
    frame = innermost_scope(context)
    if frame is not None:
        frame.hand_off()


def rerun(attempt: int, message: str, context: otel_context.Context | None = None) -> None:
    """Say that the work continued here is re-run number ``attempt`` (1 for the first re-run) of
    work whose earlier run ended without a result, as when a scheduler re-runs a task whose worker
    died (Ray's ``max_retries``). Where the innermost gym scope is a rollout continued from
    another process, the episodes opened here number from ``attempt``, and the first of them
    records attempt ``attempt - 1`` as failed (``infrastructure``, retryable; ``message`` says why)
    and links to it as its retry, so the lost run counts as an attempt. Nothing elsewhere (work
    inside an episode re-runs within that attempt) or for ``attempt`` below 1."""
    if isinstance(attempt, bool) or not isinstance(attempt, int):
        raise InvalidArgumentError(f"rerun(): attempt must be an int, got {type(attempt).__name__}")
    frame = innermost_scope(context)
    if attempt >= 1 and frame is not None and frame.remote and frame.kind == _KIND_ROLLOUT:
        frame.rerun(attempt, str(message))


def current_identity(context: otel_context.Context | None = None) -> dict[str, str | int]:
    """The gym identity (``gym.run.id``, ``gym.rollout.id``, ``gym.episode.attempt``, ...) of the
    innermost gym scope, as attribute name to value; empty outside every gym scope. A copy."""
    frame = innermost_scope(context)
    return dict(frame.identity) if frame is not None else {}


# -- identity: write -----------------------------------------------------------------------------------


def stamp_identity(span: trace.Span, identity: Mapping[str, str | int]) -> None:
    """Write ``identity`` onto ``span`` as attributes (nothing when the span does not record)."""
    if identity and span.is_recording():
        span.set_attributes(dict(identity))


def continue_scope(
    context: otel_context.Context, identity: Mapping[str, str | int], *, step_base: object = None
) -> otel_context.Context:
    """``context`` continuing the gym scope ``identity`` names (already believed: see
    :func:`incoming_identity`), under ``context``'s current span.

    Spans opened in the returned context carry the identity; ``gymtrace.current()``,
    ``record_reward()``, ``record_failure()``, ``step()`` and ``turn()`` work as in the caller's
    process (outcomes become ``gym.outcome`` records). The identity is kept in gymtrace's own
    context entry, never in OpenTelemetry baggage: the ``gym.*`` entries of ``context``'s baggage
    (what an extraction put there) are removed, also when ``identity`` is empty, so no other
    instrumentation forwards them; other baggage stays. ``step_base``: the first step number the
    caller reserved for this process (its ``gym.step.base`` baggage, read from ``context`` when
    not given).
    """
    return _remote_context(context, dict(identity), step_base)


def note_caller(context: otel_context.Context, carrier: Any) -> otel_context.Context:
    """``context`` noting the caller outside the gym whose span ``carrier``'s trace context names
    (a trainer's rollout-batch span, sent as ``traceparent`` with a request that carries no gym
    identity this process believes); ``context`` unchanged when it names none.

    A rollout (or train step) opened in the returned context, or in one made from it, stays the
    root of its own trace and links to that span (relation ``caller``) instead of joining the
    caller's trace, even under the request's own HTTP server span or a stand-in scope made for the
    request (:func:`continue_scope`). A server middleware calls it for such requests; a context
    whose current span is foreign already (extracted from the headers) needs no note."""
    return _caller_context(context, carrier)


def incoming_identity(
    baggage_header: str | None, context: otel_context.Context | None = None
) -> dict[str, str | int]:
    """The gym identity in a raw W3C ``baggage`` header, validated, as far as this process believes
    it (``GYMTRACE_TRUST_IDENTITY``: all, none, or signed with ``GYMTRACE_IDENTITY_SECRET``).

    ``context``: the request's context as an outer extraction made it (an HTTP server span's, under
    gymtrace's configuration): the identity the global propagator read from this same header is
    taken from it instead of reading the header again."""
    return _incoming_identity(baggage_header, context=context)[0]


def accept_identity(identity: Mapping[str, str | int], signature: object = None) -> dict[str, str | int]:
    """The part of an identity read from elsewhere (already validated: headers of another protocol,
    say) this process believes, per ``GYMTRACE_TRUST_IDENTITY``; ``signature`` is its ``gym.sig``."""
    return _trust.accept(dict(identity), signature)


_fallback: Callable[[Any], dict[str, str | int]] | None = None


def set_identity_fallback(read: Callable[[Any], dict[str, str | int]] | None) -> None:
    """Where a request without believed gym baggage gets its identity: ``read(headers)`` with the
    request's ASGI ``(name, value)`` byte pairs, returning a believed identity or ``{}``. ``None``:
    nowhere. One reader per process (the last one set)."""
    global _fallback
    if read is not None and not callable(read):
        raise InvalidArgumentError(
            f"set_identity_fallback(): read must be callable or None, got {read!r:.60}"
        )
    _fallback = read


def identity_fallback() -> Callable[[Any], dict[str, str | int]] | None:
    """The reader :func:`set_identity_fallback` set, or ``None``."""
    return _fallback


def set_identity_aliases(derive: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None) -> None:
    """Extra attributes the ``IdentitySpanProcessor`` stamps beside the identity: ``derive(identity)``
    for each span started in a gym scope. ``None``: none. One deriver per process."""
    if derive is not None and not callable(derive):
        raise InvalidArgumentError(
            f"set_identity_aliases(): derive must be callable or None, got {derive!r:.60}"
        )
    _processor.set_aliases(derive)


# -- tracers -------------------------------------------------------------------------------------------


def check_tracer_provider(tracer_provider: object, caller: str) -> trace.TracerProvider | None:
    """``tracer_provider`` as given to ``caller`` (say ``"instrument()"``), or an
    :class:`InvalidArgumentError` naming the argument when it is neither a ``TracerProvider`` nor
    ``None``: what every integration that takes ``tracer_provider=`` checks first."""
    if tracer_provider is not None and not isinstance(tracer_provider, trace.TracerProvider):
        raise InvalidArgumentError(
            f"{caller}: argument 'tracer_provider' must be an opentelemetry TracerProvider or None,"
            f" got {tracer_provider!r:.60}"
        )
    return tracer_provider


_check_provider = check_tracer_provider


def get_tracer(tracer_provider: trace.TracerProvider | None = None) -> trace.Tracer | None:
    """gymtrace's tracer from ``tracer_provider``, default the provider gymtrace scopes use here
    (the global one, or the one :func:`use_tracer_provider` or ``gymtrace.testing.capture_spans``
    put in force). ``None`` when it records nothing (no SDK configured, ``OTEL_SDK_DISABLED``): skip
    the work."""
    _check_provider(tracer_provider, "get_tracer()")
    if tracer_provider is None:
        return _which.active_tracer()
    return _which.tracer_for(tracer_provider)


@contextmanager
def use_tracer_provider(tracer_provider: trace.TracerProvider | None) -> Iterator[None]:
    """Send the gymtrace scopes opened inside this block, in this context (thread, task), to
    ``tracer_provider``; ``None`` changes nothing. What an integration handed ``tracer_provider=``
    wraps its work in."""
    _check_provider(tracer_provider, "use_tracer_provider()")
    if tracer_provider is None:
        yield
        return
    token = _which.set_contextual_provider(tracer_provider)
    try:
        yield
    finally:
        _which.reset_contextual_provider(token)


def bind_tracer_provider(context: contextvars.Context, tracer_provider: trace.TracerProvider | None) -> None:
    """Send the gymtrace scopes opened whenever ``context.run(...)`` runs to ``tracer_provider``
    (``None`` changes nothing): for an integration that keeps a context of its own between calls
    (an environment's episode, say) rather than a block."""
    _check_provider(tracer_provider, "bind_tracer_provider()")
    if tracer_provider is not None:
        context.run(_which.set_contextual_provider, tracer_provider)


def start_scope(scope: _Scope, tracer: trace.Tracer) -> _ActiveScope | None:
    """Start ``scope`` (what ``gymtrace.model_call(...)`` and the other levels return) on
    ``tracer`` without entering it: the returned activation's ``span`` is its span, its ``context``
    the context to run its work in (not attached). ``None`` when nothing was started. Every started
    scope must reach :func:`end_scope`."""
    return scope.start(tracer)


def end_scope(scope: _Scope, frame: _ActiveScope, exc: BaseException | None = None) -> None:
    """End what :func:`start_scope` started: the level's outcome, then its span. ``exc``: what the
    work raised (recorded as the error), or ``None``."""
    scope.finish(frame, exc)


def rollout_sampled_out(rollout_id: str, task_id: str | None = None) -> bool:
    """Whether the sampler in force (a :class:`gymtrace.sampling.RolloutSampler`, which decides by
    the IDs alone) drops a rollout with these IDs: for an integration that opens rollouts itself and
    can then skip their whole span path, at a price: a rollout whose scopes never open leaves no
    summary span (``gym.rollout.detail=false``), so the readers count only the kept share. False
    when another sampler decides at the span, or none was configured."""
    # Without a RolloutSampler ever made, its SDK module was never loaded: nothing decides early.
    sampler_module = sys.modules.get("gymtrace._sdk.sampler")
    return sampler_module is not None and sampler_module.decided_in_advance(rollout_id, task_id) is False


# -- errors --------------------------------------------------------------------------------------------


def report_error(where: str, exc: BaseException, *, may_raise: bool = True) -> None:
    """Hand a failure of the integration's own telemetry code to gymtrace's policy: logged once per
    ``where`` and exception type on the ``gymtrace`` logger and swallowed; raised in strict mode,
    unless ``may_raise=False`` (a user exception is already on its way out, and
    replacing it would change what the user's code raises)."""
    _errors.internal_error(where, exc, may_raise=may_raise)


def warn(message: str) -> None:
    """Report something about one datum the integration handled (a sample without a score, say):
    one WARNING on the ``gymtrace`` logger each time."""
    _errors.logger.warning("gymtrace: %s", message)


def misuse(message: str) -> None:
    """Report a misuse of the integration when it happens: a WARNING on the ``gymtrace`` logger
    each time, and in strict mode (``GYMTRACE_STRICT``, ``gymtrace.testing``) a
    :class:`gymtrace.GymTraceError` raised from the call that misused it."""
    _errors.data_lost(_errors.GymTraceError(message))


def warn_once(key: object, message: str) -> None:
    """Report a misuse the integration can live with (it is left untraced, say): one WARNING on the
    ``gymtrace`` logger per ``key`` in this process."""
    if _errors.first_time(key):
        _errors.logger.warning("gymtrace: %s", message)


# -- step aggregation ----------------------------------------------------------------------------------

STEP_POLICIES = _steps.POLICIES
"""The names a step policy may be given by (``"aggregate"``, ``"all"``)."""

STEPS_OWNED_ELSEWHERE = _steps.OWNED_ELSEWHERE
"""Set as a step owner's ``step_stats`` (an episode an integration opened) when the integration
samples and counts its steps itself, and writes the ``gym.steps.*`` statistics itself."""

chosen_step_parameters = _steps.given_parameters
step_policy_inputs = _steps.policy_inputs
step_policy_attributes = _steps.policy_attributes
step_statistics_attributes = _steps.statistics_attributes
write_step = _steps.write_step


# -- IDs known in advance --------------------------------------------------------------------------------


@contextmanager
def pinned_ids(trace_id: int | None = None, span_id: int | None = None) -> Iterator[None]:
    """The first span started inside this block gets ``span_id``, and, when it is a trace root,
    ``trace_id`` (``None``: drawn at random, as for every other span). For spans another process
    or a later pass must find without being told, from IDs both derive (a hash of a run and a
    rollout key, say). Honoured by the ID generator :func:`gymtrace.configure` installs; under a
    provider of your own the IDs stay random."""
    for name, value, bits in (("trace_id", trace_id, 128), ("span_id", span_id, 64)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 1 << bits
        ):
            raise InvalidArgumentError(
                f"pinned_ids(): {name} must be a non-zero {bits}-bit int, got {value!r:.40}"
            )
    token = _which.pin_ids(trace_id, span_id)
    try:
        yield
    finally:
        _which.unpin_ids(token)


def episode_carrier(
    identity: Mapping[str, str | int],
    *,
    next_attempt: int,
    trace_id: int,
    rollout_span_id: int,
    episode_span_id: int | None = None,
) -> dict[str, Any]:
    """A carrier for ``gymtrace.episode(continue_from=...)`` built from known IDs instead of taken
    from a live scope: the rollout ``identity`` (``gym.run.id``, ``gym.rollout.id``, ``gym.task.id``,
    ``gym.rollout.repeat``), the attempt to open, the rollout's trace and span, and the previous
    attempt's episode span (linked with relation ``retry``)."""

    def ref(span_id: int) -> dict[str, Any]:
        return {
            "trace_id": trace.format_trace_id(trace_id),
            "span_id": trace.format_span_id(span_id),
            "sampled": True,
        }

    carrier: dict[str, Any] = {
        "format": _CARRIER_FORMAT,
        "identity": dict(identity),
        "next_attempt": next_attempt,
        "rollout_span": ref(rollout_span_id),
    }
    if episode_span_id is not None:
        carrier["episode_span"] = ref(episode_span_id)
    return carrier


class gym_destination:  # lower case: called like the function it was
    """Requests made inside this block go to one of the gym's own servers (``True``), whatever their
    host, or out of the gym (``False``: an upstream model endpoint, even on loopback). Gym baggage and
    ``x-nemo-gym-*`` headers go only to gym destinations; by default those are loopback and the
    host patterns of ``GYMTRACE_PROPAGATE_TO`` (which win over ``False``). For a framework that
    knows which of its requests are internal; also a decorator (sync or async), entered per call."""

    # One slotted object per block, not a generator and its context manager: NeMo Gym's HTTP
    # function enters one for every request it sends, held while the request is in flight.
    __slots__ = ("_inside", "_token")

    def __init__(self, inside: bool) -> None:
        self._inside = bool(inside)
        self._token: contextvars.Token[bool | None] | None = None

    def __enter__(self) -> None:
        if self._token is not None:
            # One token per object: entered again (nested, or from another task) it would reset the
            # destination in the wrong place. The generator-based manager refused it too.
            raise RuntimeError(
                "gymtrace.instrumentation.gym_destination() is entered once: make one per block"
            )
        self._token = _trust.destination_inside.set(self._inside)

    def __exit__(self, *_exc: object) -> None:
        if self._token is not None:
            _trust.destination_inside.reset(self._token)
            self._token = None

    def __call__(self, func: _F) -> _F:
        inside = self._inside
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                with gym_destination(inside):
                    return await func(*args, **kwargs)

            return cast(_F, run_async)

        @functools.wraps(func)
        def run(*args: Any, **kwargs: Any) -> Any:
            with gym_destination(inside):
                return func(*args, **kwargs)

        return cast(_F, run)


def may_carry_identity(url: object) -> bool:
    """Whether gym identity may go with a request to ``url`` (see :func:`gym_destination`);
    ``None`` (not known): no; :data:`gymtrace.propagation.GYM_INTERNAL`: yes."""
    return _trust.may_carry_identity(url)


def inject_context(carrier: MutableMapping[str, str], context: otel_context.Context) -> None:
    """Write ``context`` into ``carrier`` with the global propagators, as ``opentelemetry.propagate.inject``
    does, with its baggage percent-encoded as :func:`gymtrace.propagation.inject` writes it.

    For a hook that already made the request's context with
    ``gymtrace.propagation.with_identity(destination=url)`` (to attach it around the request):
    writing that context decides the identity once, where ``propagation.inject(carrier, context,
    destination=url)`` would decide it again. Every baggage entry of ``context`` goes: pass only a
    context ``with_identity`` made for this carrier's destination. A failure (a read-only carrier)
    goes to gymtrace's error policy, as :func:`gymtrace.propagation.inject`'s does.
    """
    with guard("gymtrace.instrumentation.inject_context"):
        _write_carrier(carrier, context)
