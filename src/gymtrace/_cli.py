"""The ``gymtrace`` command: ``demo``, ``tree``, ``check``, ``rollouts`` and ``stats``.

The only module that prints.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gymtrace import _constants as c
from gymtrace._environment import DEFAULT_FILE, GYMTRACE_FILE
from gymtrace._spandata import SpanData, TraceFileError, read_otlp_json_lines

if TYPE_CHECKING:
    from gymtrace._outcomes import RunStats


def _default_file() -> str:
    return os.environ.get(GYMTRACE_FILE) or DEFAULT_FILE


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gymtrace", description="OpenTelemetry traces of RL rollouts.")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="trace a small simulated gym run and print its span tree")
    demo.add_argument(
        "--file", help=f"OTLP/JSON lines file to write (default: ${GYMTRACE_FILE} or {DEFAULT_FILE})"
    )
    demo.add_argument(
        "--endpoint", help="also export over OTLP to this endpoint (default: $OTEL_EXPORTER_OTLP_ENDPOINT)"
    )
    demo.add_argument("--protocol", choices=("grpc", "http/protobuf"), help="OTLP protocol (default: grpc)")
    demo.add_argument("--repeats", type=int, default=2, help="num_repeats per task (default: 2)")
    demo.add_argument("--run-id", help="the run ID (default: a new one)")
    demo.add_argument("--quiet", action="store_true", help="print the summary only, not the tree")
    demo.add_argument(
        "--distributed", action="store_true", help="run agent, model and environment as separate processes"
    )

    tree = sub.add_parser("tree", help="print span trees from a trace file or from Jaeger")
    tree.add_argument(
        "file", nargs="?", help=f"OTLP/JSON lines file (default: {DEFAULT_FILE}); ignored with --jaeger"
    )
    tree.add_argument("--jaeger", metavar="URL", help="Jaeger query URL, e.g. http://127.0.0.1:16686")
    tree.add_argument("--service", help="service to search in Jaeger (default: every service)")
    pick = tree.add_mutually_exclusive_group()
    pick.add_argument("--trace", metavar="TRACE_ID", help="one trace by ID")
    pick.add_argument("--rollout", metavar="ROLLOUT_ID", help="the trace(s) of one rollout (gym.rollout.id)")
    pick.add_argument("--run", metavar="RUN_ID", help="every rollout of a run (gym.run.id)")
    tree.add_argument("--ids", action="store_true", help="show span IDs")

    check = sub.add_parser("check", help="check trace files against gymtrace's contract")
    check.add_argument("files", nargs="*", help=f"OTLP/JSON lines files (default: {DEFAULT_FILE})")

    rollouts = sub.add_parser(
        "rollouts", help="one line per rollout: its final outcome, reward, attempts and where they ran"
    )
    _add_reader_arguments(rollouts)
    rollouts.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per line (run_id, task_id, rollout_id, repeat, outcome, reward, attempts, ...)",
    )

    stats = sub.add_parser("stats", help="per run: rollouts scored and unscored, mean reward, pass@k")
    _add_reader_arguments(stats)
    stats.add_argument(
        "--failed-as-zero",
        action="store_true",
        help="count each unscored rollout as a reward of 0 in the mean (default: mean over scored only)",
    )
    stats.add_argument(
        "--pass-threshold",
        type=float,
        default=0.0,
        metavar="X",
        help="pass@k: a repeat passes when its reward is above X (default: 0)",
    )
    stats.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per run (run_id, scored, unscored, inputs, mean_reward, ...)",
    )
    return parser


def _add_reader_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="*", help=f"OTLP/JSON lines files (default: {DEFAULT_FILE})")
    parser.add_argument(
        "--jaeger", metavar="URL", help="read from Jaeger's query API instead, e.g. http://127.0.0.1:16686"
    )
    parser.add_argument("--service", help="service to search in Jaeger (default: every service)")
    parser.add_argument("--run", metavar="RUN_ID", help="only this run (gym.run.id)")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "demo":
            return _demo(args)
        if args.command == "tree":
            return _tree(args)
        if args.command == "rollouts":
            return _rollouts(args)
        if args.command == "stats":
            return _stats(args)
        return _check(args)
    except (TraceFileError, OSError) as exc:
        print(f"gymtrace {args.command}: {exc}", file=sys.stderr)
        return 2


def _demo(args: argparse.Namespace) -> int:
    if args.repeats < 1:
        print("gymtrace demo: --repeats must be at least 1", file=sys.stderr)
        return 2
    if args.distributed:
        from gymtrace._demo_distributed import run as run_distributed

        forwarded = ["--repeats", str(args.repeats)]
        if args.file:
            forwarded += ["--file", args.file]
        code: int = run_distributed(forwarded)
        return code

    import gymtrace
    from gymtrace._demo import run_demo
    from gymtrace._render import render_tree

    path = args.file or _default_file()
    endpoint = args.endpoint or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    config = gymtrace.configure(
        service_name="gymtrace-demo", endpoint=endpoint, protocol=args.protocol, file=path
    )
    run_id = args.run_id or f"demo-{uuid.uuid4().hex[:8]}"
    started = time.perf_counter()
    result = asyncio.run(run_demo(run_id=run_id, repeats=args.repeats))
    elapsed = time.perf_counter() - started
    gymtrace.force_flush()

    spans = [s for s in read_otlp_json_lines(path) if s.attributes.get(c.RUN_ID) == run_id]
    if not args.quiet:
        print(render_tree(spans))
        print()
    _print_summary(spans, result.rewards, elapsed)
    from gymtrace._check import check_spans

    problems = check_spans(spans)
    print(f"contract check: {'OK' if not problems else f'{len(problems)} problem(s)'}")
    for problem in problems:
        print(f"  - {problem}")
    targets = ", ".join(
        f"OTLP/{config.protocol} {config.endpoint}"
        if name == "otlp"
        else f"{path}"
        if name == "file"
        else name
        for name in config.exporters
    )
    print(f"spans written to: {targets}")
    print(f"look again with: gymtrace tree {path} --run {run_id}")
    gymtrace.shutdown()
    return 1 if problems else 0


def _print_summary(spans: list[SpanData], rewards: dict[str, float | None], elapsed: float) -> None:
    """The demo's summary, computed by the same code as ``gymtrace stats`` and ``rollouts``."""
    from gymtrace._outcomes import final_outcomes, summarise

    outcomes = final_outcomes(spans)
    episodes = [s for s in spans if s.attributes.get(c.KIND) == c.KIND_EPISODE]
    scored = sum(1 for o in outcomes if o.outcome == c.OUTCOME_SCORED)
    print(
        f"run finished in {elapsed:.2f}s: {len(outcomes)} rollouts ({scored} scored,"
        f" {len(outcomes) - scored} unscored), {len(episodes)} episodes, {len(spans)} spans"
    )
    for run in summarise(outcomes=outcomes):
        _print_stats(run, failed_as_zero=False, indent="  ")
    by_name = {f"{o.task_id}/r{o.repeat}": o for o in outcomes}
    for name in sorted(rewards):
        o = by_name.get(name)
        final = "missing" if o is None else "unscored" if o.reward is None else f"{o.reward:g}"
        print(f"  {name:<16} reward={final}")


def _load(args: argparse.Namespace) -> list[SpanData]:
    if args.jaeger:
        from gymtrace._jaeger import JaegerClient

        client = JaegerClient(args.jaeger)
        if args.trace:
            return client.trace(args.trace)
        tags = {c.ROLLOUT_ID: args.rollout} if args.rollout else {c.RUN_ID: args.run} if args.run else {}
        found: list[SpanData] = client.search(args.service, tags)
        return found
    spans = read_otlp_json_lines(args.file or _default_file())
    if args.trace:
        return [s for s in spans if s.trace_id == args.trace.lower().rjust(32, "0")]
    if args.rollout or args.run:
        key, value = (c.ROLLOUT_ID, args.rollout) if args.rollout else (c.RUN_ID, args.run)
        traces = {s.trace_id for s in spans if s.attributes.get(key) == value}
        return [s for s in spans if s.trace_id in traces]
    return spans


def _tree(args: argparse.Namespace) -> int:
    from gymtrace._render import render_tree

    spans = _load(args)
    if not spans:
        print("no spans found", file=sys.stderr)
        return 1
    print(render_tree(spans, show_ids=args.ids))
    return 0


def _check(args: argparse.Namespace) -> int:
    from gymtrace._check import check_spans

    files = args.files or [_default_file()]
    spans: list[SpanData] = []
    for path in files:
        spans.extend(read_otlp_json_lines(path))
    from gymtrace._outcomes import final_outcomes

    problems = check_spans(spans)
    rollouts = final_outcomes(spans)
    if problems:
        print(f"{len(problems)} contract violation(s) in {len(spans)} spans:")
        for problem in problems:
            print(f"  - {problem}")
        return 1
    print(f"OK: {len(spans)} spans, {len(rollouts)} rollouts, no contract violations")
    return 0


def _read(args: argparse.Namespace) -> list[SpanData]:
    """The spans ``rollouts`` and ``stats`` read: files, or Jaeger (searched by run ID if given)."""
    if args.jaeger:
        from gymtrace._jaeger import JaegerClient

        if args.files:
            raise TraceFileError("give trace files or --jaeger, not both")
        found: list[SpanData] = JaegerClient(args.jaeger).search(
            args.service, {c.RUN_ID: args.run} if args.run else {}
        )
        return found
    spans: list[SpanData] = []
    for path in args.files or [_default_file()]:
        spans.extend(read_otlp_json_lines(path))
    return spans


def _reward_text(reward: float | None) -> str:
    return "-" if reward is None else f"{reward:g}"


def _rollouts(args: argparse.Namespace) -> int:
    from gymtrace._outcomes import final_outcomes

    outcomes = final_outcomes(_read(args), run_id=args.run)
    if not outcomes:
        print("no rollouts found", file=sys.stderr)
        return 1
    if args.json:
        for o in outcomes:
            print(json.dumps(o.as_json()))
        return 0
    rows = [
        (
            o.run_id or "-",
            o.task_id or "-",
            o.rollout_id,
            "-" if o.repeat is None else str(o.repeat),
            o.outcome,
            _reward_text(o.reward),
            str(o.attempts),
            _ran_in(o.services),
            o.source,
        )
        for o in outcomes
    ]
    header = ("RUN", "TASK", "ROLLOUT", "REPEAT", "OUTCOME", "REWARD", "ATTEMPTS", "RAN IN", "DECIDED BY")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    return 0


def _ran_in(services: tuple[str, ...]) -> str:
    """One service name when every attempt ran there, else ``attempt@service`` per attempt."""
    if not services:
        return "-"
    if len(set(services)) == 1 and services[0]:
        return services[0]
    return " ".join(f"{attempt}@{service or '?'}" for attempt, service in enumerate(services))


def _stats(args: argparse.Namespace) -> int:
    from gymtrace._outcomes import summarise

    stats = summarise(
        _read(args), run_id=args.run, failed_as_zero=args.failed_as_zero, pass_threshold=args.pass_threshold
    )
    if not stats:
        print("no rollouts found", file=sys.stderr)
        return 1
    for run in stats:
        if args.json:
            print(json.dumps(run.as_json()))
            continue
        _print_stats(run, failed_as_zero=args.failed_as_zero)
    return 0


def _print_stats(run: RunStats, *, failed_as_zero: bool, indent: str = "") -> None:
    print(indent + _stats_line(run, failed_as_zero=failed_as_zero))
    for p in run.pass_at_k:
        print(f"{indent}  pass@{p.k} {p.task_id}: {p.value:g} ({p.passed}/{p.k} repeats passed)")


def _stats_line(run: RunStats, *, failed_as_zero: bool) -> str:
    mean = "n/a" if run.mean_reward is None else f"{run.mean_reward:.4g}"
    over = "scored and unscored as 0" if failed_as_zero else "scored only"
    line = (
        f"run {run.run_id or '(no run)'}: {run.rollouts} rollouts, {run.scored} scored, {run.unscored} unscored;"
        f" mean {mean} over {run.inputs} input{'s' if run.inputs != 1 else ''} ({over})"
    )
    if run.runs_sharing_id > 1:
        line += f" [{run.runs_sharing_id} runs share run ID {run.run_id}: appended re-run? this one is run span {run.run_span_id}]"
    return line


if __name__ == "__main__":
    raise SystemExit(main())
