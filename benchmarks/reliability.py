"""What faults cost gymtrace's callers: a dead Collector, a million spans, a Collector restart.

Run (after ``collector/build``)::

    python benchmarks/reliability.py           # ~2-3 minutes
    python benchmarks/reliability.py --quick   # ~40 seconds

(i) **Caller-side cost per span**, dead endpoint vs live Collector, in the same run: subprocesses
    alternate (dead, live, dead, live, ...), each ``gymtrace.configure(endpoint=...)`` and times a
    tight loop of gymtrace spans on the caller's thread (step > model call > tool call). The ratio
    of medians is what to read; absolute times drift +-30 % on a shared VM.
(ii) **Memory at a million spans against a dead endpoint**: one subprocess ends 1,000,000 spans
    (200,000 with ``--quick``) while a thread samples its RSS; prints the peak, the plateau (median
    of the second half of the samples) and the RSS when the queue first filled.
(iii) **Spans delivered after a Collector restart**: ``tests/support/fault_worker.py`` exports to a real
    Collector + Jaeger (``tests/pipeline.py``); the Collector is killed, the worker keeps producing,
    the Collector is started again; prints what was finished while it was down, what was delivered
    after it came back, what was dropped, and what Jaeger holds.

Prints numbers only; nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "support"))  # the harness: pipeline.py, fault_worker.py

CALLER_CODE = r"""
import json, sys, time, gc
import gymtrace
gymtrace.configure(service_name="bench-reliability", endpoint=sys.argv[1], protocol="grpc")
n = int(sys.argv[2])
def block(count):
    with gymtrace.rollout(rollout_id="bench", task_id="t", repeat=0):
        with gymtrace.episode():
            with gymtrace.agent_invocation(agent_name="bench"):
                for _ in range(count):
                    with gymtrace.step():
                        with gymtrace.model_call(model="m", provider="p"):
                            pass
                        with gymtrace.tool_call(tool_name="t"):
                            pass
block(200)  # warm up, and let the exporter connect (or fail to)
time.sleep(1.0)
times = []
for _ in range(5):
    t0 = time.perf_counter()
    block(n // 3)
    times.append((time.perf_counter() - t0) / (3 * (n // 3) + 4))
print(json.dumps({"per_span_us": sorted(times)[2] * 1e6,
                  "stats": [s.dropped_queue_full for s in gymtrace.export_stats()]}))
"""

MEMORY_CODE = r"""
import json, os, sys, threading, time
import gymtrace
gymtrace.configure(service_name="bench-memory", endpoint=sys.argv[1], protocol="grpc")
n = int(sys.argv[2])
page = os.sysconf("SC_PAGE_SIZE")
def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page / 2**20
samples = []
done = threading.Event()
def sample():
    t0 = time.monotonic()
    while not done.is_set():
        samples.append((time.monotonic() - t0, rss_mb()))
        time.sleep(0.1)
threading.Thread(target=sample, daemon=True).start()
base = rss_mb()
first_full = None
tracer_scope = gymtrace.step
spans = 0
t0 = time.monotonic()
with gymtrace.rollout(rollout_id="mem", task_id="t", repeat=0):
    with gymtrace.episode():
        with gymtrace.agent_invocation(agent_name="mem"):
            while spans < n:
                for _ in range(1000):
                    with gymtrace.step():
                        pass
                spans += 1000
                if first_full is None and gymtrace.export_stats()[0].dropped_queue_full:
                    first_full = (spans, rss_mb())
elapsed = time.monotonic() - t0
done.set()
stats = gymtrace.export_stats()[0]
print(json.dumps({"base_mb": base, "samples": samples, "first_full": first_full, "elapsed": elapsed,
                  "finished": stats.finished, "queued": stats.queued, "dropped": stats.dropped,
                  "max_queue": int(os.environ.get("OTEL_BSP_MAX_QUEUE_SIZE", "8192"))}))
os._exit(0)  # skip the exit flush against the dead endpoint: not what is measured here
"""


def dead_endpoint() -> str:
    from pipeline import free_ports

    return f"http://127.0.0.1:{free_ports(1)[0]}"  # nothing listens there


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GYMTRACE_"))}
    env.update(OTEL_EXPORTER_OTLP_TIMEOUT="1", **extra)
    return env


def run_child(code: str, *args: str, env: dict[str, str] | None = None, timeout: float = 600) -> Any:
    out = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or child_env(),
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"child failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def caller_cost(pipe: Any, quick: bool) -> None:
    n = 3000 if quick else 9000
    rounds = 3 if quick else 6
    dead, live = [], []
    for _ in range(rounds):
        dead.append(run_child(CALLER_CODE, dead_endpoint(), str(n))["per_span_us"])
        live.append(run_child(CALLER_CODE, pipe.otlp_grpc_endpoint, str(n))["per_span_us"])
    d, lv = statistics.median(dead), statistics.median(live)
    ratios = [a / b for a, b in zip(dead, live, strict=True)]
    print("(i) caller-side cost per span (step > model call > tool call, tight loop)")
    print(f"    dead endpoint : median {d:7.1f} us/span  (rounds: {', '.join(f'{x:.1f}' for x in dead)})")
    print(f"    live Collector: median {lv:7.1f} us/span  (rounds: {', '.join(f'{x:.1f}' for x in live)})")
    print(f"    dead / live   : {d / lv:.2f} (median of per-round ratios {statistics.median(ratios):.2f})")


def memory(quick: bool) -> None:
    n = 200_000 if quick else 1_000_000
    r = run_child(MEMORY_CODE, dead_endpoint(), str(n), timeout=900)
    rss = [mb for _, mb in r["samples"]]
    second_half = rss[len(rss) // 2 :] or rss
    plateau = statistics.median(second_half)
    print(
        f"(ii) {r['finished']:,} spans against a dead endpoint in {r['elapsed']:.0f}s (queue bound {r['max_queue']})"
    )
    print(
        f"    RSS at start {r['base_mb']:.0f} MB; when the queue first filled {r['first_full'][1]:.0f} MB"
        f" (after {r['first_full'][0]:,} spans)"
    )
    print(
        f"    RSS peak {max(rss):.0f} MB; plateau (median of the 2nd half) {plateau:.0f} MB;"
        f" last sample {rss[-1]:.0f} MB"
    )
    marks = [rss[int(i * (len(rss) - 1) / 4)] for i in range(5)]
    print(f"    RSS at 0/25/50/75/100 % of the run: {' / '.join(f'{m:.0f}' for m in marks)} MB")
    print(f"    queued {r['queued']}, dropped {r['dropped']:,} (counted)")


def restart(quick: bool) -> None:
    from pipeline import Pipeline

    down_rollouts = 100 if quick else 400
    with Pipeline(decision_wait="1s", sample_percent=100) as p, tempfile.TemporaryDirectory() as tmp:
        control = Path(tmp)
        service = f"bench-restart-{os.getpid()}"
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "support" / "fault_worker.py"), "--service", service,
             "--endpoint", p.otlp_grpc_endpoint, "--phases", f"20,{down_rollouts},20",
             "--pace", "0.002", "--control", tmp, "--ids", str(control / "ids")],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=child_env(),
        )  # fmt: skip

        def phase(i: int) -> dict[str, Any]:
            path = control / f"phase-{i}.json"
            deadline = time.monotonic() + 300
            while not path.exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("worker ended early")
                time.sleep(0.05)
            return dict(json.loads(path.read_text())["stats"][0])

        before = phase(0)

        def in_jaeger() -> set[str]:
            return {s["spanID"] for t in p.find_traces(service, limit=100_000) for s in t["spans"]}

        # Kill only once Jaeger holds everything so far: what the Collector acknowledged and still
        # held (tail sampling waits decision_wait) dies with it, and no client can count that.
        deadline = time.monotonic() + 30
        while len(in_jaeger()) < before["finished"] and time.monotonic() < deadline:
            time.sleep(0.25)
        p.kill_collector()
        (control / "go-0").write_text("")
        down = phase(1)
        t_down = time.monotonic()
        p.start_collector()
        restart_s = time.monotonic() - t_down
        (control / "go-1").write_text("")
        out, _ = proc.communicate(timeout=300)
        final = json.loads(out.strip().splitlines()[-1])["stats"][0]
        # Poll: the restarted Collector forwards the burst over a few decision_wait periods.
        deadline = time.monotonic() + 60
        while True:
            received = in_jaeger()
            if len(received) >= final["exported"] or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    finished_while_down = down["finished"] - before["finished"]
    print("(iii) Collector killed (SIGKILL) mid-run, started again")
    print(
        f"    spans finished while it was down: {finished_while_down}; exported before the kill:"
        f" {down['exported']}; Collector back in {restart_s:.1f}s"
    )
    print(
        f"    spans delivered after the restart: {final['exported'] - down['exported']}"
        f" (of which finished while down: {finished_while_down}); retries {final['retries']}"
    )
    print(
        f"    totals: finished {final['finished']}, exported {final['exported']}, dropped"
        f" {final['dropped_queue_full'] + final['dropped_export_failed']}; Jaeger holds {len(received)}"
        " distinct spans"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short mode (~40 s)")
    parser.add_argument("--only", choices=["caller", "memory", "restart"], action="append")
    args = parser.parse_args(argv)
    only = set(args.only or ["caller", "memory", "restart"])
    from pipeline import Pipeline

    t0 = time.monotonic()
    if "caller" in only:
        with Pipeline(decision_wait="1s", sample_percent=100) as p:
            caller_cost(p, args.quick)
    if "memory" in only:
        memory(args.quick)
    if "restart" in only:
        restart(args.quick)
    print(f"total {time.monotonic() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
