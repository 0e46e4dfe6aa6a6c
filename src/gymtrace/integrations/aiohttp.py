"""An aiohttp ``TraceConfig`` that sends the trace and the gym identity with every request.

Example::

    import aiohttp
    from gymtrace.integrations.aiohttp import aiohttp_trace_config

    session = aiohttp.ClientSession(trace_configs=[aiohttp_trace_config()])

Each request gets ``traceparent``/``tracestate`` and a ``baggage`` header with the gym identity
only; the official ``opentelemetry-instrumentation-aiohttp-client`` makes the CLIENT spans beside
it. Needs ``gymtrace[aiohttp]``.
"""

from __future__ import annotations

from types import SimpleNamespace

try:
    import aiohttp
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("gymtrace.integrations.aiohttp needs aiohttp: pip install 'gymtrace[aiohttp]'") from exc

from gymtrace.propagation import inject

__all__ = ["aiohttp_trace_config"]


async def _on_request_start(
    session: aiohttp.ClientSession, context: SimpleNamespace, params: aiohttp.TraceRequestStartParams
) -> None:
    # The current context is the caller's, or the official instrumentation's CLIENT span when its
    # trace config ran first: either way the right parent. Its trace config, appended after ours
    # by the instrumentor, injects again with its span and keeps our baggage unless the context
    # has baggage of its own.
    inject(params.headers, continuation=False)  # never raises: inject() contains its own failures


def aiohttp_trace_config() -> aiohttp.TraceConfig:
    """A ``TraceConfig`` for ``aiohttp.ClientSession(trace_configs=[...])``."""
    config = aiohttp.TraceConfig()
    config.on_request_start.append(_on_request_start)
    return config
