"""``gymtrace stats``: per run, rollouts scored and unscored, the mean reward, pass@k.

Its lines (:func:`print_stats`) are also the demo's summary.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from gymtrace._cli.common import read_spans

if TYPE_CHECKING:
    from gymtrace._read.passk import PassK
    from gymtrace._read.stats import RunStats


def run(args: argparse.Namespace) -> int:
    from gymtrace._read.outcomes import final_outcomes
    from gymtrace._read.passk import per_task
    from gymtrace._read.stats import summarise

    if args.pass_k is not None and args.pass_k < 1:
        print("gymtrace stats: --pass-k must be at least 1", file=sys.stderr)
        return 2
    outcomes = final_outcomes(read_spans(args), run_id=args.run)
    stats = summarise(
        outcomes=outcomes, failed_as_zero=args.failed_as_zero, pass_threshold=args.pass_threshold
    )
    if not stats:
        print("no rollouts found", file=sys.stderr)
        return 1
    for run in stats:
        body = run.as_json()
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
        if pass_k is not None:
            _print_pass_k(pass_k)
    return 0


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
    if run.runs_sharing_id > 1:
        line += f" [{run.runs_sharing_id} runs share run ID {run.run_id}: appended re-run? this one is run span {run.run_span_id}]"
    return line
