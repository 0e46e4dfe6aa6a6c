"""httpx transports that send the trace and the gym identity with every request.

Example::

    import httpx
    from gymtrace.integrations.httpx import AsyncHttpxTransport, HttpxTransport

    client = httpx.Client(transport=HttpxTransport())
    async_client = httpx.AsyncClient(transport=AsyncHttpxTransport())

Each request gets ``traceparent``/``tracestate`` of the current span and, when it goes to a gym
destination (loopback, ``GYMTRACE_PROPAGATE_TO``, a server the framework calls its own), a
``baggage`` header with the gym identity; elsewhere only the keys of ``GYMTRACE_BAGGAGE_ALLOW``
go, never the identity. gymtrace makes no HTTP client spans: install the official
``opentelemetry-instrumentation-httpx`` for those. They compose without duplicates: its CLIENT
span becomes the ``traceparent`` parent, and because the transport runs that one request inside a
context whose baggage is what may go to its destination, its own injection sends the same.
``IdentitySpanProcessor`` stamps the identity onto its client spans. Needs ``gymtrace[httpx]``.
"""

from __future__ import annotations

from typing import Any

try:
    import httpx
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("gymtrace.integrations.httpx needs httpx: pip install 'gymtrace[httpx]'") from exc

from opentelemetry import context as otel_context

from gymtrace.instrumentation import inject_context, report_error
from gymtrace.propagation import with_identity

__all__ = ["AsyncHttpxTransport", "HttpxTransport"]


def _enter(request: httpx.Request) -> object:
    """Inject headers and attach the identity context; the token, or None if gymtrace failed."""
    try:
        ctx = with_identity(destination=request.url)  # identity only to gym destinations
        inject_context(request.headers, ctx)
        return otel_context.attach(ctx)
    except Exception as exc:  # noqa: BLE001 - telemetry must not break the request
        report_error("gymtrace.integrations.httpx transport", exc)
        return None


class HttpxTransport(httpx.BaseTransport):
    """Wraps ``transport`` (default ``httpx.HTTPTransport(**kwargs)``) for ``httpx.Client``."""

    def __init__(self, transport: httpx.BaseTransport | None = None, **kwargs: Any) -> None:
        self._transport = transport if transport is not None else httpx.HTTPTransport(**kwargs)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        token = _enter(request)
        try:
            return self._transport.handle_request(request)
        finally:
            if token is not None:
                otel_context.detach(token)  # type: ignore[arg-type]

    def close(self) -> None:
        self._transport.close()


class AsyncHttpxTransport(httpx.AsyncBaseTransport):
    """Wraps ``transport`` (default ``httpx.AsyncHTTPTransport(**kwargs)``) for ``httpx.AsyncClient``."""

    def __init__(self, transport: httpx.AsyncBaseTransport | None = None, **kwargs: Any) -> None:
        self._transport = transport if transport is not None else httpx.AsyncHTTPTransport(**kwargs)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        token = _enter(request)
        try:
            return await self._transport.handle_async_request(request)
        finally:
            if token is not None:
                otel_context.detach(token)  # type: ignore[arg-type]

    async def aclose(self) -> None:
        await self._transport.aclose()
