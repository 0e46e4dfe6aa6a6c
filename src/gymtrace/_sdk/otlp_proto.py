"""The protobuf wire format's primitives for OTLP: varints, length-delimited fields, ``AnyValue``
and ``KeyValue`` (opentelemetry-proto ``common.proto``), and the caches of encoded attributes.

Separate from the span and request encoding (``otlp_encode``) and the JSON lines (``otlp_json``),
which both build on these: nothing here knows what a span is.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

logger = logging.getLogger("gymtrace")

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
