"""``gymtrace check``: trace files against gymtrace's contract, and the notes that break no rule."""

from __future__ import annotations

import argparse

from gymtrace import _constants as c
from gymtrace._cli.common import read_files


def run(args: argparse.Namespace) -> int:
    from gymtrace._read.check import (
        awaiting_outcomes,
        check_spans,
        lost_notes,
        missing_service_notes,
        rerun_notes,
        training_notes,
    )
    from gymtrace._read.outcomes import final_outcomes

    spans = read_files(args.files)
    problems = check_spans(spans)
    rollouts = final_outcomes(spans)
    if problems:
        print(f"{len(problems)} contract violation(s) in {len(spans)} spans:")
        for problem in problems:
            print(f"  - {problem}")
        return 1
    if not rollouts:
        # Spans without any rollout identity say nothing about the contract: not an OK (issue 25).
        print(f"nothing to check: {len(spans)} spans, no rollouts (no gym.rollout span or outcome record)")
        return 1
    awaiting = awaiting_outcomes(spans)
    print(
        f"OK: {len(spans)} spans, {len(rollouts)} rollouts, no contract violations"
        + (f"; {len(awaiting)} awaiting an outcome from another process:" if awaiting else "")
    )
    outside = sum(
        1
        for s in spans
        if s.attributes.get(c.KIND) not in (None, c.KIND_RUN, c.KIND_TRAIN_STEP, c.KIND_CONSUMED)
        and not isinstance(s.attributes.get(c.ROLLOUT_ID), str)
    )
    if outside:
        # Not a violation (a run's own work, a service's spans), but not vouched for either.
        print(f"  - {outside} gym spans carry no rollout identity: no outcome rule applies to them")
    for note in [
        *awaiting,
        *rerun_notes(spans),
        *lost_notes(spans),
        *missing_service_notes(spans),
        *training_notes(spans),
    ]:
        print(f"  - {note}")
    return 0
