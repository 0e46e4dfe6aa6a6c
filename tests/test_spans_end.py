"""Every span gymtrace opens ends, and ends the right activation: wrappers dropped mid-episode end
theirs marked interrupted, and an exit in another thread never ends another thread's span
(issue 25)."""

from __future__ import annotations

import contextlib
import contextvars
import gc
import logging
import threading

import gymnasium as gym
import pytest

import gymtrace
from gymtrace import attributes as c
from gymtrace.integrations.gymnasium import TraceEnv
from gymtrace.testing import capture_spans, check_trace


def test_a_traceenv_dropped_mid_episode_ends_its_episode_interrupted_and_its_rollout_unscored() -> None:
    with capture_spans() as captured:
        env = TraceEnv(gym.make("CartPole-v1"))
        env.reset(seed=0)
        for _ in range(3):
            env.step(0)
        del env  # never closed
        gc.collect()
        episode = captured.one(c.KIND_EPISODE)
    assert episode.attributes[c.INTERRUPTED] is True
    assert episode.attributes[c.EPISODE_OUTCOME] == c.OUTCOME_CANCELLED
    assert captured.one(c.KIND_ROLLOUT).attributes[c.ROLLOUT_OUTCOME] == c.OUTCOME_UNSCORED
    assert check_trace(captured) == []


def test_traceenv_inside_a_users_rollout_warns_that_only_the_last_return_counts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = TraceEnv(gym.make("CartPole-v1"))
    with capture_spans(strict=False) as captured, caplog.at_level(logging.WARNING, "gymtrace"):
        with gymtrace.rollout(rollout_id="r-three"):
            for seed in range(3):
                env.reset(seed=seed)
                while True:
                    _, _, terminated, truncated, _ = env.step(env.action_space.sample())
                    if terminated or truncated:
                        break
    said = [r.getMessage() for r in caplog.records if "r-three" in r.getMessage()]
    # Each reset after a completed episode is said when it happens (issue 31), with the fix...
    at_reset = [m for m in said if m.startswith("gymtrace: TraceEnv.reset() in rollout 'r-three'")]
    assert len(at_reset) == 2 and all("one gymtrace.rollout() per reset()" in m for m in at_reset)
    # ... and what the rule threw away, when the rollout span was written.
    (warning,) = [m for m in said if m not in at_reset]
    assert "scored by its final attempt only" in warning and "Fix:" in warning
    # What check finds afterwards was said when it was recorded.
    assert any("3 episodes carry a reward" in p for p in check_trace(captured))


def test_a_shared_episode_exited_in_another_thread_never_ends_another_threads_span() -> None:
    shared = gymtrace.episode()  # one object, entered by two threads through ExitStacks
    frames: dict[str, gymtrace.ActiveScope] = {}
    stacks: dict[str, contextlib.ExitStack] = {}
    entered = threading.Barrier(2)
    with capture_spans(strict=False), gymtrace.rollout(rollout_id="r-shared"):
        context = contextvars.copy_context()

        def worker(name: str) -> None:
            stack = stacks[name] = contextlib.ExitStack()
            frames[name] = stack.enter_context(shared)
            entered.wait()

        threads = [threading.Thread(target=context.copy().run, args=(worker, n)) for n in "AB"]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # The main thread closes A's stack: it entered neither, so it must not end B's episode
        # (before issue 25 it ended B's, the one opened last); both end when their threads exit
        # them, or as interrupted at exit.
        stacks["A"].close()
        assert not frames["B"].ended and not frames["A"].ended
        assert frames["A"] is not frames["B"]


def test_a_ray_generator_tasks_context_is_attached_only_while_its_body_runs() -> None:
    # The wrapper instrument() puts around a generator task, driven as Ray drives it: the consumer
    # between items must stay in its own context.
    import os

    from opentelemetry import trace

    from gymtrace import propagation
    from gymtrace.integrations import ray as gym_ray

    def chunks(n: int):  # type: ignore[no-untyped-def]
        for i in range(n):
            assert gymtrace.current().rollout_id == "r-gen"  # the body runs in the caller's episode
            yield i

    traced = gym_ray._traced(chunks, "chunks")
    with capture_spans() as captured:
        with gymtrace.rollout(rollout_id="r-gen"), gymtrace.episode():
            payload = {
                "headers": dict(
                    propagation.inject({}, destination=propagation.GYM_INTERNAL, continuation=True)
                ),
                "pid": os.getpid(),
            }
        items = []
        for item in traced(3, _gymtrace=payload):
            items.append(item)
            # Between items: nothing of the task's execution is current here.
            assert gymtrace.current_scope() is None
            assert not trace.get_current_span().get_span_context().is_valid
        with gymtrace.rollout(rollout_id="r-later") as later:
            pass
    assert items == [0, 1, 2]
    # The later, unrelated rollout is a root of its own trace, not a child of the generator's episode.
    (root,) = [s for s in captured.by_kind(c.KIND_ROLLOUT) if s.attributes[c.ROLLOUT_ID] == "r-later"]
    assert root.parent is None
    assert later.identity == {c.ROLLOUT_ID: "r-later"}
