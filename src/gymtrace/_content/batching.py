"""OTLP export batch sizing: with content capture on, every export request stays under 4 MiB."""

from __future__ import annotations

import logging

from gymtrace._content.policy import (
    GRPC_MESSAGE_LIMIT,
    REQUEST_OVERHEAD,
    SPAN_OVERHEAD,
    capture_mode,
    max_span_bytes,
)
from gymtrace._model import settings as _settings
from gymtrace._model.errors import first_time
from gymtrace._model.settings import NO_CONTENT

logger = logging.getLogger("gymtrace")

__all__ = ["export_batch_limit", "export_settings", "otlp_batch_size"]


def export_batch_limit(max_span_bytes: int) -> int:
    """The most spans one OTLP export request may carry so that it stays under 4 MiB.

    ``(4 MiB - 64 KiB request overhead) // (span budget + 8 KiB per-span overhead)``. With the
    default 32 KiB budget: ``4_128_768 // 40_960 = 100`` spans, and a full request is at most
    ``100 * 40_960 + 65_536 = 4_161_536`` bytes, under ``4_194_304``.
    """
    return max(1, (GRPC_MESSAGE_LIMIT - REQUEST_OVERHEAD) // (max_span_bytes + SPAN_OVERHEAD))


def otlp_batch_size(configured: int, settings: _settings.Settings | None = None) -> int:
    """The OTLP export batch size ``configure()`` uses: ``configured``, lowered while capture is on
    so a batch of spans with full content budgets stays under gRPC's 4 MiB message limit."""
    if capture_mode(settings) == NO_CONTENT:
        return configured
    limit = export_batch_limit(max_span_bytes(settings))
    if configured > limit and first_time(("content batch size", configured, limit)):
        logger.info(
            "gymtrace: content capture is on; OTLP export batches are limited to %d spans (from %d)"
            " so each request stays under 4 MiB",
            limit,
            configured,
        )
    return min(configured, limit)


def export_settings(settings: _settings.Settings | None = None) -> tuple[bool, int]:
    """What of the content policy shapes the export pipeline (part of configure()'s settings)."""
    return capture_mode(settings) != NO_CONTENT, max_span_bytes(settings)
