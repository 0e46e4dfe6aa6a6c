"""The command line's grammar: every subcommand, its arguments and their help, in one place.

Kept apart from what the subcommands do (one module each beside this one) so that ``gymtrace
--help`` reads as one text, and so that building the parser imports nothing heavy: a subcommand
imports what it needs (the SDK, Jaeger's client, the demo) only when it runs.
"""

from __future__ import annotations

import argparse

from gymtrace._model import settings as _settings
from gymtrace._model.environment import DEFAULT_FILE, GYMTRACE_FILE
from gymtrace._read.passk import PASS_THRESHOLD
from gymtrace._read.pictures.runview import LANE_CHOICES, LANES_WORKER
from gymtrace._version import __version__


def make_parser() -> argparse.ArgumentParser:
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
    demo.add_argument(
        "--training",
        action="store_true",
        help="an asynchronous GRPO run: rollout workers in processes, a trainer consuming their rollouts"
        " (read it with `gymtrace stats --by train_step`)",
    )
    demo.add_argument(
        "--workers", type=int, default=2, help="--training: rollout worker processes (default: 2)"
    )
    demo.add_argument("--steps", type=int, default=3, help="--training: train steps (default: 3)")

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
        help="one JSON object per line (run_id, task_id, rollout_id, repeat, outcome, reward, attempts,"
        " group_id, policy_version, consumed_by, training_outcome, staleness, ...)",
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
        "--by",
        choices=("train_step", "policy_version", "group"),
        help="a training run, per train step (consumed, outcomes, wasted work, staleness; then a line"
        " per run: the share of rollout time wasted), per policy version or per group",
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
    _add_picture_parsers(sub)
    return parser


def _add_picture_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    lanes_help = (
        "a lane per worker process (service.name, service.instance.id), its episodes packed into as"
        " few lanes as keep them apart (default), or a lane per rollout"
    )
    timeline = sub.add_parser(
        "timeline",
        help="a run's episodes on one picture: a self-contained HTML page, or Chrome trace-event JSON (Perfetto)",
    )
    _add_picture_source(timeline)
    timeline.add_argument("--run", metavar="RUN_ID", help="the run to draw (default: the input's only run)")
    timeline.add_argument(
        "-o",
        "--output",
        metavar="OUT",
        help="file to write (default: gymtrace-timeline.html, .json with chrome)",
    )
    timeline.add_argument("--lanes", choices=LANE_CHOICES, default=LANES_WORKER, help=lanes_help)
    timeline.add_argument(
        "--format",
        choices=("html", "chrome"),
        default="html",
        help="html: a canvas page, hover a bar for its rollout; chrome: the Trace Event Format that"
        " Perfetto (ui.perfetto.dev) and chrome://tracing open",
    )
    report = sub.add_parser(
        "report", help="one self-contained HTML page of a run, beside a baseline run's compare verdicts"
    )
    _add_picture_source(report)
    report.add_argument("--run", metavar="RUN_ID", help="the run (default: the input's only run)")
    report.add_argument(
        "--baseline",
        metavar="FILE|DIR",
        action="append",
        help="the baseline run's files (repeat for several)",
    )
    report.add_argument("--baseline-run", metavar="RUN_ID", help="the baseline's run (default: its only run)")
    report.add_argument("-o", "--output", metavar="OUT", help="file to write (default: gymtrace-report.html)")
    report.add_argument(
        "--lanes", choices=LANE_CHOICES, default=LANES_WORKER, help=f"the timeline's lanes: {lanes_help}"
    )
    report.add_argument(
        "--pass-threshold",
        type=float,
        default=PASS_THRESHOLD,
        metavar="X",
        help=f"as in compare: a task passes when its mean reward is at least X (default: {PASS_THRESHOLD:g})",
    )
    report.add_argument(
        "--max-unscored-gap",
        type=float,
        default=10.0,
        metavar="PP",
        help="as in compare: no verdict when the unscored shares differ by more than PP points (default: 10)",
    )


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


def _add_picture_source(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "files",
        nargs="*",
        metavar="FILE|DIR",
        help=f"OTLP/JSON lines files or directories (default: {DEFAULT_FILE})",
    )
    parser.add_argument(
        "--jaeger",
        metavar="URL",
        help="read the run from Jaeger's query API instead, e.g. http://127.0.0.1:16686",
    )
    parser.add_argument("--service", help="service to search in Jaeger (default: every service)")


def _add_reader_arguments(parser: argparse.ArgumentParser, what: str = "OTLP/JSON lines files") -> None:
    parser.add_argument("files", nargs="*", help=f"{what} (default: {DEFAULT_FILE})")
    parser.add_argument(
        "--jaeger", metavar="URL", help="read from Jaeger's query API instead, e.g. http://127.0.0.1:16686"
    )
    parser.add_argument("--service", help="service to search in Jaeger (default: every service)")
    parser.add_argument("--run", metavar="RUN_ID", help="only this run (gym.run.id)")
