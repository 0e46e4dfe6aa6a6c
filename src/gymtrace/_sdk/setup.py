"""``configure()``, ``shutdown()`` and ``force_flush()``: the only code that imports the SDK.

Instrumentation works under any ``TracerProvider``; this module is optional setup for applications
that have none. It never replaces a provider the application already set: it adds
:class:`~gymtrace.IdentitySpanProcessor` to it and leaves exporting to the application.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import glob
import json
import logging
import os
import random
import signal
import threading
import uuid
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opentelemetry import trace

from gymtrace import _constants as c
from gymtrace._content import (
    UNCHANGED,
    apply_content_changes,
    content_changes,
    export_settings,
    otlp_batch_size,
    reset_content_policy,
)
from gymtrace._identity.processor import IdentitySpanProcessor
from gymtrace._identity.trust import trust_overrides
from gymtrace._live import markers as _live
from gymtrace._model import environment as env
from gymtrace._model import errors as _errors
from gymtrace._model import settings as _settings
from gymtrace._model.errors import InvalidArgumentError, reset_seen
from gymtrace._otel_private import fastpaths as _fastpaths
from gymtrace._otel_private.provider import ending_hook
from gymtrace._scopes import frame as _frame
from gymtrace._scopes import levels as _levels
from gymtrace._scopes import tracing as _tracing
from gymtrace._scopes.steps import StepPolicy
from gymtrace._scopes.steps import policy_from as step_policy_from
from gymtrace._scopes.steps import reset_policy as reset_step_policy
from gymtrace._scopes.steps import set_policy as set_step_policy
from gymtrace._scopes.tracing import active_tracer, current_provider
from gymtrace._sdk import lifecycle as _lifecycle
from gymtrace._sdk import otlp as _otlp
from gymtrace._sdk.backends import BackendExporter, flush_scores, score_stats
from gymtrace._sdk.export import BatchExporter
from gymtrace._sdk.export_auto import AutoExporter
from gymtrace._sdk.export_process import ProcessExporter
from gymtrace._sdk.export_targets import SDK_HINT as _SDK_HINT
from gymtrace._sdk.export_targets import file_exporter as _file_exporter
from gymtrace._sdk.export_targets import otlp_exporter as _otlp_exporter

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import Sampler

logger = logging.getLogger("gymtrace")

_PROTOCOLS = ("grpc", "http/protobuf")


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


# gymtrace's own export queues: they do nothing when a span starts or is ending.
_QUEUES = (AutoExporter, BatchExporter, ProcessExporter)


class _ExportStage:
    """The exporting processors of the provider gymtrace set, replaceable by a later configure().

    The SDK cannot remove a span processor from a provider, and the global provider can be set only
    once per process, so reconfiguring swaps what this stage delegates to.
    """

    def __init__(self) -> None:
        self._processors: tuple[Any, ...] = ()
        self._lock = threading.Lock()
        # In a child of a bare os.fork(): each rollout's spans are exported before its end returns
        # (see flush_each_rollout). Never in the process that called configure(): its binding,
        # and so its per-span and per-rollout cost, is the same whether this exists or not.
        self._flush_rollouts = False
        self._bind()

    def replace(self, processors: Sequence[Any]) -> None:
        with self._lock:
            old, self._processors = self._processors, tuple(processors)
            self._bind()
        for processor in old:
            processor.shutdown()

    def _bind(self) -> None:
        # Called for every span, so bound once per configuration: gymtrace's queues do nothing at
        # start or ending (skipped), and a single queue's on_end is called without this stage's
        # loop in between. Instance attributes, so the provider's lookup finds them first.
        processors = self._processors
        starts = tuple(p.on_start for p in processors if not isinstance(p, _QUEUES))
        endings = tuple(e for p in processors if not isinstance(p, _QUEUES) and (e := ending_hook(p)))
        ends = tuple(p.on_end for p in processors)
        self.on_start = self._fan_start(starts) if starts else _ignore_start
        self._on_ending = self._fan(endings) if endings else _ignore
        on_end = ends[0] if len(ends) == 1 else self._fan(ends)
        self.on_end = self._flushing(on_end) if self._flush_rollouts and ends else on_end

    def flush_each_rollout(self, on: bool) -> None:
        """In a child of a bare ``os.fork()``, which usually ends with ``os._exit()`` and so runs no
        exit hook: every rollout (and every span with no parent in this process) is exported
        before its end returns, bounded by the flush timeout. A ``multiprocessing`` child turns
        this off again: its exit hook flushes (_lifecycle)."""
        with self._lock:
            self._flush_rollouts = on
            self._bind()

    def _flushing(self, on_end: Callable[[Any], None]) -> Callable[[Any], None]:
        def end(span: Any) -> None:
            on_end(span)
            parent = span.parent
            if span.name == c.SPAN_ROLLOUT or parent is None or parent.is_remote:
                self._flush_forked_child()

        return end

    def _flush_forked_child(self) -> None:
        late = [p for p in self._processors if not p.force_flush(int(p.shutdown_timeout * 1000))]
        if late:
            # An exporter that cannot keep up (a Collector away) must not hold up every rollout:
            # said once, then this child's spans wait for its exit, as anywhere else.
            logger.warning(
                "gymtrace: a forked child's flush at the end of a rollout did not finish within"
                " GYMTRACE_FLUSH_TIMEOUT (%s); its spans are no longer flushed per rollout, so"
                " call gymtrace.force_flush() before os._exit()",
                ", ".join(str(getattr(p, "name", type(p).__name__)) for p in late),
            )
            self.flush_each_rollout(False)

    @staticmethod
    def _fan(calls: tuple[Callable[[Any], None], ...]) -> Callable[[Any], None]:
        def fan(span: Any) -> None:
            for call in calls:
                call(span)

        return fan

    @staticmethod
    def _fan_start(calls: tuple[Callable[..., None], ...]) -> Callable[..., None]:
        def fan(span: Any, parent_context: Any = None) -> None:
            for call in calls:
                call(span, parent_context=parent_context)

        return fan

    def rebind(self) -> None:
        """Bind again: a processor's ``on_end`` changed (an AutoExporter moved to its process)."""
        with self._lock:
            self._bind()

    def processors(self) -> tuple[Any, ...]:
        return self._processors

    def shutdown(self) -> None:
        self.replace(())

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return all(p.force_flush(timeout_millis) for p in self._processors)


def _ignore(span: Any) -> None:
    return None


def _ignore_start(span: Any, parent_context: Any = None) -> None:
    return None


class _State:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.configuration: Configuration | None = None
        self.provider: TracerProvider | None = None  # the provider gymtrace created, if any
        self.stage: _ExportStage | None = None
        self.key: tuple[Any, ...] | None = None  # what the current configuration was built from
        # The MeterProvider gymtrace set (OTLP to the spans' endpoint) when the application had none.
        self.meter_provider: Any = None
        # Configured from GYMTRACE_PARENT (a worker of a configured process), not by its own code.
        self.inherited = False


_state = _State()


# Every ID generator alive in this process. One fork hook reseeds them all: a hook per generator
# (one per capture_spans() block) could never be unregistered and would keep each one alive.
_GENERATORS: weakref.WeakSet[Any] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A forked child gets new locks for gymtrace's own module state: one a parent's thread held at
    the fork (an export worker, a thread configuring or logging) would never be released, and the
    child's first use would hang. And its ID generators are reseeded."""
    _settings._lock = threading.RLock()
    _tracing._lock = threading.Lock()
    _errors._seen_lock = threading.Lock()
    _frame._counter_lock = threading.Lock()
    _state.lock = threading.RLock()
    if _state.stage is not None:
        _state.stage._lock = threading.Lock()
        # A bare os.fork() child usually leaves through os._exit(), which runs no hook: its rollouts
        # are exported as they end (multiprocessing's children turn this off: their exit flushes).
        _state.stage.flush_each_rollout(True)
    for generator in list(_GENERATORS):
        generator.reseed()


os.register_at_fork(after_in_child=_after_fork_in_child)


def make_id_generator() -> Any:
    from opentelemetry.sdk.trace.id_generator import IdGenerator

    class UnseedableIdGenerator(IdGenerator):
        """Trace and span IDs from a private RNG seeded from the OS, reseeded in forked children.

        The SDK's default draws from the global ``random`` module, so RL code that calls
        ``random.seed(0)`` in every worker repeats trace IDs (opentelemetry-python#4376).
        """

        def __init__(self) -> None:
            self._random = random.Random(os.urandom(32))

        def reseed(self) -> None:
            self._random.seed(os.urandom(32))

        def generate_span_id(self) -> int:
            if _tracing.pinning:
                pinned = _tracing.take_pinned(1)
                if pinned is not None:
                    return pinned
            value = self._random.getrandbits(64)
            while value == 0:
                value = self._random.getrandbits(64)
            return value

        def generate_trace_id(self) -> int:
            if _tracing.pinning:
                pinned = _tracing.take_pinned(0)
                if pinned is not None:
                    return pinned
            value = self._random.getrandbits(128)
            while value == 0:
                value = self._random.getrandbits(128)
            return value

        def is_trace_id_random(self) -> bool:
            return True

    generator = UnseedableIdGenerator()
    _GENERATORS.add(generator)
    return generator


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
    trust_identity: str | None = None,
    identity_secret: str | None = None,
    baggage_allow: str | Sequence[str] | None = None,
    step_policy: str | StepPolicy | None = None,
    encoder: str | None = None,
    heartbeat: float | None = None,
    step_metrics: bool | None = None,
    backend: str | None = None,
    experiment: str | None = None,
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

    ``trust_identity`` (``all``, ``none``, ``signed``; ``GYMTRACE_TRUST_IDENTITY``),
    ``identity_secret`` (``GYMTRACE_IDENTITY_SECRET``) and ``baggage_allow``
    (``GYMTRACE_BAGGAGE_ALLOW``) set which incoming gym identity is believed and which application
    baggage is forwarded; see docs/distributed.md, "Trusting incoming identity".
    ``step_policy`` (``GYMTRACE_STEP_POLICY``) says what a ``gymtrace.step`` records: ``"all"``
    (default, every step a span: an LLM agent loop) or ``"aggregate"`` (a simulator: step count and
    duration statistics on the owner's span, a bounded sample of steps as spans), or a
    :class:`gymtrace.StepPolicy` with the sampling parameters.
    ``encoder`` (``GYMTRACE_ENCODER``) says where the OTLP and file exporters encode and send:
    ``"auto"`` (default: a thread of this process, moving to an encoder process once spans end
    faster than ~5,000 a second when the process may use two CPUs or more), ``"thread"`` (always
    the thread) or ``"process"`` (a child process fed with plain records from the start; see
    docs/performance.md).
    ``heartbeat`` (``GYMTRACE_HEARTBEAT``, seconds, default 10; ``0`` off) is the interval of the
    live markers of open rollouts that ``gymtrace live`` reads; ``step_metrics``
    (``GYMTRACE_STEP_METRICS``) adds the ``gym.step.duration`` histogram to the rollout and episode
    metrics (see docs/live-and-metrics.md). When the application set no MeterProvider and spans go
    over OTLP, the metrics go to the same endpoint.

    Idempotent: the same call twice does nothing; a different call replaces gymtrace's exporters.
    If the application already set a TracerProvider, gymtrace never replaces it: it adds
    :class:`~gymtrace.IdentitySpanProcessor` to it and leaves exporting to the application.
    """
    # Validate and resolve everything first (settings, content policy, sampler, exporters), then
    # apply: a call that raises leaves every setting as it was.
    if strict is not None and not isinstance(strict, bool):
        raise InvalidArgumentError(
            f"gymtrace.configure(): argument 'strict' must be a bool, got {strict!r:.80}"
        )
    if heartbeat is not None and (
        isinstance(heartbeat, bool)
        or not isinstance(heartbeat, (int, float))
        or not heartbeat >= 0
        or heartbeat == float("inf")
    ):
        raise InvalidArgumentError(
            f"gymtrace.configure(): argument 'heartbeat' must be a number of seconds >= 0, got {heartbeat!r:.80}"
        )
    if step_metrics is not None and not isinstance(step_metrics, bool):
        raise InvalidArgumentError(
            f"gymtrace.configure(): argument 'step_metrics' must be a bool, got {step_metrics!r:.80}"
        )
    if trace_per is not None and trace_per not in _settings.TRACE_PER:
        raise InvalidArgumentError(
            f"gymtrace.configure(): argument 'trace_per' must be one of {_settings.TRACE_PER}, got {trace_per!r:.80}"
        )
    overrides, policy_changes = content_changes(
        capture=UNCHANGED if capture_content is None else capture_content,
        redact=UNCHANGED if redact_content is None else redact_content,
    )
    if strict is not None:
        overrides["strict"] = strict
    if trace_per is not None:
        overrides["trace_per_run"] = trace_per == "run"
    if heartbeat is not None:
        overrides["heartbeat"] = float(heartbeat)
    if step_metrics is not None:
        overrides["step_metrics"] = step_metrics
    overrides.update(trust_overrides(mode=trust_identity, secret=identity_secret, allow=baggage_allow))
    settings = _settings.resolve(
        endpoint=endpoint,
        protocol=protocol,
        file=file,
        console=console,
        service_name=service_name,
        encoder=encoder,
        backend=backend,
        experiment=experiment,
        overrides=overrides,
    )
    # Validated here with the rest, its variables read with the rest; made active in _apply. Left
    # as it is when neither the argument nor the variable (a valid one) says anything.
    step = (
        step_policy_from(step_policy, settings)
        if step_policy is not None or settings.step_policy_chosen
        else None
    )
    if settings.sdk_disabled:
        _apply(settings, overrides, policy_changes, step)
        logger.info("gymtrace: OTEL_SDK_DISABLED is set; tracing stays off")
        with _state.lock:
            _state.configuration = Configuration(disabled=True)
            _state.key = None
        return _state.configuration
    if settings.unknown_exporters:
        logger.warning(
            "gymtrace: OTEL_TRACES_EXPORTER names exporters gymtrace does not build: %s",
            list(settings.unknown_exporters),
        )
    if sampler is None and settings.sample_ratio is not None:
        from gymtrace._sdk.sampler import RolloutSampler  # needs the SDK, imported only when used

        sampler = RolloutSampler(settings.sample_ratio, by=settings.sample_by)
    key = (
        service_name,
        settings.exporters,
        settings.endpoint,
        settings.protocol,
        settings.file,
        tuple(sorted((headers or {}).items())),
        _sampler_key(sampler),
        export_settings(settings),  # content capture lowers the OTLP batch size
        (
            settings.max_queue_size,
            settings.max_export_batch_size,
            settings.schedule_delay,
            settings.flush_timeout,
        ),
        settings.encoder,
        (settings.backend, settings.experiment),
    )
    with _state.lock:
        if _state.key == key and _state.configuration is not None:
            _apply(settings, overrides, policy_changes, step)
            return _state.configuration
        sdk_trace = _import_sdk()
        existing = trace.get_tracer_provider()
        if _state.provider is None and not isinstance(existing, trace.ProxyTracerProvider):
            _apply(settings, overrides, policy_changes, step)
            return _adopt(existing, sdk_trace, key)
        # Everything that can fail (imports, exporter constructors) happens before anything changes.
        processors = _processors(settings, headers)
        _apply(settings, overrides, policy_changes, step)
        if _state.provider is None:
            _state.provider = _new_provider(sdk_trace, settings.service_name, sampler)
        else:
            _keep_sampler(_state.provider, sampler)
        provider = _state.provider
        assert _state.stage is not None
        _state.stage.replace(processors)
        _meter_provider(settings, headers)
        _lifecycle.install(_flush_at_exit, _in_multiprocessing_child)
        resolved_name = str(provider.resource.attributes.get("service.name", ""))
        if service_name is not None and service_name != resolved_name:
            logger.warning(
                "gymtrace: configure(service_name=%r) after the provider was created as %r; the"
                " resource of a TracerProvider cannot change, so spans keep %r",
                service_name,
                resolved_name,
                resolved_name,
            )
        exporters = settings.exporters
        _state.configuration = Configuration(
            service_name=resolved_name,
            exporters=exporters,
            endpoint=settings.endpoint if "otlp" in exporters else None,
            protocol=settings.protocol if "otlp" in exporters else None,
            file=settings.file,
            owns_provider=True,
            headers=dict(headers or {}),
        )
        _state.key = key
        logger.info("gymtrace: tracing to %s", _describe(_state.configuration))
        _export_to_children(settings, resolved_name)
        return _state.configuration


def _meter_provider(settings: _settings.Settings, headers: Mapping[str, str] | None) -> None:
    """The metrics (``_metrics``) over OTLP to the spans' endpoint, when the application set no
    MeterProvider; one it set is never replaced, and without OTLP nothing is set up."""
    from opentelemetry import metrics

    if "otlp" not in settings.exporters or _state.meter_provider is not None:
        return
    if settings.backend != _settings.BACKEND_OTLP:
        return  # MLflow and Phoenix take traces, not metrics (their /v1/metrics answers 404)
    # Until someone sets one, the API hands out its proxy provider (a private class, so by name).
    if type(metrics.get_meter_provider()).__name__ != "_ProxyMeterProvider":
        return  # the application's
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    if settings.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import (  # type: ignore[assignment]
            OTLPMetricExporter,
        )
    endpoint = settings.endpoint
    if endpoint is not None and settings.protocol != "grpc":
        # The traces URL (…/v1/traces) names the Collector; its metrics path is beside it.
        endpoint = endpoint.rstrip("/").removesuffix("/v1/traces") + "/v1/metrics"
    exporter = OTLPMetricExporter(endpoint=endpoint, headers=dict(headers) if headers else None)
    provider = trace.get_tracer_provider()
    resource = getattr(provider, "resource", None)
    # Flushed by gymtrace's exit hook within GYMTRACE_FLUSH_TIMEOUT like the spans, not by the
    # SDK's own, which waits up to 30 s for an unreachable Collector.
    meter_provider = MeterProvider(
        metric_readers=[PeriodicExportingMetricReader(exporter)],
        shutdown_on_exit=False,
        **({"resource": resource} if resource is not None else {}),
    )
    metrics.set_meter_provider(meter_provider)
    _state.meter_provider = meter_provider
    atexit.register(_export_metrics_at_exit)


def _export_metrics_at_exit() -> None:
    # After the heartbeat thread's exit hook (registered later, at the first rollout) handed over
    # the last counts; bounded like the spans' flush.
    with _errors.guard("the exit export of the gym.* metrics", may_raise=False):
        if _state.meter_provider is not None:
            _state.meter_provider.force_flush(int(_settings.active.flush_timeout * 1000))


def _export_to_children(settings: _settings.Settings, service_name: str) -> None:
    """Leave the settings just applied in the environment every child process inherits
    (``GYMTRACE_PARENT``): a worker that never calls configure() then exports what it records under
    this process's carriers the same way (issue 25). Headers and secrets stay out: the environment
    of a child (a sandbox) is readable by whatever runs there."""
    exporters = settings.exporters
    file = settings.file if "file" in exporters else None
    parent = {
        "pid": os.getpid(),
        "service_name": service_name or None,
        "endpoint": settings.endpoint if "otlp" in exporters else None,
        "protocol": settings.protocol if "otlp" in exporters else None,
        "file": os.path.abspath(file) if file else None,
        "console": "console" in exporters,
        "strict": settings.strict,
        "trace_per": "run" if settings.trace_per_run else "rollout",
        "backend": settings.backend,
        "experiment": settings.experiment,
    }
    os.environ[env.GYMTRACE_PARENT] = json.dumps(parent)


def child_file(path: str, pid: int | None = None) -> str:
    """The trace file a child process writes when its parent writes ``path``: a directory stays the
    directory (one file per process already), a file gets a sibling per process, because processes
    appending to one file could interleave their lines."""
    if path.endswith(("/", os.sep)) or os.path.isdir(path):
        return path
    p = Path(path)
    return str(p.with_name(f"{p.stem}{_CHILD_TAG}{pid if pid is not None else os.getpid()}{p.suffix}"))


def child_files(path: str) -> list[str]:
    """The files :func:`child_file` gave the children of a process that writes ``path``."""
    p = Path(path)
    return sorted(str(f) for f in p.parent.glob(f"{glob.escape(p.stem)}{_CHILD_TAG}*{glob.escape(p.suffix)}"))


_CHILD_TAG = ".pid-"


def configure_from_parent() -> bool:
    """Configure this never-configured process from ``GYMTRACE_PARENT`` (see ``_tracing``). True
    when it did; every later call is free."""
    parent = dict(_settings.active.parent or ())
    if not parent or parent.get("pid") == os.getpid() or _state.configuration is not None:
        return False
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return False  # the application set a provider of its own: gymtrace never replaces it
    with _inherit_lock:
        if _state.configuration is not None:
            return active_tracer() is not None
        file = parent.get("file")
        endpoint = parent.get("endpoint")
        # A worker's SIGTERM is its pool's (Pool.terminate()): keep whatever it meant before, so a
        # flush at the signal cannot deadlock on a lock the interrupted code holds. Each continued
        # block flushes when it ends instead (see propagation.attach).
        main = threading.current_thread() is threading.main_thread()
        sigterm = signal.getsignal(signal.SIGTERM) if main else None
        configure(
            service_name=parent.get("service_name"),
            endpoint=endpoint,
            protocol=parent.get("protocol") if endpoint else None,
            file=child_file(file) if isinstance(file, str) else False,
            console=bool(parent.get("console")) or None,
            strict=bool(parent.get("strict")),
            trace_per=parent.get("trace_per"),
            backend=parent.get("backend"),
            experiment=parent.get("experiment"),
        )
        if main and sigterm is not None:
            signal.signal(signal.SIGTERM, sigterm)
        _state.inherited = True
        _tracing.flush_after_continuation = force_flush
        logger.info("gymtrace: configured from the parent process %s (GYMTRACE_PARENT)", parent.get("pid"))
    return active_tracer() is not None


def _forget_exported_settings() -> None:
    """After shutdown: children started from now on must not configure from settings no longer in
    force (only the variable this process wrote is removed, not one it inherited)."""
    raw = os.environ.get(env.GYMTRACE_PARENT)
    if raw and f'"pid": {os.getpid()},' in raw:
        del os.environ[env.GYMTRACE_PARENT]


_inherit_lock = threading.Lock()
_tracing.inherit_hook = configure_from_parent


def _apply(
    settings: _settings.Settings,
    overrides: dict[str, Any],
    policy_changes: dict[str, Any],
    step: StepPolicy | None = None,
) -> None:
    """Make validated settings, content policy changes and the step policy the active ones."""
    _settings.apply(settings, overrides)
    _levels.measure_steps(settings.step_metrics)
    apply_content_changes(policy_changes)
    if step is not None:
        set_step_policy(step, chosen=True)


def _keep_sampler(provider: Any, sampler: Sampler | None) -> None:
    # The SDK gives a TracerProvider its sampler when it is created, and its tracers copy it:
    # swapping it later would leave tracers already handed out on the old one. So it stays.
    if sampler is None:
        return
    current = provider.sampler
    if _sampler_key(sampler) != _sampler_key(current):
        logger.warning(
            "gymtrace: configure(sampler=%s) after the first configure(); the sampler of a"
            " TracerProvider cannot change once it is created, so %s stays",
            sampler.get_description(),
            current.get_description(),
        )


def _sampler_key(sampler: Sampler | None) -> object:
    # Two equal env-built samplers are the same setting; a user's sampler object is itself.
    return sampler.get_description() if sampler is not None else None


def _new_provider(sdk_trace: Any, service_name: str | None, sampler: Sampler | None) -> TracerProvider:
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource

    resource = Resource.create({SERVICE_NAME: service_name} if service_name else {})
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: env.DEFAULT_SERVICE_NAME}))
    if c.SERVICE_INSTANCE_ID not in resource.attributes:
        # One ID per process (unless OTEL_RESOURCE_ATTRIBUTES names one): readers tell apart
        # processes of one service by it, e.g. the checker compares step numbers per process.
        resource = resource.merge(Resource({c.SERVICE_INSTANCE_ID: str(uuid.uuid4())}))
    from gymtrace._otel_private.leanspan import GymTracerProvider

    # The SDK's provider, with gymtrace's own spans on the lean path (_leanspan.py): only here,
    # where gymtrace owns the provider; an application's provider is never changed.
    provider: Any = GymTracerProvider(resource=resource, sampler=sampler, id_generator=make_id_generator())
    provider.add_span_processor(IdentitySpanProcessor())
    _state.stage = _ExportStage()
    provider.add_span_processor(_state.stage)
    trace.set_tracer_provider(provider)
    return provider  # type: ignore[no-any-return]


def _processors(settings: _settings.Settings, headers: Mapping[str, str] | None) -> list[Any]:
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    # The standard batch-processor variables (OTEL_BSP_*) apply to gymtrace's queue too.
    processors: list[Any] = []
    for name in settings.exporters:
        if name == "otlp" and settings.backend != _settings.BACKEND_OTLP:
            # MLflow or Phoenix: mapped and scored on the queue's thread; no encoder process.
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
            exporter = _file_exporter(settings.file, settings.max_export_batch_size)
            target = {"kind": "file", "path": settings.file, "line_spans": settings.max_export_batch_size}
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


def _in_multiprocessing_child() -> None:
    stage = _state.stage
    if stage is not None:
        stage.flush_each_rollout(False)  # the multiprocessing exit hook flushes instead


def _rebind_stage() -> None:
    stage = _state.stage
    if stage is not None:
        stage.rebind()


def _splits_requests(name: str, exporter: Any) -> bool:
    return name == "file" or (name == "otlp" and bool(getattr(exporter, "splits_requests", False)))


def _flush_at_exit() -> None:
    # Each queue flushes within the GYMTRACE_FLUSH_TIMEOUT it was built with (read once, in
    # _processors); an exit is no time to parse the environment again.
    stage = _state.stage
    if stage is not None:
        late = []
        for processor in stage.processors():
            if not processor.force_flush(int(processor.shutdown_timeout * 1000)) or not flush_scores(
                processor, processor.shutdown_timeout
            ):
                late.append(
                    f"{getattr(processor, 'name', type(processor).__name__)} ({processor.shutdown_timeout:g} s)"
                )
        if late:
            # One line for the whole exit: what was still queued is lost with this process.
            logger.warning(
                "gymtrace: the exit flush did not finish within GYMTRACE_FLUSH_TIMEOUT: %s; spans still"
                " queued there are lost",
                ", ".join(late),
            )
    with _errors.guard("the exit flush of the gym.* metrics", may_raise=False):
        _live.flush_metrics()
        if _state.meter_provider is not None:
            _state.meter_provider.force_flush(int(_settings.active.flush_timeout * 1000))


def fast_paths() -> list[Any]:
    """Every use of private OpenTelemetry names (``_fastpaths.FastPath``), with whether this
    installation has what it needs: loaded here, since the span and exporter ones need the SDK."""
    # API only: the SDK's paths are not registered, and nothing uses them.
    with contextlib.suppress(ImportError):
        from gymtrace._otel_private import leanspan as _leanspan  # noqa: F401 - registers its fast path
    _otlp.register_fast_paths()
    return _fastpaths.all_paths()


def export_stats() -> list[Any]:
    """Per exporter: spans finished, exported, queued and dropped (with why) since configure().

    Every span that will never be delivered is counted here and logged at shutdown; nothing is
    dropped silently.
    """
    stage = _state.stage
    if stage is None:
        return []
    stats = [p.stats() for p in stage.processors()]
    # A backend's scores (GYMTRACE_BACKEND=mlflow|phoenix) are counted beside its spans.
    return stats + [s for s in map(score_stats, stage.processors()) if s is not None]


def _adopt(existing: trace.TracerProvider, sdk_trace: Any, key: tuple[Any, ...]) -> Configuration:
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
    _state.key = key
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
    """Export every finished span now. True when all exporters finished within the timeout.

    Flushes the provider gymtrace's spans go to: inside ``gymtrace.testing.capture_spans()`` its
    private one, else the global one. The ``gym.*`` counters gathered so far are handed to the
    global MeterProvider first (and exported, when it is the one ``configure()`` set).
    """
    with _errors.guard("gymtrace.force_flush(): the gym.* metrics"):
        _live.flush_metrics()
        if _state.meter_provider is not None:
            _state.meter_provider.force_flush(timeout_millis)
    provider = current_provider()
    flush = getattr(provider, "force_flush", None)
    return bool(flush(timeout_millis)) if flush is not None else True


def is_configured() -> bool:
    """True after a ``configure()`` (that set tracing up, adopted the application's provider or
    found ``OTEL_SDK_DISABLED``), until ``shutdown()`` or ``gymtrace.testing.reset()``."""
    return _state.configuration is not None


def get_configuration() -> Configuration | None:
    """What the last ``configure()`` set up (the same object it returned), or ``None`` when gymtrace
    is not configured. Integrations use it to configure worker processes like this one."""
    return _state.configuration


def reset() -> None:
    """Shut gymtrace's exporters down and forget the configuration and every setting made in code
    (strict mode, trace_per, the content policy); the next ``configure()`` starts fresh.

    The global TracerProvider gymtrace created stays, with its resource and sampler: OpenTelemetry
    sets it once per process.
    """
    shutdown()
    reset_content_policy()
    _settings.reset()
    _levels.measure_steps(_settings.active.step_metrics)
    reset_step_policy()  # from the settings just read again
    reset_seen()


def shutdown() -> None:
    """Flush and stop gymtrace's exporters. A later ``configure()`` starts new ones.

    The global TracerProvider stays (OpenTelemetry allows setting it once per process); until the
    next ``configure()`` its spans are not exported.
    """
    with _state.lock:
        if _state.stage is not None:
            _state.stage.shutdown()
        _state.configuration = None
        _state.key = None
        _state.inherited = False
        _tracing.flush_after_continuation = None
        _forget_exported_settings()
