"""What is switched on in this process: :func:`instrument`'s options, the tracer provider
:func:`instrument_stack` was given and whether FastAPI's operation spans stay, the lock both switch
under, and whether NeMo Gym's own telemetry spans a group (then gymtrace opens no second span for
it).

Shared by the client patches, the driver's passes and the servers, so it sits below all of them.
"""

from __future__ import annotations

import threading
from typing import Any

OPERATION_SPANS_ENV = "GYMTRACE_NEMO_GYM_OPERATION_SPANS"
"""``true`` keeps the three spans FastAPI's own telemetry makes inside every request of a NeMo Gym
server (``fastapi.dependencies``, ``fastapi.endpoint``, ``fastapi.serialization``); default
``false``: the request's server span stays, those three are not made."""


class _Options:
    body = False
    path = False
    provider: Any = None  # the tracer_provider instrument_stack() was given, None: the global one
    operation_spans = False  # keep FastAPI's operation spans in NeMo Gym's servers


_options = _Options()
_lock = threading.Lock()


def _own_telemetry(group: str) -> bool:
    """Whether NeMo Gym's own telemetry (nemo-lens) spans ``group``: then gymtrace opens no second
    span for that work (its spans are named gym.rollout / gym.verify too)."""
    try:
        from nemo_gym.telemetry._fallbacks import (  # type: ignore[import-not-found,unused-ignore]
            is_span_group_enabled,
        )

        return bool(is_span_group_enabled(group))
    except Exception:  # noqa: BLE001 - an older or newer NeMo Gym without it: ours are the only spans
        return False
