"""``gymtrace compare``: per task, run B's mean reward minus run A's, a bootstrap interval and flips."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from gymtrace import _constants as c
from gymtrace._cli.common import warn
from gymtrace._model.spandata import SpanData

if TYPE_CHECKING:
    from gymtrace._read.compare import Comparison


def _run_spans(args: argparse.Namespace, which: str) -> list[SpanData]:
    """The spans of run A or B: a run ID searched in Jaeger, a trace file, or a directory of them."""

    given = getattr(args, which)
    if args.jaeger:
        from gymtrace._read.jaeger import JaegerClient
        from gymtrace._read.source import summary_of_traces

        client = JaegerClient(args.jaeger)
        return summary_of_traces(client.traces(args.service, {c.RUN_ID: given})).spans
    path = Path(given)
    files = (
        sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
        if path.is_dir()
        else [path]
    )
    from gymtrace._read.source import read_summary_spans

    return read_summary_spans([str(p) for p in files], warn).spans


def run(args: argparse.Namespace) -> int:
    from gymtrace._read.compare import compare
    from gymtrace._read.outcomes import final_outcomes
    from gymtrace._read.passk import per_task

    if args.max_unscored_gap < 0:
        print("gymtrace compare: --max-unscored-gap must be at least 0", file=sys.stderr)
        return 2
    if args.pass_k is not None and args.pass_k < 1:
        print("gymtrace compare: --pass-k must be at least 1", file=sys.stderr)
        return 2
    sides = []
    for which in ("a", "b"):
        outcomes = final_outcomes(
            _run_spans(args, which), run_id=getattr(args, which) if args.jaeger else None
        )
        runs = sorted({o.run_id or "(no run)" for o in outcomes})
        if not outcomes:
            print(
                f"gymtrace compare: no rollouts in {which.upper()} ({getattr(args, which)})", file=sys.stderr
            )
            return 1
        if len(runs) > 1:
            print(
                f"gymtrace compare: {which.upper()} holds {len(runs)} runs ({', '.join(runs)}); give one run per side",
                file=sys.stderr,
            )
            return 2
        sides.append((runs[0], outcomes))
    (run_a, a), (run_b, b) = sides
    result = compare(a, b, threshold=args.pass_threshold, max_unscored_gap_pp=args.max_unscored_gap)
    if args.pass_k is not None:
        result.extra["pass_k"] = {
            side: per_task(outcomes, args.pass_k, args.pass_threshold).as_json()
            for side, outcomes in (("a", a), ("b", b))
        }
    result.extra["a_run_id"], result.extra["b_run_id"] = run_a, run_b
    if args.json:
        print(json.dumps(result.as_json()))
    else:
        _print_comparison(result, run_a, run_b)
    return 0


def _print_comparison(result: Comparison, run_a: str, run_b: str) -> None:
    def num(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"

    def delta_bar(delta: float | None, width: int = 10) -> str:
        # One column per tenth of reward on each side of 0: a terminal plot of the per-task deltas.
        if delta is None:
            return " " * width + "?" + " " * width
        cells = min(width, round(abs(delta) * width))
        left = " " * (width - cells) + "#" * cells if delta < 0 else " " * width
        right = "#" * cells + " " * (width - cells) if delta > 0 else " " * width
        return f"{left}|{right}"

    print(f"A = {run_a}    B = {run_b}    (every delta is B - A)")
    header = ("TASK", "A MEAN", "A N", "B MEAN", "B N", "DELTA")
    rows = [
        (
            t.task_id,
            num(t.a.mean),
            f"{t.a.n}/{t.a.repeats}",
            num(t.b.mean),
            f"{t.b.n}/{t.b.repeats}",
            num(t.delta),
        )
        for t in result.tasks
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    print(
        "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
        + "  -1"
        + " " * 8
        + "0"
        + " " * 8
        + "+1"
    )
    for row, task in zip(rows, result.tasks, strict=True):
        print(
            "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
            + "  "
            + delta_bar(task.delta)
        )
    ci = "n/a" if result.ci95 is None else f"[{result.ci95[0]:+.3f}, {result.ci95[1]:+.3f}]"
    delta = "n/a" if result.delta is None else f"{result.delta:+.3f}"
    print(f"mean delta {delta}, 95% CI {ci} (paired bootstrap over tasks and their repeats)")
    print(f"unscored: A {result.a_unscored_share:.1%}, B {result.b_unscored_share:.1%}")
    print(
        f"flips at {result.threshold:g}: pass->fail {len(result.pass_to_fail)} {list(result.pass_to_fail)},"
        f" fail->pass {len(result.fail_to_pass)} {list(result.fail_to_pass)}"
    )
    for side in ("a", "b"):
        pass_k = result.extra.get("pass_k", {}).get(side)
        if pass_k is not None:
            mean = "n/a" if pass_k["mean"] is None else f"{pass_k['mean']:.4g}"
            unscored = f"; {pass_k['unscored']} unscored repeats not counted" if pass_k["unscored"] else ""
            print(f"pass@{pass_k['k']} {side.upper()}: {mean} over {len(pass_k['tasks'])} tasks{unscored}")
    print(f"verdict: {result.verdict} ({result.reason})")
