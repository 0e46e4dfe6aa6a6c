"""gymtrace.propagation: W3C trace context + gym identity across threads, processes and env vars."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from opentelemetry import baggage, propagate, trace
from opentelemetry import context as otel_context
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

import gymtrace
from child_process import clean_env
from gymtrace import attributes as c
from gymtrace import instrumentation, propagation
from otlp_lines import read_otlp_json_lines

REMOTE_TRACE = "0af7651916cd43dd8448eb211c80319c"
REMOTE_SPAN = "b7ad6b7169203331"
HEADERS = {
    "traceparent": f"00-{REMOTE_TRACE}-{REMOTE_SPAN}-01",
    "baggage": "gym.rollout.id=r-7,gym.episode.attempt=1,gym.run.id=run-1,gym.episode.id=r-7-a1",
}


def _id(span) -> str:
    return trace.format_span_id(span.get_span_context().span_id)


def _parent(span) -> str | None:
    return trace.format_span_id(span.parent.span_id) if span.parent is not None else None


def test_inject_writes_traceparent_and_identity_baggage_for_a_gym_destination():
    with gymtrace.testing.capture_spans():
        with gymtrace.rollout(rollout_id="r-1", task_id="t-1", repeat=0), gymtrace.episode() as episode:
            headers = propagation.inject({}, destination="http://127.0.0.1:8000/run")
    assert headers["traceparent"].split("-")[1:3] == [episode.trace_id, episode.span_id]
    carried = baggage.get_all(W3CBaggagePropagator().extract(headers))
    # A plain request reserves no step: no gym.step.base.
    assert carried == {
        c.ROLLOUT_ID: "r-1",
        c.TASK_ID: "t-1",
        c.ROLLOUT_REPEAT: "0",
        c.EPISODE_ATTEMPT: "0",
        c.EPISODE_ID: "r-1",
    }


def test_a_continuation_asked_for_reserves_the_episodes_next_step():
    with gymtrace.testing.capture_spans():
        with gymtrace.rollout(rollout_id="r-1", task_id="t-1", repeat=0), gymtrace.episode():
            headers = propagation.inject({}, destination=propagation.GYM_INTERNAL, continuation=True)
    carried = baggage.get_all(W3CBaggagePropagator().extract(headers))
    # Injected at the episode level, outside any step: the callee's work is the episode's next
    # step, so its step number is reserved here.
    assert carried[c.STEP_BASE] == "1"
    assert carried[c.ROLLOUT_ID] == "r-1"


def test_inject_without_a_destination_sends_the_trace_and_no_identity():
    # An unknown destination may be a model provider (issue 31): traceparent only.
    with gymtrace.testing.capture_spans():
        with gymtrace.rollout(rollout_id="r-1", task_id="t-1"), gymtrace.episode() as episode:
            headers = propagation.inject({})
            public = propagation.inject({}, destination="https://api.openai.com/v1/chat/completions")
    for carried in (headers, public):
        assert carried["traceparent"].split("-")[1:3] == [episode.trace_id, episode.span_id]
        assert "baggage" not in carried


def test_a_continuation_to_a_destination_outside_the_gym_is_refused_loudly(caplog):
    with gymtrace.testing.capture_spans(strict=False) as captured:
        with caplog.at_level("WARNING", logger="gymtrace"):
            with gymtrace.rollout(rollout_id="r-1"), gymtrace.episode():
                headers = propagation.inject({}, continuation=True)
    # No identity went, so nothing can record the outcome elsewhere: not handed off.
    assert captured.one(c.KIND_ROLLOUT).attributes[c.ROLLOUT_OUTCOME] == c.OUTCOME_UNSCORED
    assert "baggage" not in headers
    assert any("continuation=True" in r.getMessage() for r in caplog.records)
    with gymtrace.testing.capture_spans(strict=True), pytest.raises(gymtrace.GymTraceError):
        with gymtrace.rollout(rollout_id="r-2"), gymtrace.episode():
            propagation.inject({}, destination="https://api.openai.com/v1", continuation=True)


def test_inject_sends_identity_keys_only_never_other_baggage():
    token = otel_context.attach(baggage.set_baggage("user.secret", "do-not-send"))
    try:
        with gymtrace.testing.capture_spans(), gymtrace.rollout(rollout_id="r-1"):
            headers = propagation.inject({}, destination="http://localhost:8000/")
    finally:
        otel_context.detach(token)
    assert "user.secret" not in headers["baggage"]
    assert set(baggage.get_all(W3CBaggagePropagator().extract(headers))) == {c.ROLLOUT_ID}


def test_inject_outside_any_scope_writes_no_baggage():
    assert "baggage" not in propagation.inject({})


def test_spans_under_attached_headers_continue_the_remote_trace_with_its_identity():
    with gymtrace.testing.capture_spans() as captured:
        with propagation.attach(HEADERS), gymtrace.tool_call(tool_name="search"):
            here = gymtrace.current()
    span = captured.one(c.KIND_TOOL_CALL)
    assert format(span.context.trace_id, "032x") == REMOTE_TRACE
    assert _parent(span) == REMOTE_SPAN
    assert span.attributes[c.ROLLOUT_ID] == "r-7"
    assert span.attributes[c.EPISODE_ATTEMPT] == 1
    assert (here.rollout_id, here.attempt, here.episode_id) == ("r-7", 1, "r-7-a1")


def test_foreign_span_in_extracted_context_gets_identity_from_baggage_alone():
    # What the official ASGI middleware does: its server span starts from propagate.extract(),
    # with no gym frame in the context.
    with gymtrace.testing.capture_spans() as captured:
        tracer = captured.tracer_provider.get_tracer("http-server")
        tracer.start_span("GET /run", context=propagate.extract(HEADERS)).end()
    (span,) = captured.spans
    assert span.attributes[c.ROLLOUT_ID] == "r-7"
    assert span.attributes[c.EPISODE_ATTEMPT] == 1
    assert _parent(span) == REMOTE_SPAN


@pytest.mark.parametrize(
    "carrier",
    [
        {"TRACEPARENT": HEADERS["traceparent"], "BAGGAGE": HEADERS["baggage"]},
        {"TraceParent": HEADERS["traceparent"], "Baggage": HEADERS["baggage"]},
        [(b"traceparent", HEADERS["traceparent"].encode()), (b"baggage", HEADERS["baggage"].encode())],
    ],
    ids=["env-names", "mixed-case-headers", "asgi-byte-pairs"],
)
def test_extract_reads_env_names_any_case_and_asgi_header_pairs(carrier):
    ctx = propagation.extract(carrier)
    assert format(trace.get_current_span(ctx).get_span_context().span_id, "016x") == REMOTE_SPAN
    assert propagation.identity_from_context(ctx)[c.ROLLOUT_ID] == "r-7"


def test_repeated_baggage_headers_give_one_identity_the_first_as_opentelemetry_takes_it():
    # Joining them let the SERVER span (OpenTelemetry's getter: first header) and the
    # handler (joined, last entry wins) see two different rollouts.
    carrier = [
        (b"traceparent", HEADERS["traceparent"].encode()),
        (b"baggage", b"gym.rollout.id=r-7"),
        (b"baggage", b"gym.rollout.id=r-evil,gym.episode.attempt=2"),
    ]
    ctx = propagation.extract(carrier)
    assert propagation.identity_from_context(ctx) == {c.ROLLOUT_ID: "r-7"}
    official = propagate.extract(carrier, getter=_AsgiLikeGetter())
    assert baggage.get_baggage(c.ROLLOUT_ID, official) == "r-7"


def _sent(headers) -> dict[str, object]:
    """The baggage a receiver gets from ``headers``."""
    return dict(baggage.get_all(W3CBaggagePropagator().extract(headers, context=otel_context.Context())))


class _AsgiLikeGetter:
    """What opentelemetry-instrumentation-asgi's getter returns: every value of a header."""

    def get(self, carrier, key):
        values = [v.decode() for k, v in carrier if k.decode().lower() == key]
        return values or None

    def keys(self, carrier):
        return [k.decode() for k, _ in carrier]


def test_baggage_property_is_stripped_and_plus_is_kept():
    ctx = propagation.extract({"baggage": "gym.rollout.id=r+1;ttl=30,gym.task.id=t%2F1,tenant=acme;p"})
    assert propagation.identity_from_context(ctx) == {c.ROLLOUT_ID: "r+1", c.TASK_ID: "t/1"}
    assert baggage.get_baggage("tenant", ctx) == "acme"


def test_application_baggage_stays_in_the_context_but_is_forwarded_only_when_allowed(forget_configure):
    incoming = {"baggage": "gym.rollout.id=r-1,tenant=acme,user.email=a%40b.c,flag=on"}
    handoff = {"destination": propagation.GYM_INTERNAL, "continuation": True}
    with gymtrace.testing.capture_spans(), propagation.attach(incoming):
        # The identity is gymtrace's, not baggage (issue 31); the application's entries stay.
        assert baggage.get_all() == {"tenant": "acme", "user.email": "a@b.c", "flag": "on"}
        assert gymtrace.current().rollout_id == "r-1"
        default = _sent(propagation.inject({}, **handoff))
        gymtrace.configure(baggage_allow="tenant, flag", file=False)
        allowed = _sent(propagation.inject({}, **handoff))
    # Each hand-off from the continued scope reserves a step number of its own (issue 25).
    assert default == {c.ROLLOUT_ID: "r-1", c.STEP_BASE: "1"}
    assert allowed == {c.ROLLOUT_ID: "r-1", "tenant": "acme", "flag": "on", c.STEP_BASE: "2"}


def test_allow_list_comes_from_the_environment_and_never_lets_gym_keys_through(forget_configure, monkeypatch):
    monkeypatch.setenv("GYMTRACE_BAGGAGE_ALLOW", "tenant,gym.episode.attempt")
    gymtrace.testing.reset()  # the environment read again (strict mode forgotten with the rest)
    token = otel_context.attach(baggage.set_baggage("tenant", "acme", baggage.set_baggage("other", "x")))
    try:
        sent = _sent(propagation.inject({}, destination=propagation.GYM_INTERNAL))
    finally:
        otel_context.detach(token)
    assert sent == {"tenant": "acme"}


@pytest.mark.parametrize(
    "entry",
    [
        "gym.episode.attempt=-1",
        "gym.episode.attempt=abc",
        "gym.episode.attempt=99999999999",
        "gym.episode.attempt=%D9%A3",  # an Arabic-Indic digit: isdigit() but not an attempt number
        "gym.rollout.id=" + "x" * 300,
        "gym.rollout.id=%01bell",
        "gym.rollout.id=",
    ],
)
def test_invalid_identity_values_are_dropped(entry):
    ctx = propagation.extract({"baggage": entry})
    assert propagation.identity_from_context(ctx) == {}


def test_extracted_context_keeps_application_baggage_and_the_identity_apart():
    ctx = propagation.extract({"baggage": "gym.rollout.id=r-1,tenant=acme,big=" + "y" * 1000})
    assert baggage.get_all(ctx) == {"tenant": "acme", "big": "y" * 1000}
    assert propagation.identity_from_context(ctx) == {c.ROLLOUT_ID: "r-1"}


def test_garbage_traceparent_starts_a_new_trace_and_keeps_valid_identity():
    with gymtrace.testing.capture_spans() as captured:
        with propagation.attach({"traceparent": "00-zz-garbage", "baggage": "gym.rollout.id=r-9"}):
            with gymtrace.tool_call(tool_name="t"):
                pass
    span = captured.one(c.KIND_TOOL_CALL)
    assert span.parent is None
    assert span.attributes[c.ROLLOUT_ID] == "r-9"


def test_inject_failure_never_reaches_the_caller(monkeypatch):

    class Broken(dict):
        def __setitem__(self, key, value):
            raise RuntimeError("read-only carrier")

    with gymtrace.testing.capture_spans(strict=False), gymtrace.rollout(rollout_id="r-1"):
        assert isinstance(propagation.inject(Broken()), Broken)
        instrumentation.inject_context(
            Broken(), propagation.with_identity(destination=propagation.GYM_INTERNAL)
        )


class _EchoPropagator(TextMapPropagator):
    """A non-W3C propagator, to see that OTEL_PROPAGATORS-style global settings are used."""

    def inject(self, carrier, context=None, setter=None):
        carrier["x-echo-trace"] = "echo"

    def extract(self, carrier, context=None, getter=None):
        values = getter.get(carrier, "x-echo-trace") if getter else None
        return baggage.set_baggage("echo.seen", values[0] if values else "no", context)

    @property
    def fields(self):
        return {"x-echo-trace"}


def test_global_propagators_are_honoured_for_headers_and_env_names():
    previous = propagate.get_global_textmap()
    propagate.set_global_textmap(
        CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator(), _EchoPropagator()])
    )
    try:
        with gymtrace.testing.capture_spans(), gymtrace.rollout(rollout_id="r-1"):
            env = propagation.env_carrier()
        assert env["X_ECHO_TRACE"] == "echo"
        assert {"TRACEPARENT", "BAGGAGE"} <= set(env)
        # The getter folds X_ECHO_TRACE back to x-echo-trace; echo.seen is not identity, so
        # only the raw propagated context (before gymtrace's filtering) would hold it.
        assert propagation.identity_from_context(propagation.extract(env)) == {c.ROLLOUT_ID: "r-1"}
    finally:
        propagate.set_global_textmap(previous)


def test_without_the_baggage_propagator_identity_stays_behind():
    previous = propagate.get_global_textmap()
    propagate.set_global_textmap(TraceContextTextMapPropagator())
    try:
        with gymtrace.testing.capture_spans(), gymtrace.rollout(rollout_id="r-1"):
            headers = propagation.inject({}, destination=propagation.GYM_INTERNAL)
        assert set(headers) == {"traceparent"}
    finally:
        propagate.set_global_textmap(previous)


def test_a_hook_writes_the_context_with_identity_made_as_inject_writes_it(forget_configure):
    # The aiohttp and httpx hooks make the request's context once (with_identity, to attach it
    # around the request) and write that one: the same headers, the identity decided once.
    gymtrace.configure(baggage_allow="tenant", file=False)
    url = "http://127.0.0.1:8000/run"
    token = otel_context.attach(baggage.set_baggage("tenant", "a b+c", baggage.set_baggage("secret", "x")))
    try:
        with gymtrace.testing.capture_spans(), gymtrace.rollout(rollout_id="r 1", task_id="t-1"):
            ctx = propagation.with_identity(destination=url)
            written: dict[str, str] = {}
            instrumentation.inject_context(written, ctx)
            injected = propagation.inject({}, destination=url)
    finally:
        otel_context.detach(token)
    assert written == injected
    # A space percent-encoded (OpenTelemetry would write "+", which W3C Baggage keeps as "+").
    assert "gym.rollout.id=r%201" in written["baggage"] and "tenant=a%20b+c" in written["baggage"]
    assert "secret" not in written["baggage"]


CHILD = textwrap.dedent(
    """
    import os, sys
    import gymtrace
    gymtrace.configure(service_name="sandbox", file=sys.argv[1])
    with gymtrace.propagation.attach(os.environ):
        with gymtrace.tool_call(tool_name="sandboxed"):
            pass
    gymtrace.shutdown()
    """
)


def test_child_process_started_with_env_carrier_joins_the_trace(tmp_path):
    out = tmp_path / "child.jsonl"
    env = clean_env()
    with gymtrace.testing.capture_spans() as captured:
        with gymtrace.rollout(rollout_id="r-env"), gymtrace.episode(), gymtrace.step() as step:
            subprocess.run(
                [sys.executable, "-c", CHILD, str(out)],
                env={**env, **propagation.env_carrier()},
                check=True,
                timeout=60,
            )
    (child,) = read_otlp_json_lines(out)
    assert child.service == "sandbox"
    assert child.trace_id == step.trace_id
    assert child.parent_id == step.span_id
    assert child.attributes[c.ROLLOUT_ID] == "r-env"
    assert child.attributes[c.EPISODE_ATTEMPT] == 0
    assert captured.one(c.KIND_STEP).name == "gym.step"


HAND_OFF_FIX = (
    "If it was meant for a gym scope in another process, continue that scope here with"
    " gymtrace.propagation.attach(carrier), and the sender must inject the carrier with"
    " gymtrace.propagation.inject(carrier, continuation=True) or"
    " gymtrace.propagation.inject(carrier, destination=URL): a carrier injected with neither"
    " carries no gym identity"
)


def test_a_reward_after_a_carrier_without_identity_names_both_ways_the_sender_gives_one(caplog):
    # Code written against the earlier API: inject({}) carried the identity, now only traceparent
    # (issue 43). The receiving side cannot tell that from a caller outside the gym, so it says
    # what the sender must do if the reward was meant for a gym scope.
    with gymtrace.testing.capture_spans(strict=False):
        with gymtrace.rollout(rollout_id="r-1"), gymtrace.episode():
            carrier = propagation.inject({})
        with caplog.at_level("WARNING", logger="gymtrace"):
            with propagation.attach(carrier):
                gymtrace.record_reward(1.0)  # no gym scope at all
            with propagation.attach(carrier), gymtrace.verify():
                gymtrace.record_reward(1.0)  # a verify scope, but no episode or rollout
    messages = [r.getMessage() for r in caplog.records if "record_reward" in r.getMessage()]
    assert len(messages) == 2 and all(HAND_OFF_FIX in m for m in messages), messages
    assert "outside every gym scope" in messages[0] and "inside verify" in messages[1]
    # Strict mode (GYMTRACE_STRICT=true, testing.strict()) raises the same words.
    with gymtrace.testing.capture_spans(strict=True), propagation.attach(carrier):
        with pytest.raises(gymtrace.GymTraceError, match=r"continuation=True\) or gymtrace\.propagation"):
            gymtrace.record_reward(1.0)
