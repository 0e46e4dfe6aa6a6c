"""Peer decorators next to ``@gymtrace.step``, each in its own virtualenv (``perf.py --peers``).

Each peer is installed into a virtualenv of its own under ``~/.cache/gymtrace-bench/peers/`` (not a
gymtrace dependency, and peers pin OpenTelemetry differently), together with this checkout of
gymtrace. In that venv one process sets the peer up the way its documentation says, with an SDK
``BatchSpanProcessor`` over an exporter that drops spans, and times, interleaved: a hand-written
``start_as_current_span`` (the baseline), the peer's decorator and ``@gymtrace.step`` — all under the
same provider, so the ratio peer/hand and gymtrace/hand share one baseline. Content capture off and
on are separate processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("GYMTRACE_BENCH_CACHE", Path.home() / ".cache" / "gymtrace-bench")) / "peers"

# name -> (pip requirements, setup code defining `decorate(fn)` and setting the global provider).
# Pinned to the versions measured; traceloop last, as its install resolves for the longest.
PEERS: dict[str, tuple[list[str], str]] = {
    "logfire": (
        ["logfire==5.4.0"],
        """
        import logfire
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        logfire.configure(send_to_logfire=False, console=False,
                          additional_span_processors=[BatchSpanProcessor(DropExporter())])
        decorate = logfire.instrument("step", extract_args=capture, record_return=capture)
        """,
    ),
    "langfuse": (
        ["langfuse==5.0.4", "opentelemetry-sdk"],
        """
        from langfuse import Langfuse, observe
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        # Langfuse exports through the provider it is given: the global one, with a drop exporter.
        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(DropExporter()))
        trace.set_tracer_provider(provider)
        Langfuse(public_key="pk-lf-bench", secret_key="sk-lf-bench", host="http://127.0.0.1:9",
                 tracer_provider=provider)
        decorate = observe(name="step", capture_input=capture, capture_output=capture)
        """,
    ),
    "openinference": (
        ["openinference-instrumentation==0.1.72", "opentelemetry-sdk"],
        """
        from openinference.instrumentation import OITracer, TraceConfig
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(DropExporter()))
        trace.set_tracer_provider(provider)
        oi = OITracer(trace.get_tracer("bench.oi"),
                      config=TraceConfig(hide_inputs=not capture, hide_outputs=not capture))
        decorate = oi.chain(name="step")
        """,
    ),
    "traceloop": (
        # 0.62.4 (the newest) does not install: its instrumentation pins conflict; pip settles on
        # 0.45.6 (OpenTelemetry 1.34) when asked for anything older.
        ["traceloop-sdk==0.45.6"],
        """
        os.environ["TRACELOOP_TRACE_CONTENT"] = "true" if capture else "false"
        os.environ["TRACELOOP_TELEMETRY"] = "false"
        from traceloop.sdk import Traceloop
        from traceloop.sdk.decorators import task
        Traceloop.init(app_name="bench", exporter=DropExporter(), disable_batch=False,
                       telemetry_enabled=False)
        decorate = task(name="step")
        """,
    ),
}

CHILD = r"""
import gc, json, os, statistics, sys, time
from opentelemetry import trace
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
capture = sys.argv[1] == "on"
n, repeats = int(sys.argv[2]), int(sys.argv[3])

class DropExporter(SpanExporter):
    def export(self, spans):
        return SpanExportResult.SUCCESS
    def shutdown(self):
        pass

SETUP

import gymtrace
def work(x):
    return x
peer = decorate(work)
gym = gymtrace.step(work)
tracer = trace.get_tracer("bench.hand")
def hand(x):
    with tracer.start_as_current_span("step"):
        return work(x)
def time_block(fn):
    gc.collect(); gc.disable()
    try:
        t0 = time.process_time_ns()
        for i in range(n):
            fn(i)
        return (time.process_time_ns() - t0) / n / 1000
    finally:
        gc.enable()
def under_episode(fn):
    with gymtrace.rollout(rollout_id="r", task_id="t", repeat=0):
        with gymtrace.episode():
            with gymtrace.agent_invocation(agent_name="bench"):
                return time_block(fn)
variants = {"hand": lambda: time_block(hand), "peer": lambda: time_block(peer),
            "gym": lambda: under_episode(gym)}
for v in variants.values():
    v()
res = {k: [] for k in variants}
names = list(variants)
for r in range(repeats):
    for k in names if r % 2 == 0 else names[::-1]:
        res[k].append(variants[k]())
ratio = lambda a, b: statistics.median(x / y for x, y in zip(res[a], res[b]))
print(json.dumps({"peer_vs_hand": ratio("peer", "hand"), "gym_vs_hand": ratio("gym", "hand"),
                  "gym_vs_peer": ratio("gym", "peer"), "hand_us": statistics.median(res["hand"])}))
"""


def venv_python(name: str, requirements: list[str]) -> str:
    venv = CACHE / name
    python = venv / "bin" / "python"
    marker = venv / ".installed"
    wanted = json.dumps(requirements)
    if not marker.exists() or marker.read_text() != wanted:
        print(f"  (installing {name} into {venv}: {' '.join(requirements)})", flush=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        # The peer first, with the OpenTelemetry versions it pins; then this gymtrace without
        # dependencies (it needs only the API and SDK, which every peer setup here brings).
        # Resolving both together makes pip backtrack through the peers' many pins for minutes.
        subprocess.run([str(python), "-m", "pip", "install", "-q", *requirements], check=True)
        marker.write_text(wanted)
    # This checkout of gymtrace, every run (a copy, not editable: the venv outlives the worktree).
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(ROOT)], check=True
    )
    return str(python)


def measure(name: str, capture: bool, quick: bool) -> dict[str, Any]:
    requirements, setup = PEERS[name]
    python = venv_python(name, requirements)
    code = CHILD.replace("SETUP", textwrap.dedent(setup))
    n, repeats = ("2000", "5") if quick else ("10000", "9")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GYMTRACE_", "TRACELOOP_"))}
    out = subprocess.run(
        [python, "-c", code, "on" if capture else "off", n, repeats],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{name} child failed:\n{out.stderr[-3000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def peer_rows(quick: bool) -> list[tuple[str, str, str, str, bool | None]]:
    print("peers (each in its own venv; ratios against a hand-written span in the same process)")
    rows: list[tuple[str, str, str, str, bool | None]] = []
    for name in PEERS:
        for capture in (False, True):
            try:
                r = measure(name, capture, quick)
            except (RuntimeError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
                print(f"  {name:<14} capture {'on ' if capture else 'off'}  FAILED: {str(exc)[-400:]}")
                continue
            print(
                f"  {name:<14} capture {'on ' if capture else 'off'}  peer/hand {r['peer_vs_hand']:5.2f}x"
                f"  @step/hand {r['gym_vs_hand']:5.2f}x  @step/peer {r['gym_vs_peer']:5.2f}x"
                f"  (hand {r['hand_us']:.1f} µs)"
            )
            if name == "traceloop" and not capture:
                rows.append(
                    ("`@step` vs Traceloop `@task`, capture off, same day", "0.58-0.63x", "<= 0.4x",
                     f"{r['gym_vs_peer']:.2f}x", r["gym_vs_peer"] <= 0.4)
                )  # fmt: skip
            else:
                rows.append(
                    (f"  `@step` vs {name}, capture {'on' if capture else 'off'}", "", "",
                     f"{r['gym_vs_peer']:.2f}x", None)
                )  # fmt: skip
    return rows


if __name__ == "__main__":
    for row in peer_rows("--quick" in sys.argv):
        print(row)
