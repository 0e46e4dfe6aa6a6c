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


def _from_any_value(value: Mapping[str, Any]) -> Any:
    if "stringValue" in value:
        return value["stringValue"]
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "intValue" in value:
        return int(value["intValue"])
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "arrayValue" in value:
        return tuple(_from_any_value(v) for v in value["arrayValue"].get("values", []))
    if "bytesValue" in value:
        return base64.b64decode(value["bytesValue"])
    return None


def _from_key_values(items: Iterable[Mapping[str, Any]] | None) -> dict[str, Any]:
    return {item["key"]: _from_any_value(item.get("value", {})) for item in items or ()}


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


def decode_otlp_json(request: Mapping[str, Any]) -> Iterator[SpanData]:
    """One OTLP/JSON ``ExportTraceServiceRequest`` (a line of the embedded default's file)."""
    for resource_spans in request.get("resourceSpans", ()):
        resource = _from_key_values(resource_spans.get("resource", {}).get("attributes"))
        service = str(resource.get("service.name", ""))
        instance = str(resource.get("service.instance.id", ""))
        for scope_spans in resource_spans.get("scopeSpans", ()):
            for s in scope_spans.get("spans", ()):
                status = s.get("status", {})
                code = int(status.get("code", 0) or 0)
                kind = int(s.get("kind", 1) or 0)
                yield SpanData(
                    trace_id=s["traceId"].lower(),
                    span_id=s["spanId"].lower(),
                    parent_id=(s.get("parentSpanId") or "").lower() or None,
                    name=s.get("name", ""),
                    start_ns=int(s.get("startTimeUnixNano", 0)),
                    end_ns=int(s.get("endTimeUnixNano", 0)),
                    attributes=_with_rollout_id(_from_key_values(s.get("attributes"))),
                    events=tuple(
                        EventData(
                            e.get("name", ""),
                            int(e.get("timeUnixNano", 0)),
                            _from_key_values(e.get("attributes")),
                        )
                        for e in s.get("events", ())
                    ),
                    links=tuple(
                        LinkData(
                            link["traceId"].lower(),
                            link["spanId"].lower(),
                            _from_key_values(link.get("attributes")),
                        )
                        for link in s.get("links", ())
                    ),
                    status=_OTLP_STATUS[code] if 0 <= code < len(_OTLP_STATUS) else "UNSET",
                    status_message=status.get("message", ""),
                    service=service,
                    span_kind=_OTLP_KINDS[kind] if 0 <= kind < len(_OTLP_KINDS) else "INTERNAL",
                    service_instance=instance,
                )


class TraceFileError(ValueError):
    """A file of OTLP/JSON lines could not be read; the message names the file and line."""


def read_otlp_json_lines(path: str | Path, *, partial_last_line: bool = False) -> list[SpanData]:
    """The spans in a file of OTLP/JSON lines, or in every ``*.jsonl`` file of a directory (what
    ``GYMTRACE_FILE=DIR/`` writes: one file per process). ``partial_last_line``: the file is still
    being written (``gymtrace live``), so a last line without its newline that does not parse is
    skipped rather than an error; it is whole at the next read."""
    if Path(path).is_dir():
        files = sorted(p for p in Path(path).glob("*.jsonl") if p.is_file())
        return [
            span for file in files for span in read_otlp_json_lines(file, partial_last_line=partial_last_line)
        ]
    spans: list[SpanData] = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            unfinished = partial_last_line and not line.endswith("\n")
            line = line.strip()
            if not line:
                continue
            try:
                spans.extend(decode_otlp_json(json.loads(line)))
            except (ValueError, KeyError, TypeError) as exc:
                if unfinished:
                    break
                raise TraceFileError(f"{path}:{number}: not an OTLP/JSON trace request ({exc})") from exc
    return spans


def is_marker(span: SpanData) -> bool:
    """A live marker (``gym.kind=live``): read by ``gymtrace live`` only."""
    return span.attributes.get(c.KIND) == c.KIND_LIVE


def normalize(spans: Iterable[Any]) -> list[SpanData]:
    """Accept SpanData, SDK ReadableSpans, or a mix of both; live markers are folded away, so a
    finished rollout reads the same to tree, check, rollouts and stats with or without them."""
    data = (s if isinstance(s, SpanData) else from_readable(s) for s in spans)
    return [s for s in data if s.attributes.get(c.KIND) != c.KIND_LIVE]
