"""Shared fixtures: a function-scoped in-memory capture and helpers that assert the span tree."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gymtrace import _errors, _trust
from gymtrace.testing import CapturedSpans, capture_spans


@pytest.fixture(autouse=True)
def _fresh_warning_memory() -> Iterator[None]:
    # "Logged once" is per process; each test starts with a clean memory of what was logged.
    _errors.reset_seen()
    _trust.reset_trust()  # forget trust overrides made in code; read GYMTRACE_TRUST_* again
    yield
    _errors.reset_seen()
    _trust.reset_trust()


@pytest.fixture
def captured() -> Iterator[CapturedSpans]:
    with capture_spans() as spans:
        yield spans
