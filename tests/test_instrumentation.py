"""The integration seam (gymtrace.instrumentation) does what integrations need, on the real SDK."""

from __future__ import annotations

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import gymtrace
from gymtrace import attributes, instrumentation
from gymtrace.testing import CapturedSpans, check_trace
from tree_asserts import assert_child


def _own_provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(gymtrace.IdentitySpanProcessor())  # type: ignore[arg-type]
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def test_current_identity_is_the_innermost_scopes_and_empty_outside(captured: CapturedSpans) -> None:
    assert instrumentation.current_identity() == {}
    assert instrumentation.innermost_scope() is None
    with gymtrace.rollout(rollout_id="r-1", task_id="t"), gymtrace.episode():
        identity = instrumentation.current_identity()
        scope = instrumentation.innermost_scope()
        assert scope is not None and scope.kind == attributes.KIND_EPISODE
    assert identity[attributes.ROLLOUT_ID] == "r-1"
    assert identity[attributes.EPISODE_ATTEMPT] == 0
    assert identity[attributes.EPISODE_ID] == "r-1"


def test_a_request_continues_the_callers_scope_on_the_span_it_is_handed(captured: CapturedSpans) -> None:
    with gymtrace.rollout(rollout_id="r-2"), gymtrace.episode():
        header = gymtrace.propagation.inject({}, destination=gymtrace.propagation.GYM_INTERNAL)["baggage"]
    server = captured.tracer_provider.get_tracer("server")
    with server.start_as_current_span("POST /run") as request_span:
        identity = instrumentation.incoming_identity(header)
        instrumentation.stamp_identity(request_span, identity)
        token = otel_context.attach(instrumentation.continue_scope(otel_context.get_current(), identity))
        try:
            assert gymtrace.current().rollout_id == "r-2"
            with gymtrace.step():
                pass
        finally:
            otel_context.detach(token)
    post = next(s for s in captured.spans if s.name == "POST /run")
    step = captured.one("step")
    assert post.attributes[attributes.ROLLOUT_ID] == "r-2"
    assert step.attributes[attributes.ROLLOUT_ID] == "r-2"
    assert_child(step, post)


def test_get_tracer_honours_a_given_provider_and_use_tracer_provider_routes_scopes(
    captured: CapturedSpans,
) -> None:
    provider, exporter = _own_provider()
    tracer = instrumentation.get_tracer(provider)
    assert tracer is not None
    with instrumentation.use_tracer_provider(provider):
        with gymtrace.rollout(rollout_id="r-3"), gymtrace.episode():
            with tracer.start_as_current_span("by hand"):
                pass
    with gymtrace.rollout(rollout_id="r-4"):
        pass
    mine = exporter.get_finished_spans()
    assert sorted(s.name for s in mine) == ["by hand", "gym.episode", "gym.rollout"]
    assert check_trace(list(mine)) == []
    assert [s.attributes[attributes.ROLLOUT_ID] for s in captured.spans] == ["r-4"]
    assert instrumentation.get_tracer(trace.NoOpTracerProvider()) is None
    provider.shutdown()


def test_a_scope_run_by_hand_ends_once_with_the_error(captured: CapturedSpans) -> None:
    tracer = instrumentation.get_tracer()
    assert tracer is not None
    scope = gymtrace.model_call(model="m")
    frame = instrumentation.start_scope(scope, tracer)
    assert frame is not None
    instrumentation.end_scope(scope, frame, ValueError("boom"))
    span = captured.one("model_call")
    assert span.status.status_code is trace.StatusCode.ERROR
    assert span.attributes["error.type"] == "ValueError"


def test_errors_go_through_gymtraces_policy_and_bad_arguments_are_named(captured: CapturedSpans) -> None:
    with pytest.raises(RuntimeError):  # loud in strict mode (capture_spans turns it on)
        instrumentation.report_error("a test integration", RuntimeError("bug"))
    instrumentation.report_error("a test integration", RuntimeError("bug"), may_raise=False)
    with pytest.raises(instrumentation.InvalidArgumentError, match="tracer_provider"):
        instrumentation.get_tracer("not a provider")  # type: ignore[arg-type]
    with pytest.raises(instrumentation.InvalidArgumentError, match="read"):
        instrumentation.set_identity_fallback("nope")  # type: ignore[arg-type]


def test_a_rerun_after_a_lost_run_numbers_its_episode_after_a_failed_attempt(captured: CapturedSpans) -> None:
    # A scheduler re-ran work continued from the rollout (its first run's process died and left
    # nothing): the episode it opens is attempt 1, retrying a recorded failed attempt 0.
    from gymtrace import propagation

    with gymtrace.rollout(rollout_id="r-rerun", task_id="t", repeat=0):
        headers = propagation.inject({}, destination=propagation.GYM_INTERNAL, continuation=True)
    with propagation.attach(headers):
        instrumentation.rerun(1, "the worker died")
        with gymtrace.episode() as episode:
            episode.record_reward(1.0)
    (lost,) = [s for s in captured.by_kind("outcome") if s.attributes[attributes.EPISODE_ATTEMPT] == 0]
    assert lost.attributes[attributes.FAILURE_KIND] == "infrastructure"
    assert lost.status.description == "the worker died"
    (retry,) = captured.by_kind("episode")
    assert retry.attributes[attributes.EPISODE_ATTEMPT] == 1
    assert [link.context.span_id for link in retry.links] == [lost.context.span_id]
    # Read back as `gymtrace tree` reads it: the rollout's final outcome, decided by the last record.
    (rollout_line,) = [line for line in captured.tree().splitlines() if "rollout=r-rerun" in line]
    assert "=> final: outcome=scored reward=1 attempts=2 " in rollout_line
    assert check_trace(captured.spans) == []


def test_a_rerun_inside_an_episode_stays_within_that_attempt(captured: CapturedSpans) -> None:
    from gymtrace import propagation

    with gymtrace.rollout(rollout_id="r-step-rerun"), gymtrace.episode() as episode:
        headers = propagation.inject({}, destination=propagation.GYM_INTERNAL, continuation=True)
        episode.record_reward(0.5)
    with propagation.attach(headers):
        instrumentation.rerun(1, "the worker died")  # a step's task re-ran: not a new attempt
        with gymtrace.step():
            pass
    assert [s.attributes[attributes.EPISODE_ATTEMPT] for s in captured.by_kind("episode")] == [0]
    assert captured.by_kind("outcome") == []
    with pytest.raises(instrumentation.InvalidArgumentError, match="attempt must be an int"):
        instrumentation.rerun("1", "why")  # type: ignore[arg-type]
