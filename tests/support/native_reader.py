"""The native reader in tests: required where scripts/test built it, and one input read with it and
without it (``_read.source`` and ``_read.check.stream``, private: what one process reads of its
parts, compared whole)."""

from __future__ import annotations

import importlib.util
import os
from array import array
from pathlib import Path
from typing import Any

import pytest

from gymtrace._model import environment as env
from gymtrace._model.spandata import TraceFileError
from gymtrace._read import source
from gymtrace._read.check import stream

REQUIRE_NATIVE = "GYMTRACE_REQUIRE_NATIVE"


def native_or_skip() -> None:
    """Skip a test of the native reader where it is not installed (the other Pythons' legs), unless
    ``GYMTRACE_REQUIRE_NATIVE=1`` (scripts/test's main suite): then its absence fails the test."""
    if importlib.util.find_spec("gymtrace_native") is not None:
        return
    if os.environ.get(REQUIRE_NATIVE) == "1":
        pytest.fail(
            f"{REQUIRE_NATIVE}=1 and gymtrace_native does not import (scripts/native .venv builds it)"
        )
    pytest.skip("the native reader is not installed here (scripts/native builds it)")


def read_parts(paths: list[Path], monkeypatch: pytest.MonkeyPatch, native: bool) -> dict[str, Any]:
    """What one process reads of ``paths`` for the summary readers, in a form two reads compare by:
    the spans kept, the tokens, every episode's intervals (in order of start), the earliest ends,
    the warnings and the error."""
    monkeypatch.setenv(env.GYMTRACE_NATIVE_READER, "on" if native else "off")
    assert (source.summary_reducer() is not None) is native
    found = source._read_parts([(path, None) for path in paths], entries=False)
    times = found.times.packed()
    if found.error is not None:
        # A reader that stops at an error answers with it alone; what either filter took of the
        # line in error (the Python filter: the spans before the bad one) is not read.
        return {"spans": found.spans, "warnings": found.warnings, "error": str(found.error)}
    return {
        "spans": found.spans,
        "tokens": (found.tokens.by_trace, found.tokens.by_version),
        "times": {key: sorted(_triples(flat)) for key, flat in times.items()},
        "ends": found.ends.earliest,
        "warnings": found.warnings,
        "error": str(found.error) if found.error is not None else None,
    }


def _triples(raw: bytes) -> list[tuple[int, ...]]:
    flat = array("Q")  # as EpisodeTimes holds them: a time is below 2^64, not 2^63
    flat.frombytes(raw)
    return [tuple(flat[i : i + 3]) for i in range(0, len(flat), 3)]


def check_read(paths: list[Path], monkeypatch: pytest.MonkeyPatch, native: bool) -> dict[str, Any]:
    """What ``gymtrace check`` holds of each span of ``paths`` in one process (every span, as it
    decodes it), the warnings, and the error that stopped the read."""
    monkeypatch.setenv(env.GYMTRACE_NATIVE_READER, "on" if native else "off")
    assert (source.summary_reducer(check=stream.CHECK_KEYS) is not None) is native
    spans: list[Any] = []
    warnings: list[str] = []
    try:
        spans.extend(stream._spans([(path, None) for path in paths], warnings.append))
    except TraceFileError as exc:
        return {"spans": spans, "warnings": warnings, "error": str(exc)}
    return {"spans": spans, "warnings": warnings, "error": None}
