"""The shortcuts on the per-call path (``_scopes.tracing``, private) keep OpenTelemetry's semantics.

See benchmarks/overhead.py for what they save."""

from __future__ import annotations

import subprocess
import sys

from opentelemetry import context as otel_context
from opentelemetry import trace

import gymtrace
from child_process import clean_env
from gymtrace._scopes.tracing import SPAN_CONTEXT_KEY
from gymtrace.testing import capture_spans


def _run(code: str, **env: str) -> None:
    clean = clean_env()
    subprocess.run([sys.executable, "-c", code], check=True, env={**clean, **env})


def test_tracing_is_off_until_a_provider_is_set_and_on_after() -> None:
    _run(
        "from opentelemetry import trace\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "from gymtrace._scopes.tracing import active_tracer\n"
        "assert active_tracer() is None\n"
        "trace.set_tracer_provider(TracerProvider())\n"
        "assert active_tracer() is not None\n"
    )


def test_otel_sdk_disabled_turns_tracing_off_under_an_sdk_provider() -> None:
    _run(
        "from opentelemetry import trace\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "from gymtrace._scopes.tracing import active_tracer\n"
        "trace.set_tracer_provider(TracerProvider())\n"
        "assert active_tracer() is None\n",
        OTEL_SDK_DISABLED="true",
    )


def test_a_provider_named_by_otel_python_tracer_provider_is_loaded() -> None:
    _run(
        "from gymtrace._scopes.tracing import active_tracer\nassert active_tracer() is not None\n",
        OTEL_PYTHON_TRACER_PROVIDER="sdk_tracer_provider",
    )


def test_the_span_context_key_is_found_through_the_public_api() -> None:
    assert SPAN_CONTEXT_KEY is not None
    span = trace.NonRecordingSpan(trace.INVALID_SPAN_CONTEXT)
    assert list(trace.set_span_in_context(span, otel_context.Context())) == [SPAN_CONTEXT_KEY]


def test_a_scope_context_carries_the_parent_values_the_span_and_the_frame() -> None:
    marker = otel_context.create_key("test.marker")

    @gymtrace.step
    def body() -> tuple[object, object, object]:
        return trace.get_current_span(), gymtrace.current_scope(), otel_context.get_value(marker)

    with capture_spans():
        token = otel_context.attach(otel_context.set_value(marker, "kept"))
        try:
            before = otel_context.get_current()
            span, frame, value = body()
            assert otel_context.get_current() == before
        finally:
            otel_context.detach(token)
    assert value == "kept"
    assert frame is not None and frame.span is span
    assert span.get_span_context().is_valid
