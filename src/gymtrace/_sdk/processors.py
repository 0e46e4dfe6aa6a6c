"""The exporting processors ``configure()`` hands the export stage, built from the resolved
settings: each exporter behind one of gymtrace's queues.

The exporters are OTLP (or MLflow / Phoenix, ``GYMTRACE_BACKEND``), console and file; the queue
is the thread queue, the encoder process or the auto queue that moves between them
(``GYMTRACE_ENCODER``), sized by the standard ``OTEL_BSP_*`` variables. Everything that can fail
(imports, exporter constructors) happens here, before ``configure()`` changes anything.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from gymtrace._content import otlp_batch_size
from gymtrace._model import settings as _settings
from gymtrace._sdk.export import BatchExporter
from gymtrace._sdk.export_auto import AutoExporter
from gymtrace._sdk.export_process import ProcessExporter
from gymtrace._sdk.export_targets import file_exporter as _file_exporter
from gymtrace._sdk.export_targets import otlp_exporter as _otlp_exporter
from gymtrace._sdk.state import _state


def build_processors(settings: _settings.Settings, headers: Mapping[str, str] | None) -> list[Any]:
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    # The standard batch-processor variables (OTEL_BSP_*) apply to gymtrace's queue too.
    processors: list[Any] = []
    for name in settings.exporters:
        if name == "otlp" and settings.backend != _settings.BACKEND_OTLP:
            # MLflow or Phoenix: mapped and scored on the queue's thread; no encoder process. Their
            # module (HTTP client, span mapping, the readers' outcomes) is imported only here.
            from gymtrace._sdk.backends import BackendExporter

            exporter: Any = BackendExporter(settings.backend, settings.endpoint, settings.experiment)
            target: dict[str, Any] = {}
        elif name == "otlp":
            exporter = _otlp_exporter(settings.protocol, settings.endpoint, headers)
            # What the encoder process needs to build the same exporter (GYMTRACE_ENCODER=process).
            target = {
                "kind": "otlp",
                "protocol": settings.protocol,
                "endpoint": settings.endpoint,
                "headers": dict(headers) if headers else None,
            }
        elif name == "console":
            exporter, target = ConsoleSpanExporter(), {}
        elif name == "file" and settings.file is not None:
            target = {
                "kind": "file",
                "path": settings.file,
                "line_spans": settings.max_export_batch_size,
                "compress": settings.file_compress,
                "rotate_bytes": settings.file_rotate_bytes,
            }
            exporter = _file_exporter(
                settings.file,
                settings.max_export_batch_size,
                settings.file_compress,
                settings.file_rotate_bytes,
            )
        else:
            continue
        batch_size = settings.max_export_batch_size
        queue: dict[str, Any] = {
            "name": name,
            "max_queue_size": settings.max_queue_size,
            "max_batch_size": otlp_batch_size(batch_size, settings) if name == "otlp" else batch_size,
            "schedule_delay": settings.schedule_delay,
            "shutdown_timeout": settings.flush_timeout,
            # gymtrace's OTLP exporters split requests at 4 MiB and the file exporter writes a
            # line per batch: each can take the whole backlog in one call (_export.py).
            "max_drain": settings.max_queue_size if _splits_requests(name, exporter) else None,
        }
        if target and settings.encoder == _settings.ENCODER_PROCESS:
            # The same queue and exporter in a child process (_export_process.py); this process's
            # exporter object is built anyway (its errors surface here) and is the fallback's.
            processors.append(
                ProcessExporter(target, queue, fallback=functools.partial(BatchExporter, exporter, **queue))
            )
        elif target and settings.encoder == _settings.ENCODER_AUTO:
            # The thread queue, moving to an encoder process when spans come fast (_export_auto.py).
            processors.append(AutoExporter(exporter, target, queue, rebind=_rebind_stage))
        else:
            processors.append(BatchExporter(exporter, **queue))
    return processors


def _rebind_stage() -> None:
    stage = _state.stage
    if stage is not None:
        stage.rebind()


def _splits_requests(name: str, exporter: Any) -> bool:
    return name == "file" or (name == "otlp" and bool(getattr(exporter, "splits_requests", False)))
