"""pass@k with the unbiased estimator, for any k up to a task's number of scored repeats.

With n scored repeats of a task of which c pass, the chance that at least one of k repeats drawn
without replacement passes is ``1 - C(n - c, k) / C(n, k)`` (Chen et al. 2021, "Evaluating Large
Language Models Trained on Code"). Unscored repeats are not samples: they are left out of n, never
counted as failures. A task with fewer than k scored repeats has no pass@k.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gymtrace._outcomes import RolloutOutcome, rewards_by_task


def pass_at_k(n: int, passed: int, k: int) -> float:
    """The unbiased estimate of pass@k from n samples of which ``passed`` pass."""
    if not 0 <= passed <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= passed <= n and 1 <= k <= n, got n={n}, passed={passed}, k={k}")
    if n - passed < k:
        return 1.0
    return 1.0 - math.comb(n - passed, k) / math.comb(n, k)


@dataclass(frozen=True)
class PassK:
    """pass@k over the tasks of one run."""

    k: int
    tasks: dict[str, float]  # task ID -> pass@k, for tasks with at least k scored repeats
    too_few: int  # tasks with fewer than k scored repeats, left out

    @property
    def mean(self) -> float | None:
        return math.fsum(self.tasks.values()) / len(self.tasks) if self.tasks else None

    def as_json(self) -> dict[str, object]:
        return {"k": self.k, "mean": self.mean, "tasks": self.tasks, "too_few_repeats": self.too_few}


def per_task(outcomes: Iterable[RolloutOutcome], k: int, passes: Callable[[float], bool]) -> PassK:
    """pass@k of each task in ``outcomes``; a scored repeat passes when ``passes(reward)``."""
    if k < 1:
        raise ValueError(f"pass@k needs k >= 1, got {k}")
    tasks = rewards_by_task(outcomes)
    values = {
        task: pass_at_k(len(rewards), sum(1 for r in rewards if passes(r)), k)
        for task, (_, rewards) in sorted(tasks.items())
        if len(rewards) >= k
    }
    return PassK(k, values, len(tasks) - len(values))
