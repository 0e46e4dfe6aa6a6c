"""The gym identity in a continued context is gymtrace's, never OpenTelemetry baggage (issue 31).

A context continued from a caller (``propagation.attach``, ``instrumentation.continue_scope``, the
ASGI middleware) used to hold the identity as baggage, and every instrumentation that calls
``opentelemetry.propagate.inject()`` sends the context's baggage to any host. What must hold: no
``gym.*`` entry in ``opentelemetry.baggage.get_all()`` there, the application's entries kept, and
every span started there, gymtrace's or another library's, still stamped with the identity.

And ``propagation.inject()`` writes headers, nothing else: no step number taken, no hand-off,
unless a continuation is asked for.
"""

from __future__ import annotations

import httpx
import pytest
from opentelemetry import baggage, propagate
from opentelemetry import context as otel_context

import gymtrace
from _distributed import RELAY, read_services, services
from gymtrace import attributes as c
from gymtrace import instrumentation, propagation
from gymtrace.testing import CapturedSpans

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
INCOMING = {
    "traceparent": TRACEPARENT,
    "baggage": "gym.rollout.id=r-7,gym.episode.attempt=1,gym.run.id=run-1,gym.episode.id=r-7-a1,"
    "gym.step.base=4,tenant=acme",
}
IDENTITY = {c.ROLLOUT_ID: "r-7", c.EPISODE_ATTEMPT: 1, c.RUN_ID: "run-1", c.EPISODE_ID: "r-7-a1"}


def _gym_baggage() -> dict[str, object]:
    return {k: v for k, v in baggage.get_all().items() if k.startswith("gym.")}


def _assert_stamped(captured: CapturedSpans, name: str) -> None:
    (span,) = [s for s in captured.spans if s.name == name]
    assert {k: span.attributes[k] for k in IDENTITY} == IDENTITY


def test_attach_keeps_the_identity_out_of_baggage_and_on_every_span(captured: CapturedSpans) -> None:
    library = captured.tracer_provider.get_tracer("some.http.client")
    with propagation.attach(INCOMING):
        assert _gym_baggage() == {}
        assert baggage.get_all() == {"tenant": "acme"}  # the application's baggage stays
        assert gymtrace.current().rollout_id == "r-7"
        assert propagation.identity_from_context() == IDENTITY
        with library.start_as_current_span("GET /upstream"):
            pass
        with gymtrace.step():
            pass
    _assert_stamped(captured, "GET /upstream")
    # The step number the caller reserved (gym.step.base) still numbers the steps here.
    assert captured.one(c.KIND_STEP).attributes[c.STEP_NUMBER] == 4


@pytest.mark.parametrize("believed", [True, False], ids=["believed", "not-believed"])
def test_continue_scope_takes_the_gym_entries_an_extraction_put_into_baggage(
    captured: CapturedSpans, believed: bool
) -> None:
    # The official ASGI middleware (or a user) extracted the headers with OpenTelemetry's own
    # propagators: the gym entries are in that context's baggage.
    extracted = propagate.extract(INCOMING)
    assert baggage.get_baggage(c.ROLLOUT_ID, extracted) == "r-7"
    identity = instrumentation.incoming_identity(INCOMING["baggage"]) if believed else {}
    token = otel_context.attach(instrumentation.continue_scope(extracted, identity))
    try:
        assert _gym_baggage() == {}
        assert baggage.get_all() == {"tenant": "acme"}
        assert gymtrace.current().rollout_id == ("r-7" if believed else None)
        with captured.tracer_provider.get_tracer("some.db").start_as_current_span("SELECT"):
            pass
    finally:
        otel_context.detach(token)
    (span,) = [s for s in captured.spans if s.name == "SELECT"]
    assert (span.attributes or {}).get(c.ROLLOUT_ID) == ("r-7" if believed else None)


@pytest.mark.e2e
@pytest.mark.parametrize("official", [[], ["--official"]], ids=["gymtrace-only", "with-official"])
def test_a_request_handled_under_the_asgi_middleware_has_no_gym_baggage(tmp_path, official) -> None:
    with services(tmp_path, [("svc-id", "app", [*RELAY, *official])]) as (svc,):
        reply = httpx.get(f"{svc.url}/work", headers=INCOMING).json()
    assert reply["identity"] == {"rollout_id": "r-7", "attempt": 1, "run_id": "run-1"}
    assert reply["context_baggage"] == ["tenant"]
    (work,) = [s for s in read_services(tmp_path) if s.name == "relay.work"]  # another library's span
    assert {k: work.attributes[k] for k in IDENTITY} == IDENTITY


def test_inject_inside_an_episode_leaves_steps_and_outcome_alone(captured: CapturedSpans) -> None:
    # Issue 31: the module's own client example reserved a step and handed the rollout off, so the
    # steps read [1, 3] and the outcome stayed pending.
    with gymtrace.rollout(rollout_id="r-plain", task_id="t"), gymtrace.episode():
        with gymtrace.step():
            pass
        propagation.inject({})
        propagation.inject({}, destination="http://127.0.0.1:8000/run")
        with gymtrace.step():
            pass
        gymtrace.record_reward(0.5)
    steps = [s.attributes[c.STEP_NUMBER] for s in captured.by_kind(c.KIND_STEP)]
    assert steps == [1, 2]
    rollout = captured.one(c.KIND_ROLLOUT).attributes
    assert (rollout[c.ROLLOUT_OUTCOME], rollout[c.REWARD]) == (c.OUTCOME_SCORED, 0.5)
    assert gymtrace.testing.check_trace(captured) == []


def test_a_rollout_whose_headers_were_only_injected_ends_unscored_not_pending(
    captured: CapturedSpans,
) -> None:
    with gymtrace.rollout(rollout_id="r-sent"), gymtrace.episode():
        propagation.inject({}, destination="http://127.0.0.1:8000/run")
    assert captured.one(c.KIND_ROLLOUT).attributes[c.ROLLOUT_OUTCOME] == c.OUTCOME_UNSCORED


def test_a_continuation_asked_for_reserves_a_step_and_hands_the_rollout_off(captured: CapturedSpans) -> None:
    with gymtrace.rollout(rollout_id="r-cont"), gymtrace.episode():
        with gymtrace.step():
            pass
        headers = propagation.inject({}, destination=propagation.GYM_INTERNAL, continuation=True)
        with gymtrace.step():
            pass
    with propagation.attach(headers), gymtrace.step():
        pass
    steps = sorted(s.attributes[c.STEP_NUMBER] for s in captured.by_kind(c.KIND_STEP))
    assert steps == [1, 2, 3]  # step 2 is the continuation's
    assert captured.one(c.KIND_ROLLOUT).attributes[c.ROLLOUT_OUTCOME] == c.OUTCOME_PENDING


# -- under gymtrace's configuration: the global propagator reads the identity once ------------------


def test_under_configure_an_extraction_reads_the_identity_once_for_every_reader(
    forget_configure, captured: CapturedSpans
) -> None:
    # FastAPI's own telemetry and the official ASGI middleware extract with the global propagator:
    # once gymtrace is configured, the gym entries never become OpenTelemetry baggage there, and
    # the server span, the middleware and the continued scope take the identity read that once.
    gymtrace.configure(file=False)
    extracted = propagate.extract(INCOMING)
    assert baggage.get_all(extracted) == {"tenant": "acme"}
    assert propagation.identity_from_context(extracted) == IDENTITY
    # As FastAPI's telemetry does: the extracted context attached, the server span started in it.
    outer = otel_context.attach(extracted)
    try:
        with captured.tracer_provider.get_tracer("some.server").start_as_current_span("GET /work"):
            current = otel_context.get_current()
            identity = instrumentation.incoming_identity(INCOMING["baggage"], current)
            assert identity == IDENTITY
            # Another header than the one extracted is read for itself.
            assert instrumentation.incoming_identity("gym.rollout.id=r-9", current) == {c.ROLLOUT_ID: "r-9"}
            token = otel_context.attach(instrumentation.continue_scope(current, identity))
            try:
                assert _gym_baggage() == {}
                with gymtrace.step():
                    pass
            finally:
                otel_context.detach(token)
    finally:
        otel_context.detach(outer)
    _assert_stamped(captured, "GET /work")
    # The step number the caller reserved (gym.step.base) still numbers the steps here.
    assert captured.one(c.KIND_STEP).attributes[c.STEP_NUMBER] == 4


def test_under_configure_an_extraction_believes_only_what_the_trust_setting_allows(
    forget_configure, captured: CapturedSpans
) -> None:
    gymtrace.configure(file=False, trust_identity="none")
    extracted = propagate.extract(INCOMING)
    assert baggage.get_all(extracted) == {"tenant": "acme"}
    assert propagation.identity_from_context(extracted) == {}
    with captured.tracer_provider.get_tracer("some.server").start_as_current_span(
        "GET /work", context=extracted
    ):
        pass
    (span,) = captured.spans
    assert not [key for key in span.attributes or {} if key.startswith("gym.")]


def test_without_a_baggage_propagator_the_identity_stays_behind_under_configure(forget_configure) -> None:
    from opentelemetry.propagators.composite import CompositePropagator
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    before = propagate.get_global_textmap()
    propagate.set_global_textmap(CompositePropagator([TraceContextTextMapPropagator()]))
    try:
        gymtrace.configure(file=False)
        extracted = propagate.extract(INCOMING)
        assert propagation.identity_from_context(extracted) == {}
        assert baggage.get_all(extracted) == {}
        assert propagate.get_global_textmap().fields == {"traceparent", "tracestate"}
    finally:
        gymtrace.testing.reset()
        propagate.set_global_textmap(before)


def test_reset_sets_the_global_propagator_back(forget_configure) -> None:
    before = propagate.get_global_textmap()
    gymtrace.configure(file=False)
    assert propagate.get_global_textmap() is not before
    gymtrace.testing.reset()
    assert propagate.get_global_textmap() is before
    extracted = propagate.extract(INCOMING)
    assert baggage.get_baggage(c.ROLLOUT_ID, extracted) == "r-7"  # OpenTelemetry's reading again


def test_with_the_sdk_disabled_configure_leaves_the_global_propagator_as_it_is(
    forget_configure, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = propagate.get_global_textmap()
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    gymtrace.configure(file=False)
    assert propagate.get_global_textmap() is before
