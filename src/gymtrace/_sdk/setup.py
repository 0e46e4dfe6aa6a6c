"""``configure()``: resolve the settings, build the exporters, then apply; the only code that
imports the SDK (lazily, from here and the modules it calls).

Instrumentation works under any ``TracerProvider``; this module is optional setup for applications
that have none. It never replaces a provider the application already set: it adds
:class:`~gymtrace.IdentitySpanProcessor` to it and leaves exporting to the application.

Its parts, each in its own module: what was set up (``state``), the providers (``provider``), the
per-span export stage (``stage``), the exporting processors (``processors``), what child
processes inherit (``children``), and flushing and stopping (``flush``). Here: ``configure()`` and
``configure_from_parent()``, ``reset()``, the ID generator (reseeded in forked children by the fork
hook here, which also renews every lock of gymtrace's module state) and ``fast_paths()``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import trace

from gymtrace._content import (
    UNCHANGED,
    apply_content_changes,
    content_changes,
    export_settings,
    reset_content_policy,
)
from gymtrace._identity.carriers import install_propagator, uninstall_propagator
from gymtrace._identity.trust import trust_overrides
from gymtrace._model import errors as _errors
from gymtrace._model import forks as _forks
from gymtrace._model import settings as _settings
from gymtrace._model.errors import InvalidArgumentError, reset_seen
from gymtrace._otel_private import fastpaths as _fastpaths
from gymtrace._scopes import active_scope as _frame
from gymtrace._scopes import levels as _levels
from gymtrace._scopes import tracing as _tracing
from gymtrace._scopes.steps import StepPolicy
from gymtrace._scopes.steps import policy_from as step_policy_from
from gymtrace._scopes.steps import reset_policy as reset_step_policy
from gymtrace._scopes.steps import set_policy as set_step_policy
from gymtrace._scopes.tracing import active_tracer
from gymtrace._sdk import lifecycle as _lifecycle
from gymtrace._sdk import otlp as _otlp
from gymtrace._sdk.children import child_file, export_to_children
from gymtrace._sdk.export_targets import SDK_HINT as _SDK_HINT
from gymtrace._sdk.flush import flush_at_exit, force_flush, in_multiprocessing_child, shutdown
from gymtrace._sdk.processors import build_processors as _processors
from gymtrace._sdk.provider import adopt, keep_sampler, new_provider, sampler_key, set_meter_provider
from gymtrace._sdk.state import Configuration, _state

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.sampling import Sampler

logger = logging.getLogger("gymtrace")

_PROTOCOLS = ("grpc", "http/protobuf")


def _import_sdk() -> Any:
    try:
        import opentelemetry.sdk.trace as sdk_trace
    except ImportError as exc:  # pragma: no cover - exercised in the SDK-less test environment
        raise ImportError(_SDK_HINT) from exc
    return sdk_trace


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


_forks.in_child(_after_fork_in_child)


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
        sampler_key(sampler),
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
            return adopt(existing, sdk_trace, key)
        # Everything that can fail (imports, exporter constructors) happens before anything changes.
        processors = _processors(settings, headers)
        _apply(settings, overrides, policy_changes, step)
        if _state.provider is None:
            _state.provider = new_provider(sdk_trace, settings.service_name, sampler, make_id_generator())
        else:
            keep_sampler(_state.provider, sampler)
        provider = _state.provider
        assert _state.stage is not None
        _state.stage.replace(processors)
        set_meter_provider(settings, headers)
        _lifecycle.install(flush_at_exit, in_multiprocessing_child)
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
        export_to_children(settings, resolved_name)
        return _state.configuration


def configure_from_parent() -> bool:
    """Configure this never-configured process from ``GYMTRACE_PARENT`` (see ``_scopes.tracing``). True
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
    # The incoming identity read once per request, wherever a context is extracted; with the SDK
    # disabled nothing is set up, and nothing reads it.
    if settings.sdk_disabled:
        uninstall_propagator()
    else:
        install_propagator()
    _levels.measure_steps(settings.step_metrics)
    apply_content_changes(policy_changes)
    if step is not None:
        set_step_policy(step, chosen=True)


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


def fast_paths() -> list[Any]:
    """Every use of private OpenTelemetry names (``_otel_private.fastpaths.FastPath``), with whether this
    installation has what it needs: loaded here, since the span and exporter ones need the SDK."""
    # API only: the SDK's paths are not registered, and nothing uses them.
    with contextlib.suppress(ImportError):
        from gymtrace._otel_private import leanspan as _leanspan  # noqa: F401 - registers its fast path
    _otlp.register_fast_paths()
    return _fastpaths.all_paths()


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
    uninstall_propagator()
    reset_content_policy()
    _settings.reset()
    _levels.measure_steps(_settings.active.step_metrics)
    reset_step_policy()  # from the settings just read again
    reset_seen()
