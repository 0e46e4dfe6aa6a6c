"""Per-run statistics over final outcomes: what ``gymtrace stats`` prints and the demo sums up.

Apart from :mod:`gymtrace._read.outcomes` because it is a reading of the outcomes, not a part of
deciding them: it counts scored, unscored, pending and lost rollouts, takes the mean reward by the
denominator rule (an unscored rollout is no invented 0) and pass@k by :mod:`gymtrace._read.passk`'s
one definition. The outcomes never need it, so pass@k and the statistics sit above them, and the
imports point one way: ``stats`` -> ``passk`` -> ``outcomes``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gymtrace import _constants as c
from gymtrace._read.outcomes import RolloutOutcome, final_outcomes
from gymtrace._read.passk import PASS_THRESHOLD, TaskPassK, pass_at_n, rewards_by_task


@dataclass(frozen=True)
class RunStats:
    """Per-run statistics over final outcomes (the numbers ``gymtrace stats`` prints)."""

    run_id: str | None
    scored: int
    unscored: int
    inputs: int  # the number of rewards the mean is over
    mean_reward: float | None  # None when there are no inputs
    pass_at_k: tuple[TaskPassK, ...] = ()
    # Set when several runs in the input share this run ID (one RunStats each): the run span's ID.
    run_span_id: str | None = None
    runs_sharing_id: int = 1
    # Rollouts whose outcome is expected from another process (a record not in the input): never in
    # the mean, never a zero.
    pending: int = 0
    # Rollouts whose process died before they ended (killed): no outcome, never in the mean.
    lost: int = 0
    # Attempts a killed process was running that a later pass ran again under the same number
    # (RolloutOutcome.lost_attempts), over the run's rollouts; they never count in the mean.
    lost_attempts: int = 0
    # Per task ID, the mean reward over its scored rollouts (tasks with none are left out).
    task_means: Mapping[str, float] = field(default_factory=dict)
    # Rollouts recorded whole; the others are summaries (head sampling dropped their episodes and
    # steps) and count the same in every figure above.
    rollouts_with_detail: int = 0

    @property
    def rollouts(self) -> int:
        return self.scored + self.unscored + self.pending + self.lost

    def as_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "run_id": self.run_id,
            "scored": self.scored,
            "unscored": self.unscored,
            "pending": self.pending,
            "inputs": self.inputs,
            "mean_reward": self.mean_reward,
            "task_means": dict(self.task_means),
            "rollouts_with_detail": self.rollouts_with_detail,
        }
        if self.lost:
            body["lost"] = self.lost
        if self.lost_attempts:
            body["lost_attempts"] = self.lost_attempts
        if self.pass_at_k:
            body["pass_at_k"] = {p.task_id: p.as_json() for p in self.pass_at_k}
        if self.runs_sharing_id > 1:
            body["run_span_id"] = self.run_span_id
            body["runs_sharing_id"] = self.runs_sharing_id
        return body


def _stats(
    run_id: str | None,
    outcomes: list[RolloutOutcome],
    *,
    failed_as_zero: bool,
    pass_threshold: float,
    run_span_id: str | None = None,
    sharing: int = 1,
) -> RunStats:
    rewards = [o.reward for o in outcomes if o.outcome == c.OUTCOME_SCORED and o.reward is not None]
    pending = sum(1 for o in outcomes if o.outcome == c.OUTCOME_PENDING)
    lost = sum(1 for o in outcomes if o.outcome == c.OUTCOME_LOST)
    unscored = len(outcomes) - len(rewards) - pending - lost
    task_means = {
        task: math.fsum(scored) / len(scored)
        for task, (_, scored) in sorted(rewards_by_task(outcomes).items())
        if scored
    }
    # The denominator rule: an unscored rollout has no reward (never an invented 0) and is left out
    # of the mean; --failed-as-zero counts it as an input of 0 here, in the metric only.
    inputs = [*rewards, *([0.0] * unscored if failed_as_zero else [])]
    pass_at_k = pass_at_n(outcomes, pass_threshold)
    return RunStats(
        run_id=run_id,
        scored=len(rewards),
        unscored=unscored,
        inputs=len(inputs),
        mean_reward=math.fsum(inputs) / len(inputs) if inputs else None,
        pass_at_k=pass_at_k,
        run_span_id=run_span_id,
        runs_sharing_id=sharing,
        pending=pending,
        lost=lost,
        lost_attempts=sum(len(o.lost_attempts) for o in outcomes),
        task_means=task_means,
        rollouts_with_detail=sum(1 for o in outcomes if o.detail),
    )


def summarise(
    spans: Iterable[Any] | None = None,
    *,
    outcomes: list[RolloutOutcome] | None = None,
    run_id: str | None = None,
    failed_as_zero: bool = False,
    pass_threshold: float = PASS_THRESHOLD,
) -> list[RunStats]:
    """Statistics per run over the final outcomes of ``spans`` (or of precomputed ``outcomes``).

    The mean reward is over scored rollouts only; ``failed_as_zero=True`` counts each unscored
    rollout as an input of 0 (nothing is written into the trace). pass@k is given per task that
    has more than one repeat, by ``_read.passk``'s one definition: the unbiased estimator over the
    task's scored repeats with k their number, a repeat passing when its reward is at least
    ``pass_threshold`` (default 0.5); unscored repeats are counted beside it, never as failures. Several runs
    sharing one run ID (a re-run appended to the same file) get one ``RunStats`` each.
    """
    if outcomes is None:
        outcomes = final_outcomes(spans or (), run_id=run_id)
    elif run_id is not None:
        outcomes = [o for o in outcomes if o.run_id == run_id]
    by_run: dict[str | None, list[RolloutOutcome]] = defaultdict(list)
    for o in outcomes:
        by_run[o.run_id].append(o)
    result = []
    for rid, group in by_run.items():
        instances: dict[str | None, list[RolloutOutcome]] = defaultdict(list)
        for o in group:
            instances[o.run_span_id].append(o)
        known = [i for i in instances if i is not None]
        if len(known) <= 1:
            result.append(_stats(rid, group, failed_as_zero=failed_as_zero, pass_threshold=pass_threshold))
            continue
        for instance, members in instances.items():
            result.append(
                _stats(
                    rid,
                    members,
                    failed_as_zero=failed_as_zero,
                    pass_threshold=pass_threshold,
                    run_span_id=instance,
                    sharing=len(known),
                )
            )
    return result


def members_of(run: RunStats, outcomes: Iterable[RolloutOutcome]) -> list[RolloutOutcome]:
    """The outcomes :func:`summarise` counted in ``run`` (its run ID; its run span too when several
    runs share the ID)."""
    return [
        o
        for o in outcomes
        if o.run_id == run.run_id and (run.runs_sharing_id <= 1 or o.run_span_id == run.run_span_id)
    ]
