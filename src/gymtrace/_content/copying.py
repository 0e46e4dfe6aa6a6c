"""Safe copying: a plain, bounded JSON copy of the user's value, calling none of its methods."""

from __future__ import annotations

import json
import math
from typing import Any, Final

from gymtrace._content.policy import is_secret_key
from gymtrace._content.redaction import REDACTED, redact_json_text

__all__ = ["MAX_DEPTH", "Walk"]

MAX_DEPTH: Final = 32
# UTF-8 bytes of "…[truncated N chars]" with N up to 10**16.
_STRING_MARKER: Final = 34


def _type_name(t: type) -> str:
    name = type.__dict__["__qualname__"].__get__(t)  # type's own getter: a metaclass cannot intercept
    return name if isinstance(name, str) else "object"


class Walk:
    """Copies a value into plain JSON data, spending at most about ``budget`` characters.

    Only built-in methods are called (``dict.items(d)``, ``list.__iter__(l)``, ``str.__len__(s)``),
    so subclasses that override them, and objects whose every method raises, are safe.
    """

    __slots__ = ("left", "path", "truncated")

    def __init__(self, budget: int) -> None:
        self.left = budget
        self.path: set[int] = set()  # ids of the containers being walked: a repeat is a cycle
        self.truncated = False

    def value(self, v: object, depth: int) -> object:
        t = type(v)
        if t is str:  # the common cases first
            return self.string(v)  # type: ignore[arg-type]
        if t is dict:
            return self.mapping(v, depth)  # type: ignore[arg-type]
        if v is None or t is bool:
            self.left -= 5
            return v
        if issubclass(t, str):
            return self.string(v)  # type: ignore[arg-type]
        if issubclass(t, int):
            n = int.__index__(v)  # type: ignore[arg-type]
            if n.bit_length() > 256:  # int -> str of huge ints is slow and limited (sys.int_info)
                self.left -= 24
                return f"<int of {n.bit_length()} bits>"
            self.left -= 8
            return n
        if issubclass(t, float):
            f = float.__float__(v)  # type: ignore[arg-type]
            self.left -= 12
            if math.isfinite(f):
                return f
            return "NaN" if math.isnan(f) else ("Infinity" if f > 0 else "-Infinity")
        if issubclass(t, dict):
            return self.mapping(v, depth)  # type: ignore[arg-type]
        if issubclass(t, (list, tuple)):
            return self.sequence(v, t, depth)  # type: ignore[arg-type]
        if issubclass(t, (bytes, bytearray)):
            self.left -= 24
            size = bytes.__len__(v) if issubclass(t, bytes) else bytearray.__len__(v)  # type: ignore[arg-type]
            return f"<{_type_name(t)}: {size} bytes>"
        self.left -= 16
        return f"<{_type_name(t)}>"

    def string(self, s: str) -> str:
        n = str.__len__(s)
        room = max(self.left - 2, 0)  # the quotes
        if str.isascii(s):
            size = n
        else:  # UTF-8 size of at most room + 1 characters: bounded work whatever the length
            size = len(str.__getitem__(s, slice(0, room + 1)).encode("utf-8", "surrogatepass"))
        if size <= room:
            self.left -= size + 2
            text = s if type(s) is str else str.__str__(s)
        else:
            keep = max(room - _STRING_MARKER, 0)
            head = str.__getitem__(s, slice(0, keep))
            if not str.isascii(head):  # cut at a byte count, never inside a character
                head = head.encode("utf-8", "surrogatepass")[:keep].decode("utf-8", "ignore")
            self.left -= keep + 2 + _STRING_MARKER
            self.truncated = True
            text = f"{head}…[truncated {n - str.__len__(head)} chars]"
        # JSON inside a string (tool-call arguments in a message): redact its secret-looking pairs.
        return redact_json_text(text) if '"' in text else text

    def _enter(self, v: object, depth: int) -> str | None:
        if depth >= MAX_DEPTH:
            self.truncated = True
            self.left -= 12
            return "<max depth>"
        if id(v) in self.path:
            self.left -= 8
            return "<cycle>"
        return None

    def sequence(self, v: list[Any] | tuple[Any, ...], t: type, depth: int) -> object:
        stop = self._enter(v, depth)
        if stop is not None:
            return stop
        base: Any = list if issubclass(t, list) else tuple
        size = base.__len__(v)
        out: list[object] = []
        self.left -= 2
        self.path.add(id(v))
        try:
            for index, item in enumerate(base.__iter__(v)):
                if self.left <= 0:
                    self.truncated = True
                    out.append(f"…[truncated {size - index} items]")
                    break
                out.append(self.value(item, depth + 1))
                self.left -= 1
        except RuntimeError:  # changed by another thread while we walked it
            out.append("<changed during capture>")
        finally:
            self.path.discard(id(v))
        return out

    def mapping(self, v: dict[Any, Any], depth: int) -> object:
        stop = self._enter(v, depth)
        if stop is not None:
            return stop
        size = dict.__len__(v)
        out: dict[str, object] = {}
        self.left -= 2
        self.path.add(id(v))
        try:
            for index, (raw_key, item) in enumerate(dict.items(v)):
                if self.left <= 0:
                    self.truncated = True
                    out["…"] = f"[truncated {size - index} keys]"
                    break
                key = self.key(raw_key)
                if key in out:
                    key = f"{key}#{index}"
                if is_secret_key(key):
                    out[key] = REDACTED
                    self.left -= len(key) + 16
                else:
                    out[key] = self.value(item, depth + 1)
                    self.left -= 2
        except RuntimeError:  # changed by another thread while we walked it
            out["…"] = "<changed during capture>"
        finally:
            self.path.discard(id(v))
        return out

    def key(self, k: object) -> str:
        t = type(k)
        if issubclass(t, str):
            return self.string(k)  # type: ignore[arg-type]
        if k is None or t is bool or issubclass(t, (int, float)):
            value = self.value(k, MAX_DEPTH)
            return json.dumps(value) if not isinstance(value, str) else value
        self.left -= 16
        return f"<{_type_name(t)}>"
