"""Jaeger's stores under a training run: every hop counted, ingest, search, disk per span, startup.

Run (after ``collector/build --otelcol --opensearch``)::

    python benchmarks/storage.py                              # 2,000 rollouts x 14 spans per store
    python benchmarks/storage.py --rollouts 10000 20000 --stores badger opensearch

For each store and size this runs the real scripts from a copy of ``collector/`` on free ports (as
the end-to-end tests do): ``collector/up --storage S`` on an empty data directory (**cold**), a child
process exporting N rollouts of 14 gymtrace spans each (rollout > episode > 12 steps; a quarter
of them unscored) as fast as the API allows through the tail-sampling Collector with every rollout
kept (``GYMTRACE_SAMPLE_PERCENT=100``), then counts every hop (issue 47):

* **producer**: spans finished, exported and dropped (``gymtrace.export_stats()``, after a flush
  that waits as long as delivery takes);
* **Collector**: spans its receiver accepted and refused, sent to Jaeger, and lost (send failed or
  queue full), from its own ``otelcol_*`` metrics through ``collector/status --json``, as the
  difference across the run;
* **store**: span documents of this run's service in OpenSearch (``_count``; ``_cat/indices``
  would count Jaeger's nested tag documents too), or the distinct spans Jaeger's search returns
  (Badger, memory: one search per task of the run).

**Ingest** is spans per second from the producer's first span until the *last* span sent is
searchable: polled every 0.5 s until the last rollout is whole in Jaeger's search and the store
holds every exported span (OpenSearch's ``_count``; Badger and memory: what Jaeger's storage
exporter wrote, which is searchable when written). It is printed only for a run whose counts agree
(producer exported = Collector accepted = Collector sent = spans in the store); otherwise the row
names the first hop where spans went missing. Then:

* **search all**: one Jaeger search for every rollout of the run (``gym.run.id`` +
  ``gym.kind=rollout``, limit N + 10), and whether the store is still up after it (the search that
  took a 512 MB OpenSearch node down at 10,000 rollouts);
* **search**: median and p90 of 20 searches by ``gym.rollout.id`` and of the
  ``gym.rollout.outcome=unscored`` search (limit 20), through Jaeger's query API;
* **disk**: bytes on disk per span of the timed run, less what the store held after the warm-up
  (Badger: the blocks its directory allocates, as ``du`` counts them; OpenSearch: the span and
  service indices' live segments after a flush, not the files of segments a merge replaced, which
  the node deletes seconds later), none for memory;
* ``collector/down`` then ``collector/up`` over the data just written (**warm**).

Before the timed run, ``--warm-up N`` (default 2,000; 0 for none) sends N rollouts of another
service through the same pipeline and waits until the store holds them: the timed run then meets a
store that has been running, as a scale-out store serving many runs is, not a JVM started seconds
before the burst that compiles its indexing code while it ingests (``--warm-up 0`` times that).
The node's figures are those of the timed run alone.

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
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "support"))  # the harness: pipeline.py, collector_scripts.py

from child_process import clean_env  # noqa: E402
from pipeline import COLLECTOR_DIR, free_ports  # noqa: E402

SPANS_PER_ROLLOUT = 14
STEPS = SPANS_PER_ROLLOUT - 2
TASKS = 50
SERVICE = "storage-bench"
WARM_UP_SERVICE = "storage-bench-warm-up"

PRODUCER = r"""
import json, sys, time
import gymtrace

endpoint, run_id, n, steps, tasks, service = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
gymtrace.configure(service_name=service, endpoint=endpoint, protocol="grpc", file=False)
start = time.time()
with gymtrace.run(run_id=run_id):
    for i in range(n):
        with gymtrace.rollout(rollout_id=f"r-{i}", task_id=f"t-{i % tasks}", repeat=i // tasks):
            with gymtrace.episode():
                for _ in range(steps):
                    with gymtrace.step():
                        pass
                if i % 4:
                    gymtrace.record_reward((i % 7) / 6)
produced = time.time()
# Delivered, however long it takes: the default flush timeout (5 s) bounds only the exit.
flushed = gymtrace.force_flush(timeout_millis=600_000)
[stats] = gymtrace.export_stats()
gymtrace.shutdown()
print(json.dumps({"start": start, "produced": produced, "flushed_at": time.time(), "flushed": flushed,
                  **stats.__dict__}))
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
    "GYMTRACE_COLLECTOR_METRICS_PORT",
    "GYMTRACE_JAEGER_METRICS_PORT",
)


def _get(url: str, timeout: float = 120) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.load(resp)


def _search(query: str, tags: dict[str, str], limit: int, timeout: float = 120) -> list[Any]:
    params = urllib.parse.urlencode(
        {"service": SERVICE, "tags": json.dumps(tags), "limit": limit, "lookback": "2h"}
    )
    return _get(f"{query}/api/traces?{params}", timeout)["data"] or []


def _timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _dir_bytes(path: Path) -> int:
    """Bytes allocated on disk (like ``du``): Badger's value log is a sparse, preallocated file."""
    return sum(f.stat().st_blocks * 512 for f in path.rglob("*") if f.is_file())


def _disk_bytes(store: str, copy: Path, os_url: str) -> int | None:
    """What the store holds on disk: Badger's directory as ``du`` counts it; OpenSearch's span and
    service indices' live segments after a flush (the store's own size counts, until the node lets
    them go some seconds later, the files of segments a merge has just replaced: twice the bytes
    right after a run that merged); None for memory."""
    if store == "badger":
        return _dir_bytes(copy.parent / "data" / "badger")
    if store == "opensearch":
        urllib.request.urlopen(urllib.request.Request(f"{os_url}/_flush", method="POST"), timeout=120).read()
        segments = _get(f"{os_url}/_cat/segments/gymtrace-jaeger-*?bytes=b&h=size&format=json")
        return sum(int(segment["size"]) for segment in segments)
    return None


def _script(copy: Path, name: str, *args: str, env: dict[str, str]) -> float:
    start = time.perf_counter()
    out = subprocess.run([str(copy / name), *args], env=env, capture_output=True, text=True, check=False)
    if out.returncode:
        sys.exit(f"collector/{name} {' '.join(args)} failed:\n{out.stdout}{out.stderr}")
    return time.perf_counter() - start


def _status(copy: Path, env: dict[str, str]) -> dict[str, Any]:
    """``collector/status --json``: the processes' own counts (its exit status says lost or down)."""
    out = subprocess.run(
        [str(copy / "status"), "--json"], env=env, capture_output=True, text=True, check=False
    )
    return json.loads(out.stdout)


def _opensearch_count(os_url: str, service: str = SERVICE) -> int:
    """This run's span documents (one per span), counted by OpenSearch."""
    body = json.dumps({"query": {"term": {"process.serviceName": service}}}).encode()
    request = urllib.request.Request(
        f"{os_url}/gymtrace-jaeger-span-*/_count", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        return int(json.load(resp)["count"])


def _jaeger_written(copy: Path, env: dict[str, str]) -> int:
    return int(_status(copy, env)["hops"].get("jaeger", {}).get("written", 0))


def _jaeger_spans(query: str, rollouts: int, run_id: str) -> int:
    """Distinct spans of the run that Jaeger's search returns: one search per task, and the run's
    own trace."""
    spans = {
        span["spanID"]
        for trace in _search(query, {"gym.run.id": run_id, "gym.kind": "run"}, 1)
        for span in trace["spans"]
    }
    per_task = rollouts // TASKS + 10
    for task in range(TASKS):
        for trace in _search(query, {"gym.task.id": f"t-{task}", "gym.kind": "rollout"}, per_task, 600):
            spans.update(span["spanID"] for span in trace["spans"])
    return len(spans)


def _node_stats(os_url: str) -> dict[str, Any]:
    """Where the node's time went (``_nodes/stats``): indexing, refresh, merge, flush, bulk, and
    the write thread pool's rejections; seconds since the node started."""
    node = next(iter(_get(f"{os_url}/_nodes/stats/indices,thread_pool,jvm", 60)["nodes"].values()))
    indices = node["indices"]
    write = node["thread_pool"].get("write", {})
    return {
        "indexing_s": indices["indexing"]["index_time_in_millis"] / 1000,
        "refresh_s": indices["refresh"]["total_time_in_millis"] / 1000,
        "refreshes": indices["refresh"]["total"],
        "merge_s": indices["merges"]["total_time_in_millis"] / 1000,
        "flush_s": indices["flush"]["total_time_in_millis"] / 1000,
        "bulk_s": indices.get("bulk", {}).get("total_time_in_millis", 0) / 1000,
        "bulk_requests": indices.get("bulk", {}).get("total_operations", 0),
        "write_rejected": write.get("rejected", 0),
        "gc_old_s": node["jvm"]["gc"]["collectors"]["old"]["collection_time_in_millis"] / 1000,
        "gc_young_s": node["jvm"]["gc"]["collectors"]["young"]["collection_time_in_millis"] / 1000,
        "heap_max_mb": node["jvm"]["mem"]["heap_max_in_bytes"] // 2**20,
    }


def _missing_at(counts: dict[str, int]) -> str | None:
    """The first hop where spans went missing, or None when every count agrees."""
    hops = (
        ("producer (dropped)", counts["finished"], counts["exported"]),
        ("producer -> Collector", counts["exported"], counts["collector_accepted"]),
        (
            "Collector (refused, sampled out, failed or still queued)",
            counts["collector_accepted"],
            counts["collector_sent"],
        ),
        ("Jaeger -> store", counts["collector_sent"], counts["store"]),
    )
    for hop, before, after in hops:
        if after < before:
            return f"{before - after:,} missing at {hop}"
    if counts["jaeger_accepted"] > counts["collector_sent"] + 1:  # + up's probe straight into Jaeger
        return f"{counts['jaeger_accepted'] - counts['collector_sent']:,} sent to Jaeger twice (timed out, retried)"
    if counts["store"] > counts["exported"]:
        return f"{counts['store'] - counts['exported']:,} more in the store than exported (duplicates)"
    return None


def _stored(
    copy: Path, env: dict[str, str], store: str, os_url: str, service: str, written_before: int
) -> int:
    """Spans of ``service`` the store holds: OpenSearch's ``_count``; for Badger and memory, what
    Jaeger's storage exporter wrote since ``written_before`` (searchable once written)."""
    if store == "opensearch":
        return _opensearch_count(os_url, service)
    return _jaeger_written(copy, env) - written_before


def _produce(endpoint: str, run_id: str, rollouts: int, service: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", PRODUCER, endpoint, run_id, str(rollouts), str(STEPS), str(TASKS), service],
        env=clean_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(out.stdout.splitlines()[-1]))


def _warm_up(copy: Path, env: dict[str, str], store: str, endpoint: str, os_url: str, rollouts: int) -> float:
    """Send ``rollouts`` rollouts of another service through the pipeline and wait until the store
    holds them all: the node's JVM has then compiled its hot paths and the day's index exists, as
    in a store that has been running. The timed run's counts leave this service out."""
    start = time.time()
    written_before = _jaeger_written(copy, env)
    exported = _produce(endpoint, "warm-up", rollouts, WARM_UP_SERVICE)["exported"]
    deadline = time.time() + 600
    while time.time() < deadline:
        try:
            stored = _stored(copy, env, store, os_url, WARM_UP_SERVICE, written_before)
        except OSError:
            stored = 0
        if stored >= exported:
            return time.time() - start
        time.sleep(0.5)
    sys.exit(f"warm-up: the store did not hold {exported:,} spans within 600 s")


def bench(
    store: str,
    rollouts: int,
    work: Path,
    *,
    counts_only: bool = False,
    extra: dict[str, str] | None = None,
    warm_up: int = 0,
) -> dict[str, Any]:
    copy = work / f"{store}-{rollouts}" / "collector"
    shutil.copytree(COLLECTOR_DIR, copy, ignore=shutil.ignore_patterns("bin", ".run", ".data"))
    (copy / "bin").symlink_to(COLLECTOR_DIR / "bin")
    ports = free_ports(len(PORT_VARIABLES) + 1)
    env = clean_env(
        **dict(zip(PORT_VARIABLES, map(str, ports), strict=False)),
        GYMTRACE_OPENSEARCH_PORT=str(ports[-1]),
        GYMTRACE_JAEGER_DATA_DIR=str(copy.parent / "data"),
        GYMTRACE_SAMPLE_PERCENT="100",
        GYMTRACE_DECISION_WAIT_AFTER_ROOT="1s",
        GYMTRACE_UP_TIMEOUT="120",
        GYMTRACE_JAEGER_MAX_TRACES=str(rollouts + 100),
        **(extra or {}),
    )
    query = f"http://127.0.0.1:{env['GYMTRACE_JAEGER_QUERY_PORT']}"
    os_url = f"http://127.0.0.1:{env['GYMTRACE_OPENSEARCH_PORT']}"
    spans = rollouts * SPANS_PER_ROLLOUT
    result: dict[str, Any] = {"store": store, "rollouts": rollouts, "spans": spans}
    endpoint = f"http://127.0.0.1:{env['GYMTRACE_OTLP_GRPC_PORT']}"
    try:
        result["up_cold_s"] = _script(copy, "up", "--storage", store, env=env)
        disk_before = 0
        if warm_up:
            result["warm_up_s"] = _warm_up(copy, env, store, endpoint, os_url, warm_up)
            if not counts_only:  # what the warm-up stored is not the timed run's
                disk_before = _disk_bytes(store, copy, os_url) or 0
        node_before = _node_stats(os_url) if store == "opensearch" else None
        status_before = _status(copy, env)
        before = status_before["spans"]
        jaeger_before = int(status_before["hops"].get("jaeger", {}).get("accepted", 0))
        written_before = _jaeger_written(copy, env)
        run_id = f"bench-{store}-{rollouts}"
        producer = _produce(endpoint, run_id, rollouts, SERVICE)
        start = producer["start"]
        result["produce_s"] = producer["produced"] - start
        result["producer"] = {
            k: producer[k] for k in ("finished", "exported", "dropped_queue_full", "dropped_export_failed")
        }
        exported = producer["exported"]
        # Ingest: until the last rollout is whole in Jaeger's search and the store holds every
        # exported span, polled every 0.5 s (at most 10 minutes).
        last = {"gym.rollout.id": f"r-{rollouts - 1}"}
        deadline = time.time() + 600
        ingest_at = None
        peak_queue = 0
        while time.time() < deadline:
            polled = time.time()
            try:
                # The Collector's sending queue: spans decided and waiting for Jaeger to take them.
                peak_queue = max(peak_queue, int(_status(copy, env)["spans"]["queued"]))
                whole = sum(len(t["spans"]) for t in _search(query, last, 1, 30)) >= SPANS_PER_ROLLOUT
                stored = _stored(copy, env, store, os_url, SERVICE, written_before)
            except OSError:
                whole, stored = False, 0
            if whole and stored >= exported:
                ingest_at = polled
                break
            time.sleep(max(0.0, 0.5 - (time.time() - polled)))
        result["collector_peak_queue"] = peak_queue
        if node_before is not None:
            node = _node_stats(os_url)
            result["node"] = {k: v if k == "heap_max_mb" else v - node_before[k] for k, v in node.items()}
        status_after = _status(copy, env)
        after = status_after["spans"]
        result["collector"] = {
            k: after[k] - before[k] for k in ("accepted", "refused", "sent", "queued", "lost")
        }
        # What Jaeger took in: more than the Collector sent when a request timed out at the
        # Collector after Jaeger had taken it, and was sent again (a duplicate in the store).
        result["jaeger_accepted"] = (
            int(status_after["hops"].get("jaeger", {}).get("accepted", 0)) - jaeger_before
        )
        result["store_spans"] = (
            _opensearch_count(os_url) if store == "opensearch" else _jaeger_spans(query, rollouts, run_id)
        )
        counts = {
            "finished": producer["finished"],
            "exported": exported,
            "collector_accepted": result["collector"]["accepted"],
            "collector_sent": result["collector"]["sent"],
            "jaeger_accepted": result["jaeger_accepted"],
            "store": result["store_spans"],
        }
        result["missing"] = _missing_at(counts)
        if ingest_at is not None and result["missing"] is None:
            result["ingest_s"] = ingest_at - start
            result["ingest_spans_per_s"] = exported / result["ingest_s"]
        # One search for every rollout of the run; then: is the store still up?
        everything = {"gym.run.id": run_id, "gym.kind": "rollout"}
        t0 = time.perf_counter()
        try:
            found = len(_search(query, everything, rollouts + 10, 600))
            result["search_all"] = f"{found:,} of {rollouts:,} in {time.perf_counter() - t0:.1f} s"
        except urllib.error.HTTPError as exc:
            body = exc.read().decode("utf-8", "replace")
            try:
                reason = "; ".join(e["msg"] for e in json.loads(body)["errors"])
            except (ValueError, KeyError, TypeError):
                reason = body.replace("\n", " ").strip()[:160]
            result["search_all"] = f"refused in {time.perf_counter() - t0:.1f} s: HTTP {exc.code} {reason}"
        except OSError as exc:
            result["search_all"] = f"failed in {time.perf_counter() - t0:.1f} s: {exc}"
        if store == "opensearch":
            try:
                health = _get(f"{os_url}/_cluster/health", 30)["status"]
                result["store_up"] = f"yes ({health})"
            except OSError as exc:
                result["store_up"] = f"NO: {exc}"
        else:
            result["store_up"] = (
                "yes"
                if subprocess.run(["curl", "-fs", "-o", "/dev/null", f"{query}/api/services"]).returncode == 0
                else "NO"
            )
        if counts_only:
            return result
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
        disk = _disk_bytes(store, copy, os_url)
        if disk is not None:
            result["disk_bytes"] = disk - disk_before
            result["disk_bytes_per_span"] = result["disk_bytes"] / spans
        _script(copy, "down", env=env)
        result["up_warm_s"] = _script(copy, "up", "--storage", store, env=env)
    finally:
        subprocess.run([str(copy / "down")], env=env, capture_output=True, check=False)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, nargs="+", default=[2000])
    parser.add_argument("--stores", nargs="+", default=["memory", "badger", "opensearch"])
    parser.add_argument("--json", action="store_true", help="one JSON object per store and size")
    parser.add_argument(
        "--counts-only",
        action="store_true",
        help="the hops, ingest and the search for everything only (no latencies, disk, warm start)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="VAR=VALUE",
        help="a GYMTRACE_* setting for collector/up (tuning runs), e.g. GYMTRACE_OPENSEARCH_REFRESH=5s",
    )
    parser.add_argument(
        "--warm-up",
        type=int,
        default=2000,
        metavar="ROLLOUTS",
        help="before each timed run, send this many rollouts of another service and wait until"
        " they are stored (a store that has been running, not a cold JVM; default 2,000); 0: time a node"
        " started just before the run",
    )
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="gymtrace-storage-bench-") as work:
        for rollouts in args.rollouts:
            for store in args.stores:
                extra = dict(item.split("=", 1) for item in args.set)
                result = bench(
                    store,
                    rollouts,
                    Path(work),
                    counts_only=args.counts_only,
                    extra=extra,
                    warm_up=args.warm_up,
                )
                results.append(result)
                print(json.dumps(result) if args.json else result, flush=True)
    print()
    print(
        "| store | spans | producer finished / exported / dropped | Collector accepted / sent / lost"
        " | Jaeger took | in the store | ingest spans/s | search all rollouts | store up after |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        p, c = r["producer"], r["collector"]
        dropped = p["dropped_queue_full"] + p["dropped_export_failed"]
        ingest = (
            f"{r['ingest_spans_per_s']:,.0f}"
            if "ingest_spans_per_s" in r
            else f"— ({r['missing'] or 'not all searchable in 600 s'})"
        )
        print(
            f"| {r['store']} | {r['spans']:,} | {p['finished']:,} / {p['exported']:,} / {dropped:,}"
            f" | {c['accepted']:,} / {c['sent']:,} / {c['lost']:,} | {r['jaeger_accepted']:,}"
            f" | {r['store_spans']:,} | {ingest}"
            f" | {r['search_all']} | {r['store_up']} |"
        )
    ingest = {(r["store"], r["rollouts"]): r.get("ingest_spans_per_s") for r in results}
    for rollouts in args.rollouts:
        os_rate, badger_rate = ingest.get(("opensearch", rollouts)), ingest.get(("badger", rollouts))
        if os_rate and badger_rate:
            print(f"OpenSearch ingest / Badger's at {rollouts:,} rollouts: {os_rate / badger_rate:.2f}x")
    nodes = [r for r in results if "node" in r]
    if nodes:
        print()
        print(
            "OpenSearch node (_nodes/stats, over the timed run: from its first span until the run is searchable): seconds of indexing / bulk / refresh (count) / merge / flush / GC young+old, write rejections, heap"
        )
        for r in nodes:
            n = r["node"]
            print(
                f"  {r['spans']:,} spans: indexing {n['indexing_s']:.1f} s, bulk {n['bulk_s']:.1f} s"
                f" ({n['bulk_requests']:,} requests), refresh {n['refresh_s']:.1f} s ({n['refreshes']:,}),"
                f" merge {n['merge_s']:.1f} s, flush {n['flush_s']:.1f} s, GC {n['gc_young_s']:.1f}+{n['gc_old_s']:.1f} s,"
                f" write rejected {n['write_rejected']:,}, heap {n['heap_max_mb']:,} MB"
            )
    if args.counts_only:
        return
    print()
    print(
        "| store | spans | search by id ms (median/p90) | unscored search ms (median/p90) | disk bytes/span | up cold s | up warm s |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in results:
        disk = f"{r['disk_bytes_per_span']:.0f}" if "disk_bytes_per_span" in r else "—"
        print(
            f"| {r['store']} | {r['spans']:,} "
            f"| {r['search_by_id_ms'][0]:.0f} / {r['search_by_id_ms'][1]:.0f} "
            f"| {r['search_unscored_ms'][0]:.0f} / {r['search_unscored_ms'][1]:.0f} "
            f"| {disk} | {r['up_cold_s']:.1f} | {r['up_warm_s']:.1f} |"
        )


if __name__ == "__main__":
    main()
