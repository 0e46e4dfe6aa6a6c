"""``gymtrace demo`` (a small simulated gym run, local or ``--distributed``) and ``demo-service``,
one service of ``demo --distributed``, which starts them as processes.

The demo's summary is computed by the same code as ``gymtrace stats`` and ``rollouts``.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from typing import TYPE_CHECKING

from gymtrace import _constants as c
from gymtrace._cli.common import default_file
from gymtrace._cli.stats import print_stats
from gymtrace._model.spandata import SpanData

if TYPE_CHECKING:
    from gymtrace.demo.distributed import DistributedResult


def run(args: argparse.Namespace) -> int:
    if args.repeats < 1:
        print("gymtrace demo: --repeats must be at least 1", file=sys.stderr)
        return 2
    if args.distributed:
        return _demo_distributed(args)
    if args.training:
        return _demo_training(args)

    from gymtrace._read.render import render_tree
    from gymtrace.demo.local import run_local

    result = run_local(
        run_id=args.run_id or f"demo-{uuid.uuid4().hex[:8]}",
        file=args.file or default_file(),
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
    _write_report(result.spans, result.file, result.run_id)
    return 1 if result.problems else 0


def _demo_training(args: argparse.Namespace) -> int:
    import json

    from gymtrace._cli.stats import _by_line
    from gymtrace._read.outcomes import final_outcomes
    from gymtrace._read.training import finish_rows, read_training, run_stats, step_stats
    from gymtrace.demo.training import run_training

    if args.workers < 1 or args.steps < 1:
        print("gymtrace demo --training: --workers and --steps must be at least 1", file=sys.stderr)
        return 2
    run_id = args.run_id or f"grpo-{uuid.uuid4().hex[:8]}"
    file = args.file or default_file()
    result = run_training(
        run_id=run_id,
        file=file,
        workers=args.workers,
        steps=args.steps,
        endpoint=args.endpoint,
        protocol=args.protocol,
    )
    outcomes = final_outcomes(result.spans)
    training = read_training(result.spans, outcomes)
    finish_rows(training, outcomes)
    services = sorted({s.service for s in result.spans})
    print(
        f"training run {run_id} finished in {result.elapsed:.2f}s: {len(outcomes)} rollouts from"
        f" {result.workers} worker processes, {len(result.steps)} train steps, {len(result.spans)} spans"
        f" ({', '.join(services)})"
    )
    for body in [*step_stats(training), *run_stats(training, outcomes)]:
        print("  " + (json.dumps(body) if args.quiet else _by_line(body)))
    print("what the trainer did, recorded beside the trace:")
    for step in result.steps:
        counts = ", ".join(f"{n} {name}" for name, n in sorted(step.outcomes.items()))
        print(
            f"  step {step.step} (policy {step.policy_version}): {counts}; wasted {step.wasted_seconds:.4f}s"
        )
    print(f"contract check: {'OK' if not result.problems else f'{len(result.problems)} problem(s)'}")
    for problem in result.problems:
        print(f"  - {problem}")
    print(f"spans written to: {file}")
    print(f"look again with: gymtrace stats --by train_step {file} --run {run_id}")
    _write_report(result.spans, file, run_id)
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
    from gymtrace._read.outcomes import final_outcomes
    from gymtrace._read.stats import summarise

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
        print_stats(run, failed_as_zero=False)
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
    if result.file is not None and result.spans:
        # As the local demo does: the run's report beside the file every process wrote to.
        _write_report(result.spans, result.file, result.run_id)
    return 0


def _write_report(spans: list[SpanData], file: str, run_id: str) -> None:
    """The run's report beside its trace file (``gymtrace report``'s page), and where it is."""
    import re
    from pathlib import Path

    from gymtrace._cli.report import write_report
    from gymtrace._read.pictures.runview import build_view
    from gymtrace._read.timesplit import EpisodeTimes

    view = build_view(spans, EpisodeTimes().add_spans(spans), run_id)
    out = Path(file).resolve().with_name(f"gymtrace-report-{re.sub(r'[^A-Za-z0-9._-]', '_', run_id)}.html")
    write_report(view, [file], out)
    print(f"report: {out} (open it in a browser; again with: gymtrace report {file} --run {run_id})")


def run_service(args: argparse.Namespace) -> int:
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
    from gymtrace._read.outcomes import final_outcomes
    from gymtrace._read.stats import summarise

    outcomes = final_outcomes(spans)
    episodes = [s for s in spans if s.attributes.get(c.KIND) == c.KIND_EPISODE]
    scored = sum(1 for o in outcomes if o.outcome == c.OUTCOME_SCORED)
    print(
        f"run finished in {elapsed:.2f}s: {len(outcomes)} rollouts ({scored} scored,"
        f" {len(outcomes) - scored} unscored), {len(episodes)} episodes, {len(spans)} spans"
    )
    for run in summarise(outcomes=outcomes):
        print_stats(run, failed_as_zero=False, indent="  ")
    by_name = {f"{o.task_id}/r{o.repeat}": o for o in outcomes}
    for name in sorted(rewards):
        o = by_name.get(name)
        final = "missing" if o is None else "unscored" if o.reward is None else f"{o.reward:g}"
        print(f"  {name:<16} reward={final}")
