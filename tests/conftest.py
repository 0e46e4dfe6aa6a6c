"""Shared fixtures: a function-scoped in-memory capture and helpers that assert the span tree."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gymtrace import _errors
from gymtrace.testing import CapturedSpans, capture_spans


@pytest.fixture(autouse=True)
def _fresh_warning_memory() -> Iterator[None]:
    # "Logged once" is per process; each test starts with a clean memory of what was logged.
    _errors.reset_seen()
    yield
    _errors.reset_seen()


@pytest.fixture
def captured() -> Iterator[CapturedSpans]:
    with capture_spans() as spans:
        yield spans


def parent_of(span: Any) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def span_id(span: Any) -> int:
    return span.get_span_context().span_id


def by_name(spans: list[Any], name: str) -> Any:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, f"expected one span named {name!r}, got {[s.name for s in spans]}"
    return found[0]


def assert_child(child: Any, parent: Any) -> None:
    assert parent_of(child) == span_id(parent), f"{child.name} is not a child of {parent.name}"
    assert child.get_span_context().trace_id == parent.get_span_context().trace_id
