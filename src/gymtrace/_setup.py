"""``configure()``, ``shutdown()`` and ``force_flush()``: the only code that imports the SDK.

Instrumentation works under any ``TracerProvider``; this module is optional setup for applications
that have none. It never replaces a provider the application already set: it adds
:class:`~gymtrace.IdentitySpanProcessor` to it and leaves exporting to the application.
"""

from __future__ import annotations

import logging
import os
import random
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opentelemetry import trace

from gymtrace import _environment as env
from gymtrace import _lifecycle
from gymtrace._content import UNCHANGED, configure_content, export_settings, otlp_batch_size
from gymtrace._errors import InvalidArgumentError, set_strict
from gymtrace._export import DEFAULT_MAX_BATCH_SIZE, DEFAULT_MAX_QUEUE_SIZE, BatchExporter
from gymtrace._levels import set_trace_per
from gymtrace._otlp import encode_json_line, grpc_exporter, http_exporter
from gymtrace._processor import IdentitySpanProcessor
from gymtrace._steps import StepPolicy
from gymtrace._steps import policy_from as step_policy_from
from gymtrace._steps import set_policy as set_step_policy

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.sampling import Sampler

logger = logging.getLogger("gymtrace")

_PROTOCOLS = ("grpc", "http/protobuf")
_SDK_HINT = "gymtrace.configure() needs the OpenTelemetry SDK and OTLP exporter: pip install 'gymtrace[sdk]'"


def _import_sdk() -> Any:
    try:
        import opentelemetry.sdk.trace as sdk_trace
    except ImportError as exc:  # pragma: no cover - exercised in the SDK-less test environment
        raise ImportError(_SDK_HINT) from exc
    return sdk_trace


@dataclass(frozen=True)
class Configuration:
    """What ``configure()`` set up; returned so callers and tests can see the resolved settings."""

    service_name: str | None = None
    exporters: tuple[str, ...] = ()
    endpoint: str | None = None
    protocol: str | None = None
    file: str | None = None
    owns_provider: bool = False
    disabled: bool = False
    headers: Mapping[str, str] = field(default_factory=dict)


class _ExportStage:
    """The exporting processors of the provider gymtrace set, replaceable by a later configure().

    The SDK cannot remove a span processor from a provider, and the global provider can be set only
    once per process, so reconfiguring swaps what this stage delegates to.
    """

    def __init__(self) -> None:
        self._processors: tuple[Any, ...] = ()
        self._lock = threading.Lock()

    def replace(self, processors: Sequence[Any]) -> None:
        with self._lock:
            old, self._processors = self._processors, tuple(processors)
        for processor in old:
            processor.shutdown()

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        for processor in self._processors:
            processor.on_start(span, parent_context=parent_context)

    def _on_ending(self, span: Any) -> None:
        for processor in self._processors:
            on_ending = getattr(processor, "_on_ending", None)
            if on_ending is not None:
                on_ending(span)

    def on_end(self, span: Any) -> None:
        for processor in self._processors:
            processor.on_end(span)

    def processors(self) -> tuple[Any, ...]:
        return self._processors

    def shutdown(self) -> None:
        self.replace(())

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return all(p.force_flush(timeout_millis) for p in self._processors)


class _State:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.configuration: Configuration | None = None
        self.provider: TracerProvider | None = None  # the provider gymtrace created, if any
        self.stage: _ExportStage | None = None
        self.settings: tuple[Any, ...] | None = None


_state = _State()


def make_id_generator() -> Any:
    from opentelemetry.sdk.trace.id_generator import IdGenerator

    class UnseedableIdGenerator(IdGenerator):
        """Trace and span IDs from a private RNG seeded from the OS, reseeded in forked children.

        The SDK's default draws from the global ``random`` module, so RL code that calls
        ``random.seed(0)`` in every worker repeats trace IDs (opentelemetry-python#4376).
        """

        def __init__(self) -> None:
            self._random = random.Random(os.urandom(32))
            os.register_at_fork(after_in_child=self._reseed)

        def _reseed(self) -> None:
            self._random.seed(os.urandom(32))

        def generate_span_id(self) -> int:
            value = self._random.getrandbits(64)
            while value == 0:
                value = self._random.getrandbits(64)
            return value

        def generate_trace_id(self) -> int:
            value = self._random.getrandbits(128)
            while value == 0:
                value = self._random.getrandbits(128)
            return value

        def is_trace_id_random(self) -> bool:
            return True

    return UnseedableIdGenerator()


def _file_exporter(path: str) -> SpanExporter:
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class OtlpJsonLinesExporter(SpanExporter):
        """Appends one OTLP/JSON ``ExportTraceServiceRequest`` per batch to a file.

        The format is the Collector's ``file`` exporter's, so the file can be replayed into a
        Collector with the ``otlpjsonfile`` receiver.
        """

        def __init__(self, file_path: str) -> None:
            self.path = file_path
            self._lock = threading.Lock()
            self._file: Any = None

        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            line = encode_json_line(spans)
            with self._lock:
                if self._file is None:
                    Path(self.path).parent.mkdir(parents=True, exist_ok=True)
                    self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open
                self._file.write(line + "\n")
                self._file.flush()
            return SpanExportResult.SUCCESS

        def shutdown(self) -> None:
            with self._lock:
                if self._file is not None:
                    self._file.close()
                    self._file = None

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return True

    return OtlpJsonLinesExporter(path)


def _otlp_exporter(protocol: str, endpoint: str | None, headers: Mapping[str, str] | None) -> SpanExporter:
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
        raise ImportError(_SDK_HINT) from exc


def _http_traces_url(base: str) -> str:
    # OTEL_EXPORTER_OTLP_ENDPOINT is a base URL; the HTTP exporter posts to {base}/v1/traces.
    return base.rstrip("/") + "/v1/traces"


def _resolve(
    *,
    endpoint: str | None,
    protocol: str | None,
    file: str | os.PathLike[str] | bool | None,
    console: bool | None,
) -> tuple[list[str], str | None, str, str | None]:
    environ = os.environ
    wanted = {
        name.strip().lower() for name in environ.get(env.OTEL_TRACES_EXPORTER, "").split(",") if name.strip()
    }
    protocol = (
        protocol
        or environ.get(env.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL)
        or environ.get(env.OTEL_EXPORTER_OTLP_PROTOCOL)
        or "grpc"
    ).strip()
    if protocol not in _PROTOCOLS:
        raise InvalidArgumentError(
            f"gymtrace.configure(): argument 'protocol' must be one of {_PROTOCOLS}, got {protocol!r}"
        )
    if endpoint is not None:
        if not isinstance(endpoint, str) or not endpoint:
            raise InvalidArgumentError(
                f"gymtrace.configure(): argument 'endpoint' must be a URL string, got {endpoint!r}"
            )
        resolved_endpoint: str | None = endpoint
        if protocol == "http/protobuf" and not endpoint.rstrip("/").endswith("/v1/traces"):
            resolved_endpoint = _http_traces_url(endpoint)
    elif environ.get(env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT):
        resolved_endpoint = environ[env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT]
    elif environ.get(env.OTEL_EXPORTER_OTLP_ENDPOINT):
        base = environ[env.OTEL_EXPORTER_OTLP_ENDPOINT]
        resolved_endpoint = _http_traces_url(base) if protocol == "http/protobuf" else base
    else:
        resolved_endpoint = None

    exporters: list[str] = []
    if resolved_endpoint is not None or "otlp" in wanted:
        exporters.append("otlp")
    if console if console is not None else "console" in wanted:
        exporters.append("console")
    if file is False:
        path = None
    elif file is not None and file is not True:
        path = os.fspath(file)
    elif environ.get(env.GYMTRACE_FILE):
        path = environ[env.GYMTRACE_FILE]
    elif file is True or (not exporters and "none" not in wanted):
        path = env.DEFAULT_FILE  # the embedded default: no server needed
    else:
        path = None
    if path is not None:
        exporters.append("file")
    unknown = wanted - {"otlp", "console", "none"}
    if unknown:
        logger.warning(
            "gymtrace: OTEL_TRACES_EXPORTER names exporters gymtrace does not build: %s", sorted(unknown)
        )
    return exporters, resolved_endpoint, protocol, path


def configure(
    *,
    service_name: str | None = None,
    endpoint: str | None = None,
    protocol: str | None = None,
    headers: Mapping[str, str] | None = None,
    file: str | os.PathLike[str] | bool | None = None,
    console: bool | None = None,
    sampler: Sampler | None = None,
    trace_per: str | None = None,
    strict: bool | None = None,
    capture_content: str | bool | None = None,
    redact_content: Callable[[str, Any], Any] | None = None,
    step_policy: str | StepPolicy | None = None,
) -> Configuration:
    """Set up tracing for gymtrace. Optional: instrumentation works under any TracerProvider.

    Exporters, each resolved as argument > ``GYMTRACE_*`` > ``OTEL_*`` > default:

    - **OTLP** when ``endpoint`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` /
      ``OTEL_EXPORTER_OTLP_ENDPOINT``) is set or ``OTEL_TRACES_EXPORTER`` names ``otlp``;
      ``protocol`` is ``grpc`` (default, like opentelemetry-python's distro) or ``http/protobuf``;
      TLS and auth headers come from ``headers`` or the standard ``OTEL_EXPORTER_OTLP_*`` variables.
    - **console** when ``console=True`` or ``OTEL_TRACES_EXPORTER`` names ``console``.
    - **file** of OTLP/JSON lines at ``file`` or ``GYMTRACE_FILE``; when nothing else is
      configured it is the embedded default, ``./gymtrace-traces.jsonl`` (``file=False`` turns it
      off; ``OTEL_TRACES_EXPORTER=none`` turns every exporter off).

    ``service_name`` falls back to ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES``, then
    ``gymtrace``. The sampler defaults to the SDK's reading of ``OTEL_TRACES_SAMPLER``. With
    ``OTEL_SDK_DISABLED=true`` nothing is set up and decorated calls cost next to nothing.

    ``capture_content`` (a ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` mode or a bool) and
    ``redact_content`` (a hook) set the content policy, see :func:`gymtrace.configure_content`.
    With capture on, OTLP export batches are capped so every request stays under 4 MiB.

    ``step_policy`` (``GYMTRACE_STEP_POLICY``) says what a ``gymtrace.step`` records: ``"all"``
    (default, every step a span: an LLM agent loop) or ``"aggregate"`` (a simulator: step count and
    duration statistics on the owner's span, a bounded sample of steps as spans), or a
    :class:`gymtrace.StepPolicy` with the sampling parameters.

    Idempotent: the same call twice does nothing; a different call replaces gymtrace's exporters.
    If the application already set a TracerProvider, gymtrace never replaces it: it adds
    :class:`~gymtrace.IdentitySpanProcessor` to it and leaves exporting to the application.
    """
    if strict is not None:
        set_strict(strict)
    if step_policy is not None or os.environ.get(env.GYMTRACE_STEP_POLICY):
        set_step_policy(step_policy_from(step_policy))
    if trace_per is not None:
        set_trace_per(trace_per)
    elif os.environ.get(env.GYMTRACE_TRACE_PER):
        set_trace_per(os.environ[env.GYMTRACE_TRACE_PER].strip().lower())
    if capture_content is not None or redact_content is not None:
        configure_content(
            capture=UNCHANGED if capture_content is None else capture_content,
            redact=UNCHANGED if redact_content is None else redact_content,
        )
    if env.env_flag(os.environ.get(env.OTEL_SDK_DISABLED)):
        logger.info("gymtrace: OTEL_SDK_DISABLED is set; tracing stays off")
        return Configuration(disabled=True)

    if sampler is None and os.environ.get(env.GYMTRACE_SAMPLE_RATIO):
        sampler = _sampler_from_env()
    exporters, endpoint_used, protocol_used, path = _resolve(
        endpoint=endpoint, protocol=protocol, file=file, console=console
    )
    settings = (
        service_name,
        tuple(exporters),
        endpoint_used,
        protocol_used,
        path,
        tuple(sorted((headers or {}).items())),
        _sampler_key(sampler),
        export_settings(),  # content capture lowers the OTLP batch size
    )
    with _state.lock:
        if _state.settings == settings and _state.configuration is not None:
            return _state.configuration
        sdk_trace = _import_sdk()
        existing = trace.get_tracer_provider()
        if _state.provider is None and not isinstance(existing, trace.ProxyTracerProvider):
            return _adopt(existing, sdk_trace, settings)
        if _state.provider is None:
            _state.provider = _new_provider(sdk_trace, service_name, sampler)
        provider = _state.provider
        assert _state.stage is not None
        _state.stage.replace(_processors(exporters, endpoint_used, protocol_used, path, headers))
        _lifecycle.install(_flush_at_exit)
        resolved_name = str(provider.resource.attributes.get("service.name", ""))
        if service_name is not None and service_name != resolved_name:
            logger.warning(
                "gymtrace: configure(service_name=%r) after the provider was created as %r; the"
                " resource of a TracerProvider cannot change, so spans keep %r",
                service_name,
                resolved_name,
                resolved_name,
            )
        _state.configuration = Configuration(
            service_name=resolved_name,
            exporters=tuple(exporters),
            endpoint=endpoint_used if "otlp" in exporters else None,
            protocol=protocol_used if "otlp" in exporters else None,
            file=path,
            owns_provider=True,
            headers=dict(headers or {}),
        )
        _state.settings = settings
        logger.info("gymtrace: tracing to %s", _describe(_state.configuration))
        return _state.configuration


def _sampler_from_env() -> Sampler:
    from gymtrace.sampling import RolloutSampler

    raw = os.environ[env.GYMTRACE_SAMPLE_RATIO]
    try:
        ratio = float(raw)
    except ValueError:
        raise InvalidArgumentError(
            f"{env.GYMTRACE_SAMPLE_RATIO} must be a number in [0, 1], got {raw!r}"
        ) from None
    return RolloutSampler(ratio, by=os.environ.get(env.GYMTRACE_SAMPLE_BY, "rollout").strip().lower())


def _sampler_key(sampler: Sampler | None) -> object:
    # Two equal env-built samplers are the same setting; a user's sampler object is itself.
    return sampler.get_description() if sampler is not None else None


def _new_provider(sdk_trace: Any, service_name: str | None, sampler: Sampler | None) -> TracerProvider:
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource

    resource = Resource.create({SERVICE_NAME: service_name} if service_name else {})
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: env.DEFAULT_SERVICE_NAME}))
    from gymtrace._leanspan import GymTracerProvider

    # The SDK's provider, with gymtrace's own spans on the lean path (_leanspan.py): only here,
    # where gymtrace owns the provider; an application's provider is never changed.
    provider: Any = GymTracerProvider(resource=resource, sampler=sampler, id_generator=make_id_generator())
    provider.add_span_processor(IdentitySpanProcessor())
    _state.stage = _ExportStage()
    provider.add_span_processor(_state.stage)
    trace.set_tracer_provider(provider)
    return provider  # type: ignore[no-any-return]


def _env_number(name: str, default: float, *, minimum: float) -> float:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        raise InvalidArgumentError(f"{name} must be a number, got {raw!r}") from None
    if value < minimum:
        raise InvalidArgumentError(f"{name} must be >= {minimum}, got {raw!r}")
    return value


def _processors(
    exporters: Sequence[str],
    endpoint: str | None,
    protocol: str,
    path: str | None,
    headers: Mapping[str, str] | None,
) -> list[Any]:
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    # The standard batch-processor variables apply to gymtrace's queue too.
    queue_size = int(_env_number(env.OTEL_BSP_MAX_QUEUE_SIZE, DEFAULT_MAX_QUEUE_SIZE, minimum=1))
    batch_size = int(_env_number(env.OTEL_BSP_MAX_EXPORT_BATCH_SIZE, DEFAULT_MAX_BATCH_SIZE, minimum=1))
    delay = _env_number(env.OTEL_BSP_SCHEDULE_DELAY, 500, minimum=0) / 1000
    flush_timeout = _env_number(env.GYMTRACE_FLUSH_TIMEOUT, 5.0, minimum=0)
    processors: list[Any] = []
    for name in exporters:
        if name == "otlp":
            exporter: Any = _otlp_exporter(protocol, endpoint, headers)
        elif name == "console":
            exporter = ConsoleSpanExporter()
        elif name == "file" and path is not None:
            exporter = _file_exporter(path)
        else:
            continue
        processors.append(
            BatchExporter(
                exporter,
                name=name,
                max_queue_size=queue_size,
                max_batch_size=otlp_batch_size(batch_size) if name == "otlp" else batch_size,
                schedule_delay=delay,
                shutdown_timeout=flush_timeout,
            )
        )
    return processors


def _flush_at_exit() -> None:
    # Each queue flushes within the GYMTRACE_FLUSH_TIMEOUT it was built with (read once, in
    # _processors); an exit is no time to parse the environment again.
    stage = _state.stage
    if stage is not None:
        for processor in stage.processors():
            processor.force_flush(int(processor.shutdown_timeout * 1000))


def export_stats() -> list[Any]:
    """Per exporter: spans finished, exported, queued and dropped (with why) since configure().

    Every span that will never be delivered is counted here and logged at shutdown; nothing is
    dropped silently.
    """
    stage = _state.stage
    return [p.stats() for p in stage.processors()] if stage is not None else []


def _adopt(existing: trace.TracerProvider, sdk_trace: Any, settings: tuple[Any, ...]) -> Configuration:
    """The application set its own provider: add identity stamping, never exporters."""
    if isinstance(existing, sdk_trace.TracerProvider):
        if not getattr(existing, "_gymtrace_identity_added", False):
            existing.add_span_processor(IdentitySpanProcessor())
            existing._gymtrace_identity_added = True
        logger.warning(
            "gymtrace: the application already set a TracerProvider; gymtrace adds its"
            " IdentitySpanProcessor to it and does not add exporters or replace it, so the"
            " endpoint/protocol/file settings of configure() are not applied"
        )
    else:
        logger.warning(
            "gymtrace: the application's TracerProvider (%s) is not an OpenTelemetry SDK provider;"
            " gymtrace cannot add IdentitySpanProcessor to it. Add it yourself to stamp gym identity"
            " onto other libraries' spans",
            type(existing).__name__,
        )
    resource = getattr(existing, "resource", None)
    name = str(resource.attributes.get("service.name", "")) if resource is not None else None
    configuration = Configuration(service_name=name, owns_provider=False)
    _state.configuration = configuration
    _state.settings = settings
    return configuration


def _describe(configuration: Configuration) -> str:
    parts = []
    for name in configuration.exporters:
        if name == "otlp":
            parts.append(
                f"OTLP/{configuration.protocol} {configuration.endpoint or '(exporter default endpoint)'}"
            )
        elif name == "file":
            parts.append(f"file {configuration.file}")
        else:
            parts.append(name)
    return ", ".join(parts) or "no exporter"


def force_flush(timeout_millis: int = 30000) -> bool:
    """Export every finished span now. True when all exporters finished within the timeout."""
    provider = _state.provider if _state.provider is not None else trace.get_tracer_provider()
    flush = getattr(provider, "force_flush", None)
    return bool(flush(timeout_millis)) if flush is not None else True


def shutdown() -> None:
    """Flush and stop gymtrace's exporters. A later ``configure()`` starts new ones.

    The global TracerProvider stays (OpenTelemetry allows setting it once per process); until the
    next ``configure()`` its spans are not exported.
    """
    with _state.lock:
        if _state.stage is not None:
            _state.stage.shutdown()
        _state.configuration = None
        _state.settings = None
