"""The multi-machine path: two OpenSearch nodes (collector/opensearch) form one cluster, Jaeger
writes every span index with one replica, one node stops, and the traces are still searchable
through Jaeger, from the copies on the node that is left."""

from __future__ import annotations

import json
import signal
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from child_process import clean_env, run_python
from collector_scripts import free_port_pair, until
from gymtrace import _constants as c
from pipeline import COLLECTOR_DIR, Pipeline, PipelineError

pytestmark = pytest.mark.e2e

LAUNCHER = COLLECTOR_DIR / "opensearch"

_HARNESS = """
import gymtrace
gymtrace.configure(service_name={service!r}, endpoint={endpoint!r}, protocol="grpc", file=False)
with gymtrace.run(run_id={run_id!r}):
    for i in range(6):
        with gymtrace.rollout(rollout_id=f"r-{{i}}", task_id="t", repeat=i), gymtrace.episode():
            gymtrace.record_reward(i / 5)
gymtrace.shutdown()
"""


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.load(resp)


def _whole(traces: list[Any]) -> bool:
    """All six rollouts with both their spans (rollout and episode): a trace is found as soon as
    one of its spans is searchable, and its two spans may sit in different shards."""
    return len(traces) == 6 and all(len(t["spans"]) == 2 for t in traces)


def _search_or_none(p: Pipeline, service: str, tags: dict[str, str]) -> list[Any] | None:
    try:
        traces = p.find_traces(service, tags)
    except PipelineError:
        return None
    return traces if _whole(traces) else None


@pytest.fixture
def two_nodes(tmp_path: Path) -> Iterator[tuple[list[str], list[subprocess.Popen[bytes]]]]:
    """Two nodes of one cluster on loopback: distinct HTTP and transport ports, each the other's seed."""
    http = [free_port_pair(100) for _ in range(2)]
    while http[1] in (http[0], http[0] + 100) or http[1] + 100 == http[0]:
        http[1] = free_port_pair(100)
    seeds = ",".join(f"127.0.0.1:{p + 100}" for p in http)
    cluster = f"gymtrace-failover-{uuid.uuid4().hex[:6]}"
    nodes = []
    try:
        for i, port in enumerate(http, 1):
            log = (tmp_path / f"node-{i}.log").open("wb")
            argv = [str(LAUNCHER), "--http-port", str(port), "--data", str(tmp_path / f"node-{i}")]
            argv += ["--name", f"n{i}", "--cluster", cluster, "--seed", seeds, "--initial-nodes", "n1,n2"]
            nodes.append(subprocess.Popen(argv, env=clean_env(), stdout=log, stderr=subprocess.STDOUT))
        urls = [f"http://127.0.0.1:{p}" for p in http]
        until(
            lambda: _get(f"{urls[0]}/_cluster/health?wait_for_nodes=2&timeout=1s")["number_of_nodes"] == 2,
            240,
            "two OpenSearch nodes in one cluster",
        )
        yield urls, nodes
    finally:
        for node in nodes:
            node.send_signal(signal.SIGTERM)
        for node in nodes:
            try:
                node.wait(60)
            except subprocess.TimeoutExpired:
                node.kill()
                node.wait(10)


def test_traces_stay_searchable_when_one_of_two_nodes_stops(
    two_nodes: tuple[list[str], list[subprocess.Popen[bytes]]], tmp_path: Path
) -> None:
    urls, nodes = two_nodes
    env = {"GYMTRACE_OPENSEARCH_URL": ",".join(urls), "GYMTRACE_OPENSEARCH_REPLICAS": "1"}
    # Two primaries, so each node is likely to hold one and its replica on the other.
    env["GYMTRACE_OPENSEARCH_SHARDS"] = "2"
    run_id, service = f"failover-{uuid.uuid4().hex[:8]}", f"failover-{uuid.uuid4().hex[:6]}"
    with Pipeline(
        storage="opensearch", extra_env=env, workdir=tmp_path / "pipeline", startup_timeout=120
    ) as p:
        out = run_python(code=_HARNESS.format(service=service, endpoint=p.otlp_grpc_endpoint, run_id=run_id))
        assert out.returncode == 0, out.stderr
        tags = {c.RUN_ID: run_id, c.KIND: c.KIND_ROLLOUT}
        before = p.wait_for_traces(service, tags, predicate=_whole, timeout=90)
        # Every span shard is on both nodes, and the cluster is green (each replica assigned).
        health = _get(f"{urls[0]}/_cluster/health/gymtrace-jaeger-span-*?wait_for_status=green&timeout=60s")
        assert health["status"] == "green", health
        shards = _get(f"{urls[0]}/_cat/shards/gymtrace-jaeger-span-*?format=json")
        assert {s["node"] for s in shards} == {"n1", "n2"} and len(shards) == 4

        # Stop the node that is not the cluster manager (two nodes cannot re-elect one after
        # losing the manager; a third node would let either go).
        manager = _get(f"{urls[0]}/_cat/cluster_manager?format=json")[0]["node"]
        gone = 1 if manager == "n1" else 0
        nodes[gone].send_signal(signal.SIGTERM)
        nodes[gone].wait(60)
        left = urls[1 - gone]
        until(
            lambda: _get(f"{left}/_cluster/health?timeout=1s")["number_of_nodes"] == 1,
            60,
            "the cluster to notice the stopped node",
        )

        # Jaeger's client marks a node dead on the first refused connection and sends the next
        # request to a live one: a search may fail once, never for long.
        after = until(lambda: _search_or_none(p, service, tags), 90, "the traces from the node left")
        assert sorted(t["traceID"] for t in after) == sorted(t["traceID"] for t in before)
        assert sum(len(t["spans"]) for t in after) == sum(len(t["spans"]) for t in before) == 12
        # The left node serves every span shard (promoted replicas included) on its own.
        shards = _get(f"{left}/_cat/shards/gymtrace-jaeger-span-*?format=json")
        primaries = [s for s in shards if s["prirep"] == "p"]
        assert len(primaries) == 2 and all(s["state"] == "STARTED" for s in primaries), shards
