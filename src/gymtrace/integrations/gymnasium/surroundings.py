"""What TraceEnv reads around the environment it wraps: its registered ID, the gym scope a reset
runs in (a harness's own episode, a rollout whose episode completed) and the ``TimeLimit`` wrappers
around it, whose truncation completes the episode.

Separate from the wrapper: these are the rules of who owns an episode, read once per reset.
"""

from __future__ import annotations

from typing import Any

import gymtrace
from gymtrace import attributes as c
from gymtrace.instrumentation import (
    misuse,
    warn_once,
)


def _env_id(env: Any) -> str:
    """The registered ID (``CartPole-v1``) of an environment or of a vector environment's
    sub-environments; the class name when it was not made by ``gymnasium.make``."""
    spec = getattr(env, "spec", None)
    if getattr(spec, "id", None) is None:
        subs = getattr(env, "envs", None)  # SyncVectorEnv
        if subs:
            spec = getattr(subs[0], "spec", None)
        elif callable(getattr(env, "get_attr", None)):  # AsyncVectorEnv: asks the workers once
            try:
                spec = env.get_attr("spec")[0]
            except Exception:  # noqa: BLE001 - a worker that cannot answer: the class name will do
                spec = None
    env_id = getattr(spec, "id", None)
    return str(env_id) if env_id else type(getattr(env, "unwrapped", env)).__name__


def _warn_inside_episode() -> None:
    warn_once(
        ("gymtrace.integrations.gymnasium", "episode"),
        "TraceEnv.reset() inside an open gymtrace.episode(): TraceEnv opens the episode"
        " itself (use it inside a rollout or no scope); this environment's episodes are not traced",
    )


def _outer_time_limits(env: Any, caller: Any) -> tuple[Any, ...]:
    """The ``gymnasium.wrappers.TimeLimit`` wrappers around ``env`` (a TraceEnv), found from the
    frames of the ``reset()`` call that reached it (``caller``: the frame that called it). A
    wrapper around TraceEnv calls it from its own method, so each frame whose ``self`` wraps the
    one below it is one more wrapper; the first frame that is none is the user's code."""
    from gymnasium import Wrapper
    from gymnasium.wrappers import TimeLimit

    found: list[Any] = []
    inner, frame = env, caller
    while frame is not None:
        code = frame.f_code
        if code.co_name != "reset" or code.co_varnames[:1] != ("self",):
            # Not a wrapper's reset(): the user's code. Its f_locals is never read (before Python
            # 3.13 reading it keeps a copy of every local alive as long as the frame runs).
            break
        owner = frame.f_locals.get("self")
        if owner is inner and inner is not env:
            frame = frame.f_back  # the same wrapper, one more of its methods (super().reset)
            continue
        if not isinstance(owner, Wrapper) or getattr(owner, "env", None) is not inner:
            break
        if isinstance(owner, TimeLimit):
            if isinstance(getattr(owner, "_elapsed_steps", None), int) and isinstance(
                getattr(owner, "_max_episode_steps", None), int
            ):
                found.append(owner)
            else:
                _warn_time_limit_outside()
        inner, frame = owner, frame.f_back
    return tuple(found)


def _truncated_outside(limits: tuple[Any, ...]) -> bool:
    """Whether a TimeLimit around the TraceEnv truncates the step now returning to it: it counts
    the step after TraceEnv returns, and truncates at ``max_episode_steps`` (gymnasium's rule)."""
    return any(limit._elapsed_steps + 1 >= limit._max_episode_steps for limit in limits)


def _warn_time_limit_outside() -> None:
    warn_once(
        ("gymtrace.integrations.gymnasium", "time limit outside"),
        "a gymnasium TimeLimit wraps TraceEnv and its step count cannot be read, so TraceEnv cannot"
        " see it truncate: those episodes end cancelled (unscored) at the next reset(). Fix: wrap"
        " TraceEnv around the TimeLimit, TraceEnv(TimeLimit(env, max_episode_steps=n)), or"
        " gym.make(..., max_episode_steps=n) inside TraceEnv",
    )


def _reset_after_completed(rollout: gymtrace.ActiveScope) -> None:
    """``reset()`` in the user's rollout whose last episode completed: a second sample in one
    rollout, which gets one reward (its final episode's). Said now (strict mode: raised)."""
    last = rollout.last_episode
    if last is None or not last.ended or last.failure is not None or last.cancelled:
        return  # the first episode, or a retry after one that failed or was cut short
    misuse(
        f"TraceEnv.reset() in rollout {rollout.identity.get(c.ROLLOUT_ID)!r} after its episode"
        f" (attempt {last.attempt}) completed: a rollout gets one reward, its final episode's, and"
        " its episodes are retries, so this episode's return replaces that one's. Fix: open one"
        " gymtrace.rollout() per reset() (a rollout is one sample), or use TraceEnv outside any"
        " rollout, where every reset() opens a rollout of its own"
    )


def _recording(frame: gymtrace.ActiveScope) -> bool:
    return frame.span.is_recording()


def _sampled_out(frame: gymtrace.ActiveScope) -> bool:
    """Its span records nothing, yet a tracer gave it IDs: a sampler dropped it (tracing off gives
    no IDs). Its rollout still leaves a summary span, so the episode's return is still wanted."""
    return frame.span.get_span_context().is_valid
