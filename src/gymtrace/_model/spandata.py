"""A plain, SDK-free record of a finished span, readable from every place spans end up.

The contract checker and ``gymtrace tree`` work on these, whether the spans come from
``gymtrace.testing.capture_spans()`` (SDK ``ReadableSpan``), from the embedded default's file of
OTLP/JSON lines, or from Jaeger's query API.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gymtrace import _constants as c
from gymtrace._model.numbers import read_int
from gymtrace._model.tracefiles import TraceFileError as TraceFileError
from gymtrace._model.tracefiles import Warn, line_cut_short, open_lines, trace_files


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


def _any_value(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}  # int64 is a string in OTLP/JSON
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, bytes):
        return {"bytesValue": base64.b64encode(value).decode("ascii")}
    if isinstance(value, (list, tuple)):
        return {"arrayValue": {"values": [_any_value(v) for v in value]}}
    return {"stringValue": str(value)}


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


def _from_key_values(items: Any, what: str = "attributes") -> dict[str, Any]:
    found: dict[str, Any] = {}
    for item in _array(items, what):
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
        found[key] = value
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


def _with_rollout_id(attributes: dict[str, Any]) -> dict[str, Any]:
    """NeMo Gym's own telemetry names a rollout ``nemo.gym.rollout.id`` (its capture key, with
    ``-a{n}`` after attempt 0): where no ``gym.rollout.id`` is set, that key is the rollout ID, and
    its suffix the attempt, so every reader finds NeMo Gym's rollouts as its own."""
    key = attributes.get(c.NEMO_GYM_ROLLOUT_ID)
    if c.ROLLOUT_ID in attributes or not isinstance(key, str) or not key:
        return attributes
    qualified = _ATTEMPT_SUFFIX.match(key)
    attributes[c.ROLLOUT_ID] = qualified.group(1) if qualified else key
    if qualified and c.EPISODE_ATTEMPT not in attributes:
        attributes[c.EPISODE_ATTEMPT] = int(qualified.group(2))
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


def decode_otlp_json(request: Any) -> Iterator[SpanData]:
    """One OTLP/JSON ``ExportTraceServiceRequest`` (a line of the embedded default's file).

    Every field is type-checked: a field of the wrong type raises :class:`BadTraceData` naming it,
    never an ``AttributeError`` from deep inside a reader."""
    request = _object(request, "the request")
    for resource_spans in _array(request.get("resourceSpans"), "resourceSpans"):
        resource_spans = _object(resource_spans, "resourceSpans[]")
        resource = _from_key_values(
            _object(resource_spans.get("resource") or {}, "resource").get("attributes"), "resource attributes"
        )
        service = str(resource.get("service.name", ""))
        instance = str(resource.get("service.instance.id", ""))
        for scope_spans in _array(resource_spans.get("scopeSpans"), "scopeSpans"):
            scope_spans = _object(scope_spans, "scopeSpans[]")
            for s in _array(scope_spans.get("spans"), "spans"):
                yield _decode_span(_object(s, "spans[]"), service, instance)


def _decode_span(s: Mapping[str, Any], service: str, instance: str) -> SpanData:
    status = _object(s.get("status") or {}, "status")
    parent = _text(s.get("parentSpanId"), "parentSpanId")
    events = []
    for e in _array(s.get("events"), "events"):
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
    return SpanData(
        trace_id=_hex_id(s.get("traceId"), "traceId", 32),
        span_id=_hex_id(s.get("spanId"), "spanId", 16),
        parent_id=_hex_id(parent, "parentSpanId", 16) if parent else None,
        name=_text(s.get("name"), "name"),
        start_ns=_time(s.get("startTimeUnixNano"), "startTimeUnixNano"),
        end_ns=_time(s.get("endTimeUnixNano"), "endTimeUnixNano"),
        attributes=_with_rollout_id(_from_key_values(s.get("attributes"))),
        events=tuple(events),
        links=tuple(links),
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


def read_trace_files(
    files: Iterable[Path], *, partial_last_line: bool = False, warn: Warn | None = None
) -> list[SpanData]:
    """The spans of each of ``files`` (as :func:`read_otlp_json_lines`, each file alone: a list
    :func:`~gymtrace._model.tracefiles.trace_files` made, read once each)."""
    spans: list[SpanData] = []
    for file in files:
        # Read as bytes and decoded line by line: a byte that is not UTF-8 is an error naming its
        # line, not a UnicodeDecodeError out of the file iterator.
        with open_lines(file, warn=warn, still_written=partial_last_line) as lines:
            for number, raw in enumerate(lines, 1):
                unfinished = not raw.endswith(b"\n")
                raw = raw.strip()
                if not raw:
                    continue
                try:
                    spans.extend(decode_otlp_json(json.loads(raw.decode("utf-8"))))
                except BadTraceData as exc:
                    if unfinished and _cut_short(file, number, partial_last_line, warn):
                        break
                    raise TraceFileError(f"{file}:{number}: not a trace gymtrace can read: {exc}") from exc
                except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, or nested too deep
                    if unfinished and _cut_short(file, number, partial_last_line, warn):
                        break
                    raise TraceFileError(f"{file}:{number}: not an OTLP/JSON trace request ({exc})") from exc
    return spans


def _cut_short(path: Path, number: int, partial_last_line: bool, warn: Warn | None) -> bool:
    """A last line without its newline that does not read: True to skip it (the file is still
    being written, or the caller takes a warning: its writer was killed mid-line)."""
    if not partial_last_line and warn is not None:
        warn(line_cut_short(path, number))
    return partial_last_line or warn is not None


def is_marker(span: SpanData) -> bool:
    """A live marker (``gym.kind=live``): read by ``gymtrace live`` only."""
    return span.attributes.get(c.KIND) == c.KIND_LIVE


def normalize(spans: Iterable[Any]) -> list[SpanData]:
    """Accept SpanData, SDK ReadableSpans, or a mix of both; live markers are folded away, so a
    finished rollout reads the same to tree, check, rollouts and stats with or without them."""
    data = (s if isinstance(s, SpanData) else from_readable(s) for s in spans)
    return [s for s in data if s.attributes.get(c.KIND) != c.KIND_LIVE]
