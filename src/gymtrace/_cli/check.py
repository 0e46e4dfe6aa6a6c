"""``gymtrace check``: trace files against gymtrace's contract, and the notes that break no rule."""

from __future__ import annotations

import argparse

from gymtrace._cli.common import input_names, warn


def run(args: argparse.Namespace) -> int:
    from gymtrace._read.check.stream import check_files

    verdict = check_files(input_names(args.files), warn=warn)
    if verdict.problems:
        print(f"{len(verdict.problems)} contract violation(s) in {verdict.spans} spans:")
        for problem in verdict.problems:
            print(f"  - {problem}")
        return 1
    if not verdict.rollouts:
        # Spans without any rollout identity say nothing about the contract: not an OK (issue 25).
        print(f"nothing to check: {verdict.spans} spans, no rollouts (no gym.rollout span or outcome record)")
        return 1
    awaiting = verdict.awaiting
    print(
        f"OK: {verdict.spans} spans, {verdict.rollouts} rollouts, no contract violations"
        + (f"; {len(awaiting)} awaiting an outcome from another process:" if awaiting else "")
    )
    if verdict.outside:
        # Not a violation (a run's own work, a service's spans), but not vouched for either.
        print(f"  - {verdict.outside} gym spans carry no rollout identity: no outcome rule applies to them")
    for note in [*awaiting, *verdict.notes]:
        print(f"  - {note}")
    return 0
