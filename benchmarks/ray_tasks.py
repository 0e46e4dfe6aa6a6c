"""What ``gymtrace.integrations.ray`` costs per Ray task, the per-call flush included.

One local cluster (``ray.init(num_cpus=2)``), one remote function that does a little work; rounds
alternate the same number of sequential calls made outside any gym scope (nothing carried, the
function runs as it would untraced) and inside an episode (carried, a ``ray.task`` span and a child
span in the worker, flushed to the worker's trace file before the call returns). Prints the median
round-trip per call of each, their ratio, and the median time the worker spent in the flush.

    python benchmarks/ray_tasks.py [--calls 100] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import ray

import gymtrace
import gymtrace.integrations.ray


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    out = tempfile.mkdtemp()
    config = gymtrace.configure(service_name="bench-ray", file=os.path.join(out, "traces.jsonl"))
    gymtrace.integrations.ray.instrument(config)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)

    @ray.remote
    def work(x: int) -> tuple[int, float]:
        with gymtrace.tool_call(tool_name="work"):
            total = sum(range(2000 + x))
        # The flush the integration does at the end of the call, timed here once more on its own.
        start = time.perf_counter()
        gymtrace.force_flush()
        return total, time.perf_counter() - start

    ray.get([work.remote(0) for _ in range(4)])  # warm the workers
    plain: list[float] = []
    traced: list[float] = []
    flushes: list[float] = []
    for _ in range(args.rounds):
        start = time.perf_counter()
        for i in range(args.calls):
            ray.get(work.remote(i))
        plain.append((time.perf_counter() - start) / args.calls)
        with gymtrace.rollout(rollout_id="bench"), gymtrace.episode():
            start = time.perf_counter()
            for i in range(args.calls):
                flushes.append(ray.get(work.remote(i))[1])
            traced.append((time.perf_counter() - start) / args.calls)
    ray.shutdown()
    p, t = statistics.median(plain), statistics.median(traced)
    print(f"Ray task round trip, {args.calls} sequential calls x {args.rounds} rounds, medians")
    print(f"outside gym scopes (nothing carried): {p * 1e3:7.2f} ms")
    print(f"inside an episode (carried, flushed): {t * 1e3:7.2f} ms   {t / p:.2f}x")
    print(f"worker's force_flush after the call:  {statistics.median(flushes) * 1e3:7.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
