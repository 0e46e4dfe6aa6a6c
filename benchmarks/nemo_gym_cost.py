"""CPU per rollout of the real NeMo Gym 0.7.0 stack, untraced vs traced by gymtrace, side by side.

Run in the NeMo Gym venv ``scripts/test`` builds (about 10 minutes on a 2-core machine)::

    .venv-nemo/bin/python benchmarks/nemo_gym_cost.py [--server example_multi_step] [--limit 5]
        [--repeats 4] [--rounds 3] [--settle 2] [--gymtrace-src DIR] [--sides plain,sdk,contrib,before,full,full-ops]

Up to six stacks (``--sides``) run at once against one instant fake Responses API upstream
(tests/support/fake_responses_upstream.py): ``gym env start`` plain; plain with the OpenTelemetry
SDK's ``TracerProvider`` set in every process by a ``sitecustomize`` and nothing else (no exporter,
no gymtrace: FastAPI's own telemetry records its spans once a provider is set, so this is the floor
under any OpenTelemetry tracing of these servers); under
``opentelemetry-instrument`` with gymtrace's NeMo Gym integration switched off
(``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=gymtrace_nemo_gym``: FastAPI's own telemetry and any
contrib instrumentation installed, their spans written to ``GYMTRACE_FILE=DIR/`` by gymtrace's
configurator and exporter);
fully traced (the integration on, ``GYMTRACE_FILE=DIR/``); and fully traced with FastAPI's operation
spans kept (``GYMTRACE_NEMO_GYM_OPERATION_SPANS=true``), which gymtrace's NeMo Gym setup otherwise
turns off; and ``before``, fully traced by the gymtrace of ``--gymtrace-src`` (an earlier commit's
``src/``), so a change is measured against its before in the same rounds. Each round runs
``gym eval run`` over the same tasks on each (the driver as its stack: plain, or under
``opentelemetry-instrument`` with the same environment), in an order that rotates and, every other
turn, reverses (each side first, middle and last, and right after each other side, as often), each
driver started after a pause (``--settle``) for the side before it to go quiet, and takes the CPU
time (user + system) of the driver (its
rusage, start-up included) and of every process of the stack (servers, Ray, ``gym env start``;
psutil, before and after). Printed: CPU ms per rollout for each side (driver and stack, then the
stack alone, which leaves out the driver's start-up), each side's ratio to the plain one, and the
spans written per rollout; the median over rounds with the lowest and highest round, and each
difference between sides with its spread over rounds (the sides of one round run back to back). Nothing here asserts a time: the machine is
shared and absolute times drift.
"""

from __future__ import annotations

import argparse
import compileall
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nemo_gym
import psutil

import gymtrace
from gymtrace._model.tracefiles import open_lines, trace_files

BIN = Path(sys.executable).parent
PACKAGES = Path(nemo_gym.__file__).resolve().parent.parent
UPSTREAM = Path(__file__).resolve().parent.parent / "tests" / "support" / "fake_responses_upstream.py"
# The sides, in the order printed: how each runs the stack and its driver.
PLAIN, SDK, CONTRIB, FULL = "plain", "sdk only", "integration off", "gymtrace"
# gymtrace with FastAPI's operation spans kept (GYMTRACE_NEMO_GYM_OPERATION_SPANS=true): what
# dropping them by default saves is this side less the gymtrace one.
FULL_OPS = "gymtrace + ops"
# Fully traced by the gymtrace of --gymtrace-src (an earlier commit's src/) while the other sides
# trace with the installed one: a before/after in the same rounds, each round's pair back to back.
BEFORE = "gymtrace before"
SIDES = (PLAIN, SDK, CONTRIB, BEFORE, FULL, FULL_OPS)
SIDE_KEYS = {
    "plain": PLAIN,
    "sdk": SDK,
    "contrib": CONTRIB,
    "before": BEFORE,
    "full": FULL,
    "full-ops": FULL_OPS,
}
# The "sdk only" side: the plain stack with the OpenTelemetry SDK's TracerProvider set in every
# process (no exporter, no gymtrace): what FastAPI's own telemetry costs once a provider records its
# spans, the floor under any OpenTelemetry tracing of these servers.
SDK_SITE = """from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

trace.set_tracer_provider(TracerProvider())
"""
KINDS = ("resources_servers", "responses_api_agents/simple_agent", "environment_servers/legacy_agent")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _group(process: psutil.Process, root: bool) -> str:
    """Which part of the stack a process is: a NeMo Gym server (by its directory), Ray's own
    processes, or ``gym env start`` (the head server, and what it reaped)."""
    if root:
        return "gym env start"
    command = " ".join(process.cmdline())
    if command.endswith("app.py"):
        return Path(process.cwd()).name  # simple_agent, openai_model, the resources server, ...
    return "ray" if "ray" in command else "other"


class Side:
    def __init__(
        self, root: Path, server: str, upstream_port: str, variant: str, source: str | None = None
    ) -> None:
        traced = variant not in (PLAIN, SDK)
        self.root, self.traced, self.variant = root, traced, variant
        self.head = f"++head_server.port={_free_port()}"
        self.traces = root / "traces"
        for kind in (f"resources_servers/{server}", *KINDS[1:], "responses_api_models/openai_model"):
            (root / "venvs" / kind).mkdir(parents=True, exist_ok=True)
            link = root / "venvs" / kind / ".venv"
            if not link.exists():
                link.symlink_to(sys.prefix)
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("GYMTRACE_", "OTEL_")) and k != "PYTHONPATH"
        }
        self.env.update(
            {"PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "RAY_USAGE_STATS_ENABLED": "0"}
        )
        if traced and source:
            self.env["PYTHONPATH"] = (
                source  # another gymtrace (an earlier commit's src/) before the installed one
            )
        if traced:
            self.env.update(
                {
                    "GYMTRACE_FILE": f"{self.traces}/",
                    "OTEL_TRACES_EXPORTER": "none",
                    "OTEL_METRICS_EXPORTER": "none",
                    "OTEL_LOGS_EXPORTER": "none",
                }
            )
        if variant == SDK:
            site = root / "sdk-site"
            site.mkdir(exist_ok=True)
            (site / "sitecustomize.py").write_text(SDK_SITE)
            self.env["PYTHONPATH"] = str(site)
        if variant == FULL_OPS:
            self.env["GYMTRACE_NEMO_GYM_OPERATION_SPANS"] = "true"
        if variant == CONTRIB:
            # The supported switch: opentelemetry-instrument loads no instrumentor of this name.
            self.env["OTEL_PYTHON_DISABLED_INSTRUMENTATIONS"] = "gymtrace_nemo_gym"
        prefix = [str(BIN / "opentelemetry-instrument")] if traced else []
        command = [
            *prefix,
            str(BIN / "gym"),
            "env",
            "start",
            "--resources-server",
            server,
            "--model-type",
            "openai_model",
            "--model",
            "fake-model",
            "--model-url",
            f"http://127.0.0.1:{upstream_port}/v1",
            "--model-api-key",
            "not-a-key",
            "+skip_venv_if_present=true",
            f"+uv_venv_dir={root / 'venvs'}",
            self.head,
        ]
        self.log = root / "env_start.log"
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                command, cwd=root, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def wait_ready(self, timeout: float = 400) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "servers ready" in self.log.read_text(errors="replace"):
                return
            if self.process.poll() is not None:
                break
            time.sleep(1)
        raise SystemExit(f"stack did not start:\n{self.log.read_text(errors='replace')[-3000:]}")

    def stack_cpu(self) -> dict[str, float]:
        """CPU seconds so far of every process of the stack, by group (see :func:`_group`)."""
        processes = [psutil.Process(self.process.pid)]
        processes += processes[0].children(recursive=True)
        total: dict[str, float] = {}
        for process in processes:
            try:
                times = process.cpu_times()
                group = _group(process, process.pid == self.process.pid)
            except psutil.Error:
                continue
            spent = times.user + times.system + times.children_user + times.children_system
            total[group] = total.get(group, 0.0) + spent
        return total

    def run(
        self, name: str, agent: str, data: Path, limit: int, repeats: int
    ) -> tuple[float, dict[str, float], int]:
        """CPU seconds of one ``gym eval run``: the driver's, the stack's by group; and the rollouts
        it wrote."""
        output = self.root / name / "rollouts.jsonl"
        prefix = [str(BIN / "opentelemetry-instrument")] if self.traced else []
        command = [
            *prefix,
            str(BIN / "gym"),
            "eval",
            "run",
            "--no-serve",
            "--agent",
            agent,
            "--input",
            str(data),
            "--limit",
            str(limit),
            "--num-repeats",
            str(repeats),
            "--output",
            str(output),
            self.head,
        ]
        before = self.stack_cpu()
        driver = subprocess.Popen(
            command, cwd=self.root, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        _, status, usage = os.wait4(driver.pid, 0)
        driver.returncode = os.waitstatus_to_exitcode(status)
        if driver.returncode != 0:
            raise SystemExit(f"gym eval run failed ({driver.returncode}) on the {self.variant} side")
        time.sleep(1.0)  # the servers' exporters write on their schedule
        after = self.stack_cpu()
        stack = {group: spent - before.get(group, 0.0) for group, spent in after.items()}
        rows = sum(1 for line in output.read_text().splitlines() if line.strip())
        return usage.ru_utime + usage.ru_stime, stack, rows

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)


def _spans(traces: Path) -> int:
    """The spans written so far: each OTLP/JSON line holds a batch, each span one ``"spanId"`` key
    (a parent's is ``"parentSpanId"``)."""
    count = 0
    if not traces.exists():  # an untraced side
        return 0
    for file in trace_files(traces):  # compressed as GYMTRACE_FILE_COMPRESS says (plain by default)
        with open_lines(file, still_written=True) as lines:
            count += sum(line.count(b'"spanId"') for line in lines)
    return count


def _order(sides: list[Side], round_number: int) -> list[Side]:
    """The sides in the order round ``round_number`` runs them: each first, middle and last in
    turn (a drift in the machine's load is shared), and, every other turn of the rotation
    reversed, each right after each other side as often. A side right after a traced one runs
    while that one's servers may still be busy (an export, a collection) on the other core, which
    costs CPU time too: with the rotation alone, in `sdk,before,full` the gymtrace side always came
    right after the `before` side, and in an A/A run (both of the same code) measured +5.4 ms a
    rollout more than it (per round median +4.6)."""
    shift = round_number % len(sides)
    turn = sides[shift:] + sides[:shift]
    return turn if (round_number // len(sides)) % 2 == 0 else turn[::-1]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--server", default="example_multi_step")
    parser.add_argument("--limit", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--settle",
        type=float,
        default=2.0,
        help="seconds to wait before each side's driver, for the side before it to go quiet",
    )
    parser.add_argument(
        "--gymtrace-src",
        help="trace with the gymtrace package in this src/ directory (say, `git archive` of an earlier"
        " commit) instead of the installed one: the before of a before/after; with the `before` side,"
        " that side alone does",
    )
    parser.add_argument(
        "--sides",
        default=",".join(SIDE_KEYS),
        help="which sides to run, comma-separated keys: "
        + ", ".join(f"{k} ({v})" for k, v in SIDE_KEYS.items())
        + "; the ratios are to the first of plain / sdk that runs",
    )
    args = parser.parse_args()
    try:
        chosen = [SIDE_KEYS[key.strip()] for key in args.sides.split(",") if key.strip()]
    except KeyError as exc:
        parser.error(f"--sides: unknown side {exc}; known: {', '.join(SIDE_KEYS)}")
    variants = [variant for variant in SIDES if variant in chosen]
    if BEFORE in variants and not args.gymtrace_src:
        parser.error("--sides before needs --gymtrace-src: the gymtrace it traces with")
    # The gymtrace that traces, compiled as pip compiles an installed package: an editable checkout
    # run with PYTHONDONTWRITEBYTECODE=1 (CI machines set it) would otherwise compile its ~160
    # modules again in every process it starts, ~0.1 s of CPU a driver that a user's install never
    # pays.
    for gymtrace_dir in {
        Path(gymtrace.__file__).parent,
        *([Path(args.gymtrace_src) / "gymtrace"] if args.gymtrace_src else []),
    }:
        compileall.compile_dir(str(gymtrace_dir), quiet=1)

    # Which sides the gymtrace of --gymtrace-src traces: the `before` side, or else every traced one.
    def source_of(variant: str) -> str | None:
        return args.gymtrace_src if variant == BEFORE or BEFORE not in variants else None

    agent = f"{args.server}_simple_agent"
    data = PACKAGES / "resources_servers" / args.server / "data" / "example.jsonl"
    with tempfile.TemporaryDirectory(prefix="nemo-cost-") as tmp:
        root = Path(tmp)
        port_file = root / "upstream.port"
        upstream = subprocess.Popen(
            [sys.executable, str(UPSTREAM), str(port_file), str(root / "headers.jsonl")],
            start_new_session=True,
        )
        sides: list[Side] = []
        try:
            while not port_file.exists():
                time.sleep(0.1)
            port = port_file.read_text().strip()
            for number, variant in enumerate(variants):
                (root / str(number)).mkdir()
                sides.append(Side(root / str(number), args.server, port, variant, source_of(variant)))
            for side in sides:
                side.wait_ready()
            for side in sides:
                side.run("warm", agent, data, 1, 1)
            spans_before = {side.variant: _spans(side.traces) for side in sides}
            per: dict[str, list[float]] = {variant: [] for variant in variants}
            servers: dict[str, list[float]] = {variant: [] for variant in variants}
            # Per round and side: ms CPU per rollout of each part (the driver, each server, Ray).
            parts: dict[str, list[dict[str, float]]] = {variant: [] for variant in variants}
            rollouts = dict.fromkeys(variants, 0)
            for round_number in range(args.rounds):
                for side in _order(sides, round_number):
                    time.sleep(args.settle)  # the side before it done (its exporters, Ray's beats)
                    driver, stack, rows = side.run(
                        f"round-{round_number}", agent, data, args.limit, args.repeats
                    )
                    stack_total = sum(stack.values())
                    per[side.variant].append((driver + stack_total) / rows * 1000)
                    servers[side.variant].append(stack_total / rows * 1000)
                    parts[side.variant].append(
                        {"driver": driver / rows * 1000, **{k: v / rows * 1000 for k, v in stack.items()}}
                    )
                    rollouts[side.variant] += rows
            time.sleep(2)
            spans = {
                side.variant: (_spans(side.traces) - spans_before[side.variant])
                / max(rollouts[side.variant], 1)
                for side in sides
            }
        finally:
            for side in sides:
                side.stop()
            os.killpg(upstream.pid, signal.SIGTERM)
    print(
        f"NeMo Gym {args.server} via simple_agent, {args.limit} tasks x {args.repeats} repeats, {args.rounds} rounds"
    )
    total = {variant: statistics.median(values) for variant, values in per.items()}
    alone = {variant: statistics.median(values) for variant, values in servers.items()}
    base = next(variant for variant in (PLAIN, SDK, *variants) if variant in total)
    for variant in variants:
        values = per[variant]
        rounds = ", ".join(f"{v:.1f}" for v in values)
        print(
            f"  {variant:<15} {total[variant]:6.1f} ms CPU per rollout (rounds {min(values):.1f} to"
            f" {max(values):.1f}), {total[variant] / total[base]:.2f}x {base}"
            f" (stack alone {alone[variant]:.1f} ms, {alone[variant] / alone[base]:.2f}x);"
            f" {spans[variant]:.1f} spans per rollout; rounds: {rounds}"
        )

    def over(side: str, floor: str, what: str) -> None:
        if side in total and floor in total:
            # Per round, side less floor (the sides of a round ran back to back): its spread too.
            paired = sorted(a - b for a, b in zip(per[side], per[floor], strict=True))
            print(
                f"  {what}: {total[side] - total[floor]:+.1f} ms per rollout ({total[side] / total[floor]:.2f}x);"
                f" per round {paired[0]:+.1f} to {paired[-1]:+.1f}, median {statistics.median(paired):+.1f}"
            )

    over(SDK, PLAIN, "the SDK alone over plain")
    over(CONTRIB, SDK, "gymtrace's exporter and configurator over the SDK alone")
    over(FULL, CONTRIB, "gymtrace's integration over the rest of opentelemetry-instrument")
    over(BEFORE, SDK, "the gymtrace of --gymtrace-src over the SDK alone")
    over(FULL, SDK, "gymtrace's whole share (full over the SDK alone)")
    over(FULL, BEFORE, "this gymtrace over the one of --gymtrace-src (after less before)")
    over(FULL_OPS, SDK, "gymtrace with FastAPI's operation spans kept, over the SDK alone")
    over(FULL_OPS, FULL, "what dropping FastAPI's operation spans saves (kept over dropped)")
    print("  by process, ms CPU per rollout (median over rounds): " + ", ".join(variants))
    names = sorted({name for rounds in parts.values() for row in rounds for name in row})
    for name in names:
        medians = [statistics.median(row.get(name, 0.0) for row in parts[variant]) for variant in variants]
        print(f"    {name:<38}" + "".join(f" {m:8.1f}" for m in medians))


if __name__ == "__main__":
    main()
