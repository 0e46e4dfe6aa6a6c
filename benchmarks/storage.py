"""Jaeger's stores under a training run: ingest rate, search latency, disk per span, startup.

Run (after ``collector/build --otelcol --opensearch``)::

    python benchmarks/storage.py                              # 2,000 rollouts x 40 spans per store
    python benchmarks/storage.py --rollouts 10000             # the full size, where the machine can
    python benchmarks/storage.py --stores badger opensearch

For each store this runs the real scripts from a copy of ``collector/`` on free ports (as the
end-to-end tests do): ``collector/up --storage S`` on an empty data directory (**cold**), a child
process exporting N rollouts of 40 gymtrace spans each (rollout > episode > 38 steps; a quarter of
them unscored) through the tail-sampling Collector with every rollout kept, then:

* **ingest**: spans per second from the producer's first span until every rollout is searchable in
  Jaeger (the last rollout by its ID, then all N by ``gym.run.id`` + ``gym.kind=rollout``);
* **search**: median and p90 of 20 searches by ``gym.rollout.id`` and of the
  ``gym.rollout.outcome=unscored`` search (limit 20), through Jaeger's query API;
* **disk**: bytes on disk per span (Badger: the blocks its directory allocates, as ``du`` counts
  them; OpenSearch: the span and service indices' primary store size after a flush), none for
  memory;
* ``collector/down`` then ``collector/up`` over the data just written (**warm**).

Prints numbers only; nothing here asserts a time. On a shared 2-core VM absolute times drift; read
the stores against each other within one run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "support"))  # the harness: pipeline.py, collector_scripts.py

from child_process import clean_env  # noqa: E402
from pipeline import COLLECTOR_DIR, free_ports  # noqa: E402

SPANS_PER_ROLLOUT = 40

PRODUCER = r"""
import sys, time
import gymtrace

endpoint, run_id, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
gymtrace.configure(service_name="storage-bench", endpoint=endpoint, protocol="grpc", file=False)
start = time.time()
with gymtrace.run(run_id=run_id):
    for i in range(n):
        with gymtrace.rollout(rollout_id=f"r-{i}", task_id=f"t-{i % 50}", repeat=i // 50):
            with gymtrace.episode():
                for _ in range(38):
                    with gymtrace.step():
                        pass
                if i % 4:
                    gymtrace.record_reward((i % 7) / 6)
gymtrace.shutdown()
print(start, time.time())
"""

PORT_VARIABLES = (
    "GYMTRACE_OTLP_GRPC_PORT",
    "GYMTRACE_OTLP_HTTP_PORT",
    "GYMTRACE_COLLECTOR_HEALTH_PORT",
    "GYMTRACE_JAEGER_OTLP_GRPC_PORT",
    "GYMTRACE_JAEGER_OTLP_HTTP_PORT",
    "GYMTRACE_JAEGER_QUERY_PORT",
    "GYMTRACE_JAEGER_QUERY_GRPC_PORT",
    "GYMTRACE_JAEGER_HEALTH_PORT",
    "GYMTRACE_PROMETHEUS_PORT",
)


def _get(url: str, timeout: float = 120) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.load(resp)


def _search(query: str, tags: dict[str, str], limit: int) -> list[Any]:
    params = urllib.parse.urlencode(
        {"service": "storage-bench", "tags": json.dumps(tags), "limit": limit, "lookback": "2h"}
    )
    return _get(f"{query}/api/traces?{params}")["data"] or []


def _timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _dir_bytes(path: Path) -> int:
    """Bytes allocated on disk (like ``du``): Badger's value log is a sparse, preallocated file."""
    return sum(f.stat().st_blocks * 512 for f in path.rglob("*") if f.is_file())


def _script(copy: Path, name: str, *args: str, env: dict[str, str]) -> float:
    start = time.perf_counter()
    out = subprocess.run([str(copy / name), *args], env=env, capture_output=True, text=True, check=False)
    if out.returncode:
        sys.exit(f"collector/{name} {' '.join(args)} failed:\n{out.stdout}{out.stderr}")
    return time.perf_counter() - start


def bench(store: str, rollouts: int, work: Path) -> dict[str, Any]:
    copy = work / store / "collector"
    shutil.copytree(COLLECTOR_DIR, copy, ignore=shutil.ignore_patterns("bin", ".run", ".data"))
    (copy / "bin").symlink_to(COLLECTOR_DIR / "bin")
    ports = free_ports(len(PORT_VARIABLES) + 1)
    env = clean_env(
        **dict(zip(PORT_VARIABLES, map(str, ports), strict=False)),
        GYMTRACE_OPENSEARCH_PORT=str(ports[-1]),
        GYMTRACE_JAEGER_DATA_DIR=str(work / store / "data"),
        GYMTRACE_SAMPLE_PERCENT="100",
        GYMTRACE_DECISION_WAIT_AFTER_ROOT="1s",
        GYMTRACE_UP_TIMEOUT="120",
        GYMTRACE_JAEGER_MAX_TRACES=str(rollouts + 100),
    )
    query = f"http://127.0.0.1:{env['GYMTRACE_JAEGER_QUERY_PORT']}"
    result: dict[str, Any] = {"store": store, "rollouts": rollouts, "spans": rollouts * SPANS_PER_ROLLOUT}
    try:
        result["up_cold_s"] = _script(copy, "up", "--storage", store, env=env)
        run_id = f"bench-{store}"
        endpoint = f"http://127.0.0.1:{env['GYMTRACE_OTLP_GRPC_PORT']}"
        out = subprocess.run(
            [sys.executable, "-c", PRODUCER, endpoint, run_id, str(rollouts)],
            env=clean_env(),
            capture_output=True,
            text=True,
            check=True,
        )
        start, produced = map(float, out.stdout.split())
        result["produce_s"] = produced - start
        last = {"gym.rollout.id": f"r-{rollouts - 1}"}
        while not _search(query, last, 1):
            time.sleep(1)
        everything = {"gym.run.id": run_id, "gym.kind": "rollout"}
        deadline = time.time() + 600
        while (found := len(_search(query, everything, rollouts + 10))) < rollouts and time.time() < deadline:
            time.sleep(5)
        result["ingest_s"] = time.time() - start
        result["found"] = found
        result["ingest_spans_per_s"] = rollouts * SPANS_PER_ROLLOUT / result["ingest_s"]
        by_id = [
            _timed(lambda i=i: _search(query, {"gym.rollout.id": f"r-{i}"}, 1))
            for i in range(0, rollouts, max(1, rollouts // 20))
        ]
        unscored = [
            _timed(lambda: _search(query, {"gym.rollout.outcome": "unscored"}, 20)) for _ in range(10)
        ]
        result["search_by_id_ms"] = (
            statistics.median(by_id) * 1000,
            statistics.quantiles(by_id, n=10)[-1] * 1000,
        )
        result["search_unscored_ms"] = (
            statistics.median(unscored) * 1000,
            statistics.quantiles(unscored, n=10)[-1] * 1000,
        )
        if store == "badger":
            result["disk_bytes"] = _dir_bytes(work / store / "data" / "badger")
        elif store == "opensearch":
            os_url = f"http://127.0.0.1:{env['GYMTRACE_OPENSEARCH_PORT']}"
            urllib.request.urlopen(
                urllib.request.Request(f"{os_url}/_flush", method="POST"), timeout=120
            ).read()
            stats = _get(f"{os_url}/gymtrace-jaeger-*/_stats/store")
            result["disk_bytes"] = stats["_all"]["primaries"]["store"]["size_in_bytes"]
        if "disk_bytes" in result:
            result["disk_bytes_per_span"] = result["disk_bytes"] / result["spans"]
        _script(copy, "down", env=env)
        result["up_warm_s"] = _script(copy, "up", "--storage", store, env=env)
    finally:
        subprocess.run([str(copy / "down")], env=env, capture_output=True, check=False)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=2000)
    parser.add_argument("--stores", nargs="+", default=["memory", "badger", "opensearch"])
    parser.add_argument("--json", action="store_true", help="one JSON object per store")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="gymtrace-storage-bench-") as work:
        for store in args.stores:
            result = bench(store, args.rollouts, Path(work))
            results.append(result)
            print(json.dumps(result) if args.json else result, flush=True)
    print()
    print(
        "| store | spans | ingest spans/s | search by id ms (median/p90) | unscored search ms (median/p90) | disk bytes/span | up cold s | up warm s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        disk = f"{r['disk_bytes_per_span']:.0f}" if "disk_bytes_per_span" in r else "—"
        print(
            f"| {r['store']} | {r['spans']:,} | {r['ingest_spans_per_s']:,.0f} "
            f"| {r['search_by_id_ms'][0]:.0f} / {r['search_by_id_ms'][1]:.0f} "
            f"| {r['search_unscored_ms'][0]:.0f} / {r['search_unscored_ms'][1]:.0f} "
            f"| {disk} | {r['up_cold_s']:.1f} | {r['up_warm_s']:.1f} |"
        )


if __name__ == "__main__":
    main()
