"""The scope carrier: the small JSON-safe dict ``ActiveScope.carrier()`` gives for another process.

It holds only identity and span IDs (safe to store and log) and may travel through files and queues
for hours, so reading one validates everything. Apart from the activation because both sides use
it: the scope that writes it (``ActiveScope.carrier()``), and the episode (``continue_from=``,
``restored_from=``) and ``gymtrace.propagation`` that read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanContext, TraceFlags

from gymtrace._model.errors import GymTraceError
from gymtrace._model.ids import clean_identity

CARRIER_FORMAT = "gymtrace.carrier/1"


def span_ref(ctx: SpanContext) -> dict[str, Any]:
    return {
        "trace_id": trace.format_trace_id(ctx.trace_id),
        "span_id": trace.format_span_id(ctx.span_id),
        "sampled": bool(ctx.trace_flags.sampled),
    }


def _span_context(ref: Any) -> SpanContext | None:
    try:
        ctx = SpanContext(
            trace_id=int(ref["trace_id"], 16),
            span_id=int(ref["span_id"], 16),
            is_remote=True,
            trace_flags=TraceFlags(TraceFlags.SAMPLED if ref.get("sampled", True) else TraceFlags.DEFAULT),
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    return ctx if ctx.is_valid else None


def read_carrier(carrier: Any) -> tuple[dict[str, str | int], int, SpanContext | None, SpanContext | None]:
    """Validate a carrier (it may have travelled through files and queues for hours):
    ``(identity, next attempt, rollout span, previous episode span)``."""
    if not isinstance(carrier, Mapping) or carrier.get("format") != CARRIER_FORMAT:
        raise GymTraceError(f"not a gymtrace carrier (expected format {CARRIER_FORMAT!r}): {carrier!r:.120}")
    identity = clean_identity(carrier.get("identity") or {})
    next_attempt = carrier.get("next_attempt", 0)
    if isinstance(next_attempt, bool) or not isinstance(next_attempt, int) or next_attempt < 0:
        raise GymTraceError(f"carrier 'next_attempt' must be an int >= 0, got {next_attempt!r:.40}")
    rollout_span = _span_context(carrier.get("rollout_span") or {})
    episode_span = _span_context(carrier.get("episode_span") or {})
    return identity, next_attempt, rollout_span, episode_span
