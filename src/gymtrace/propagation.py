"""Carry a trace and its gym identity across process boundaries.

The W3C ``traceparent``/``tracestate`` headers carry the trace; W3C ``baggage`` carries the gym
identity keys and nothing else (baggage travels on every outgoing request, model providers
included). Both go through ``opentelemetry.propagate``, so ``OTEL_PROPAGATORS`` is honoured.

Example::

    # client side
    headers = gymtrace.propagation.inject({})
    requests.post(url, json=task, headers=headers)

    # server side
    with gymtrace.propagation.attach(request.headers):
        handle(task)                      # spans here join the client's trace and rollout

    # child process or sandbox
    subprocess.run(cmd, env={**os.environ, **gymtrace.propagation.env_carrier()})
    # ...and in the child:  with gymtrace.propagation.attach(os.environ): ...
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import baggage, propagate
from opentelemetry import context as otel_context

from gymtrace import _constants as c
from gymtrace._scope import FRAME_KEY, ActiveScope, current_frame

__all__ = ["attach", "env_carrier", "extract", "identity_from_context", "inject"]

# Identity values arriving from outside are bounded: an ID is short printable text.
_MAX_ID_LENGTH = 256
_MAX_INT = 1_000_000_000
_PRINTABLE = re.compile(r"^[\x20-\x7e\u00a0-\U0010ffff]+$")
_ENV_NAMES = {"traceparent": "TRACEPARENT", "tracestate": "TRACESTATE", "baggage": "BAGGAGE"}
REMOTE_KIND = "remote"


def _context_with_identity(ctx: otel_context.Context) -> otel_context.Context:
    frame = ctx.get(FRAME_KEY)
    if not isinstance(frame, ActiveScope):
        return ctx
    for key, value in frame.identity.items():
        ctx = baggage.set_baggage(key, str(value), ctx)
    return ctx


def inject(
    carrier: MutableMapping[str, str] | None = None, context: otel_context.Context | None = None
) -> MutableMapping[str, str]:
    """Write ``traceparent``, ``tracestate`` and the gym identity (``baggage``) into ``carrier``.

    Returns the carrier (a new dict when none is given).
    """
    if carrier is None:
        carrier = {}
    ctx = context if context is not None else otel_context.get_current()
    propagate.inject(carrier, context=_context_with_identity(ctx))
    return carrier


def _clean(key: str, raw: object) -> str | int | None:
    if not isinstance(raw, str) or not raw or len(raw) > _MAX_ID_LENGTH or not _PRINTABLE.match(raw):
        return None
    if key in c.INT_IDENTITY_KEYS:
        if not raw.isdigit() or len(raw) > 10:
            return None
        number = int(raw)
        return number if number <= _MAX_INT else None
    return raw


def clean_identity(entries: Mapping[str, object]) -> dict[str, str | int]:
    """Keep the gym identity keys whose values are short printable text (or small ints)."""
    identity: dict[str, str | int] = {}
    for key in c.IDENTITY_KEYS:
        if key in entries:
            raw = entries[key]
            value = _clean(key, str(raw) if isinstance(raw, int) and not isinstance(raw, bool) else raw)
            if value is not None:
                identity[key] = value
    return identity


def identity_from_context(ctx: otel_context.Context) -> dict[str, str | int]:
    """The gym identity carried in a context's baggage, validated (bad values are dropped)."""
    return clean_identity(baggage.get_all(ctx))


def _normalized(carrier: Mapping[str, Any]) -> dict[str, str]:
    # Environment variables are upper case (TRACEPARENT); HTTP header mappings may be any case.
    out: dict[str, str] = {}
    for key, value in carrier.items():
        if isinstance(key, str) and key.lower() in _ENV_NAMES and isinstance(value, str):
            out[key.lower()] = value
    return out


def extract(carrier: Mapping[str, Any], context: otel_context.Context | None = None) -> otel_context.Context:
    """A context that continues the trace and gym identity described by ``carrier``.

    Garbage is ignored: an invalid ``traceparent`` gives a context without a remote parent, and
    identity values that are not short printable text (or non-negative integers) are dropped.
    """
    ctx = propagate.extract(_normalized(carrier), context=context)
    identity = identity_from_context(ctx)
    if identity:
        frame = ActiveScope(REMOTE_KIND, None)
        frame.identity = identity
        ctx = otel_context.set_value(FRAME_KEY, frame, ctx)
    return ctx


@contextmanager
def attach(carrier: Mapping[str, Any]) -> Iterator[otel_context.Context]:
    """Continue the remote trace and gym identity in ``carrier`` for the duration of the block."""
    ctx = extract(carrier)
    token = otel_context.attach(ctx)
    try:
        yield ctx
    finally:
        otel_context.detach(token)


def env_carrier(context: otel_context.Context | None = None) -> dict[str, str]:
    """``TRACEPARENT``/``TRACESTATE``/``BAGGAGE`` for a child process's environment.

    Follows the OpenTelemetry environment-variable carrier specification; the child continues with
    ``gymtrace.propagation.attach(os.environ)``.
    """
    headers = inject({}, context)
    return {_ENV_NAMES[k]: v for k, v in headers.items() if k in _ENV_NAMES}


def current_identity() -> dict[str, str | int]:
    frame = current_frame()
    return dict(frame.identity) if frame is not None else {}
