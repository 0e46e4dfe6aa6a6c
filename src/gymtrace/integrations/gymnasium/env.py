"""``TraceEnv``: the transparent proxy that turns a Gymnasium environment's episodes into gym
rollouts (reset opens the episode, step counts and times steps, termination records the return).

A vector environment's wrapper (:mod:`.vector`) is a subclass, chosen when the wrapped environment
is a ``VectorEnv``.
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import dataclasses
import itertools
import sys
import uuid
import weakref
from collections.abc import Callable
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
    report_error,
    write_step,
)
from gymtrace.instrumentation import chosen_step_parameters as given_parameters
from gymtrace.instrumentation import step_policy_inputs as policy_inputs
from gymtrace.integrations.gymnasium.episodes import (
    _DEFAULT_POLICY,
    _SUMMARY_POLICY,
    _VERIFY,
    _epoch_offset,
    _exit,
    _Open,
    _perf_counter_ns,
    _Policy,
    _random,
    _step_scope,
)
from gymtrace.integrations.gymnasium.surroundings import (
    _env_id,
    _outer_time_limits,
    _recording,
    _reset_after_completed,
    _sampled_out,
    _truncated_outside,
    _warn_inside_episode,
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


# The wrapper of vector environments: a subclass of TraceEnv that .vector registers here when the
# package imports it (importing any module of the package imports the package first).
_VECTOR_WRAPPER: list[type[TraceEnv]] = []


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
                cls = _VECTOR_WRAPPER[0]
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
        # A rollout the sampler drops is opened all the same (its spans record nothing): its end
        # writes the one summary span that keeps counts and rewards exact.
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
            opened = rollout.__enter__()
            if not _recording(opened) and not _sampled_out(opened):
                _exit(rollout, None)  # tracing is off: pass through
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
        env_step = self.__wrapped__.step if index is None else None
        if not _recording(frame):
            if _sampled_out(frame):
                # Its rollout (the wrapper's or the caller's) was dropped by head sampling: only
                # the return and the end are kept, for the rollout's summary span.
                return _Open(context, rollout, episode, frame, False, _SUMMARY_POLICY, env_step, True)
            _exit(episode, None)
            if rollout is not None:
                _exit(rollout, None)
            return None
        # Its steps are sampled and counted here: gymtrace's own step engine keeps its hands off.
        frame.step_stats = OWNED_ELSEWHERE
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
        if ep.summary:
            # Sampled out: the return goes to the rollout's summary, through the episode's outcome.
            if exc is None:
                ep.frame.record_reward(float(ep.reward))
        else:
            TraceEnv._self_end_recorded(ep, exc)
        _exit(ep.episode, exc)
        if ep.rollout is not None:
            # A cancelled episode leaves its rollout unscored, not cancelled: nothing failed.
            _exit(ep.rollout, None if isinstance(exc, asyncio.CancelledError) else exc)

    @staticmethod
    def _self_end_recorded(ep: _Open, exc: BaseException | None) -> None:
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
        if ep.summary:  # no seed_session: nothing below a dropped rollout is recorded
            try:
                result = ep.run(env.reset, seed=seed, options=options)
            except BaseException as exc:
                self._self_end(ep, exc)
                raise
            self._self_open = ep
            return result
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
