"""Serialising within budgets: redacted JSON text cut visibly to a byte limit."""

from __future__ import annotations

import contextlib
import json
from typing import Final

from gymtrace._content.copying import Walk
from gymtrace._content.policy import Redactor
from gymtrace._model.errors import GymTraceError, contract_problem

__all__ = ["fit", "serialise", "utf8"]

# json.loads() of a string that looks like JSON (tool arguments from a model) only below this size,
# so its keys can be redacted; longer strings are cut as text.
_MAX_PARSE_CHARS: Final = 1024 * 1024
_HOOK_FAILED: Final = "[REDACTED: the redaction hook failed]"


def utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: OTLP strings must be valid UTF-8
        return text.encode("utf-8", "replace")


def fit(text: str, limit: int) -> str:
    """``text`` if its UTF-8 form fits ``limit`` bytes, else a prefix ending in
    ``…[truncated N bytes]``, the whole at most ``limit`` bytes long. Lone surrogates become ``?``
    (OTLP strings must be valid UTF-8, or the whole export request fails)."""
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:
        data = text.encode("utf-8", "replace")
        text = data.decode("utf-8")
    if len(data) <= limit:
        return text
    reserve = len(f"…[truncated {len(data)} bytes]".encode())
    kept = data[: max(limit - reserve, 0)].decode("utf-8", "ignore")  # no half characters
    cut = len(data) - len(kept.encode("utf-8"))
    return f"{kept}…[truncated {cut} bytes]"


def _looks_like_json(s: str) -> bool:
    return s[:1] in ("{", "[") and s.rstrip()[-1:] in ("}", "]")


def serialise(name: str, value: object, limit: int, redact: Redactor | None) -> str:
    """The text recorded for ``value`` under attribute ``name``: redacted, at most ``limit`` bytes.

    Structured values become compact JSON. A top-level string stays text (a prompt), unless it is
    a JSON object or array (tool arguments as the model wrote them): that is parsed, so its
    secret-looking keys are redacted like a dict's. In any other string (above 1 MiB, not valid
    JSON, or JSON nested in a message) the secret-looking ``"key": "value"`` pairs are redacted.
    """
    if issubclass(type(value), str) and str.__len__(value) <= _MAX_PARSE_CHARS:  # type: ignore[arg-type]
        text = str.__str__(value)
        if _looks_like_json(text):
            with contextlib.suppress(ValueError, RecursionError):
                value = json.loads(text)
    # The walk's estimate leaves out JSON escapes ("\n" is two bytes): keep a margin so the text
    # rarely needs the final cut, which would end it mid-JSON.
    walk_limit = limit - min(256, limit // 8)
    try:
        copy = Walk(walk_limit).value(value, 0)
    except RecursionError:  # called near the interpreter's recursion limit
        copy = "<too deep to capture here>"
    if redact is not None:
        try:
            copy = redact(name, copy)
        except Exception as exc:  # noqa: BLE001 - fail closed: never record unredacted content
            contract_problem(
                ("redaction hook", type(exc)),
                GymTraceError(f"the content redaction hook raised {type(exc).__name__}: {exc!s:.200}"),
            )
            return _HOOK_FAILED
        copy = Walk(walk_limit).value(copy, 0)  # the hook's result is walked like user data
    if isinstance(copy, str):
        return fit(copy, limit)  # a top-level string stays text
    return fit(json.dumps(copy, ensure_ascii=False, separators=(",", ":"), allow_nan=False), limit)
