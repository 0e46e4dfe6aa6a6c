"""Ended spans as an OTLP ``ExportTraceServiceRequest`` in protobuf bytes (``trace.proto``).

Written straight from the span's fields (read by ``gymtrace._otel_private.spanfields``) with the
wire primitives of ``otlp_proto``; the requests are cut under :data:`MAX_REQUEST_BYTES`. The
senders (``otlp``) and the JSON lines (``otlp_json``) are separate.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentelemetry.trace.span import DEFAULT_TRACE_STATE

from gymtrace._otel_private.spanfields import _Read, last_object_cache
from gymtrace._otel_private.spanfields import read_span as _read
from gymtrace._sdk.otlp_proto import (
    _FLAGS_HAS_IS_REMOTE,
    _FLAGS_IS_REMOTE,
    _SMALL,
    _attributes,
    _field,
    _keep,
    _pack_event_time,
    _pack_fixed32,
    _pack_times,
    _varint,
)

# The Collector's OTLP receivers refuse requests over 4 MiB by default (gRPC max_recv_msg_size_mib);
# a batch whose encoding is larger goes out as several requests under this bound.
MAX_REQUEST_BYTES = 4 * 1024 * 1024 - 64 * 1024  # headroom for the transport's own framing


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


def _schema(url: str | None) -> bytes:
    # schema_url is field 3 of both ResourceSpans and ScopeSpans.
    return _field(b"\x1a", url.encode("utf-8")) if url else b""


def encode_request(spans: Sequence[Any]) -> bytes:
    """All ``spans`` as one serialised ``ExportTraceServiceRequest``, whatever its size."""
    return b"".join(body for _, body in encode_requests(spans, max_bytes=2**62))
