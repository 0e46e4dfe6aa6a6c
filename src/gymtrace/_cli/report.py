"""``gymtrace report``: one self-contained HTML page of a run (outcomes, rewards, pass@k, where the
time went, the timeline, the slowest and the failed rollouts), beside a baseline run when given."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gymtrace._cli.common import input_names, read_picture, warn
from gymtrace._read.passk import PASS_THRESHOLD

if TYPE_CHECKING:
    from gymtrace._read.pictures.runview import RunView

DEFAULT_OUTPUT = "gymtrace-report.html"


def run(args: argparse.Namespace) -> int:
    from gymtrace._read.pictures.runview import RunNotFound, read_view

    if args.baseline_run is not None and not args.baseline:
        print("gymtrace report: --baseline-run needs --baseline FILE|DIR", file=sys.stderr)
        return 2
    try:
        view = read_picture(args)
        baseline = (
            read_view(args.baseline, args.baseline_run, lanes_by=args.lanes, warn=warn)
            if args.baseline
            else None
        )
    except RunNotFound as exc:
        print(f"gymtrace report: {exc}", file=sys.stderr)
        return 2
    out = write_report(
        view,
        [f"Jaeger at {args.jaeger}"] if args.jaeger else input_names(args.files),
        Path(args.output or DEFAULT_OUTPUT),
        baseline,
        args.baseline or (),
        pass_threshold=args.pass_threshold,
        max_unscored_gap=args.max_unscored_gap,
    )
    print(f"run {view.name}: {len(view.rollouts)} rollouts -> {out}")
    return 0


def write_report(
    view: RunView,
    sources: Sequence[str],
    out: Path,
    baseline: RunView | None = None,
    baseline_sources: Sequence[str] = (),
    *,
    pass_threshold: float = PASS_THRESHOLD,
    max_unscored_gap: float = 10.0,
) -> Path:
    """Write the report of ``view`` to ``out`` (the demo writes one too); with ``baseline``,
    ``gymtrace compare``'s verdicts, the baseline as A."""
    from gymtrace._read.compare import compare
    from gymtrace._read.pictures.report import report_page

    comparison = None
    if baseline is not None:
        comparison = compare(
            baseline.outcomes, view.outcomes, threshold=pass_threshold, max_unscored_gap_pp=max_unscored_gap
        )
    page = report_page(
        view,
        source=", ".join(sources),
        baseline=baseline,
        baseline_source=", ".join(baseline_sources),
        comparison=comparison,
    )
    out.write_text(page, encoding="utf-8")
    return out
