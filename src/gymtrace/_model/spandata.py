"""A plain, SDK-free record of a finished span, readable from every place spans end up.

The contract checker and ``gymtrace tree`` work on these, whether the spans come from
``gymtrace.testing.capture_spans()`` (SDK ``ReadableSpan``), from the embedded default's file of
OTLP/JSON lines, or from Jaeger's query API.
"""

from __future__ import annotations

import base64
import json
import marshal
import operator
import pickle
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

from gymtrace import _constants as c
from gymtrace._model.anyvalue import any_value as _any_value
from gymtrace._model.numbers import read_int
from gymtrace._model.tracefiles import (
    REQUEST_START,
    Part,
    Warn,
    compression_of,
    line_cut_short,
    open_lines,
    trace_files,
)
from gymtrace._model.tracefiles import TraceFileError as TraceFileError


@dataclass(frozen=True)
class LinkData:
    trace_id: str
    span_id: str
    attributes: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EventData:
    name: str
    time_ns: int
    attributes: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SpanData:
    trace_id: str  # 32 lowercase hex digits
    span_id: str  # 16 lowercase hex digits
    parent_id: str | None
    name: str
    start_ns: int
    end_ns: int
    attributes: Mapping[str, Any]
    events: tuple[EventData, ...] = ()
    links: tuple[LinkData, ...] = ()
    status: str = "UNSET"  # UNSET, OK or ERROR
    status_message: str = ""
    service: str = ""
    span_kind: str = "INTERNAL"
    # The resource's service.instance.id: tells apart processes of one service (the checker groups
    # step and turn numbers by the process that recorded them).
    service_instance: str = ""

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


def _hex(value: int, width: int) -> str:
    return format(value, f"0{width}x")


def from_readable(span: Any) -> SpanData:
    """Convert an SDK ``ReadableSpan``."""
    ctx = span.get_span_context()
    parent = span.parent
    resource = getattr(span, "resource", None)
    service = resource.attributes.get("service.name", "") if resource is not None else ""
    instance = resource.attributes.get("service.instance.id", "") if resource is not None else ""
    return SpanData(
        trace_id=_hex(ctx.trace_id, 32),
        span_id=_hex(ctx.span_id, 16),
        parent_id=_hex(parent.span_id, 16) if parent is not None else None,
        name=span.name,
        start_ns=span.start_time or 0,
        end_ns=span.end_time or 0,
        attributes=dict(span.attributes or {}),
        events=tuple(EventData(e.name, e.timestamp, dict(e.attributes or {})) for e in span.events),
        links=tuple(
            LinkData(
                _hex(link.context.trace_id, 32), _hex(link.context.span_id, 16), dict(link.attributes or {})
            )
            for link in span.links
        ),
        status=span.status.status_code.name,
        status_message=span.status.description or "",
        service=str(service),
        span_kind=span.kind.name,
        service_instance=str(instance),
    )


# -- OTLP/JSON (https://opentelemetry.io/docs/specs/otlp/#json-protobuf-encoding) -------------------

_OTLP_KINDS = ("UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER")
_OTLP_STATUS = ("UNSET", "OK", "ERROR")


def _key_values(attributes: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    return [{"key": k, "value": _any_value(v)} for k, v in (attributes or {}).items()]


class BadTraceData(ValueError):
    """A field of an OTLP/JSON request has the wrong type or an impossible value; the message names
    the field (the file reader adds the file and line)."""


def _type_name(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )


def _object(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise BadTraceData(f"{what} must be an object, got {_type_name(value)}")
    return value


def _array(value: Any, what: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise BadTraceData(f"{what} must be an array, got {_type_name(value)}")
    return value


def _text(value: Any, what: str, default: str = "") -> str:
    if value is None:
        return default
    if not isinstance(value, str):
        raise BadTraceData(f"{what} must be a string, got {_type_name(value)}")
    text: str = value
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            # A lone surrogate ("\\ud800" in the JSON; a Python string can hold one, and the file
            # exporter writes it as JSON does): read as U+FFFD, which every output can print.
            text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def _int64(value: Any, what: str, default: int = 0) -> int:
    """An OTLP/JSON integer: a JSON number or, as the encoding writes int64, a string of digits."""
    if value is None:
        return default
    number = read_int(value, None, digits=True)
    if number is not None:
        return number
    raise BadTraceData(f"{what} must be an integer, got {_type_name(value)} {str(value)[:40]!r}")


def _time(value: Any, what: str) -> int:
    number = _int64(value, what)
    if not 0 <= number < 2**64:
        raise BadTraceData(f"{what} must be nanoseconds since the epoch (0 to 2^64), got {number}")
    return number


def _hex_id(value: Any, what: str, width: int) -> str:
    text = _text(value, what)
    if len(text) != width or not _HEX.fullmatch(text):
        raise BadTraceData(f"{what} must be {width} hexadecimal digits, got {text[:40]!r}")
    return text.lower()


def _enum(value: Any, what: str, prefix: str, names: tuple[str, ...], default: int) -> str:
    # Protobuf's JSON mapping allows an enum's number or its name (SPAN_KIND_SERVER). An unknown
    # number or name reads as the default (a newer OTLP may add values); a wrong type does not.
    if isinstance(value, str) and value.startswith(prefix):
        name = value[len(prefix) :]
        return name if name in names else names[default]
    number = _int64(value, what, default)
    return names[number] if 0 <= number < len(names) else names[default]


_HEX = re.compile(r"[0-9a-fA-F]+")


def _from_any_value(value: Any, what: str = "value") -> Any:
    value = _object(value, what)
    if "stringValue" in value:
        return _text(value["stringValue"], f"{what}.stringValue")
    if "boolValue" in value:
        if not isinstance(value["boolValue"], bool):
            raise BadTraceData(f"{what}.boolValue must be a boolean, got {_type_name(value['boolValue'])}")
        return value["boolValue"]
    if "intValue" in value:
        return _int64(value["intValue"], f"{what}.intValue")
    if "doubleValue" in value:
        double = value["doubleValue"]
        if isinstance(double, (int, float)) and not isinstance(double, bool):
            return float(double)
        if isinstance(double, str) and double in ("NaN", "Infinity", "-Infinity"):
            return float(double.replace("Infinity", "inf"))
        raise BadTraceData(f"{what}.doubleValue must be a number, got {_type_name(double)}")
    if "arrayValue" in value:
        array = _object(value["arrayValue"], f"{what}.arrayValue")
        return tuple(_from_any_value(v, f"{what}.arrayValue[]") for v in _array(array.get("values"), what))
    if "bytesValue" in value:
        try:
            return base64.b64decode(_text(value["bytesValue"], f"{what}.bytesValue"), validate=True)
        except ValueError as exc:
            raise BadTraceData(f"{what}.bytesValue must be base64 ({exc})") from exc
    return None


def decode_any_value(value: Any) -> Any:
    """One OTLP/JSON ``AnyValue`` object as the readers see it (:class:`BadTraceData` if it is not
    one)."""
    return _from_any_value(value)


# The gym attributes every reader relies on, with the type gymtrace writes them as: a file where one
# has another type was not written by gymtrace, and is refused with the attribute's name instead of
# failing deep inside a reader (issue 31).
_GYM_TYPES: dict[str, tuple[type, ...]] = {
    c.KIND: (str,),
    c.RUN_ID: (str,),
    c.TASK_ID: (str,),
    c.ROLLOUT_ID: (str,),
    c.EPISODE_ID: (str,),
    c.ROLLOUT_OUTCOME: (str,),
    c.EPISODE_OUTCOME: (str,),
    c.FAILURE_KIND: (str,),
    c.LINK_RELATION: (str,),
    c.OUTCOME_SOURCE: (str,),
    c.LIVE_EVENT: (str,),
    c.REWARD: (int, float),
    c.ROLLOUT_REPEAT: (int,),
    c.EPISODE_ATTEMPT: (int,),
    c.ROLLOUT_ATTEMPTS: (int,),
    c.TURN_NUMBER: (int,),
    c.STEP_NUMBER: (int,),
    c.LIVE_STARTED: (int,),
    c.LIVE_INTERVAL: (int, float),
    c.LIVE_STEP: (int,),
}


_SLOW = object()


def _plain_value(value: dict[str, Any]) -> Any:
    """What :func:`_from_any_value` reads from the common values (ASCII text, digits, a float, a
    boolean) without its checks; ``_SLOW`` for anything else, which it then reads and names."""
    if "stringValue" in value:
        text = value["stringValue"]
        return text if type(text) is str and text.isascii() else _SLOW
    if "boolValue" in value:
        flag = value["boolValue"]
        return flag if type(flag) is bool else _SLOW
    if "intValue" in value:
        number = value["intValue"]
        if type(number) is str and number.isascii() and number.isdigit():
            return int(number)
        return number if type(number) is int else _SLOW
    if "doubleValue" in value:
        double = value["doubleValue"]
        return float(double) if type(double) in (float, int) else _SLOW
    return _SLOW


def _from_key_values(
    items: Any, what: str = "attributes", keys: frozenset[str] | None = None
) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for item in _array(items, what):
        if (
            keys is not None
            and type(item) is dict
            and not (type(key := item.get("key")) is str and key in keys)
        ):
            continue  # read lean: only the keys asked for (a key that is not text is none of them)
        if type(item) is dict:
            # The fast path: a readable key and a plain value of the type _GYM_TYPES wants.
            key, value = item.get("key"), item.get("value")
            if type(key) is str and key.isascii() and type(value) is dict:
                plain = _plain_value(value)
                if plain is not _SLOW:
                    wanted = _GYM_TYPES.get(key)
                    if wanted is None or type(plain) in wanted:
                        found[sys.intern(key)] = plain
                        continue
        item = _object(item, f"{what}[]")
        key = _text(item.get("key"), f"{what}[].key")
        value = _from_any_value(item.get("value", {}), f"attribute {key!r}")
        wanted = _GYM_TYPES.get(key)
        if wanted is not None and (
            not isinstance(value, wanted) or (isinstance(value, bool) and bool not in wanted)
        ):
            raise BadTraceData(
                f"attribute {key!r} must be {' or '.join(t.__name__ for t in wanted)}, got {value!r:.40}"
            )
        # Interned: a reader holding many spans holds each attribute name once, not once a span.
        found[sys.intern(key)] = value
    return found


def _event_json(time_ns: int, name: str, attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    return {"timeUnixNano": str(time_ns), "name": name, "attributes": _key_values(attributes)}


def _link_json(trace_id: str, span_id: str, attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    return {"traceId": trace_id, "spanId": span_id, "attributes": _key_values(attributes)}


def encode_otlp_json(spans: Iterable[Any]) -> dict[str, Any]:
    """SDK ``ReadableSpan`` objects to one OTLP/JSON ``ExportTraceServiceRequest``."""
    by_resource: dict[int, tuple[Any, dict[tuple[str, str], list[dict[str, Any]]]]] = {}
    for span in spans:
        resource = span.resource
        _, scopes = by_resource.setdefault(id(resource), (resource, {}))
        scope = span.instrumentation_scope
        key = (scope.name, scope.version or "") if scope is not None else ("", "")
        ctx = span.get_span_context()
        record: dict[str, Any] = {
            "traceId": _hex(ctx.trace_id, 32),
            "spanId": _hex(ctx.span_id, 16),
            "name": span.name,
            "kind": span.kind.value + 1,
            "startTimeUnixNano": str(span.start_time or 0),
            "endTimeUnixNano": str(span.end_time or 0),
            "attributes": _key_values(span.attributes),
            "flags": int(ctx.trace_flags),
        }
        if span.parent is not None:
            record["parentSpanId"] = _hex(span.parent.span_id, 16)
        if span.events:
            record["events"] = [_event_json(e.timestamp, e.name, e.attributes) for e in span.events]
        if span.links:
            record["links"] = [
                _link_json(_hex(link.context.trace_id, 32), _hex(link.context.span_id, 16), link.attributes)
                for link in span.links
            ]
        status: dict[str, Any] = {"code": span.status.status_code.value}
        if span.status.description:
            status["message"] = span.status.description
        record["status"] = status
        scopes.setdefault(key, []).append(record)
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": _key_values(resource.attributes)},
                "scopeSpans": [
                    {"scope": {"name": name, "version": version}, "spans": records}
                    for (name, version), records in scopes.items()
                ],
            }
            for resource, scopes in by_resource.values()
        ]
    }


_ATTEMPT_SUFFIX = re.compile(r"^(.+)-a([0-9]{1,9})$")


def nemo_gym_identity(key: str) -> tuple[str, int | None]:
    """The rollout ID and attempt that NeMo Gym's capture key ``nemo.gym.rollout.id`` names: the key,
    with ``-a{n}`` after attempt 0 (None: no suffix)."""
    qualified = _ATTEMPT_SUFFIX.match(key)
    return (qualified.group(1), int(qualified.group(2))) if qualified else (key, None)


def _with_rollout_id(attributes: dict[str, Any]) -> dict[str, Any]:
    """NeMo Gym's own telemetry names a rollout ``nemo.gym.rollout.id`` (its capture key, with
    ``-a{n}`` after attempt 0): where no ``gym.rollout.id`` is set, that key is the rollout ID, and
    its suffix the attempt, so every reader finds NeMo Gym's rollouts as its own."""
    key = attributes.get(c.NEMO_GYM_ROLLOUT_ID)
    if c.ROLLOUT_ID in attributes or not isinstance(key, str) or not key:
        return attributes
    rollout_id, attempt = nemo_gym_identity(key)
    attributes[c.ROLLOUT_ID] = rollout_id
    if attempt is not None and c.EPISODE_ATTEMPT not in attributes:
        attributes[c.EPISODE_ATTEMPT] = attempt
    return attributes


def encode_spandata_json(
    spans: Iterable[SpanData], resource: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """``SpanData`` records to one OTLP/JSON ``ExportTraceServiceRequest`` (the inverse of
    :func:`decode_otlp_json`): one resource per service and instance, ``resource`` added to each."""
    by_resource: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for span in spans:
        record: dict[str, Any] = {
            "traceId": span.trace_id,
            "spanId": span.span_id,
            "name": span.name,
            "kind": _OTLP_KINDS.index(span.span_kind) if span.span_kind in _OTLP_KINDS else 1,
            "startTimeUnixNano": str(span.start_ns),
            "endTimeUnixNano": str(span.end_ns),
            "attributes": _key_values(span.attributes),
            "flags": 1,
        }
        if span.parent_id is not None:
            record["parentSpanId"] = span.parent_id
        if span.events:
            record["events"] = [_event_json(e.time_ns, e.name, e.attributes) for e in span.events]
        if span.links:
            record["links"] = [
                _link_json(link.trace_id, link.span_id, link.attributes) for link in span.links
            ]
        status: dict[str, Any] = {
            "code": _OTLP_STATUS.index(span.status) if span.status in _OTLP_STATUS else 0
        }
        if span.status_message:
            status["message"] = span.status_message
        record["status"] = status
        by_resource.setdefault((span.service, span.service_instance), []).append(record)
    resource_spans = []
    for (service, instance), records in by_resource.items():
        attributes = {**(resource or {}), c.SERVICE_NAME: service}
        if instance:
            attributes[c.SERVICE_INSTANCE_ID] = instance
        resource_spans.append(
            {
                "resource": {"attributes": _key_values(attributes)},
                "scopeSpans": [{"scope": {"name": c.INSTRUMENTATION_NAME}, "spans": records}],
            }
        )
    return {"resourceSpans": resource_spans}


# Decodes one raw span given its resource's service name and instance: the full decoder, or one that
# reads less (decode_lean).
Decode = Callable[[Mapping[str, Any], str, str], "SpanData"]


class MadeSpans(list[SpanData]):
    """The spans the native reader made of a line itself (each as :func:`decode_reduced` makes it),
    in the line's order: all a reader keeps of the line, with nothing left to parse."""


class LineReducer(Protocol):
    """What the native reader makes of each line before it is parsed (see :func:`iter_requests`)."""

    def reduce(self, line: bytes) -> bytes | list[SpanData]: ...

    def read(
        self, fd: int, start: int, stop: int | None = None
    ) -> Iterator[tuple[bytes | list[SpanData], bool]]:
        """The lines of the plain file open as ``fd``, from ``start`` to the line ``stop`` is in,
        each reduced as it is read (or made into the spans kept), with whether it ends without a
        newline."""
        ...

    def discard(self) -> None:
        """Take back what was taken of the line reduced last: the reader skipped it."""


def decode_otlp_json(
    request: Any, keep: Callable[[Mapping[str, Any]], bool] | None = None, decode: Decode | None = None
) -> Iterator[SpanData]:
    """One OTLP/JSON ``ExportTraceServiceRequest`` (a line of the embedded default's file).

    Every field of a span decoded is type-checked: a field of the wrong type raises
    :class:`BadTraceData` naming it, never an ``AttributeError`` from deep inside a reader.
    ``keep``, given a span's raw object, says whether to decode it (a reader that needs few spans
    skips the rest); ``decode`` decodes it (default: every field)."""
    decode = decode or decode_span
    request = _object(request, "the request")
    for resource_spans in _array(request.get("resourceSpans"), "resourceSpans"):
        resource_spans = _object(resource_spans, "resourceSpans[]")
        resource = _from_key_values(
            _object(resource_spans.get("resource") or {}, "resource").get("attributes"), "resource attributes"
        )
        service = sys.intern(str(resource.get("service.name", "")))
        instance = sys.intern(str(resource.get("service.instance.id", "")))
        for scope_spans in _array(resource_spans.get("scopeSpans"), "scopeSpans"):
            scope_spans = _object(scope_spans, "scopeSpans[]")
            for s in _array(scope_spans.get("spans"), "spans"):
                s = _object(s, "spans[]")
                if keep is None or keep(s):
                    yield decode(s, service, instance)


def decode_span(s: Mapping[str, Any], service: str, instance: str) -> SpanData:
    """One raw OTLP/JSON span, every field read and checked (see :func:`decode_otlp_json`)."""
    span = _plain_span(s, service, instance)
    return span if span is not None else _checked_span(s, service, instance)


# -- the fast path ------------------------------------------------------------------------------
#
# A training run's file holds millions of spans, nearly all written by gymtrace's own exporter:
# ASCII IDs and names, times and int64 attributes as strings of digits, plain attribute values.
# Those are read here without the per-field checks (a span of ~11 attributes in ~4 us instead of
# ~13 us); anything else, a field missing, of another type or not plain, makes the fast path give
# up (None) and the checked path read the span, so both read the same spans the same way and a bad
# span is named by the checked path's message (issue 45).

_KEY = operator.itemgetter("key")
_VALUE = operator.itemgetter("value")
_HEX_DIGITS = "0123456789abcdef"
_KINDS_BY_NUMBER = dict(enumerate(_OTLP_KINDS))
_STATUS_BY_NUMBER = dict(enumerate(_OTLP_STATUS))
_new = object.__new__
_set = object.__setattr__


def span_from_fields(fields: dict[str, Any]) -> SpanData:
    """A :class:`SpanData` of fields already read and checked (the fast decoder's, a packed span's,
    the native reader's): without ``__init__``, whose frozen-dataclass checks they do not need."""
    span = _new(SpanData)
    _set(span, "__dict__", fields)
    return span


def raw_attributes(raw: Mapping[str, Any]) -> dict[str, Any] | None:
    """A raw span's attributes as ``{key: raw AnyValue object}`` (the last of a key that repeats),
    read in C (``dict(zip(map(...)))``: a reader that looks at a few keys of every span pays for
    no loop in Python); None when they are not a list of ``{key, value}`` objects or a key repeats
    (then the checked decoder names what is wrong)."""
    items = raw.get("attributes")
    if items is None:
        return {}
    if items.__class__ is not list:
        return None
    try:
        found = dict(zip(map(_KEY, items), map(_VALUE, items), strict=True))
    except (TypeError, KeyError):
        return None
    return found if len(found) == len(items) else None


def plain_value(value: Any) -> Any:
    """What the checked decoder reads from a common raw ``AnyValue`` (ASCII text, a string of
    digits, a number, a boolean); :data:`NOT_PLAIN` for anything else."""
    if value.__class__ is not dict or len(value) != 1:
        return NOT_PLAIN
    for kind, x in value.items():
        if kind == "stringValue":
            return x if x.__class__ is str and x.isascii() else NOT_PLAIN
        if kind == "intValue":
            if x.__class__ is str:
                return int(x) if x.isdigit() and x.isascii() else NOT_PLAIN
            return x if x.__class__ is int else NOT_PLAIN
        if kind == "doubleValue":
            return float(x) if x.__class__ is float or x.__class__ is int else NOT_PLAIN
        if kind == "boolValue":
            return x if x.__class__ is bool else NOT_PLAIN
    return NOT_PLAIN


NOT_PLAIN: Any = _SLOW


def _plain_attributes(raw: Mapping[str, Any], keys: frozenset[str] | None) -> dict[str, Any] | None:
    """The attributes of a raw span (those in ``keys``, when given) if each is plain and of the type
    :data:`_GYM_TYPES` wants; else None. Of a key given twice, the last (as the checked path)."""
    items = raw.get("attributes")
    if items is None:
        return {}
    if items.__class__ is not list:
        return None
    attributes: dict[str, Any] = {}
    intern = sys.intern
    gym_types = _GYM_TYPES
    try:
        for item in items:
            key = item["key"]
            if keys is not None and key not in keys:
                continue
            value = item["value"]
            if (
                key.__class__ is not str
                or not key.isascii()
                or value.__class__ is not dict
                or len(value) != 1
            ):
                return None
            # plain_value inlined for the two common kinds (this loop runs ~10 times a span).
            plain = value.get("stringValue", _SLOW)
            if plain is not _SLOW:
                if plain.__class__ is not str or not plain.isascii():
                    return None
                # Interned: a reader holding a run's rollouts holds each run ID, task ID, kind and
                # outcome once, not once a span (a third of what it held was such text).
                plain = intern(plain)
            else:
                plain = value.get("intValue", _SLOW)
                if plain.__class__ is str and plain.isdigit() and plain.isascii():
                    plain = int(plain)
                else:
                    plain = plain_value(value)
                    if plain is _SLOW:
                        return None
            wanted = gym_types.get(key)
            if wanted is not None and plain.__class__ not in wanted:
                return None
            attributes[intern(key)] = plain
    except (TypeError, KeyError):  # an item that is not a {key, value} object, a key that is not text
        return None
    return attributes


# The trace ID last read whole: a trace's spans come together, so most spans' trace IDs are checked
# by comparing them with it.
_last_trace_id = [""]


def _plain_span(
    s: Mapping[str, Any],
    service: str,
    instance: str,
    keys: frozenset[str] | None = None,
    events: bool = True,
) -> SpanData | None:
    """A span whose every field is plain, decoded without the checks; None otherwise. With
    ``keys``, only those attributes, and no events or links (see :func:`decode_lean`); without
    ``events``, no events."""
    trace_id, span_id, name = s.get("traceId"), s.get("spanId"), s.get("name")
    # An ID is lowercase hex: nothing left once its hex digits are stripped (a third of a regex).
    if (
        trace_id.__class__ is not str
        or span_id.__class__ is not str
        or name.__class__ is not str
        or not name.isascii()
        or len(span_id) != 16
        or span_id.strip(_HEX_DIGITS)
    ):
        return None
    if trace_id != _last_trace_id[0]:
        if len(trace_id) != 32 or trace_id.strip(_HEX_DIGITS):
            return None
        _last_trace_id[0] = trace_id
    parent = s.get("parentSpanId")
    if parent == "" or parent is None:
        parent = None
    elif parent.__class__ is not str or len(parent) != 16 or parent.strip(_HEX_DIGITS):
        return None
    # Times as gymtrace writes them: 1 to 19 ASCII digits (below 2^64).
    start, end = s.get("startTimeUnixNano"), s.get("endTimeUnixNano")
    if (
        start.__class__ is not str
        or end.__class__ is not str
        or not 0 < len(start) < 20
        or not 0 < len(end) < 20
    ):
        return None
    both = start + end
    if not both.isdigit() or not both.isascii():
        return None
    # A bool or a float is no enum number (the checked path refuses them; a dict would take True
    # for 1), hence the class before the look-up.
    number = s.get("kind", 1)
    kind = _KINDS_BY_NUMBER.get(number) if number.__class__ is int else None
    status = s.get("status")
    code: str | None = "UNSET"
    message: Any = ""
    if status is None:
        pass
    elif status.__class__ is dict:
        number = status.get("code", 0)
        code = _STATUS_BY_NUMBER.get(number) if number.__class__ is int else None
        message = status.get("message", "")
    else:
        return None
    if kind is None or code is None or message.__class__ is not str:
        return None
    attributes = _plain_attributes(s, keys)
    if attributes is None:
        return None
    if c.NEMO_GYM_ROLLOUT_ID in attributes:
        attributes = _with_rollout_id(attributes)
    span_events: tuple[EventData, ...] = ()
    links: tuple[LinkData, ...] = ()
    if keys is None and ((events and "events" in s) or "links" in s):
        try:
            span_events, links = _events_and_links(s, events)
        except BadTraceData:
            return None
    return span_from_fields(
        {
            "trace_id": trace_id,
            "span_id": span_id,
            "parent_id": parent,
            "name": name,
            "start_ns": int(start),
            "end_ns": int(end),
            "attributes": attributes,
            "events": span_events,
            "links": links,
            "status": code,
            "status_message": message if message.isascii() else _text(message, "status.message"),
            "service": service,
            "span_kind": kind,
            "service_instance": instance,
        }
    )


def decode_lean(s: Mapping[str, Any], service: str, instance: str, keys: frozenset[str]) -> SpanData:
    """A raw span with only the attributes in ``keys`` (each checked as the full decoder checks it)
    and no events or links: what ``gymtrace check`` holds of a span whose other attributes, events
    and links no rule reads (``_read.check.stream``). Its IDs, times, name and status are read
    and checked as :func:`decode_otlp_json` reads them."""
    span = _plain_span(s, service, instance, keys)
    return span if span is not None else _checked_span(s, service, instance, keys)


def _events_and_links(
    s: Mapping[str, Any], read_events: bool = True
) -> tuple[tuple[EventData, ...], tuple[LinkData, ...]]:
    events = []
    for e in _array(s.get("events"), "events") if read_events else ():
        e = _object(e, "events[]")
        events.append(
            EventData(
                _text(e.get("name"), "events[].name"),
                _time(e.get("timeUnixNano"), "events[].timeUnixNano"),
                _from_key_values(e.get("attributes"), "event attributes"),
            )
        )
    links = []
    for link in _array(s.get("links"), "links"):
        link = _object(link, "links[]")
        links.append(
            LinkData(
                _hex_id(link.get("traceId"), "links[].traceId", 32),
                _hex_id(link.get("spanId"), "links[].spanId", 16),
                _from_key_values(link.get("attributes"), "link attributes"),
            )
        )
    return tuple(events), tuple(links)


def _checked_span(
    s: Mapping[str, Any],
    service: str,
    instance: str,
    keys: frozenset[str] | None = None,
    read_events: bool = True,
) -> SpanData:
    """A span decoded field by field, each checked: the error names the first field that is wrong.
    With ``keys``, as :func:`decode_lean` reads it; without ``read_events``, no events."""
    status = _object(s.get("status") or {}, "status")
    parent = _text(s.get("parentSpanId"), "parentSpanId")
    events, links = _events_and_links(s, read_events) if keys is None else ((), ())
    return SpanData(
        trace_id=_hex_id(s.get("traceId"), "traceId", 32),
        span_id=_hex_id(s.get("spanId"), "spanId", 16),
        parent_id=_hex_id(parent, "parentSpanId", 16) if parent else None,
        name=_text(s.get("name"), "name"),
        start_ns=_time(s.get("startTimeUnixNano"), "startTimeUnixNano"),
        end_ns=_time(s.get("endTimeUnixNano"), "endTimeUnixNano"),
        attributes=_with_rollout_id(_from_key_values(s.get("attributes"), keys=keys)),
        events=events,
        links=links,
        status=_enum(status.get("code"), "status.code", "STATUS_CODE_", _OTLP_STATUS, 0),
        status_message=_text(status.get("message"), "status.message"),
        service=service,
        span_kind=_enum(s.get("kind"), "kind", "SPAN_KIND_", _OTLP_KINDS, 1),
        service_instance=instance,
    )


def read_otlp_json_lines(
    path: str | Path, *, partial_last_line: bool = False, warn: Warn | None = None
) -> list[SpanData]:
    """The spans in a file of OTLP/JSON lines and its segments, plain or compressed, or in every
    trace file of a directory (what ``GYMTRACE_FILE=DIR/`` writes: one file per process); see
    :func:`gymtrace._model.tracefiles.trace_files`. ``partial_last_line``: the file is still being
    written (``gymtrace live``), so a last line (or compressed block) caught mid-write is skipped
    rather than an error; it is whole at the next read. ``warn``: a last line or block a killed
    writer left cut short is skipped and told, naming the file, and so is a foreign file in a
    directory."""
    return read_trace_files(trace_files(path, warn), partial_last_line=partial_last_line, warn=warn)


def _orjson_loads() -> Callable[[bytes], Any] | None:
    try:
        import orjson
    except ImportError:  # the plain install: the standard library's json
        return None
    loads: Callable[[bytes], Any] = orjson.loads
    return loads


_FAST_LOADS = _orjson_loads()


def parses_fast() -> bool:
    """Whether lines are parsed by orjson (the ``fast`` extra) rather than the standard library."""
    return _FAST_LOADS is not None


def decode_held(s: Mapping[str, Any], service: str, instance: str, *, events: bool = False) -> SpanData:
    """A span a reader holds to the end (a rollout root, an episode...): :func:`decode_span`, without
    its events unless ``events`` (no summary reader reads them: an episode's exception stack traces
    were most of the text held), of a copy of ``s`` (``marshal`` copies parsed JSON exactly, NaN
    and lone surrogates too, in C), so it is held apart from the line it was parsed from, whose
    memory is then freed whole. Held pieces of every parsed line scattered the next lines' objects
    through memory: the summary readers read a run ~25% slower (issue 45)."""
    copied = marshal.loads(marshal.dumps(s))  # type: ignore[arg-type]  # parsed JSON: a dict
    span = _plain_span(copied, service, instance, events=events)
    return span if span is not None else _checked_span(copied, service, instance, read_events=events)


def native_span_builder() -> tuple[Any, ...]:
    """What the native reader makes spans with (``_read.native``): :func:`span_from_fields`,
    :class:`LinkData`, the types each gym attribute may hold (bits: text 1, integer 2, float 4,
    boolean 8), and the span kinds' and statuses' names by number."""
    bits = {str: 1, int: 2, float: 4, bool: 8}
    types = {key: sum(bits[t] for t in wanted) for key, wanted in _GYM_TYPES.items()}
    return span_from_fields, LinkData, types, list(_OTLP_KINDS), list(_OTLP_STATUS)


def decode_reduced(s: Mapping[str, Any], service: str, instance: str) -> SpanData:
    """:func:`decode_held` of a span from a line the native reader reduced to the spans a reader
    keeps, without the copy: nearly all of such a line is held, there is no line to free."""
    span = _plain_span(s, service, instance, events=False)
    return span if span is not None else _checked_span(s, service, instance, read_events=False)


def parse_json_line(raw: bytes) -> Any:
    """One line of JSON, by orjson when it is installed (the ``fast`` extra), else by the standard
    library. What orjson refuses and ``json`` reads (``NaN``, a lone surrogate, an integer past 64
    bits) is read by ``json``, so both installs read the same lines the same way."""
    if _FAST_LOADS is not None:
        try:
            return _FAST_LOADS(raw)
        except ValueError:
            pass
    return json.loads(raw.decode("utf-8"))


@contextmanager
def _read_lines(
    path: Path, part: Part, warn: Warn | None, still_written: bool, reducer: LineReducer | None
) -> Iterator[Iterable[tuple[bytes | list[SpanData], bool]]]:
    """The lines of a file or part (:func:`~gymtrace._model.tracefiles.open_lines`), each with
    whether it ends without its newline; through ``reducer`` when given: a plain file read by it (a
    line of ~0.5 MB is not made a Python object first), a compressed one line by line; a line
    reduced to spans it made itself comes as their list (:class:`MadeSpans`)."""
    if reducer is not None and compression_of(path) is None:
        with open(path, "rb") as f:
            start, stop = part if part is not None else (0, None)
            yield reducer.read(f.fileno(), start, stop)
        return
    with open_lines(path, warn=warn, still_written=still_written, part=part) as lines:
        if reducer is None:
            yield ((raw, not raw.endswith(b"\n")) for raw in lines)
        else:
            yield ((reducer.reduce(raw), not raw.endswith(b"\n")) for raw in lines)


def line_number(path: str | Path, part: Part, number: int) -> int:
    """The line number in the whole file of line ``number`` of ``part`` (counted only for a
    message: a part's first line number is not known without reading what comes before it)."""
    if part is None or part[0] == 0:
        return number
    with open_lines(path, part=(0, part[0])) as lines:
        return sum(1 for _ in lines) + number


def iter_requests(
    path: str | Path,
    *,
    partial_last_line: bool = False,
    warn: Warn | None = None,
    part: Part = None,
    reducer: LineReducer | None = None,
) -> Iterator[tuple[int, Any, bool]]:
    """Each line of one trace file, plain or compressed (or of ``part`` of it) as ``(line
    number in the part, parsed JSON, last line without its newline)``, one at a time.

    A line that is not JSON raises :class:`TraceFileError` naming the file and line, except a last
    line without its newline: the file is still being written (``partial_last_line``, for
    ``gymtrace live``: skipped, it is whole at the next read) or its writer was killed mid-line
    (skipped if ``warn`` is given, and told, naming the file; else the same error). A compressed
    file's last block cut short is :func:`~gymtrace._model.tracefiles.open_lines`'s to tell.

    ``reducer`` takes each line before it is parsed and gives back the line to parse: the native
    reader's (``_read.native``), which drops the spans it can read in compiled code and gives back
    a line it cannot read as it came, so that what is said of such a line is said here; it is told
    of a line skipped."""
    # Read as bytes and decoded line by line: a byte that is not UTF-8 is an error naming its line,
    # not a UnicodeDecodeError out of the file iterator.
    path = Path(path)
    with _read_lines(path, part, warn, partial_last_line, reducer) as lines:
        for number, (read, unfinished) in enumerate(lines, 1):
            if isinstance(read, list):  # the spans the native reader made (a line read is bytes)
                yield number, MadeSpans(read), unfinished
                continue
            raw = read.strip()
            if not raw:
                continue
            try:
                request = parse_json_line(raw)
            except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, or nested too deep
                if unfinished and _cut_short(path, part, number, partial_last_line, warn):
                    return
                where = f"{path}:{line_number(path, part, number)}"
                if warn is None or (request := _after_a_cut_write(raw)) is None:
                    raise TraceFileError(f"{where}: not an OTLP/JSON trace request ({exc})") from exc
                warn(_write_cut_short(where))
            yield number, request, unfinished


def _write_cut_short(where: str) -> str:
    """What a reader says of a line that begins with a write cut short and ends with a whole one."""
    return (
        f"{where}: a write cut short (its writer was killed mid-line) runs into the next writer's"
        " line: the cut part is skipped"
    )


def _after_a_cut_write(raw: bytes) -> Any:
    """The request a line ends with when it begins with a write cut short: a writer killed
    mid-line (an encoder process, a forked child) leaves its bytes without a newline, and the next
    writer of the file appends a whole line after them. None unless the line's last request start
    comes after its first byte and reads whole from there."""
    start = raw.rfind(REQUEST_START)
    if start <= 0:
        return None
    try:
        return parse_json_line(raw[start:])
    except (ValueError, RecursionError):
        return None


def _cut_short(path: Path, part: Part, number: int, partial_last_line: bool, warn: Warn | None) -> bool:
    """A last line without its newline that does not read: True to skip it (the file is still
    being written, or the caller takes a warning: its writer was killed mid-line), False for the
    error a caller that takes no warning gets."""
    if partial_last_line:
        return True
    if warn is None:
        return False
    warn(line_cut_short(path, line_number(path, part, number)))
    return True


def iter_file_spans(
    path: str | Path,
    *,
    partial_last_line: bool = False,
    warn: Warn | None = None,
    keep: Callable[[Mapping[str, Any]], bool] | None = None,
    part: Part = None,
    decode: Decode | None = None,
    reducer: LineReducer | None = None,
) -> Iterator[SpanData]:
    """The spans of one trace file (a file :func:`~gymtrace._model.tracefiles.trace_files` listed,
    plain or compressed; or ``part`` of it), one at a time. ``keep``, given a span's raw
    OTLP/JSON object, says whether to decode it at all, and ``decode`` how (see
    :func:`decode_otlp_json`); ``reducer`` as :func:`iter_requests`'s."""
    file = Path(path)
    lines = iter_requests(file, partial_last_line=partial_last_line, warn=warn, part=part, reducer=reducer)
    for number, request, unfinished in lines:
        if request.__class__ is MadeSpans:
            yield from request
            continue
        try:
            # Decoded whole before any is yielded: a bad span fails its line, not half of it.
            spans = list(decode_otlp_json(request, keep, decode))
        except BadTraceData as exc:
            if unfinished and _cut_short(file, part, number, partial_last_line, warn):
                if reducer is not None:
                    reducer.discard()
                return
            where = f"{file}:{line_number(file, part, number)}"
            raise TraceFileError(f"{where}: not a trace gymtrace can read: {exc}") from exc
        yield from spans


def iter_otlp_json_lines(
    path: str | Path,
    *,
    partial_last_line: bool = False,
    warn: Warn | None = None,
    keep: Callable[[Mapping[str, Any]], bool] | None = None,
    decode: Decode | None = None,
) -> Iterator[SpanData]:
    """The spans of every file that holds what was written to ``path`` (its segments, plain or
    compressed; a directory's trace files: :func:`~gymtrace._model.tracefiles.trace_files`), one
    at a time; ``keep`` and ``decode`` as :func:`iter_file_spans`'s."""
    for file in trace_files(path, warn):
        yield from iter_file_spans(
            file, partial_last_line=partial_last_line, warn=warn, keep=keep, decode=decode
        )


def read_trace_files(
    files: Iterable[Path], *, partial_last_line: bool = False, warn: Warn | None = None
) -> list[SpanData]:
    """The spans of each of ``files`` (as :func:`read_otlp_json_lines`, each file alone: a list
    :func:`~gymtrace._model.tracefiles.trace_files` made, read once each)."""
    return [
        span
        for file in files
        for span in iter_file_spans(file, partial_last_line=partial_last_line, warn=warn)
    ]


def is_marker(span: SpanData) -> bool:
    """A live marker (``gym.kind=live``): read by ``gymtrace live`` only."""
    return span.attributes.get(c.KIND) == c.KIND_LIVE


def normalize(spans: Iterable[Any]) -> list[SpanData]:
    """Accept SpanData, SDK ReadableSpans, or a mix of both; live markers are folded away, so a
    finished rollout reads the same to tree, check, rollouts and stats with or without them."""
    data = (s if isinstance(s, SpanData) else from_readable(s) for s in spans)
    return [s for s in data if s.attributes.get(c.KIND) != c.KIND_LIVE]


# -- spans handed from one process to another ---------------------------------------------------------

_FIELDS = tuple(f.name for f in fields(SpanData))
_EVENTS = _FIELDS.index("events")
_LINKS = _FIELDS.index("links")
_ROW = operator.attrgetter(*_FIELDS)


def _span_row(span: SpanData) -> list[Any]:
    row = list(_ROW(span))
    if row[_EVENTS]:
        row[_EVENTS] = tuple((e.name, e.time_ns, dict(e.attributes)) for e in row[_EVENTS])
    if row[_LINKS]:
        row[_LINKS] = tuple((k.trace_id, k.span_id, dict(k.attributes)) for k in row[_LINKS])
    return row


def pack_values(value: Any, fallback: Any = None) -> bytes:
    """``value`` (built-in values) as bytes for :func:`unpack_values` in another process: by
    ``marshal``, written and read in C (text that was interned comes back interned); when a value is
    of a type marshal does not know, ``fallback`` (default: ``value``) pickled."""
    try:
        return b"m" + marshal.dumps(value)
    except ValueError:
        return b"p" + pickle.dumps(value if fallback is None else fallback, pickle.HIGHEST_PROTOCOL)


def unpack_values(packed: bytes) -> tuple[bool, Any]:
    """What :func:`pack_values` packed: (True, the value) if marshal carried it, else (False, the
    fallback)."""
    body = memoryview(packed)[1:]  # after the tag (no copy of the rest)
    if packed[:1] == b"m":
        return True, marshal.loads(body)
    return False, pickle.loads(body)


def pack_spans(spans: list[SpanData]) -> bytes:
    """``spans`` as bytes for :func:`unpack_spans` in another process: their fields as built-in
    values (:func:`pack_values`), a third faster both ways than pickling the dataclasses; a
    reader's second process hands back ~10^5 spans this way. Pickled when a value is of a type
    marshal does not know (none a decoder makes)."""
    return pack_values([_span_row(span) for span in spans], spans)


def unpack_spans(packed: bytes) -> list[SpanData]:
    """The spans :func:`pack_spans` packed, equal to what it was given."""
    marshalled, rows = unpack_values(packed)
    if not marshalled:
        spans: list[SpanData] = rows
        return spans
    spans = []
    append = spans.append
    names = _FIELDS
    for row in rows:
        if row[_EVENTS]:
            row[_EVENTS] = tuple(EventData(*e) for e in row[_EVENTS])
        if row[_LINKS]:
            row[_LINKS] = tuple(LinkData(*k) for k in row[_LINKS])
        append(span_from_fields(dict(zip(names, row, strict=True))))
    return spans
