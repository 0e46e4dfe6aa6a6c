"""The OTLP exporters that send the lean encoder's bytes.

gymtrace writes the protobuf wire format of ``ExportTraceServiceRequest`` straight from the SDK
span's fields (``otlp_proto``: wire primitives; ``otlp_encode``: spans, resources and requests;
``otlp_json``: the file exporter's lines) instead of building the SDK's message objects, so the
export thread holds the GIL for a fraction of the time (docs/performance.md, "Encoding off the
critical path"). The exporters (built inside the fence, ``_otel_private.otlp_seams``) are the SDK's
own with only the encoding replaced: TLS, headers, compression, timeouts, the
``OTEL_EXPORTER_OTLP_*`` variables and transport retries stay theirs. The result decodes with
``opentelemetry-proto`` to the message the SDK builds (``tests/test_otlp_encoder.py``). This module
is what the rest of gymtrace imports.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gymtrace._otel_private import otlp_seams as _seams
from gymtrace._otel_private.otlp_seams import register_fast_paths
from gymtrace._otel_private.spanfields import last_object_cache
from gymtrace._sdk.otlp_encode import (
    MAX_REQUEST_BYTES,
    encode_request,
    encode_request_spans,
    encode_requests,
    encode_span,
)
from gymtrace._sdk.otlp_json import encode_json_line, encode_span_json, join_json_line

__all__ = [
    "MAX_REQUEST_BYTES",
    "encode_json_line",
    "encode_request",
    "encode_request_spans",
    "encode_requests",
    "encode_span",
    "encode_span_json",
    "grpc_exporter",
    "http_exporter",
    "join_json_line",
    "last_object_cache",
    "register_fast_paths",
]


def _requests(spans: Sequence[Any]) -> list[tuple[list[Any], bytes]]:
    # MAX_REQUEST_BYTES read per batch, so the bound is this module's (a test lowers it here).
    return encode_request_spans(spans, MAX_REQUEST_BYTES)


def grpc_exporter(**kwargs: Any) -> Any:
    """The SDK's OTLP/gRPC span exporter, sending the lean encoder's bytes."""
    return _seams.grpc_exporter(_requests, **kwargs)


def http_exporter(**kwargs: Any) -> Any:
    """The SDK's OTLP/HTTP span exporter, posting the lean encoder's bytes."""
    return _seams.http_exporter(_requests, **kwargs)
