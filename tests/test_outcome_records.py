"""Outcome records; private where the failure classifier and the step range are reached directly.

Outcomes decided outside the rollout span: in another process, in a later phase, in an attempt
continued elsewhere. Each becomes a ``gym.outcome`` record in the rollout's trace."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import textwrap
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace

import gymtrace
from child_process import run_python
from gymtrace import attributes as c
from gymtrace import propagation
from gymtrace._model.spandata import read_otlp_json_lines
from gymtrace.testing import CapturedSpans, capture_spans, check_trace


def _hex_trace(span: Any) -> str:
    return trace.format_trace_id(span.get_span_context().trace_id)


def _handoff() -> dict[str, str]:
    """Headers for work that continues the episode in another process: a hand-off, asked for."""
    return dict(propagation.inject({}, destination=propagation.GYM_INTERNAL, continuation=True))


def _one_record(captured: CapturedSpans) -> Any:
    (record,) = captured.by_kind(c.KIND_OUTCOME)
    assert record.name == c.SPAN_OUTCOME
    return record


def test_reward_under_attach_is_the_rollouts_outcome_record(captured: CapturedSpans) -> None:
    with gymtrace.rollout(rollout_id="r-remote", task_id="t") as rollout, gymtrace.episode():
        headers = _handoff()
    # What a worker process does with the headers: continue the episode and score it.
    with propagation.attach(headers):
        assert gymtrace.current().attempt == 0
        with gymtrace.verify():
            gymtrace.record_reward(1.0)
    record = _one_record(captured)
    assert record.attributes[c.ROLLOUT_OUTCOME] == c.OUTCOME_SCORED
    assert record.attributes[c.REWARD] == 1.0
    assert record.attributes[c.EPISODE_ATTEMPT] == 0
    assert record.attributes[c.ROLLOUT_ID] == "r-remote"
    assert record.attributes[c.OUTCOME_SOURCE] == c.SOURCE_REMOTE
    assert _hex_trace(record) == rollout.trace_id
    # The rollout root ended before the worker scored it: pending there (it handed the episode
    # over), concluded by the record.
    assert captured.one(c.KIND_ROLLOUT).attributes[c.ROLLOUT_OUTCOME] == c.OUTCOME_PENDING
    verify = captured.one(c.KIND_VERIFY)
    assert verify.attributes[c.REWARD] == 1.0
    assert check_trace(captured) == []


def test_failure_under_attach_records_an_unscored_outcome(captured: CapturedSpans) -> None:
    with gymtrace.rollout(rollout_id="r-fail"), gymtrace.episode():
        headers = _handoff()
    with propagation.attach(headers):
        gymtrace.record_failure("infrastructure", message="sandbox lost")
    record = _one_record(captured)
    assert record.attributes[c.ROLLOUT_OUTCOME] == c.OUTCOME_UNSCORED
    assert c.REWARD not in record.attributes
    assert record.attributes[c.FAILURE_KIND] == c.FAILURE_INFRASTRUCTURE
    assert record.attributes[c.FAILURE_RETRYABLE] is True


def test_reward_after_the_rollout_ended_is_a_late_record(captured: CapturedSpans) -> None:
    with gymtrace.rollout(rollout_id="r-late") as rollout:
        with gymtrace.episode():
            pass  # the solver; the scorer runs later
    gymtrace.record_reward(0.5, scope=rollout)
    record = _one_record(captured)
    assert record.attributes[c.OUTCOME_SOURCE] == c.SOURCE_LATE
    assert record.attributes[c.REWARD] == 0.5
    assert record.parent is not None
    assert record.parent.span_id == rollout.span.get_span_context().span_id
    relations = [link.attributes[c.LINK_RELATION] for link in record.links]
    assert relations == [c.RELATION_OUTCOME]
    assert check_trace(captured) == []


def test_late_reward_through_a_scope_carrier(captured: CapturedSpans) -> None:
    with gymtrace.rollout(rollout_id="r-carried"), gymtrace.episode() as episode:
        carrier = json.loads(json.dumps(episode.carrier()))  # it travels as JSON
    with propagation.attach(carrier), gymtrace.verify():
        gymtrace.record_reward(1.0)
    record = _one_record(captured)
    assert record.attributes[c.EPISODE_ATTEMPT] == 0
    assert record.attributes[c.ROLLOUT_OUTCOME] == c.OUTCOME_SCORED


def test_late_reward_for_a_failed_episode_is_refused_loudly(
    captured: CapturedSpans, caplog: pytest.LogCaptureFixture
) -> None:
    with gymtrace.rollout(rollout_id="r-failed"), gymtrace.episode() as episode:
        gymtrace.record_failure("terminal")
    with pytest.raises(gymtrace.GymTraceError, match="never scored"):
        episode.record_reward(1.0)
    assert captured.by_kind(c.KIND_OUTCOME) == []


def test_attempt_continued_elsewhere_records_the_final_outcome(captured: CapturedSpans) -> None:
    with gymtrace.rollout(rollout_id="r-cont") as rollout:
        with gymtrace.episode():
            gymtrace.record_failure("infrastructure")
        carrier = rollout.carrier()
    # Another process, later: the next attempt, scored.
    with gymtrace.episode(continue_from=carrier), gymtrace.verify():
        gymtrace.record_reward(0.75)
    record = _one_record(captured)
    assert record.attributes[c.OUTCOME_SOURCE] == c.SOURCE_CONTINUED
    assert record.attributes[c.EPISODE_ATTEMPT] == 1
    assert record.attributes[c.ROLLOUT_ATTEMPTS] == 2
    assert record.attributes[c.REWARD] == 0.75
    assert _hex_trace(record) == rollout.trace_id
    assert check_trace(captured) == []


def test_steps_continued_elsewhere_take_the_reserved_numbers(captured: CapturedSpans) -> None:
    with gymtrace.rollout(rollout_id="r-steps"), gymtrace.episode():
        with gymtrace.step():
            pass  # step 1, here
        handoffs = [_handoff() for _ in range(2)]  # steps 2 and 3 run elsewhere
        with gymtrace.step():
            pass  # step 4, here
    for headers in handoffs:
        with propagation.attach(headers), gymtrace.step():
            pass
    numbers = sorted(s.attributes[c.STEP_NUMBER] for s in captured.by_kind(c.KIND_STEP))
    assert numbers == [1, 2, 3, 4]


def test_dropped_rewards_are_logged_every_time(caplog: pytest.LogCaptureFixture) -> None:
    with capture_spans(strict=False), caplog.at_level(logging.WARNING, logger="gymtrace"):
        gymtrace.record_reward(1.0)
        gymtrace.record_reward(2.0)
    dropped = [r for r in caplog.records if "record_reward" in r.getMessage()]
    assert len(dropped) == 2
    assert "Fix:" in dropped[0].getMessage()


def test_reward_recorded_in_another_process_is_the_outcome(tmp_path: Path) -> None:
    traces = tmp_path / "traces.jsonl"
    worker = tmp_path / "worker.py"
    worker.write_text(
        textwrap.dedent("""
        import json, os, sys
        import gymtrace
        gymtrace.configure(service_name="scorer", file=sys.argv[1])
        with gymtrace.propagation.attach(json.loads(sys.argv[2])):
            with gymtrace.step():
                pass
            with gymtrace.verify():
                gymtrace.record_reward(1.0)
        gymtrace.shutdown()
    """)
    )
    driver = """
        import json, subprocess, sys
        import gymtrace
        gymtrace.configure(service_name="driver", file=sys.argv[1])
        with gymtrace.rollout(rollout_id="r-proc", task_id="t"), gymtrace.episode():
            handoff = dict(destination=gymtrace.propagation.GYM_INTERNAL, continuation=True)
            headers = dict(gymtrace.propagation.inject({}, **handoff))
            subprocess.run([sys.executable, sys.argv[2], sys.argv[1], json.dumps(headers)], check=True)
            with gymtrace.step():
                pass
        gymtrace.shutdown()
    """
    done = run_python(str(traces), str(worker), code=driver)
    assert done.returncode == 0, done.stderr
    spans = read_otlp_json_lines(traces)
    (record,) = [s for s in spans if s.attributes.get(c.KIND) == c.KIND_OUTCOME]
    (root,) = [s for s in spans if s.attributes.get(c.KIND) == c.KIND_ROLLOUT]
    assert record.service == "scorer"
    assert record.trace_id == root.trace_id
    assert record.attributes[c.REWARD] == 1.0
    steps = {s.service: s.attributes[c.STEP_NUMBER] for s in spans if s.attributes.get(c.KIND) == c.KIND_STEP}
    assert steps == {"scorer": 1, "driver": 2}
    assert gymtrace.testing.check_trace(spans) == []


# -- bugs found in review ------------------------------------------------------------------------------


def test_verify_whose_reward_from_raises_still_ends_and_blames_the_callable() -> None:
    @gymtrace.verify(reward_from=lambda result: result["missing"])
    def score() -> dict[str, float]:
        return {"reward": 1.0}

    with capture_spans(strict=False) as captured:
        assert score() == {"reward": 1.0}
    verify = captured.one(c.KIND_VERIFY)
    assert verify.status.status_code == trace.StatusCode.ERROR
    assert verify.attributes[c.ERROR_TYPE] == "KeyError"
    assert c.REWARD not in verify.attributes
    with capture_spans(strict=True) as captured, pytest.raises(gymtrace.GymTraceError, match="reward_from"):
        score()
    assert len(captured.by_kind(c.KIND_VERIFY)) == 1  # ended even though strict mode raised


def test_exit_in_another_task_ends_the_span_without_raising_into_user_code() -> None:
    async def main() -> None:
        stack = contextlib.AsyncExitStack()
        await asyncio.create_task(stack.enter_async_context(gymtrace.step()))  # entered in a task
        await stack.aclose()  # exited here, in another context

    with capture_spans(strict=False) as captured:
        asyncio.run(main())
    assert len(captured.by_kind(c.KIND_STEP)) == 1


class EnvLost(ConnectionError):
    pass


def test_error_type_is_fully_qualified_however_the_failure_is_recorded(captured: CapturedSpans) -> None:
    with gymtrace.rollout(rollout_id="r-err"):
        with gymtrace.episode():
            gymtrace.record_failure("infrastructure", exception=EnvLost("gone"))
        with contextlib.suppress(EnvLost), gymtrace.episode():
            raise EnvLost("gone again")
    first, second = captured.by_kind(c.KIND_EPISODE)
    assert first.attributes[c.ERROR_TYPE] == second.attributes[c.ERROR_TYPE] == f"{__name__}.EnvLost"


def test_attempts_do_not_retry_a_bug_in_harness_code(captured: CapturedSpans) -> None:
    with gymtrace.rollout(rollout_id="r-bug"), pytest.raises(KeyError):
        for attempt in gymtrace.attempts(max_attempts=3):
            with attempt:
                {}["missing"]
    (episode,) = captured.by_kind(c.KIND_EPISODE)
    assert episode.attributes[c.FAILURE_KIND] == c.FAILURE_ERROR
    assert episode.attributes[c.FAILURE_RETRYABLE] is False
    assert captured.one(c.KIND_ROLLOUT).attributes[c.ROLLOUT_OUTCOME] == c.OUTCOME_UNSCORED


@pytest.mark.parametrize(
    ("error", "kind"),
    [(ConnectionResetError("reset"), c.FAILURE_INFRASTRUCTURE), (TimeoutError("slow"), c.FAILURE_TIMEOUT)],
)
def test_attempts_retry_infrastructure_by_default(
    captured: CapturedSpans, error: Exception, kind: str
) -> None:
    with gymtrace.rollout(rollout_id="r-infra"):
        for attempt in gymtrace.attempts(max_attempts=2):
            with attempt:
                if attempt.number == 0:
                    raise error
                gymtrace.record_reward(1.0)
    first, second = captured.by_kind(c.KIND_EPISODE)
    assert first.attributes[c.FAILURE_KIND] == kind
    assert first.attributes[c.FAILURE_RETRYABLE] is True
    assert second.attributes[c.REWARD] == 1.0


def test_attempts_retry_http_5xx_of_httpx() -> None:
    import httpx

    request = httpx.Request("POST", "http://127.0.0.1/v1/chat")
    overloaded = httpx.HTTPStatusError("503", request=request, response=httpx.Response(503, request=request))
    not_found = httpx.HTTPStatusError("404", request=request, response=httpx.Response(404, request=request))
    from gymtrace._model.failures import classify

    assert classify(overloaded) == (c.FAILURE_INFRASTRUCTURE, True)
    assert classify(not_found) == (c.FAILURE_ERROR, False)
    assert classify(httpx.ConnectTimeout("slow")) == (c.FAILURE_TIMEOUT, True)


def _steps(count: int) -> None:
    for _ in range(count):
        with gymtrace.step():
            pass


def test_step_numbers_stay_unique_when_continuations_record_several_steps(captured: CapturedSpans) -> None:
    # Issue 25: one episode spread over many tasks, each recording several steps, numbered 279
    # steps with 35 distinct numbers. Hand-offs at the episode level, and from a continuation
    # handing on (a task calling a task). (All in this one process here, so check_trace, which
    # compares the order of numbers per process, does not apply.)
    with gymtrace.rollout(rollout_id="r-many"), gymtrace.episode():
        with gymtrace.step():
            pass
        handoffs = [_handoff() for _ in range(12)]
        with gymtrace.step():
            pass
    for headers in handoffs:
        with propagation.attach(headers):
            _steps(3)
            nested = _handoff()
        with propagation.attach(nested):
            _steps(2)
    numbers = [s.attributes[c.STEP_NUMBER] for s in captured.by_kind(c.KIND_STEP)]
    assert len(numbers) == 2 + 12 * 5
    assert len(set(numbers)) == len(numbers), sorted(numbers)
    # The caller's own steps keep small numbers: 1, then 14 after the 12 reserved ones.
    assert numbers[:2] == [1, 14]


def test_step_numbers_stay_unique_past_ten_thousand_steps_in_each_part() -> None:
    # Each part of the episode (the caller and two continuations) records 12,000 steps: more than
    # the 10,000 a part had before, so the caller's own numbers used to run into continuation 1's.
    with capture_spans(strict=True) as captured:
        with gymtrace.rollout(rollout_id="r-long"), gymtrace.episode():
            handoffs = [_handoff() for _ in range(2)]
            _steps(12_000)
        for headers in handoffs:
            with propagation.attach(headers):
                _steps(12_000)
    numbers = [s.attributes[c.STEP_NUMBER] for s in captured.by_kind(c.KIND_STEP)]
    assert len(numbers) == len(set(numbers)) == 36_000
    assert max(numbers) < 1 << 63


def test_step_numbers_stay_unique_through_a_task_calling_a_task_calling_a_task() -> None:
    # Three hand-offs deep (the driver's episode, a task, a task it calls, one that calls): every
    # level's reserved number survives the trip (the deepest is beyond the 10 digits an attempt
    # number may have), and the numbers stay unique and within OTLP's int64.
    with capture_spans(strict=True) as captured:
        with gymtrace.rollout(rollout_id="r-deep"), gymtrace.episode():
            with gymtrace.step():
                pass
            level = _handoff()
        for _ in range(2):
            with propagation.attach(level):
                _steps(3)
                level = _handoff()
    numbers = [s.attributes[c.STEP_NUMBER] for s in captured.by_kind(c.KIND_STEP)]
    assert len(numbers) == len(set(numbers)) == 7
    assert max(numbers) > 10**10  # the second level's range, reached through a 13-digit base
    assert max(numbers) < 1 << 63


def test_a_part_that_outgrows_its_step_range_is_reported(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The range is a million steps; a smaller one here shows what happens past it without a
    # million spans. The caller handed off step 2, so its own step 100 could be continuation 1's.
    from gymtrace._scopes import active_scope as _frame

    monkeypatch.setattr(_frame, "STEP_RANGE", 100)
    with capture_spans(strict=False), caplog.at_level(logging.WARNING, logger="gymtrace"):
        with gymtrace.rollout(rollout_id="r-range"), gymtrace.episode():
            with gymtrace.step():
                pass
            _handoff()
            _steps(99)
    warnings = [r.getMessage() for r in caplog.records if "may repeat" in r.getMessage()]
    assert len(warnings) == 1, warnings  # once per part, not once per step
    assert "r-range" in warnings[0] and "step 100" in warnings[0]
    with capture_spans(strict=True), pytest.raises(gymtrace.GymTraceError, match="may repeat"):
        with gymtrace.rollout(rollout_id="r-range-strict"), gymtrace.episode():
            _handoff()
            _steps(100)


def test_hand_offs_nested_past_int64_say_their_numbers_may_repeat(caplog: pytest.LogCaptureFixture) -> None:
    with capture_spans(strict=False), caplog.at_level(logging.WARNING, logger="gymtrace"):
        with gymtrace.rollout(rollout_id="r-deeper"), gymtrace.episode():
            level = _handoff()
        for _ in range(4):
            with propagation.attach(level):
                with gymtrace.step():
                    pass
                with gymtrace.step():
                    pass
                level = _handoff()
    assert any("no range of step numbers left" in r.getMessage() for r in caplog.records)
