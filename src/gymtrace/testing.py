"""Helpers for testing code instrumented with gymtrace.

Example::

    import gymtrace
    from gymtrace.testing import capture_spans, check_trace

    def test_rollout_is_scored():
        with capture_spans() as captured:
            run_my_rollout()
        assert captured.one("rollout").attributes["gym.rollout.outcome"] == "scored"
        assert check_trace(captured.spans) == []

``capture_spans()`` gives gymtrace a private in-memory TracerProvider for the duration of the block;
it never touches the application's global provider. Spans of other libraries are captured when they
use ``captured.tracer_provider`` (most instrumentations accept ``tracer_provider=``).

``strict()`` turns strict mode on for a block (or a whole test suite, from a fixture): gymtrace's
own failures and contract problems (inverted nesting, invalid identity) raise instead of being
logged. gymtrace never turns it on by itself because a test runner is running (it reads no
``PYTEST_*`` variable): only ``GYMTRACE_STRICT=true``, ``configure(strict=True)``, ``strict()`` and
``capture_spans()`` do, so your tests run the code your production runs unless you ask::

    # conftest.py
    import pytest
    from gymtrace.testing import strict

    @pytest.fixture(autouse=True)
    def gymtrace_strict():
        with strict():
            yield

Child processes do not inherit it: give them ``GYMTRACE_STRICT=true`` in their environment.

``reset()`` undoes ``gymtrace.configure()`` between tests (a fixture calling it after each test
keeps one test's strict mode or content policy out of the next).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from gymtrace import _constants as c
from gymtrace._identity.processor import IdentitySpanProcessor
from gymtrace._model.errors import set_strict, strict_override
from gymtrace._model.spandata import SpanData, from_readable
from gymtrace._read.check import check_spans
from gymtrace._read.render import render_tree
from gymtrace._scopes import consumed as _consumed
from gymtrace._scopes import training as _training
from gymtrace._scopes.tracing import pop_provider, push_provider
from gymtrace._sdk.setup import make_id_generator
from gymtrace._sdk.setup import reset as reset_setup

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider

__all__ = ["CapturedSpans", "capture_spans", "check_trace", "reset", "strict"]


class CapturedSpans:
    """Finished spans collected by :func:`capture_spans`, in the order they ended."""

    def __init__(self, provider: TracerProvider, exporter: Any) -> None:
        self.tracer_provider = provider
        self._exporter = exporter

    @property
    def spans(self) -> list[ReadableSpan]:
        """The finished spans, without live markers (as every reader of finished traces)."""
        return [
            s for s in self._exporter.get_finished_spans() if (s.attributes or {}).get(c.KIND) != c.KIND_LIVE
        ]

    @property
    def markers(self) -> list[ReadableSpan]:
        """The live markers (``gym.kind=live``) written while rollouts were open."""
        return [
            s for s in self._exporter.get_finished_spans() if (s.attributes or {}).get(c.KIND) == c.KIND_LIVE
        ]

    @property
    def data(self) -> list[SpanData]:
        """The spans as plain :class:`SpanData` records (hex IDs, plain dicts)."""
        return [from_readable(s) for s in self.spans]

    def by_kind(self, kind: str) -> list[ReadableSpan]:
        return [s for s in self.spans if (s.attributes or {}).get(c.KIND) == kind]

    def one(self, kind: str) -> ReadableSpan:
        """The single span of ``kind``; AssertionError if there are none or several."""
        found = self.by_kind(kind)
        assert len(found) == 1, f"expected one {kind} span, found {len(found)}: {[s.name for s in found]}"
        return found[0]

    def tree(self) -> str:
        return render_tree(self.data)

    def clear(self) -> None:
        self._exporter.clear()


@contextmanager
def capture_spans(*, strict: bool | None = True) -> Iterator[CapturedSpans]:
    """Collect every span gymtrace finishes inside the block (needs ``gymtrace[sdk]``).

    ``strict=True`` (default) turns strict mode on for the duration (see :func:`strict`);
    ``False`` turns it off (the production policy: logged, not raised); ``None`` keeps what is in
    force (``GYMTRACE_STRICT``, ``configure(strict=...)``, an enclosing :func:`strict`).
    """
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider(id_generator=make_id_generator(), shutdown_on_exit=False)
    provider.add_span_processor(IdentitySpanProcessor())  # type: ignore[arg-type]  # duck-typed: no SDK import in the core
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    previous_strict = strict_override()
    if strict is not None:
        set_strict(strict)
    push_provider(provider)
    try:
        yield CapturedSpans(provider, exporter)
    finally:
        pop_provider(provider)
        set_strict(previous_strict)
        provider.shutdown()


@contextmanager
def strict(enabled: bool = True) -> Iterator[None]:
    """Strict mode on (or, with ``enabled=False``, off) for the duration of the block, in this
    process; what was in force before comes back after it, even when the block raises.

    In strict mode gymtrace raises its own internal errors and the contract problems it otherwise
    logs as warnings (:class:`gymtrace.HierarchyViolationError`, :class:`gymtrace.InvalidArgumentError`,
    ...). ``GYMTRACE_STRICT=true`` does the same for a whole process and the children that inherit
    its environment.
    """
    previous = strict_override()
    set_strict(bool(enabled))
    try:
        yield
    finally:
        set_strict(previous)


def check_trace(spans: Any) -> list[str]:
    """The violations of gymtrace's contract in ``spans`` (empty when it holds).

    Accepts SDK ``ReadableSpan`` objects, :class:`SpanData` records, or a :class:`CapturedSpans`.
    """
    if isinstance(spans, CapturedSpans):
        spans = spans.spans
    return check_spans(spans)


def reset() -> None:
    """Forget what ``gymtrace.configure()`` and ``configure_content()`` set, for users' test suites.

    Shuts gymtrace's exporters down (flushing what they hold), forgets the configuration
    (``gymtrace.is_configured()`` is then False) and every setting made in code: strict mode,
    ``trace_per``, the content policy (capture mode, budgets, redaction hook, secret keys). The
    environment is read again, so a variable a test set with ``monkeypatch.setenv`` applies. The
    next ``configure()`` starts fresh, except for what it cannot undo: the global TracerProvider,
    which OpenTelemetry lets a process set once, keeps the resource (``service.name``) and sampler
    it was created with. The process's policy version (``set_policy_version``) is forgotten too,
    with the rollouts remembered for a train step's bare-ID ``consume()``.
    """
    reset_setup()
    _training.set_policy_version(None)
    _consumed.forget()
