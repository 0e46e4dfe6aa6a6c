"""NeMo Gym pieces without NeMo Gym; private where traces are encoded by hand and read in process.

The NeMo Gym pieces that need no NeMo Gym: destinations identity may go to, IDs pinned for a
resume pass, a trace directory and NeMo Gym's own rollout key in the readers, process names.
The stack itself is tests/test_nemo_gym_stack.py."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import gymtrace
from gymtrace import attributes, instrumentation, propagation
from gymtrace._model.spandata import encode_otlp_json, read_otlp_json_lines
from gymtrace.integrations import nemo_gym
from gymtrace.integrations.autoinstrument import is_helper_process
from gymtrace.propagation import inject


@pytest.fixture(autouse=True)
def _reset(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("GYMTRACE_PROPAGATE_TO", raising=False)
    gymtrace.testing.reset()
    yield
    gymtrace.testing.reset()


def _baggage_to(url: object) -> str:
    with gymtrace.testing.capture_spans(), gymtrace.rollout(rollout_id="3-1", task_id="3"):
        return inject({}, destination=url).get("baggage", "")


def test_gym_identity_goes_to_loopback_and_listed_hosts_only(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "gym.rollout.id=3-1" in _baggage_to("http://127.0.0.1:9000/run")
    assert "gym.rollout.id=3-1" in _baggage_to("http://localhost/v1/responses")
    assert "gym." not in _baggage_to(None)  # unknown: it may be a model provider (issue 31)
    assert "gym.rollout.id=3-1" in _baggage_to(propagation.GYM_INTERNAL)  # a child, a pool task
    assert "gym." not in _baggage_to("https://api.openai.com/v1/responses")
    monkeypatch.setenv("GYMTRACE_PROPAGATE_TO", "*.gym.internal,10.0.0.7:8000")
    gymtrace.testing.reset()
    assert "gym.rollout.id=3-1" in _baggage_to("http://env-1.gym.internal:8000/run")
    assert "gym.rollout.id=3-1" in _baggage_to("http://10.0.0.7:8000/run")
    assert "gym." not in _baggage_to("http://10.0.0.7:9000/run")


def test_a_framework_marks_its_own_servers_and_its_upstream() -> None:
    with instrumentation.gym_destination(False):
        # NeMo Gym's upstream model endpoint, even on loopback: never identity.
        assert "gym." not in _baggage_to("http://127.0.0.1:8000/v1/responses")
        assert not instrumentation.may_carry_identity("http://127.0.0.1:8000/")
    with instrumentation.gym_destination(True):
        assert "gym.rollout.id=3-1" in _baggage_to("http://10.1.2.3:11000/run")


def test_pinned_ids_give_a_resume_pass_the_trace_and_span_of_the_first() -> None:
    run_id = nemo_gym.run_id_for_output("/tmp/out/rollouts.jsonl")
    trace_id = nemo_gym.trace_id_for(run_id, "1-0")
    rollout_span = nemo_gym.span_id_for(run_id, "1-0", "rollout")
    first_episode = nemo_gym.span_id_for(run_id, "1-0", "episode-0")
    with gymtrace.testing.capture_spans() as captured:
        with gymtrace.run(run_id=run_id):
            with instrumentation.pinned_ids(trace_id, rollout_span):
                rollout = gymtrace.rollout(rollout_id="1-0", task_id="1", repeat=0)
                rollout.__enter__()
            try:
                with instrumentation.pinned_ids(None, first_episode), gymtrace.episode():
                    gymtrace.record_failure(message="upstream 400")
            finally:
                rollout.__exit__(None, None, None)
        carrier = instrumentation.episode_carrier(
            {"gym.run.id": run_id, "gym.rollout.id": "1-0", "gym.task.id": "1", "gym.rollout.repeat": 0},
            next_attempt=1,
            trace_id=trace_id,
            rollout_span_id=rollout_span,
            episode_span_id=first_episode,
        )
        with gymtrace.episode(continue_from=carrier):
            gymtrace.record_reward(1.0)
    spans = captured.spans
    by_name = {(s.name, s.attributes.get("gym.episode.attempt")): s for s in spans}
    root = by_name[("gym.rollout", None)]
    assert (root.context.trace_id, root.context.span_id) == (trace_id, rollout_span)
    assert by_name[("gym.episode", 0)].context.span_id == first_episode
    second = by_name[("gym.episode", 1)]
    assert second.context.trace_id == trace_id and second.parent.span_id == rollout_span
    assert [(link.context.span_id, link.attributes["gym.link.relation"]) for link in second.links] == [
        (first_episode, "retry")
    ]
    assert gymtrace.testing.check_trace(spans) == []
    # Nothing else took the pinned IDs.
    assert sum(s.context.span_id == rollout_span for s in spans) == 1


def test_readers_take_a_directory_and_nemo_gyms_own_rollout_key(tmp_path: Path) -> None:
    with gymtrace.testing.capture_spans() as captured:
        with gymtrace.rollout(rollout_id="0-0", task_id="0"), gymtrace.episode():
            gymtrace.record_reward(1.0)
    first = captured.spans
    # NeMo Gym's own telemetry: spans with only nemo.gym.rollout.id, its attempt-qualified key.
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("nemo_gym").start_as_current_span("gym.model.call") as span:
        span.set_attribute("nemo.gym.rollout.id", "2-1-a1")
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "driver-1.jsonl").write_text(json.dumps(encode_otlp_json(first)) + "\n")
    (tmp_path / "traces" / "model-2.jsonl").write_text(
        json.dumps(encode_otlp_json(exporter.get_finished_spans())) + "\n"
    )
    spans = read_otlp_json_lines(tmp_path / "traces")
    assert len(spans) == len(first) + 1
    (theirs,) = [s for s in spans if s.name == "gym.model.call"]
    assert (theirs.attributes["gym.rollout.id"], theirs.attributes["gym.episode.attempt"]) == ("2-1", 1)
    # The CLI readers accept the directory too.
    from gymtrace._cli import main

    assert main(["check", str(tmp_path / "traces")]) == 0


def test_processes_are_named_after_their_nemo_gym_server_or_command() -> None:
    assert (
        nemo_gym.process_service_name(["app.py"], {"NEMO_GYM_CONFIG_PATH": "policy_model"}) == "policy_model"
    )
    assert nemo_gym.process_service_name(["/v/bin/gym", "eval", "run", "--no-serve"], {}) == "gym-eval-run"
    assert nemo_gym.process_service_name(["/v/bin/ng_collect_rollouts"], {}) == "ng_collect_rollouts"
    assert nemo_gym.process_service_name(["train.py"], {}) is None
    assert is_helper_process(["/v/lib/python3.11/site-packages/ray/_private/workers/default_worker.py"])
    assert is_helper_process(["ray::IDLE"])
    assert not is_helper_process(["/v/bin/gym", "env", "start"])


def test_nemo_gym_capture_keys_name_the_rollout_and_attempt() -> None:
    assert nemo_gym.identity_from_key("4-1") == nemo_gym.RolloutIdentity("4-1", "4", 1, 0)
    assert nemo_gym.identity_from_key("4-1-a2") == nemo_gym.RolloutIdentity("4-1", "4", 1, 2)
    assert nemo_gym.identity_from_key("my-id") == nemo_gym.RolloutIdentity("my-id", "", None, 0)
    assert nemo_gym.identity_from_key("../x") is None


class _Answer:
    """What the agent's request gets back, as aiohttp's response reads: a status and a body."""

    status = 200

    async def read(self) -> bytes:
        return b'{"output": []}'


def test_a_request_waited_on_gets_a_live_marker_dated_when_it_went_out_and_one_answered_sooner_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import asyncio

    from gymtrace.integrations.nemo_gym import agent

    def model_call(wrapped: Any) -> list[ReadableSpan]:
        """One model request of an agent's invocation, its answer from ``wrapped``: the step
        markers written."""

        async def call() -> None:
            invocation = agent._Invocation("my_agent", instrumentation.get_tracer())
            conversation = agent._Conversation(invocation, True, "my_agent")
            try:
                await agent._agent_request(
                    wrapped,
                    (),
                    {},
                    conversation,
                    "responses_api_models",
                    False,
                    "/v1/responses",
                    "policy_model",
                )
            finally:
                invocation.close()

        with gymtrace.rollout(rollout_id="0-0", task_id="0"), gymtrace.episode():
            asyncio.run(call())
        # Either way the step names the server its request went to.
        step = [s for s in captured.spans if (s.attributes or {}).get(attributes.KIND) == "step"][-1]
        assert tuple((step.attributes or {})[attributes.STEP_SERVERS]) == ("policy_model",)
        return step_markers()

    def step_markers() -> list[ReadableSpan]:
        # Not the live thread's rollout markers, which a rollout open at its next mark gets.
        return [m for m in captured.markers if (m.attributes or {}).get(attributes.LIVE_EVENT) == "step"]

    async def answered(*args: Any, **kwargs: Any) -> _Answer:
        return _Answer()

    sent: list[int] = []

    async def waited_on(*args: Any, **kwargs: Any) -> _Answer:
        sent.append(time.time_ns())
        while not step_markers():  # answered once its marker is written: no timing assumed
            await asyncio.sleep(0.01)
        return _Answer()

    with gymtrace.testing.capture_spans() as captured:
        # Answered before its marker is due (a minute here): nothing for `gymtrace live` to name.
        monkeypatch.setattr(agent, "MARK_AFTER", 60.0)
        assert model_call(answered) == []
        # Still waited on when it is due: one marker, dated when the request went out.
        monkeypatch.setattr(agent, "MARK_AFTER", 0.01)
        before = time.time_ns()
        (marker,) = model_call(waited_on)
    marker_attributes = dict(marker.attributes or {})
    assert marker_attributes[attributes.LIVE_SERVER] == "policy_model"
    assert marker_attributes[attributes.LIVE_STEP] == 1
    assert marker_attributes[attributes.ROLLOUT_ID] == "0-0"
    assert marker.start_time is not None and before <= marker.start_time <= sent[0]
    assert marker.end_time == marker.start_time


def test_an_answered_request_keeps_nothing_of_its_context_until_its_marker_would_be_due(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each request's marker is due a minute later here; answered at once, it must not keep its
    # context (and so the scopes and values in it) alive for that minute: what a busy agent keeps
    # alive across collections is what its garbage collector pays for.
    import asyncio
    import gc
    import weakref

    from opentelemetry import context as otel_context

    from gymtrace.integrations.nemo_gym import agent

    class Probe:
        pass

    monkeypatch.setattr(agent, "MARK_AFTER", 60.0)

    async def answered(*args: Any, **kwargs: Any) -> _Answer:
        return _Answer()

    async def call() -> bool:
        probe = Probe()
        alive = weakref.ref(probe)
        token = otel_context.attach(otel_context.set_value("test-probe", probe))
        try:
            invocation = agent._Invocation("my_agent", instrumentation.get_tracer())
            conversation = agent._Conversation(invocation, True, "my_agent")
            for _ in range(3):
                await agent._agent_request(
                    answered,
                    (),
                    {},
                    conversation,
                    "responses_api_models",
                    False,
                    "/v1/responses",
                    "policy_model",
                )
            invocation.close()
        finally:
            otel_context.detach(token)
        del probe, invocation, conversation
        gc.collect()
        # Still inside the loop, long before any marker would be due.
        return alive() is None

    with (
        gymtrace.testing.capture_spans(),
        gymtrace.rollout(rollout_id="0-0", task_id="0"),
        gymtrace.episode(),
    ):
        assert asyncio.run(call())
