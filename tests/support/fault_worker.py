"""A training-loop stand-in for the fault-injection tests and benchmarks: run it as a subprocess.

It calls ``gymtrace.configure(service_name=..., endpoint=..., protocol="grpc")`` and produces
rollouts (rollout > episode > agent invocation > 2 steps > model call + tool call: 9 spans each,
plus one run span) at a steady pace, in *phases*. After each phase it writes
``<control>/phase-<i>.json`` (the export stats so far) and waits for ``<control>/go-<i>`` before
the next phase, so a test can kill, restart or stall the Collector at a known point. At the end it
flushes and prints one JSON line to stdout::

    {"stats": [ExportStats as dict, ...], "user_errors": 0, "max_rollout_seconds": ..., ...}

Every finished, sampled span ID is appended to ``--ids`` as it ends (one hex ID a line, written
with ``os.write`` on an ``O_APPEND`` descriptor), so the list survives a SIGTERM.

``--move-at-once`` (with ``GYMTRACE_ENCODER=auto``, the default) moves the export to the encoder
process at the queue's first look instead of at ~5,000 spans a second, a rate this worker never
reaches: the scenarios then run across the move. Phase files and the result say where export ran
(``"encoders"``: ``thread`` or ``process`` per exporter).

``--hang`` makes the worker open a run, rollout, episode and step after the last phase, write
``<control>/hanging``, and sleep: the test then stops it with a signal.

Only the standard library and gymtrace are used; the module is not a test.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from opentelemetry import trace

import gymtrace

SPANS_PER_ROLLOUT = 9


class SpanIdRecorder:
    """A span processor that appends the ID of every sampled span that ends to a file."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        return None

    def _on_ending(self, span: Any) -> None:
        return None

    def on_end(self, span: Any) -> None:
        if span.context.trace_flags.sampled:
            os.write(self._fd, f"{span.context.span_id:016x}\n".encode())

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def one_rollout(run_id: str, index: int, work_seconds: float) -> None:
    with gymtrace.rollout(rollout_id=f"{run_id}-r{index}", task_id=f"task-{index % 7}", repeat=0):
        with gymtrace.episode():
            with gymtrace.agent_invocation(agent_name="worker"):
                for _ in range(2):
                    with gymtrace.step():
                        with gymtrace.model_call(model="stub-model", provider="stub"):
                            time.sleep(work_seconds)
                        with gymtrace.tool_call(tool_name="stub-tool"):
                            pass
            gymtrace.record_reward(1.0)


def wait_for(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"fault_worker: nobody created {path} within {timeout}s")
        time.sleep(0.02)


def stats_json() -> list[dict[str, Any]]:
    return [dataclasses.asdict(s) for s in gymtrace.export_stats()]


def encoders() -> list[str]:
    """Where each exporter encodes now: ``thread`` or ``process`` (what the queue says it is)."""
    from gymtrace._sdk import setup as _setup

    return [str(getattr(p, "encoder", "thread")) for p in _setup._state.stage.processors()]


def wait_moved(timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while set(encoders()) != {"process"}:
        if time.monotonic() > deadline:
            raise TimeoutError(f"fault_worker: export did not move to the encoder process: {encoders()}")
        time.sleep(0.02)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--service", required=True)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--phases", default="20", help="rollouts per phase, comma-separated")
    parser.add_argument("--pace", type=float, default=0.01, help="seconds between rollouts")
    parser.add_argument("--work", type=float, default=0.001, help="seconds inside each model call")
    parser.add_argument("--control", required=True, help="directory for phase-*.json / go-*")
    parser.add_argument("--ids", required=True, help="file that collects finished span IDs")
    parser.add_argument("--final-flush", type=float, default=30.0, help="seconds; 0 skips it")
    parser.add_argument("--hang", action="store_true")
    parser.add_argument("--move-at-once", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(name)s %(levelname)s %(message)s")

    control = Path(args.control)
    if args.move_at_once:
        from gymtrace._sdk import export_auto as _export_auto

        # One span, whenever: the queue's first look moves the export (its worker looks before
        # each batch it takes, every 0.5 s here).
        _export_auto.UPGRADE_SPANS, _export_auto.UPGRADE_WINDOW = 1, 3600.0
    gymtrace.configure(service_name=args.service, endpoint=args.endpoint, protocol="grpc")
    provider: Any = trace.get_tracer_provider()
    provider.add_span_processor(SpanIdRecorder(args.ids))

    phases = [int(n) for n in args.phases.split(",") if n]
    user_errors = 0
    max_rollout = 0.0
    produced = 0
    run_id = args.service
    with gymtrace.run(run_id=run_id):
        for phase, count in enumerate(phases):
            for _ in range(count):
                t0 = time.perf_counter()
                try:
                    one_rollout(run_id, produced, args.work)
                except Exception as exc:  # noqa: BLE001 - counting what tracing did to user code
                    user_errors += 1
                    print(f"fault_worker: user code raised {exc!r}", file=sys.stderr)
                max_rollout = max(max_rollout, time.perf_counter() - t0)
                produced += 1
                if args.move_at_once and produced == 1:
                    wait_moved()  # the first rollout's spans are the thread queue's, the rest not
                time.sleep(args.pace)
            state = {"phase": phase, "produced": produced, "stats": stats_json(), "encoders": encoders()}
            tmp = control / f".phase-{phase}.json"
            tmp.write_text(json.dumps(state))
            tmp.rename(control / f"phase-{phase}.json")
            if phase < len(phases) - 1 or args.hang:
                wait_for(control / f"go-{phase}", timeout=120)
        if args.hang:
            with gymtrace.rollout(rollout_id=f"{run_id}-hung", task_id="hung", repeat=0):
                with gymtrace.episode():
                    with gymtrace.agent_invocation(agent_name="worker"):
                        with gymtrace.step():
                            (control / "hanging").write_text(str(os.getpid()))
                            # Short sleeps: a signal's handler runs between bytecodes, not
                            # within one long sleep entered just after the signal arrived.
                            for _ in range(2400):
                                time.sleep(0.05)
            return 4  # not reached when the test stops it

    flushed = gymtrace.force_flush(int(args.final_flush * 1000)) if args.final_flush else None
    result = {
        "stats": stats_json(),
        "encoders": encoders(),
        "flushed": flushed,
        "produced_rollouts": produced,
        "user_errors": user_errors,
        "max_rollout_seconds": max_rollout,
        "main_returned_at": time.time(),
    }
    print(json.dumps(result), flush=True)
    return 0 if user_errors == 0 else 3


if __name__ == "__main__":
    sys.exit(main())
