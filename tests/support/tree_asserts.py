"""Assertions on the span tree, shared by the tests (parent span IDs, not names)."""

from __future__ import annotations

from typing import Any


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
