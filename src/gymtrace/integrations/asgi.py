"""ASGI middleware: continue the caller's trace and gym identity for the lifetime of each request.

Example (Starlette or FastAPI)::

    from gymtrace.integrations.asgi import GymTraceMiddleware
    from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware   # optional

    app = FastAPI()
    app.add_middleware(GymTraceMiddleware)       # inner: gym identity
    app = OpenTelemetryMiddleware(app)           # outer: the HTTP server span (optional)

Every span opened while the request is handled, including while a streaming response is being
sent and in background tasks, joins the caller's trace and carries its ``gym.rollout.id``,
``gym.episode.attempt``, ...; ``gymtrace.current()`` returns that identity. A request whose caller
sent a trace context but no gym identity this process believes (a trainer with telemetry of its
own) is the exception for rollouts: one opened while it is handled is the root of its own trace,
linked to the caller's span (relation ``caller``).

**gymtrace makes no HTTP spans of its own.** HTTP server and client spans are the job of the
official OpenTelemetry instrumentations (``opentelemetry-instrumentation-asgi``/``-fastapi``,
``-httpx``, ``-aiohttp-client``), which follow the HTTP semantic conventions; this middleware only
adds the gym identity to the request's context. So there is never a duplicate server span, with
or without the official middleware:

- with ``OpenTelemetryMiddleware`` outside this one (recommended; ``FastAPIInstrumentor`` puts it
  outermost), that middleware extracts the headers and starts a SERVER span; this middleware
  reuses that extraction (the headers are parsed once), keeps the span as the parent, adds the
  identity (believed per ``GYMTRACE_TRUST_IDENTITY``) to the request's context and to the span.
- with FastAPI, add it with ``app.add_middleware``: FastAPI's own telemetry extracts the headers
  again and attaches a fresh context around its middleware stack, so a middleware wrapped around
  the FastAPI app from outside is lost.
- without it, this middleware attaches the extracted remote context: the handler's spans are
  children of the caller's span.
- with it *inside* this one, the official middleware finds a current span and records an
  INTERNAL span instead of a SERVER span; parentage and identity stay right.

Non-HTTP scopes (``lifespan``) pass straight through.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace

from gymtrace.instrumentation import (
    check_tracer_provider,
    continue_scope,
    identity_fallback,
    incoming_identity,
    innermost_scope,
    note_caller,
    report_error,
    set_identity_fallback,
    stamp_identity,
    use_tracer_provider,
)
from gymtrace.propagation import extract

__all__ = ["GymTraceMiddleware"]

_Scope = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
_Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
_ASGIApp = Callable[[_Scope, _Receive, _Send], Awaitable[None]]


def _first_baggage(headers: Any) -> str | None:
    """The first ``baggage`` header of ASGI ``(name, value)`` byte pairs, as the official
    middleware's getter takes it."""
    for name, value in headers:
        if isinstance(name, (bytes, bytearray)) and bytes(name).lower() == b"baggage":
            return bytes(value).decode("latin-1")
    return None


def _set_fallback_identity(read: Callable[[Any], dict[str, str | int]] | None) -> None:
    """Kept for callers written before gymtrace.instrumentation.set_identity_fallback existed."""
    set_identity_fallback(read)


def _with_fallback(ctx: otel_context.Context, headers: Any) -> otel_context.Context:
    # Where identity comes from when a request carries no believed gym baggage (NeMo Gym's headers
    # once gymtrace.integrations.nemo_gym.instrument() ran), unless the extraction continued a scope.
    read = identity_fallback()
    if read is None or innermost_scope(ctx) is not None:
        return ctx
    identity = read(headers)
    return continue_scope(ctx, identity) if identity else ctx


def _request_context(headers: Any, current: otel_context.Context | None = None) -> otel_context.Context:
    """The context a request with ``headers`` runs in: the caller's trace and gym identity.

    One extraction per request. If ``current`` already has a span (an outer HTTP
    server middleware extracted the headers and made it), that extraction is reused: the span stays
    the parent, the application baggage it extracted stays, and only the gym identity is read
    from the first ``baggage`` header (as the outer middleware read it), believed per
    ``GYMTRACE_TRUST_IDENTITY``, and stamped onto that span. Otherwise the headers are extracted
    here and the remote caller's span is the parent.
    """
    if current is None:
        current = otel_context.get_current()
    local = trace.get_current_span(current)
    if not local.get_span_context().is_valid:
        ctx = _with_fallback(extract(headers, current), headers)
        # A caller without a gym identity believed here (a trainer's span): the rollouts opened
        # for it link to that span rather than join its trace (issue 44).
        return ctx if innermost_scope(ctx) is not None else note_caller(ctx, headers)
    identity = incoming_identity(_first_baggage(headers), current)
    read = identity_fallback()
    if not identity and read is not None:
        identity = read(headers)
    # The outer middleware's span got what OpenTelemetry's propagator decoded (a baggage property
    # inside the value, "+" as a space); this is the identity the request runs with.
    stamp_identity(local, identity)
    return continue_scope(current if identity else note_caller(current, headers), identity)


class GymTraceMiddleware:
    """Continue the caller's trace and gym identity for each HTTP or WebSocket request.

    ``tracer_provider``: where the gymtrace scopes the handler opens go (default: the global
    provider). The middleware itself makes no spans.
    """

    def __init__(self, app: _ASGIApp, *, tracer_provider: trace.TracerProvider | None = None) -> None:
        check_tracer_provider(tracer_provider, "GymTraceMiddleware()")
        self.app = app
        self.tracer_provider = tracer_provider

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        if scope.get("type") not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        token = None
        try:
            token = otel_context.attach(_request_context(scope.get("headers") or ()))
        except Exception as exc:  # noqa: BLE001 - telemetry must not break the request
            report_error("gymtrace.integrations.asgi GymTraceMiddleware", exc)
        try:
            with use_tracer_provider(self.tracer_provider):
                await self.app(scope, receive, send)
        finally:
            if token is not None:
                otel_context.detach(token)
