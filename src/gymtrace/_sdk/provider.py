"""The providers: the TracerProvider gymtrace creates (or the application's, which it adopts and
never replaces) and the MeterProvider it sets for the ``gym.*`` metrics when spans go over OTLP.

A provider's resource and sampler are fixed when it is created, and OpenTelemetry sets the global
one once per process: what a later ``configure()`` cannot change is said in a warning here.
"""

from __future__ import annotations

import atexit
import logging
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from opentelemetry import trace

from gymtrace import _constants as c
from gymtrace._identity.processor import IdentitySpanProcessor
from gymtrace._model import environment as env
from gymtrace._model import errors as _errors
from gymtrace._model import settings as _settings
from gymtrace._sdk.stage import ExportStage
from gymtrace._sdk.state import Configuration, _state

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import Sampler

logger = logging.getLogger("gymtrace")


def new_provider(
    sdk_trace: Any, service_name: str | None, sampler: Sampler | None, id_generator: Any
) -> TracerProvider:
    """The SDK's provider for this process, with gymtrace's identity processor and export stage, set
    as the global one."""
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
    provider: Any = GymTracerProvider(resource=resource, sampler=sampler, id_generator=id_generator)
    provider.add_span_processor(IdentitySpanProcessor())
    _state.stage = ExportStage()
    provider.add_span_processor(_state.stage)
    trace.set_tracer_provider(provider)
    return provider  # type: ignore[no-any-return]


def keep_sampler(provider: Any, sampler: Sampler | None) -> None:
    # The SDK gives a TracerProvider its sampler when it is created, and its tracers copy it:
    # swapping it later would leave tracers already handed out on the old one. So it stays.
    if sampler is None:
        return
    current = provider.sampler
    if sampler_key(sampler) != sampler_key(current):
        logger.warning(
            "gymtrace: configure(sampler=%s) after the first configure(); the sampler of a"
            " TracerProvider cannot change once it is created, so %s stays",
            sampler.get_description(),
            current.get_description(),
        )


def sampler_key(sampler: Sampler | None) -> object:
    # Two equal env-built samplers are the same setting; a user's sampler object is itself.
    return sampler.get_description() if sampler is not None else None


def adopt(existing: trace.TracerProvider, sdk_trace: Any, key: tuple[Any, ...]) -> Configuration:
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


def set_meter_provider(settings: _settings.Settings, headers: Mapping[str, str] | None) -> None:
    """The metrics (``_scopes.metrics``) over OTLP to the spans' endpoint, when the application set no
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
