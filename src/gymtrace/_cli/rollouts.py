"""``gymtrace rollouts``: one line per rollout, its final outcome by the rule every reader applies."""

from __future__ import annotations

import argparse
import json
import sys

from gymtrace._cli.common import print_table, read_summary


def run(args: argparse.Namespace) -> int:
    from gymtrace._read.outcomes import dedupe, final_outcomes
    from gymtrace._read.source import time_splits
    from gymtrace._read.timesplit import split_json
    from gymtrace._read.training import finish_rows, read_training

    summary = read_summary(args)
    spans = summary.spans
    # The JSON lines' time splits, worked out beside the outcomes (a big input: another process).
    with time_splits(summary, wanted=args.json) as splits_of:
        data = dedupe(spans)
        outcomes = final_outcomes(spans, run_id=args.run, data=data)
        if not outcomes:
            print("no rollouts found", file=sys.stderr)
            return 1
        if args.json:
            training = read_training(data, outcomes, summary.tokens)
            finish_rows(training, outcomes)
            splits = splits_of(outcomes)
            for o in outcomes:
                time_split = split_json(splits[id(o)])
                print(json.dumps({**o.as_json(), **training.row(o).as_json(), "time_split": time_split}))
            return 0
    rows = [
        (
            o.run_id or "-",
            o.task_id or "-",
            o.rollout_id,
            "-" if o.repeat is None else str(o.repeat),
            o.outcome,
            _reward_text(o.reward),
            str(o.attempts)
            + (f" ({o.task_reruns} Ray re-run)" if o.task_reruns else "")
            + (
                f" (+{len(o.lost_attempts)} lost: {_attempts_text(o.lost_attempts)})"
                if o.lost_attempts
                else ""
            ),
            _ran_in(o.services),
            o.source,
        )
        for o in outcomes
    ]
    print_table(
        ("RUN", "TASK", "ROLLOUT", "REPEAT", "OUTCOME", "REWARD", "ATTEMPTS", "RAN IN", "DECIDED BY"), rows
    )
    return 0


def _reward_text(reward: float | None) -> str:
    return "-" if reward is None else f"{reward:g}"


def _ran_in(services: tuple[str, ...]) -> str:
    """One service name when every attempt ran there, else ``attempt@service`` per attempt."""
    if not services:
        return "-"
    if len(set(services)) == 1 and services[0]:
        return services[0]
    return " ".join(f"{attempt}@{service or '?'}" for attempt, service in enumerate(services))


def _attempts_text(attempts: tuple[int, ...]) -> str:
    return ("attempt " if len(attempts) == 1 else "attempts ") + ", ".join(map(str, attempts))
