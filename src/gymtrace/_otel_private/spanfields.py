"""Reading an ended SDK span's private fields: the OTLP encoders, the encoder-process records and
the identity processor read them instead of the ``ReadableSpan`` properties.

ReadableSpan's properties wrap its private fields: a MappingProxyType over the attributes whose
items() go through Python-level __iter__/__getitem__, a locked tuple copy of the events and of the
links (empty on almost every span), an isinstance per dropped count. Sampled in the CartPole loop's
export thread, they were a fifth of the encoding time. A span class that keeps every one of those
properties as the SDK defines them (the SDK's spans, their ReadableSpan copies, gymtrace's lean
span) is read from the fields (:func:`read_span`, checked once per class); any other class through
its properties, which is the public fallback.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from gymtrace._constants import KIND as _KIND
from gymtrace._otel_private import fastpaths as _fastpaths

# What the encoders read of an ended span, in this order (a plain tuple: a NamedTuple's __new__
# alone cost ~0.7 µs a span).
_Read = tuple[
    Any,
    Any,
    str,
    Any,
    int,
    int,
    Mapping[str, Any],
    int,
    Sequence[Any],
    int,
    Sequence[Any],
    int,
    Any,
    Any,
    Any,
]


_PROPERTIES = (
    "name",
    "parent",
    "kind",
    "start_time",
    "end_time",
    "attributes",
    "dropped_attributes",
    "events",
    "dropped_events",
    "links",
    "dropped_links",
    "status",
    "resource",
    "instrumentation_scope",
)
_FIELDS = ("_context", *(f"_{name}" for name in _PROPERTIES if not name.startswith("dropped")))
_DIRECT: dict[type, bool] = {}


def _sdk_layout(kind: type, span: Any) -> bool:
    try:
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.sdk.trace import Span as SdkSpan
    except ImportError:
        return False
    return (
        issubclass(kind, ReadableSpan)
        and all(getattr(kind, name, None) is getattr(ReadableSpan, name) for name in _PROPERTIES)
        and kind.get_span_context in (ReadableSpan.get_span_context, SdkSpan.get_span_context)
        and all(hasattr(span, name) for name in _FIELDS)
    )


def readable_directly(span: Any) -> bool:
    """Whether ``span``'s class keeps the SDK's fields behind the SDK's properties (see above)."""
    kind = type(span)
    direct = _DIRECT.get(kind)
    if direct is None:
        if len(_DIRECT) > 64:
            _DIRECT.clear()
        direct = _DIRECT[kind] = _sdk_layout(kind, span)
    return direct


def _read(span: Any) -> _Read:
    if not readable_directly(span):
        return (
            span.get_span_context(), span.parent, span.name, span.kind, span.start_time or 0,
            span.end_time or 0, span.attributes or {}, span.dropped_attributes, span.events,
            span.dropped_events, span.links, span.dropped_links, span.status, span.resource,
            span.instrumentation_scope,
        )  # fmt: skip
    attributes, events, links = span._attributes, span._events, span._links
    # An ended span's BoundedAttributes is immutable: its plain dict is what the proxy would show.
    plain = getattr(attributes, "_dict", None)
    return (
        span._context, span._parent, span._name, span._kind, span._start_time or 0,
        span._end_time or 0, plain if type(plain) is dict else (attributes or {}),
        getattr(attributes, "dropped", 0), tuple(events) if events else (), getattr(events, "dropped", 0),
        tuple(links) if links else (), getattr(links, "dropped", 0), span._status, span._resource,
        span._instrumentation_scope,
    )  # fmt: skip


# Every reader of ended spans (the encoders, the encoder-process records) meets the same few status
# objects again and again: each keeps its encoding of the last one.
_Value = TypeVar("_Value")


def last_object_cache(compute: Callable[[Any], _Value]) -> Callable[[Any], _Value]:
    """``compute(obj)``, kept for the last object seen (by identity; the object is held, so its id
    is never another's): almost every span shares one status object, the unset one."""
    last: tuple[Any, Any] = (object(), None)

    def cached(obj: Any) -> _Value:
        nonlocal last
        seen = last
        if obj is seen[0]:
            return seen[1]  # type: ignore[no-any-return]
        value = compute(obj)
        last = (obj, value)  # replaced whole: the export threads of two queues may race
        return value

    return cached


# The read_span of the encoders: one module-level name, bound once by its callers.
read_span = _read


class SkipsOwnSpans:
    """Base of the identity processor: ``on_start`` returns at once for a span that started with
    ``gym.kind`` among its attributes (every span gymtrace makes, every step of a fast loop),
    read from the SDK span's plain dict, so those spans cost no call here; any other span goes to
    ``start_other``. ``span.attributes`` would wrap the dict twice, and ``in`` on the wrapper runs
    Python-level Mapping code (~0.5 µs). A span without that dict (not an SDK span) takes the
    general path too."""

    # False while every span needs the general path (extra attributes derived for each one).
    skip_own = True

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        if self.skip_own:
            try:
                plain = span._attributes._dict
                if type(plain) is dict and _KIND in plain:
                    return
            except Exception:  # noqa: BLE001 - not an SDK span: the general path below
                pass
        self.start_other(span, parent_context)

    def start_other(self, span: Any, parent_context: Any) -> None:
        raise NotImplementedError


def attribute_dict(span: Any) -> dict[str, Any] | None:
    """``span``'s plain attribute dict when it is an SDK span that has one, else None (the caller
    then reads ``span.attributes``)."""
    plain = getattr(getattr(span, "_attributes", None), "_dict", None)
    return plain if isinstance(plain, dict) else None


def _span_reads_missing() -> list[str]:
    try:
        from opentelemetry.sdk.trace import TracerProvider
    except ImportError:
        return ["opentelemetry-sdk (not installed)"]
    span = TracerProvider().get_tracer("gymtrace.probe").start_span("probe", attributes={"k": 1})
    missing = [] if attribute_dict(span) == {"k": 1} else ["BoundedAttributes._dict (the identity processor)"]
    span.end()
    if not readable_directly(span):
        missing.append(f"ReadableSpan fields {', '.join(_FIELDS)} behind its properties")
    return missing


_fastpaths.register(
    "span fields read directly",
    __name__,
    (
        "ReadableSpan._attributes/_events/_links/... behind the SDK's properties",
        "BoundedAttributes._dict",
    ),
    "the ReadableSpan properties (a fifth more encoding time)",
    _span_reads_missing,
)
