"""Trace Gymnasium environments: ``TraceEnv(env)`` turns episodes into gym rollouts.

Example::

    import gymnasium as gym
    import gymtrace
    from gymtrace.integrations.gymnasium import TraceEnv

    gymtrace.configure(service_name="cartpole")
    env = TraceEnv(gym.make("CartPole-v1"))
    obs, info = env.reset(seed=0)          # opens rollout > episode, the reset is its seed_session
    while True:
        obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        if terminated or truncated:        # the episode return becomes the reward at verify
            break

What each call records:

- ``reset()`` opens an episode whose ``gym.seed_session`` span covers the reset. Inside an open
  ``gymtrace.rollout()`` scope it is the next episode (attempt) of that rollout (after an episode
  of it completed, a second sample in one rollout: said at the reset, raised in strict mode);
  otherwise every reset opens its own rollout, with ``rollout_id`` from the callable given (called
  with the wrapper's episode index 0, 1, 2...) or generated (``{env id}-{8 hex}-{index}``),
  ``task_id`` the environment's ID (``CartPole-v1``) unless given, and ``repeat`` the episode
  index. A reset while an episode is still open ends that episode ``cancelled`` (unscored). A
  ``gymnasium.wrappers.TimeLimit`` wrapped around TraceEnv is found from the ``reset()`` call that
  came through it, and its truncation completes the episode as if the environment had said it.
  Inside an open
  ``gymtrace.episode()`` (the harness's own) the environment is not traced (logged once): TraceEnv
  opens the episode itself.
- ``step()`` counts a step. ``terminated`` or ``truncated`` (a ``TimeLimit`` too) completes the
  episode: a ``gym.verify`` span records the episode return as the reward. An exception in the
  environment's ``step`` fails the episode (``gym.failure.kind=error``, the rollout unscored) and
  is re-raised unchanged.
- Steps follow the step policy, visible on the episode span as ``gym.steps.policy``. ``"aggregate"``
  (for simulators whose steps take microseconds): the first ``first`` steps, the ``slowest``
  slowest of the others (written when the episode ends, with their true times), every step of a
  sampled share ``episode_share`` of episodes (those say ``"all"``) and every step that raised are
  ``gym.step`` spans, each saying why in ``gym.step.kept``; every step is counted in
  ``gym.steps.count`` with the duration statistics ``gym.steps.duration.{total,mean,min,max}_ms``
  and ``gym.steps.slowest.number``, and the parameters are ``gym.steps.policy.{first,slowest,
  episode_share}``, as gymtrace's own step engine writes them. ``"all"``: every step is a span
  (for environments whose steps take milliseconds, e.g. an LLM agent loop). The policy is the
  ``steps`` argument (a name or a ``gymtrace.StepPolicy``); without it, the one
  ``configure(step_policy=...)`` or ``GYMTRACE_STEP_POLICY`` chose (an aggregate one with its
  parameters); without either, ``"aggregate"`` with ``first=1`` (:data:`DEFAULT_SAMPLE_FIRST`),
  no slowest steps (:data:`DEFAULT_SAMPLE_SLOWEST`) and no sampled share, each replaced by a
  ``GYMTRACE_STEP_FIRST``/``_SLOWEST``/``_EPISODE_SHARE`` variable that is set. ``sample_first``
  wins over any ``first``. The wrapper counts and samples its steps itself, under any global policy.
- A vector environment (``SyncVectorEnv``, ``AsyncVectorEnv``, any ``gymnasium.vector.VectorEnv``)
  gets one rollout per sub-environment episode, each in its own context, so identities never mix;
  the sub-environment index is ``gym.env.index``. Every autoreset mode is followed: ``NextStep``
  (the sub-environment's next episode, seed_session included, starts in the step that resets it),
  ``SameStep`` (it starts at once) and ``Disabled`` (at ``reset(options={"reset_mask": ...})``). A
  vector step's duration counts for each sub-environment stepped. A vector environment always
  opens its own rollouts: inside a ``gymtrace.rollout()`` scope it is not traced (logged).

``copy.copy``, ``copy.deepcopy`` and pickling give a TraceEnv with the same arguments around the
environment's copy: it traces episodes of its own (none open, its own generated rollout IDs).

The episode's spans live in a context of their own, held by the wrapper between calls: spans the
environment itself opens inside ``reset``/``step`` nest under the episode, but code between two
``step()`` calls runs in the caller's context. ``AsyncVectorEnv``'s ``step_async``/``step_wait``

The package, by role: :mod:`.env` (``TraceEnv``), :mod:`.episodes` (an open episode and its step
policy), :mod:`.surroundings` (what is read around the environment) and :mod:`.vector` (vector
environments).
"""

from __future__ import annotations

from gymtrace.instrumentation import STEP_POLICIES as POLICIES  # noqa: F401 - importable here as before the split
from gymtrace.integrations.gymnasium.env import TraceEnv
from gymtrace.integrations.gymnasium.episodes import DEFAULT_SAMPLE_FIRST, DEFAULT_SAMPLE_SLOWEST
from gymtrace.integrations.gymnasium.vector import _TraceVectorEnv  # noqa: F401 - registers it on TraceEnv

__all__ = ["DEFAULT_SAMPLE_FIRST", "DEFAULT_SAMPLE_SLOWEST", "TraceEnv"]
