"""Outgoing HTTP requests that carry the trace and the gym identity (httpx and aiohttp).

Example::

    import httpx, aiohttp
    from gymtrace.http import HttpxTransport, AsyncHttpxTransport, aiohttp_trace_config

    client = httpx.Client(transport=HttpxTransport())
    async_client = httpx.AsyncClient(transport=AsyncHttpxTransport())
    session = aiohttp.ClientSession(trace_configs=[aiohttp_trace_config()])
    instrument_aiohttp()      # instead, beside opentelemetry-instrumentation-aiohttp-client

Each request gets ``traceparent``/``tracestate`` of the current span and a ``baggage`` header
with the gym identity only. gymtrace makes no HTTP client spans: install the official
``opentelemetry-instrumentation-httpx`` / ``-aiohttp-client`` for those. They compose without
duplicates: their CLIENT span becomes the ``traceparent`` parent, and because the transport runs
the request inside a context whose baggage is the gym identity, their own injection sends the
identity too. ``IdentitySpanProcessor`` stamps the identity onto their client spans. The official
aiohttp instrumentor is the exception: its trace config runs after the caller's and injects the
*current* context's baggage, so beside it use ``instrument_aiohttp()``, which runs each request
inside the context whose baggage is what may leave the process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["AsyncHttpxTransport", "HttpxTransport", "aiohttp_trace_config", "instrument_aiohttp"]

if TYPE_CHECKING:
    from gymtrace._aiohttp import aiohttp_trace_config
    from gymtrace._aiohttp import instrument as instrument_aiohttp
    from gymtrace._httpx import AsyncHttpxTransport, HttpxTransport


def __getattr__(name: str) -> Any:
    # httpx and aiohttp are optional: import each only when its integration is used.
    if name in ("HttpxTransport", "AsyncHttpxTransport"):
        from gymtrace import _httpx

        return getattr(_httpx, name)
    if name == "aiohttp_trace_config":
        from gymtrace._aiohttp import aiohttp_trace_config

        return aiohttp_trace_config
    if name == "instrument_aiohttp":
        from gymtrace._aiohttp import instrument

        return instrument
    raise AttributeError(f"module 'gymtrace.http' has no attribute {name!r}")
