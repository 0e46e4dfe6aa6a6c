"""ASGI middleware: continue the caller's trace and gym identity for the lifetime of each request.

Example (Starlette or FastAPI)::

    from gymtrace.integrations.asgi import GymTraceMiddleware
    from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware   # optional

    app = FastAPI()
    app.add_middleware(GymTraceMiddleware)       # inner: gym identity
    app = OpenTelemetryMiddleware(app)           # outer: the HTTP server span (optional)

Every span opened while the request is handled, including while a streaming response is being
sent and in background tasks, joins the caller's trace and carries its ``gym.rollout.id``,
``gym.episode.attempt``, ...; ``gymtrace.current()`` returns that identity.

**gymtrace makes no HTTP spans of its own.** HTTP server and client spans are the job of the
official OpenTelemetry instrumentations (``opentelemetry-instrumentation-asgi``/``-fastapi``,
``-httpx``, ``-aiohttp-client``), which follow the HTTP semantic conventions; this middleware only
adds the gym identity to the request's context. So there is never a duplicate server span, with
or without the official middleware:

- with ``OpenTelemetryMiddleware`` outside this one (recommended; ``FastAPIInstrumentor`` puts it
  outermost), that middleware extracts ``traceparent`` and starts a SERVER span; this middleware
  sees that span continuing the incoming trace, keeps it as the parent and adds the identity.
  ``IdentitySpanProcessor`` stamps the identity onto the server span from the request's baggage.
- without it, this middleware attaches the extracted remote context: the handler's spans are
  children of the caller's span.
- with it *inside* this one, the official middleware finds a current span and records an
  INTERNAL span instead of a SERVER span; parentage and identity stay right.

Non-HTTP scopes (``lifespan``) pass straight through.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace

# _with_remote_frame is the one private name an integration uses: the caller's scope continued on
# a chosen parent span, which no public function offers yet.
from gymtrace.propagation import _with_remote_frame, extract, identity_from_context

__all__ = ["GymTraceMiddleware"]

_logger = logging.getLogger("gymtrace")

_Scope = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
_Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
_ASGIApp = Callable[[_Scope, _Receive, _Send], Awaitable[None]]


def _request_context(headers: Any, current: otel_context.Context | None = None) -> otel_context.Context:
    """The context a request with ``headers`` runs in: the caller's trace and gym identity.

    If ``current`` already has a span in the incoming trace (an outer HTTP server middleware
    made it), that span stays the parent; otherwise the remote caller's span is the parent.
    """
    if current is None:
        current = otel_context.get_current()
    remote = extract(headers)
    identity = identity_from_context(remote)
    local = trace.get_current_span(current).get_span_context()
    incoming = trace.get_current_span(remote).get_span_context()
    if local.is_valid and (not incoming.is_valid or incoming.trace_id == local.trace_id):
        base = current
    elif incoming.is_valid:
        base = trace.set_span_in_context(trace.get_current_span(remote), current)
    else:
        base = trace.set_span_in_context(trace.INVALID_SPAN, current)
    # The caller's episode continues here with the chosen parent as its span (outcome records
    # recorded in this request hang under it).
    return _with_remote_frame(base, identity)


class GymTraceMiddleware:
    """Continue the caller's trace and gym identity for each HTTP or WebSocket request."""

    def __init__(self, app: _ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        if scope.get("type") not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        token = None
        try:
            token = otel_context.attach(_request_context(scope.get("headers") or ()))
        except Exception:
            _logger.warning(
                "gymtrace: GymTraceMiddleware could not continue the caller's trace", exc_info=True
            )
        try:
            await self.app(scope, receive, send)
        finally:
            if token is not None:
                otel_context.detach(token)
