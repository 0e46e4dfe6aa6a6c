"""Which tracer gymtrace spans go to, decided cheaply on every call.

A decorated call asks :func:`active_tracer` first. ``None`` means tracing is off (no SDK
configured, ``OTEL_SDK_DISABLED=true``, or a no-op provider) and the wrapper calls the function
directly: going through OpenTelemetry's no-op tracer would cost ~10 µs per call, this costs a
dictionary lookup and a comparison.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace

from gymtrace import _constants as c
from gymtrace._otel_private import fastpaths as _fastpaths
from gymtrace._otel_private.provider import global_tracer_provider as _global_provider
from gymtrace._version import __version__

# (provider, tracer or None): the answer for the provider seen last. Replaced as a whole tuple so
# readers on other threads never see half an update.
_cache: tuple[object, trace.Tracer | None] = (object(), None)
# Providers pushed by gymtrace.testing.capture_spans(); the innermost wins over the global one.
_overrides: list[trace.TracerProvider] = []
_lock = threading.Lock()


# A provider an integration was handed (``tracer_provider=``), in force in this context only: set by
# gymtrace.instrumentation.use_tracer_provider around the integration's work. Read only once some
# integration was handed one, so the hot path of everyone else pays one global read.
_contextual: contextvars.ContextVar[trace.TracerProvider | None] = contextvars.ContextVar(
    "gymtrace.tracer_provider", default=None
)
_contextual_in_use = False
# Tracers of the providers integrations were handed, by provider (few: one per instrument() call).
_contextual_tracers: dict[int, tuple[trace.TracerProvider, trace.Tracer | None]] = {}

# Set by _setup at import: configures this process from GYMTRACE_PARENT when it never was (a worker
# started by a configured process). Called where a gym context from another process is continued.
inherit_hook: Callable[[], bool] | None = None
# Set when that happened: the flush each continued block ends with (workers often end without exit
# handlers: a pool's os._exit, a killed process).
flush_after_continuation: Callable[[], Any] | None = None


def inherit_parent_settings() -> bool:
    """Configure this process like the parent that started it, if it never was configured and the
    parent left its settings (``GYMTRACE_PARENT``). True when tracing is on afterwards."""
    if active_tracer() is not None:
        return True
    hook = inherit_hook
    return hook() if hook is not None else False


def active_tracer() -> trace.Tracer | None:
    provider: trace.TracerProvider | None
    if _contextual_in_use:
        given = _contextual.get()
        if given is not None:
            return tracer_for(given)
    if _overrides:
        provider = _overrides[-1]
    else:
        # The API's global, read without get_tracer_provider()'s os.environ lookup where the fence
        # (gymtrace._otel_private.provider) allows it; None: nothing set, which means off.
        provider = _global_provider()
        if provider is None:
            return None
    cache = _cache
    if provider is cache[0]:
        return cache[1]
    return _refresh(provider)


def _refresh(provider: trace.TracerProvider) -> trace.Tracer | None:
    global _cache
    tracer: trace.Tracer | None
    if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        # Nothing configured yet. The global provider can still be set later; get_tracer_provider()
        # then returns a different object and we land here again.
        tracer = None
    else:
        tracer = provider.get_tracer(c.INSTRUMENTATION_NAME, __version__)
        # The SDK hands out a NoOpTracer when OTEL_SDK_DISABLED=true.
        if isinstance(tracer, trace.NoOpTracer):
            tracer = None
    with _lock:
        _cache = (provider, tracer)
    return tracer


def tracer_for(provider: trace.TracerProvider) -> trace.Tracer | None:
    """gymtrace's tracer from ``provider``; None when it records nothing (a no-op or proxy provider,
    or the SDK disabled). Cached per provider."""
    entry = _contextual_tracers.get(id(provider))
    if entry is not None and entry[0] is provider:
        return entry[1]
    tracer: trace.Tracer | None = None
    if not isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        tracer = provider.get_tracer(c.INSTRUMENTATION_NAME, __version__)
        if isinstance(tracer, trace.NoOpTracer):
            tracer = None
    with _lock:
        _contextual_tracers[id(provider)] = (provider, tracer)
    return tracer


def set_contextual_provider(provider: trace.TracerProvider | None) -> contextvars.Token[Any]:
    """Make ``provider`` the one gymtrace scopes opened in this context go to; the token resets it."""
    global _contextual_in_use
    _contextual_in_use = True
    return _contextual.set(provider)


def reset_contextual_provider(token: contextvars.Token[Any]) -> None:
    _contextual.reset(token)


def push_provider(provider: trace.TracerProvider) -> None:
    with _lock:
        _overrides.append(provider)


def pop_provider(provider: trace.TracerProvider) -> None:
    with _lock:
        _overrides.remove(provider)


def current_provider() -> trace.TracerProvider:
    return _overrides[-1] if _overrides else trace.get_tracer_provider()


def _span_context_key() -> str | None:
    """The context key under which ``trace.set_span_in_context`` stores the span, or None.

    The key is private to opentelemetry-api (a ``create_key`` with a random suffix), so it is
    found through the public API: set a probe span into an empty context and see which key appeared.
    Knowing it lets ``Scope.start`` build a scope's context with one copy of the parent context
    instead of four (``set_value`` copies twice, and there are two values to set). ``None`` if
    the probe is not conclusive; callers then use ``set_span_in_context`` and ``set_value``.
    """
    try:
        probe = trace.NonRecordingSpan(trace.INVALID_SPAN_CONTEXT)
        keys = list(trace.set_span_in_context(probe, otel_context.Context()))
        if len(keys) != 1 or not isinstance(keys[0], str):
            return None
        if trace.get_current_span(otel_context.Context({keys[0]: probe})) is not probe:
            return None
        return keys[0]
    except Exception:  # noqa: BLE001 - an unexpected API change must only cost speed
        return None


SPAN_CONTEXT_KEY = _span_context_key()


def _context_variable() -> contextvars.ContextVar[otel_context.Context] | None:
    """The context variable OpenTelemetry's default runtime context keeps the current context in.

    The token ``attach`` returns names it (``Token.var``, public in ``contextvars``). Reading,
    setting and resetting it directly answers what ``get_current``/``attach``/``detach`` answer,
    each two Python calls cheaper, and every span does all three. ``None`` for any other runtime
    context (``OTEL_PYTHON_CONTEXT``): then the public calls are used.
    """
    try:
        current = otel_context.get_current()
        token = otel_context.attach(current)
        otel_context.detach(token)
        var = getattr(token, "var", None)
        if (
            isinstance(token, contextvars.Token)
            and isinstance(var, contextvars.ContextVar)
            and var.get() is current
        ):
            return var
    except Exception:  # noqa: BLE001 - an unexpected runtime context must only cost speed
        pass
    return None


_CONTEXT_VAR = _context_variable()

current_context: Callable[[], otel_context.Context]
attach: Callable[[otel_context.Context], object]
# ``detach`` without its Python frame, for the hottest exits: it may raise where ``detach`` logs
# (a token used twice or made in another context), so callers catch and hand over to ``detach``.
reset: Callable[[Any], object]
if _CONTEXT_VAR is not None:
    current_context = _CONTEXT_VAR.get
    attach = _CONTEXT_VAR.set
    reset = _CONTEXT_VAR.reset

    def detach(token: Any) -> None:
        """``otel_context.detach``: a token that cannot be reset (used twice, or made in another
        context) goes to OpenTelemetry's own detach, which logs the failure as it always does."""
        try:
            reset(token)
        except Exception:  # noqa: BLE001 - handed on to OpenTelemetry, which logs it
            otel_context.detach(token)

else:
    current_context = otel_context.get_current
    attach = otel_context.attach
    detach = reset = otel_context.detach


_fastpaths.register(
    "context variable",
    __name__,
    ("the ContextVar behind otel_context.attach() (Token.var)", "the key set_span_in_context() uses"),
    "otel_context.get_current/attach/detach and set_span_in_context/set_value (two calls more each)",
    lambda: (
        (["contextvars runtime context (Token.var)"] if _CONTEXT_VAR is None else [])
        + (["set_span_in_context's context key"] if SPAN_CONTEXT_KEY is None else [])
    ),
)

# -- IDs chosen by the caller --------------------------------------------------------------------------
#
# A span whose IDs another process (or a later pass) must know without being told: the NeMo Gym
# integration derives a rollout's trace and span IDs from its run and rollout key, so a resume pass
# hours later links to the attempt that failed. The ID generator configure() installs takes a
# pinned ID once, in the context that pinned it; every other span draws random IDs as before.
_pinned: contextvars.ContextVar[list[int | None] | None] = contextvars.ContextVar(
    "gymtrace_pinned_ids", default=None
)


# False until the first pin: the ID generator then skips the context variable (every span asks).
pinning = False
# Whether an integration pinned IDs (pinning stays on for good then), and how many short pins are
# held now: a sampled-out rollout's summary pins its IDs for one span, and must not leave every
# later span of the process asking the context variable (~0.1 µs a span, two per root).
_pinned_for_good = False
_held = 0
_held_lock = threading.Lock()


def pin_ids(trace_id: int | None, span_id: int | None) -> contextvars.Token[list[int | None] | None]:
    """The next root span started in this context gets ``trace_id``, the next span ``span_id``
    (each once; ``None``: drawn as usual). Undo with :func:`unpin_ids`."""
    global pinning, _pinned_for_good
    with _held_lock:  # so that a short pin ending meanwhile cannot turn the check off
        _pinned_for_good = pinning = True
    return _pinned.set([trace_id, span_id])


def unpin_ids(token: contextvars.Token[list[int | None] | None]) -> None:
    _pinned.reset(token)


def pin_for_one_span(trace_id: int | None, span_id: int | None) -> contextvars.Token[list[int | None] | None]:
    """:func:`pin_ids` for the one span started next in this context; undo with
    :func:`unpin_after_one_span`, which turns the ID generator's check off again unless another
    pin still needs it."""
    global pinning, _held
    with _held_lock:
        _held += 1
        pinning = True
    return _pinned.set([trace_id, span_id])


def unpin_after_one_span(token: contextvars.Token[list[int | None] | None]) -> None:
    global pinning, _held
    _pinned.reset(token)
    with _held_lock:
        _held -= 1
        pinning = _pinned_for_good or _held > 0


def take_pinned(which: int) -> int | None:
    """The pinned trace ID (``which=0``) or span ID (``1``), once; ``None`` when none is pinned."""
    pinned = _pinned.get()
    if pinned is None:
        return None
    value = pinned[which]
    pinned[which] = None
    return value
