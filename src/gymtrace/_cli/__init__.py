"""The ``gymtrace`` command: ``demo``, ``tree``, ``check``, ``rollouts``, ``stats``, ``live``, ``import``,
``compare`` and ``push``.

The only module that prints. ``demo-service`` serves one service of ``demo --distributed``, which
starts them as processes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gymtrace import _constants as c
from gymtrace._model import settings as _settings
from gymtrace._model.environment import DEFAULT_FILE, GYMTRACE_FILE
from gymtrace._model.spandata import SpanData, TraceFileError, read_otlp_json_lines
from gymtrace._read.passk import PASS_THRESHOLD
from gymtrace._sdk.children import child_files
from gymtrace._version import __version__

if TYPE_CHECKING:
    from gymtrace._read.compare import Comparison
    from gymtrace._read.outcomes import RunStats
    from gymtrace._read.passk import PassK
    from gymtrace.demo.distributed import DistributedResult


def _default_file() -> str:
    return _settings.resolve(file=True).file or DEFAULT_FILE


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gymtrace", description="OpenTelemetry traces of RL rollouts.")
    parser.add_argument("--version", action="version", version=f"gymtrace {__version__}")
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
        "files",
        nargs="*",
        help=f"OTLP/JSON lines files, read together (default: {DEFAULT_FILE}); ignored with --jaeger",
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
        default=PASS_THRESHOLD,
        metavar="X",
        help=f"pass@k: a scored repeat passes when its reward is at least X (default: {PASS_THRESHOLD:g})",
    )
    stats.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per run (run_id, scored, unscored, inputs, mean_reward, ...)",
    )
    stats.add_argument(
        "--pass-k",
        type=int,
        metavar="K",
        help="pass@K per task (unbiased estimator over scored repeats; a repeat passes at or above"
        " --pass-threshold) and its mean; JSON key pass_k",
    )
    live = sub.add_parser(
        "live", help="the open rollouts: running, stalled (no progress) or lost (process gone)"
    )
    _add_reader_arguments(live, what="OTLP/JSON lines files or directories of them")
    live.add_argument(
        "--stalled-after",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds without progress after which a live rollout reads stalled (default: 60)",
    )
    live.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per rollout (run_id, task_id, rollout_id, attempt, state, age_s, idle_s, step, service)",
    )
    _add_records_parsers(sub)
    return parser


def _add_records_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    imp = sub.add_parser(
        "import",
        help="write trajectory records (NeMo Gym output, ATIF, Inspect AI logs) as traces",
        description="Write records as the traces a live gymtrace run writes: deterministic IDs,"
        " recorded times kept, synthesised ones marked gym.timing=synthetic.",
    )
    imp.add_argument("format", choices=("nemo-gym", "atif", "inspect"), help="the records' format")
    imp.add_argument(
        "records", nargs="+", metavar="FILE", help="record files (directories for atif and inspect)"
    )
    imp.add_argument(
        "-o", "--output", metavar="OUT", help=f"OTLP/JSON lines file to append to (default: {DEFAULT_FILE})"
    )
    imp.add_argument(
        "--endpoint",
        metavar="URL",
        help="send over OTLP/HTTP (JSON), e.g. http://127.0.0.1:4318 (also to OUT if -o)",
    )
    imp.add_argument("--run", metavar="ID", help="the run ID (default: from the records)")

    compare = sub.add_parser(
        "compare", help="per task: mean reward of run B minus run A, with a bootstrap interval and flips"
    )
    compare.add_argument("a", metavar="A", help="run A: a trace file or directory, or a run ID with --jaeger")
    compare.add_argument("b", metavar="B", help="run B, the same way")
    compare.add_argument("--jaeger", metavar="URL", help="read both runs from Jaeger by run ID")
    compare.add_argument("--service", help="service to search in Jaeger (default: every service)")
    compare.add_argument(
        "--json", action="store_true", help="one JSON object (tasks, delta, ci95, verdict, ...)"
    )
    compare.add_argument(
        "--pass-threshold",
        type=float,
        default=PASS_THRESHOLD,
        metavar="X",
        help="a task passes when its mean reward is at least X (flips), a repeat when its reward is"
        f" (pass@k), as in stats (default: {PASS_THRESHOLD:g})",
    )
    compare.add_argument(
        "--max-unscored-gap",
        type=float,
        default=10.0,
        metavar="PP",
        help="refuse a verdict when the runs' unscored shares differ by more than PP points (default: 10)",
    )
    compare.add_argument("--pass-k", type=int, metavar="K", help="also give pass@K per task and run")
    _add_push_parser(sub)


def _add_push_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    push = sub.add_parser(
        "push",
        help="send trace files to MLflow or Arize Phoenix, each rollout's reward as their score (idempotent)",
    )
    push.add_argument("--backend", required=True, choices=("mlflow", "phoenix"), help="the server's kind")
    push.add_argument(
        "--endpoint", required=True, metavar="URL", help="its base URL, e.g. http://127.0.0.1:5000"
    )
    push.add_argument(
        "--experiment",
        default=_settings.DEFAULT_EXPERIMENT,
        metavar="NAME",
        help=f"MLflow experiment (created if missing) or Phoenix project (default: {_settings.DEFAULT_EXPERIMENT})",
    )
    push.add_argument("files", nargs="+", metavar="FILE|DIR", help="OTLP/JSON lines files or directories")


def _add_reader_arguments(parser: argparse.ArgumentParser, what: str = "OTLP/JSON lines files") -> None:
    parser.add_argument("files", nargs="*", help=f"{what} (default: {DEFAULT_FILE})")
    parser.add_argument(
        "--jaeger", metavar="URL", help="read from Jaeger's query API instead, e.g. http://127.0.0.1:16686"
    )
    parser.add_argument("--service", help="service to search in Jaeger (default: every service)")
    parser.add_argument("--run", metavar="RUN_ID", help="only this run (gym.run.id)")


# Exit codes (docs/cli.md): 0 success; 1 the answer is "no" (contract violations, nothing found);
# 2 bad usage or an unreadable input (argparse's own convention for usage errors); 130 interrupted;
# 141 the reader of standard output went away (128 + SIGPIPE, what a shell reports for a command
# killed by the signal, as `yes | head -1` is).
EXIT_CLOSED_PIPE = 141


def main(argv: Sequence[str] | None = None) -> int:
    try:
        code = _main(argv)
        # Flushed here, not at interpreter exit, so a reader that went away is noticed below
        # instead of in Python's exit-time flush, which prints "Exception ignored ...".
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        return _closed_pipe()


def _closed_pipe() -> int:
    """Standard output's reader closed the pipe (``gymtrace rollouts --json | head -1``): stop
    quietly, as ``cat`` does. What is still buffered cannot be written anywhere; pointing standard
    output at the null device keeps the interpreter's exit-time flush from failing again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
    return EXIT_CLOSED_PIPE


def _main(argv: Sequence[str] | None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "demo":
            return _demo(args)
        if args.command == "demo-service":
            return _demo_service(args)
        if args.command == "tree":
            return _tree(args)
        if args.command == "rollouts":
            return _rollouts(args)
        if args.command == "stats":
            return _stats(args)
        if args.command == "import":
            return _import(args)
        if args.command == "compare":
            return _compare(args)
        if args.command == "live":
            return _live(args)
        if args.command == "push":
            return _push(args)
        return _check(args)
    except BrokenPipeError:
        raise  # an OSError, but not the input's: main() stops quietly
    except (TraceFileError, OSError) as exc:
        print(f"gymtrace {args.command}: {exc}", file=sys.stderr)
        return 2


def _demo(args: argparse.Namespace) -> int:
    if args.repeats < 1:
        print("gymtrace demo: --repeats must be at least 1", file=sys.stderr)
        return 2
    if args.distributed:
        return _demo_distributed(args)

    from gymtrace._read.render import render_tree
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
    from gymtrace._read.outcomes import final_outcomes, summarise

    # From the spans when they are at hand (files), by the rule every reader applies; over OTLP
    # the spans are in the Collector, so the driver's own summary is all there is.
    outcomes = final_outcomes(result.spans, run_id=result.run_id) if result.spans else []
    rows = (
        [(o.rollout_id, o.attempts, o.reward, o.trace_id) for o in outcomes]
        if outcomes
        else [(r["rollout_id"], r["attempts"], r["reward"], r["trace_id"]) for r in result.rollouts]
    )
    for rollout_id, attempts, reward, trace_id in rows:
        shown = "unscored" if reward is None else f"reward={reward:g}"
        print(f"rollout {rollout_id}: {attempts} attempt(s), {shown}, trace {trace_id}")
    for run in summarise(outcomes=outcomes):
        _print_stats(run, failed_as_zero=False)
    if result.endpoint is not None:
        print(
            f"spans exported to OTLP/{result.protocol} {result.endpoint};"
            f' search Jaeger for the tag gym.rollout.id or run id "{result.run_id}"'
        )
        return 0
    if not quiet:
        from gymtrace._read.render import render_tree

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
    """The demo's summary, computed by the same code as ``gymtrace stats`` and ``rollouts``."""
    from gymtrace._read.outcomes import final_outcomes, summarise

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
        from gymtrace._read.jaeger import JaegerClient

        client = JaegerClient(args.jaeger)
        if args.trace:
            return client.trace(args.trace)
        tags = {c.ROLLOUT_ID: args.rollout} if args.rollout else {c.RUN_ID: args.run} if args.run else {}
        found: list[SpanData] = client.search(args.service, tags)
        return found
    spans = _read_files(args.files)
    if args.trace:
        return [s for s in spans if s.trace_id == args.trace.lower().rjust(32, "0")]
    if args.rollout or args.run:
        key, value = (c.ROLLOUT_ID, args.rollout) if args.rollout else (c.RUN_ID, args.run)
        traces = {s.trace_id for s in spans if s.attributes.get(key) == value}
        return [s for s in spans if s.trace_id in traces]
    return spans


def _tree(args: argparse.Namespace) -> int:
    from gymtrace._read.render import render_tree

    spans = _load(args)
    if not spans:
        print("no spans found", file=sys.stderr)
        return 1
    print(render_tree(spans, show_ids=args.ids))
    return 0


def _check(args: argparse.Namespace) -> int:
    from gymtrace._read.check import (
        awaiting_outcomes,
        check_spans,
        lost_notes,
        missing_service_notes,
        rerun_notes,
    )
    from gymtrace._read.outcomes import final_outcomes

    spans = _read_files(args.files)
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
        if s.attributes.get(c.KIND) not in (None, c.KIND_RUN)
        and not isinstance(s.attributes.get(c.ROLLOUT_ID), str)
    )
    if outside:
        # Not a violation (a run's own work, a service's spans), but not vouched for either.
        print(f"  - {outside} gym spans carry no rollout identity: no outcome rule applies to them")
    for note in [*awaiting, *rerun_notes(spans), *lost_notes(spans), *missing_service_notes(spans)]:
        print(f"  - {note}")
    return 0


def _read(args: argparse.Namespace) -> list[SpanData]:
    """The spans ``rollouts`` and ``stats`` read: files, or Jaeger (searched by run ID if given)."""
    if args.jaeger:
        from gymtrace._read.jaeger import JaegerClient

        if args.files:
            raise TraceFileError("give trace files or --jaeger, not both")
        found: list[SpanData] = JaegerClient(args.jaeger).search(
            args.service, {c.RUN_ID: args.run} if args.run else {}
        )
        return found
    return _read_files(args.files)


def _read_files(files: list[str]) -> list[SpanData]:
    """The spans of every file given, read as one (a Ray run writes one per worker, a traced
    service one per process), or of the default file."""
    spans: list[SpanData] = []
    # With no file named: the default file and the files its workers wrote beside it (a worker
    # configured from GYMTRACE_PARENT writes {stem}.pid-{pid}{suffix}), so their outcomes count.
    for path in files or [_default_file(), *child_files(_default_file())]:
        spans.extend(read_otlp_json_lines(path))
    return spans


def _reward_text(reward: float | None) -> str:
    return "-" if reward is None else f"{reward:g}"


def _rollouts(args: argparse.Namespace) -> int:
    from gymtrace._read.outcomes import final_outcomes

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
            str(o.attempts) + (f" ({o.task_reruns} Ray re-run)" if o.task_reruns else ""),
            _ran_in(o.services),
            o.source,
        )
        for o in outcomes
    ]
    _print_table(
        ("RUN", "TASK", "ROLLOUT", "REPEAT", "OUTCOME", "REWARD", "ATTEMPTS", "RAN IN", "DECIDED BY"), rows
    )
    return 0


def _print_table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


def _live(args: argparse.Namespace) -> int:
    from gymtrace._read.liveview import live_rollouts

    if args.stalled_after < 0:
        print("gymtrace live: --stalled-after must be >= 0 seconds", file=sys.stderr)
        return 2
    if args.jaeger:
        from gymtrace._read.jaeger import JaegerClient

        if args.files:
            raise TraceFileError("give trace files or --jaeger, not both")
        tags: dict[str, str] = {c.KIND: c.KIND_LIVE}
        if args.run:
            tags[c.RUN_ID] = args.run
        spans: list[SpanData] = JaegerClient(args.jaeger).search(args.service, tags)
    else:
        spans = []
        # Files its processes are still writing: a last line caught mid-write is read next time.
        for path in args.files or [_default_file(), *child_files(_default_file())]:
            spans.extend(read_otlp_json_lines(path, partial_last_line=True))
    rollouts = live_rollouts(spans, now_ns=time.time_ns(), stalled_after=args.stalled_after, run_id=args.run)
    if args.json:
        for rollout in rollouts:
            print(json.dumps(rollout.as_json()))
        return 0
    if not rollouts:
        print("no open rollouts")
        return 0
    rows = [
        (
            r.run_id or "-",
            r.task_id or "-",
            r.rollout_id,
            str(r.attempt),
            r.state,
            f"{r.age_s:.1f}s",
            f"{r.idle_s:.1f}s",
            str(r.step),
            r.service or "-",
        )
        for r in rollouts
    ]
    _print_table(("RUN", "TASK", "ROLLOUT", "ATTEMPT", "STATE", "AGE", "IDLE", "STEP", "SERVICE"), rows)
    return 0


def _ran_in(services: tuple[str, ...]) -> str:
    """One service name when every attempt ran there, else ``attempt@service`` per attempt."""
    if not services:
        return "-"
    if len(set(services)) == 1 and services[0]:
        return services[0]
    return " ".join(f"{attempt}@{service or '?'}" for attempt, service in enumerate(services))


def _stats(args: argparse.Namespace) -> int:
    from gymtrace._read.outcomes import final_outcomes, summarise
    from gymtrace._read.passk import per_task

    if args.pass_k is not None and args.pass_k < 1:
        print("gymtrace stats: --pass-k must be at least 1", file=sys.stderr)
        return 2
    outcomes = final_outcomes(_read(args), run_id=args.run)
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
        _print_stats(run, failed_as_zero=args.failed_as_zero)
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


def _import(args: argparse.Namespace) -> int:

    from gymtrace._import import write as _write

    paths = [Path(p) for p in args.records]
    if args.format == "nemo-gym":
        from gymtrace._import import nemo_gym as importer
    elif args.format == "atif":
        from gymtrace._import import atif as importer  # type: ignore[no-redef]
    else:
        from gymtrace._import import inspect as importer  # type: ignore[no-redef]
    try:
        result = importer.import_files(paths, run_id=args.run)
    except (ValueError, ImportError) as exc:
        print(f"gymtrace import: {exc}", file=sys.stderr)
        return 2
    if not result.spans:
        print("gymtrace import: no records found", file=sys.stderr)
        return 1
    resource = {c.RECORD_FORMAT: args.format}
    targets = []
    if args.output or not args.endpoint:
        targets.append(args.output or _default_file())
        _write.write_file(result.spans, targets[-1], resource)
    if args.endpoint:
        targets.append(_write.traces_url(args.endpoint))
        _write.send(result.spans, args.endpoint, resource)
    target = " and ".join(targets)
    runs = sorted(
        {str(s.attributes.get(c.RUN_ID)) for s in result.spans if s.attributes.get(c.KIND) == c.KIND_RUN}
    )
    print(
        f"imported {result.rollouts} rollouts of run {', '.join(runs)}: {len(result.spans)} spans"
        f" ({result.synthetic} with synthesised times) to {target}"
    )
    if result.unmapped:
        print(f"not mapped ({sum(result.unmapped.values())}):")
        for what, count in sorted(result.unmapped.items()):
            print(f"  {count:>6}  {what}")
    return 0


def _run_spans(args: argparse.Namespace, which: str) -> list[SpanData]:
    """The spans of run A or B: a run ID searched in Jaeger, a trace file, or a directory of them."""

    given = getattr(args, which)
    if args.jaeger:
        from gymtrace._read.jaeger import JaegerClient

        found: list[SpanData] = JaegerClient(args.jaeger).search(args.service, {c.RUN_ID: given})
        return found
    path = Path(given)
    files = (
        sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
        if path.is_dir()
        else [path]
    )
    return _read_files([str(p) for p in files])


def _compare(args: argparse.Namespace) -> int:
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


def _print_stats(run: RunStats, *, failed_as_zero: bool, indent: str = "") -> None:
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
        + ";"
        f" mean {mean} over {run.inputs} input{'s' if run.inputs != 1 else ''} ({over})"
    )
    if run.runs_sharing_id > 1:
        line += f" [{run.runs_sharing_id} runs share run ID {run.run_id}: appended re-run? this one is run span {run.run_span_id}]"
    return line


if __name__ == "__main__":
    raise SystemExit(main())


def _push(args: argparse.Namespace) -> int:
    from gymtrace._sdk.backends import BackendError, NotYet, client, push

    spans = _read_files(args.files)
    if not spans:
        print("gymtrace push: no spans in the files given", file=sys.stderr)
        return 1
    target = client(args.backend, args.endpoint, args.experiment)
    try:
        result = push(target, spans)
    except BackendError as exc:
        print(f"gymtrace push: {exc}", file=sys.stderr)
        return 2
    except NotYet as exc:
        print(
            f"gymtrace push: {target.where()} cannot be reached or has not stored the spans ({exc}): start"
            " it, check --endpoint, and push again (pushing twice changes nothing)",
            file=sys.stderr,
        )
        return 2
    except ImportError as exc:
        print(f"gymtrace push: needs gymtrace[sdk] (the OTLP protobuf messages): {exc}", file=sys.stderr)
        return 2
    where = f"experiment {args.experiment!r}" if args.backend == "mlflow" else f"project {args.experiment!r}"
    print(
        f"pushed {result.spans} spans, {result.rollouts} rollouts ({result.scored} with a reward) of"
        f" run(s) {', '.join(result.runs) or '-'} to {target.where()}, {where}"
    )
    return 0
