"""Deprecated: the HTTP client helpers moved to :mod:`gymtrace.integrations.httpx` and
:mod:`gymtrace.integrations.aiohttp`.

This module re-exports them, with a ``DeprecationWarning``, for one release. httpx and aiohttp
stay optional: each is imported only when its helper is used.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

__all__ = ["AsyncHttpxTransport", "HttpxTransport", "aiohttp_trace_config"]

if TYPE_CHECKING:
    from gymtrace.integrations.aiohttp import aiohttp_trace_config
    from gymtrace.integrations.httpx import AsyncHttpxTransport, HttpxTransport

warnings.warn(
    "gymtrace.http is deprecated and will be removed in the next release; import HttpxTransport"
    " and AsyncHttpxTransport from gymtrace.integrations.httpx, aiohttp_trace_config from"
    " gymtrace.integrations.aiohttp",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> Any:
    if name in ("HttpxTransport", "AsyncHttpxTransport"):
        from gymtrace.integrations import httpx

        return getattr(httpx, name)
    if name == "aiohttp_trace_config":
        from gymtrace.integrations.aiohttp import aiohttp_trace_config

        return aiohttp_trace_config
    raise AttributeError(f"module 'gymtrace.http' has no attribute {name!r}")
