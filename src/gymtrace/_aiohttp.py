"""An aiohttp ``TraceConfig`` that sends the trace and the gym identity with every request."""

from __future__ import annotations

from types import SimpleNamespace

try:
    import aiohttp
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "gymtrace.http.aiohttp_trace_config needs aiohttp: pip install 'gymtrace[aiohttp]'"
    ) from exc

from gymtrace._errors import internal_error
from gymtrace.propagation import inject


async def _on_request_start(
    session: aiohttp.ClientSession, context: SimpleNamespace, params: aiohttp.TraceRequestStartParams
) -> None:
    # The current context is the caller's, or the official instrumentation's CLIENT span when its
    # trace config ran first: either way the right parent. Its trace config, appended after ours
    # by the instrumentor, injects again with its span and keeps our baggage unless the context
    # has baggage of its own.
    try:
        inject(params.headers, continuation=False)
    except Exception as exc:  # noqa: BLE001 - telemetry must not break the request
        internal_error("gymtrace.http aiohttp trace config", exc)


def aiohttp_trace_config() -> aiohttp.TraceConfig:
    """A ``TraceConfig`` for ``aiohttp.ClientSession(trace_configs=[...])``."""
    config = aiohttp.TraceConfig()
    config.on_request_start.append(_on_request_start)
    return config
