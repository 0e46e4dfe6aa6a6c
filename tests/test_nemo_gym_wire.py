"""What the NeMo Gym integration reads; private where the readers run in process on spans built here.

What it reads off the wire and keeps between passes, without a stack.

The real stack (tests/test_nemo_gym_stack.py) proves the whole; these pin each reading: GenAI
attributes from Responses API and chat completions bodies, the exception NeMo Gym answers a 500
with, the pass log that makes a fresh pass a new run, a relative ``GYMTRACE_FILE``, and what the
readers make of a killed pass (``lost``) and of per-task means.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gymtrace import attributes as c
from gymtrace._model.spandata import SpanData
from gymtrace._read.outcomes import final_outcomes
from gymtrace._read.stats import summarise
from gymtrace.integrations import nemo_gym
from gymtrace.integrations.autoinstrument import absolute_trace_file

RESPONSES_BODY: dict[str, Any] = {
    "id": "resp_1",
    "model": "m-1",
    "object": "response",
    "status": "completed",
    "incomplete_details": None,
    "output": [
        {"type": "function_call", "name": "lookup", "call_id": "call_a", "arguments": "{}"},
        {"type": "function_call", "name": "lookup", "call_id": "call_b", "arguments": "{}"},
    ],
    "usage": {
        "input_tokens": 120,
        "input_tokens_details": {"cached_tokens": 100},
        "output_tokens": 30,
        "output_tokens_details": {"reasoning_tokens": 12},
    },
}
CHAT_BODY: dict[str, Any] = {
    "id": "chatcmpl-1",
    "model": "m-2",
    "choices": [
        {
            "finish_reason": "tool_calls",
            "message": {"tool_calls": [{"id": "call_c", "function": {"name": "get", "arguments": "{}"}}]},
        }
    ],
    "usage": {
        "prompt_tokens": 50,
        "completion_tokens": 7,
        "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 3},
    },
}


def test_a_responses_api_body_gives_tokens_cached_reasoning_response_id_and_the_tool_calls_it_asks_for() -> (
    None
):
    assert nemo_gym._usage_attributes(RESPONSES_BODY) == {
        c.GEN_AI_RESPONSE_ID: "resp_1",
        c.GEN_AI_RESPONSE_MODEL: "m-1",
        c.GEN_AI_USAGE_INPUT_TOKENS: 120,
        c.GEN_AI_USAGE_OUTPUT_TOKENS: 30,
        c.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: 100,
        c.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS: 12,
        c.GEN_AI_RESPONSE_FINISH_REASONS: ["tool_calls"],
        c.GEN_AI_RESPONSE_TOOL_CALL_IDS: ["call_a", "call_b"],
    }
    # Two calls of one tool in one response (parallel): each keeps its own ID, in order.
    assert nemo_gym._function_calls(RESPONSES_BODY) == [("lookup", "call_a"), ("lookup", "call_b")]
    truncated = {**RESPONSES_BODY, "output": [], "incomplete_details": {"reason": "max_output_tokens"}}
    assert nemo_gym._usage_attributes(truncated)[c.GEN_AI_RESPONSE_FINISH_REASONS] == ["max_output_tokens"]


def test_a_chat_completions_body_gives_the_same_attributes_under_its_own_field_names() -> None:
    assert nemo_gym._usage_attributes(CHAT_BODY) == {
        c.GEN_AI_RESPONSE_ID: "chatcmpl-1",
        c.GEN_AI_RESPONSE_MODEL: "m-2",
        c.GEN_AI_USAGE_INPUT_TOKENS: 50,
        c.GEN_AI_USAGE_OUTPUT_TOKENS: 7,
        c.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: 0,
        c.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS: 3,
        c.GEN_AI_RESPONSE_FINISH_REASONS: ["tool_calls"],
        c.GEN_AI_RESPONSE_TOOL_CALL_IDS: ["call_c"],
    }
    assert nemo_gym._usage_attributes("not a body") == {}
    assert nemo_gym._usage_attributes({"usage": {"input_tokens": True, "output_tokens": -1}}) == {}


def _one_span(body: bytes) -> Any:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    span = provider.get_tracer("t").start_span("gym.verify")
    nemo_gym._record_server_error(span, 500, body)
    span.end()
    (finished,) = exporter.get_finished_spans()
    return finished


def test_the_exception_nemo_gym_answers_a_500_with_is_on_the_failing_span() -> None:
    span = _one_span(json.dumps(repr(ValueError("no answer in 'response'"))).encode())
    assert span.status.is_ok is False
    assert span.status.description == "ValueError: no answer in 'response'"
    assert span.attributes[c.ERROR_TYPE] == "ValueError"
    (event,) = span.events
    assert (event.name, dict(event.attributes or {})) == (
        c.EXCEPTION_EVENT,
        {c.EXCEPTION_TYPE: "ValueError", c.EXCEPTION_MESSAGE: "no answer in 'response'"},
    )
    # With the traceback NeMo Gym formatted in the server, the event carries it too.
    stacktrace = 'Traceback (most recent call last):\n  File "app.py", line 9, in verify\nValueError: x\n'
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    traced = provider.get_tracer("t").start_span("gym.verify")
    nemo_gym._record_server_error(traced, 500, json.dumps(repr(ValueError("x"))).encode(), stacktrace)
    traced.end()
    (event,) = exporter.get_finished_spans()[0].events
    assert dict(event.attributes or {})[c.EXCEPTION_STACKTRACE] == stacktrace
    # An answer that names no exception: the status says the HTTP status, nothing is made up.
    plain = _one_span(b'"An unknown error occurred"')
    assert plain.status.description == "HTTP 500" and c.ERROR_TYPE not in (plain.attributes or {})


def test_a_relative_trace_file_is_made_absolute_for_the_processes_started_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    environ = {"GYMTRACE_FILE": "traces/"}
    assert absolute_trace_file(environ) == f"{tmp_path}/traces/"
    assert environ["GYMTRACE_FILE"] == f"{tmp_path}/traces/"  # what a child process inherits
    environ = {"GYMTRACE_FILE": "run.jsonl"}
    assert absolute_trace_file(environ) == f"{tmp_path}/run.jsonl"
    untouched = {"GYMTRACE_FILE": "/abs/traces/"}
    assert absolute_trace_file(untouched) == "/abs/traces/" and untouched == {"GYMTRACE_FILE": "/abs/traces/"}
    assert absolute_trace_file({}) == ""


def test_the_pass_log_names_the_run_of_the_last_fresh_pass_and_where_each_attempt_failed(
    tmp_path: Path,
) -> None:
    output = tmp_path / "out" / "rollouts.jsonl"
    output.parent.mkdir()
    assert nemo_gym.output_passes(output) is None
    log = nemo_gym.pass_log_path(output)
    assert log == output.with_name(".rollouts.jsonl.gymtrace-passes.jsonl")
    lines = [
        {"pass": "fresh", "run_id": "r-first"},
        {"group_sizes": {"0": 4, "1": 4, "2": 4}},
        {"failed": "1-0", "attempt": 0},
        {"pass": "fresh", "run_id": "r-second"},  # a fresh pass over the same output: a new run
        {"group_sizes": {"0": 2, "1": 3, "2": True}},  # task 2: not a size
        {"failed": "2-0", "attempt": 0},
        {"pass": "resume", "run_id": "r-second"},
        {"failed": "2-0", "attempt": 1},
    ]
    log.write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"pass": "res')  # killed mid-line
    passes = nemo_gym.output_passes(output)
    assert passes is not None
    assert (passes.run_id, passes.passes, dict(passes.failed_in)) == (
        "r-second",
        2,
        {("2-0", 0): 0, ("2-0", 1): 1},
    )
    # The group sizes its fresh pass counted, for the resume passes that dispatch only what is left.
    assert dict(passes.group_sizes) == {"0": 2, "1": 3}


def test_a_tasks_group_is_named_by_its_run_and_task_and_stays_an_id_under_a_long_run_id() -> None:
    assert nemo_gym.group_id_for("rollouts-3f2a-a1b2c3", "7") == "rollouts-3f2a-a1b2c3/task-7"
    assert nemo_gym.group_id_for("rollouts-3f2a-a1b2c3", "7") != nemo_gym.group_id_for(
        "rollouts-3f2a-d4e5f6", "7"
    )
    long_run = "r" * 300
    group = nemo_gym.group_id_for(long_run, "12")
    assert len(group) <= 256 and group.endswith("/task-12")
    assert group == nemo_gym.group_id_for(long_run, "12") != nemo_gym.group_id_for("s" * 300, "12")


def _span(span_id: str, trace: str, kind: str, start: int, end: int, **attributes: Any) -> SpanData:
    return SpanData(trace, span_id, None, f"gym.{kind}", start, end, {c.KIND: kind, **attributes})


def test_a_rollout_whose_process_died_reads_lost_and_stats_count_it_outside_the_mean() -> None:
    # The marker is from 1970: its process stopped beating long before the reader's clock.
    identity = {c.RUN_ID: "r", c.TASK_ID: "3"}
    spans = [
        _span(
            "a" * 16,
            "1" * 32,
            c.KIND_ROLLOUT,
            1,
            2,
            **identity,
            **{
                c.ROLLOUT_ID: "3-0",
                c.REWARD: 1.0,
                c.ROLLOUT_OUTCOME: c.OUTCOME_SCORED,
                c.ROLLOUT_ATTEMPTS: 1,
            },
        ),
        _span(
            "b" * 16,
            "2" * 32,
            c.KIND_LIVE,
            5,
            5,
            **identity,
            **{
                c.ROLLOUT_ID: "3-1",
                c.LIVE_EVENT: c.LIVE_EVENT_ROLLOUT,
                c.LIVE_INTERVAL: 1.0,
                c.EPISODE_ATTEMPT: 0,
            },
        ),
    ]
    outcomes = {o.rollout_id: o for o in final_outcomes(spans)}
    assert outcomes["3-1"].outcome == c.OUTCOME_LOST and outcomes["3-1"].reward is None
    assert outcomes["3-1"].run_id == "r"
    (stats,) = summarise(outcomes=list(outcomes.values()))
    body = stats.as_json()
    assert (body["scored"], body["unscored"], body["lost"], body["mean_reward"]) == (1, 0, 1, 1.0)
    assert body["task_means"] == {"3": 1.0}


def test_check_names_a_server_that_took_part_in_a_rollout_but_left_no_span_in_its_trace() -> None:
    from gymtrace._read.check import missing_service_notes

    trace = "3" * 32
    rollout = _span("c" * 16, trace, c.KIND_ROLLOUT, 1, 9, **{c.ROLLOUT_ID: "0-0"})
    marker = _span("d" * 16, trace, c.KIND_LIVE, 2, 2, **{c.ROLLOUT_ID: "0-0", c.LIVE_SERVER: "policy_model"})
    assert missing_service_notes([rollout, marker]) == [
        "rollout 0-0: no span of policy_model, which took part in it: did that process write its trace"
        " elsewhere (a relative GYMTRACE_FILE)?"
    ]
    model = SpanData(trace, "e" * 16, "c" * 16, "chat m", 3, 4, {c.ROLLOUT_ID: "0-0"}, service="policy_model")
    assert missing_service_notes([rollout, marker, model]) == []
    # No request waited long enough for a marker: the agent's step names where its requests went.
    step = SpanData(
        trace,
        "f" * 16,
        "c" * 16,
        "gym.step",
        2,
        8,
        {c.ROLLOUT_ID: "0-0", c.KIND: c.KIND_STEP, c.STEP_SERVERS: ("policy_model", "tools")},
        service="my_agent",
    )
    assert missing_service_notes([rollout, step, model]) == [
        "rollout 0-0: no span of tools, which took part in it: did that process write its trace"
        " elsewhere (a relative GYMTRACE_FILE)?"
    ]
    tool = SpanData(trace, "9" * 16, "f" * 16, "execute_tool t", 5, 6, {c.ROLLOUT_ID: "0-0"}, service="tools")
    assert missing_service_notes([rollout, step, model, tool]) == []


def test_live_shows_the_step_a_rollout_is_in_and_the_server_its_request_waits_on() -> None:
    from gymtrace._read.liveview import live_rollouts

    trace = "4" * 32
    now = 10 * 10**9
    beat = {c.ROLLOUT_ID: "3-0", c.LIVE_INTERVAL: 1.0, c.EPISODE_ATTEMPT: 0}
    driver = SpanData(
        trace, "1" * 16, None, "gym.live", now - 10**8, now - 10**8,
        {c.KIND: c.KIND_LIVE, c.LIVE_EVENT: c.LIVE_EVENT_HEARTBEAT, c.LIVE_STEP: 0, **beat},
        service="gym-eval-run",
    )  # fmt: skip
    request = SpanData(
        trace, "2" * 16, None, "gym.live", now - 5 * 10**8, now - 5 * 10**8,
        {c.KIND: c.KIND_LIVE, c.LIVE_EVENT: c.LIVE_EVENT_STEP, c.LIVE_STEP: 2, c.LIVE_SERVER: "policy_model",
         c.ROLLOUT_ID: "3-0"},
        service="agent",
    )  # fmt: skip
    # The model server's HTTP plumbing ended after the request went out; its chat span did not.
    plumbing = SpanData(trace, "3" * 16, None, "fastapi.dependencies", now - 4 * 10**8, now - 4 * 10**8, {})
    # The resources server's seed span began before the request went out and ended after it: the
    # server answered first and closed its span later (a loaded machine). Not a step further on.
    seed = SpanData(
        trace, "6" * 16, None, "seed_session", now - 6 * 10**8, now - 4 * 10**8,
        {c.KIND: c.KIND_SEED_SESSION, c.ROLLOUT_ID: "3-0"}, service="resources",
    )  # fmt: skip
    (live,) = live_rollouts([driver, request, plumbing, seed], now_ns=now)
    assert (live.state, live.step, live.service) == ("running", 2, "policy_model")
    answered = SpanData(
        trace, "5" * 16, None, "chat m", now - 4 * 10**8, now - 3 * 10**8,
        {c.KIND: c.KIND_MODEL_CALL, c.ROLLOUT_ID: "3-0"}, service="policy_model",
    )  # fmt: skip
    (live,) = live_rollouts([driver, request, plumbing, seed, answered], now_ns=now)
    assert (live.step, live.service) == (2, "gym-eval-run")
