"""One open episode of a traced environment and its step policy: which steps become spans (the
first, the slowest, every step of a sampled share), the duration statistics of all of them, and how
an episode's scopes end.

Separate from the wrapper because the single and the vector wrapper both keep their episodes here,
and because it is the per-step hot path: everything a step touches is bound once at module level.
"""

from __future__ import annotations

import contextvars
import heapq
import os
import random
import sys
import time
from typing import Any

import gymtrace
from gymtrace import StepPolicy
from gymtrace import attributes as c
from gymtrace.instrumentation import step_policy_attributes as policy_attributes
from gymtrace.instrumentation import step_statistics_attributes as statistics_attributes
from gymtrace.instrumentation import (
    write_step,
)

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


# An episode of a rollout that head sampling dropped: no step becomes a span; it is only counted.
_SUMMARY_POLICY = _Policy(True, 0, 0, 0.0)


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
        "summary",
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
        summary: bool = False,
    ) -> None:
        self.context = context
        # Its rollout was dropped by head sampling: no span below it, only its return and its end,
        # which the rollout's summary span says (no step is a span: give it _SUMMARY_POLICY).
        self.summary = summary
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


def _epoch_offset() -> int:
    """What turns a ``perf_counter_ns`` time into ``time_ns`` (epoch) nanoseconds, now: the two
    clocks run at the same rate, so a step timed earlier in the episode maps through it too.

    The epoch clock is read between two reads of the other, and of three tries the tightest is
    taken: a thread paused between two reads (a busy machine) shifted every step it mapped by the
    pause, enough to put a kept step before the step span that ran live just ahead of it (CI saw
    "step numbers ... [2, 1]")."""
    width, offset = -1, 0
    for _ in range(3):
        before = _perf_counter_ns()
        epoch = _time_ns()
        after = _perf_counter_ns()
        if width < 0 or after - before < width:
            width, offset = after - before, epoch - (before + after) // 2
    return offset


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
