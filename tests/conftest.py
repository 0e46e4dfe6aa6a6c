"""Shared fixtures: a function-scoped in-memory capture and helpers that assert the span tree."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest

import gymtrace
from gymtrace._identity import trust as _trust
from gymtrace._model import errors as _errors
from gymtrace._scopes.tracing import pop_provider, push_provider
from gymtrace._sdk.setup import make_id_generator
from gymtrace.testing import CapturedSpans, capture_spans, strict


@pytest.fixture(autouse=True)
def _fresh_warning_memory() -> Iterator[None]:
    # "Logged once" is per process; each test starts with a clean memory of what was logged.
    _errors.reset_seen()
    _trust.reset_trust()  # forget trust overrides made in code; read GYMTRACE_TRUST_* again
    yield
    _errors.reset_seen()
    _trust.reset_trust()


@pytest.fixture(autouse=True)
def _strict_gymtrace() -> Iterator[None]:
    # gymtrace's own suite runs strict, asked for explicitly: gymtrace reads no test-runner variable
    # (issue 31), so a bug in it raises here instead of being logged. A test of the production
    # policy turns it off for its block (capture_spans(strict=False), strict(False)); a child
    # process is strict only when its test gives it GYMTRACE_STRICT=true.
    with strict():
        yield


@pytest.fixture
def captured() -> Iterator[CapturedSpans]:
    with capture_spans() as spans:
        yield spans


@pytest.fixture
def forget_configure() -> Iterator[None]:
    """For a test that calls ``gymtrace.configure()`` or ``gymtrace.testing.reset()`` in this
    process: everything they set is forgotten after it (``reset()``), and after monkeypatch's
    variables are gone when the test names this fixture before ``monkeypatch``."""
    yield
    gymtrace.testing.reset()


# -- providers of a test's own ------------------------------------------------------------------------
#
# Test infrastructure, as capture_spans() is: gymtrace's scopes record under a provider given for a
# block instead of the global one, which OpenTelemetry lets a process set once. For what
# capture_spans() does not give: tracing off whatever global provider an earlier test left, or a
# sampler. The tests assert what gymtrace records under it through the public API.


@contextmanager
def _under(provider: Any) -> Iterator[None]:
    push_provider(provider)
    try:
        yield
    finally:
        pop_provider(provider)


@pytest.fixture
def use_provider() -> Callable[[Any], AbstractContextManager[None]]:
    """``with use_provider(provider):`` gymtrace's scopes record under ``provider`` in the block
    (a ``NoOpTracerProvider``: tracing off)."""
    return _under


@contextmanager
def _sampled(sampler: Any) -> Iterator[CapturedSpans]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler, id_generator=make_id_generator())
    provider.add_span_processor(gymtrace.IdentitySpanProcessor())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        with _under(provider):
            yield CapturedSpans(provider, exporter)
    finally:
        provider.shutdown()


@pytest.fixture
def capture_sampled() -> Callable[[Any], AbstractContextManager[CapturedSpans]]:
    """``with capture_sampled(sampler) as captured:`` what ``capture_spans()`` captures (the same
    ``CapturedSpans``), under a provider with ``sampler`` and the ID generator
    ``gymtrace.configure()`` installs (a dropped rollout's summary takes its IDs from it)."""
    return _sampled


E2E_DIR = Path(__file__).resolve().parent / "e2e"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Everything under tests/e2e needs a built binary or a server (the Collector and Jaeger, MLflow,
    # Phoenix, OpenSearch): `scripts/test --quick` (-m "not e2e") leaves it to the full run.
    for item in items:
        if E2E_DIR in item.path.parents:
            item.add_marker(pytest.mark.e2e)
