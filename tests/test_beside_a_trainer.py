"""Beside a trainer's own telemetry: a trainer (NeMo RL) that traces itself with OpenTelemetry hands
its context to the gym, and each rollout stays the root of its own trace with a ``caller`` link to
the trainer's rollout-batch span, instead of joining the trainer's trace (issue 44). gymtrace's own
hand-offs (a run or rollout of another gymtrace process, whose identity this process believes)
keep continuing as before.

The process test runs a stand-in trainer (tests/support/stand_in_trainer.py: NeMo RL's span and
attribute names on the real OpenTelemetry SDK, nothing of gymtrace's) against a gym HTTP service in
its own process, with and without the official ASGI middleware's HTTP server span in between.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace

import gymtrace
from _distributed import RELAY, read_services, services
from child_process import run_python
from gymtrace import attributes as c
from gymtrace import instrumentation, propagation
from gymtrace.demo.distributed import official_instrumentation_available
from gymtrace.testing import CapturedSpans

TRAINER = str(Path(__file__).parent / "support" / "stand_in_trainer.py")
PROMPTS, SAMPLES = 2, 3


def _links(span: Any) -> list[tuple[int, int, str | None]]:
    return [
        (link.context.trace_id, link.context.span_id, link.attributes.get(c.LINK_RELATION))
        for link in span.links
    ]


def _trainer_spans(path: Path) -> list[dict[str, Any]]:
    """The stand-in trainer's spans, as the SDK's ``ReadableSpan.to_json()`` wrote them."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _hex(value: str) -> str:
    return value.removeprefix("0x")


@pytest.mark.e2e
@pytest.mark.parametrize("official", [False, True], ids=["no-http-span", "official-http-span"])
def test_a_trainers_request_gets_a_rollout_of_its_own_trace_linked_to_the_trainers_batch_span(
    tmp_path: Path, official: bool
) -> None:
    if official and not official_instrumentation_available():
        pytest.skip("needs opentelemetry-instrumentation-asgi (the dev extra)")
    gym_dir = tmp_path / "gym"
    gym_dir.mkdir()
    trainer_out = tmp_path / "trainer.ndjson"
    extra = [*RELAY, "--official"] if official else list(RELAY)
    with services(gym_dir, [("gym-env", "app", extra)]) as (gym,):
        done = run_python(TRAINER, "http", gym.url, str(trainer_out), str(PROMPTS), str(SAMPLES), timeout=120)
        assert done.returncode == 0, done.stderr
    gym_spans = read_services(gym_dir)
    trainer = _trainer_spans(trainer_out)

    (step,) = [s for s in trainer if s["name"] == "rl.grpo.step"]
    (batch,) = [s for s in trainer if s["name"] == "rl.grpo.collect_rollouts"]
    assert batch["attributes"]["rl.num_generations_per_prompt"] == SAMPLES
    trainer_trace = _hex(step["context"]["trace_id"])
    assert _hex(batch["context"]["trace_id"]) == trainer_trace
    batch_span = _hex(batch["context"]["span_id"])

    rollouts = [s for s in gym_spans if s.attributes.get(c.KIND) == c.KIND_ROLLOUT]
    assert len(rollouts) == PROMPTS * SAMPLES
    for rollout in rollouts:
        # Its own trace: a root, in a trace of its own, linked to the batch that asked for it.
        assert rollout.parent_id is None, rollout
        assert rollout.trace_id != trainer_trace
        assert [
            (link.trace_id, link.span_id, link.attributes.get(c.LINK_RELATION)) for link in rollout.links
        ] == [(trainer_trace, batch_span, c.RELATION_CALLER)]
        # With its own gym attributes, on it and on every span below it.
        task = rollout.attributes[c.TASK_ID]
        assert rollout.attributes[c.ROLLOUT_ID] == f"{task}-{rollout.attributes[c.ROLLOUT_REPEAT]}"
        assert (rollout.attributes[c.GROUP_ID], rollout.attributes[c.GROUP_SIZE]) == (f"task-{task}", SAMPLES)
        below = [s for s in gym_spans if s.trace_id == rollout.trace_id and s is not rollout]
        assert {s.attributes.get(c.KIND) for s in below} >= {c.KIND_EPISODE, c.KIND_TOOL_CALL, c.KIND_VERIFY}
        assert all(s.attributes.get(c.ROLLOUT_ID) == rollout.attributes[c.ROLLOUT_ID] for s in below)
    assert len({r.trace_id for r in rollouts}) == len(rollouts)

    # The trainer's trace holds its own spans (and the gym's HTTP server spans of its requests,
    # children of the batch span), never a gym span.
    in_trainer_trace = [s for s in gym_spans if s.trace_id == trainer_trace]
    assert not [s for s in in_trainer_trace if c.KIND in s.attributes], in_trainer_trace
    if official:
        assert len(in_trainer_trace) == PROMPTS * SAMPLES
        assert {s.parent_id for s in in_trainer_trace} == {batch_span}
    else:
        assert in_trainer_trace == []


def test_a_rollout_under_a_run_and_a_trainers_span_links_to_both_the_run_first(
    captured: CapturedSpans,
) -> None:
    foreign = captured.tracer_provider.get_tracer("nemo_rl.telemetry")
    with gymtrace.run(run_id="R") as run:
        with foreign.start_as_current_span(
            "rl.grpo.collect_rollouts", context=otel_context.Context()
        ) as batch:
            with gymtrace.rollout(rollout_id="0-0"):
                pass
    rollout = captured.one(c.KIND_ROLLOUT)
    assert rollout.parent is None
    assert _links(rollout) == [
        (run.span.get_span_context().trace_id, run.span.get_span_context().span_id, c.RELATION_RUN),
        (batch.get_span_context().trace_id, batch.get_span_context().span_id, c.RELATION_CALLER),
    ]


def test_a_span_of_the_applications_own_inside_a_gym_run_is_no_caller(captured: CapturedSpans) -> None:
    # The application's span inside the run is in the run's trace: the rollout links to the run only.
    app = captured.tracer_provider.get_tracer("app")
    with gymtrace.run(run_id="R") as run, app.start_as_current_span("collect"):
        with gymtrace.rollout(rollout_id="0-0"):
            pass
    rollout = captured.one(c.KIND_ROLLOUT)
    assert _links(rollout) == [
        (run.span.get_span_context().trace_id, run.span.get_span_context().span_id, c.RELATION_RUN)
    ]


def test_gymtraces_own_hand_off_of_a_run_still_links_the_rollout_to_the_run_and_nothing_else(
    captured: CapturedSpans,
) -> None:
    with gymtrace.run(run_id="R") as run:
        carrier = propagation.inject({}, destination=propagation.GYM_INTERNAL)
    # Another process continues the run (the carrier travelled with the work).
    with propagation.attach(carrier, trusted=True), gymtrace.rollout(rollout_id="0-0"):
        pass
    rollout = captured.one(c.KIND_ROLLOUT)
    assert rollout.parent is None
    assert _links(rollout) == [
        (run.span.get_span_context().trace_id, run.span.get_span_context().span_id, c.RELATION_RUN)
    ]


@pytest.mark.parametrize("http_span", [True, False], ids=["under-http-span", "under-caller-span"])
def test_a_request_noted_as_a_trainers_links_its_rollout_to_the_trainer_past_the_stand_in_run(
    captured: CapturedSpans, http_span: bool
) -> None:
    # What the NeMo Gym middleware does for an untraced driver's row that came with a trainer's
    # traceparent: a run made up for the request (continue_scope), under the request's HTTP server
    # span or, without one, the trainer's span itself; the rollout opened there.
    trainer = captured.tracer_provider.get_tracer("nemo_rl.telemetry")
    with trainer.start_as_current_span("rl.grpo.collect_rollouts", context=otel_context.Context()) as batch:
        headers = propagation.inject({}, destination="https://gym.example")  # traceparent, no identity
    server = captured.tracer_provider.get_tracer("an-http-server")
    incoming = propagation.extract(headers)
    with (
        server.start_as_current_span("POST /run", context=incoming)
        if http_span
        else trace.use_span(trace.get_current_span(incoming))
    ):
        ctx = instrumentation.note_caller(otel_context.get_current(), headers)
        ctx = instrumentation.continue_scope(ctx, {c.RUN_ID: "servers-only"})
        token = otel_context.attach(ctx)
        try:
            with gymtrace.rollout(rollout_id="0-0"):
                pass
        finally:
            otel_context.detach(token)
    rollout = captured.one(c.KIND_ROLLOUT)
    assert rollout.parent is None and rollout.attributes[c.RUN_ID] == "servers-only"
    batch_context = batch.get_span_context()
    # The caller only: the run made up for the request has no span, the trainer's is no run.
    assert _links(rollout) == [(batch_context.trace_id, batch_context.span_id, c.RELATION_CALLER)]


def test_a_request_without_a_trace_context_keeps_its_rollout_under_the_http_span_and_stand_in_run(
    captured: CapturedSpans,
) -> None:
    # The NeMo Gym servers-only rollout of a driver that sent no traceparent: as before issue 44.
    server = captured.tracer_provider.get_tracer("an-http-server")
    with server.start_as_current_span("POST /run") as request:
        ctx = instrumentation.note_caller(otel_context.get_current(), {})
        ctx = instrumentation.continue_scope(ctx, {c.RUN_ID: "servers-only"})
        token = otel_context.attach(ctx)
        try:
            with gymtrace.rollout(rollout_id="0-0"):
                pass
        finally:
            otel_context.detach(token)
    rollout = captured.one(c.KIND_ROLLOUT)
    assert rollout.parent is not None and rollout.parent.span_id == request.get_span_context().span_id
    assert list(rollout.links) == []


def test_a_train_step_opened_inside_the_trainers_own_step_span_is_its_own_trace_linked_to_it(
    captured: CapturedSpans,
) -> None:
    # gymtrace.train_step inside NeMo RL's rl.grpo.step: the step's consumed records stay in a
    # trace of gymtrace's, and Jaeger goes from it to NeMo RL's step.
    foreign = captured.tracer_provider.get_tracer("nemo_rl.telemetry")
    with gymtrace.run(run_id="R") as run:
        with foreign.start_as_current_span("rl.grpo.step", context=otel_context.Context()) as step:
            with gymtrace.train_step(step=1, policy_version=1):
                gymtrace.consume({c.RUN_ID: "R", c.ROLLOUT_ID: "0-0", c.POLICY_VERSION: 0})
    train_step = captured.one(c.KIND_TRAIN_STEP)
    assert train_step.parent is None
    assert _links(train_step) == [
        (run.span.get_span_context().trace_id, run.span.get_span_context().span_id, c.RELATION_RUN),
        (step.get_span_context().trace_id, step.get_span_context().span_id, c.RELATION_CALLER),
    ]
    (consumed,) = captured.by_kind(c.KIND_CONSUMED)
    assert consumed.context.trace_id == train_step.context.trace_id != step.get_span_context().trace_id


def test_with_one_trace_per_run_a_rollout_under_a_trainers_span_stays_in_the_runs_trace_linked_to_it(
    captured: CapturedSpans, forget_configure: None
) -> None:
    gymtrace.configure(trace_per="run", file=False)
    foreign = captured.tracer_provider.get_tracer("nemo_rl.telemetry")
    with gymtrace.run(run_id="R") as run:
        with foreign.start_as_current_span(
            "rl.grpo.collect_rollouts", context=otel_context.Context()
        ) as batch:
            with gymtrace.rollout(rollout_id="0-0"):
                pass
    rollout = captured.one(c.KIND_ROLLOUT)
    assert rollout.parent is not None and rollout.parent.span_id == run.span.get_span_context().span_id
    assert rollout.context.trace_id == run.span.get_span_context().trace_id
    assert _links(rollout) == [
        (batch.get_span_context().trace_id, batch.get_span_context().span_id, c.RELATION_CALLER)
    ]
