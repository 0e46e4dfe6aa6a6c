"""The OTLP exporters that send the lean encoder's bytes.

The SDK's OTLP exporters build a protobuf message object per span, per attribute and per value,
then serialise the tree: ~60 µs per span of pure Python on the export thread, which holds the GIL
the application needs. gymtrace writes the protobuf wire format of ``ExportTraceServiceRequest``
straight from the SDK span's fields into bytes instead (``otlp_proto``: the wire primitives;
``otlp_encode``: spans, resources and requests; ``otlp_json``: the file exporter's JSON lines), so
the export thread holds the GIL for a fraction of that time. ``benchmarks/perf.py`` prints both
costs side by side.

The exporters (built inside the fence, ``_otel_private.otlp_seams``, because they set the SDK
exporters' private transport fields; re-exported here) are the SDK's own OTLP exporters with only
the encoding replaced: TLS, headers, compression, timeouts, the ``OTEL_EXPORTER_OTLP_*`` variables
and the SDK's transport retries stay exactly theirs. The result decodes with the official ``opentelemetry-proto`` classes to the
same message the SDK encoder builds (``tests/test_otlp_encoder.py``). The encoders are re-exported
here: this module is what the rest of gymtrace imports.
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
from gymtrace._sdk.otlp_json import encode_json_line

__all__ = [
    "MAX_REQUEST_BYTES",
    "encode_json_line",
    "encode_request",
    "encode_request_spans",
    "encode_requests",
    "encode_span",
    "grpc_exporter",
    "http_exporter",
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
