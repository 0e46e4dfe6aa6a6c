"""An attribute value as an OTLP/JSON ``AnyValue`` (https://opentelemetry.io/docs/specs/otlp/#json-protobuf-encoding).

Apart from the span model (``spandata``), which reads and writes whole spans: the file exporter of
every traced process needs this alone, and does not import the readers' model for it.
"""

from __future__ import annotations

import base64
from typing import Any


def any_value(value: Any) -> dict[str, Any]:
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
        return {"arrayValue": {"values": [any_value(v) for v in value]}}
    return {"stringValue": str(value)}
