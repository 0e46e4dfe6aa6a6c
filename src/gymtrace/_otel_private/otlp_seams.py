"""The SDK's OTLP exporters' private transport seams, probed once: whether gymtrace's exporters
(``gymtrace._sdk.otlp``), which subclass the SDK's, can hand it already encoded bytes.

gRPC: ``OTLPSpanExporter._export()``, ``_translate_data()``, ``_channel``, ``_stub``, ``_client``;
HTTP: ``_client.export(bytes)`` (1.45+). Without them the SDK's exporter runs with its own encoder
(the public fallback). The exporter classes themselves stay in ``gymtrace._sdk.otlp``: they set
those seams on ``self``, their own inherited fields.
"""

from __future__ import annotations

from typing import Any

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
