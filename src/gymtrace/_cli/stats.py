"""``gymtrace stats``: per run, rollouts scored and unscored, the mean reward, pass@k.

Its lines (:func:`print_stats`) are also the demo's summary.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from gymtrace import _constants as c
from gymtrace._cli.common import read_summary

if TYPE_CHECKING:
    from collections.abc import Callable

    from gymtrace._model.spandata import SpanData
    from gymtrace._read.outcomes import RolloutOutcome
    from gymtrace._read.passk import PassK
    from gymtrace._read.source import Summary
    from gymtrace._read.stats import RunStats
    from gymtrace._read.timesplit import TimeSplit


def run(args: argparse.Namespace) -> int:
    from gymtrace._read.outcomes import dedupe, final_outcomes
    from gymtrace._read.passk import per_task
    from gymtrace._read.source import time_splits
    from gymtrace._read.stats import members_of, summarise
    from gymtrace._read.timesplit import rollout_seconds, run_times, times_text

    if args.pass_k is not None and args.pass_k < 1:
        print("gymtrace stats: --pass-k must be at least 1", file=sys.stderr)
        return 2
    summary = read_summary(args)
    # The time splits (every view but --by policy_version and group), worked out beside the
    # outcomes (a big input: another process).
    with time_splits(summary, wanted=args.by in (None, "train_step")) as splits_of:
        data = dedupe(summary.spans)
        outcomes = final_outcomes(summary.spans, run_id=args.run, data=data)
        if args.by is not None:
            return _by(args, summary, data, outcomes, splits_of)
        stats = summarise(
            outcomes=outcomes, failed_as_zero=args.failed_as_zero, pass_threshold=args.pass_threshold
        )
        if not stats:
            print("no rollouts found", file=sys.stderr)
            return 1
        splits = splits_of(outcomes)
    for run in stats:
        body = run.as_json()
        members = members_of(run, outcomes)
        body.update(run_times([splits[id(o)] for o in members], [rollout_seconds(o.root) for o in members]))
        pass_k = None
        if args.pass_k is not None:
            pass_k = per_task(
                (o for o in outcomes if o.run_id == run.run_id), args.pass_k, args.pass_threshold
            )
            body["pass_k"] = pass_k.as_json()
        if args.json:
            print(json.dumps(body))
            continue
        print_stats(run, failed_as_zero=args.failed_as_zero)
        print("  " + times_text(body))
        if pass_k is not None:
            _print_pass_k(pass_k)
    return 0


def _by(
    args: argparse.Namespace,
    summary: Summary,
    data: list[SpanData],
    outcomes: list[RolloutOutcome],
    splits_of: Callable[[list[RolloutOutcome]], dict[int, TimeSplit | None]],
) -> int:
    """``--by train_step|policy_version|group``: one object (or line) per step, version or group."""
    from gymtrace._read.training import (
        finish_rows,
        group_stats,
        read_training,
        run_stats,
        step_stats,
        version_stats,
    )

    training = read_training(data, outcomes, summary.tokens)
    finish_rows(training, outcomes)
    if args.run is not None:
        training.consumptions = [e for e in training.consumptions if e.run_id == args.run]
        training.steps = [s for s in training.steps if s.attributes.get(c.RUN_ID) == args.run]
        training.training_runs = {r for r in training.training_runs if r == args.run}
    if args.by == "train_step":
        objects = step_stats(training, splits_of(outcomes))
        runs = run_stats(training, outcomes)
    elif args.by == "policy_version":
        objects, runs = version_stats(training, outcomes), []
    else:
        objects, runs = group_stats(training, outcomes), []
    if not objects and not runs:
        print(f"no {args.by.replace('_', ' ')}s found", file=sys.stderr)
        return 1
    for body in [*objects, *runs]:
        print(json.dumps(body) if args.json else _by_line(body))
    return 0


def _number(value: object) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _by_line(body: dict[str, Any]) -> str:
    from gymtrace._read.timesplit import split_text

    run = body.get("run_id") or "(no run)"
    if "train_step" in body:
        outcomes = ", ".join(f"{n} {name}" for name, n in body["outcomes"].items() if n)
        slowest = body["slowest"]
        return (
            f"run {run} step {_number(body['train_step'])} (policy {_number(body['policy_version'])}):"
            f" {body['consumed']} consumed ({outcomes or 'none'}); wasted {_number(body['wasted_seconds'])}s,"
            f" {body['wasted_output_tokens']} output tokens; staleness p50 {_number(body['staleness_p50'])}"
            f" max {_number(body['staleness_max'])}; mean reward trained {_number(body['mean_reward_trained'])}"
            + (f"; slowest {slowest['rollout_id']} {_number(slowest['seconds'])}s" if slowest else "")
            + (f"; time {split_text(body['time_split'])}" if body.get("time_split") else "")
        )
    if "wasted_share" in body:
        share = body["wasted_share"]
        return (
            f"run {run}: {'-' if share is None else f'{share:.1%}'} of {_number(body['rollout_seconds'])}"
            f" rollout-seconds not trained on; {body['unconsumed']} rollouts unconsumed"
        )
    if "policy_version" in body:
        return (
            f"run {run} policy {_number(body['policy_version'])}: {body['rollouts']} rollouts, mean reward"
            f" {_number(body['mean_reward'])}, {body['output_tokens']} output tokens,"
            f" {body['ended_under_newer']} ended under a newer version"
        )
    outcomes = ", ".join(f"{n} {name}" for name, n in body["outcomes"].items())
    return (
        f"run {run} group {body['group_id']}: {body['members']} of {_number(body['group_size'])} seen,"
        f" mean reward {_number(body['mean_reward'])} std {_number(body['reward_std'])}"
        + (" (zero variance)" if body["zero_variance"] else "")
        + (f"; {outcomes}" if outcomes else "")
    )


def _print_pass_k(pass_k: PassK, indent: str = "  ") -> None:
    mean = "n/a" if pass_k.mean is None else f"{pass_k.mean:.4g}"
    print(
        f"{indent}pass@{pass_k.k}: {mean} over {len(pass_k.tasks)} tasks"
        + (
            f" ({pass_k.too_few} with fewer than {pass_k.k} scored repeats left out)"
            if pass_k.too_few
            else ""
        )
        + (f"; {pass_k.unscored} unscored repeats not counted" if pass_k.unscored else "")
    )


def print_stats(run: RunStats, *, failed_as_zero: bool, indent: str = "") -> None:
    print(indent + _stats_line(run, failed_as_zero=failed_as_zero))
    for p in run.pass_at_k:
        unscored = f"; {p.unscored} unscored, not counted" if p.unscored else ""
        value = "n/a" if p.value is None else f"{p.value:g}"
        print(f"{indent}  pass@{p.k} {p.task_id}: {value} ({p.passed}/{p.n} scored repeats passed{unscored})")


def _stats_line(run: RunStats, *, failed_as_zero: bool) -> str:
    mean = "n/a" if run.mean_reward is None else f"{run.mean_reward:.4g}"
    over = "scored and unscored as 0" if failed_as_zero else "scored only"
    line = (
        f"run {run.run_id or '(no run)'}: {run.rollouts} rollouts, {run.scored} scored, {run.unscored} unscored"
        + (f", {run.pending} pending (outcome expected from another process)" if run.pending else "")
        + (f", {run.lost} lost (its process died before it ended)" if run.lost else "")
        + (
            f", {run.lost_attempts} lost attempt(s) (killed, then run again by a resume)"
            if run.lost_attempts
            else ""
        )
        + ";"
        f" mean {mean} over {run.inputs} input{'s' if run.inputs != 1 else ''} ({over})"
    )
    if run.rollouts_with_detail < run.rollouts:
        # Head sampling: the counts and the mean are over every rollout, the detail over these.
        line += f"; {run.rollouts_with_detail} of {run.rollouts} rollouts with detail (the rest sampled out)"
    if run.runs_sharing_id > 1:
        line += f" [{run.runs_sharing_id} runs share run ID {run.run_id}: appended re-run? this one is run span {run.run_span_id}]"
    return line
