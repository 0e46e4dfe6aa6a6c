"""The OTLP exporters that send the lean encoder's bytes.

The SDK's OTLP exporters build a protobuf message object per span, per attribute and per value,
then serialise the tree: ~60 µs per span of pure Python on the export thread, which holds the GIL
the application needs. gymtrace writes the protobuf wire format of ``ExportTraceServiceRequest``
straight from the SDK span's fields into bytes instead (``otlp_proto``: the wire primitives;
``otlp_encode``: spans, resources and requests; ``otlp_json``: the file exporter's JSON lines), so
the export thread holds the GIL for a fraction of that time. ``benchmarks/perf.py`` prints both
costs side by side.

The exporters here are the SDK's own OTLP exporters with only the encoding replaced: TLS, headers,
compression, timeouts, the ``OTEL_EXPORTER_OTLP_*`` variables and the SDK's transport retries
stay exactly theirs. The result decodes with the official ``opentelemetry-proto`` classes to the
same message the SDK encoder builds (``tests/test_otlp_encoder.py``). The encoders are re-exported
here: this module is what the rest of gymtrace imports.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gymtrace._otel_private import fastpaths as _fastpaths
from gymtrace._otel_private.otlp_seams import _GRPC_SEAMS, _grpc_seams_missing, _http_seams_missing
from gymtrace._otel_private.spanfields import last_object_cache
from gymtrace._sdk.otlp_encode import (
    MAX_REQUEST_BYTES,
    _undelivered,
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


_GRPC_EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


# -- exporters -----------------------------------------------------------------------------------------


def _identity(data: bytes) -> bytes:
    return data


class _RawTraceServiceStub:
    """``TraceServiceStub`` that sends already serialised requests.

    The generated stub serialises a message object with ``SerializeToString``; this one passes
    the encoder's bytes through and decodes the response with the official class.
    """

    def __init__(self, channel: Any) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

        self.Export = channel.unary_unary(
            _GRPC_EXPORT_METHOD,
            request_serializer=_identity,
            response_deserializer=ExportTraceServiceResponse.FromString,
        )


def register_fast_paths() -> None:
    """Declare this module's uses of private exporter names (probed when first read)."""
    _fastpaths.register(
        "lean OTLP/gRPC export",
        __name__,
        _GRPC_SEAMS,
        "the SDK's OTLP/gRPC exporter with its own encoder (~5x the encoding time per span)",
        _grpc_seams_missing,
    )
    _fastpaths.register(
        "lean OTLP/HTTP export",
        __name__,
        ("OTLPSpanExporter._client.export(bytes)",),
        "the SDK's OTLP/HTTP exporter with its own encoder (~5x the encoding time per span)",
        _http_seams_missing,
    )


def grpc_exporter(**kwargs: Any) -> Any:
    """The SDK's OTLP/gRPC span exporter, sending the lean encoder's bytes."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    if _grpc_seams_missing(OTLPSpanExporter):
        return OTLPSpanExporter(**kwargs)  # the SDK's own encoding (tests/test_fast_paths.py says so)

    class LeanGrpcSpanExporter(OTLPSpanExporter):
        # encode_requests keeps every request under MAX_REQUEST_BYTES, however many spans it is
        # handed: the export queue may hand it its whole backlog (_export.BatchExporter.max_drain).
        splits_requests = True

        def __init__(self, **kw: Any) -> None:
            super().__init__(**kw)
            # The mixin builds the stub from self._stub, now and on every reconnect.
            self._stub = _RawTraceServiceStub
            self._client = _RawTraceServiceStub(self._channel)  # type: ignore[assignment]

        def _translate_data(self, data: Any) -> Any:
            return data  # already a serialised request (see export)

        def export(self, spans: Sequence[Any]) -> Any:
            return SpanExportResult.FAILURE if self.export_partial(spans) else SpanExportResult.SUCCESS

        def export_partial(self, spans: Sequence[Any]) -> list[Any]:
            """Send ``spans`` in requests under the 4 MiB bound; the spans not delivered (those of
            the first request that failed and after), so a retry resends only them."""
            delivered: list[Any] = []
            for sent, request in encode_request_spans(spans, MAX_REQUEST_BYTES):
                if self._export(request) != SpanExportResult.SUCCESS:  # type: ignore[arg-type]
                    return _undelivered(spans, delivered)
                delivered.extend(sent)
            return []

    return LeanGrpcSpanExporter(**kwargs)


def http_exporter(**kwargs: Any) -> Any:
    """The SDK's OTLP/HTTP span exporter, posting the lean encoder's bytes.

    Uses the SDK's HTTP client (its retries, TLS, compression and headers) when it has the
    ``_client.export(bytes)`` seam of opentelemetry-exporter-otlp-proto-http 1.45+; older
    versions keep their stock encoding.
    """
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    class LeanHttpSpanExporter(OTLPSpanExporter):
        @property
        def splits_requests(self) -> bool:
            # Only the lean path splits at MAX_REQUEST_BYTES; the stock fallback sends one request.
            return callable(getattr(getattr(self, "_client", None), "export", None))

        def export(self, spans: Sequence[Any]) -> Any:
            return SpanExportResult.FAILURE if self.export_partial(spans) else SpanExportResult.SUCCESS

        def export_partial(self, spans: Sequence[Any]) -> list[Any]:
            """Like the gRPC exporter's: the spans not delivered, so a retry resends only them."""
            client = getattr(self, "_client", None)
            if getattr(self, "_shutdown", False) or not callable(getattr(client, "export", None)):
                return [] if super().export(spans) == SpanExportResult.SUCCESS else list(spans)
            assert client is not None
            delivered: list[Any] = []
            for sent, request in encode_request_spans(spans, MAX_REQUEST_BYTES):
                if not client.export(request).success:
                    return _undelivered(spans, delivered)
                delivered.extend(sent)
            return []

    return LeanHttpSpanExporter(**kwargs)
