"""A lean OTLP/protobuf encoder and the OTLP exporters that send its bytes.

The SDK's OTLP exporters build a protobuf message object per span, per attribute and per value,
then serialise the tree: ~60 µs per span of pure Python on the export thread, which holds the GIL
the application needs (REFERENCE.md, "Performance facts"). This module writes the protobuf wire
format of ``ExportTraceServiceRequest`` (opentelemetry-proto ``trace.proto``) straight from the
SDK span's fields into bytes, with the encoded form of each repeated attribute (the gym identity
keys are the same on every span of a rollout) cached, so the export thread holds the GIL for a
fraction of that time. ``benchmarks/perf.py`` prints both costs side by side.

The exporters are the SDK's own OTLP exporters with only the encoding replaced: TLS, headers,
compression, timeouts, the ``OTEL_EXPORTER_OTLP_*`` variables and the SDK's transport retries
stay exactly theirs. The result decodes with the official ``opentelemetry-proto`` classes to the
same message the SDK encoder builds (``tests/test_otlp_encoder.py``).
"""

from __future__ import annotations

import json
import logging
import math
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from opentelemetry.trace.span import DEFAULT_TRACE_STATE

from gymtrace._model.spandata import _any_value as _json_any_value
from gymtrace._otel_private import fastpaths as _fastpaths

logger = logging.getLogger("gymtrace")

# The Collector's OTLP receivers refuse requests over 4 MiB by default (gRPC max_recv_msg_size_mib);
# a batch whose encoding is larger goes out as several requests under this bound.
MAX_REQUEST_BYTES = 4 * 1024 * 1024 - 64 * 1024  # headroom for the transport's own framing

_GRPC_EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"

# SpanFlags: the SDK always says whether the parent was remote (0x100), and sets 0x200 if so.
_FLAGS_HAS_IS_REMOTE = 0x100
_FLAGS_IS_REMOTE = 0x200

_pack_double = struct.Struct("<d").pack
_pack_fixed32 = struct.Struct("<I").pack
_pack_times = struct.Struct("<BQBQ").pack  # start (field 7) and end (field 8), both fixed64
_pack_event_time = struct.Struct("<BQ").pack

_SMALL = [bytes((i,)) for i in range(128)]


def _varint(value: int) -> bytes:
    if value < 128:
        return _SMALL[value] if value >= 0 else _varint(value & 0xFFFFFFFFFFFFFFFF)
    if value < 16384:  # two bytes: the length of nearly every encoded span
        return bytes(((value & 0x7F) | 0x80, value >> 7))
    out = bytearray()
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: tag, length, payload."""
    n = len(payload)
    return tag + (_SMALL[n] if n < 128 else _varint(n)) + payload


# -- AnyValue / KeyValue (common.proto) --------------------------------------------------------------


def _any_value(value: Any) -> bytes:
    """The body of an ``AnyValue`` message (without its own tag and length)."""
    if isinstance(value, str):
        return _field(b"\x0a", value.encode("utf-8", "surrogatepass"))
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, int):
        if not -(2**63) <= value < 2**63:
            # int64 cannot hold it; the SDK encoder fails the whole batch here, a string keeps it.
            return _field(b"\x0a", str(value).encode("ascii"))
        return b"\x18" + _varint(value)
    if isinstance(value, float):
        return b"\x21" + _pack_double(value)
    if isinstance(value, bytes):
        return _field(b"\x3a", value)
    if value is None:
        return b""
    if isinstance(value, Mapping):
        return _field(b"\x32", b"".join(_field(b"\x0a", _key_value(str(k), v)) for k, v in value.items()))
    if isinstance(value, Sequence):
        return _field(b"\x2a", b"".join(_field(b"\x0a", _any_value(v)) for v in value))
    raise TypeError(f"cannot encode a {type(value).__name__} attribute value")


def _key_value(key: str, value: Any) -> bytes:
    return _field(b"\x0a", key.encode("utf-8", "surrogatepass")) + _field(b"\x12", _any_value(value))


# Encoded attributes (tag included), keyed by tag, key, value type and value: the identity
# attributes, span kinds and names repeat on every span. The tag is in the key because the same
# attribute is a different field on a span, an event, a link, a scope or a resource. Bounded:
# cleared when full, which costs one re-encode.
_KV_CACHE: dict[tuple[Any, str, type, Any], bytes] = {}
_KV_CACHE_MAX = 8192
_KV_CACHEABLE = (str, bool, int, float)
_KV_CACHE_MAX_STR = 256
_Encoded = TypeVar("_Encoded", bytes, str)
_Kept = TypeVar("_Kept")
_Tag = TypeVar("_Tag")


def _cached_each(
    attributes: Mapping[str, Any],
    cache: dict[tuple[Any, str, type, Any], _Encoded],
    encode: Callable[[_Tag, str, Any], _Encoded | None],
    tag: _Tag,
) -> list[_Encoded]:
    """Each attribute as ``encode(tag, key, value)`` makes it (None leaves it out), taken from
    ``cache`` when a short scalar was encoded before: the protobuf and the JSON encoders share this
    lookup. ``tag`` is passed through rather than bound in a closure: this runs once per span."""
    parts = []
    for key, value in attributes.items():
        kind = type(value)
        if kind in _KV_CACHEABLE:
            # Looked up before the length check: a long string is never cached, so never found.
            encoded = cache.get((tag, key, kind, value))
            if encoded is not None:
                parts.append(encoded)
                continue
        encoded = encode(tag, key, value)
        if encoded is None:
            continue
        if kind in _KV_CACHEABLE and (kind is not str or len(value) <= _KV_CACHE_MAX_STR):
            _keep(cache, (tag, key, kind, value), encoded)
        parts.append(encoded)
    return parts


def _keep(cache: dict[Any, _Kept], key: Any, value: _Kept) -> _Kept:
    """``cache[key] = value``, the cache cleared first when it holds :data:`_KV_CACHE_MAX` entries
    (names and values that never repeat must not grow it without bound); returns ``value``."""
    if len(cache) >= _KV_CACHE_MAX:
        cache.clear()
    cache[key] = value
    return value


def _attributes(tag: bytes, attributes: Mapping[str, Any] | None) -> bytes:
    """Every attribute as a repeated ``KeyValue`` field with the given tag; unencodable ones are
    skipped and logged, as the SDK encoder does."""
    if not attributes:
        return b""
    return b"".join(_cached_each(attributes, _KV_CACHE, _tagged_key_value, tag))


def _tagged_key_value(tag: bytes, key: str, value: Any) -> bytes | None:
    try:
        return _field(tag, _key_value(key, value))
    except (TypeError, ValueError):
        logger.warning("gymtrace: attribute %r could not be encoded; it is left out", key, exc_info=True)
        return None


# -- Span (trace.proto) ------------------------------------------------------------------------------


# Span.flags (field 16, fixed32: tag (16 << 3) | 5 = 133, a two-byte varint), for a parent that is
# local (or none) and one that is remote.
_LOCAL_PARENT_FLAGS = b"\x85\x01" + _pack_fixed32(_FLAGS_HAS_IS_REMOTE)
_REMOTE_PARENT_FLAGS = b"\x85\x01" + _pack_fixed32(_FLAGS_HAS_IS_REMOTE | _FLAGS_IS_REMOTE)


def _flags(context: Any) -> bytes:
    return _REMOTE_PARENT_FLAGS if context is not None and context.is_remote else _LOCAL_PARENT_FLAGS


def _trace_state(trace_state: Any) -> str:
    if trace_state is DEFAULT_TRACE_STATE:
        return ""  # most spans: TraceState's emptiness is a Python-level __len__
    return ",".join(f"{k}={v}" for k, v in trace_state.items()) if trace_state else ""


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


# ReadableSpan's properties wrap its private fields: a MappingProxyType over the attributes whose
# items() go through Python-level __iter__/__getitem__, a locked tuple copy of the events and of
# the links (empty on almost every span), an isinstance per dropped count. Sampled in the CartPole
# loop's export thread, they were a fifth of the encoding time. A span class that keeps every one
# of those properties as the SDK defines them (the SDK's spans, their ReadableSpan copies,
# gymtrace's lean span) is read from the fields; any other class through its properties.
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


def encode_span(span: Any) -> bytes:
    """One SDK ``ReadableSpan`` as the body of an OTLP ``Span`` message."""
    return _encode_read(_read(span))


def _encode_read(read: _Read) -> bytes:
    (ctx, parent, name, kind, start, end, attributes, dropped_attributes, events, dropped_events, links,
     dropped_links, status) = read[:13]  # fmt: skip
    parts = [b"\x0a\x10" + ctx.trace_id.to_bytes(16, "big") + b"\x12\x08" + ctx.span_id.to_bytes(8, "big")]
    state = _trace_state(ctx.trace_state)
    if state:
        parts.append(_field(b"\x1a", state.encode("utf-8")))
    if parent is not None:
        parts.append(b"\x22\x08" + parent.span_id.to_bytes(8, "big"))
    # Keyed by the kind's value: an Enum member hashes through a Python-level __hash__.
    named = _NAMES.get((name, kind._value_))
    if named is None:
        named = _keep(
            _NAMES,
            (name, kind._value_),
            _field(b"\x2a", name.encode("utf-8", "surrogatepass"))
            + b"\x30"
            + _varint(kind.value + 1),  # Span.kind: OTLP's enum is the API's value plus one
        )
    parts.append(named)
    parts.append(_pack_times(0x39, start, 0x41, end))
    parts.append(_attributes(b"\x4a", attributes))
    if dropped_attributes:
        parts.append(b"\x50" + _varint(dropped_attributes))
    for event in events:
        body = _pack_event_time(0x09, event.timestamp) + _field(b"\x12", event.name.encode("utf-8"))
        body += _attributes(b"\x1a", event.attributes)
        if event.dropped_attributes:
            body += b"\x20" + _varint(event.dropped_attributes)
        parts.append(_field(b"\x5a", body))
    if dropped_events:
        parts.append(b"\x60" + _varint(dropped_events))
    for link in links:
        lctx = link.context
        body = b"\x0a\x10" + lctx.trace_id.to_bytes(16, "big") + b"\x12\x08" + lctx.span_id.to_bytes(8, "big")
        body += _attributes(b"\x22", link.attributes)
        if link.dropped_attributes:
            body += b"\x28" + _varint(link.dropped_attributes)
        body += b"\x35" + _pack_fixed32(_FLAGS_HAS_IS_REMOTE | (_FLAGS_IS_REMOTE if lctx.is_remote else 0))
        parts.append(_field(b"\x6a", body))
    if dropped_links:
        parts.append(b"\x70" + _varint(dropped_links))
    parts.append(_status(status))
    parts.append(_flags(parent))
    return b"".join(parts)


# Encoded name and kind, by (name, kind): a few span names repeat on every span.
_NAMES: dict[tuple[str, int], bytes] = {}
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


def _encode_status(status: Any) -> bytes:
    code = status.status_code.value
    body = _field(b"\x12", status.description.encode("utf-8")) if status.description else b""
    if code:
        body += b"\x18" + _SMALL[code]
    return _field(b"\x7a", body)


_status = last_object_cache(_encode_status)


# -- Resource, scope, request -------------------------------------------------------------------------

# Encoded resources and scopes, by identity (they are shared by every span of a provider). The
# object is kept beside its bytes so a recycled id() can never match.
_HEAD_CACHE: dict[int, tuple[Any, bytes]] = {}


def _resource_head(resource: Any) -> bytes:
    cached = _HEAD_CACHE.get(id(resource))
    if cached is not None and cached[0] is resource:
        return cached[1]
    encoded = _field(b"\x0a", _attributes(b"\x0a", resource.attributes)) if resource is not None else b""
    _remember(resource, encoded)
    return encoded


def _scope_head(scope: Any) -> bytes:
    cached = _HEAD_CACHE.get(id(scope))
    if cached is not None and cached[0] is scope:
        return cached[1]
    if scope is None:
        encoded = _field(b"\x0a", b"")
    else:
        body = _field(b"\x0a", scope.name.encode("utf-8")) if scope.name else b""
        if scope.version:
            body += _field(b"\x12", scope.version.encode("utf-8"))
        body += _attributes(b"\x1a", getattr(scope, "attributes", None))
        encoded = _field(b"\x0a", body)
    _remember(scope, encoded)
    return encoded


def _remember(owner: Any, encoded: bytes) -> None:
    if len(_HEAD_CACHE) > 256:
        _HEAD_CACHE.clear()
    _HEAD_CACHE[id(owner)] = (owner, encoded)


def encode_requests(spans: Sequence[Any], max_bytes: int = MAX_REQUEST_BYTES) -> list[tuple[int, bytes]]:
    """SDK ``ReadableSpan`` objects as serialised ``ExportTraceServiceRequest`` messages.

    Returns ``(span_count, request_bytes)`` pairs: one request unless the spans' encoding exceeds
    ``max_bytes``, then as many as keep each under it (a single span larger than the bound still
    goes alone; the receiver decides). Grouped by resource and instrumentation scope like the
    SDK's encoder.
    """
    return [(len(sent), body) for sent, body in encode_request_spans(spans, max_bytes)]


_NO_GROUP = (object(), object(), None, None)  # matches no span's resource and scope


def encode_request_spans(spans: Sequence[Any], max_bytes: int) -> list[tuple[list[Any], bytes]]:
    """:func:`encode_requests`, each request with the spans it holds (a partition of ``spans``),
    so an exporter can tell which spans a failed request leaves undelivered."""
    groups: dict[tuple[int, int], tuple[Any, Any, list[bytes], list[Any]]] = {}
    group: Any = _NO_GROUP
    for span in spans:
        read = _read(span)
        resource, scope = read[13], read[14]
        if resource is not group[0] or scope is not group[1]:  # most spans: the previous one's group
            key = (id(resource), id(scope))
            group = groups.get(key)
            if group is None:
                group = groups[key] = (resource, scope, [], [])
        group[2].append(_field(b"\x12", _encode_read(read)))
        group[3].append(span)
    # Equal resources and scopes are one group, as in the SDK's encoder (a tracer per call gives
    # equal but distinct scope objects). Compared once per group: Resource hashes through JSON.
    merged: dict[Any, dict[Any, tuple[Any, Any, list[bytes], list[Any]]]] = {}
    for resource, scope, encoded_spans, group_spans in groups.values():
        by_scope = merged.setdefault(resource, {})
        if scope in by_scope:
            by_scope[scope][2].extend(encoded_spans)
            by_scope[scope][3].extend(group_spans)
        else:
            by_scope[scope] = (resource, scope, encoded_spans, group_spans)

    requests: list[tuple[list[Any], bytes]] = []
    chunk: list[bytes] = []  # ResourceSpans fields of the request being filled
    chunk_spans: list[Any] = []  # the spans in it
    chunk_size = 0
    for resource, by_scope in merged.items():
        resource_head = _resource_head(resource)
        resource_tail = _schema(getattr(resource, "schema_url", ""))
        scope_fields: list[bytes] = []  # ScopeSpans of this resource in the current request
        scope_size = 0
        for _, scope, encoded_spans, group_spans in by_scope.values():
            scope_head = _scope_head(scope)
            scope_tail = _schema(getattr(scope, "schema_url", "") if scope is not None else "")
            i = 0
            while i < len(encoded_spans):
                room = max_bytes - chunk_size - scope_size - len(resource_head) - len(scope_head) - 64
                end, size = i, 0
                alone = not chunk and not scope_fields
                if i == 0:
                    # Usually the whole group fits: measured at C speed, not span by span.
                    total = sum(map(len, encoded_spans))
                    if total <= room:
                        end, size = len(encoded_spans), total
                while end < len(encoded_spans) and (
                    size + len(encoded_spans[end]) <= room or (alone and end == i)
                ):
                    size += len(encoded_spans[end])
                    end += 1
                if end > i:
                    field = _field(b"\x12", scope_head + b"".join(encoded_spans[i:end]) + scope_tail)
                    scope_fields.append(field)
                    scope_size += len(field)
                    chunk_spans.extend(group_spans[i:end])
                    i = end
                if i < len(encoded_spans):
                    # The request is full: close this resource's part of it and start the next.
                    if scope_fields:
                        chunk.append(_field(b"\x0a", resource_head + b"".join(scope_fields) + resource_tail))
                    requests.append((chunk_spans, b"".join(chunk)))
                    chunk, chunk_spans, chunk_size = [], [], 0
                    scope_fields, scope_size = [], 0
        if scope_fields:
            resource_spans = _field(b"\x0a", resource_head + b"".join(scope_fields) + resource_tail)
            chunk.append(resource_spans)
            chunk_size += len(resource_spans)
    if chunk:
        requests.append((chunk_spans, b"".join(chunk)))
    return requests


def _undelivered(spans: Sequence[Any], delivered: list[Any]) -> list[Any]:
    sent = {id(span) for span in delivered}
    return [span for span in spans if id(span) not in sent]


def _schema(url: str | None) -> bytes:
    # schema_url is field 3 of both ResourceSpans and ScopeSpans.
    return _field(b"\x1a", url.encode("utf-8")) if url else b""


def encode_request(spans: Sequence[Any]) -> bytes:
    """All ``spans`` as one serialised ``ExportTraceServiceRequest``, whatever its size."""
    return b"".join(body for _, body in encode_requests(spans, max_bytes=2**62))


# -- OTLP/JSON lines (the file exporter) ----------------------------------------------------------------

# ASCII escapes like json.dumps: a lone surrogate in an attribute must not break the file write.
_dumps = json.JSONEncoder(separators=(",", ":")).encode
# The string encoder _dumps uses (ensure_ascii), called directly for a single string.
_json_string = json.encoder.encode_basestring_ascii
_JSON_CACHE: dict[tuple[Any, str, type, Any], str] = {}


def _json_attributes(attributes: Mapping[str, Any] | None) -> str:
    """``"attributes":[...]`` text; each key/value fragment is cached like the protobuf ones."""
    if not attributes:
        return "[]"
    return "[" + ",".join(_cached_each(attributes, _JSON_CACHE, _json_key_value, None)) + "]"


def _json_key_value(_tag: None, key: str, value: Any) -> str:
    # The text _dumps makes of {"key": key, "value": _json_any_value(value)}, written directly for
    # the plain types: a cache miss (an ID, a count, a duration) cost ~2.5 µs through the encoder.
    kind = type(value)
    if kind is str:
        return f'{{"key":{_json_string(key)},"value":{{"stringValue":{_json_string(value)}}}}}'
    if kind is int:
        return f'{{"key":{_json_string(key)},"value":{{"intValue":"{int.__repr__(value)}"}}}}'
    if kind is bool:
        return f'{{"key":{_json_string(key)},"value":{{"boolValue":{"true" if value else "false"}}}}}'
    if kind is float and math.isfinite(value):
        return f'{{"key":{_json_string(key)},"value":{{"doubleValue":{float.__repr__(value)}}}}}'
    return _dumps({"key": key, "value": _json_any_value(value)})


def _json_resource_spans(resource: Any, scopes: dict[Any, list[str]]) -> str:
    scope_parts = []
    for scope, spans in scopes.items():
        name = scope.name if scope is not None else ""
        version = (scope.version or "") if scope is not None else ""
        scope_parts.append(
            '{"scope":' + _dumps({"name": name, "version": version}) + ',"spans":[' + ",".join(spans) + "]}"
        )
    return (
        '{"resource":{"attributes":'
        + _json_attributes(resource.attributes)
        + '},"scopeSpans":['
        + ",".join(scope_parts)
        + "]}"
    )


def encode_json_line(spans: Sequence[Any]) -> str:
    """SDK spans as one OTLP/JSON ``ExportTraceServiceRequest`` on one line (no newline).

    The same JSON as ``json.dumps(_spandata.encode_otlp_json(spans))`` (the Collector's ``file``
    exporter format), written as text with cached attribute fragments: a third of the time.
    """
    by_resource: dict[int, tuple[Any, dict[Any, list[str]]]] = {}
    last: tuple[Any, Any, list[str]] = (_NO_GROUP, _NO_GROUP, [])  # resource, scope, their spans
    for span in spans:
        (ctx, parent, name, kind, start, end, attributes, _, events, _, links, _, status, resource,
         scope) = _read(span)  # fmt: skip
        named = _JSON_NAMES.get((name, kind._value_))  # '"name":...,"kind":N,' (see _encode_read)
        if named is None:
            named = _keep(
                _JSON_NAMES, (name, kind._value_), f'"name":{_json_string(name)},"kind":{kind.value + 1},'
            )
        text = (
            f'{{"traceId":"{ctx.trace_id:032x}","spanId":"{ctx.span_id:016x}",{named}'
            f'"startTimeUnixNano":"{start}","endTimeUnixNano":"{end}",'
            f'"attributes":{_json_attributes(attributes)},"flags":{int(ctx.trace_flags)}'
        )
        if parent is not None:
            text += f',"parentSpanId":"{parent.span_id:016x}"'
        if events:
            text += (
                ',"events":['
                + ",".join(
                    f'{{"timeUnixNano":"{e.timestamp}","name":{_json_string(e.name)},'
                    f'"attributes":{_json_attributes(e.attributes)}}}'
                    for e in events
                )
                + "]"
            )
        if links:
            text += (
                ',"links":['
                + ",".join(
                    f'{{"traceId":"{link.context.trace_id:032x}","spanId":"{link.context.span_id:016x}",'
                    f'"attributes":{_json_attributes(link.attributes)}}}'
                    for link in links
                )
                + "]"
            )
        text += _json_status(status)
        if resource is last[0] and scope is last[1]:
            last[2].append(text)  # most spans: the previous span's resource and scope
            continue
        entry = by_resource.get(id(resource))
        if entry is None:
            entry = by_resource[id(resource)] = (resource, {})
        # Scopes are grouped by (name, version) like encode_otlp_json.
        last = (resource, scope, entry[1].setdefault(_ScopeKey(scope), []))
        last[2].append(text)
    return (
        '{"resourceSpans":['
        + ",".join(_json_resource_spans(resource, scopes) for resource, scopes in by_resource.values())
        + "]}"
    )


# '"name":...,"kind":N,' by (name, kind value).
_JSON_NAMES: dict[tuple[str, int], str] = {}


def _json_status_text(status: Any) -> str:
    if status.description:
        return (
            f',"status":{{"code":{status.status_code.value},"message":{_json_string(status.description)}}}}}'
        )
    return f',"status":{{"code":{status.status_code.value}}}}}'


_json_status = last_object_cache(_json_status_text)


class _ScopeKey:
    """Groups scopes by (name, version), keeping one scope object to read them from."""

    __slots__ = ("_key", "name", "version")

    def __init__(self, scope: Any) -> None:
        self.name = scope.name if scope is not None else ""
        self.version = (scope.version or "") if scope is not None else ""
        self._key = (self.name, self.version)

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _ScopeKey) and other._key == self._key


# -- exporters -----------------------------------------------------------------------------------------


def _identity(data: bytes) -> bytes:
    return data


class _RawTraceServiceStub:
    """``TraceServiceStub`` that sends already serialised requests.

    The generated stub serialises a message object with ``SerializeToString``; this one passes
    the encoder's bytes through and decodes the response with the official class.
    """

    def __init__(self, channel: Any) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

        self.Export = channel.unary_unary(
            _GRPC_EXPORT_METHOD,
            request_serializer=_identity,
            response_deserializer=ExportTraceServiceResponse.FromString,
        )


_GRPC_SEAMS = ("OTLPSpanExporter._export()", "._translate_data()", "._channel", "._stub", "._client")


def _grpc_seams_missing(exporter_class: Any = None) -> list[str]:
    """What of the gRPC exporter's private seams this installation lacks (checked on a real
    instance once: the channel connects lazily, so nothing is sent)."""
    if exporter_class is None:
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        except ImportError:
            return ["opentelemetry-exporter-otlp-proto-grpc (not installed)"]
        exporter_class = OTLPSpanExporter
    cached = _SEAMS_CHECKED.get(exporter_class)
    if cached is not None:
        return cached
    missing = [
        f"OTLPSpanExporter.{n}()"
        for n in ("_export", "_translate_data")
        if not callable(getattr(exporter_class, n, None))
    ]
    if not missing:
        probe = exporter_class(endpoint="127.0.0.1:1", insecure=True)
        missing = [f"OTLPSpanExporter.{n}" for n in ("_channel", "_stub", "_client") if not hasattr(probe, n)]
        probe.shutdown()
    _SEAMS_CHECKED[exporter_class] = missing
    return missing


def _http_seams_missing() -> list[str]:
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        return ["opentelemetry-exporter-otlp-proto-http (not installed)"]
    probe = OTLPSpanExporter(endpoint="http://127.0.0.1:1/v1/traces")
    try:
        return (
            []
            if callable(getattr(getattr(probe, "_client", None), "export", None))
            else ["OTLPSpanExporter._client.export(bytes) (1.45+)"]
        )
    finally:
        probe.shutdown()  # type: ignore[no-untyped-call]  # the SDK leaves it unannotated


def _span_reads_missing() -> list[str]:
    try:
        from opentelemetry.sdk.trace import TracerProvider
    except ImportError:
        return ["opentelemetry-sdk (not installed)"]
    span = TracerProvider().get_tracer("gymtrace.probe").start_span("probe")
    span.end()
    return (
        [] if readable_directly(span) else [f"ReadableSpan fields {', '.join(_FIELDS)} behind its properties"]
    )


_SEAMS_CHECKED: dict[Any, list[str]] = {}


def register_fast_paths() -> None:
    """Declare this module's uses of private exporter and span names (probed when first read)."""
    _fastpaths.register(
        "lean OTLP/gRPC export",
        __name__,
        _GRPC_SEAMS,
        "the SDK's OTLP/gRPC exporter with its own encoder (~5x the encoding time per span)",
        _grpc_seams_missing,
    )
    _fastpaths.register(
        "lean OTLP/HTTP export",
        __name__,
        ("OTLPSpanExporter._client.export(bytes)",),
        "the SDK's OTLP/HTTP exporter with its own encoder (~5x the encoding time per span)",
        _http_seams_missing,
    )
    _fastpaths.register(
        "span fields read directly",
        __name__,
        ("ReadableSpan._attributes/_events/_links/... behind the SDK's properties",),
        "the ReadableSpan properties (a fifth more encoding time)",
        _span_reads_missing,
    )


def grpc_exporter(**kwargs: Any) -> Any:
    """The SDK's OTLP/gRPC span exporter, sending the lean encoder's bytes."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    if _grpc_seams_missing(OTLPSpanExporter):
        return OTLPSpanExporter(**kwargs)  # the SDK's own encoding (tests/test_fast_paths.py says so)

    class LeanGrpcSpanExporter(OTLPSpanExporter):
        # encode_requests keeps every request under MAX_REQUEST_BYTES, however many spans it is
        # handed: the export queue may hand it its whole backlog (_export.BatchExporter.max_drain).
        splits_requests = True

        def __init__(self, **kw: Any) -> None:
            super().__init__(**kw)
            # The mixin builds the stub from self._stub, now and on every reconnect.
            self._stub = _RawTraceServiceStub
            self._client = _RawTraceServiceStub(self._channel)  # type: ignore[assignment]

        def _translate_data(self, data: Any) -> Any:
            return data  # already a serialised request (see export)

        def export(self, spans: Sequence[Any]) -> Any:
            return SpanExportResult.FAILURE if self.export_partial(spans) else SpanExportResult.SUCCESS

        def export_partial(self, spans: Sequence[Any]) -> list[Any]:
            """Send ``spans`` in requests under the 4 MiB bound; the spans not delivered (those of
            the first request that failed and after), so a retry resends only them."""
            delivered: list[Any] = []
            for sent, request in encode_request_spans(spans, MAX_REQUEST_BYTES):
                if self._export(request) != SpanExportResult.SUCCESS:  # type: ignore[arg-type]
                    return _undelivered(spans, delivered)
                delivered.extend(sent)
            return []

    return LeanGrpcSpanExporter(**kwargs)


def http_exporter(**kwargs: Any) -> Any:
    """The SDK's OTLP/HTTP span exporter, posting the lean encoder's bytes.

    Uses the SDK's HTTP client (its retries, TLS, compression and headers) when it has the
    ``_client.export(bytes)`` seam of opentelemetry-exporter-otlp-proto-http 1.45+; older
    versions keep their stock encoding.
    """
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    class LeanHttpSpanExporter(OTLPSpanExporter):
        @property
        def splits_requests(self) -> bool:
            # Only the lean path splits at MAX_REQUEST_BYTES; the stock fallback sends one request.
            return callable(getattr(getattr(self, "_client", None), "export", None))

        def export(self, spans: Sequence[Any]) -> Any:
            return SpanExportResult.FAILURE if self.export_partial(spans) else SpanExportResult.SUCCESS

        def export_partial(self, spans: Sequence[Any]) -> list[Any]:
            """Like the gRPC exporter's: the spans not delivered, so a retry resends only them."""
            client = getattr(self, "_client", None)
            if getattr(self, "_shutdown", False) or not callable(getattr(client, "export", None)):
                return [] if super().export(spans) == SpanExportResult.SUCCESS else list(spans)
            assert client is not None
            delivered: list[Any] = []
            for sent, request in encode_request_spans(spans, MAX_REQUEST_BYTES):
                if not client.export(request).success:
                    return _undelivered(spans, delivered)
                delivered.extend(sent)
            return []

    return LeanHttpSpanExporter(**kwargs)
