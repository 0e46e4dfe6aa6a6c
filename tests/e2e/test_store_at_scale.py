"""The scale-out store under pressure (issue 47), through the real scripts on a local OpenSearch node:

- a store that refuses writes (a write block on the span index) loses spans that
  ``collector/status`` counts, exactly as many as are missing from the store;
- a search larger than the store allows is refused with an error that Jaeger's API and
  ``gymtrace rollouts --jaeger`` pass on, and the node stays up;
- the store (Jaeger and its OpenSearch node) stopped mid-run, the Collector restarted while it is
  down, and everything started again: every span the producer exported is stored, once, from the
  Collector's sending queue on disk.

One OpenSearch node for the module (a JVM start costs tens of seconds on 2 cores); the tests run
in this order and each leaves the pipeline up for the next.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from child_process import run_gymtrace, run_python
from collector_scripts import alive, collector_copy, free_port_pair, pids, ports_env, script, until

pytestmark = pytest.mark.e2e

STEPS = 12  # a rollout: its root, one episode, 12 steps
SPANS = STEPS + 2
# Searches of more traces than this are refused (collector/opensearch: search.max_buckets).
SEARCH_CAP = 50

PRODUCER = """
import json, os, sys, time
import gymtrace

endpoint, service, run_id, first, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
gymtrace.configure(service_name=service, endpoint=endpoint, protocol="grpc", file=False)
with gymtrace.run(run_id=run_id):  # one span of its own
    for r in range(first, first + count):
        with gymtrace.rollout(rollout_id=f"r-{r}", task_id="t", repeat=r), gymtrace.episode():
            for _ in range(int(os.environ["STEPS"])):
                with gymtrace.step():
                    pass
            gymtrace.record_reward(1.0)
# Delivered however long it takes (a Collector restarting meanwhile): not the 5 s exit bound.
flushed = gymtrace.force_flush(timeout_millis=180_000)
[stats] = gymtrace.export_stats()
gymtrace.shutdown()
print(json.dumps({"flushed": flushed, **stats.__dict__}))
"""


class Stack:
    """``collector/up --storage opensearch`` from a copy of ``collector/``, on free ports."""

    def __init__(self, copy: Path, env: dict[str, str]) -> None:
        self.copy, self.env = copy, env
        self.query = f"http://127.0.0.1:{env['GYMTRACE_JAEGER_QUERY_PORT']}"
        self.opensearch = f"http://127.0.0.1:{env['GYMTRACE_OPENSEARCH_PORT']}"
        self.endpoint = f"http://127.0.0.1:{env['GYMTRACE_OTLP_GRPC_PORT']}"

    def up(self) -> str:
        out = script(self.copy, "up", "--storage", "opensearch", env=self.env)
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout

    def status(self) -> tuple[int, dict[str, Any], str]:
        """``collector/status --json`` and the table it prints: exit status, object, text."""
        as_json = script(self.copy, "status", "--json", env=self.env)
        text = script(self.copy, "status", env=self.env)
        return as_json.returncode, json.loads(as_json.stdout), text.stdout

    def produce(self, service: str, run_id: str, first: int, count: int) -> dict[str, Any]:
        out = run_python(
            self.endpoint,
            service,
            run_id,
            str(first),
            str(count),
            code=PRODUCER,
            env={"STEPS": str(STEPS)},
            timeout=300,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        stats = json.loads(out.stdout.splitlines()[-1])
        assert stats["flushed"] and stats["exported"] == stats["finished"] == count * SPANS + 1, stats
        return stats

    def stop(self, name: str) -> None:
        """SIGTERM one process collector/up started (as collector/down does) and wait for its end."""
        pid = pids(self.copy)[name]
        os.kill(pid, signal.SIGTERM)
        until(lambda: not alive(pid), 90, f"{name} to stop")

    def _post(self, path: str, body: dict[str, Any], method: str = "POST") -> Any:
        request = urllib.request.Request(
            f"{self.opensearch}{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method=method,
        )
        with urllib.request.urlopen(request, timeout=30) as resp:
            return json.load(resp)

    def stored(self, service: str) -> int:
        """Span documents of ``service`` in the span indices (refreshed first: what is there)."""
        self._post("/gymtrace-jaeger-span-*/_refresh", {})
        query = {"query": {"term": {"process.serviceName": service}}}
        return int(self._post("/gymtrace-jaeger-span-*/_count", query)["count"])

    def span_ids(self, service: str) -> list[str]:
        """Every stored span ID of ``service`` (duplicates kept), straight from OpenSearch."""
        self._post("/gymtrace-jaeger-span-*/_refresh", {})
        query = {"size": 10_000, "_source": ["spanID"], "query": {"term": {"process.serviceName": service}}}
        hits = self._post("/gymtrace-jaeger-span-*/_search", query)["hits"]["hits"]
        return [hit["_source"]["spanID"] for hit in hits]

    def block_writes(self, blocked: bool) -> None:
        self._post("/gymtrace-jaeger-span-*/_settings", {"index.blocks.write": blocked}, method="PUT")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp_path = tmp_path_factory.mktemp("store")
    env = ports_env(
        GYMTRACE_OPENSEARCH_PORT=str(free_port_pair(100)),
        GYMTRACE_JAEGER_DATA_DIR=str(tmp_path / "data"),
        GYMTRACE_SAMPLE_PERCENT="100",
        GYMTRACE_DECISION_WAIT_AFTER_ROOT="1s",
        GYMTRACE_UP_TIMEOUT="90",
        GYMTRACE_OPENSEARCH_MAX_TRACES_PER_SEARCH=str(SEARCH_CAP),
    )
    copy = collector_copy(tmp_path)
    s = Stack(copy, env)
    try:
        s.up()
        yield s
    finally:
        script(copy, "down", env=env)


def test_a_store_that_refuses_writes_is_counted_as_lost_in_collector_status(stack: Stack) -> None:
    service = f"refused-{uuid.uuid4().hex[:6]}"
    # Spans of the day first, so the day's span index exists for the block.
    stack.produce(service, "before-block", 0, 2)
    until(lambda: stack.stored(service) == 2 * SPANS + 1, 90, "the first spans in the store")
    _, before, _ = stack.status()
    stack.block_writes(True)
    try:
        stats = stack.produce(service, "blocked", 2, 20)

        def counted() -> int | None:
            lost = int(stack.status()[1]["spans"]["lost"]) - int(before["spans"]["lost"])
            return lost if lost >= stats["exported"] else None

        lost = until(counted, 120, "collector/status to count the refused spans")
        time.sleep(3)  # and no more than that: a second look after Jaeger's next bulk flushes
        lost = int(stack.status()[1]["spans"]["lost"]) - int(before["spans"]["lost"])
    finally:
        stack.block_writes(False)
    missing = stats["exported"] - (stack.stored(service) - (2 * SPANS + 1))
    code, after, text = stack.status()
    # Every span the store refused is counted, and only those: the count is the missing spans.
    assert missing == stats["exported"] == 20 * SPANS + 1
    assert lost == missing, (lost, missing, after)
    assert (
        after["spans"]["lost_by_hop"]["store_refused"] - before["spans"]["lost_by_hop"]["store_refused"]
        == missing
    )
    assert code == 1 and "spans lost: store refused" in text, text
    print(text)


def test_a_search_larger_than_the_store_allows_is_refused_and_the_node_stays_up(stack: Stack) -> None:
    service = f"search-{uuid.uuid4().hex[:6]}"
    run_id = f"run-{uuid.uuid4().hex[:6]}"
    stack.produce(service, run_id, 0, SEARCH_CAP + 10)
    until(lambda: stack.stored(service) == (SEARCH_CAP + 10) * SPANS + 1, 90, "the rollouts in the store")
    # Within the cap: found. Above it: an error, not a node out of memory.
    params = {"service": service, "tags": json.dumps({"gym.kind": "rollout"}), "lookback": "1h"}
    small = urllib.parse.urlencode({**params, "limit": SEARCH_CAP // 2})
    with urllib.request.urlopen(f"{stack.query}/api/traces?{small}", timeout=60) as resp:
        assert len(json.load(resp)["data"]) == SEARCH_CAP // 2
    large = urllib.parse.urlencode({**params, "limit": SEARCH_CAP + 10})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{stack.query}/api/traces?{large}", timeout=60)
    # Jaeger passes on only the status of the refusal (OpenSearch's 503); the node's log names it.
    answer = refused.value.read().decode("utf-8", "replace")
    assert "elastic: Error 503" in answer, answer
    log = (stack.copy.parent.parent / "data" / "opensearch" / "logs" / "gymtrace.log").read_text()
    assert "TooManyBucketsException" in log
    health = json.load(urllib.request.urlopen(f"{stack.opensearch}/_cluster/health", timeout=30))
    assert health["status"] in ("green", "yellow"), health

    # gymtrace's reader pages through the search, 200 traces a request, so the store never refuses
    # it: it reads every rollout, or exits non-zero naming a refusal.
    # Named, the service is searched at once; unnamed, once Jaeger lists it, which on OpenSearch
    # is a refresh after the spans are searchable (a read between the two finds no rollout, and
    # says so with the services it asked: tests/test_jaeger_reader.py).
    def listed() -> bool:
        with urllib.request.urlopen(f"{stack.query}/api/services", timeout=60) as resp:
            return service in (json.load(resp)["data"] or [])

    until(listed, 90, "Jaeger to list the service")
    for where in (["--service", service], []):
        read = run_gymtrace("rollouts", "--jaeger", stack.query, "--run", run_id, "--json", *where)
        if read.returncode != 0:
            assert read.returncode == 2 and "search.max_buckets" in read.stderr, read.stderr[-2000:]
        else:
            assert len(read.stdout.splitlines()) == SEARCH_CAP + 10


def test_the_store_stopped_mid_run_loses_nothing_across_a_collector_restart(stack: Stack) -> None:
    service = f"restart-{uuid.uuid4().hex[:6]}"
    stack.produce(service, "restart", 0, 5)
    until(lambda: stack.stored(service) == 5 * SPANS + 1, 90, "the first rollouts in the store")
    # The store goes down mid-run: Jaeger (it flushes its bulk writes to the node first), then
    # the node.
    stack.stop("jaeger")
    stack.stop("opensearch")
    stats = stack.produce(service, "restart", 5, 100)
    # Accepted, decided and waiting in the Collector's sending queue; then the Collector restarts.
    until(lambda: stack.status()[1]["spans"]["queued"] >= stats["exported"], 120, "the spans in the queue")
    stack.stop("collector")
    stack.up()  # the node, Jaeger and the Collector again: its queue, on disk, is delivered
    expected = (5 + 100) * SPANS + 2  # and the run span of each of the two producers
    until(lambda: stack.stored(service) >= expected, 180, "every span in the store")
    ids = stack.span_ids(service)
    assert len(set(ids)) == expected, (len(set(ids)), expected)
    code, status, text = stack.status()
    assert code == 0 and status["spans"]["lost"] == 0, text
    print(f"stored {len(ids)} span documents, {len(set(ids))} distinct, of {expected}")
