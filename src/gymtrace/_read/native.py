"""The native reader, behind one fence: ``gymtrace_native``, compiled from ``native/`` in gymtrace's
repository (Rust), when it is installed and ``GYMTRACE_NATIVE_READER`` is not ``off``.

It runs the summary readers' span filter (:func:`gymtrace._read.source.summary_filter`) over a whole
line of a trace file before Python parses it, and gives back the line with only the spans the
filter would keep, and what it took of the others when asked. Parsing every span into Python
objects only to drop ~88 % of them was most of a reader's time. What it cannot read exactly as the
Python filter would, it leaves in the line for the Python filter; a line it cannot read at all it
gives back as it came. For ``gymtrace check`` it drops nothing and makes each span of a line as the
checker decodes it (``_read.check.stream.decode_for_check``), or gives the line back. Without it,
the same files are read the same way in Python, slower.
"""

from __future__ import annotations

import os
import threading
from types import ModuleType

from gymtrace._model import environment as env
from gymtrace._model.env_reading import Reader

_native: ModuleType | None
try:
    import gymtrace_native

    _native = gymtrace_native
except ImportError:  # not built here: the Python readers read alone
    _native = None

_ON, _OFF = "on", "off"
_warned: set[tuple[str, str]] = set()
_lock = threading.RLock()


def native_module() -> ModuleType | None:
    """``gymtrace_native`` when it is installed and not switched off, else None."""
    if _native is None:
        return None
    read = Reader(os.environ, strict=False, lenient=False, lock=_lock, warned=_warned)
    return _native if read.choice(env.GYMTRACE_NATIVE_READER, (_ON, _OFF), _ON) == _ON else None
