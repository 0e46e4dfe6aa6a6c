"""The time split (``_read.timesplit``, private) at exact figures, on traces built at chosen times.

An episode's wall time cut into model, tool, env, verify and other, as unions of
intervals with model > tool > env > verify taking overlapped time, clipped to the episode, summing
to its duration in integer nanoseconds. Figures are exact: the traces are built at chosen times."""

from __future__ import annotations

import json
import random
from pathlib import Path

import gymnasium
import pytest

import gymtrace
from built_runs import BuiltRun
from gymtrace import _constants as c
from gymtrace._cli import main
from gymtrace._read.timesplit import (
    ENV,
    MODEL,
    OTHER,
    TOOL,
    VERIFY,
    EpisodeTimes,
    TimeSplit,
    episode_split,
    episodes_by_rollout,
    percentile,
    rollout_split,
    run_times,
    segments,
)
from gymtrace.integrations.gymnasium import TraceEnv
from gymtrace.testing import CapturedSpans

US = 1_000  # ns


def _split_of(run: BuiltRun) -> tuple[TimeSplit, int]:
    """The split of the run's one episode, and its duration in ns."""
    times = EpisodeTimes().add_spans(run.spans)
    (episode,) = [s for s in run.spans if s.attributes.get(c.KIND) == c.KIND_EPISODE]
    return times.split(episode), episode.end_ns - episode.start_ns


def test_concurrent_model_calls_count_once_as_their_union() -> None:
    run = BuiltRun("r")
    episode = run.rollout("a").episode(0, 10_000)
    for k in range(8):  # eight calls of 2 ms each (16 ms in all), staggered by 0.25 ms: 2..5.75 ms
        episode.child(c.KIND_MODEL_CALL, 2_000 + k * 250, 4_000 + k * 250)
    split, duration = _split_of(run)
    assert split == TimeSplit(model=3_750 * US, other=6_250 * US)
    assert split.total == duration


def test_overlapping_parts_go_to_the_first_of_model_tool_env_verify() -> None:
    run = BuiltRun("r")
    episode = run.rollout("a").episode(0, 10_000)
    episode.child(c.KIND_SEED_SESSION, 0, 2_000)
    episode.child(c.KIND_TOOL_CALL, 1_000, 4_000)  # 1..2 overlaps env: tool's
    episode.child(c.KIND_MODEL_CALL, 3_000, 5_000)  # 3..4 overlaps tool: model's
    episode.child(c.KIND_VERIFY, 4_500, 7_000)  # 4.5..5 under model: model's
    split, duration = _split_of(run)
    assert split == TimeSplit(
        model=2_000 * US, tool=2_000 * US, env=1_000 * US, verify=2_000 * US, other=3_000 * US
    )
    assert split.total == duration


def test_gaps_between_parts_are_other() -> None:
    run = BuiltRun("r")
    episode = run.rollout("a").episode(1_000, 9_000)
    episode.child(c.KIND_MODEL_CALL, 2_000, 3_000)
    episode.child(c.KIND_TOOL_CALL, 5_000, 6_500)
    split, duration = _split_of(run)
    assert split == TimeSplit(model=1_000 * US, tool=1_500 * US, other=5_500 * US)
    assert split.total == duration == 8_000 * US


def test_a_model_call_nested_in_a_tool_call_is_model_time_counted_once() -> None:
    # A subagent spawned by a tool call: its model calls run inside the tool's span.
    run = BuiltRun("r")
    episode = run.rollout("a").episode(0, 10_000)
    episode.child(c.KIND_TOOL_CALL, 1_000, 9_000)
    episode.child(c.KIND_AGENT_INVOCATION, 1_500, 8_500)
    episode.child(c.KIND_MODEL_CALL, 2_000, 4_000)
    episode.child(c.KIND_TOOL_CALL, 4_000, 5_000)  # the subagent's own tool, inside the outer one
    episode.child(c.KIND_MODEL_CALL, 5_000, 6_000)
    split, duration = _split_of(run)
    assert split == TimeSplit(model=3_000 * US, tool=5_000 * US, other=2_000 * US)
    assert split.total == duration


def test_an_agent_step_with_no_model_call_counts_its_tool_and_leaves_the_rest_other() -> None:
    run = BuiltRun("r")
    episode = run.rollout("a").episode(0, 6_000)
    episode.child(c.KIND_STEP, 1_000, 5_000)  # an agent's step: no part of its own
    episode.child(c.KIND_TOOL_CALL, 2_000, 3_000)
    split, duration = _split_of(run)
    assert split == TimeSplit(tool=1_000 * US, other=5_000 * US)
    assert split.total == duration


def test_spans_of_other_processes_are_clipped_to_the_episode() -> None:
    # Another process's clock runs 1.5 ms ahead: its spans stick out of the episode.
    run = BuiltRun("r")
    episode = run.rollout("a").episode(1_000, 5_000)
    episode.child(c.KIND_MODEL_CALL, 0, 2_000, service="model-server")
    episode.child(None, 4_000, 7_000, operation=c.OPERATION_EXECUTE_TOOL, service="env-server")
    episode.child(c.KIND_VERIFY, 6_000, 8_000, service="scorer")  # wholly after: nothing
    split, duration = _split_of(run)
    assert split == TimeSplit(model=1_000 * US, tool=1_000 * US, other=2_000 * US)
    assert split.total == duration


def test_another_librarys_inference_span_counts_as_model_by_its_operation_name() -> None:
    run = BuiltRun("r")
    episode = run.rollout("a").episode(0, 4_000)
    episode.child(None, 0, 1_000, operation=c.OPERATION_CHAT)
    episode.child(None, 1_000, 2_000, operation=c.OPERATION_TEXT_COMPLETION)
    episode.child(None, 2_000, 3_000, operation=c.OPERATION_INVOKE_AGENT)  # no part
    split, _ = _split_of(run)
    assert split == TimeSplit(model=2_000 * US, other=2_000 * US)


def test_the_parts_sum_to_the_duration_to_the_nanosecond_on_odd_times() -> None:
    start, end = 1_733_000_000_123_456_789, 1_733_000_003_987_654_321
    intervals = [
        (MODEL, start + 17, start + 1_000_003),
        (MODEL, start + 999_999, start + 2_500_001),
        (TOOL, start - 5, start + 13),
        (ENV, end - 7, end + 11),
        (VERIFY, start + 2_000_000, end - 3),
    ]
    split = episode_split(start, end, intervals)
    assert split.total == end - start
    assert abs(sum(split.seconds().values()) - (end - start) / 1e9) < 1e-6
    assert split.model == 2_500_001 - 17
    assert split.tool == 13


def test_segments_give_each_instant_to_one_part_in_order() -> None:
    cut = segments(0, 10, [(TOOL, 2, 8), (MODEL, 3, 5), (MODEL, 5, 6)])
    assert cut == [(OTHER, 0, 2), (TOOL, 2, 3), (MODEL, 3, 6), (TOOL, 6, 8), (OTHER, 8, 10)]


def test_calls_in_sequence_split_as_the_sweep_splits_them_whatever_their_order_and_overlap() -> None:
    # episode_split takes a shortcut when no two intervals overlap: it must give what the sweep
    # (segments) gives, on episodes with and without overlaps, gaps, touching ends and clipping.
    rng = random.Random(7)
    for _ in range(5000):
        start, end = rng.randint(0, 50), rng.randint(51, 110)
        intervals = []
        for _ in range(rng.randint(0, 7)):
            at = rng.randint(-10, 115)
            intervals.append((rng.choice((MODEL, TOOL, ENV, VERIFY)), at, at + rng.randint(-2, 20)))
        swept = [0, 0, 0, 0, 0]
        for part, s, e in segments(start, end, intervals):
            swept[part] += e - s
        assert list(episode_split(start, end, intervals).parts()) == swept, (start, end, intervals)


def test_an_episode_that_ends_before_it_starts_splits_into_zeros() -> None:
    assert episode_split(10, 5, [(MODEL, 0, 20)]) == TimeSplit()


def test_gymnasium_steps_are_env_and_its_aggregated_steps_move_from_other(captured: CapturedSpans) -> None:
    env = TraceEnv(gymnasium.make("CartPole-v1"), steps="aggregate", sample_first=1)
    env.reset(seed=3)
    steps = 0
    while True:
        steps += 1
        *_, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            break
    env.close()
    spans = captured.data
    (episode,) = [s for s in spans if s.attributes.get(c.KIND) == c.KIND_EPISODE]
    assert episode.attributes[c.STEPS_SAMPLED] == 1 < steps == episode.attributes[c.STEPS_COUNT]
    split = EpisodeTimes().add_spans(spans).split(episode)
    timed = sum(
        s.duration_ns for s in spans if s.attributes.get(c.KIND) in (c.KIND_SEED_SESSION, c.KIND_STEP)
    )
    untimed = round(episode.attributes[c.STEPS_DURATION_TOTAL_MS] * 1e6) - sum(
        s.duration_ns for s in spans if s.attributes.get(c.KIND) == c.KIND_STEP
    )
    assert untimed > 0
    assert split.env == timed + untimed
    assert split.total == episode.end_ns - episode.start_ns
    assert split.model == split.tool == 0


def test_an_aggregated_total_larger_than_other_takes_all_of_other_and_no_more() -> None:
    run = BuiltRun("r")
    episode = run.rollout("a").episode(0, 1_000, gym__env__id="X-v0", gym__steps__duration__total_ms=5.0)
    episode.child(c.KIND_SEED_SESSION, 0, 100)
    episode.child(c.KIND_STEP, 100, 300)
    episode.child(c.KIND_VERIFY, 900, 1_000)
    split, duration = _split_of(run)
    assert split == TimeSplit(env=900 * US, verify=100 * US)
    assert split.total == duration


def test_steps_outside_an_environment_integration_are_no_part() -> None:
    run = BuiltRun("r")
    episode = run.rollout("a").episode(0, 1_000)
    episode.child(c.KIND_STEP, 0, 1_000)
    split, _ = _split_of(run)
    assert split == TimeSplit(other=1_000 * US)


def test_a_rollout_sums_its_attempts_and_a_sampled_out_rollout_has_none() -> None:
    run = BuiltRun("r")
    rollout = run.rollout("a")
    first = rollout.episode(0, 1_000, outcome=c.OUTCOME_FAILED, failure=c.FAILURE_INFRASTRUCTURE)
    first.child(c.KIND_MODEL_CALL, 0, 400)
    second = rollout.episode(2_000, 3_000, reward=1.0)
    second.child(c.KIND_MODEL_CALL, 2_000, 2_300)
    second.child(c.KIND_VERIFY, 2_900, 3_000)
    root = rollout.end(reward=1.0)
    times = EpisodeTimes().add_spans(run.spans)
    episodes = episodes_by_rollout(run.spans)[(root.trace_id, "a")]
    assert rollout_split(root, episodes, times) == TimeSplit(
        model=700 * US, verify=100 * US, other=1_200 * US
    )
    sampled_out = run.rollout("b").end(reward=1.0, detail=False)
    assert rollout_split(sampled_out, episodes, times) is None
    assert rollout_split(root, [], times) is None


def test_a_file_appended_to_itself_splits_the_same() -> None:
    run = BuiltRun("r")
    episode = run.rollout("a").episode(0, 1_000)
    episode.child(c.KIND_MODEL_CALL, 0, 600)
    once = _split_of(run)[0]
    twice = EpisodeTimes().add_spans(run.spans + run.spans)
    (episode_span,) = episodes_by_rollout(run.spans + run.spans)[(episode.span.trace_id, "a")]
    assert twice.split(episode_span) == once == TimeSplit(model=600 * US, other=400 * US)


def test_a_real_episode_splits_into_its_spans_and_sums_to_its_duration(captured: CapturedSpans) -> None:
    with gymtrace.rollout(rollout_id="real", task_id="t"), gymtrace.episode():
        with gymtrace.seed_session():
            pass
        with gymtrace.agent_invocation(agent_name="a"), gymtrace.step():
            with gymtrace.model_call(model="m"):
                pass
            with gymtrace.tool_call(tool_name="x"):
                pass
        with gymtrace.verify():
            gymtrace.record_reward(1.0)
    spans = captured.data
    (episode,) = [s for s in spans if s.attributes.get(c.KIND) == c.KIND_EPISODE]
    split = EpisodeTimes().add_spans(spans).split(episode)

    def took(kind: str) -> int:
        return sum(s.duration_ns for s in spans if s.attributes.get(c.KIND) == kind)

    assert split.model == took(c.KIND_MODEL_CALL)
    assert split.tool == took(c.KIND_TOOL_CALL)
    assert split.env == took(c.KIND_SEED_SESSION)
    assert split.verify == took(c.KIND_VERIFY)
    assert split.total == episode.duration_ns


def test_percentiles_are_nearest_rank_values_that_occurred() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile([3.0], 99) == 3.0
    assert percentile([], 50) is None


def test_a_run_sums_its_rollouts_splits_and_shares() -> None:
    found = run_times(
        [TimeSplit(model=3 * 10**9, other=10**9), None, TimeSplit(tool=10**9, other=10**9)], [4.0, None, 2.0]
    )
    assert found["time_split"] == {"model": 3.0, "tool": 1.0, "env": 0.0, "verify": 0.0, "other": 2.0}
    assert found["time_share"]["model"] == pytest.approx(0.5)
    assert found["rollout_seconds_p50"] == 2.0 and found["rollout_seconds_p99"] == 4.0
    assert run_times([], [])["time_split"] is None


# -- what the readers print -------------------------------------------------------------------------


def _lines(capsys: pytest.CaptureFixture[str], *argv: str) -> list[str]:
    assert main(list(argv)) == 0
    return capsys.readouterr().out.splitlines()


def _two_rollouts(path: Path) -> Path:
    """Rollout a: a failed attempt (0.4 ms model of 1 ms) and a scored one (0.3 ms model, 0.1 ms
    verify of 1 ms), 3.002 ms end to end; rollout b: one episode, 2 ms tool of 4 ms, sampled in."""
    run = BuiltRun("split")
    a = run.rollout("a")
    a.episode(0, 1_000, outcome=c.OUTCOME_FAILED, failure=c.FAILURE_INFRASTRUCTURE).child(
        c.KIND_MODEL_CALL, 0, 400
    )
    second = a.episode(2_000, 3_000, reward=1.0)
    second.child(c.KIND_MODEL_CALL, 2_000, 2_300)
    second.child(c.KIND_VERIFY, 2_900, 3_000)
    a.end(reward=1.0)
    b = run.rollout("b", repeat=1)
    b.episode(10_000, 14_000, reward=0.0).child(c.KIND_TOOL_CALL, 11_000, 13_000)
    b.end(reward=0.0)
    run.rollout("c", repeat=2).end(reward=0.5, detail=False, end_us=20_000)  # sampled out: no episode
    return run.write(path)


def test_rollouts_json_rows_carry_each_rollouts_split_summed_over_its_attempts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _two_rollouts(tmp_path / "run.jsonl")
    rows = {r["rollout_id"]: r for r in map(json.loads, _lines(capsys, "rollouts", str(path), "--json"))}
    assert rows["a"]["time_split"] == {
        "model": 0.0007,
        "tool": 0.0,
        "env": 0.0,
        "verify": 0.0001,
        "other": 0.0012,
    }
    assert rows["b"]["time_split"] == {"model": 0.0, "tool": 0.002, "env": 0.0, "verify": 0.0, "other": 0.002}
    assert rows["c"]["time_split"] is None


def test_stats_gives_the_runs_split_its_shares_and_the_p50_p99_rollout_duration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _two_rollouts(tmp_path / "run.jsonl")
    (body,) = map(json.loads, _lines(capsys, "stats", str(path), "--json"))
    assert body["time_split"] == pytest.approx(
        {"model": 0.0007, "tool": 0.002, "env": 0.0, "verify": 0.0001, "other": 0.0032}
    )
    assert body["time_share"]["tool"] == pytest.approx(0.002 / 0.006)
    # Durations: a 3.002 ms, b 4.002 ms, c 20 ms (its root only): nearest rank.
    assert body["rollout_seconds_p50"] == pytest.approx(0.004002)
    assert body["rollout_seconds_p99"] == pytest.approx(0.020)
    text = "\n".join(_lines(capsys, "stats", str(path)))
    assert (
        "time: model 0.0007s (12%), tool 0.002s (33%), env 0s (0%), verify 0.0001s (2%), other 0.0032s (53%)"
        in text
    )
    assert "rollout duration p50 0.004002s, p99 0.02s" in text
