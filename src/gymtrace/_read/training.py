"""Training runs read back: which step consumed each rollout, and statistics per step, version, group.

A train step's consumption is written as ``gym.consumed`` records (children of the step, see
``_scopes/consumed.py``): per rollout its ID, the trace and span of its rollout span when the trainer
knew it, the training outcome, the reason and the rollout's start policy version. Here each entry
is joined to a rollout of the input: by its rollout span, else by its rollout ID in its trace, else
(a bare ID the trainer could not resolve) to the most recent rollout of that ID in the run that no
earlier entry took, as ``consume()`` resolves one in-process. Records are taken in the order they
were written, so "not yet consumed" means the same here as there.

What the readers print from it (``gymtrace rollouts --json``, ``gymtrace stats --by ...``) and what
``gymtrace check`` reports (a rollout trained twice, negative staleness, a group larger than its
declared size, an ID consumed that no rollout of the input has) all come from :func:`read_training`.
"""

from __future__ import annotations

import functools
import json
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gymtrace import _constants as c
from gymtrace._model.ids import read_version
from gymtrace._model.numbers import read_int
from gymtrace._model.spandata import SpanData
from gymtrace._read.outcomes import RolloutOutcome
from gymtrace._read.source import TokenTotals
from gymtrace._read.timesplit import TimeSplit
from gymtrace._scopes.training import staleness

_OUTCOME_ORDER = c.TRAINING_OUTCOMES


def _array(value: Any) -> list[str]:
    """An array attribute as a list of text: a tuple from a file, JSON text from Jaeger's v1 API."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return []
    if not isinstance(value, (list, tuple)):
        return []
    return ["" if v is None else str(v) for v in value]


@dataclass
class Consumption:
    """One rollout a train step consumed."""

    run_id: str | None
    step: int | None
    step_version: int | str | None
    step_span_id: str | None
    rollout_id: str
    outcome: str
    reason: str
    staleness: int | None
    rollout: RolloutOutcome | None  # None: no rollout of the input matches
    by_id: bool


@dataclass
class TrainingRow:
    """The training columns of one rollout's row (``gymtrace rollouts --json``)."""

    group_id: str | None = None
    group_size: int | None = None
    policy_version: int | str | None = None
    policy_version_end: int | str | None = None
    consumed_by: int | None = None
    training_outcome: str | None = None
    staleness: int | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "group_id": self.group_id,
            "group_size": self.group_size,
            "policy_version": self.policy_version,
            "policy_version_end": self.policy_version_end,
            "consumed_by": self.consumed_by,
            "training_outcome": self.training_outcome,
            "staleness": self.staleness,
        }


@dataclass
class Training:
    """Everything the input says about training: consumptions, per-rollout rows, and what ran."""

    consumptions: list[Consumption] = field(default_factory=list)
    rows: dict[int, TrainingRow] = field(default_factory=dict)  # id(RolloutOutcome) -> row
    # Runs that have train steps (their rollouts no step took are "unconsumed").
    training_runs: set[str | None] = field(default_factory=set)
    steps: list[SpanData] = field(default_factory=list)
    # Output tokens per rollout trace (model calls below rollouts), and per policy version.
    tokens_by_trace: dict[str, int] = field(default_factory=dict)
    tokens_by_version: dict[tuple[str | None, str], int] = field(default_factory=dict)
    outcomes: list[RolloutOutcome] = field(default_factory=list)

    def row(self, outcome: RolloutOutcome) -> TrainingRow:
        return self.rows.get(id(outcome)) or TrainingRow()


def _version(value: object) -> int | str | None:
    if value is None:
        return None
    try:
        return _version_of((value.__class__, value))
    except TypeError:  # unhashable: read, not remembered
        return read_version(value)


# A run has a few policy versions and 10^5 rollouts and consumptions, each naming one as text: each
# value read once (keyed by its type too, since True == 1).
@functools.lru_cache(maxsize=4096)
def _version_of(typed: tuple[type, object]) -> int | str | None:
    return read_version(typed[1])


def _seconds(outcome: RolloutOutcome) -> float:
    root = outcome.root
    return max(0, root.end_ns - root.start_ns) / 1e9 if root is not None else 0.0


def read_training(
    spans: Sequence[SpanData], outcomes: Sequence[RolloutOutcome], dropped: TokenTotals | None = None
) -> Training:
    """Join the input's consumed records to its rollouts (see the module docstring). ``dropped``:
    the output tokens of spans a streaming read dropped (``_read.source``), counted beside those
    of ``spans``."""
    result = Training(outcomes=list(outcomes))
    if dropped is not None:
        result.tokens_by_trace.update(dropped.by_trace)
        result.tokens_by_version.update(dropped.by_version)
    by_span: dict[tuple[str, str], RolloutOutcome] = {}
    by_trace: dict[tuple[str, str], list[RolloutOutcome]] = defaultdict(list)
    by_id: dict[tuple[str | None, str], list[RolloutOutcome]] = defaultdict(list)
    for o in outcomes:
        root = o.root
        attributes: Mapping[str, Any] = root.attributes if root is not None else {}
        size = read_int(attributes.get(c.GROUP_SIZE))
        group = attributes.get(c.GROUP_ID)
        result.rows[id(o)] = TrainingRow(
            group_id=group if isinstance(group, str) else None,
            group_size=size,
            policy_version=_version(attributes.get(c.POLICY_VERSION)),
            policy_version_end=_version(attributes.get(c.POLICY_VERSION_END)),
        )
        if root is not None:
            by_span[(root.trace_id, root.span_id)] = o
        by_trace[(o.trace_id, o.rollout_id)].append(o)
        by_id[(o.run_id, o.rollout_id)].append(o)
    for ids in by_id.values():
        if len(ids) > 1:
            ids.sort(key=lambda o: o.root.start_ns if o.root is not None else 0)

    records = []
    for span in spans:
        kind = span.attributes.get(c.KIND)
        if kind == c.KIND_CONSUMED:
            records.append(span)
        elif kind == c.KIND_TRAIN_STEP:
            result.steps.append(span)
            run = span.attributes.get(c.RUN_ID)
            result.training_runs.add(run if isinstance(run, str) else None)
        tokens = span.attributes.get(c.GEN_AI_USAGE_OUTPUT_TOKENS)
        if tokens is not None:
            tokens = read_int(tokens)
        if tokens and isinstance(span.attributes.get(c.ROLLOUT_ID), str):
            result.tokens_by_trace[span.trace_id] = result.tokens_by_trace.get(span.trace_id, 0) + tokens
            version = span.attributes.get(c.POLICY_VERSION)
            if version is not None:
                run = span.attributes.get(c.RUN_ID)
                key = (run if isinstance(run, str) else None, str(version))
                result.tokens_by_version[key] = result.tokens_by_version.get(key, 0) + tokens
    taken: set[int] = set()
    for record in sorted(records, key=lambda s: (s.start_ns, s.span_id)):
        _read_record(record, result, by_span, by_trace, by_id, taken)
    return result


def _read_record(
    record: SpanData,
    result: Training,
    by_span: Mapping[tuple[str, str], RolloutOutcome],
    by_trace: Mapping[tuple[str, str], list[RolloutOutcome]],
    by_id: Mapping[tuple[str | None, str], list[RolloutOutcome]],
    taken: set[int],
) -> None:
    attributes = record.attributes
    run = attributes.get(c.RUN_ID)
    run_id = run if isinstance(run, str) else None
    result.training_runs.add(run_id)
    step = read_int(attributes.get(c.TRAIN_STEP))
    step_version = _version(attributes.get(c.POLICY_VERSION))
    ids = _array(attributes.get(c.CONSUMED_ROLLOUT_IDS))
    columns = [
        _array(attributes.get(name))
        for name in (
            c.CONSUMED_SPANS,
            c.CONSUMED_OUTCOMES,
            c.CONSUMED_REASONS,
            c.CONSUMED_VERSIONS,
            c.CONSUMED_BY_ID,
        )
    ]
    for n, rollout_id in enumerate(ids):
        span_ref, outcome, reason, version_text, bare = (
            column[n] if n < len(column) else "" for column in columns
        )
        trace_id, _, span_id = span_ref.partition("-")
        found: RolloutOutcome | None = None
        if trace_id and span_id:
            found = by_span.get((trace_id, span_id))
        if found is None and trace_id:
            candidates = by_trace.get((trace_id, rollout_id)) or []
            found = candidates[-1] if candidates else None
        if found is None and not trace_id:
            # A bare ID: the most recent rollout of it in the run that no earlier entry took.
            open_ = [o for o in by_id.get((run_id, rollout_id), ()) if id(o) not in taken]
            found = open_[-1] if open_ else None
        rollout_version = _version(version_text) if version_text else None
        if rollout_version is None and found is not None:
            rollout_version = result.row(found).policy_version
        consumption = Consumption(
            run_id=run_id,
            step=step,
            step_version=step_version,
            step_span_id=record.parent_id,
            rollout_id=rollout_id,
            outcome=outcome,
            reason=reason,
            staleness=staleness(step_version, rollout_version),
            rollout=found,
            by_id=bool(bare) or not trace_id,
        )
        result.consumptions.append(consumption)
        if found is not None:
            taken.add(id(found))
            row = result.rows.get(id(found))
            if row is not None and (row.training_outcome is None or outcome == c.TRAINED):
                # Consumed twice (a check reports it): the trained consumption speaks for it.
                row.consumed_by = step
                row.training_outcome = outcome
                row.staleness = consumption.staleness


def finish_rows(training: Training, outcomes: Iterable[RolloutOutcome]) -> None:
    """``unconsumed`` for a rollout of a run with train steps that no step took."""
    for o in outcomes:
        row = training.rows.get(id(o))
        if row is not None and row.training_outcome is None and o.run_id in training.training_runs:
            row.training_outcome = c.UNCONSUMED


# -- statistics -----------------------------------------------------------------------------------------


def _median(values: list[int]) -> float | None:
    return float(statistics.median(values)) if values else None


def _mean(values: list[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def step_stats(
    training: Training, splits: Mapping[int, TimeSplit | None] | None = None
) -> list[dict[str, Any]]:
    """One object per train step, in step order, then one run object per training run; with
    ``splits`` (per rollout outcome, by ``id()``), each step's ``time_split``: its consumed
    rollouts' summed (None when none of them has one)."""
    by_step: dict[tuple[str | None, str | None], list[Consumption]] = {}
    step_info: dict[tuple[str | None, str | None], tuple[int | None, int | str | None]] = {}
    for step in training.steps:
        run = step.attributes.get(c.RUN_ID)
        key: tuple[str | None, str | None] = (run if isinstance(run, str) else None, step.span_id)
        by_step.setdefault(key, [])
        step_info[key] = (
            read_int(step.attributes.get(c.TRAIN_STEP)),
            _version(step.attributes.get(c.POLICY_VERSION)),
        )
    for consumption in training.consumptions:
        key = (consumption.run_id, consumption.step_span_id)
        by_step.setdefault(key, []).append(consumption)
        step_info.setdefault(key, (consumption.step, consumption.step_version))
    objects = []
    for key, consumed in by_step.items():
        number, version = step_info[key]
        outcomes = {name: 0 for name in _OUTCOME_ORDER}
        wasted_seconds = 0.0
        wasted_tokens = 0
        staleness = []
        rewards = []
        slowest: tuple[float, str] | None = None
        time_split: TimeSplit | None = None
        for entry in consumed:
            outcomes[entry.outcome] = outcomes.get(entry.outcome, 0) + 1
            if entry.staleness is not None:
                staleness.append(entry.staleness)
            rollout = entry.rollout
            seconds = _seconds(rollout) if rollout is not None else 0.0
            if entry.outcome != c.TRAINED:
                wasted_seconds += seconds
                if rollout is not None:
                    wasted_tokens += training.tokens_by_trace.get(rollout.trace_id, 0)
            elif rollout is not None and rollout.outcome == c.OUTCOME_SCORED and rollout.reward is not None:
                rewards.append(rollout.reward)
            if rollout is not None and (slowest is None or seconds > slowest[0]):
                slowest = (seconds, rollout.rollout_id)
            split = splits.get(id(rollout)) if splits is not None and rollout is not None else None
            if split is not None:
                time_split = split if time_split is None else time_split + split
        objects.append(
            {
                "run_id": key[0],
                "train_step": number,
                "policy_version": version,
                "consumed": len(consumed),
                "outcomes": outcomes,
                "wasted_seconds": round(wasted_seconds, 6),
                "wasted_output_tokens": wasted_tokens,
                "staleness_p50": _median(staleness),
                "staleness_max": max(staleness) if staleness else None,
                "mean_reward_trained": _mean(rewards),
                "slowest": {"rollout_id": slowest[1], "seconds": round(slowest[0], 6)} if slowest else None,
                "time_split": time_split.seconds() if time_split is not None else None,
            }
        )
    objects.sort(key=lambda o: (o["run_id"] or "", o["train_step"] if o["train_step"] is not None else -1))
    return objects


def run_stats(training: Training, outcomes: Sequence[RolloutOutcome]) -> list[dict[str, Any]]:
    """Per training run: the share of all rollout time not trained on, and how many no step took."""
    objects = []
    for run_id in sorted(training.training_runs, key=lambda r: r or ""):
        total = wasted = 0.0
        unconsumed = 0
        for o in outcomes:
            if o.run_id != run_id:
                continue
            seconds = _seconds(o)
            total += seconds
            outcome = training.row(o).training_outcome
            if outcome != c.TRAINED:
                wasted += seconds
            if outcome == c.UNCONSUMED:
                unconsumed += 1
        objects.append(
            {
                "run_id": run_id,
                "rollout_seconds": round(total, 6),
                "wasted_seconds": round(wasted, 6),
                "wasted_share": wasted / total if total > 0 else None,
                "unconsumed": unconsumed,
            }
        )
    return objects


def version_stats(training: Training, outcomes: Sequence[RolloutOutcome]) -> list[dict[str, Any]]:
    """One object per policy version a rollout started under (in a run)."""
    groups: dict[tuple[str | None, str], list[RolloutOutcome]] = defaultdict(list)
    values: dict[tuple[str | None, str], int | str] = {}
    for o in outcomes:
        version = training.row(o).policy_version
        if version is None:
            continue
        key = (o.run_id, str(version))
        groups[key].append(o)
        values[key] = version
    keyed: list[tuple[tuple[str, tuple[int, int, str]], dict[str, Any]]] = []
    for key, members in groups.items():
        rewards = [o.reward for o in members if o.outcome == c.OUTCOME_SCORED and o.reward is not None]
        newer = sum(1 for o in members if training.row(o).policy_version_end not in (None, values[key]))
        keyed.append(
            (
                (key[0] or "", _sort_version(values[key])),
                {
                    "run_id": key[0],
                    "policy_version": values[key],
                    "rollouts": len(members),
                    "mean_reward": _mean(rewards),
                    "output_tokens": training.tokens_by_version.get(key, 0),
                    "ended_under_newer": newer,
                },
            )
        )
    keyed.sort(key=lambda pair: pair[0])
    return [obj for _, obj in keyed]


def _sort_version(version: int | str) -> tuple[int, int, str]:
    return (0, version, "") if isinstance(version, int) else (1, 0, version)


def group_stats(training: Training, outcomes: Sequence[RolloutOutcome]) -> list[dict[str, Any]]:
    """One object per group (run, group ID)."""
    groups: dict[tuple[str | None, str], list[RolloutOutcome]] = defaultdict(list)
    for o in outcomes:
        group = training.row(o).group_id
        if group is not None:
            groups[(o.run_id, group)].append(o)
    objects = []
    for (run_id, group), members in groups.items():
        sizes = [s for s in (training.row(o).group_size for o in members) if s is not None]
        rewards = [o.reward for o in members if o.outcome == c.OUTCOME_SCORED and o.reward is not None]
        outcomes_count: dict[str, int] = {}
        for o in members:
            name = training.row(o).training_outcome
            if name is not None:
                outcomes_count[name] = outcomes_count.get(name, 0) + 1
        objects.append(
            {
                "run_id": run_id,
                "group_id": group,
                "group_size": max(sizes) if sizes else None,
                "members": len(members),
                "mean_reward": _mean(rewards),
                "reward_std": statistics.pstdev(rewards) if rewards else None,
                "zero_variance": len(rewards) >= 2 and max(rewards) == min(rewards),
                "outcomes": outcomes_count,
            }
        )
    objects.sort(key=lambda o: (o["run_id"] or "", o["group_id"]))
    return objects


# -- what gymtrace check reports --------------------------------------------------------------------------


def training_problems(training: Training) -> list[tuple[str, str]]:
    """Violations: a rollout trained twice, a negative staleness, a group larger than declared."""
    problems: list[tuple[str, str]] = []
    trained: dict[int, list[Consumption]] = defaultdict(list)
    for entry in training.consumptions:
        if entry.rollout is not None and entry.outcome == c.TRAINED:
            trained[id(entry.rollout)].append(entry)
        if entry.staleness is not None and entry.staleness < 0:
            problems.append(
                (
                    "negative staleness",
                    f"rollout {entry.rollout_id}: consumed by train step {entry.step} at policy version"
                    f" {entry.step_version} with staleness {entry.staleness}: it started under a newer"
                    " version than the step's",
                )
            )
    for entries in trained.values():
        if len(entries) > 1:
            steps = ", ".join(str(e.step) for e in entries)
            problems.append(
                (
                    "trained twice",
                    f"rollout {entries[0].rollout_id}: trained {len(entries)} times (train steps {steps})",
                )
            )
    return problems + _group_problems(training)


def _group_problems(training: Training) -> list[tuple[str, str]]:
    members: dict[tuple[str | None, str], list[TrainingRow]] = defaultdict(list)
    for o in training.outcomes:
        row = training.row(o)
        if row.group_id is not None:
            members[(o.run_id, row.group_id)].append(row)
    problems = []
    for (_, group), rows in members.items():
        declared = max((r.group_size or 0) for r in rows)
        if declared and len(rows) > declared:
            problems.append(
                (
                    "group larger than declared",
                    f"group {group}: {len(rows)} rollouts, declared gym.group.size {declared}",
                )
            )
    return problems


def training_notes(training: Training) -> list[str]:
    """Warnings: a rollout ID consumed that no rollout of the input has (it may be sampled out)."""
    unknown = sorted({e.rollout_id for e in training.consumptions if e.rollout is None})
    return [
        f"rollout {rollout_id}: consumed by a train step but not in the input (sampled out, or in"
        " a file not given?)"
        for rollout_id in unknown
    ]
