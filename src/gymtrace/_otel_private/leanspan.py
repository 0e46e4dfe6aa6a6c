"""A leaner recording path for gymtrace's own spans, used only under the provider gymtrace owns.

Measured (``benchmarks/perf.py``, forms): of the ~30 µs an SDK span costs, the SDK spends ~9 %
re-validating attributes gymtrace built from validated values, and more on a ``ReadableSpan``
copy made at the end of every span and on keyword-heavy constructor chains. :class:`LeanTracer`
is the SDK's ``Tracer`` with one method replaced: ``start_span`` takes the same sampling, ID and
limit decisions, builds the same SDK ``Span`` class (so every span processor, exporter and
``isinstance`` check sees what it always saw), but fills plain-typed attributes without the
per-value validation, and ends spans without the copy. Any other attribute value, and every
tracer other than gymtrace's, takes the SDK's own path.

It is installed only when ``configure()`` creates the provider, and only if the SDK's ``Tracer``
and ``Span`` have the private fields this module fills (checked once; otherwise the SDK path stays).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from typing import Any

from opentelemetry import trace as trace_api
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk import trace as sdk_trace
from opentelemetry.sdk.trace import sampling as sdk_sampling
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.util import BoundedList
from opentelemetry.trace import SpanContext, SpanKind
from opentelemetry.trace.span import DEFAULT_TRACE_STATE
from opentelemetry.trace.status import Status, StatusCode

from gymtrace import _constants as c
from gymtrace._model import errors as _errors
from gymtrace._otel_private import fastpaths as _fastpaths

try:  # the key the API stores the current span under (private): a parent read without two calls
    from opentelemetry.trace.propagation import _SPAN_KEY
except ImportError:  # an API without it: the SDK's path (make_lean leaves the tracer as it is)
    _SPAN_KEY = None  # type: ignore[assignment]  # checked before use (_SUPPORTED)

try:
    from opentelemetry.sdk.trace import _tracer_metrics
except ImportError:  # an SDK without span metrics
    _tracer_metrics = None  # type: ignore[assignment]

logger = logging.getLogger("gymtrace")

_PLAIN = (str, bool, int, float)
_UNSET_STATUS = Status(StatusCode.UNSET)
_NONE: tuple[Any, ...] = ()
_TRACER_FIELDS = (
    "sampler",
    "resource",
    "span_processor",
    "id_generator",
    "instrumentation_info",
    "_span_limits",
    "_instrumentation_scope",
)


# The SDK instantiates the private _Span (Span refuses direct construction since 1.2x).
_SpanBase: Any = getattr(sdk_trace, "_Span", sdk_trace.Span)


class _Lean:
    """Whether new spans take the lean path: on until a lean method fails once in this process."""

    on = True


def _lean_failed(where: str, exc: Exception) -> None:
    """A method of the lean path raised: the SDK's own spans from now on, and one WARNING. Never
    raised, in strict mode neither: the caller's ``with`` block is not the place for an SDK
    mismatch this module should have caught (issue 31)."""
    _Lean.on = False
    _errors.internal_error(
        f"the lean span path ({where}); gymtrace uses the SDK's own spans now", exc, may_raise=False
    )


class _LeanSpan(_SpanBase):  # type: ignore[misc]
    """The SDK span, constructed directly and handed to ``on_end`` as itself.

    After ``end()`` every mutator of the SDK span is a no-op (``_check_span_ended``) and the
    attributes are immutable, so the span is the read-only view the SDK would otherwise copy.
    Every method here catches its own failure (:func:`_lean_failed`): a span that cannot be ended
    or set the lean way is reported, never raised into the block that uses it.
    """

    def _readable_span(self) -> Any:
        return self

    def end(self, end_time: int | None = None) -> None:
        try:
            super().end(end_time)
        except Exception as exc:  # noqa: BLE001 - the SDK's end() on a span it did not build
            _lean_failed("end", exc)

    # Most gymtrace spans never get an event or a link: the two bounded lists (a deque and a lock
    # each, ~4 % of a span) are made when needed. Until then the span holds a tuple, which every
    # reader of the SDK span handles (``events``/``links`` copy it to a tuple,
    # ``dropped_events``/``dropped_links`` count 0 for anything not a BoundedList): empty, or for
    # events the first one alone (an episode's reward event is the only one it ever gets).
    def _add_event(self, event: Any) -> None:
        span: Any = self
        try:
            if type(span._events) is tuple:
                with span._lock:  # two threads adding an event must not each replace the tuple
                    events = span._events
                    if type(events) is tuple and span._end_time is None:
                        limit = span._limits.max_events
                        if not events and (limit is None or limit > 0):
                            span._events = (event,)
                            return
                        bounded: Any = BoundedList(limit)
                        bounded.extend(events)
                        span._events = bounded
            super()._add_event(event)
        except Exception as exc:  # noqa: BLE001 - see end()
            _lean_failed("add_event", exc)

    # Attributes and events set after the start with plain values (str with no length limit, bool,
    # int, float: values the SDK's cleaning returns unchanged) go into the same fields the SDK's
    # path fills, without that cleaning; the Gymnasium integration sets an episode's statistics
    # and outcome and adds its reward event this way once per episode. Anything else, an ended
    # span (the SDK's warning) or a length limit takes the SDK's path.
    def set_attribute(self, key: str, value: Any) -> None:
        span: Any = self
        try:
            if _SETITEM_KNOWN and type(value) in _PLAIN and type(key) is str and key:
                with span._lock:
                    attributes = span._attributes
                    if span._end_time is None and attributes.max_value_len is None:
                        with attributes._lock:
                            attributes._setitem_locked(key, value)
                        return
            super().set_attribute(key, value)
        except Exception as exc:  # noqa: BLE001 - see end()
            _lean_failed("set_attribute", exc)

    def set_attributes(self, attributes: Any) -> None:
        try:
            self._set_attributes(attributes)
        except Exception as exc:  # noqa: BLE001 - see end()
            _lean_failed("set_attributes", exc)

    def _set_attributes(self, attributes: Any) -> None:
        span: Any = self
        if _SETITEM_KNOWN and type(attributes) is dict:
            for key, value in attributes.items():
                if type(value) not in _PLAIN or type(key) is not str or not key:
                    break
            else:
                with span._lock:
                    bounded = span._attributes
                    if span._end_time is None and bounded.max_value_len is None:
                        with bounded._lock:
                            for key, value in attributes.items():
                                bounded._setitem_locked(key, value)
                        return
        super().set_attributes(attributes)

    def add_event(self, name: str, attributes: Any = None, timestamp: int | None = None) -> None:
        try:
            self._lean_add_event(name, attributes, timestamp)
        except Exception as exc:  # noqa: BLE001 - see end()
            _lean_failed("add_event", exc)

    def _lean_add_event(self, name: str, attributes: Any, timestamp: int | None) -> None:
        span: Any = self
        limits = span._limits
        if (
            _ATTRIBUTE_FIELDS_KNOWN
            and (attributes is None or type(attributes) is dict)
            and limits.max_attribute_length is None
            and len(attributes or ()) <= (limits.max_event_attributes or 0)
        ):
            for value in (attributes or {}).values():
                if type(value) not in _PLAIN:
                    break
            else:
                # BoundedAttributes(max_event_attributes, attributes, immutable=True), as add_event
                # builds it, from values that need no cleaning.
                bounded: Any = _new_attributes(BoundedAttributes)
                bounded._dict = dict(attributes) if attributes else {}
                bounded.maxlen = limits.max_event_attributes
                bounded.dropped = 0
                bounded.max_value_len = None
                bounded._lock = threading.Lock()
                bounded._immutable = True
                self._add_event(sdk_trace.Event(name=name, attributes=bounded, timestamp=timestamp))
                return
        super().add_event(name, attributes, timestamp)

    def _add_link(self, link: Any) -> None:
        span: Any = self
        try:
            if span._links is _NONE:
                with span._lock:
                    if span._links is _NONE and span._end_time is None:
                        span._links = BoundedList(span._limits.max_links)
            super()._add_link(link)
        except Exception as exc:  # noqa: BLE001 - see end()
            _lean_failed("add_link", exc)


# Every field a lean span gets, set by _lean_span below: exactly the fields the SDK's own span has in
# the releases this module was built for. A release with one more (or one fewer) is not the span
# this module builds, whatever its methods look like (issue 31: a new field that end() read passed a
# check for the known ones, and AttributeError came out of the user's `with`).
_LEAN_FIELDS: frozenset[str] = frozenset(
    {
        "_name",
        "_context",
        "_kind",
        "_instrumentation_info",
        "_instrumentation_scope",
        "_parent",
        "_start_time",
        "_end_time",
        "_attributes",
        "_events",
        "_links",
        "_resource",
        "_status",
        "_sampler",
        "_trace_config",
        "_record_exception",
        "_set_status_on_exception",
        "_span_processor",
        "_limits",
        "_lock",
        "_record_end_metrics",
    }
)


def _code_names(code: Any) -> set[str]:
    """The names a code object and the code nested in it use: attributes, globals, locals (not the
    compiler's own, such as a comprehension's ``.0``, which CPython 3.12 no longer makes)."""
    names = {name for name in (*code.co_names, *code.co_varnames) if not name.startswith(".")}
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _code_names(const)
    return names


def _functions(owner: Any) -> dict[str, Any]:
    """The functions a class defines itself (properties by their getter and setter), by name."""
    found = {}
    for name, member in vars(owner).items():
        for suffix, function in (("", member), (".fget", getattr(member, "fget", None))):
            function = getattr(function, "__func__", function)  # static and class methods
            if hasattr(function, "__code__"):
                found[name + suffix] = function
        setter = getattr(member, "fset", None)
        if hasattr(setter, "__code__"):
            found[name + ".fset"] = setter
    return found


def code_fingerprint(owner: Any, only: tuple[str, ...] = ()) -> str:
    """A digest of the code of ``owner``'s own methods (or of the ``only`` ones): per method, its
    name, argument count and the sorted names it uses. The same across CPython 3.10 to 3.13 for
    the same source (names come from the source, not the bytecode), different as soon as a method
    uses another field or calls another method."""
    functions = _functions(owner)
    lines = []
    for name in sorted(only or functions):
        function = functions.get(name)
        if function is None:
            lines.append(f"{name}: missing")
            continue
        code = function.__code__
        lines.append(
            f"{name}({code.co_argcount},{code.co_kwonlyargcount}): {' '.join(sorted(_code_names(code)))}"
        )
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


# What the lean path was built for: the code of the SDK classes a lean span runs (its methods come
# from Span and ReadableSpan) and of what it stands in for (Tracer.start_span builds the span it
# replaces; BoundedAttributes is filled field by field), by digest, one per SDK release whose code
# differs. The span fields alone cannot tell a release whose end() reads a field set elsewhere, or
# calls a new method. A release not listed here gets the SDK's own spans (one INFO line at
# configure(); tests/test_fast_paths.py fails naming the class), until its code is read and added.
#   python -c "from gymtrace._otel_private.leanspan import sdk_code; print(sdk_code())"
_BUILT_FOR: dict[str, frozenset[str]] = {
    # opentelemetry-sdk 1.45.0 and 1.45.1 (the same code), CPython 3.10, 3.11, 3.12 and 3.13.
    "Span": frozenset({"bf3c30d9bf2065b8"}),
    "ReadableSpan": frozenset({"b9f63c4902ddb0b6"}),
    "Tracer.start_span": frozenset({"84a7917195e503d1"}),
    "BoundedAttributes": frozenset({"65f08795021f2043"}),
}


def sdk_code() -> dict[str, str]:
    """The digests of this SDK's code that :data:`_BUILT_FOR` is checked against."""
    return {
        "Span": code_fingerprint(sdk_trace.Span),
        "ReadableSpan": code_fingerprint(sdk_trace.ReadableSpan),
        "Tracer.start_span": code_fingerprint(sdk_trace.Tracer, ("start_span",)),
        "BoundedAttributes": code_fingerprint(BoundedAttributes),
    }


def _span_fields_present() -> list[str]:
    probe = sdk_trace.TracerProvider().get_tracer("gymtrace.probe")
    span: Any = probe.start_span("probe")
    span.end()
    present = set(vars(span))
    # Exactly the fields the lean path sets: one more is a field the SDK's methods may read that a
    # lean span would not have.
    missing = [f"sdk Span.{name}" for name in sorted(_LEAN_FIELDS - present)]
    missing += [f"sdk Span field not built for: {name}" for name in sorted(present - _LEAN_FIELDS)]
    if type(span) is not getattr(sdk_trace, "_Span", None) or _functions(type(span)):
        missing.append("opentelemetry.sdk.trace._Span (the SDK's span class, adding nothing to Span)")
    missing += [
        f"sdk {part}'s code (digest {digest}, built for {', '.join(sorted(_BUILT_FOR[part]))})"
        for part, digest in sdk_code().items()
        if digest not in _BUILT_FOR[part]
    ]
    if not hasattr(span._attributes, "_dict"):
        missing.append("BoundedAttributes._dict")
    return missing


try:
    _MISSING_SPAN_FIELDS = _span_fields_present()
except Exception as exc:  # noqa: BLE001 - an SDK we do not know: keep the SDK's path
    _MISSING_SPAN_FIELDS = [f"sdk Span fields ({type(exc).__name__}: {exc})"]
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


def _attribute_fields_known() -> bool:
    # The fields BoundedAttributes.__init__ sets, as the lean path sets them (checked once).
    probe = BoundedAttributes(3, None, immutable=False)
    return sorted(vars(probe)) == ["_dict", "_immutable", "_lock", "dropped", "max_value_len", "maxlen"] and (
        type(probe._dict) is dict
    )


try:
    _ATTRIBUTE_FIELDS_KNOWN = _attribute_fields_known()
except Exception:  # noqa: BLE001 - an SDK we do not know: construct them the SDK's way
    _ATTRIBUTE_FIELDS_KNOWN = False
# BoundedAttributes' insertion under its lock (replace, or evict the oldest at the limit), which the
# lean set_attribute(s) call; without it, the SDK's own set_attribute(s).
_SETITEM_KNOWN = _ATTRIBUTE_FIELDS_KNOWN and callable(getattr(BoundedAttributes, "_setitem_locked", None))


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
