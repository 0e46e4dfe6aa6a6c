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
called directly are traced as one step, from ``step_async`` to ``step_wait``.
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import dataclasses
import heapq
import itertools
import os
import random
import sys
import time
import uuid
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import wrapt
from opentelemetry import trace

import gymtrace
from gymtrace import StepPolicy
from gymtrace import attributes as c
from gymtrace.instrumentation import STEP_POLICIES as POLICIES
from gymtrace.instrumentation import STEPS_OWNED_ELSEWHERE as OWNED_ELSEWHERE
from gymtrace.instrumentation import (
    bind_tracer_provider,
    check_tracer_provider,
    misuse,
    report_error,
    rollout_sampled_out,
    warn_once,
    write_step,
)
from gymtrace.instrumentation import chosen_step_parameters as given_parameters
from gymtrace.instrumentation import step_policy_attributes as policy_attributes
from gymtrace.instrumentation import step_policy_inputs as policy_inputs
from gymtrace.instrumentation import step_statistics_attributes as statistics_attributes

__all__ = ["DEFAULT_SAMPLE_FIRST", "DEFAULT_SAMPLE_SLOWEST", "TraceEnv"]


DEFAULT_SAMPLE_FIRST = 1
"""Steps of each episode recorded as spans under the ``aggregate`` policy (then only failures).

Measured (``benchmarks/gymnasium_steps.py``, random-action CartPole, file exporter): the first
step's span is ~11 µs of CPU of an episode's ~149 µs traced. It shows a step's shape (and what the
environment does inside it); ``0`` keeps only the aggregates."""

DEFAULT_SAMPLE_SLOWEST = 0
"""The slowest steps of each episode written as spans under the integration's own default policy.

0: each would cost ~10 µs of CPU on every episode (the same benchmark), while the episode span
already names the slowest step (``gym.steps.slowest.number``) and its duration. A policy chosen
with ``configure(step_policy=...)``/``GYMTRACE_STEP_POLICY``, or given as ``steps``, says how
many."""

# The integration's own policy, when neither the arguments nor configure() chose one.
_DEFAULT_POLICY = StepPolicy(
    c.STEPS_POLICY_AGGREGATE, first=DEFAULT_SAMPLE_FIRST, slowest=DEFAULT_SAMPLE_SLOWEST, episode_share=0.0
)

_perf_counter_ns = time.perf_counter_ns
_time_ns = time.time_ns
# A step number no episode reaches: under the "all" policy every step is below it. Also a
# duration no step reaches: with no slowest steps to keep, no step is slow enough.
_EVERY_STEP = sys.maxsize
# A private generator for the sampled share of episodes: RL code seeds the global one.
_random = random.Random(os.urandom(16))
os.register_at_fork(after_in_child=lambda: _random.seed(os.urandom(16)))


class _Policy:
    """The step policy of one episode, resolved from the arguments and the chosen policy."""

    __slots__ = ("aggregate", "every", "first", "share", "slowest")

    def __init__(self, aggregate: bool, first: int, slowest: int, share: float) -> None:
        self.aggregate = aggregate  # False: every step of every episode is a span ("all")
        self.every = not aggregate or share >= 1.0
        self.first = first
        self.slowest = slowest
        self.share = share

    def episode_attributes(self, every: bool) -> dict[str, Any]:
        """What the episode span says of its policy, as gymtrace's own engine says it (an episode
        of the sampled share says "all"); under "all" there are no parameters to say."""
        if not self.aggregate:
            return {c.STEPS_POLICY: c.STEPS_POLICY_ALL}
        return policy_attributes(every, self.first, self.slowest, self.share)


class _Open:
    """One open episode (and the rollout the wrapper opened for it), held outside any ``with``,
    with the step policy's state: which steps become spans, and the aggregate of all of them.

    ``Scope.__enter__``/``__exit__`` keep their state in the context they ran in, so every call on
    these scopes goes through ``context.run``. The statistics are plain slots in integer
    nanoseconds: an unsampled step must cost a small fraction of a CartPole step (~8 µs). Steps
    are timed with ``perf_counter_ns``; :func:`_epoch_offset`, taken when a span is written after
    the fact, turns those times into its epoch nanoseconds.
    """

    __slots__ = (
        "context",
        "count",
        "env_step",
        "episode",
        "errors",
        "floor",
        "frame",
        "keep",
        "limit",
        "limits",
        "max_ns",
        "min_ns",
        "reward",
        "rollout",
        "run",
        "sampled",
        "scopes",
        "slow",
        "slowest",
        "total_ns",
    )

    def __init__(
        self,
        context: contextvars.Context,
        rollout: gymtrace.Scope | None,
        episode: gymtrace.Scope,
        frame: gymtrace.ActiveScope,
        every: bool,
        policy: _Policy,
        env_step: Any,
    ) -> None:
        self.context = context
        self.run = context.run
        self.env_step = env_step  # the wrapped environment's bound step (scalar environments)
        # The gymnasium TimeLimit wrappers around the TraceEnv (see _outer_time_limits): their
        # truncation ends the episode as if the environment had said it. Empty: none.
        self.limits: tuple[Any, ...] = ()
        self.rollout = rollout
        self.episode = episode
        self.frame = frame
        # Steps numbered up to ``limit`` become spans, marked as the first ones when sampled.
        self.limit = _EVERY_STEP if every else policy.first
        self.scopes = _STEP_SCOPES if every else _FIRST_STEP_SCOPES
        # The ``keep`` slowest of the other steps become spans when the episode ends: a min-heap
        # of (duration, number, start), entered by a step slower than ``floor``.
        self.keep = 0 if every else policy.slowest
        self.floor = -1 if self.keep else _EVERY_STEP
        self.slow: list[tuple[int, int, int]] = []
        self.reward = 0.0
        self.count = 0
        self.sampled = 0
        self.errors = 0
        self.total_ns = 0
        self.min_ns = _EVERY_STEP
        self.max_ns = -1
        self.slowest = 0

    def add(self, number: int, ns: int) -> None:
        """Count step ``number`` that took ``ns``."""
        self.count = number
        self.total_ns += ns
        if ns > self.max_ns:
            self.max_ns = ns
            self.slowest = number
        if ns < self.min_ns:
            self.min_ns = ns

    def add_span(self, number: int, ns: int, exc: BaseException | None = None) -> None:
        """Count step ``number``, a span, that took ``ns`` and raised ``exc`` (if not None)."""
        self.add(number, ns)
        self.sampled += 1
        if isinstance(exc, Exception):
            self.errors += 1

    def slower(self, number: int, start: int, ns: int) -> None:
        """Step ``number`` (no span) is among the slowest so far: keep it, dropping the fastest."""
        slow = self.slow
        if len(slow) < self.keep:
            heapq.heappush(slow, (ns, number, start))
            if len(slow) < self.keep:
                return
        else:
            heapq.heapreplace(slow, (ns, number, start))
        self.floor = slow[0][0]

    def write_slowest(self) -> None:
        """The slowest steps kept, as spans under the episode in the order they ran."""
        frame, offset = self.frame, _epoch_offset()
        slow, self.slow = sorted(self.slow, key=lambda entry: entry[2]), []
        for ns, number, start in slow:
            start += offset
            if write_step(frame.context, frame.identity, number, start, start + ns, c.STEP_KEPT_SLOWEST):
                self.sampled += 1

    def attributes(self) -> dict[str, Any]:
        """The statistics set when the episode ends (the policy was set when it started)."""
        return statistics_attributes(
            self.count, self.sampled, self.errors, self.total_ns, self.min_ns, self.max_ns, self.slowest
        )


def _end_abandoned(live: set[_Open]) -> None:
    """The wrapper was collected (or the process is exiting) with episodes open: end each as
    cancelled, marked interrupted. Never raises: it runs in a finalizer."""
    while live:
        ep = live.pop()
        try:
            ep.frame.span.set_attribute(c.INTERRUPTED, True)
            ep.context.run(
                TraceEnv._self_end_in,
                ep,
                asyncio.CancelledError("TraceEnv dropped mid-episode without close()"),
            )
        except Exception as error:  # noqa: BLE001 - a finalizer must not raise
            report_error(
                "gymtrace.integrations.gymnasium ending an abandoned episode", error, may_raise=False
            )


def _epoch_offset() -> int:
    """What turns a ``perf_counter_ns`` time into ``time_ns`` (epoch) nanoseconds, now: the two
    clocks run at the same rate, so a step timed earlier in the episode maps through it too."""
    return _time_ns() - _perf_counter_ns()


def _exit(scope: gymtrace.Scope, exc: BaseException | None) -> None:
    if exc is None:
        scope.__exit__(None, None, None)
    else:
        scope.__exit__(type(exc), exc, exc.__traceback__)


# Scopes without per-episode arguments, made once: a Scope is reusable (as a decorator's is).
_VERIFY = gymtrace.verify()


def _new_step_scope(number: int, first: bool) -> gymtrace.Scope:
    """``gymtrace.step(number=number)``: of a step that is a span because every step is, or (``first``)
    because it is among the first sampled (``gym.step.kept``, as gymtrace's engine marks it)."""
    if first:
        return gymtrace.step(number=number, attributes={c.STEP_KEPT: c.STEP_KEPT_FIRST})
    return gymtrace.step(number=number)


# The first step numbers' scopes, made once.
_STEP_SCOPES = tuple(_new_step_scope(number, first=False) for number in range(1, 65))
_FIRST_STEP_SCOPES = tuple(_new_step_scope(number, first=True) for number in range(1, 65))


def _step_scope(ep: _Open, number: int) -> gymtrace.Scope:
    """The scope of step ``number`` of ``ep``, a span."""
    scopes = ep.scopes
    if number <= len(scopes):
        return scopes[number - 1]
    return _new_step_scope(number, first=scopes is _FIRST_STEP_SCOPES)


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


class TraceEnv(wrapt.ObjectProxy):  # type: ignore[type-arg]  # proxies any environment
    """A transparent proxy of a Gymnasium ``Env`` or ``VectorEnv`` that traces its episodes.

    ``rollout_id``: a callable of the wrapper's episode index (0, 1, ...) returning the rollout ID;
    default ``{env id}-{8 hex}-{index}``. ``task_id``: default the environment's ID.
    ``steps``: ``"aggregate"``, ``"all"`` or a :class:`gymtrace.StepPolicy`; ``sample_first``: the
    first steps of each episode recorded as spans under ``"aggregate"``. When not given, both come
    from the step policy ``configure()`` or ``GYMTRACE_STEP_POLICY`` chose, else ``"aggregate"``
    with :data:`DEFAULT_SAMPLE_FIRST` and :data:`DEFAULT_SAMPLE_SLOWEST` unless a
    ``GYMTRACE_STEP_*`` variable says otherwise.
    Everything else (attributes, ``isinstance``, other wrappers around it) behaves as the wrapped
    environment.
    """

    def __new__(cls, env: Any, *args: Any, **kwargs: Any) -> Any:
        if cls is TraceEnv:
            from gymnasium.vector import VectorEnv

            if isinstance(env, VectorEnv):
                cls = _TraceVectorEnv
        return super().__new__(cls)

    def __init__(
        self,
        env: Any,
        *,
        rollout_id: Callable[[int], str] | None = None,
        task_id: str | None = None,
        steps: str | StepPolicy | None = None,
        sample_first: int | None = None,
        tracer_provider: trace.TracerProvider | None = None,
    ) -> None:
        import gymnasium
        from gymnasium.vector import VectorEnv

        if not isinstance(env, (gymnasium.Env, VectorEnv)):
            raise TypeError(
                f"TraceEnv(env): argument 'env' must be a gymnasium.Env or gymnasium.vector.VectorEnv,"
                f" got {type(env).__name__}"
            )
        if rollout_id is not None and not callable(rollout_id):
            raise TypeError(
                "TraceEnv(): argument 'rollout_id' must be a callable of the episode index returning"
                f" a string, got {type(rollout_id).__name__}"
            )
        if task_id is not None and (not isinstance(task_id, str) or not task_id):
            raise TypeError(f"TraceEnv(): argument 'task_id' must be a non-empty string, got {task_id!r:.60}")
        if steps is not None and not isinstance(steps, StepPolicy) and steps not in POLICIES:
            raise ValueError(
                f"TraceEnv(): argument 'steps' must be {c.STEPS_POLICY_AGGREGATE!r},"
                f" {c.STEPS_POLICY_ALL!r} or a gymtrace.StepPolicy, got {steps!r:.60}"
            )
        if sample_first is not None and (
            isinstance(sample_first, bool) or not isinstance(sample_first, int) or sample_first < 0
        ):
            raise ValueError(
                f"TraceEnv(): argument 'sample_first' must be an int >= 0, got {sample_first!r:.60}"
            )
        check_tracer_provider(tracer_provider, "TraceEnv()")
        super().__init__(env)
        # Where this environment's spans go (None: the global provider). Kept out of the arguments
        # a pickle carries: a provider cannot cross one, and the unpickled copy uses the global one.
        self._self_tracer_provider = tracer_provider
        # As given, for a copy (copy, deepcopy, pickle): a copy is a new TraceEnv of a copy of env.
        self._self_arguments: dict[str, Any] = {
            "rollout_id": rollout_id,
            "task_id": task_id,
            "steps": steps,
            "sample_first": sample_first,
        }
        self._self_env_id = _env_id(env)
        self._self_task_id = task_id or self._self_env_id
        self._self_rollout_id = rollout_id
        self._self_prefix = f"{self._self_env_id}-{uuid.uuid4().hex[:8]}"
        self._self_counter = itertools.count()
        # None: not given, the chosen step policy or the integration's default decides per episode.
        self._self_steps = steps
        self._self_first = sample_first
        # (the chosen policy it was resolved under, the episodes' policy): see _self_policy.
        self._self_resolved: tuple[tuple[Any, Any], _Policy] | None = None
        self._self_open: _Open | None = None
        # By sub-environment index and whether every step is a span, under the current policy.
        self._self_episodes: dict[tuple[int | None, bool], gymtrace.Scope] = {}
        # The episodes open now. A wrapper dropped mid-episode without close() ends them,
        # interrupted, when it is collected or the process exits: no span stays open (issue 25).
        self._self_live: set[_Open] = set()
        weakref.finalize(self, _end_abandoned, self._self_live)

    # -- opening and ending episodes ----------------------------------------------------------------

    def _self_new_rollout_id(self, n: int) -> str:
        if self._self_rollout_id is None:
            return f"{self._self_prefix}-{n}"
        value = self._self_rollout_id(n)  # a bug here is the caller's: it propagates, nothing is open yet
        if not isinstance(value, str) or not value:
            raise TypeError(
                f"TraceEnv(): argument 'rollout_id' returned {value!r:.60} for episode {n}; it must"
                " return a non-empty string"
            )
        return value

    def _self_open_episode(self, index: int | None, own_rollout: bool) -> _Open | None:
        """Open rollout (when ``own_rollout``) and episode in a copy of the caller's context."""
        n = next(self._self_counter)
        rollout_id = self._self_new_rollout_id(n) if own_rollout else None
        if rollout_id is not None and rollout_sampled_out(rollout_id, self._self_task_id):
            # Sampled out by the rollout sampler, which decides by the ID alone: the episode passes
            # through untraced, as it would after opening the rollout's span only to find it dropped
            # (~8 µs an episode that nothing records).
            return None
        context = contextvars.copy_context()
        bind_tracer_provider(context, self._self_tracer_provider)
        ep = context.run(self._self_open_in, context, index, rollout_id, n)
        if ep is not None:
            self._self_live.add(ep)
        return ep

    def _self_open_in(
        self, context: contextvars.Context, index: int | None, rollout_id: str | None, n: int
    ) -> _Open | None:
        rollout: gymtrace.Scope | None = None
        if rollout_id is not None:
            rollout = gymtrace.rollout(rollout_id=rollout_id, task_id=self._self_task_id, repeat=n)
            if not _recording(rollout.__enter__()):
                _exit(rollout, None)  # tracing is off (or this rollout is sampled out): pass through
                return None
        policy = self._self_policy()
        every = policy.every or (policy.share > 0.0 and _random.random() < policy.share)
        key = (index, every)
        episode = self._self_episodes.get(key)
        if episode is None:
            # Made once per sub-environment and policy: validating the attributes is ~1.5 µs an
            # episode. The policy is known now: set at the start it is visible even on an episode
            # cut short, and costs nothing (an attribute set later is validated one by one).
            attributes: dict[str, Any] = {c.ENV_ID: self._self_env_id, **policy.episode_attributes(every)}
            if index is not None:
                attributes[c.ENV_INDEX] = index
            episode = self._self_episodes[key] = gymtrace.episode(attributes=attributes)
        frame = episode.__enter__()
        if not _recording(frame):
            _exit(episode, None)
            if rollout is not None:
                _exit(rollout, None)
            return None
        # Its steps are sampled and counted here: gymtrace's own step engine keeps its hands off.
        frame.step_stats = OWNED_ELSEWHERE
        env_step = self.__wrapped__.step if index is None else None
        return _Open(context, rollout, episode, frame, every, policy, env_step)

    def _self_policy(self) -> _Policy:
        """The step policy of the episode opening now. The ``steps`` argument decides, else the
        policy ``configure()`` or ``GYMTRACE_STEP_POLICY`` chose, else the integration's default
        with any parameter a ``GYMTRACE_STEP_*`` variable gave; ``sample_first`` wins over any of
        them. Resolved again only when what it depends on changed."""
        inputs = policy_inputs()
        cached = self._self_resolved
        if cached is not None and cached[0] == inputs:
            return cached[1]
        chosen = inputs[0]
        steps = self._self_steps
        if isinstance(steps, StepPolicy):
            base = steps
        else:
            # The parameters of a chosen policy that aggregates; a chosen "all" says nothing of
            # how to sample, so then the integration's own, with what the variables gave.
            if chosen is not None and chosen.aggregate:
                base = chosen
            else:
                base = dataclasses.replace(_DEFAULT_POLICY, **given_parameters())
            name = steps if steps is not None else chosen.policy if chosen is not None else base.policy
            if name != base.policy:
                base = dataclasses.replace(base, policy=name)
        first = base.first if self._self_first is None else self._self_first
        policy = _Policy(base.aggregate, first, base.slowest, base.episode_share)
        self._self_resolved = (inputs, policy)
        # Episode scopes of the policy before are not used again: at most two per sub-environment.
        self._self_episodes.clear()
        return policy

    def _self_end(self, ep: _Open, exc: BaseException | None) -> None:
        """End the episode: completed with its return as the reward, failed with ``exc``, or
        cancelled when ``exc`` is a ``CancelledError``. Never raises."""
        self._self_live.discard(ep)
        try:
            ep.context.run(self._self_end_in, ep, exc)
        except Exception as error:  # noqa: BLE001 - telemetry must not break the environment
            report_error("gymtrace.integrations.gymnasium ending an episode", error, may_raise=exc is None)

    @staticmethod
    def _self_end_in(ep: _Open, exc: BaseException | None) -> None:
        if ep.slow:
            ep.write_slowest()
        # One call for all the statistics: each set_attribute is validated and locked on its own.
        ep.frame.span.set_attributes(ep.attributes())
        if exc is None:
            verify = _VERIFY.__enter__()
            try:
                verify.record_reward(float(ep.reward))
            finally:
                _exit(_VERIFY, None)
        _exit(ep.episode, exc)
        if ep.rollout is not None:
            # A cancelled episode leaves its rollout unscored, not cancelled: nothing failed.
            _exit(ep.rollout, None if isinstance(exc, asyncio.CancelledError) else exc)

    def _self_failed_step(self, ep: _Open, number: int, start: int, end: int, exc: BaseException) -> None:
        """A step without a span raised: counted, and (an ``Exception``, not an interruption)
        written as a span with its true times and its exception, as gymtrace's engine does."""
        try:
            ep.add(number, end - start)
            if not isinstance(exc, Exception):
                return
            ep.errors += 1
            frame, offset = ep.frame, _epoch_offset()
            if ep.context.run(
                write_step,
                frame.context,
                frame.identity,
                number,
                start + offset,
                end + offset,
                c.STEP_KEPT_RAISED,
                exc,
            ):
                ep.sampled += 1
        except Exception as error:  # noqa: BLE001 - the step's own exception is on its way out
            report_error("gymtrace.integrations.gymnasium recording a failed step", error, may_raise=False)

    # -- the Env API ----------------------------------------------------------------------------------

    def reset(self, *, seed: Any = None, options: Any = None) -> Any:
        env = self.__wrapped__
        previous = self._self_open
        if previous is not None:
            self._self_open = None
            self._self_end(previous, asyncio.CancelledError("reset before the episode ended"))
        current = gymtrace.current_scope()
        if current is not None and current.nearest(c.KIND_EPISODE) is not None:
            # The harness opened the episode itself (and scores it): an episode inside it would
            # invert the hierarchy, so the environment runs untraced there.
            _warn_inside_episode()
            return env.reset(seed=seed, options=options)
        rollout = current.nearest(c.KIND_ROLLOUT) if current is not None else None
        if rollout is not None:
            _reset_after_completed(rollout)
        ep = self._self_open_episode(None, rollout is None)
        if ep is None:
            return env.reset(seed=seed, options=options)
        ep.limits = _outer_time_limits(self, sys._getframe(1))
        session = gymtrace.seed_session(attributes={c.ENV_SEED: seed} if isinstance(seed, int) else None)
        ep.context.run(session.__enter__)
        try:
            result = ep.context.run(env.reset, seed=seed, options=options)
        except BaseException as exc:
            ep.context.run(_exit, session, exc)
            self._self_end(ep, exc)
            raise
        ep.context.run(_exit, session, None)
        self._self_open = ep
        return result

    def step(self, action: Any) -> Any:
        ep = self._self_open
        if ep is None:  # no reset yet, tracing off, or the episode already ended
            return self.__wrapped__.step(action)
        number = ep.count + 1
        if number <= ep.limit:
            return self._self_step_span(ep, number, action)
        # The unsampled step, on every step of a simulator: timed in integer nanoseconds, counted.
        start = _perf_counter_ns()
        try:
            result = ep.run(ep.env_step, action)
        except BaseException as exc:
            self._self_open = None
            self._self_failed_step(ep, number, start, _perf_counter_ns(), exc)
            self._self_end(ep, exc)
            raise
        ns = _perf_counter_ns() - start
        # ep.add(number, ns), inline: this runs on every step of a simulator.
        ep.count = number
        ep.total_ns += ns
        if ns < ep.min_ns:
            ep.min_ns = ns
        if ns > ep.max_ns:
            ep.max_ns = ns
            ep.slowest = number
        if ns > ep.floor:  # never, unless the policy keeps the slowest steps
            ep.slower(number, start, ns)
        ep.reward += result[1]
        if result[2] or result[3] or (ep.limits and _truncated_outside(ep.limits)):
            self._self_open = None
            self._self_end(ep, None)
        return result

    def _self_step_span(self, ep: _Open, number: int, action: Any) -> Any:
        scope = _step_scope(ep, number)
        run = ep.run
        run(scope.__enter__)
        start = _perf_counter_ns()
        try:
            result = run(ep.env_step, action)
        except BaseException as exc:
            ep.add_span(number, _perf_counter_ns() - start, exc)
            run(_exit, scope, exc)
            self._self_open = None
            self._self_end(ep, exc)
            raise
        ep.add_span(number, _perf_counter_ns() - start)
        run(_exit, scope, None)
        ep.reward += result[1]
        if result[2] or result[3] or (ep.limits and _truncated_outside(ep.limits)):
            self._self_open = None
            self._self_end(ep, None)
        return result

    def close(self, *args: Any, **kwargs: Any) -> Any:
        self._self_cancel_all("environment closed before the episode ended")
        return self.__wrapped__.close(*args, **kwargs)

    def _self_cancel_all(self, why: str) -> None:
        ep, self._self_open = self._self_open, None
        if ep is not None:
            self._self_end(ep, asyncio.CancelledError(why))

    def __repr__(self) -> str:
        return f"<TraceEnv {self.__wrapped__!r}>"

    # A copy is what the environment's copy is, traced on its own: a TraceEnv with the same
    # arguments around a copy of the wrapped environment, with no open episode and rollout IDs of
    # its own. (wrapt's proxy refuses to be copied: it cannot know what a copy of a proxy means.)

    def __copy__(self) -> Any:
        return TraceEnv(
            copy.copy(self.__wrapped__), **self._self_arguments, tracer_provider=self._self_tracer_provider
        )

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return TraceEnv(
            copy.deepcopy(self.__wrapped__, memo),
            **self._self_arguments,
            tracer_provider=self._self_tracer_provider,
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuilt, (self.__wrapped__, self._self_arguments)

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        return self.__reduce__()


def _rebuilt(env: Any, arguments: dict[str, Any]) -> Any:
    """A pickled TraceEnv, unpickled: a new one around the unpickled environment."""
    return TraceEnv(env, **arguments)


class _Batch:
    """One vector step in flight: what ``step`` (or ``step_async``) opened before the call."""

    __slots__ = ("resetting", "sessions", "spans", "start", "stepped")

    def __init__(
        self,
        resetting: list[int],
        sessions: list[tuple[_Open, gymtrace.Scope]],
        stepped: list[int],
        spans: list[tuple[_Open, gymtrace.Scope]],
        start: int,
    ) -> None:
        self.resetting = resetting
        self.sessions = sessions
        self.stepped = stepped
        self.spans = spans
        self.start = start


class _TraceVectorEnv(TraceEnv):
    """``TraceEnv`` of a vector environment: one rollout per sub-environment episode."""

    def __init__(self, env: Any, **kwargs: Any) -> None:
        super().__init__(env, **kwargs)
        from gymnasium.vector import AutoresetMode

        mode = getattr(env, "autoreset_mode", None) or env.metadata.get("autoreset_mode")
        try:
            mode = AutoresetMode(mode) if mode is not None else AutoresetMode.NEXT_STEP
        except ValueError:
            mode = AutoresetMode.NEXT_STEP
        self._self_mode = mode.value
        self._self_num = int(env.num_envs)
        self._self_eps: list[_Open | None] = [None] * self._self_num
        # NextStep autoreset: sub-environments whose episode ended in the previous step, and which
        # the next step() therefore resets instead of stepping.
        self._self_pending: list[bool] = [False] * self._self_num
        self._self_traced = True
        self._self_batch: _Batch | None = None

    def _self_open_sub(self, index: int) -> _Open | None:
        try:
            return self._self_open_episode(index, own_rollout=True)
        except (TypeError, ValueError):
            raise  # the user's rollout_id callable
        except Exception as error:  # noqa: BLE001 - telemetry must not break the environment
            report_error("gymtrace.integrations.gymnasium opening an episode", error)
            return None

    def _self_sessions(self, indices: Sequence[int], seed: Any) -> list[tuple[_Open, gymtrace.Scope]]:
        sessions = []
        for index in indices:
            ep = self._self_eps[index]
            if ep is None:
                continue
            sub_seed = None
            if isinstance(seed, int):
                sub_seed = seed + index  # what the vector envs give each sub-environment
            elif isinstance(seed, (list, tuple)) and isinstance(seed[index], int):
                sub_seed = seed[index]
            session = gymtrace.seed_session(
                attributes={c.ENV_SEED: sub_seed} if sub_seed is not None else None
            )
            ep.context.run(session.__enter__)
            sessions.append((ep, session))
        return sessions

    def _self_fail_all(self, exc: BaseException, indices: Sequence[int]) -> None:
        for index in indices:
            ep, self._self_eps[index] = self._self_eps[index], None
            if ep is not None:
                self._self_end(ep, exc)

    def reset(self, *, seed: Any = None, options: Any = None) -> Any:
        env = self.__wrapped__
        mask = options.get("reset_mask") if isinstance(options, dict) else None
        indices = [i for i in range(self._self_num) if mask is None or bool(mask[i])]
        current = gymtrace.current_scope()
        if current is not None and current.nearest(c.KIND_ROLLOUT) is not None:
            if self._self_traced:
                warn_once(
                    ("gymtrace.integrations.gymnasium", "vector rollout", id(self)),
                    "TraceEnv of a vector environment opens one rollout per sub-environment"
                    " episode; inside gymtrace.rollout() it would nest rollouts, so it is not traced."
                    " Use it inside gymtrace.run() or no scope.",
                )
            self._self_traced = False
            self._self_cancel_all("environment reset inside a rollout")
            return env.reset(seed=seed, options=options)
        self._self_traced = True
        for index in indices:
            self._self_pending[index] = False
            ep, self._self_eps[index] = self._self_eps[index], None
            if ep is not None:
                self._self_end(ep, asyncio.CancelledError("reset before the episode ended"))
        for index in indices:
            self._self_eps[index] = self._self_open_sub(index)
        sessions = self._self_sessions(indices, seed)
        try:
            result = env.reset(seed=seed, options=options)
        except BaseException as exc:
            for ep, session in sessions:
                ep.context.run(_exit, session, exc)
            self._self_fail_all(exc, indices)
            raise
        for ep, session in sessions:
            ep.context.run(_exit, session, None)
        return result

    def step(self, actions: Any) -> Any:
        env = self.__wrapped__
        if not self._self_traced:
            return env.step(actions)
        batch = self._self_before_step()
        try:
            result = env.step(actions)
        except BaseException as exc:
            self._self_step_failed(batch, exc)
            raise
        self._self_after_step(batch, result)
        return result

    # AsyncVectorEnv's two halves of step(), for code that overlaps them with its own work.

    def step_async(self, actions: Any) -> None:
        env = self.__wrapped__
        if not self._self_traced:
            return env.step_async(actions)  # type: ignore[no-any-return]
        batch = self._self_before_step()
        try:
            env.step_async(actions)
        except BaseException as exc:
            self._self_step_failed(batch, exc)
            raise
        self._self_batch = batch
        return None

    def step_wait(self, *args: Any, **kwargs: Any) -> Any:
        env = self.__wrapped__
        batch, self._self_batch = getattr(self, "_self_batch", None), None
        if batch is None:
            return env.step_wait(*args, **kwargs)
        try:
            result = env.step_wait(*args, **kwargs)
        except BaseException as exc:
            self._self_step_failed(batch, exc)
            raise
        self._self_after_step(batch, result)
        return result

    def _self_before_step(self) -> _Batch:
        num = self._self_num
        eps = self._self_eps
        pending = self._self_pending
        # NextStep: the sub-environments that ended last step are reset by this call; their next
        # episode starts here with the reset as its seed_session.
        resetting = [i for i in range(num) if pending[i]]
        for index in resetting:
            pending[index] = False
            eps[index] = self._self_open_sub(index)
        sessions = self._self_sessions(resetting, None) if resetting else []
        stepped = [i for i in range(num) if eps[i] is not None and not (resetting and i in resetting)]
        spans: list[tuple[_Open, gymtrace.Scope]] = []
        for index in stepped:
            ep = eps[index]
            assert ep is not None
            number = ep.count + 1
            if number <= ep.limit:
                scope = _step_scope(ep, number)
                ep.context.run(scope.__enter__)
                spans.append((ep, scope))
        return _Batch(resetting, sessions, stepped, spans, _perf_counter_ns())

    def _self_step_failed(self, batch: _Batch, exc: BaseException) -> None:
        end = _perf_counter_ns()
        eps = self._self_eps
        for ep, scope in batch.sessions:
            ep.context.run(_exit, scope, exc)
        spanned = {id(ep) for ep, _ in batch.spans}
        for ep, scope in batch.spans:
            ep.add_span(ep.count + 1, end - batch.start, exc)
            ep.context.run(_exit, scope, exc)
        for index in batch.stepped:
            sub = eps[index]
            if sub is not None and id(sub) not in spanned:
                self._self_failed_step(sub, sub.count + 1, batch.start, end, exc)
        self._self_fail_all(exc, range(self._self_num))

    def _self_after_step(self, batch: _Batch, result: Any) -> None:
        ns = _perf_counter_ns() - batch.start
        eps = self._self_eps
        resetting = batch.resetting
        for ep, scope in batch.sessions:
            ep.context.run(_exit, scope, None)
        for ep, scope in batch.spans:
            ep.sampled += 1
            ep.context.run(_exit, scope, None)
        rewards = result[1].tolist()
        ended = (result[2] | result[3]).tolist()
        spanned = {id(ep) for ep, _ in batch.spans} if batch.spans else ()
        for index in batch.stepped:
            sub = eps[index]
            assert sub is not None
            number = sub.count + 1
            sub.add(number, ns)
            if ns > sub.floor and id(sub) not in spanned:
                sub.slower(number, batch.start, ns)
            sub.reward += rewards[index]
        mode = self._self_mode
        for index in range(self._self_num):
            if not ended[index] or (resetting and index in resetting):
                continue
            ended_ep, eps[index] = eps[index], None
            if ended_ep is not None:
                self._self_end(ended_ep, None)
            if mode == "NextStep":
                self._self_pending[index] = True
            elif mode == "SameStep":
                # The sub-environment was reset inside this very step: its next episode starts now.
                eps[index] = self._self_open_sub(index)
                for new, session in self._self_sessions([index], None):
                    new.context.run(_exit, session, None)

    def _self_cancel_all(self, why: str) -> None:
        for index in range(self._self_num):
            self._self_pending[index] = False
            ep, self._self_eps[index] = self._self_eps[index], None
            if ep is not None:
                self._self_end(ep, asyncio.CancelledError(why))

    def __repr__(self) -> str:
        return f"<TraceEnv {self.__wrapped__!r}>"
