"""The exporters behind gymtrace's queues: OTLP (gRPC or HTTP, with the lean encoder) and the file of
OTLP/JSON lines. Built by ``configure()`` in the application's process, and by the encoder process
(``_sdk/export_process.py``) from the same settings."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gymtrace._model import environment as env
from gymtrace._model import settings as _settings
from gymtrace._model.tracefiles import SegmentWriter, compression_of, compressor
from gymtrace._sdk.otlp import encode_span_json, grpc_exporter, http_exporter, join_json_line

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExporter

SDK_HINT = "gymtrace.configure() needs the OpenTelemetry SDK and OTLP exporter: pip install 'gymtrace[sdk]'"


def file_exporter(
    path: str,
    line_spans: int = _settings.DEFAULT_MAX_EXPORT_BATCH_SIZE,
    compress: str = env.COMPRESS_NONE,
    rotate_bytes: int = 0,
) -> SpanExporter:
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class OtlpJsonLinesExporter(SpanExporter):
        """Appends OTLP/JSON ``ExportTraceServiceRequest`` lines to a file, one per ``line_spans``
        spans, all of one export in a single write: with ``compress``, one gzip member or zstd frame,
        into the file's segments (``_model/tracefiles.py``).

        The format is the Collector's ``file`` exporter's, so the file can be replayed into a
        Collector with the ``otlpjsonfile`` receiver. The queue hands this exporter everything
        queued at once; lines stay the configured batch size so no line grows with the backlog,
        and the one write is one GIL handoff however many lines it holds. It runs on the queue's
        worker thread or in the encoder process, so the compression does too: never on the
        application's threads (and zlib lets go of the GIL while it compresses).
        """

        def __init__(self, file_path: str, spans_per_line: int) -> None:
            self.path = file_path
            self.spans_per_line = max(1, spans_per_line)
            self._lock = threading.Lock()
            self._pack = compressor(compression_of(file_path) or compress)
            self._segments = SegmentWriter(file_path, compress, rotate_bytes)

        # The queue encodes each span as it ends, with this (a string holds nothing the cyclic
        # garbage collector tracks; a queued span holds a dozen containers): see _sdk/export.py.
        queued_form = staticmethod(encode_span_json)

        def export(self, spans: Sequence[ReadableSpan | tuple[Any, Any, str]]) -> SpanExportResult:
            step = self.spans_per_line
            text = "".join(
                join_json_line(map(_encoded, spans[i : i + step])) + "\n" for i in range(0, len(spans), step)
            )
            data = text.encode("utf-8")
            if self._pack is not None:
                data = self._pack(data)  # outside the lock: the other writer of the file goes on
            with self._lock:
                self._segments.write(data)
            return SpanExportResult.SUCCESS

        def shutdown(self) -> None:
            with self._lock:
                self._segments.close()

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return True

        def after_fork_in_child(self) -> None:
            # A lock the parent's export worker held at the fork is never released in the child.
            # The open file stays: appends from both processes land whole (O_APPEND), and each
            # moves to the next segment when the one they share is full.
            self._lock = threading.Lock()

    return OtlpJsonLinesExporter(path, line_spans)


def _encoded(item: Any) -> tuple[Any, Any, str]:
    """A queued item as the file writes it: encoded already (``queued_form``), or a span (a queue that
    does not encode as spans end: the encoder process's, or after an encoding error)."""
    return item if type(item) is tuple else encode_span_json(item)


def otlp_exporter(protocol: str, endpoint: str | None, headers: Mapping[str, str] | None) -> SpanExporter:
    # The SDK's exporters with gymtrace's lean encoder (_otlp.py): same transport, a sixth of the
    # encoding time on the export thread, which shares the GIL with the application.
    kwargs: dict[str, Any] = {}
    if headers:
        kwargs["headers"] = dict(headers)
    if endpoint is not None:
        kwargs["endpoint"] = endpoint
    try:
        if protocol == "grpc":
            return grpc_exporter(**kwargs)  # type: ignore[no-any-return]
        return http_exporter(**kwargs)  # type: ignore[no-any-return]
    except ImportError as exc:
        raise ImportError(SDK_HINT) from exc
