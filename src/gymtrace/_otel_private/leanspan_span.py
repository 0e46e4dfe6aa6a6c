"""gymtrace's lean span: the SDK's own span class, filled and ended without the SDK's copies.

Separate from the tracer that builds it (``leanspan``): this is the class every reader of a span
sees (the OTLP encoder, the encoder-process records, span processors), with the probe of the
``BoundedAttributes`` fields its setters fill. Every method catches its own failure and turns the
lean path off for the process (:func:`_lean_failed`), never raising into the user's block.
"""

from __future__ import annotations

import threading
from typing import Any

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk import trace as sdk_trace
from opentelemetry.sdk.util import BoundedList
from opentelemetry.trace.status import Status, StatusCode

from gymtrace._model import errors as _errors

_PLAIN = (str, bool, int, float)
_UNSET_STATUS = Status(StatusCode.UNSET)
_NONE: tuple[Any, ...] = ()
_new_attributes = object.__new__

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
