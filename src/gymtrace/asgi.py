"""Deprecated: the ASGI middleware moved to :mod:`gymtrace.integrations.asgi`.

This module re-exports it, with a ``DeprecationWarning``, for one release.
"""

from __future__ import annotations

import warnings

from gymtrace.integrations.asgi import GymTraceMiddleware

__all__ = ["GymTraceMiddleware"]

warnings.warn(
    "gymtrace.asgi is deprecated and will be removed in the next release; import"
    " GymTraceMiddleware from gymtrace.integrations.asgi",
    DeprecationWarning,
    stacklevel=2,
)
