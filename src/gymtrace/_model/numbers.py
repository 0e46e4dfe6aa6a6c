"""Reading an integer out of data gymtrace did not type itself: span attributes read back, JSON
records, OTLP/JSON files, a library's response objects.

One rule everywhere: a ``bool`` is never an integer (Python's ``True`` is an ``int``, but never a
count, an attempt or a step number in a trace). What differs between callers is explicit at the
call: what stands for "no integer" (``default``), whether negative values count (``minimum``) and
whether a string of ASCII digits is read as its number (``digits``, as OTLP/JSON writes int64).
Standard library only, so every layer may use it.
"""

from __future__ import annotations

import re
from typing import overload

_INTEGER = re.compile(r"[+-]?[0-9]+")


@overload
def read_int(
    value: object, default: None = None, *, minimum: int | None = None, digits: bool = False
) -> int | None: ...
@overload
def read_int(value: object, default: int, *, minimum: int | None = None, digits: bool = False) -> int: ...
def read_int(
    value: object, default: int | None = None, *, minimum: int | None = None, digits: bool = False
) -> int | None:
    """``value`` as an integer: an ``int`` that is not a ``bool`` (with ``digits``, also a string
    of ASCII digits with an optional sign), at least ``minimum`` when given; else ``default``."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif digits and isinstance(value, str) and _INTEGER.fullmatch(value):
        number = int(value)
    else:
        return default
    return number if minimum is None or number >= minimum else default
