"""Two runs side by side (``gymtrace compare A B``): per-task reward deltas, a paired bootstrap
interval, flips, and a refusal when the runs lost different shares of rollouts.

Read from the final outcomes every reader uses (``_read.outcomes.final_outcomes``). The rules, and
why there is no verdict below :data:`MIN_PAIRED_TASKS` tasks scored in both, are docs/records.md:

- tasks are joined on ``gym.task.id``, never on position; a task's mean is over its scored repeats;
  every delta is B minus A, the run's the mean of the per-task deltas;
- the 95 % interval is a two-level paired bootstrap (the tasks, then each task's A and B repeats)
  with a fixed seed, so the same inputs always give the same interval;
- a flip follows pass@k's one rule (:func:`gymtrace._read.passk.passes`);
- the verdict is refused when the runs' unscored shares differ by more than the gap.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gymtrace import _constants as c
from gymtrace._read.outcomes import RolloutOutcome
from gymtrace._read.passk import PASS_THRESHOLD, passes, rewards_by_task

# The interval's resampling: a fixed seed (deterministic), and about four million draws in all
# (at least a thousand resamples, however many repeats there are).
SEED = 20_240_601
RESAMPLES = 10_000
_DRAWS = 4_000_000
# Fewer tasks scored in both runs than this: no verdict, no interval (see the module doc).
MIN_PAIRED_TASKS = 6

VERDICT_B_BETTER = "b_better"
VERDICT_A_BETTER = "a_better"
VERDICT_INCONCLUSIVE = "inconclusive"
VERDICT_REFUSED = "refused"
VERDICT_NO_DATA = "no_data"
VERDICT_TOO_FEW = "too_few_tasks"


@dataclass(frozen=True)
class Side:
    """One run's repeats of one task."""

    repeats: int
    rewards: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.rewards)

    @property
    def unscored(self) -> int:
        return self.repeats - self.n

    @property
    def mean(self) -> float | None:
        return math.fsum(self.rewards) / self.n if self.rewards else None


@dataclass(frozen=True)
class TaskDelta:
    task_id: str
    a: Side
    b: Side

    @property
    def delta(self) -> float | None:
        a, b = self.a.mean, self.b.mean
        return b - a if a is not None and b is not None else None

    def as_json(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "a_mean": self.a.mean,
            "b_mean": self.b.mean,
            "delta": self.delta,
            "a_n": self.a.n,
            "b_n": self.b.n,
            "a_unscored": self.a.unscored,
            "b_unscored": self.b.unscored,
        }


@dataclass(frozen=True)
class Comparison:
    tasks: tuple[TaskDelta, ...]
    delta: float | None
    ci95: tuple[float, float] | None
    pass_to_fail: tuple[str, ...]
    fail_to_pass: tuple[str, ...]
    verdict: str
    reason: str
    a_unscored_share: float
    b_unscored_share: float
    threshold: float
    extra: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "tasks": [t.as_json() for t in self.tasks],
            "delta": self.delta,
            "ci95": list(self.ci95) if self.ci95 is not None else None,
            "pass_to_fail": list(self.pass_to_fail),
            "fail_to_pass": list(self.fail_to_pass),
            "verdict": self.verdict,
            "reason": self.reason,
            "a_unscored_share": self.a_unscored_share,
            "b_unscored_share": self.b_unscored_share,
            "pass_threshold": self.threshold,
            **self.extra,
        }


def _natural(task_id: str) -> list[str | int]:
    """Task 2 before task 10: digits compare as numbers (re.split keeps text at even places)."""
    return [int(part) if i % 2 else part for i, part in enumerate(re.split(r"(\d+)", task_id))]


def _sides(outcomes: Sequence[RolloutOutcome]) -> dict[str, Side]:
    return {task: Side(n, tuple(rewards)) for task, (n, rewards) in rewards_by_task(outcomes).items()}


def _unscored_share(outcomes: Sequence[RolloutOutcome]) -> float:
    if not outcomes:
        return 0.0
    return sum(1 for o in outcomes if o.outcome != c.OUTCOME_SCORED) / len(outcomes)


def _constant(values: Sequence[float]) -> float | Sequence[float]:
    return float(values[0]) if min(values) == max(values) else values


def bootstrap_ci95(
    pairs: Sequence[tuple[Sequence[float], Sequence[float]]], *, seed: int = SEED
) -> tuple[float, float]:
    """The 2.5th and 97.5th percentiles of the mean per-task delta (B minus A) over a two-level
    bootstrap: tasks resampled with replacement, then each drawn task's A rewards and B rewards
    resampled with replacement (a task with one repeat a side keeps its one value)."""
    n = len(pairs)
    rng = random.Random(seed)
    choices = rng.choices
    draws = n + sum(len(a) + len(b) for a, b in pairs)
    resamples = max(1_000, min(RESAMPLES, _DRAWS // draws))
    # A side whose repeats all got the same reward (every 0/1 task that always or never passes)
    # resamples to that reward: kept as a number, it costs no draw.
    sides = [(_constant(a), _constant(b)) for a, b in pairs]

    def mean(values: float | Sequence[float]) -> float:
        if isinstance(values, float):
            return values
        return math.fsum(choices(values, k=len(values))) / len(values)

    means = sorted(math.fsum(mean(b) - mean(a) for a, b in choices(sides, k=n)) / n for _ in range(resamples))
    low = means[math.floor(0.025 * (resamples - 1))]
    high = means[math.ceil(0.975 * (resamples - 1))]
    return low, high


def compare(
    a: Sequence[RolloutOutcome],
    b: Sequence[RolloutOutcome],
    *,
    threshold: float = PASS_THRESHOLD,
    max_unscored_gap_pp: float = 10.0,
) -> Comparison:
    """Run B against run A (see the module doc)."""
    sides_a, sides_b = _sides(a), _sides(b)
    empty = Side(0, ())
    tasks = tuple(
        TaskDelta(task, sides_a.get(task, empty), sides_b.get(task, empty))
        for task in sorted(set(sides_a) | set(sides_b), key=_natural)
    )
    joined = [t for t in tasks if t.delta is not None]
    deltas = [t.delta for t in joined if t.delta is not None]
    pass_to_fail = tuple(
        t.task_id
        for t in joined
        if t.a.mean is not None
        and t.b.mean is not None
        and passes(t.a.mean, threshold)
        and not passes(t.b.mean, threshold)
    )
    fail_to_pass = tuple(
        t.task_id
        for t in joined
        if t.a.mean is not None
        and t.b.mean is not None
        and passes(t.b.mean, threshold)
        and not passes(t.a.mean, threshold)
    )
    share_a, share_b = _unscored_share(a), _unscored_share(b)
    delta = math.fsum(deltas) / len(deltas) if deltas else None
    enough = len(joined) >= MIN_PAIRED_TASKS
    ci95 = bootstrap_ci95([(t.a.rewards, t.b.rewards) for t in joined]) if enough else None
    gap = abs(share_b - share_a) * 100
    if gap > max_unscored_gap_pp:
        verdict = VERDICT_REFUSED
        reason = (
            f"unscored shares differ by {gap:.1f} points (A {share_a:.1%}, B {share_b:.1%}), more than"
            f" {max_unscored_gap_pp:g}: a run that lost more rollouts is not comparable on the ones it kept"
        )
    elif not joined:
        verdict, reason = VERDICT_NO_DATA, "no task is scored in both runs"
    elif ci95 is None:
        verdict = VERDICT_TOO_FEW
        reason = (
            f"{len(joined)} task{'s' if len(joined) != 1 else ''} scored in both runs; a verdict needs at"
            f" least {MIN_PAIRED_TASKS} (no test reaches 95% confidence on fewer pairs)"
        )
    elif ci95[0] > 0:
        verdict, reason = VERDICT_B_BETTER, "the 95% interval of B - A is above 0"
    elif ci95[1] < 0:
        verdict, reason = VERDICT_A_BETTER, "the 95% interval of B - A is below 0"
    else:
        verdict, reason = VERDICT_INCONCLUSIVE, "the 95% interval of B - A contains 0"
    return Comparison(
        tasks=tasks,
        delta=delta,
        ci95=ci95,
        pass_to_fail=pass_to_fail,
        fail_to_pass=fail_to_pass,
        verdict=verdict,
        reason=reason,
        a_unscored_share=share_a,
        b_unscored_share=share_b,
        threshold=threshold,
    )
