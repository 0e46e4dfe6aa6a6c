"""Rollout semantics: attempts, retries, restores, rewards, unscored outcomes, carriers, sampling."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from opentelemetry.trace import NoOpTracerProvider, StatusCode

import gymtrace
from gymtrace import attributes as c
from gymtrace.testing import CapturedSpans, capture_spans, check_trace
from tree_asserts import assert_child


class EnvDown(ConnectionError):
    pass


def _episodes(captured: CapturedSpans) -> list[Any]:
    return sorted(captured.by_kind("episode"), key=lambda s: s.attributes[c.EPISODE_ATTEMPT])


def test_two_failed_attempts_then_success_reads_correctly_as_data(captured: CapturedSpans) -> None:
    outcomes = iter([EnvDown("lost"), EnvDown("lost again"), None])
    with gymtrace.run(run_id="run-1"), gymtrace.rollout(rollout_id="r-1", task_id="t-1", repeat=0):
        for attempt in gymtrace.attempts(3, retry_on=EnvDown):
            with attempt:
                failure = next(outcomes)
                if failure is not None:
                    raise failure
                with gymtrace.verify():
                    gymtrace.record_reward(0.75)
    first, second, third = _episodes(captured)
    rollout = captured.one("rollout")
    assert [e.attributes[c.EPISODE_ATTEMPT] for e in (first, second, third)] == [0, 1, 2]
    assert [e.attributes[c.EPISODE_ID] for e in (first, second, third)] == ["r-1", "r-1-a1", "r-1-a2"]
    assert [e.attributes[c.EPISODE_OUTCOME] for e in (first, second, third)] == [
        "failed",
        "failed",
        "completed",
    ]
    for failed in (first, second):
        assert failed.attributes[c.FAILURE_KIND] == "infrastructure"
        assert failed.attributes[c.FAILURE_RETRYABLE] is True
        assert c.REWARD not in failed.attributes
        assert failed.status.status_code == StatusCode.ERROR
    assert third.attributes[c.REWARD] == 0.75
    assert [(e.name, dict(e.attributes)) for e in third.events] == [
        (
            c.GEN_AI_EVALUATION_RESULT,
            {c.GEN_AI_EVALUATION_NAME: "reward", c.GEN_AI_EVALUATION_SCORE_VALUE: 0.75},
        )
    ]
    # Each retry links to the attempt before it.
    assert first.links == ()
    assert [(link.context.span_id, link.attributes[c.LINK_RELATION]) for link in second.links] == [
        (first.get_span_context().span_id, "retry")
    ]
    assert [link.context.span_id for link in third.links] == [second.get_span_context().span_id]
    for episode in (first, second, third):
        assert_child(episode, rollout)
    assert rollout.attributes[c.ROLLOUT_OUTCOME] == "scored"
    assert rollout.attributes[c.REWARD] == 0.75
    assert rollout.attributes[c.ROLLOUT_ATTEMPTS] == 3
    assert captured.one("verify").attributes[c.REWARD] == 0.75
    assert check_trace(captured) == []


def test_exhausted_attempts_leave_the_rollout_unscored_without_a_reward(captured: CapturedSpans) -> None:
    with gymtrace.rollout(rollout_id="r-2"):
        loop = gymtrace.attempts(2, retry_on=EnvDown, reraise=False)
        for attempt in loop:
            with attempt:
                raise EnvDown("down")
    assert loop.succeeded is False
    assert loop.attempts_made == 2
    rollout = captured.one("rollout")
    assert rollout.attributes[c.ROLLOUT_OUTCOME] == "unscored"
    assert c.REWARD not in rollout.attributes  # never an invented 0
    assert rollout.attributes[c.ROLLOUT_ATTEMPTS] == 2
    assert check_trace(captured) == []


def test_exhausted_attempts_reraise_the_last_error_by_default(captured: CapturedSpans) -> None:
    errors = [EnvDown("first"), EnvDown("second")]
    with pytest.raises(EnvDown, match="second"), gymtrace.rollout(rollout_id="r-3"):
        for attempt in gymtrace.attempts(2, retry_on=EnvDown):
            with attempt:
                raise errors[attempt.index]
    assert captured.one("rollout").attributes[c.ROLLOUT_OUTCOME] == "unscored"


def test_non_retryable_exception_stops_the_loop_at_once(captured: CapturedSpans) -> None:
    with pytest.raises(ValueError, match="bug"), gymtrace.rollout(rollout_id="r-4"):
        for attempt in gymtrace.attempts(3, retry_on=EnvDown):
            with attempt:
                raise ValueError("bug in the agent")
    (episode,) = _episodes(captured)
    assert episode.attributes[c.FAILURE_KIND] == "error"
    assert episode.attributes[c.FAILURE_RETRYABLE] is False


def test_earlier_reward_does_not_survive_a_later_failed_final_attempt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with capture_spans(strict=False) as captured, caplog.at_level(logging.WARNING, "gymtrace"):
        with gymtrace.rollout(rollout_id="r-5"):
            with gymtrace.episode():
                gymtrace.record_reward(1.0)
                gymtrace.record_failure("infrastructure", message="lost after verify")
            with gymtrace.episode():
                gymtrace.record_failure("terminal")
    # The discarded reward is said once, when the rollout is written.
    (warning,) = [r.getMessage() for r in caplog.records if "r-5" in r.getMessage()]
    assert "reward 1 of attempt 0 was recorded before the attempt failed" in warning
    first, second = _episodes(captured)
    assert c.REWARD not in first.attributes  # failed episodes are never scored
    assert second.attributes[c.FAILURE_RETRYABLE] is False
    assert first.attributes[c.FAILURE_RETRYABLE] is True
    rollout = captured.one("rollout")
    assert rollout.attributes[c.ROLLOUT_OUTCOME] == "unscored"
    assert c.REWARD not in rollout.attributes


def test_checkpoint_restore_is_marked_and_links_to_the_episode_it_continues(captured: CapturedSpans) -> None:
    with gymtrace.rollout(rollout_id="r-6"):
        with gymtrace.episode() as first:
            first.record_failure("timeout")
        with gymtrace.episode(restored_from=first):
            gymtrace.record_failure("timeout")
        with gymtrace.episode(restored_from=True):  # True: the previous episode of this rollout
            pass
    a0, a1, a2 = _episodes(captured)
    assert c.EPISODE_RESTORED not in a0.attributes
    assert a1.attributes[c.EPISODE_RESTORED] is True
    assert a1.attributes[c.EPISODE_ATTEMPT] == 1  # a restore increments the attempt
    assert [(link.context.span_id, link.attributes[c.LINK_RELATION]) for link in a1.links] == [
        (a0.get_span_context().span_id, "restore")
    ]
    assert [link.context.span_id for link in a2.links] == [a1.get_span_context().span_id]


def test_attempts_with_restore_open_restored_episodes(captured: CapturedSpans) -> None:
    with gymtrace.rollout(rollout_id="r-7"):
        for attempt in gymtrace.attempts(3, restore=True):
            with attempt:
                if attempt.index == 0:
                    attempt.fail("timeout")
    a0, a1 = _episodes(captured)
    assert a0.attributes[c.FAILURE_KIND] == "timeout"
    assert a1.attributes[c.EPISODE_RESTORED] is True
    assert a1.links[0].attributes[c.LINK_RELATION] == "restore"
    assert check_trace(captured) == []


def test_retry_loop_behaves_the_same_with_tracing_off(use_provider: Any) -> None:
    # No capture and no provider: the loop must still retry on attempt.fail() and exceptions.
    # Tracing is off for the loop even where an earlier test in this worker left a global provider
    # (test_settings.py's configure() calls do): traced, this loop outside any rollout opens three
    # episodes numbered attempt 0, which is not what this test is about, and it failed whenever
    # pytest-xdist's --dist loadfile put test_settings.py before this file on one worker.
    # Production policy (not strict), as before.
    seen = []
    with use_provider(NoOpTracerProvider()), gymtrace.testing.strict(False):
        loop = gymtrace.attempts(3)
        for attempt in loop:
            with attempt:
                seen.append(attempt.number)
                if attempt.index == 0:
                    attempt.fail("infrastructure")
                elif attempt.index == 1:
                    raise OSError("flaky")
    assert seen == [0, 1, 2]
    assert loop.succeeded


def test_repeats_are_separate_rollouts_not_attempts(captured: CapturedSpans) -> None:
    for repeat in range(3):
        with gymtrace.rollout(rollout_id=f"t-1/r{repeat}", task_id="t-1", repeat=repeat), gymtrace.episode():
            gymtrace.record_reward(float(repeat))
    rollouts = captured.by_kind("rollout")
    assert sorted(r.attributes[c.ROLLOUT_REPEAT] for r in rollouts) == [0, 1, 2]
    assert len({r.get_span_context().trace_id for r in rollouts}) == 3
    assert {e.attributes[c.EPISODE_ATTEMPT] for e in captured.by_kind("episode")} == {0}


def test_verify_reward_from_return_value(captured: CapturedSpans) -> None:
    @gymtrace.verify(reward_from="score")
    def verify(answer: str) -> dict[str, Any]:
        return {"score": 0.5 if answer else 0.0, "details": "..."}

    with gymtrace.rollout(rollout_id="r-8"), gymtrace.episode():
        assert verify("x") == {"score": 0.5, "details": "..."}
    assert captured.one("verify").attributes[c.REWARD] == 0.5
    assert captured.one("episode").attributes[c.REWARD] == 0.5
    assert captured.one("rollout").attributes[c.REWARD] == 0.5


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "1.0", None, True])
def test_invalid_reward_is_a_clear_error_in_strict_mode(captured: CapturedSpans, bad: Any) -> None:
    with gymtrace.episode(), pytest.raises(gymtrace.InvalidArgumentError, match="argument 'value'"):
        gymtrace.record_reward(bad)


def test_cancelled_rollout_work_is_unscored(captured: CapturedSpans) -> None:
    with pytest.raises(KeyboardInterrupt), gymtrace.rollout(rollout_id="r-9"), gymtrace.episode():
        raise KeyboardInterrupt
    assert captured.one("episode").attributes[c.EPISODE_OUTCOME] == "cancelled"
    assert captured.one("rollout").attributes[c.ROLLOUT_OUTCOME] == "unscored"


def test_carrier_continues_the_rollout_in_another_process_hours_later(captured: CapturedSpans) -> None:
    with gymtrace.run(run_id="run-1"), gymtrace.rollout(rollout_id="r-10", task_id="t", repeat=1):
        with gymtrace.episode() as first:
            first.record_failure("infrastructure")
            carrier = json.loads(json.dumps(first.carrier()))  # JSON-safe: stored, queued, sent
    # ... later, elsewhere: no enclosing rollout, only the carrier.
    with gymtrace.episode(continue_from=carrier), gymtrace.step():
        gymtrace.record_reward(1.0)
    rollout = captured.one("rollout")
    a0, a1 = _episodes(captured)
    assert a1.attributes[c.EPISODE_ATTEMPT] == 1
    assert a1.attributes[c.EPISODE_ID] == "r-10-a1"
    for key, value in ((c.ROLLOUT_ID, "r-10"), (c.TASK_ID, "t"), (c.RUN_ID, "run-1"), (c.ROLLOUT_REPEAT, 1)):
        assert a1.attributes[key] == value
        assert captured.one("step").attributes[key] == value
    assert_child(a1, rollout)  # in the rollout's trace, under the rollout span
    assert [(link.context.span_id, link.attributes[c.LINK_RELATION]) for link in a1.links] == [
        (a0.get_span_context().span_id, "retry")
    ]
    assert check_trace(captured) == []


def test_carrier_restore_from_another_process_is_marked_restored(captured: CapturedSpans) -> None:
    with gymtrace.rollout(rollout_id="r-11"), gymtrace.episode() as first:
        first.record_failure("timeout")
        carrier = first.carrier()
    with gymtrace.episode(restored_from=carrier):
        pass
    _, restored = _episodes(captured)
    assert restored.attributes[c.EPISODE_RESTORED] is True
    assert restored.links[0].attributes[c.LINK_RELATION] == "restore"


@pytest.mark.parametrize(
    "carrier",
    [{"format": "something-else"}, {"format": "gymtrace.carrier/1", "next_attempt": -1}, "not a mapping"],
)
def test_malformed_carrier_is_a_clear_error_in_strict_mode(captured: CapturedSpans, carrier: Any) -> None:
    with (
        pytest.raises(gymtrace.GymTraceError, match=r"gymtrace\.episode\(\)"),
        gymtrace.episode(continue_from=carrier),
    ):
        pass


def test_rollout_sampler_keeps_or_drops_whole_rollouts_by_task(use_provider: Any) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from gymtrace.sampling import RolloutSampler, keep_rollout

    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=RolloutSampler(0.5, by="task"))
    provider.add_span_processor(gymtrace.IdentitySpanProcessor())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with use_provider(provider):
        with gymtrace.run(run_id="run-s"):
            for task in range(20):
                for repeat in range(2):
                    with gymtrace.rollout(rollout_id=f"t{task}/r{repeat}", task_id=f"t{task}", repeat=repeat):
                        for attempt in gymtrace.attempts(2):
                            with attempt, gymtrace.step():
                                if attempt.index == 0:
                                    attempt.fail()
    spans = exporter.get_finished_spans()
    # A dropped rollout leaves only its summary (gym.rollout.detail=false): no episode, no step.
    summaries = [s for s in spans if s.attributes.get(c.ROLLOUT_DETAIL) is False]
    kept_tasks = {s.attributes[c.TASK_ID] for s in spans if c.TASK_ID in s.attributes} - {
        s.attributes[c.TASK_ID] for s in summaries
    }
    assert kept_tasks == {f"t{t}" for t in range(20) if keep_rollout(f"t{t}", 0.5)}
    assert 0 < len(kept_tasks) < 20
    assert sorted(s.attributes[c.ROLLOUT_ID] for s in summaries) == sorted(
        f"t{t}/r{r}" for t in range(20) for r in range(2) if f"t{t}" not in kept_tasks
    )
    assert all(s.attributes[c.ROLLOUT_ATTEMPTS] == 2 for s in summaries)
    for task in kept_tasks:  # whole groups: both repeats, both attempts, every level
        # A rollout still open at the heartbeat thread's next mark (a stall on a busy machine) also
        # has live markers: kept or dropped with it, so they count only as its task's.
        kinds = [
            s.attributes[c.KIND]
            for s in spans
            if s.attributes.get(c.TASK_ID) == task and s.attributes[c.KIND] != c.KIND_LIVE
        ]
        assert sorted(kinds) == sorted(["rollout", "episode", "episode", "step", "step"] * 2)
    assert len([s for s in spans if s.attributes[c.KIND] == "run"]) == 1  # runs are always kept


def test_sampling_decision_is_stable_across_processes() -> None:
    import subprocess
    import sys

    from gymtrace.sampling import keep_rollout

    code = (
        "from gymtrace.sampling import keep_rollout; print([keep_rollout(f'r{i}', 0.3) for i in range(50)])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == str([keep_rollout(f"r{i}", 0.3) for i in range(50)])
