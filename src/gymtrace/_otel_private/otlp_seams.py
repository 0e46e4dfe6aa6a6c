"""The SDK's OTLP exporters with the lean encoder's bytes sent through their private transport seams.

gRPC: ``OTLPSpanExporter._export()``, ``_translate_data()``, ``_channel``, ``_stub``, ``_client``;
HTTP: ``_client.export(bytes)`` (1.45+). Each seam is probed once; without them the SDK's exporter
runs with its own encoder (the public fallback). The exporter classes live here, inside the fence,
because they subclass the SDK's exporters and set those inherited private fields;
``gymtrace._sdk.otlp`` re-exports them for the rest of gymtrace.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from gymtrace._otel_private import fastpaths as _fastpaths

# The encoder's requests for a batch: (the spans a request holds, the request's bytes), each request
# under the exporter's size bound. Given by gymtrace._sdk.otlp, which owns the encoding.
Requests = Callable[[Sequence[Any]], Iterable[tuple[list[Any], bytes]]]


def _undelivered(spans: Sequence[Any], delivered: list[Any]) -> list[Any]:
    sent = {id(span) for span in delivered}
    return [span for span in spans if id(span) not in sent]


_GRPC_SEAMS = ("OTLPSpanExporter._export()", "._translate_data()", "._channel", "._stub", "._client")


def _grpc_seams_missing(exporter_class: Any = None) -> list[str]:
    """What of the gRPC exporter's private seams this installation lacks (checked on a real
    instance once: the channel connects lazily, so nothing is sent)."""
    if exporter_class is None:
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        except ImportError:
            return ["opentelemetry-exporter-otlp-proto-grpc (not installed)"]
        exporter_class = OTLPSpanExporter
    cached = _SEAMS_CHECKED.get(exporter_class)
    if cached is not None:
        return cached
    missing = [
        f"OTLPSpanExporter.{n}()"
        for n in ("_export", "_translate_data")
        if not callable(getattr(exporter_class, n, None))
    ]
    if not missing:
        probe = exporter_class(endpoint="127.0.0.1:1", insecure=True)
        missing = [f"OTLPSpanExporter.{n}" for n in ("_channel", "_stub", "_client") if not hasattr(probe, n)]
        probe.shutdown()
    _SEAMS_CHECKED[exporter_class] = missing
    return missing


def _http_seams_missing() -> list[str]:
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        return ["opentelemetry-exporter-otlp-proto-http (not installed)"]
    probe = OTLPSpanExporter(endpoint="http://127.0.0.1:1/v1/traces")
    try:
        return (
            []
            if callable(getattr(getattr(probe, "_client", None), "export", None))
            else ["OTLPSpanExporter._client.export(bytes) (1.45+)"]
        )
    finally:
        probe.shutdown()  # type: ignore[no-untyped-call]  # the SDK leaves it unannotated


_SEAMS_CHECKED: dict[Any, list[str]] = {}


_GRPC_EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


# -- exporters -----------------------------------------------------------------------------------------


def _identity(data: bytes) -> bytes:
    return data


class _RawTraceServiceStub:
    """``TraceServiceStub`` that sends already serialised requests.

    The generated stub serialises a message object with ``SerializeToString``; this one passes
    the encoder's bytes through and decodes the response with the official class, and tells
    ``attempted`` whether each attempt went through (the SDK retries a failed one within the
    export's timeout, out of the export queue's sight).
    """

    def __init__(self, channel: Any, attempted: Callable[[bool], None]) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

        call = channel.unary_unary(
            _GRPC_EXPORT_METHOD,
            request_serializer=_identity,
            response_deserializer=ExportTraceServiceResponse.FromString,
        )

        def export(*args: Any, **kwargs: Any) -> Any:
            try:
                response = call(*args, **kwargs)
            except Exception:
                attempted(False)
                raise
            attempted(True)
            return response

        self.Export = export


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


def grpc_exporter(requests: Requests, **kwargs: Any) -> Any:
    """The SDK's OTLP/gRPC span exporter, sending the lean encoder's bytes (``requests``)."""
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
            # The last attempt to send failed (a refused connection): the SDK tries again within the
            # export's timeout, seconds during which the export queue must not hold its caller for
            # room (export.RoomWait). Cleared by the next attempt that goes through.
            self.attempt_failed = False
            # The mixin builds the stub from self._stub, now and on every reconnect.
            self._stub = functools.partial(_RawTraceServiceStub, attempted=self._attempted)
            self._client = self._stub(self._channel)

        def _attempted(self, ok: bool) -> None:
            self.attempt_failed = not ok

        def _translate_data(self, data: Any) -> Any:
            return data  # already a serialised request (see export)

        def export(self, spans: Sequence[Any]) -> Any:
            return SpanExportResult.FAILURE if self.export_partial(spans) else SpanExportResult.SUCCESS

        def export_partial(self, spans: Sequence[Any]) -> list[Any]:
            """Send ``spans`` in requests under the 4 MiB bound; the spans not delivered (those of
            the first request that failed and after), so a retry resends only them."""
            delivered: list[Any] = []
            for sent, request in requests(spans):
                if self._export(request) != SpanExportResult.SUCCESS:  # type: ignore[arg-type]
                    return _undelivered(spans, delivered)
                delivered.extend(sent)
            return []

    return LeanGrpcSpanExporter(**kwargs)


def http_exporter(requests: Requests, **kwargs: Any) -> Any:
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
            for sent, request in requests(spans):
                if not client.export(request).success:
                    return _undelivered(spans, delivered)
                delivered.extend(sent)
            return []

    return LeanHttpSpanExporter(**kwargs)
