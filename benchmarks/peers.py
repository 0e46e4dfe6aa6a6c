"""Peer decorators next to ``@gymtrace.step``, each in its own virtualenv (``perf.py --peers``).

Each peer is installed into a virtualenv of its own under ``~/.cache/gymtrace-bench/peers/`` (not a
gymtrace dependency, and peers pin OpenTelemetry differently), together with this checkout of
gymtrace. Measured as the targets were first measured, "side by side, each against the same hand-written
baseline in its own process":

- **the peer's process** sets the peer up the way its documentation says, exporting through an SDK
  ``BatchSpanProcessor`` to an exporter that drops spans, and times, interleaved, the hand-written
  baseline and the peer's decorator;
- **gymtrace's process** (same venv, so the same OpenTelemetry release) sets gymtrace up the way a
  gymtrace user does, ``gymtrace.configure()``: its own provider, lean span path, identity
  processor and export queue, feeding an exporter that drops spans; it times, interleaved, the same
  baseline and ``@gymtrace.step``.

The baseline is the same code in both processes (``BASELINE``): a ``start_as_current_span`` with the
same name under a stock SDK ``TracerProvider`` of its own with a ``BatchSpanProcessor`` over an
exporter that drops spans. The headline ratio is (gymtrace / baseline) ÷ (peer / baseline). The
peer's process also times ``@gymtrace.step`` under the *peer's* provider, against a hand-written
span under that same provider: the figure this benchmark printed before, labelled "same process";
there gymtrace's lean path does not apply, as in an application that sets its own provider.
Content capture off and on are separate peer processes; gymtrace's process, which has no capture
setting that touches a step's arguments, runs once per peer between them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, NamedTuple

from _child import run_json  # benchmarks/_child.py, beside this script

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("GYMTRACE_BENCH_CACHE", Path.home() / ".cache" / "gymtrace-bench")) / "peers"


class Peer(NamedTuple):
    requirements: list[str]  # pip requirements, pinned to the versions measured
    setup: str  # code that sets the global provider up and defines `decorate(fn)`
    constraints: tuple[str, ...] = ()  # pip constraints (-c), when the requirements alone do not resolve


# Traceloop's OpenTelemetry family, pinned to one release. traceloop-sdk 0.62.4 (the newest) requires
# opentelemetry-sdk>=1.38 and opentelemetry-instrumentation-{logging,redis,requests,sqlalchemy,
# threading,urllib3}>=0.59b0: pip takes sdk 1.45.2 (which needs semantic-conventions 0.66b2), but
# -threading and -urllib3 stop at 0.66b1, and pip backtracks through the instrumentations instead of
# stepping the SDK back, ending in ResolutionImpossible. With the family at 1.45.1 / 0.66b1 it
# resolves at once (only the unused milvus and pinecone instrumentations fall back to 0.60.0).
_TRACELOOP_CONSTRAINTS = (
    "opentelemetry-api==1.45.1",
    "opentelemetry-sdk==1.45.1",
    "opentelemetry-proto==1.45.1",
    "opentelemetry-exporter-otlp-proto-common==1.45.1",
    "opentelemetry-exporter-otlp-proto-grpc==1.45.1",
    "opentelemetry-exporter-otlp-proto-http==1.45.1",
    "opentelemetry-semantic-conventions==0.66b1",
    "opentelemetry-instrumentation==0.66b1",
    "opentelemetry-util-http==0.66b1",
    *(
        f"opentelemetry-instrumentation-{name}==0.66b1"
        for name in ("logging", "redis", "requests", "sqlalchemy", "threading", "urllib3")
    ),
)

# Pinned to the versions measured (each the newest on PyPI on 2026-11-30); traceloop last, as its
# install resolves for the longest.
PEERS: dict[str, Peer] = {
    "logfire": Peer(
        ["logfire==5.4.0"],
        """
        import logfire
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        logfire.configure(send_to_logfire=False, console=False,
                          additional_span_processors=[BatchSpanProcessor(DropExporter())])
        decorate = logfire.instrument("step", extract_args=capture, record_return=capture)
        """,
    ),
    "langfuse": Peer(
        ["langfuse==5.0.4", "opentelemetry-sdk"],
        """
        from langfuse import Langfuse, observe
        from opentelemetry.sdk.trace import TracerProvider
        # Langfuse adds its own span processor (a BatchSpanProcessor) to the provider it is given;
        # span_exporter= replaces its OTLP exporter with the drop exporter. Given none, it encodes
        # every span for a dead endpoint on its export thread, CPU this benchmark would charge to it.
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
        Langfuse(public_key="pk-lf-bench", secret_key="sk-lf-bench", host="http://127.0.0.1:9",
                 tracer_provider=provider, span_exporter=DropExporter())
        decorate = observe(name="step", capture_input=capture, capture_output=capture)
        """,
    ),
    "openinference": Peer(
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
    "traceloop": Peer(
        # 0.62.4 (the newest): unconstrained, ResolutionImpossible (see _TRACELOOP_CONSTRAINTS).
        # 0.62.4 with _TRACELOOP_CONSTRAINTS: installs; imports httpx undeclared, hence "httpx".
        # 0.45.6 (OpenTelemetry 1.34): measured here before 0.62.4 installed; no longer used.
        ["traceloop-sdk==0.62.4", "httpx"],
        """
        os.environ["TRACELOOP_TRACE_CONTENT"] = "true" if capture else "false"
        os.environ["TRACELOOP_TELEMETRY"] = "false"
        from traceloop.sdk import Traceloop
        from traceloop.sdk.decorators import task
        Traceloop.init(app_name="bench", exporter=DropExporter(), disable_batch=False,
                       telemetry_enabled=False)
        decorate = task(name="step")
        """,
        _TRACELOOP_CONSTRAINTS,
    ),
}

# Both processes: the timing loop (CPU time, gc collected then off per block, variants interleaved
# with the order reversed every other round) and an exporter that drops spans but counts them.
PRELUDE = r"""
import gc, json, os, statistics, sys, time
from opentelemetry import trace
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
capture = sys.argv[1] == "on"
n, repeats = int(sys.argv[2]), int(sys.argv[3])

class DropExporter(SpanExporter):
    received = 0
    def export(self, spans):
        DropExporter.received += len(spans)
        return SpanExportResult.SUCCESS
    def shutdown(self):
        pass

def work(x):
    return x

def time_block(fn):
    gc.collect(); gc.disable()
    try:
        t0 = time.process_time_ns()
        for i in range(n):
            fn(i)
        return (time.process_time_ns() - t0) / n / 1000
    finally:
        gc.enable()

def interleaved(variants):
    for v in variants.values():
        v()  # warm-up round, not counted
    res = {k: [] for k in variants}
    names = list(variants)
    for r in range(repeats):
        for k in names if r % 2 == 0 else names[::-1]:
            res[k].append(variants[k]())
    return res

def ratio(res, a, b):
    return statistics.median(x / y for x, y in zip(res[a], res[b]))

def under_episode(fn):
    # A step as gymtrace users make one: inside a rollout, an episode and an agent invocation.
    import gymtrace
    def run():
        with gymtrace.rollout(rollout_id="r", task_id="t", repeat=0):
            with gymtrace.episode():
                with gymtrace.agent_invocation(agent_name="bench"):
                    return time_block(fn)
    return run
"""

# The hand-written baseline: identical code in the peer's process and in gymtrace's.
BASELINE = r"""
from opentelemetry.sdk.trace import TracerProvider as _StockProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor as _StockBatch
_stock = _StockProvider()
_stock.add_span_processor(_StockBatch(DropExporter()))
_hand_tracer = _stock.get_tracer("bench.hand")
def hand(x):
    with _hand_tracer.start_as_current_span("step"):
        return work(x)
"""

PEER_CHILD = r"""
SETUP
BASELINE
import gymtrace
peer = decorate(work)
# The same-process figure: @gymtrace.step under the peer's provider (no configure(), so no lean
# path), against a hand-written span under that provider too.
gym_same = gymtrace.step(work)
_peer_tracer = trace.get_tracer("bench.hand")
def hand_peer(x):
    with _peer_tracer.start_as_current_span("step"):
        return work(x)
res = interleaved({"hand": lambda: time_block(hand), "peer": lambda: time_block(peer),
                   "hand_peer": lambda: time_block(hand_peer), "gym_same": under_episode(gym_same)})
print(json.dumps({"peer_vs_hand": ratio(res, "peer", "hand"), "hand_us": statistics.median(res["hand"]),
                  "peer_us": statistics.median(res["peer"]),
                  "same_peer_vs_hand": ratio(res, "peer", "hand_peer"),
                  "same_gym_vs_hand": ratio(res, "gym_same", "hand_peer"),
                  "same_gym_vs_peer": ratio(res, "gym_same", "peer")}))
"""

GYM_CHILD = r"""
import gymtrace
from gymtrace._sdk import processors as _processors
from gymtrace._otel_private.leanspan import LeanTracer
# configure() builds its exporters in _sdk.processors; swapping the file exporter's constructor for the drop
# exporter keeps everything else exactly what configure() makes: gymtrace's provider and lean span
# path, IdentitySpanProcessor, the export stage and gymtrace's batching queue with its thread.
_processors._file_exporter = lambda *args, **kwargs: DropExporter()
configuration = gymtrace.configure(service_name="bench-peers", file=os.devnull)
assert configuration.owns_provider and configuration.exporters == ("file",), configuration
BASELINE
gym = gymtrace.step(work)
res = interleaved({"hand": lambda: time_block(hand), "gym": under_episode(gym)})
gymtrace.force_flush()
stats = gymtrace.export_stats()
made = (1 + repeats) * (n + 3)  # per block: n steps, and a rollout, an episode and an agent span
assert [(s.finished, s.exported, s.dropped) for s in stats] == [(made, made, 0)], stats
lean = isinstance(trace.get_tracer_provider().get_tracer("gymtrace"), LeanTracer)
print(json.dumps({"gym_vs_hand": ratio(res, "gym", "hand"), "hand_us": statistics.median(res["hand"]),
                  "gym_us": statistics.median(res["gym"]), "lean": lean}))
"""


def venv_python(name: str, peer: Peer) -> str:
    venv = CACHE / name
    python = venv / "bin" / "python"
    marker = venv / ".installed"
    # (Without constraints the marker is the requirements alone, as venvs made before them recorded.)
    wanted = json.dumps(
        [peer.requirements, list(peer.constraints)] if peer.constraints else peer.requirements
    )
    if not marker.exists() or marker.read_text() != wanted:
        print(f"  (installing {name} into {venv}: {' '.join(peer.requirements)})", flush=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        constraints = venv / "constraints.txt"
        constraints.write_text("".join(f"{line}\n" for line in peer.constraints))
        # The peer first, with the OpenTelemetry versions it pins; then this gymtrace without
        # dependencies (it needs only the API and SDK, which every peer setup here brings).
        # Resolving both together makes pip backtrack through the peers' many pins for minutes.
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "-c", str(constraints), *peer.requirements],
            check=True,
        )
        marker.write_text(wanted)
    # This checkout of gymtrace, every run (a copy, not editable: the venv outlives the worktree).
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(ROOT)], check=True
    )
    return str(python)


def run(python: str, code: str, capture: bool, quick: bool) -> dict[str, Any]:
    n, repeats = ("2000", "5") if quick else ("10000", "9")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GYMTRACE_", "TRACELOOP_"))}
    return dict(run_json(python, PRELUDE + code, ["on" if capture else "off", n, repeats], env))


def measure(name: str, quick: bool) -> dict[str, Any]:
    """The peer's process with capture off, gymtrace's process, the peer's with capture on."""
    peer = PEERS[name]
    python = venv_python(name, peer)
    baseline = textwrap.dedent(BASELINE)
    peer_code = PEER_CHILD.replace("SETUP", textwrap.dedent(peer.setup)).replace("BASELINE", baseline)
    off = run(python, peer_code, False, quick)
    gym = run(python, GYM_CHILD.replace("BASELINE", baseline), False, quick)
    on = run(python, peer_code, True, quick)
    version = subprocess.run(
        [python, "-c", "import opentelemetry.version as v; print(v.__version__)"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return {"off": off, "on": on, "gym": gym, "otel": version}


def peer_rows(quick: bool) -> list[tuple[str, str, str, str, bool | None]]:
    print(
        "peers (each in its own venv; gymtrace under configure() in its own process, the peer in its own;"
        " both against the same hand-written span)"
    )
    rows: list[tuple[str, str, str, str, bool | None]] = []
    for name, peer in PEERS.items():
        try:
            r = measure(name, quick)
        except (RuntimeError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            print(f"  {name:<14} FAILED: {str(exc)[-400:]}")
            continue
        gym = r["gym"]
        print(
            f"  {name} ({' '.join(peer.requirements)}, opentelemetry {r['otel']}): gymtrace process"
            f" @step/hand {gym['gym_vs_hand']:.2f}x ({gym['gym_us']:.1f} vs {gym['hand_us']:.1f} µs,"
            f" lean path {'on' if gym['lean'] else 'OFF'})"
        )
        for capture in (False, True):
            p = r["on" if capture else "off"]
            ratio = gym["gym_vs_hand"] / p["peer_vs_hand"]
            label = "on " if capture else "off"
            print(
                f"    capture {label}  peer/hand {p['peer_vs_hand']:5.2f}x ({p['peer_us']:.1f} vs"
                f" {p['hand_us']:.1f} µs)  @step/peer {ratio:5.2f}x  | same process, under the peer's"
                f" provider: peer/hand {p['same_peer_vs_hand']:5.2f}x  @step/hand {p['same_gym_vs_hand']:5.2f}x"
                f"  @step/peer {p['same_gym_vs_peer']:5.2f}x"
            )
            if name == "traceloop" and not capture:
                rows.append(
                    ("`@step` vs Traceloop `@task`, capture off, same day", "0.58-0.63x", "<= 0.4x",
                     f"{ratio:.2f}x", ratio <= 0.4)
                )  # fmt: skip
                rows.append(
                    ("  (same process, gymtrace under Traceloop's provider)", "", "",
                     f"{p['same_gym_vs_peer']:.2f}x", None)
                )  # fmt: skip
            else:
                rows.append(
                    (f"  `@step` vs {name}, capture {label.strip()} (same process: {p['same_gym_vs_peer']:.2f}x)",
                     "", "", f"{ratio:.2f}x", None)
                )  # fmt: skip
    return rows


if __name__ == "__main__":
    for row in peer_rows("--quick" in sys.argv):
        print(row)
