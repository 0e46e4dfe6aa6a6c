"""Spans to encoder-process records and back: the lean span's fields read into a record on the
application's side, and ``ReadableSpan`` objects filled field by field in the encoder process.

Here because both read or write private fields of the SDK's spans (the fence around private
OpenTelemetry), each behind a capability probe with a public fallback: :func:`_record` reads any
span class through ``spanfields.read_span`` (its properties when its layout is not the SDK's), and
:meth:`_Rebuilder.span` builds a ``ReadableSpan`` through its constructor when the fields are not
the ones :func:`_readable_fields_known` checked. The record layout is :meth:`_Rebuilder.span`'s.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from opentelemetry.trace.span import DEFAULT_TRACE_STATE

from gymtrace._otel_private import fastpaths as _fastpaths
from gymtrace._otel_private.spanfields import last_object_cache
from gymtrace._otel_private.spanfields import read_span as _read

# Records per frame: a marshal call and a write per this many spans (about 0.3 ms of work).
_BLOCK = 256
_SAMPLED = 1  # TraceFlags.SAMPLED
_SHORT = 12  # fields of the short record form


def _state(trace_state: Any) -> tuple[tuple[str, str], ...] | None:
    return tuple(trace_state.items()) if trace_state else None


def _plain(attributes: Any) -> dict[str, Any]:
    return attributes if type(attributes) is dict else dict(attributes or {})


def _record(span: Any, remember: Callable[[Any, Any], None]) -> tuple[Any, ...]:
    """An ended span as plain values (see :meth:`_Rebuilder.span`); its resource and scope by key,
    handed to ``remember``. For any span class; gymtrace's own spans take
    :meth:`ProcessExporter.on_end`'s fast path."""
    (ctx, parent, name, kind, start, end, attributes, dropped_attributes, events, dropped_events, links,
     dropped_links, status, resource, scope) = _read(span)  # fmt: skip
    remember(resource, scope)
    return (
        ctx.trace_id, ctx.span_id, int(ctx.trace_flags), _state(ctx.trace_state),
        None if parent is None else parent.span_id, parent is not None and parent.is_remote,
        name, kind.value, start, end, _plain(attributes), dropped_attributes,
        _event_values(events) if events else (), dropped_events,
        tuple(
            (link.context.trace_id, link.context.span_id, int(link.context.trace_flags), link.context.is_remote,
             _plain(link.attributes), getattr(link.attributes, "dropped", 0))
            for link in links
        ) if links else (),
        dropped_links, *_status_values(status), id(resource), id(scope),
    )  # fmt: skip


def _event_values(events: Any) -> tuple[tuple[Any, ...], ...]:
    """A span's events as (name, timestamp, attributes, dropped attributes)."""
    return tuple(
        (e.name, e.timestamp, _plain(e.attributes), getattr(e.attributes, "dropped", 0)) for e in events
    )


# A status as (code, description).
_status_values = last_object_cache(lambda status: (status.status_code.value, status.description))


# gymtrace's own span class, whose records on_end builds from the fields (the tuple layout of the
# context as leanspan checked it), and the status its spans share until one is set; any other class goes
# through _record. Set by the first ProcessExporter: leanspan imports the SDK, and the API-only
# install imports this module.
_FAST: Any = None
_UNSET_STATUS: Any = object()


def learn_lean_span() -> None:
    global _FAST, _UNSET_STATUS
    from gymtrace._otel_private import leanspan as _leanspan
    from gymtrace._otel_private import leanspan_span as _leanspan_span

    _UNSET_STATUS = _leanspan_span._UNSET_STATUS
    _FAST = _leanspan_span._LeanSpan if _leanspan._SUPPORTED and _leanspan._CONTEXT_LAYOUT_KNOWN else None


def _records_from_fields_missing() -> list[str]:
    try:
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.trace import SpanContext

        from gymtrace._otel_private import leanspan as _leanspan
    except ImportError:
        return ["opentelemetry-sdk (not installed)"]
    missing = (
        [] if _leanspan._SUPPORTED and _leanspan._CONTEXT_LAYOUT_KNOWN else ["the lean span path (leanspan)"]
    )
    if not _readable_fields_known(ReadableSpan, SpanContext):
        missing.append(f"ReadableSpan.__init__ fields {', '.join(_READABLE_FIELDS)}")
    return missing


class LeanSpanRecords:
    """The span processor's ``on_end`` for ``ProcessExporter`` (``gymtrace._sdk.export_process``),
    which inherits it: gymtrace's own spans become records straight from their fields, with no
    call between the processor and the fields (this runs for every span). Every other span, and
    every span while no encoder process runs, goes to the host's ``_on_end_slow``."""

    if TYPE_CHECKING:  # what the host class provides
        _ready: bool
        _pending: collections.deque[tuple[Any, ...]]
        _last_resource: Any
        _last_scope: Any
        _lock: threading.RLock

        def _remember(self, resource: Any, scope: Any) -> None: ...
        def _send(self, records: list[tuple[Any, ...]]) -> None: ...
        def _take_pending(self) -> list[tuple[Any, ...]]: ...
        def _on_end_slow(self, span: Any) -> None: ...

    def on_end(self, span: Any) -> None:
        if type(span) is _FAST and self._ready and not span._links:
            # gymtrace's own spans, almost always: the record straight from the fields, no lock
            # (an episode's reward event included).
            trace_id, span_id, _, flags, trace_state, _ = span._context
            if not flags & _SAMPLED:
                return
            parent = span._parent
            attributes = span._attributes
            plain = getattr(attributes, "_dict", None)
            resource, scope = span._resource, span._instrumentation_scope
            if resource is not self._last_resource or scope is not self._last_scope:
                self._remember(resource, scope)
            record: tuple[Any, ...]
            events = span._events
            if (
                not events
                and span._status is _UNSET_STATUS
                and trace_state is DEFAULT_TRACE_STATE
                and type(plain) is dict
                and not attributes.dropped
            ):
                # The short form (see _Rebuilder.span): a sixth less to build and to marshal.
                record = (
                    trace_id, span_id, int(flags), None if parent is None else parent[1],
                    parent is not None and parent[2], span._name, span._kind._value_, span._start_time or 0,
                    span._end_time or 0, plain, id(resource), id(scope),
                )  # fmt: skip
            else:
                record = (
                    trace_id, span_id, int(flags), None if trace_state is DEFAULT_TRACE_STATE else _state(trace_state),
                    None if parent is None else parent[1], parent is not None and parent[2],
                    span._name, span._kind._value_, span._start_time or 0, span._end_time or 0,
                    plain if type(plain) is dict else _plain(attributes), getattr(attributes, "dropped", 0),
                    _event_values(events) if events else (), getattr(events, "dropped", 0), (), 0,
                    *_status_values(span._status), id(resource), id(scope),
                )  # fmt: skip
            pending = self._pending
            pending.append(record)
            if len(pending) >= _BLOCK:
                with self._lock:
                    if len(self._pending) >= _BLOCK and self._ready:  # not sent by another thread
                        self._send(self._take_pending())
            return
        self._on_end_slow(span)


_new_object = object.__new__
_new_tuple = tuple.__new__
_NO_STATE: Any = DEFAULT_TRACE_STATE


def _readable_fields_known(readable: Any, span_context: Any) -> bool:
    # The fields ReadableSpan.__init__ sets, as _Rebuilder._short sets them.
    probe = readable(name="probe", context=span_context(1, 2, False), resource=object())
    return sorted(vars(probe)) == sorted(_READABLE_FIELDS)


_READABLE_FIELDS = (
    "_name", "_context", "_kind", "_instrumentation_info", "_instrumentation_scope", "_parent", "_start_time",
    "_end_time", "_attributes", "_events", "_links", "_resource", "_status",
)  # fmt: skip


class _Rebuilder:
    """Records back into SDK ``ReadableSpan`` objects, with shared resources and scopes."""

    def __init__(self) -> None:
        from opentelemetry.sdk.trace import Event, ReadableSpan
        from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags, TraceState
        from opentelemetry.trace.status import Status, StatusCode

        self.resources: dict[int, Any] = {}
        self.scopes: dict[int, Any] = {}
        self._readable = ReadableSpan
        self._event, self._link = Event, Link
        self._context, self._flags, self._state = SpanContext, TraceFlags, TraceState
        self._kinds = {kind.value: kind for kind in SpanKind}
        self._codes = {code.value: code for code in StatusCode}
        self._status, self._unset = Status, Status(StatusCode.UNSET)
        self._flag_objects = {value: TraceFlags(value) for value in range(256)}
        self._last_parent: tuple[Any, ...] = (None, None, None, None)  # trace, span, remote, context
        from gymtrace._otel_private.leanspan import _CONTEXT_LAYOUT_KNOWN

        # Contexts built as tuples (checked by _leanspan) and spans from their fields (checked here).
        self._direct = _CONTEXT_LAYOUT_KNOWN and _readable_fields_known(ReadableSpan, SpanContext)

    def _short(self, record: tuple[Any, ...]) -> Any:
        """The short record (see ProcessExporter.on_end) as a ReadableSpan, its fields set as
        ``ReadableSpan.__init__`` sets them (checked once) and its contexts built as the tuples
        they are: this runs for every span the encoder process receives."""
        (trace_id, span_id, flags, parent_id, parent_remote, name, kind, start, end, attributes, resource,
         scope) = record  # fmt: skip
        trace_flags = self._flag_objects[flags]
        last = self._last_parent
        if parent_id is None:
            parent = None
        elif last[0] == trace_id and last[1] == parent_id and last[2] == parent_remote:
            parent = last[3]  # siblings (the steps of an episode) share their parent's context
        else:
            parent = _new_tuple(
                self._context, (trace_id, parent_id, parent_remote, trace_flags, _NO_STATE, True)
            )
            self._last_parent = (trace_id, parent_id, parent_remote, parent)
        span: Any = _new_object(self._readable)
        span._name = name
        span._context = _new_tuple(self._context, (trace_id, span_id, False, trace_flags, _NO_STATE, True))
        span._kind = self._kinds[kind]
        span._instrumentation_info = None
        span._instrumentation_scope = self.scopes.get(scope)
        span._parent = parent
        span._start_time = start
        span._end_time = end
        span._attributes = attributes
        span._events = ()
        span._links = ()
        span._resource = self.resources.get(resource)
        span._status = self._unset
        return span

    def define(self, resources: list[Any], scopes: list[Any]) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        for key, attributes, schema_url in resources:
            self.resources[key] = Resource(attributes, schema_url or None)
        for key, name, version, schema_url, attributes in scopes:
            self.scopes[key] = InstrumentationScope(
                name, version or None, schema_url or None, attributes or None
            )

    def _bounded(self, attributes: dict[str, Any], dropped: int) -> Any:
        if not dropped:
            return attributes
        from opentelemetry.attributes import BoundedAttributes

        bounded = BoundedAttributes(None, attributes, immutable=True)
        bounded.dropped = dropped
        return bounded

    def span(self, record: tuple[Any, ...]) -> Any:
        if len(record) == _SHORT and self._direct and record[10] in self.resources:
            return self._short(record)
        if len(record) == _SHORT:
            # No trace state, no dropped attributes, no events or links, an unset status.
            trace_id, span_id, flags, parent_id, parent_remote, *rest, attributes, resource, scope = record
            record = (trace_id, span_id, flags, None, parent_id, parent_remote, *rest, attributes, 0, (), 0, (),
                      0, 0, None, resource, scope)  # fmt: skip
        (trace_id, span_id, flags, state, parent_id, parent_remote, name, kind, start, end, attributes,
         dropped_attributes, events, dropped_events, links, dropped_links, code, description, resource,
         scope) = record  # fmt: skip
        trace_flags = self._flags(flags)
        trace_state = self._state(list(state)) if state else None
        context = self._context(trace_id, span_id, False, trace_flags, trace_state)
        parent = (
            None
            if parent_id is None
            else self._context(trace_id, parent_id, parent_remote, trace_flags, trace_state)
        )
        event_objects = _counted(
            [
                self._event(e_name, self._bounded(e_attributes, e_dropped), e_time)
                for e_name, e_time, e_attributes, e_dropped in events
            ],
            dropped_events,
        )
        link_objects = _counted(
            [
                self._link(
                    self._context(l_trace, l_span, l_remote, self._flags(l_flags)),
                    self._bounded(l_attr, l_dropped),
                )
                for l_trace, l_span, l_flags, l_remote, l_attr, l_dropped in links
            ],
            dropped_links,
        )
        status = (
            self._unset if code == 0 and not description else self._status(self._codes[code], description)
        )
        return self._readable(
            name=name,
            context=context,
            parent=parent,
            resource=self.resources.get(resource),
            attributes=self._bounded(attributes, dropped_attributes),
            events=event_objects,
            links=link_objects,
            kind=self._kinds[kind],
            status=status,
            start_time=start,
            end_time=end,
            instrumentation_scope=self.scopes.get(scope),
        )


def _counted(items: list[Any], dropped: int) -> Any:
    """``items`` as the span had them: a BoundedList saying how many were dropped, if any were."""
    if not dropped:
        return items
    from opentelemetry.sdk.util import BoundedList

    bounded = BoundedList.from_seq(len(items), items)
    bounded.dropped = dropped
    return bounded


_fastpaths.register(
    "encoder-process records from span fields",
    __name__,
    ("sdk _Span fields (as _leanspan checks them)", "ReadableSpan.__init__ fields"),
    "records built through the span's properties, spans rebuilt through ReadableSpan(...)",
    _records_from_fields_missing,
)
