"""A leaner recording path for gymtrace's own spans, used only under the provider gymtrace owns.

:class:`LeanTracer` is the SDK's ``Tracer`` with ``start_span`` replaced: the same sampling, ID and
limit decisions and the same SDK ``Span`` class (every span processor, exporter and ``isinstance``
check sees what it always saw), but plain-typed attributes are filled without the SDK's per-value
validation and spans end without the ``ReadableSpan`` copy. Any other attribute value, and every
tracer other than gymtrace's, takes the SDK's own path. The span class is in ``leanspan_span``, the
check of which SDK it was built for in ``sdkdigest``.

Installed only when ``configure()`` creates the provider, and only if the SDK's ``Tracer`` and
``Span`` have the private fields this module fills (checked once; otherwise the SDK path stays).
What it saves: docs/performance.md, "A leaner span".
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from opentelemetry import trace as trace_api
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk import trace as sdk_trace
from opentelemetry.sdk.trace import sampling as sdk_sampling
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import SpanContext, SpanKind
from opentelemetry.trace.span import DEFAULT_TRACE_STATE

from gymtrace import _constants as c
from gymtrace._model import errors as _errors
from gymtrace._otel_private import fastpaths as _fastpaths
from gymtrace._otel_private.leanspan_span import (
    _ATTRIBUTE_FIELDS_KNOWN,
    _NONE,
    _PLAIN,
    _SETITEM_KNOWN,
    _UNSET_STATUS,
    _Lean,
    _lean_failed,
    _LeanSpan,
)
from gymtrace._otel_private.sdkdigest import _MISSING_SPAN_FIELDS

try:  # the key the API stores the current span under (private): a parent read without two calls
    from opentelemetry.trace.propagation import _SPAN_KEY
except ImportError:  # an API without it: the SDK's path (make_lean leaves the tracer as it is)
    _SPAN_KEY = None  # type: ignore[assignment]  # checked before use (_SUPPORTED)

try:
    from opentelemetry.sdk.trace import _tracer_metrics
except ImportError:  # an SDK without span metrics
    _tracer_metrics = None  # type: ignore[assignment]

logger = logging.getLogger("gymtrace")

_TRACER_FIELDS = (
    "sampler",
    "resource",
    "span_processor",
    "id_generator",
    "instrumentation_info",
    "_span_limits",
    "_instrumentation_scope",
)

_SUPPORTED = not _MISSING_SPAN_FIELDS and _SPAN_KEY is not None


_RECORD_AND_SAMPLE = sdk_sampling.Decision.RECORD_AND_SAMPLE
# The four TraceFlags values a span of this process can get, made once.
_FLAGS = {value: trace_api.TraceFlags(value) for value in range(4)}
_new_attributes = object.__new__
_new_tuple = tuple.__new__
_SAMPLED = int(trace_api.TraceFlags.SAMPLED)
_TRACE_ID_MAX = 2**128 - 1
_SPAN_ID_MAX = 2**64 - 1
# W3C Trace Context level 2's random-trace-ID flag, which the SDK sets from 1.42 on; the lean path
# sets it as the SDK does, so without it (an older API) the SDK's own path runs.
_RANDOM = int(getattr(trace_api.TraceFlags, "RANDOM_TRACE_ID", 0))
_RANDOM_KNOWN = bool(_RANDOM) and callable(getattr(RandomIdGenerator, "is_trace_id_random", None))


def _context_layout_known() -> bool:
    # SpanContext is a tuple (trace_id, span_id, is_remote, trace_flags, trace_state, is_valid) whose
    # __new__ only fills defaults and computes is_valid; the lean path unpacks and builds it so.
    flags, state = trace_api.TraceFlags(3), trace_api.TraceState([("k", "v")])
    made = SpanContext(5, 7, False, flags, state)
    return (
        tuple(made) == (5, 7, False, flags, state, True)
        and made.trace_flags is flags
        and made.trace_state is state
        and _new_tuple(SpanContext, (5, 7, False, flags, state, True)) == made
    )


try:
    _CONTEXT_LAYOUT_KNOWN = _context_layout_known()
except Exception:  # noqa: BLE001 - an API we do not know: use its properties and constructor
    _CONTEXT_LAYOUT_KNOWN = False


def _default_on_intact() -> bool:
    # Its five delegates as the SDK defines them (a sampler with another delegate is called).
    on, off = sdk_sampling.ALWAYS_ON, sdk_sampling.ALWAYS_OFF
    sampler: Any = sdk_sampling.DEFAULT_ON
    return (
        type(sampler) is sdk_sampling.ParentBased
        and [
            getattr(sampler, f"_{name}", None)
            for name in (
                "root",
                "remote_parent_sampled",
                "remote_parent_not_sampled",
                "local_parent_sampled",
                "local_parent_not_sampled",
            )
        ]
        == [on, on, off, on, off]
        and getattr(on, "_decision", None) is _RECORD_AND_SAMPLE
    )


try:
    _DEFAULT_ON_INTACT = _default_on_intact()
except Exception:  # noqa: BLE001 - an SDK we do not know: always call the sampler
    _DEFAULT_ON_INTACT = False
# The SDK's default sampler (parentbased_always_on, the object the SDK builds when
# OTEL_TRACES_SAMPLER is unset), whose decision start_span takes without calling it; None if its
# delegates are not the SDK's (then every sampler is called).
_DEFAULT_SAMPLER = sdk_sampling.DEFAULT_ON if _DEFAULT_ON_INTACT else None
_NoOpMetrics: Any = getattr(_tracer_metrics, "NoOpTracerMetrics", None)
_noop: Any = getattr(_tracer_metrics, "noop", None)
if _NoOpMetrics is None or _noop is None or _NoOpMetrics().start_span(None, _RECORD_AND_SAMPLE) is not _noop:
    _NoOpMetrics = None  # not the no-op this module knows: always ask the tracer's metrics


class LeanTracer(sdk_trace.Tracer):
    def start_span(
        self,
        name: str,
        context: Any = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Any = None,
        links: Any = (),
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> trace_api.Span:
        span = None
        if _Lean.on:
            try:
                span = self._lean_span(
                    name,
                    context,
                    kind,
                    attributes,
                    links,
                    start_time,
                    record_exception,
                    set_status_on_exception,
                )
            except Exception as exc:  # noqa: BLE001 - see _LeanSpan.end(); this span takes the SDK's path
                _lean_failed("start_span", exc)
        if span is None:  # something only the SDK's own path handles
            return super().start_span(
                name, context, kind, attributes, links, start_time, record_exception, set_status_on_exception
            )
        return span

    def _lean_span(
        self,
        name: str,
        context: Any,
        kind: SpanKind,
        attributes: Any,
        links: Any,
        start_time: int | None,
        record_exception: bool,
        set_status_on_exception: bool,
    ) -> trace_api.Span | None:
        """The span, started, or None where the SDK's path must decide: links, limits it enforces,
        a non-plain attribute value, or a sampler that changed the attributes."""
        limits = self._span_limits
        if (
            links
            or not attributes
            or limits.max_span_attribute_length is not None
            or len(attributes) > (limits.max_span_attributes or 0)
            or not self._is_enabled()
        ):
            return None
        for value in attributes.values():
            if type(value) not in _PLAIN:
                return None
        current = context.get(_SPAN_KEY) if context is not None else None
        if type(current) is _LeanSpan and _CONTEXT_LAYOUT_KNOWN:
            # A parent this tracer made (every nested gymtrace span): its context is a valid local
            # SpanContext, read as the tuple it is instead of through six properties.
            parent: Any = current._context
            trace_id, _, _, parent_flags, trace_state, _ = parent
            random_trace_id = parent_flags & _RANDOM
            parent_sampled = parent_flags & _SAMPLED
        else:
            parent = trace_api.get_current_span(context).get_span_context()
            if parent is None or not parent.is_valid:
                parent = None
                trace_id = self.id_generator.generate_trace_id()
                random_trace_id = self.id_generator.is_trace_id_random()
                parent_sampled = True
                trace_state = None
            else:
                trace_id = parent.trace_id
                random_trace_id = parent.trace_flags.random_trace_id
                parent_sampled = parent.trace_flags.sampled
                trace_state = parent.trace_state
        if parent_sampled and self.sampler is _DEFAULT_SAMPLER:
            # The SDK's default sampler, ParentBased(ALWAYS_ON), samples a root and every child of
            # a sampled parent, with the parent's trace state and the attributes as given: the
            # same decision without its three context lookups and a SamplingResult per span.
            flags = _SAMPLED
            decision: Any = _RECORD_AND_SAMPLE
        else:
            sampling: Any = self.sampler.should_sample(context, trace_id, name, kind, attributes, ())
            decision = sampling.decision
            trace_state = sampling.trace_state
            flags = _SAMPLED if decision.is_sampled() else 0
            if (
                decision.is_recording()
                and sampling.attributes is not attributes
                and sampling.attributes != attributes
            ):
                return None  # the sampler changed the attributes: the SDK validates what it returned
        if random_trace_id:
            flags |= _RANDOM
        trace_flags = _FLAGS.get(flags) or trace_api.TraceFlags(flags)
        span_id = self.id_generator.generate_span_id()
        if _CONTEXT_LAYOUT_KNOWN:
            span_context = _new_tuple(
                SpanContext,
                (
                    trace_id,
                    span_id,
                    False,
                    trace_flags,
                    DEFAULT_TRACE_STATE if trace_state is None else trace_state,
                    0 < trace_id <= _TRACE_ID_MAX and 0 < span_id <= _SPAN_ID_MAX,
                ),
            )
        else:
            span_context = trace_api.SpanContext(
                trace_id, span_id, is_remote=False, trace_flags=trace_flags, trace_state=trace_state
            )
        metrics = self._tracer_metrics
        # The SDK's metrics are off unless a meter provider was given: its no-op answers noop.
        record_end_metrics = _noop if type(metrics) is _NoOpMetrics else metrics.start_span(parent, decision)
        if decision is not _RECORD_AND_SAMPLE and not decision.is_recording():
            return trace_api.NonRecordingSpan(context=span_context)
        span: Any = _LeanSpan.__new__(_LeanSpan)
        span._name = name
        span._context = span_context
        span._kind = kind
        span._instrumentation_info = self.instrumentation_info
        span._instrumentation_scope = self._instrumentation_scope
        span._parent = parent
        span._start_time = None
        span._end_time = None
        span._resource = self.resource
        span._status = _UNSET_STATUS
        span._sampler = self.sampler
        span._trace_config = None
        span._record_exception = record_exception
        span._set_status_on_exception = set_status_on_exception
        span._span_processor = self.span_processor
        span._limits = limits
        span._lock = threading.Lock()
        if _ATTRIBUTE_FIELDS_KNOWN:
            # BoundedAttributes.__init__ with validated plain values: the same fields, set directly.
            bounded: Any = _new_attributes(BoundedAttributes)
            bounded._dict = dict(attributes)
            bounded.maxlen = limits.max_span_attributes
            bounded.dropped = 0
            bounded.max_value_len = None
            bounded._lock = threading.Lock()
            bounded._immutable = False
        else:
            bounded = BoundedAttributes(limits.max_span_attributes, None, immutable=False)
            bounded._dict.update(attributes)
        span._attributes = bounded
        span._events = _NONE
        span._links = _NONE
        span._record_end_metrics = record_end_metrics
        span._start_time = start_time if start_time is not None else time.time_ns()
        self.span_processor.on_start(span, parent_context=context)
        lean: trace_api.Span = span
        return lean


def _tracer_fields_missing() -> list[str]:
    tracer = sdk_trace.TracerProvider().get_tracer("gymtrace.probe")
    return [
        f"sdk Tracer.{f}"
        for f in (*_TRACER_FIELDS, "_tracer_metrics", "_is_enabled")
        if not hasattr(tracer, f)
    ]


def _lean_spans_missing() -> list[str]:
    """What the lean span path needs that this SDK lacks (empty: it is active)."""
    missing = list(_MISSING_SPAN_FIELDS)
    if _SPAN_KEY is None:
        missing.append("opentelemetry.trace.propagation._SPAN_KEY")
    missing += _tracer_fields_missing()
    if not _RANDOM_KNOWN:
        missing.append("TraceFlags.RANDOM_TRACE_ID / IdGenerator.is_trace_id_random() (1.42+)")
    for known, what in (
        (_CONTEXT_LAYOUT_KNOWN, "SpanContext tuple layout"),
        (_ATTRIBUTE_FIELDS_KNOWN, "BoundedAttributes fields"),
        (_SETITEM_KNOWN, "BoundedAttributes._setitem_locked()"),
        (_DEFAULT_ON_INTACT, "sampling.DEFAULT_ON delegates (ParentBased._root, ...)"),
        (_NoOpMetrics is not None, "sdk.trace._tracer_metrics.NoOpTracerMetrics / noop"),
    ):
        if not known:
            missing.append(what)
    return missing


_fastpaths.register(
    "lean spans",
    __name__,
    (
        "sdk _Span private fields",
        "Tracer.__class__ swap",
        "trace.propagation._SPAN_KEY",
        "BoundedAttributes._dict/_setitem_locked",
        "sampling.DEFAULT_ON delegates",
        "_tracer_metrics.noop",
    ),
    "the SDK's Tracer.start_span and Span (each missing part alone falls back to the SDK's code)",
    _lean_spans_missing,
)


def make_lean(tracer: Any, name: str) -> Any:
    """gymtrace's own tracer from the provider gymtrace created, made lean if the SDK allows."""
    if name != c.INSTRUMENTATION_NAME:
        return tracer
    if (
        _SUPPORTED
        and _RANDOM_KNOWN
        and type(tracer) is sdk_trace.Tracer
        and all(hasattr(tracer, f) for f in (*_TRACER_FIELDS, "_tracer_metrics", "_is_enabled"))
    ):
        tracer.__class__ = LeanTracer
    elif _errors.first_time("lean spans off"):
        # One line, once per process: this SDK is not the one the lean path was built for.
        missing = _fastpaths.status("lean spans").missing or ("the tracer is not the SDK's Tracer",)
        logger.info(
            "gymtrace: the SDK's own spans are used (the lean span path does not match this SDK: %s)",
            "; ".join(missing),
        )
    return tracer


class GymTracerProvider(sdk_trace.TracerProvider):
    """The SDK's provider; gymtrace's own tracer from it is a :class:`LeanTracer`."""

    def get_tracer(self, instrumenting_module_name: str, *args: Any, **kwargs: Any) -> trace_api.Tracer:
        tracer = super().get_tracer(instrumenting_module_name, *args, **kwargs)
        return make_lean(tracer, instrumenting_module_name)  # type: ignore[no-any-return]
