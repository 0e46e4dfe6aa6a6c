"""TraceEnv on real gymnasium; private where it sets a step policy or a provider, reads outcomes, or
feeds the episode clock's offset reads.

CartPole and FrozenLake, scalar and vector."""

from __future__ import annotations

import copy
import pickle
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import gymtrace
from gymtrace import attributes as c
from gymtrace._read.outcomes import final_outcomes
from gymtrace._scopes import steps as _steps
from gymtrace.testing import CapturedSpans, capture_spans, check_trace

gym = pytest.importorskip("gymnasium")

from gymtrace.integrations.gymnasium import TraceEnv  # noqa: E402 - after the importorskip
from gymtrace.integrations.gymnasium import episodes as _episodes  # noqa: E402


def attrs(span: Any) -> dict[str, Any]:
    return dict(span.attributes or {})


def rollouts(captured: CapturedSpans) -> dict[str, dict[str, Any]]:
    """Rollout ID -> the rollout root's attributes."""
    return {attrs(s)[c.ROLLOUT_ID]: attrs(s) for s in captured.by_kind("rollout")}


def spans_of(captured: CapturedSpans, rollout_id: str, kind: str) -> list[Any]:
    return [s for s in captured.by_kind(kind) if attrs(s).get(c.ROLLOUT_ID) == rollout_id]


def play(env: Any, seed: int, policy: Any = None) -> tuple[float, int]:
    """One episode with a seeded random (or given) policy: (return, steps) as the caller sees them."""
    env.reset(seed=seed)
    env.action_space.seed(seed)
    total, steps = 0.0, 0
    while True:
        action = policy() if policy is not None else env.action_space.sample()
        _, reward, terminated, truncated, _ = env.step(action)
        total += float(reward)
        steps += 1
        if terminated or truncated:
            return total, steps


class Broken(Exception):
    pass


class CountsSteps(gym.Wrapper):  # type: ignore[misc]
    """A wrapper that knows which step of the episode it is on."""

    def __init__(self, env: Any) -> None:
        super().__init__(env)
        self.steps = 0

    def reset(self, **kwargs: Any) -> Any:
        self.steps = 0
        return self.env.reset(**kwargs)


class BreaksOnThirdStep(CountsSteps):
    def step(self, action: Any) -> Any:
        self.steps += 1
        if self.steps == 3:
            raise Broken("simulator crashed")
        return self.env.step(action)


# -- scalar ---------------------------------------------------------------------------------------


def test_each_cartpole_reset_is_a_scored_rollout_with_its_return_as_reward(captured: CapturedSpans) -> None:
    env = TraceEnv(gym.make("CartPole-v1"), rollout_id=lambda n: f"cartpole-{n}")
    played = [play(env, seed) for seed in range(3)]

    found = rollouts(captured)
    assert sorted(found) == ["cartpole-0", "cartpole-1", "cartpole-2"]
    for n, (total, steps) in enumerate(played):
        root = found[f"cartpole-{n}"]
        assert root[c.TASK_ID] == "CartPole-v1"
        assert root[c.ROLLOUT_REPEAT] == n
        assert root[c.ROLLOUT_OUTCOME] == "scored"
        assert root[c.REWARD] == total
        (episode,) = spans_of(captured, f"cartpole-{n}", "episode")
        ep = attrs(episode)
        assert ep[c.EPISODE_OUTCOME] == "completed"
        assert ep[c.STEPS_POLICY] == "aggregate"
        assert ep[c.STEPS_COUNT] == steps
        assert ep[c.STEPS_SAMPLED] == 1
        assert 1 <= ep[c.STEPS_SLOWEST_NUMBER] <= steps
        assert ep[c.STEPS_DURATION_MIN_MS] <= ep[c.STEPS_DURATION_MEAN_MS] <= ep[c.STEPS_DURATION_MAX_MS]
        # The tree: seed_session, the sampled first step, verify, all children of the episode.
        children = [s for s in captured.spans if s.parent and s.parent.span_id == episode.context.span_id]
        assert sorted(s.name for s in children) == ["gym.seed_session", "gym.step", "gym.verify"]
        (step,) = spans_of(captured, f"cartpole-{n}", "step")
        assert attrs(step)[c.STEP_NUMBER] == 1
        (verify,) = spans_of(captured, f"cartpole-{n}", "verify")
        assert attrs(verify)[c.REWARD] == total
    # Read back as `gymtrace rollouts` reads it: each rollout's final outcome.
    finals = {o.rollout_id: (o.outcome, o.reward, o.attempts) for o in final_outcomes(captured.data)}
    assert finals == {f"cartpole-{n}": ("scored", total, 1) for n, (total, _) in enumerate(played)}
    assert check_trace(captured) == []


def test_steps_all_makes_every_frozenlake_step_a_numbered_span(captured: CapturedSpans) -> None:
    env = TraceEnv(gym.make("FrozenLake-v1", is_slippery=True), rollout_id=lambda n: f"lake-{n}", steps="all")
    played = [play(env, seed) for seed in range(4)]

    found = rollouts(captured)
    for n, (total, steps) in enumerate(played):
        assert found[f"lake-{n}"][c.REWARD] == total
        numbers = sorted(attrs(s)[c.STEP_NUMBER] for s in spans_of(captured, f"lake-{n}", "step"))
        assert numbers == list(range(1, steps + 1))
        (episode,) = spans_of(captured, f"lake-{n}", "episode")
        assert attrs(episode)[c.STEPS_POLICY] == "all"
        assert attrs(episode)[c.STEPS_SAMPLED] == steps
    assert check_trace(captured) == []


def test_resets_inside_a_rollout_scope_are_its_attempts(captured: CapturedSpans) -> None:
    crashing = TraceEnv(BreaksOnThirdStep(gym.make("FrozenLake-v1", is_slippery=False)))
    env = TraceEnv(gym.make("FrozenLake-v1", is_slippery=False))
    right, down = 2, 1
    path = iter([down, down, right, right, down, right])  # reaches the goal: reward 1

    with gymtrace.rollout(rollout_id="lake-task", task_id="FrozenLake-4x4"):
        with pytest.raises(Broken):
            play(crashing, 0, lambda: down)  # attempt 0: the simulator crashes
        total, _ = play(env, 0, lambda: next(path))  # attempt 1, the retry
    assert total == 1.0

    (root,) = captured.by_kind("rollout")
    assert attrs(root)[c.ROLLOUT_ATTEMPTS] == 2
    assert attrs(root)[c.ROLLOUT_OUTCOME] == "scored"
    assert attrs(root)[c.REWARD] == 1.0
    outcomes = sorted(
        (attrs(s)[c.EPISODE_ATTEMPT], attrs(s)[c.EPISODE_OUTCOME]) for s in captured.by_kind("episode")
    )
    assert outcomes == [(0, "failed"), (1, "completed")]
    assert all(s.parent and s.parent.span_id == root.context.span_id for s in captured.by_kind("episode"))
    assert check_trace(captured) == []


def test_time_limit_truncation_is_a_completed_scored_episode(captured: CapturedSpans) -> None:
    env = TraceEnv(gym.make("CartPole-v1", max_episode_steps=5), rollout_id=lambda n: f"short-{n}")
    env.reset(seed=3)
    result = None
    for _ in range(5):
        result = env.step(0 if _ % 2 else 1)  # alternate pushes: upright for five steps
    assert result is not None and result[3] and not result[2]

    (episode,) = captured.by_kind("episode")
    assert attrs(episode)[c.EPISODE_OUTCOME] == "completed"
    assert attrs(episode)[c.STEPS_COUNT] == 5
    assert rollouts(captured)["short-0"][c.REWARD] == 5.0
    assert check_trace(captured) == []


def test_an_exception_in_step_fails_the_episode_and_leaves_the_rollout_unscored(
    captured: CapturedSpans,
) -> None:
    env = TraceEnv(BreaksOnThirdStep(gym.make("CartPole-v1")), rollout_id=lambda n: f"broken-{n}")
    env.reset(seed=0)
    env.step(0)
    env.step(1)
    with pytest.raises(Broken, match="simulator crashed"):
        env.step(0)

    root = rollouts(captured)["broken-0"]
    assert root[c.ROLLOUT_OUTCOME] == "unscored"
    assert c.REWARD not in root
    (episode,) = captured.by_kind("episode")
    assert attrs(episode)[c.EPISODE_OUTCOME] == "failed"
    assert attrs(episode)[c.FAILURE_KIND] == "error"
    assert attrs(episode)[c.STEPS_COUNT] == 3
    # The step that raised is a span even under the aggregate policy (which samples only step 1).
    steps = {attrs(s)[c.STEP_NUMBER]: s for s in captured.by_kind("step")}
    assert sorted(steps) == [1, 3]
    assert attrs(steps[3])[c.ERROR_TYPE].endswith("Broken")
    assert attrs(steps[3])[c.STEP_KEPT] == "raised"
    assert [e.name for e in steps[3].events] == ["exception"]
    assert steps[1].end_time <= steps[3].start_time <= steps[3].end_time <= episode.end_time
    assert attrs(episode)[c.STEPS_ERRORS] == 1 and attrs(episode)[c.STEPS_SAMPLED] == 2
    assert captured.by_kind("verify") == []
    assert check_trace(captured) == []


class SlowSteps(CountsSteps):
    """Takes the given seconds in the given steps of each episode (1-based), and opens a span of
    its own in every step, as a simulator instrumented with OpenTelemetry would. With a
    ``VirtualClock`` the seconds pass on that clock instead of in a real sleep."""

    def __init__(
        self, env: Any, sleeps: dict[int, float], tracer: Any, clock: VirtualClock | None = None
    ) -> None:
        super().__init__(env)
        self.sleeps = sleeps
        self.tracer = tracer
        self.clock = clock

    def step(self, action: Any) -> Any:
        self.steps += 1
        with self.tracer.start_as_current_span(f"physics {self.steps}"):
            seconds = self.sleeps.get(self.steps, 0.0)
            if self.clock is None:
                time.sleep(seconds)
            else:
                self.clock.advance(seconds)
            return self.env.step(action)


class VirtualClock:
    """The step timer's ``perf_counter_ns``, made deterministic: one microsecond per reading plus
    whatever a step says it took, so a busy machine cannot reorder the steps' durations."""

    def __init__(self) -> None:
        self.now = time.perf_counter_ns()

    def __call__(self) -> int:
        self.now += 1_000
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += int(seconds * 1e9)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> VirtualClock:
        from gymtrace.integrations.gymnasium import env, episodes

        monkeypatch.setattr(env, "_perf_counter_ns", self)
        monkeypatch.setattr(episodes, "_perf_counter_ns", self)
        return self


def test_step_statistics_are_each_unsampled_steps_own_time(
    captured: CapturedSpans, monkeypatch: pytest.MonkeyPatch
) -> None:
    tracer = captured.tracer_provider.get_tracer("sim")
    sleeps = {2: 0.004, 4: 0.030}
    clock = VirtualClock().install(monkeypatch)
    env = TraceEnv(SlowSteps(gym.make("CartPole-v1", max_episode_steps=6), sleeps, tracer, clock))
    env.reset(seed=0)
    for n in range(6):
        env.step(n % 2)  # alternate pushes: upright for six steps, then the TimeLimit

    ep = attrs(captured.one("episode"))
    assert ep[c.STEPS_COUNT] == 6 and ep[c.STEPS_SAMPLED] == 1
    assert ep[c.STEPS_SLOWEST_NUMBER] == 4
    # On the virtual clock each step took what it asked for, plus one microsecond of reading.
    assert ep[c.STEPS_DURATION_MAX_MS] == pytest.approx(30.001)
    assert ep[c.STEPS_DURATION_MIN_MS] == pytest.approx(0.001)  # the four steps that did not sleep
    assert ep[c.STEPS_DURATION_TOTAL_MS] == pytest.approx(34.006)
    assert ep[c.STEPS_DURATION_MEAN_MS] == pytest.approx(ep[c.STEPS_DURATION_TOTAL_MS] / 6)
    # Spans the environment opens in a step nest under that step's span when it has one (the
    # sampled first step), else directly under the episode: never under the caller's context.
    episode, (step,) = captured.one("episode"), captured.by_kind("step")
    parents = {s.name: s.parent.span_id for s in captured.spans if s.name.startswith("physics")}
    assert parents == {
        "physics 1": step.context.span_id,
        **{f"physics {n}": episode.context.span_id for n in range(2, 7)},
    }
    assert check_trace(captured) == []


def test_environments_stepped_in_turn_keep_their_own_episodes(captured: CapturedSpans) -> None:
    # The wrappers share the scopes they reuse (verify, the first steps): each activation must
    # still land in its own episode's context.
    envs = {
        "a": TraceEnv(gym.make("CartPole-v1"), rollout_id=lambda n: f"a-{n}", sample_first=2),
        "b": TraceEnv(gym.make("CartPole-v1"), rollout_id=lambda n: f"b-{n}", steps="all"),
    }
    played = {name: [0, 0] for name in envs}  # episodes ended, steps of the running episode
    for env in envs.values():
        env.reset(seed=0)
        env.action_space.seed(0)
    while min(done for done, _ in played.values()) < 2:
        for name, env in envs.items():
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            played[name][1] += 1
            if terminated or truncated:
                played[name] = [played[name][0] + 1, 0]
                env.reset()
    for env in envs.values():
        env.close()

    episodes = {s.context.span_id: s for s in captured.by_kind("episode")}
    for kind in ("seed_session", "step", "verify"):
        for span in captured.by_kind(kind):
            episode = episodes[span.parent.span_id]
            assert attrs(span)[c.ROLLOUT_ID] == attrs(episode)[c.ROLLOUT_ID]
    for episode in episodes.values():
        a = attrs(episode)
        numbers = sorted(attrs(s)[c.STEP_NUMBER] for s in captured.by_kind("step") if s.parent.span_id
                         == episode.context.span_id)  # fmt: skip
        if a[c.ROLLOUT_ID].startswith("a-"):
            assert numbers == [1, 2][: a[c.STEPS_COUNT]]
        else:
            assert numbers == list(range(1, a[c.STEPS_COUNT] + 1))
        assert a[c.STEPS_SAMPLED] == len(numbers)
    assert check_trace(captured) == []


@pytest.mark.parametrize("outer", ["time_limit", "time_limit_around_another_wrapper"])
def test_a_time_limit_around_the_wrapper_completes_and_scores_its_episodes(
    captured: CapturedSpans, outer: str
) -> None:
    # Issue 31: TimeLimit(TraceEnv(env)) truncates episodes TraceEnv's own step never says ended;
    # they used to end cancelled at the next reset, every one unscored, silently. TraceEnv finds
    # the TimeLimit around it when reset() comes through it, and ends the episode at its truncation.
    inner = TraceEnv(gym.make("CartPole-v1"), rollout_id=lambda n: f"tl-{n}")
    middle = CountsSteps(inner) if outer == "time_limit_around_another_wrapper" else inner
    env = gym.wrappers.TimeLimit(middle, 5)
    returns = [play(env, seed, policy=lambda: 0) for seed in range(2)]
    env.close()
    for n in range(2):
        total, steps = returns[n]
        assert steps == 5  # truncated by the outer limit, not terminated
        (episode,) = spans_of(captured, f"tl-{n}", "episode")
        assert attrs(episode)[c.EPISODE_OUTCOME] == "completed"
        assert attrs(episode)[c.STEPS_COUNT] == 5
        root = rollouts(captured)[f"tl-{n}"]
        assert (root[c.ROLLOUT_OUTCOME], root[c.REWARD]) == ("scored", total)
    assert check_trace(captured) == []


def test_a_user_loop_that_stops_early_inside_an_outer_wrapper_still_cancels(captured: CapturedSpans) -> None:
    # Only the TimeLimit's truncation ends an episode: an episode the caller abandons (reset
    # before its end) through a wrapper stays cancelled, unscored.
    env = CountsSteps(TraceEnv(gym.make("CartPole-v1"), rollout_id=lambda n: f"stop-{n}"))
    env.reset(seed=0)
    env.step(0)
    env.reset(seed=1)
    env.close()
    assert rollouts(captured)["stop-0"][c.ROLLOUT_OUTCOME] == "unscored"
    (episode,) = spans_of(captured, "stop-0", "episode")
    assert attrs(episode)[c.EPISODE_OUTCOME] == "cancelled"


def test_a_second_reset_in_a_users_rollout_after_a_completed_episode_is_said_when_it_happens(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A rollout is one sample with one reward; its episodes are retries. A reset after one of
    # them completed starts a second sample in it: said at that reset, with the fix (strict
    # mode raises there, before anything is opened), not only when the rollout ends.
    env = TraceEnv(gym.make("CartPole-v1"))
    with capture_spans(strict=True), gymtrace.rollout(rollout_id="mine", task_id="t"):
        play(env, 0)
        with pytest.raises(gymtrace.GymTraceError, match=r"TraceEnv.reset\(\) in rollout 'mine'.* per reset"):
            env.reset(seed=1)
    with capture_spans(strict=False) as captured, caplog.at_level("WARNING", "gymtrace"):
        with gymtrace.rollout(rollout_id="mine", task_id="t"):
            play(env, 0)
            before = len(caplog.records)
            env.reset(seed=1)
            said = [r.getMessage() for r in caplog.records[before:]]
            assert any("TraceEnv.reset() in rollout 'mine'" in m and "Fix:" in m for m in said)
            env.close()
    assert rollouts(captured)["mine"][c.ROLLOUT_ATTEMPTS] == 2


def test_a_reset_after_a_failed_episode_in_a_users_rollout_is_a_retry_and_says_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = TraceEnv(gym.make("CartPole-v1"))
    with capture_spans(strict=True) as captured, gymtrace.rollout(rollout_id="retry", task_id="t"):
        env.reset(seed=0)
        env.step(0)  # cut short: the next reset cancels it, and the rollout retries
        play(env, 1)
    assert rollouts(captured)["retry"][c.ROLLOUT_OUTCOME] == "scored"
    assert check_trace(captured) == []


def test_a_reset_before_the_episode_ended_cancels_it(captured: CapturedSpans) -> None:
    env = TraceEnv(gym.make("CartPole-v1"), rollout_id=lambda n: f"cut-{n}")
    env.reset(seed=0)
    env.step(0)
    play(env, 1)

    assert rollouts(captured)["cut-0"][c.ROLLOUT_OUTCOME] == "unscored"
    assert rollouts(captured)["cut-1"][c.ROLLOUT_OUTCOME] == "scored"
    (cut,) = spans_of(captured, "cut-0", "episode")
    assert attrs(cut)[c.EPISODE_OUTCOME] == "cancelled"
    assert check_trace(captured) == []


def test_inside_a_harness_episode_the_env_is_left_untraced(
    captured: CapturedSpans, caplog: pytest.LogCaptureFixture
) -> None:
    env = TraceEnv(gym.make("CartPole-v1"))
    with gymtrace.rollout(rollout_id="harness"), gymtrace.episode():
        play(env, 0)
    assert [s.name for s in captured.by_kind("episode")] == ["gym.episode"]
    assert captured.by_kind("step") == [] and captured.by_kind("seed_session") == []
    assert "inside an open gymtrace.episode()" in caplog.text
    assert check_trace(captured) == []


def test_untraced_without_a_provider_and_results_unchanged() -> None:
    plain = gym.make("CartPole-v1")
    traced = TraceEnv(gym.make("CartPole-v1"))
    assert play(plain, 7) == play(traced, 7)
    assert isinstance(traced, gym.Env)
    assert traced.unwrapped.spec.id == "CartPole-v1"
    # Other wrappers accept it as the environment it proxies.
    stats = gym.wrappers.RecordEpisodeStatistics(traced)
    assert play(stats, 7) == play(plain, 7)


@pytest.fixture
def chosen_policy() -> Iterator[Any]:
    """Choose a global step policy as configure(step_policy=...) does; forgotten afterwards."""

    def choose(policy: str, **parameters: Any) -> None:
        _steps.set_policy(gymtrace.StepPolicy(policy, **parameters), chosen=True)

    yield choose
    _steps.reset_policy()


def kept_steps(captured: CapturedSpans, rollout_id: str) -> dict[int, str | None]:
    """Step number -> why that step is a span (``gym.step.kept``; None: every step is one)."""
    return {
        attrs(s)[c.STEP_NUMBER]: attrs(s).get(c.STEP_KEPT) for s in spans_of(captured, rollout_id, "step")
    }


# (chosen policy, TraceEnv arguments) -> (policy on the episode span, first steps kept, slowest kept)
# with None for "every step is a span".
POLICY_CASES = [
    (None, {}, "aggregate", 1, 0),  # the integration's own default
    (("aggregate", {}), {}, "aggregate", 1, 1),  # StepPolicy's defaults: first=1, slowest=1
    (("aggregate", {"first": 2, "slowest": 3}), {}, "aggregate", 2, 3),
    (("aggregate", {"first": 3, "slowest": 2, "episode_share": 1.0}), {}, "all", None, None),
    (("all", {}), {}, "all", None, None),
    (("aggregate", {}), {"steps": "all"}, "all", None, None),  # the argument wins
    (("all", {}), {"steps": "aggregate", "sample_first": 2}, "aggregate", 2, 0),  # the integration's
    (("aggregate", {"slowest": 4}), {"sample_first": 0}, "aggregate", 0, 4),
    (None, {"steps": gymtrace.StepPolicy("aggregate", first=0, slowest=2)}, "aggregate", 0, 2),
]


@pytest.mark.parametrize(("chosen", "arguments", "policy", "first", "slowest"), POLICY_CASES)
def test_the_chosen_step_policy_or_the_argument_decides_and_every_step_is_counted_once(
    captured: CapturedSpans,
    chosen_policy: Any,
    chosen: tuple[str, dict[str, Any]] | None,
    arguments: dict[str, Any],
    policy: str,
    first: int | None,
    slowest: int | None,
) -> None:
    # The wrapper samples and counts its own steps: gymtrace's step engine, aggregating too
    # under a chosen "aggregate", must neither drop the wrapper's step spans nor overwrite its
    # statistics with its own (which see only the spans).
    if chosen is not None:
        chosen_policy(chosen[0], **chosen[1])
    env = TraceEnv(gym.make("CartPole-v1"), rollout_id=lambda n: f"pole-{n}", **arguments)
    played = [play(env, seed, policy=lambda: 0) for seed in range(3)]
    for n, (_, steps) in enumerate(played):
        (episode,) = spans_of(captured, f"pole-{n}", "episode")
        ep = attrs(episode)
        kept = kept_steps(captured, f"pole-{n}")
        assert ep[c.STEPS_POLICY] == policy
        assert ep[c.STEPS_COUNT] == steps
        assert ep[c.STEPS_SAMPLED] == len(kept)
        if first is None or slowest is None:
            assert kept == dict.fromkeys(range(1, steps + 1))  # every step, none marked as a sample
            continue
        assert (ep[c.STEPS_FIRST], ep[c.STEPS_SLOWEST]) == (first, slowest)
        assert [k for k, why in kept.items() if why == "first"] == list(range(1, first + 1))
        slow = sorted(k for k, why in kept.items() if why == "slowest")
        assert len(slow) == min(slowest, steps - first) and all(k > first for k in slow)
        assert set(kept.values()) <= {"first", "slowest"}
        if ep[c.STEPS_SLOWEST_NUMBER] > first and slowest:
            # The slowest step of all is among the slowest kept, with its true duration.
            span = next(
                s
                for s in spans_of(captured, f"pole-{n}", "step")
                if attrs(s)[c.STEP_NUMBER] == ep[c.STEPS_SLOWEST_NUMBER]
            )
            assert (span.end_time - span.start_time) / 1e6 == pytest.approx(ep[c.STEPS_DURATION_MAX_MS])
    assert check_trace(captured) == []


def test_a_policy_chosen_between_episodes_applies_from_the_next_one(
    captured: CapturedSpans, chosen_policy: Any
) -> None:
    env = TraceEnv(gym.make("CartPole-v1"), rollout_id=lambda n: f"switch-{n}")
    play(env, 0, policy=lambda: 0)
    chosen_policy("all")
    _, second_steps = play(env, 1, policy=lambda: 0)
    chosen_policy("aggregate", first=2, slowest=0)
    play(env, 2, policy=lambda: 0)
    policies = [attrs(spans_of(captured, f"switch-{n}", "episode")[0])[c.STEPS_POLICY] for n in range(3)]
    assert policies == ["aggregate", "all", "aggregate"]
    assert kept_steps(captured, "switch-0") == {1: "first"}
    assert kept_steps(captured, "switch-1") == dict.fromkeys(range(1, second_steps + 1))
    assert kept_steps(captured, "switch-2") == {1: "first", 2: "first"}
    assert check_trace(captured) == []


@pytest.fixture
def step_variables(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Set GYMTRACE_STEP_* variables and read the environment again; read once more afterwards."""

    def set_variables(**values: str) -> None:
        for name, value in values.items():
            monkeypatch.setenv(f"GYMTRACE_STEP_{name.upper()}", value)
        gymtrace.testing.reset()

    yield set_variables
    monkeypatch.undo()
    gymtrace.testing.reset()


@pytest.mark.parametrize(
    ("variables", "first", "slowest"),
    [
        ({"slowest": "2"}, 1, 2),  # a parameter alone: the integration's defaults for the rest
        ({"first": "3"}, 3, 0),
        ({"first": "0", "slowest": "1"}, 0, 1),
        ({"slowest": "lots"}, 1, 0),  # a bad value is not a value given (warned, then the default)
        ({"policy": "aggregate", "slowest": "3"}, 1, 3),  # a chosen policy: all of its parameters
        ({"policy": "aggregate"}, 1, 1),
    ],
)
def test_step_variables_set_the_wrappers_sample(
    step_variables: Any, variables: dict[str, str], first: int, slowest: int
) -> None:
    step_variables(**variables)
    with capture_spans(strict=False) as captured:
        env = TraceEnv(gym.make("CartPole-v1"), rollout_id=lambda n: f"vars-{n}")
        played = [play(env, seed, policy=lambda: 0) for seed in range(2)]
    for n, (_, steps) in enumerate(played):
        ep = attrs(spans_of(captured, f"vars-{n}", "episode")[0])
        kept = kept_steps(captured, f"vars-{n}")
        assert ep[c.STEPS_POLICY] == "aggregate"
        assert (ep[c.STEPS_FIRST], ep[c.STEPS_SLOWEST]) == (first, slowest)
        assert sorted(k for k, why in kept.items() if why == "first") == list(range(1, first + 1))
        assert len([k for k, why in kept.items() if why == "slowest"]) == min(slowest, steps - first)
    assert check_trace(captured) == []


def test_the_slowest_steps_are_spans_with_their_true_times_in_order(captured: CapturedSpans) -> None:
    tracer = captured.tracer_provider.get_tracer("sim")
    sleeps = {3: 0.010, 5: 0.030, 7: 0.020}
    steps = gymtrace.StepPolicy("aggregate", first=1, slowest=2)
    env = TraceEnv(SlowSteps(gym.make("CartPole-v1", max_episode_steps=8), sleeps, tracer), steps=steps)
    env.reset(seed=0)
    for n in range(8):
        env.step(n % 2)

    episode = captured.one("episode")
    ep = attrs(episode)
    assert ep[c.STEPS_COUNT] == 8 and ep[c.STEPS_SAMPLED] == 3
    # Which steps were slowest is read from the simulator's own spans, not from the sleeps asked
    # for: on a loaded machine a 20 ms sleep can outlast a 30 ms one.
    physics = {s.name: s for s in captured.spans if s.name.startswith("physics")}
    took = {n: physics[f"physics {n}"].end_time - physics[f"physics {n}"].start_time for n in range(2, 9)}
    slowest = sorted(sorted(took, key=took.__getitem__, reverse=True)[:2])
    by_number = {attrs(s)[c.STEP_NUMBER]: s for s in captured.by_kind("step")}
    # The slowest step of all is kept (first or slowest), and is the longest of the kept spans: step
    # 1, whose time holds first-call work the simulator's span does not see, can be it (CI, loaded).
    kept_took = {n: s.end_time - s.start_time for n, s in by_number.items()}
    assert ep[c.STEPS_SLOWEST_NUMBER] == max(kept_took, key=kept_took.__getitem__)
    assert sorted(by_number) == [1, *slowest]
    assert [attrs(by_number[n])[c.STEP_KEPT] for n in (1, *slowest)] == ["first", "slowest", "slowest"]
    for number in slowest:
        span = by_number[number]
        assert span.parent.span_id == episode.context.span_id
        assert (span.end_time - span.start_time) / 1e9 >= sleeps.get(number, 0.0)
        # Its times are the step's own: the simulator's span inside it lies within them.
        inner = physics[f"physics {number}"]
        assert span.start_time <= inner.start_time <= inner.end_time <= span.end_time
        assert attrs(span)[c.ROLLOUT_ID] == ep[c.ROLLOUT_ID]
    assert by_number[slowest[0]].end_time <= by_number[slowest[1]].start_time
    assert check_trace(captured) == []


def test_a_share_of_episodes_has_every_step_as_a_span(captured: CapturedSpans) -> None:
    # Half the episodes, drawn from gymtrace's own generator: seeding Python's does not fix it.
    steps = gymtrace.StepPolicy("aggregate", first=1, slowest=0, episode_share=0.5)
    env = TraceEnv(gym.make("CartPole-v1"), rollout_id=lambda n: f"share-{n}", steps=steps)
    played = [play(env, seed, policy=lambda: 0) for seed in range(40)]
    everything = 0
    for n, (_, count) in enumerate(played):
        ep = attrs(spans_of(captured, f"share-{n}", "episode")[0])
        kept = kept_steps(captured, f"share-{n}")
        assert ep[c.STEPS_EPISODE_SHARE] == 0.5
        if ep[c.STEPS_POLICY] == "all":
            everything += 1
            assert kept == dict.fromkeys(range(1, count + 1))
        else:
            assert kept == {1: "first"}
    assert 5 <= everything <= 35  # 40 draws at 1/2: outside this 1 time in ~10^5
    assert check_trace(captured) == []


def test_a_vector_env_keeps_each_sub_episodes_slowest_steps(captured: CapturedSpans) -> None:
    steps = gymtrace.StepPolicy("aggregate", first=1, slowest=2)
    env = TraceEnv(gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2), steps=steps)
    returns = drive_vector(env, 80, seed=3)
    env.close()
    assert_one_rollout_per_sub_episode(captured, returns)
    for root in captured.by_kind("rollout"):
        rollout_id = attrs(root)[c.ROLLOUT_ID]
        ep = attrs(spans_of(captured, rollout_id, "episode")[0])
        if ep[c.EPISODE_OUTCOME] != "completed":
            continue
        kept = kept_steps(captured, rollout_id)
        assert ep[c.STEPS_SAMPLED] == len(kept) == 1 + min(2, ep[c.STEPS_COUNT] - 1)
        assert kept[1] == "first"
        assert sorted(why for why in kept.values()) == ["first"] + ["slowest"] * (len(kept) - 1)


def test_kept_steps_map_to_epoch_time_through_the_tightest_clock_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Kept steps are timed with perf_counter_ns and written after the fact through an offset to
    # time_ns. A thread paused between the two clock reads shifted them by the pause: on a busy CI
    # machine a kept step 2 landed before the live step 1 (check: "step numbers ... [2, 1]"). Here
    # the first of the reads is paused 5 us after the perf_counter read; the others are not.
    true_offset = 1_000_000_000
    perf = iter([100, 5_110, 5_200, 5_220, 5_300, 5_330])
    epoch = iter([true_offset + 5_100, true_offset + 5_210, true_offset + 5_315])
    monkeypatch.setattr(_episodes, "_perf_counter_ns", lambda: next(perf))
    monkeypatch.setattr(_episodes, "_time_ns", lambda: next(epoch))
    assert _episodes._epoch_offset() == true_offset


COPIES = {
    "copy": copy.copy,
    "deepcopy": copy.deepcopy,
    "pickle": lambda env: pickle.loads(pickle.dumps(env)),
}


@pytest.mark.parametrize("how", sorted(COPIES))
def test_a_copy_is_a_trace_env_of_its_own_with_the_same_arguments(captured: CapturedSpans, how: str) -> None:
    env = TraceEnv(gym.make("FrozenLake-v1", is_slippery=False), task_id="lake", steps="all")
    env.reset(seed=0)
    env.step(2)  # mid-episode: the copy carries no open episode
    twin = COPIES[how](env)
    assert isinstance(twin, TraceEnv) and twin is not env
    _, twin_steps = play(twin, 1, policy=lambda: 1)
    env.reset(seed=2)  # cancels the original's open episode
    env.step(1)
    env.close()

    by_id = rollouts(captured)
    assert all(a[c.TASK_ID] == "lake" for a in by_id.values())
    twin_ids = [i for i, a in by_id.items() if a[c.ROLLOUT_OUTCOME] == "scored"]
    assert len(twin_ids) == 1 and len(by_id) == 3  # its own rollout IDs: none collides
    (episode,) = spans_of(captured, twin_ids[0], "episode")
    assert attrs(episode)[c.STEPS_POLICY] == "all"
    assert attrs(episode)[c.STEPS_COUNT] == twin_steps == len(spans_of(captured, twin_ids[0], "step"))
    assert check_trace(captured) == []


def test_a_deep_copy_of_a_traced_vector_env_traces_each_sub_environment(captured: CapturedSpans) -> None:
    env = TraceEnv(gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync"))
    twin = copy.deepcopy(env)
    assert twin.num_envs == 2
    returns = drive_vector(twin, 80, seed=3)
    twin.close()
    assert_one_rollout_per_sub_episode(captured, returns)


def test_bad_arguments_name_the_argument() -> None:
    with pytest.raises(TypeError, match="'env'"):
        TraceEnv(object())
    with pytest.raises(ValueError, match="'steps'"):
        TraceEnv(gym.make("CartPole-v1"), steps="some")
    with pytest.raises(ValueError, match="'sample_first'"):
        TraceEnv(gym.make("CartPole-v1"), sample_first=-1)
    with pytest.raises(TypeError, match="'rollout_id'"):
        TraceEnv(gym.make("CartPole-v1"), rollout_id="fixed")  # type: ignore[arg-type]
    env = TraceEnv(gym.make("CartPole-v1"), rollout_id=lambda n: n)  # type: ignore[arg-type,return-value]
    with capture_spans(), pytest.raises(TypeError, match="'rollout_id' returned 0"):
        env.reset(seed=0)


@pytest.mark.parametrize("by", ["rollout", "task"])
def test_under_the_rollout_sampler_a_dropped_episode_leaves_its_summary_and_a_kept_one_is_whole(
    by: str,
) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from gymtrace._scopes.tracing import pop_provider, push_provider
    from gymtrace.sampling import RolloutSampler, keep_rollout

    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=RolloutSampler(0.5, by=by))
    provider.add_span_processor(gymtrace.IdentitySpanProcessor())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    envs = {
        task: TraceEnv(gym.make("CartPole-v1"), rollout_id=lambda n, t=task: f"{t}-{n}", task_id=task)
        for task in ("a", "b", "c", "d")
    }
    plain = gym.make("CartPole-v1")
    push_provider(provider)
    try:
        played = {(task, n): play(env, n) for task, env in envs.items() for n in range(6)}
    finally:
        pop_provider(provider)
    assert all(played[task, n] == play(plain, n) for task, n in played)  # results unchanged either way
    spans = exporter.get_finished_spans()
    kept = {
        s.attributes[c.ROLLOUT_ID]
        for s in spans
        if s.attributes[c.KIND] == "rollout" and c.ROLLOUT_DETAIL not in s.attributes
    }
    expected = {f"{t}-{n}" for t, n in played if keep_rollout(f"{t}-{n}" if by == "rollout" else t, 0.5)}
    assert kept == expected and 0 < len(kept) < len(played)
    # Every episode's return is read back, kept or not: the counts and the mean are exact.
    outcomes = {o.rollout_id: o for o in final_outcomes(spans)}
    assert {r: (o.outcome, o.reward, o.attempts) for r, o in outcomes.items()} == {
        f"{t}-{n}": ("scored", played[t, n][0], 1) for t, n in played
    }
    assert {r for r, o in outcomes.items() if o.detail} == kept
    for task, n in played:
        rollout_id = f"{task}-{n}"
        kinds = sorted(s.attributes[c.KIND] for s in spans if s.attributes.get(c.ROLLOUT_ID) == rollout_id)
        if rollout_id in kept:  # the whole episode, its repeat the wrapper's episode index
            # A live marker is written when the marker thread wakes while the rollout is open,
            # which a loaded machine makes likely: it is no span of the episode.
            assert [k for k in kinds if k != c.KIND_LIVE] == [
                "episode",
                "rollout",
                "seed_session",
                "step",
                "verify",
            ]
            root = next(s for s in spans if s.attributes.get(c.ROLLOUT_ID) == rollout_id and s.parent is None)
            assert root.attributes[c.ROLLOUT_REPEAT] == n
        else:  # its summary, and none of its episode, seed_session, steps or verify
            assert kinds == ["rollout"]
            (summary,) = (s for s in spans if s.attributes.get(c.ROLLOUT_ID) == rollout_id)
            assert summary.attributes[c.ROLLOUT_DETAIL] is False
            assert summary.attributes[c.ROLLOUT_REPEAT] == n and summary.attributes[c.TASK_ID] == task
    assert check_trace(spans) == []


def test_a_vector_env_sampled_at_a_tenth_reads_back_every_sub_episodes_return() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from gymtrace._scopes.tracing import pop_provider, push_provider
    from gymtrace._sdk.setup import make_id_generator
    from gymtrace.sampling import RolloutSampler, keep_rollout

    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=RolloutSampler(0.1), id_generator=make_id_generator())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    env = TraceEnv(
        gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 3), rollout_id=lambda n: f"v-{n}"
    )
    push_provider(provider)
    try:
        returns = drive_vector(env, 400, seed=3)
        env.close()
    finally:
        pop_provider(provider)
    spans = exporter.get_finished_spans()
    outcomes = final_outcomes(spans)
    scored = [o for o in outcomes if o.outcome == "scored"]
    # Every ended sub-episode's return, whether its rollout was kept whole or summed up.
    assert sorted(o.reward for o in scored) == sorted(r for sub in returns for r in sub)
    assert {o.rollout_id for o in outcomes if o.detail} == {
        o.rollout_id for o in outcomes if keep_rollout(o.rollout_id, 0.1)
    }
    assert 0 < sum(o.detail for o in outcomes) < len(scored)
    # Nothing of a dropped rollout but its summary: no seed_session, episode or step span.
    dropped = {o.rollout_id for o in outcomes if not o.detail}
    assert {s.attributes[c.KIND] for s in spans if s.attributes.get(c.ROLLOUT_ID) in dropped} == {"rollout"}
    assert check_trace(spans) == []


# -- vector ------------------------------------------------------------------------------------------


def drive_vector(env: Any, steps: int, seed: int, split: bool = False) -> list[list[float]]:
    """Step a vector env with seeded random actions; per sub-environment, the returns of the
    episodes that ended, computed from what the env returned (independently of gymtrace)."""
    mode = env.metadata["autoreset_mode"].value
    num = env.num_envs
    env.reset(seed=seed)
    env.action_space.seed(seed)
    returns: list[list[float]] = [[] for _ in range(num)]
    running = [0.0] * num
    resetting = np.zeros(num, dtype=bool)
    for _ in range(steps):
        if split:  # AsyncVectorEnv's two halves, as code overlapping its own work calls them
            env.step_async(env.action_space.sample())
            _, rewards, terminated, truncated, _ = env.step_wait()
        else:
            _, rewards, terminated, truncated, _ = env.step(env.action_space.sample())
        for i in range(num):
            if mode == "NextStep" and resetting[i]:
                continue  # this step reset sub-environment i; its reward is not a step's
            running[i] += float(rewards[i])
            if terminated[i] or truncated[i]:
                returns[i].append(running[i])
                running[i] = 0.0
        resetting = terminated | truncated
    return returns


def assert_one_rollout_per_sub_episode(captured: CapturedSpans, returns: list[list[float]]) -> None:
    by_index: dict[int, list[tuple[int, float]]] = {}
    for root in captured.by_kind("rollout"):
        a = attrs(root)
        (episode,) = spans_of(captured, a[c.ROLLOUT_ID], "episode")
        if a[c.ROLLOUT_OUTCOME] == "scored":
            by_index.setdefault(attrs(episode)[c.ENV_INDEX], []).append((a[c.ROLLOUT_REPEAT], a[c.REWARD]))
        else:  # the episode still running when the env closed
            assert attrs(episode)[c.EPISODE_OUTCOME] == "cancelled"
        # No cross-talk: every span of the trace has this rollout's identity and sub-environment.
        for span in captured.spans:
            if span.context.trace_id == root.context.trace_id:
                assert attrs(span)[c.ROLLOUT_ID] == a[c.ROLLOUT_ID]
                if attrs(span)[c.KIND] in ("episode",):
                    assert attrs(span)[c.ENV_INDEX] == attrs(episode)[c.ENV_INDEX]
    for index, expected in enumerate(returns):
        assert [reward for _, reward in sorted(by_index.get(index, []))] == expected
    assert check_trace(captured) == []


def test_sync_vector_cartpole_next_step_autoreset_one_rollout_per_sub_episode(
    captured: CapturedSpans,
) -> None:
    env = TraceEnv(gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 3))
    returns = drive_vector(env, 120, seed=5)
    env.close()
    assert sum(len(r) for r in returns) >= 6
    assert_one_rollout_per_sub_episode(captured, returns)
    assert {attrs(s)[c.TASK_ID] for s in captured.by_kind("rollout")} == {"CartPole-v1"}
    # Every episode opened by an autoreset has its seed_session.
    assert len(captured.by_kind("seed_session")) == len(captured.by_kind("episode"))


def test_sync_vector_frozenlake_same_step_autoreset(captured: CapturedSpans) -> None:
    env = TraceEnv(
        gym.vector.SyncVectorEnv(
            [lambda: gym.make("FrozenLake-v1", is_slippery=True)] * 2, autoreset_mode="SameStep"
        ),
        steps="all",
    )
    returns = drive_vector(env, 80, seed=2)
    env.close()
    assert sum(len(r) for r in returns) >= 4
    assert_one_rollout_per_sub_episode(captured, returns)
    for episode in captured.by_kind("episode"):
        a = attrs(episode)
        numbers = sorted(attrs(s)[c.STEP_NUMBER] for s in spans_of(captured, a[c.ROLLOUT_ID], "step"))
        assert numbers == list(range(1, a[c.STEPS_COUNT] + 1))


@pytest.mark.parametrize("split", [False, True], ids=["step", "step_async-step_wait"])
def test_async_vector_cartpole_traces_from_the_driver(captured: CapturedSpans, split: bool) -> None:
    env = TraceEnv(gym.vector.AsyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2))
    try:
        returns = drive_vector(env, 60, seed=9, split=split)
    finally:
        env.close()
    assert sum(len(r) for r in returns) >= 2
    assert_one_rollout_per_sub_episode(captured, returns)


def test_disabled_autoreset_follows_the_reset_mask(captured: CapturedSpans) -> None:
    makers = [lambda: gym.make("CartPole-v1", max_episode_steps=2), lambda: gym.make("CartPole-v1")]
    env = TraceEnv(
        gym.vector.SyncVectorEnv(makers, autoreset_mode="Disabled"), rollout_id=lambda n: f"masked-{n}"
    )
    env.reset(seed=0)
    for _ in range(2):
        env.step(np.array([0, 1]))  # sub-environment 0 reaches its time limit
    env.reset(options={"reset_mask": np.array([True, False])})  # resets only 0
    env.step(np.array([1, 0]))
    env.close()

    found = rollouts(captured)
    outcomes = [found[f"masked-{n}"][c.ROLLOUT_OUTCOME] for n in range(3)]
    assert outcomes == ["scored", "unscored", "unscored"]  # 1 and 2 were still running at close()
    assert found["masked-0"][c.REWARD] == 2.0
    indices = {attrs(e)[c.ROLLOUT_ID]: attrs(e)[c.ENV_INDEX] for e in captured.by_kind("episode")}
    assert indices == {"masked-0": 0, "masked-1": 1, "masked-2": 0}
    assert check_trace(captured) == []


def test_a_vector_env_inside_a_rollout_is_left_untraced(
    captured: CapturedSpans, caplog: pytest.LogCaptureFixture
) -> None:
    env = TraceEnv(gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2))
    with gymtrace.rollout(rollout_id="outer"):
        env.reset(seed=0)
        env.step(env.action_space.sample())
    env.close()
    assert [attrs(s)[c.ROLLOUT_ID] for s in captured.by_kind("rollout")] == ["outer"]
    assert "not traced" in caplog.text


def test_readme_tree_is_what_trace_env_writes(captured: CapturedSpans) -> None:
    from readme_tree import check_readme_tree, excerpt

    env = TraceEnv(gym.make("CartPole-v1"), rollout_id=lambda n: f"cartpole-{n}")
    play(env, seed=0)
    play(env, seed=1)
    assert check_trace(captured) == []
    check_readme_tree("gymnasium", excerpt(captured.spans))
