"""The ``gymtrace`` command: ``demo``, ``tree`` and ``check``. The only module that prints.

``demo-service`` serves one service of ``demo --distributed``, which starts them as processes.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gymtrace import _constants as c
from gymtrace import _settings
from gymtrace._environment import DEFAULT_FILE, GYMTRACE_FILE
from gymtrace._spandata import SpanData, TraceFileError, read_otlp_json_lines

if TYPE_CHECKING:
    from gymtrace.demo.distributed import DistributedResult


def _default_file() -> str:
    return _settings.resolve(file=True).file or DEFAULT_FILE


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

    service = sub.add_parser(
        "demo-service", help="serve one service of `demo --distributed` (which starts them itself)"
    )
    service.add_argument("--role", choices=("agent", "model", "env"), required=True)
    service.add_argument("--service", help="its service.name (tracing is not configured without one)")
    service.add_argument("--crash-rollout", metavar="ROLLOUT_ID", help="env: die on this rollout's attempt 0")
    service.add_argument("--official", action="store_true", help="add the official HTTP instrumentations")

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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "demo":
            return _demo(args)
        if args.command == "demo-service":
            return _demo_service(args)
        if args.command == "tree":
            return _tree(args)
        return _check(args)
    except (TraceFileError, OSError) as exc:
        print(f"gymtrace {args.command}: {exc}", file=sys.stderr)
        return 2


def _demo(args: argparse.Namespace) -> int:
    if args.repeats < 1:
        print("gymtrace demo: --repeats must be at least 1", file=sys.stderr)
        return 2
    if args.distributed:
        return _demo_distributed(args)

    from gymtrace._render import render_tree
    from gymtrace.demo.local import run_local

    result = run_local(
        run_id=args.run_id or f"demo-{uuid.uuid4().hex[:8]}",
        file=args.file or _default_file(),
        repeats=args.repeats,
        endpoint=args.endpoint,  # None: configure() reads OTEL_EXPORTER_OTLP_ENDPOINT
        protocol=args.protocol,
    )
    if not args.quiet:
        print(render_tree(result.spans))
        print()
    _print_summary(result.spans, result.rewards, result.elapsed)
    print(f"contract check: {'OK' if not result.problems else f'{len(result.problems)} problem(s)'}")
    for problem in result.problems:
        print(f"  - {problem}")
    print(f"spans written to: {', '.join(result.targets)}")
    print(f"look again with: gymtrace tree {result.file} --run {result.run_id}")
    return 1 if result.problems else 0


def _demo_distributed(args: argparse.Namespace) -> int:
    from gymtrace.demo.distributed import missing_requirements, run_distributed

    missing = missing_requirements()
    if missing is not None:
        print(f"gymtrace demo --distributed needs: {missing}", file=sys.stderr)
        return 2
    try:
        result = run_distributed(
            run_id=args.run_id or f"demo-{uuid.uuid4().hex[:8]}",
            repeats=args.repeats,
            file=args.file,
            endpoint=args.endpoint,
            protocol=args.protocol,
        )
    except KeyboardInterrupt:
        print("interrupted; services stopped", file=sys.stderr)
        return 130
    return _print_distributed(result, quiet=args.quiet)


def _print_distributed(result: DistributedResult, *, quiet: bool) -> int:
    for summary in result.rollouts:
        reward = "unscored" if summary["reward"] is None else f"reward={summary['reward']:g}"
        print(
            f"rollout {summary['rollout_id']}: {summary['attempts']} attempt(s), {reward}, "
            f"trace {summary['trace_id']}"
        )
    if result.endpoint is not None:
        print(
            f"spans exported to OTLP/{result.protocol} {result.endpoint};"
            f' search Jaeger for the tag gym.rollout.id or run id "{result.run_id}"'
        )
        return 0
    if not quiet:
        from gymtrace._render import render_tree

        print(render_tree(result.spans))
    services = len({s.service for s in result.spans})
    print(f"{len(result.spans)} spans from {services} services appended to {result.file}")
    return 0


def _demo_service(args: argparse.Namespace) -> int:
    from gymtrace.demo.services import READY_PREFIX, app_for, serve

    def announce(port: int) -> None:
        print(f"{READY_PREFIX}{port}", flush=True)  # the line ServiceProcess waits for

    return serve(
        app_for(args.role, crash_rollout=args.crash_rollout),
        service_name=args.service,
        on_ready=announce,
        official=args.official,
        instrument=args.official,
    )


def _print_summary(spans: list[SpanData], rewards: dict[str, float | None], elapsed: float) -> None:
    rollouts = [s for s in spans if s.attributes.get(c.KIND) == c.KIND_ROLLOUT]
    episodes = [s for s in spans if s.attributes.get(c.KIND) == c.KIND_EPISODE]
    scored = [r for r in rollouts if r.attributes.get(c.ROLLOUT_OUTCOME) == c.OUTCOME_SCORED]
    print(
        f"run finished in {elapsed:.2f}s: {len(rollouts)} rollouts ({len(scored)} scored,"
        f" {len(rollouts) - len(scored)} unscored), {len(episodes)} episodes, {len(spans)} spans"
    )
    for name, reward in sorted(rewards.items()):
        print(f"  {name:<16} reward={'unscored' if reward is None else f'{reward:g}'}")


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
    problems = check_spans(spans)
    rollouts = {s.attributes.get(c.ROLLOUT_ID) for s in spans if s.attributes.get(c.KIND) == c.KIND_ROLLOUT}
    if problems:
        print(f"{len(problems)} contract violation(s) in {len(spans)} spans:")
        for problem in problems:
            print(f"  - {problem}")
        return 1
    print(f"OK: {len(spans)} spans, {len(rollouts)} rollouts, no contract violations")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
