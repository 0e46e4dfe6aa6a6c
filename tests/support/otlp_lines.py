"""The tests' own reader of the trace files gymtrace writes, independent of gymtrace's.

A test that reads a file back with gymtrace's reader checks gymtrace against itself: a change that
broke the file and the reader alike would pass. This reads the wire format as documented, with the
standard library only: OTLP/JSON lines (one ``ExportTraceServiceRequest`` a line, IDs as hex,
int64 as strings; https://opentelemetry.io/docs/specs/otlp/#json-protobuf-encoding), and the file
names of docs/configuration.md (``traces.jsonl``, then ``traces.000001.jsonl``, ..., each plain or
``.gz``; a child process's ``traces.pid-PID.jsonl``; a directory: every such file in it).

Its records have the field names of the records gymtrace's readers use (``trace_id``, ``span_id``,
``parent_id``, ``name``, ``start_ns``, ``end_ns``, ``attributes``, ``events``, ``links``,
``status``, ``status_message``, ``service``, ``span_kind``, ``service_instance``), so a test
reads the same either way. It reads gymtrace's own keys as they are written, nothing derived: no
live marker is folded away, no NeMo Gym key stands for ``gym.rollout.id``. What the tests here do
not need (zstd files, a line still being written) is refused with an error that says so.
"""

from __future__ import annotations

import base64
import gzip
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# OTLP/JSON writes an enum as its number (the spec) or its name (protobuf's JSON mapping allows it).
_KINDS = ("UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER")
_STATUS = ("UNSET", "OK", "ERROR")
_HEX = re.compile(r"[0-9a-f]+")
# docs/configuration.md: "traces.jsonl", segments "traces.000001.jsonl", each plain or ".gz" (".zst"
# is refused below), a child process's "traces.pid-4242.jsonl" with segments of its own.
_SUFFIX = ".jsonl"
_COMPRESSED = (".gz", ".zst")


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
    """One span of a file, as the wire says it: IDs as lowercase hex, times in ns since the epoch."""

    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    start_ns: int
    end_ns: int
    attributes: Mapping[str, Any]
    events: tuple[EventData, ...] = ()
    links: tuple[LinkData, ...] = ()
    status: str = "UNSET"  # UNSET, OK or ERROR
    status_message: str = ""
    service: str = ""  # the resource's service.name
    span_kind: str = "UNSPECIFIED"  # INTERNAL, SERVER, CLIENT, PRODUCER, CONSUMER
    service_instance: str = ""  # the resource's service.instance.id
    resource: Mapping[str, Any] = field(default_factory=dict)
    scope: str = ""  # the instrumentation scope's name

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


class NotOtlpJson(ValueError):
    """A line or a field that is not OTLP/JSON; the message names the file, the line and the field."""


# -- values ------------------------------------------------------------------------------------------


def any_value(value: Mapping[str, Any]) -> Any:
    """One OTLP ``AnyValue``: ``{"stringValue": "x"}`` -> ``"x"``, ``{"intValue": "3"}`` -> ``3``,
    an array as a tuple, a kvlist as a dict, bytes from base64; an empty value is None."""
    if not isinstance(value, Mapping):
        raise NotOtlpJson(f"an AnyValue must be an object, got {value!r:.60}")
    if "stringValue" in value:
        return str(value["stringValue"])
    if "boolValue" in value:
        flag = value["boolValue"]
        if not isinstance(flag, bool):
            raise NotOtlpJson(f"boolValue must be true or false, got {flag!r:.60}")
        return flag
    if "intValue" in value:
        return int(value["intValue"])  # int64: a string of digits in OTLP/JSON
    if "doubleValue" in value:
        double = value["doubleValue"]
        return float(double.replace("Infinity", "inf")) if isinstance(double, str) else float(double)
    if "arrayValue" in value:
        return tuple(any_value(v) for v in value["arrayValue"].get("values", []))
    if "kvlistValue" in value:
        return key_values(value["kvlistValue"].get("values", []))
    if "bytesValue" in value:
        return base64.b64decode(value["bytesValue"], validate=True)
    if value:
        raise NotOtlpJson(f"not an AnyValue: {value!r:.60}")
    return None


def key_values(items: Iterable[Mapping[str, Any]] | None) -> dict[str, Any]:
    """A list of OTLP ``KeyValue`` objects as a dict (of a key given twice, the last)."""
    return {str(item["key"]): any_value(item.get("value", {})) for item in items or ()}


def _enum(value: Any, names: tuple[str, ...], prefix: str, what: str) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(names):
        return names[value]
    if isinstance(value, str) and value.startswith(prefix) and value[len(prefix) :] in names:
        return value[len(prefix) :]
    raise NotOtlpJson(f"{what}: not one of {names}: {value!r:.60}")


def _hex_id(value: Any, width: int, what: str) -> str:
    if not isinstance(value, str) or len(value) != width or not _HEX.fullmatch(value.lower()):
        raise NotOtlpJson(f"{what}: not {width} hex digits: {value!r:.60}")
    return value.lower()


def _span(raw: Mapping[str, Any], resource: Mapping[str, Any], scope: str) -> SpanData:
    status = raw.get("status") or {}
    parent = raw.get("parentSpanId") or None
    return SpanData(
        trace_id=_hex_id(raw.get("traceId"), 32, "traceId"),
        span_id=_hex_id(raw.get("spanId"), 16, "spanId"),
        parent_id=_hex_id(parent, 16, "parentSpanId") if parent is not None else None,
        name=str(raw["name"]),
        start_ns=int(raw["startTimeUnixNano"]),
        end_ns=int(raw["endTimeUnixNano"]),
        attributes=key_values(raw.get("attributes")),
        events=tuple(
            EventData(str(e["name"]), int(e.get("timeUnixNano", 0)), key_values(e.get("attributes")))
            for e in raw.get("events") or ()
        ),
        links=tuple(
            LinkData(
                _hex_id(link.get("traceId"), 32, "links[].traceId"),
                _hex_id(link.get("spanId"), 16, "links[].spanId"),
                key_values(link.get("attributes")),
            )
            for link in raw.get("links") or ()
        ),
        status=_enum(status.get("code", 0), _STATUS, "STATUS_CODE_", "status.code"),
        status_message=str(status.get("message", "")),
        service=str(resource.get("service.name", "")),
        span_kind=_enum(raw.get("kind", 0), _KINDS, "SPAN_KIND_", "kind"),
        service_instance=str(resource.get("service.instance.id", "")),
        resource=resource,
        scope=scope,
    )


def spans_of_request(request: Mapping[str, Any]) -> Iterator[SpanData]:
    """The spans of one ``ExportTraceServiceRequest`` (one line of a file), in the order written."""
    for resource_spans in request["resourceSpans"]:
        resource = key_values((resource_spans.get("resource") or {}).get("attributes"))
        for scope_spans in resource_spans.get("scopeSpans") or ():
            scope = str((scope_spans.get("scope") or {}).get("name", ""))
            for raw in scope_spans.get("spans") or ():
                yield _span(raw, resource, scope)


# -- files -------------------------------------------------------------------------------------------


def _name_parts(name: str) -> tuple[str, int, str] | None:
    """``traces.000002.jsonl.gz`` -> ``("traces", 2, ".gz")``; None for a name that is no trace file."""
    compressed = next((s for s in _COMPRESSED if name.endswith(s)), "")
    name = name[: len(name) - len(compressed)]
    if not name.endswith(_SUFFIX):
        return None
    stem = name[: -len(_SUFFIX)]
    segment = re.search(r"\.([0-9]{6})$", stem)
    if segment is None:
        return stem, 0, compressed
    return stem[: segment.start()], int(segment.group(1)), compressed


def files_of(path: str | Path) -> list[Path]:
    """The files a process configured with ``path`` wrote, in order: ``path`` itself (or
    ``path.gz``) and its segments; for a directory, every trace file in it. FileNotFoundError when
    there is none."""
    p = Path(path)
    if p.is_dir():
        found = [f for f in p.iterdir() if f.is_file() and not f.name.startswith(".") and _name_parts(f.name)]
    else:
        parts = _name_parts(p.name)
        if parts is None or parts[1] != 0:
            found = [p] if p.is_file() else []  # a file by any other name, or one segment: itself
        else:
            stem = parts[0]
            found = [
                f
                for f in p.parent.glob(f"{glob_escape(stem)}*")
                if f.is_file() and (named := _name_parts(f.name)) is not None and named[0] == stem
            ]
    if not found:
        raise FileNotFoundError(f"{path}: no trace file (nor any segment of one)")

    def order(f: Path) -> tuple[str, int, str]:
        stem, segment, compressed = _name_parts(f.name) or (f.name, 0, "")
        return stem, segment, compressed

    return sorted(found, key=order)


def glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)


def _lines(file: Path) -> Iterator[bytes]:
    if file.name.endswith(".zst"):
        raise NotImplementedError(f"{file}: the tests' reader reads plain and .gz files, not zstd")
    opener = gzip.open if file.name.endswith(".gz") else open
    with opener(file, "rb") as f:
        yield from f


def read_otlp_json_lines(path: str | Path) -> list[SpanData]:
    """Every span of the file a process configured with ``path`` wrote (its segments too), or of
    every trace file in a directory, in the order written. A line that is not a whole
    ``ExportTraceServiceRequest`` is an error naming the file and line (a test reads a file its
    writer finished)."""
    spans: list[SpanData] = []
    for file in files_of(path):
        for number, raw in enumerate(_lines(file), 1):
            if not raw.strip():
                continue
            try:
                spans.extend(spans_of_request(json.loads(raw)))
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise NotOtlpJson(f"{file}:{number}: not an OTLP/JSON trace request: {exc!r}") from exc
    return spans


def child_files(path: str | Path) -> list[Path]:
    """The files of the child processes of a process that wrote ``path``, one name per child (and
    grandchild), as docs/outcomes.md names them: ``{stem}.pid-{pid}{suffix}``. A child's segments
    are read with its name (:func:`read_otlp_json_lines`)."""
    p = Path(path)
    parts = _name_parts(p.name)
    if parts is None or parts[1] != 0:
        raise ValueError(f"{path}: not the name a process is configured with (stem.jsonl)")
    rule = re.compile(re.escape(parts[0]) + r"((?:\.pid-[0-9]+)+)")
    children = set()
    for f in p.parent.iterdir():
        named = _name_parts(f.name)
        if named is not None and (own := rule.fullmatch(named[0])) is not None:
            children.add(p.with_name(f"{parts[0]}{own.group(1)}{_SUFFIX}"))
    return sorted(children)


# -- into the SDK's spans ----------------------------------------------------------------------------


def as_readable(spans: Iterable[SpanData]) -> list[Any]:
    """The spans as OpenTelemetry SDK ``ReadableSpan`` objects, for what takes those
    (``gymtrace.testing.check_trace``)."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

    def context(trace_id: str, span_id: str) -> SpanContext:
        return SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=False, trace_flags=TraceFlags(1))

    readable = []
    for s in spans:
        readable.append(
            ReadableSpan(
                name=s.name,
                context=context(s.trace_id, s.span_id),
                parent=context(s.trace_id, s.parent_id) if s.parent_id is not None else None,
                resource=Resource(dict(s.resource)),
                attributes=dict(s.attributes),
                events=[Event(e.name, dict(e.attributes), timestamp=e.time_ns) for e in s.events],
                links=[Link(context(link.trace_id, link.span_id), dict(link.attributes)) for link in s.links],
                kind=SpanKind[s.span_kind] if s.span_kind != "UNSPECIFIED" else SpanKind.INTERNAL,
                status=Status(StatusCode[s.status], s.status_message if s.status == "ERROR" else None),
                start_time=s.start_ns,
                end_time=s.end_ns,
            )
        )
    return readable
