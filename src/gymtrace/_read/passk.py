"""pass@k, the one definition ``gymtrace stats`` and ``gymtrace compare`` share.

With n scored repeats of a task of which c pass, the chance that at least one of k repeats drawn
without replacement passes is ``1 - C(n - c, k) / C(n, k)``, the unbiased estimator (Chen et al.
2021, "Evaluating Large Language Models Trained on Code"). Unscored repeats are not samples: they
are left out of n and shown beside it, never counted as failures. A task with fewer than k scored
repeats has no pass@k.

One threshold rule: a scored repeat passes when its reward is **at least** the threshold
(:func:`passes`, ``reward >= threshold``, default :data:`PASS_THRESHOLD`); ``compare``'s flips read
a task's mean reward with the same rule.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from gymtrace import _constants as c

if TYPE_CHECKING:
    from gymtrace._read.outcomes import RolloutOutcome

# The default of --pass-threshold in both commands: with 0/1 rewards a 1 passes and a 0 fails, and
# with rewards in [0, 1] a repeat passes when it earned at least half.
PASS_THRESHOLD: Final = 0.5


def passes(reward: float, threshold: float = PASS_THRESHOLD) -> bool:
    """The one threshold rule: at least the threshold passes (issue 31: stats said ``>``)."""
    return reward >= threshold


def pass_at_k(n: int, passed: int, k: int) -> float:
    """The unbiased estimate of pass@k from n samples of which ``passed`` pass."""
    if not 0 <= passed <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= passed <= n and 1 <= k <= n, got n={n}, passed={passed}, k={k}")
    if n - passed < k:
        return 1.0
    return 1.0 - math.comb(n - passed, k) / math.comb(n, k)


def rewards_by_task(outcomes: Iterable[RolloutOutcome]) -> dict[str, tuple[int, list[float]]]:
    """Per task ID: its number of repeats, and the rewards of its scored ones (an unscored repeat
    has no reward, never a 0). Outcomes without a task ID are left out."""
    found: dict[str, tuple[int, list[float]]] = {}
    for o in outcomes:
        if o.task_id is None:
            continue
        repeats, rewards = found.get(o.task_id, (0, []))
        if o.outcome == c.OUTCOME_SCORED and o.reward is not None:
            rewards.append(o.reward)
        found[o.task_id] = (repeats + 1, rewards)
    return found


@dataclass(frozen=True)
class TaskPassK:
    """pass@k of one task over its scored repeats, with the repeats that were not scored."""

    task_id: str
    k: int  # 0 when no repeat was scored (no pass@k)
    n: int  # scored repeats, the estimator's samples
    passed: int  # of those, the ones that pass
    unscored: int  # repeats without a reward (unscored or pending): shown, never failures

    @property
    def value(self) -> float | None:
        return pass_at_k(self.n, self.passed, self.k) if 1 <= self.k <= self.n else None

    def as_json(self) -> dict[str, Any]:
        return {
            "k": self.k,
            "n": self.n,
            "passed": self.passed,
            "unscored": self.unscored,
            "value": self.value,
        }


@dataclass(frozen=True)
class PassK:
    """pass@k over the tasks of one run."""

    k: int
    tasks: dict[str, float]  # task ID -> pass@k, for tasks with at least k scored repeats
    too_few: int  # tasks with fewer than k scored repeats, left out
    unscored: int = 0  # repeats of the tasks above that were not scored (not in any n)

    @property
    def mean(self) -> float | None:
        return math.fsum(self.tasks.values()) / len(self.tasks) if self.tasks else None

    def as_json(self) -> dict[str, object]:
        return {
            "k": self.k,
            "mean": self.mean,
            "tasks": self.tasks,
            "too_few_repeats": self.too_few,
            "unscored": self.unscored,
        }


def _task(task_id: str, repeats: int, rewards: list[float], k: int, threshold: float) -> TaskPassK:
    return TaskPassK(
        task_id,
        k,
        len(rewards),
        sum(1 for r in rewards if passes(r, threshold)),
        repeats - len(rewards),
    )


def per_task(outcomes: Iterable[RolloutOutcome], k: int, threshold: float = PASS_THRESHOLD) -> PassK:
    """pass@k of each task in ``outcomes`` that has at least k scored repeats (``--pass-k K``)."""
    if k < 1:
        raise ValueError(f"pass@k needs k >= 1, got {k}")
    tasks = rewards_by_task(outcomes)
    found = [
        _task(task, repeats, rewards, k, threshold)
        for task, (repeats, rewards) in sorted(tasks.items())
        if len(rewards) >= k
    ]
    values = {t.task_id: t.value for t in found if t.value is not None}
    return PassK(k, values, len(tasks) - len(values), sum(t.unscored for t in found))


def pass_at_n(outcomes: Iterable[RolloutOutcome], threshold: float = PASS_THRESHOLD) -> tuple[TaskPassK, ...]:
    """``stats``' per-task line: for each task with more than one repeat, pass@n with n its scored
    repeats (so 1 when any scored repeat passed), its unscored repeats beside it."""
    return tuple(
        _task(task, repeats, rewards, len(rewards), threshold)
        for task, (repeats, rewards) in sorted(rewards_by_task(outcomes).items())
        if repeats > 1
    )
