"""What exporting spans costs a process's garbage collector: collections per 1,000 spans.

Run::

    python benchmarks/gc_pressure.py                # 20,000 spans, 5 rounds
    python benchmarks/gc_pressure.py --rounds 3

Why: NeMo Gym's servers spend 30-34 % of their CPU in CPython's cyclic garbage collector, nearly
all in full collections of 150-180 ms over their large heaps, one every ~11 collections of the
middle generation (docs/performance.md, "Again, and where the garbage collector's share is"). A
young collection falls due when the count of container objects allocated and not yet freed
passes 700, and the count restarts at zero after each collection: an object that outlives a
collection is never taken off it. A span the SDK drops as it ends (no processor) is freed before
that happens; a span that waits in an export queue keeps its container objects (the span, its
context, its attributes, events and links) alive across collections. So the queue turns every
exported span into net allocations, and each ~100 young collections bring a full one.

Each side is a child process that makes ``--spans`` spans the way an instrumented web framework
does (``tracer.start_as_current_span`` with a handful of HTTP attributes, through the
OpenTelemetry API), and reports the collections of each generation (``gc.get_stats()``), the
seconds spent in them (a ``gc.callbacks`` hook) and the CPU per span (``time.process_time``, the
export thread's work included):

* ``sdk only``: the SDK's ``TracerProvider`` and no processor (the spans are dropped as they end);
* ``gymtrace, none``: ``gymtrace.configure(file=False)`` and no endpoint: gymtrace's provider and
  identity processor, no exporter;
* ``gymtrace file``: ``gymtrace.configure(file=...)`` with the export on a thread of the process
  (``GYMTRACE_ENCODER=thread``, what ``auto`` uses at a server's span rate).

Sides alternate round by round; medians are printed, the CPU beside ``sdk only``'s. How often
a full collection follows, and what it costs, depends on the heap and on what else the process
keeps: in NeMo Gym's servers one came every ~11 middle collections and took 150-180 ms. Nothing
here asserts a time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _child import run_json

CHILD = r"""
import gc, json, sys, tempfile, time, os
side, spans = sys.argv[1], int(sys.argv[2])
from opentelemetry import trace
if side == "sdk":
    from opentelemetry.sdk.trace import TracerProvider
    trace.set_tracer_provider(TracerProvider())
else:
    import gymtrace
    file = os.path.join(tempfile.mkdtemp(), "spans.jsonl") if side == "gymtrace" else False
    gymtrace.configure(service_name="gc-pressure", file=file)
tracer = trace.get_tracer("bench")
spent = [0.0, 0.0, 0.0]
started = [0.0]
def on_gc(phase, info):
    if phase == "start":
        started[0] = time.perf_counter()
    else:
        spent[info["generation"]] += time.perf_counter() - started[0]
def requests(n):
    for i in range(n):
        with tracer.start_as_current_span("POST /run", kind=trace.SpanKind.SERVER, attributes={
            "http.method": "POST", "http.route": "/run", "http.status_code": 200,
            "net.peer.port": 40000 + i % 1000, "gym.rollout.id": f"r-{i // 12}",
        }):
            pass
def flush():
    if side != "sdk":
        gymtrace.force_flush()
requests(2000)  # warm: caches filled, the export thread running
flush()
gc.collect()
gc.callbacks.append(on_gc)
before = [g["collections"] for g in gc.get_stats()]
cpu = time.process_time()
requests(spans)
flush()
cpu = time.process_time() - cpu
after = [g["collections"] for g in gc.get_stats()]
print(json.dumps({"collections": [b - a for a, b in zip(before, after)], "gc_s": spent,
                  "cpu_us_per_span": cpu / spans * 1e6}))
"""

SIDES = {"sdk": "sdk only", "no-export": "gymtrace, none", "gymtrace": "gymtrace file"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spans", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GYMTRACE_", "OTEL_"))}
    env["GYMTRACE_ENCODER"] = "thread"
    results: dict[str, list[dict]] = {side: [] for side in SIDES}
    for round_ in range(args.rounds):
        order = list(SIDES) if round_ % 2 == 0 else list(reversed(SIDES))  # alternating
        for side in order:
            results[side].append(run_json(sys.executable, CHILD, [side, str(args.spans)], env))
    print(f"{args.spans:,} spans through the OpenTelemetry API, {args.rounds} rounds, medians:")
    base_cpu = statistics.median(r["cpu_us_per_span"] for r in results["sdk"])
    for side, label in SIDES.items():
        rows = results[side]
        per_k = [statistics.median(r["collections"][g] * 1000 / args.spans for r in rows) for g in range(3)]
        gc_us = statistics.median(sum(r["gc_s"]) / args.spans * 1e6 for r in rows)
        cpu = statistics.median(r["cpu_us_per_span"] for r in rows)
        print(
            f"  {label:14} collections per 1,000 spans: young {per_k[0]:.2f}, middle {per_k[1]:.2f},"
            f" full {per_k[2]:.2f}; in the collector {gc_us:.1f} us a span;"
            f" CPU {cpu:.1f} us a span ({cpu / base_cpu:.2f}x sdk only)"
        )


if __name__ == "__main__":
    main()
