"""The step policy: what a ``gymtrace.step`` records when steps are too fast to trace one by one.

``all`` (the default) makes every step a span. ``aggregate`` puts the step count and duration
statistics on the step owner's span (the agent invocation, else the episode) and keeps a bounded
sample of steps as spans, each with its true number and times: the first ``first`` of each owner,
the ``slowest`` slowest of the rest (written when the owner ends), every step of a share
``episode_share`` of owners, and always a step that raised. The owner's ``gym.steps.policy`` says
which applied, so readers, the checker and ``gymtrace tree`` know the step spans are a sample.
"""

from __future__ import annotations

import heapq
import os
import random
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from opentelemetry import trace

from gymtrace import _constants as c
from gymtrace._model import forks as _forks
from gymtrace._model import settings as _settings
from gymtrace._model.errors import InvalidArgumentError
from gymtrace._model.failures import record_error
from gymtrace._scopes.tracing import active_tracer

POLICY_ALL = c.STEPS_POLICY_ALL
POLICY_AGGREGATE = c.STEPS_POLICY_AGGREGATE
POLICIES = _settings.STEP_POLICIES


@dataclass(frozen=True)
class StepPolicy:
    """What a step records; see the module docstring. ``StepPolicy()`` is every step a span."""

    policy: str = POLICY_ALL
    first: int = _settings.DEFAULT_STEP_FIRST
    slowest: int = _settings.DEFAULT_STEP_SLOWEST
    episode_share: float = _settings.DEFAULT_STEP_EPISODE_SHARE

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise InvalidArgumentError(
                f"gymtrace.StepPolicy(): argument 'policy' must be one of {POLICIES}, got {self.policy!r}"
            )
        for name in ("first", "slowest"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidArgumentError(
                    f"gymtrace.StepPolicy(): argument {name!r} must be an int >= 0, got {value!r}"
                )
        share = self.episode_share
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 <= share <= 1.0:
            raise InvalidArgumentError(
                f"gymtrace.StepPolicy(): argument 'episode_share' must be a number in [0, 1], got {share!r}"
            )

    @property
    def aggregate(self) -> bool:
        return self.policy == POLICY_AGGREGATE


_FIELDS = tuple(f.name for f in fields(StepPolicy))


def policy_from(
    value: str | StepPolicy | Mapping[str, Any] | None, settings: _settings.Settings | None = None
) -> StepPolicy:
    """The policy for ``configure(step_policy=...)``: a StepPolicy, a policy name (its parameters
    from the ``GYMTRACE_STEP_*`` variables) or None (all of it from the environment). The variables
    come resolved in ``settings`` (default: the active ones), where a bad value was already reported
    as every bad variable is; a bad argument raises."""
    if isinstance(value, StepPolicy):
        return value
    if isinstance(value, Mapping):
        unknown = sorted(str(key) for key in value if key not in _FIELDS)
        if unknown:
            raise InvalidArgumentError(
                f"gymtrace.configure(): argument 'step_policy' has unknown keys {unknown}; a step"
                f" policy has {list(_FIELDS)}"
            )
        return StepPolicy(**value)
    if value is not None and not isinstance(value, str):
        raise InvalidArgumentError(
            "gymtrace.configure(): argument 'step_policy' must be 'all', 'aggregate' or a"
            f" gymtrace.StepPolicy, got {type(value).__name__}"
        )
    read = _settings.active if settings is None else settings
    name = read.step_policy if value is None else value.strip().lower()
    if name not in POLICIES:
        raise InvalidArgumentError(
            f"gymtrace.configure(): argument 'step_policy' must be one of {POLICIES}, got {value!r:.60}"
        )
    return StepPolicy(
        policy=name, first=read.step_first, slowest=read.step_slowest, episode_share=read.step_episode_share
    )


_policy: StepPolicy
_chosen: bool
# Read by the engine on every step: True when the policy is aggregate.
aggregating: bool


def current_policy() -> StepPolicy:
    return _policy


def set_policy(policy: StepPolicy, chosen: bool = False) -> None:
    """Make ``policy`` the one in force; ``chosen`` when the user chose it (configure() or the
    variable), so that it also applies where an integration has a default of its own."""
    global _policy, _chosen, aggregating
    _policy = policy
    _chosen = chosen
    aggregating = policy.aggregate


def chosen_policy() -> StepPolicy | None:
    """The policy ``configure(step_policy=...)`` or ``GYMTRACE_STEP_POLICY`` chose; None when neither
    said anything, and an integration applies its own default (the Gymnasium one aggregates)."""
    return _policy if _chosen else None


def given_parameters() -> dict[str, Any]:
    """The step policy's parameters a ``GYMTRACE_STEP_*`` variable gave, by name (``first``,
    ``slowest``, ``episode_share``): what an integration with a default policy of its own takes
    over its own defaults when no policy was chosen (``GYMTRACE_STEP_SLOWEST=3`` alone, say)."""
    read = _settings.active
    return {name: getattr(read, f"step_{name}") for name in read.step_parameters_given}


def policy_inputs() -> tuple[StepPolicy | None, _settings.Settings]:
    """What :func:`chosen_policy` and :func:`given_parameters` answer from: when this changes
    (compared item by item), their answers may have."""
    return chosen_policy(), _settings.active


def reset_policy() -> None:
    """Back to what the environment says, as the active settings read it (``gymtrace.testing.reset()``)."""
    set_policy(policy_from(None), _settings.active.step_policy_chosen)


reset_policy()  # at import: what the environment says


# A private RNG for the episode share: RL code seeds the global one in every worker.
_random = random.Random(os.urandom(16))
_forks.in_child(lambda: _random.seed(os.urandom(16)))


class StepStats:
    """The steps of one owner (agent invocation or episode) under the aggregate policy."""

    __slots__ = (
        "_lock",
        "count",
        "errors",
        "everything",
        "first",
        "max_ns",
        "min_ns",
        "policy",
        "slow",
        "slowest",
        "slowest_number",
        "spans",
        "started",
        "total_ns",
    )

    def __init__(self, policy: StepPolicy) -> None:
        self.policy = policy
        self.first = policy.first
        self.slowest = policy.slowest
        # Every step of this owner is a span (the sampled share of owners).
        self.everything = policy.episode_share > 0 and _random.random() < policy.episode_share
        self.count = 0
        self.started = 0
        self.errors = 0
        self.spans = 0
        self.total_ns = 0
        self.min_ns = -1
        self.max_ns = -1
        self.slowest_number = 0
        # Min-heap of (duration, number, start, end) of the slowest steps that are not spans yet.
        self.slow: list[tuple[int, int, int, int]] = []
        self._lock = threading.Lock()

    def wants_span(self) -> bool:
        """Whether the step starting now becomes a live span: one of the first ``first`` started
        (counted, so explicit step numbers do not matter), or every step of a sampled owner."""
        self.started += 1
        return self.everything or self.started <= self.first

    def record(self, number: int, start_ns: int, end_ns: int, as_span: bool, error: bool = False) -> None:
        # No lock: this runs on every step (a lock is ~0.3 µs), and the steps of one owner run one
        # at a time (an agent loop, or coroutines of one event loop). Steps of one owner run on
        # several threads at once could lose a count, never a span or a recorded error.
        duration = end_ns - start_ns
        self.count += 1
        if error:
            self.errors += 1
        self.total_ns += duration
        if duration > self.max_ns:
            self.max_ns = duration
            self.slowest_number = number
        if self.min_ns < 0 or duration < self.min_ns:
            self.min_ns = duration
        if as_span:
            self.spans += 1
        elif self.slowest:
            slow = self.slow
            if len(slow) < self.slowest:
                heapq.heappush(slow, (duration, number, start_ns, end_ns))
            elif duration > slow[0][0]:
                heapq.heapreplace(slow, (duration, number, start_ns, end_ns))

    def finish(
        self, owner_span: Any, tracer: trace.Tracer | None, context: Any, identity: Mapping[str, Any]
    ) -> None:
        """Write the slowest steps as spans, then the statistics onto the owner's span."""
        with self._lock:
            slow, self.slow = sorted(self.slow, key=lambda e: e[2]), []
        if tracer is not None:
            for _, number, start_ns, end_ns in slow:
                write_step(context, identity, number, start_ns, end_ns, c.STEP_KEPT_SLOWEST, tracer=tracer)
                self.spans += 1
        owner_span.set_attributes(self.attributes())

    def attributes(self) -> dict[str, Any]:
        """The policy and the statistics (gym.steps.*), as the owner's span says them."""
        policy = self.policy
        return {
            **policy_attributes(self.everything, policy.first, policy.slowest, policy.episode_share),
            **statistics_attributes(
                self.count,
                self.spans,
                self.errors,
                self.total_ns,
                self.min_ns,
                self.max_ns,
                self.slowest_number,
            ),
        }


def policy_attributes(every: bool, first: int, slowest: int, episode_share: float) -> dict[str, Any]:
    """An aggregating owner's ``gym.steps.policy`` and its parameters. An owner of the sampled
    share (``every``) had every step as a span: for its reader that is "all"."""
    return {
        c.STEPS_POLICY: POLICY_ALL if every else POLICY_AGGREGATE,
        c.STEPS_FIRST: first,
        c.STEPS_SLOWEST: slowest,
        c.STEPS_EPISODE_SHARE: float(episode_share),
    }


def statistics_attributes(
    count: int, sampled: int, errors: int, total_ns: int, min_ns: int, max_ns: int, slowest_number: int
) -> dict[str, Any]:
    """An owner's step statistics: how many steps ran, how many are spans, how many raised, and
    (when any ran) their durations in milliseconds and the slowest one's number."""
    out: dict[str, Any] = {c.STEPS_COUNT: count, c.STEPS_SAMPLED: sampled}
    if errors:
        out[c.STEPS_ERRORS] = errors
    if count:
        out[c.STEPS_DURATION_TOTAL_MS] = total_ns / 1e6
        out[c.STEPS_DURATION_MEAN_MS] = total_ns / count / 1e6
        out[c.STEPS_DURATION_MIN_MS] = min_ns / 1e6
        out[c.STEPS_DURATION_MAX_MS] = max_ns / 1e6
        out[c.STEPS_SLOWEST_NUMBER] = slowest_number
    return out


class _OwnedElsewhere(StepStats):
    """The steps of an owner an integration samples and counts itself (the Gymnasium integration's
    episodes: its steps are too fast for this engine). Every step span the integration opens is
    kept as it is, and the integration, not this engine, writes the ``gym.steps.*`` statistics."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(StepPolicy(POLICY_AGGREGATE))
        self.everything = True  # no gym.step.kept: the integration's sample is not this engine's

    def wants_span(self) -> bool:
        return True

    def record(self, number: int, start_ns: int, end_ns: int, as_span: bool, error: bool = False) -> None:
        return None

    def finish(
        self, owner_span: Any, tracer: trace.Tracer | None, context: Any, identity: Mapping[str, Any]
    ) -> None:
        return None


OWNED_ELSEWHERE: StepStats = _OwnedElsewhere()
"""Set as an owner's ``step_stats`` by an integration with a step policy of its own. Shared: it
holds no state."""


def stats_for(owner: Any) -> StepStats:
    """The step statistics of a step owner (agent invocation, episode, ...), made at its first step.

    The policy is visible at once on the owner's span and, when the owner is an agent invocation,
    on its episode's span, so a reader of either knows the step spans are a sample.
    """
    stats = owner._counter().stats = StepStats(_policy)
    policy_name = POLICY_ALL if stats.everything else POLICY_AGGREGATE
    owner.span.set_attribute(c.STEPS_POLICY, policy_name)
    episode = owner.nearest(c.KIND_EPISODE)
    if episode is not None and episode is not owner:
        episode.span.set_attribute(c.STEPS_POLICY, policy_name)
    return stats


# gym.step.duration's recorder while GYMTRACE_STEP_METRICS is on (_levels.measure_steps), else None.
measure: Any = None


def end_unsampled(frame: Any, timing: tuple[Any, int, int, bool], exc: BaseException | None) -> None:
    """A step without a span ended: count it; if it raised, it becomes a span now."""
    stats, number, start_ns, _ = timing
    end_ns = time.time_ns()
    if measure is not None:
        measure((end_ns - start_ns) / 1e9)
    raised = isinstance(exc, Exception)
    stats.record(number, start_ns, end_ns, raised, raised)
    if isinstance(exc, Exception):
        write_step(frame.context, frame.identity, number, start_ns, end_ns, c.STEP_KEPT_RAISED, exc)


def write_owner(frame: Any) -> None:
    """The owner ends: its slowest steps become spans, its span gets the statistics."""
    frame.counter.stats.finish(frame.span, active_tracer(), frame.context, frame.identity)


def write_step(
    context: Any,
    identity: Mapping[str, Any],
    number: int,
    start_ns: int,
    end_ns: int,
    kept: str,
    exc: Exception | None = None,
    tracer: trace.Tracer | None = None,
) -> bool:
    """A step that ran without a span, written as one after the fact with its true number and
    times: one of the slowest, or one that raised (``exc``, recorded as the engine records an
    exception on a live span). ``context`` is its owner's; ``tracer``
    default the active one. False when nothing records (no span was written)."""
    if tracer is None:
        tracer = active_tracer()
        if tracer is None:
            return False
    span = tracer.start_span(
        c.SPAN_STEP,
        context=context,
        attributes={**identity, c.KIND: c.KIND_STEP, c.STEP_NUMBER: number, c.STEP_KEPT: kept},
        start_time=start_ns,
    )
    if exc is not None:
        record_error(span, exc, timestamp=end_ns)
    span.end(end_time=end_ns)
    return True
