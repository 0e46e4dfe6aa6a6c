"""The provider's private parts: the API's global provider, read on every decorated call, and the
span processors' ``_on_ending`` hook.

While ``OTEL_PYTHON_TRACER_PROVIDER`` was not set at import, the API's module global
``_TRACER_PROVIDER`` is read directly, by a C-level reader chosen here once, instead of through
``trace.get_tracer_provider()``, which looks the variable up in ``os.environ`` on every call while
no provider is set. If a release renames the global, the public call is chosen instead, and
``gymtrace`` reports the fast path as off. What it saves: docs/performance.md, "Free when off".
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

from opentelemetry import trace

from gymtrace._otel_private import fastpaths as _fastpaths

_NAME = "_TRACER_PROVIDER"


def _readable() -> bool:
    return hasattr(trace, _NAME) and "OTEL_PYTHON_TRACER_PROVIDER" not in os.environ


# The global provider, or None when none was set (the public fallback never answers None: it hands
# out the proxy provider, which the caller treats as "off" too).
global_tracer_provider: Callable[[], trace.TracerProvider | None] = (
    functools.partial(vars(trace).get, _NAME) if _readable() else trace.get_tracer_provider
)

_fastpaths.register(
    "global provider read",
    __name__,
    ("opentelemetry.trace._TRACER_PROVIDER",),
    "trace.get_tracer_provider() on every decorated call (~1 µs while no provider is set)",
    lambda: [] if hasattr(trace, _NAME) else ["opentelemetry.trace._TRACER_PROVIDER"],
)


def ending_hook(processor: object) -> Callable[[Any], None] | None:
    """The SDK's private ``_on_ending(span)`` hook of a span processor (called by the SDK's provider
    just before a span ends, since 1.2x), which gymtrace's stage of processors calls on for the
    processors it holds; None when the processor has none (then there is nothing to call)."""
    hook = getattr(processor, "_on_ending", None)
    return hook if callable(hook) else None
