"""Jaeger's persistent stores through ``collector/up --storage``: a run's rollouts, rewards and
outcomes read back the same after ``collector/down`` + ``collector/up`` (and, on Badger, after a
killed Jaeger), and the searches the docs show find the right traces, on Badger and on a real
OpenSearch node that ``collector/up`` starts.

Each store is one test (an OpenSearch JVM start costs tens of seconds on 2 cores): write, read,
restart, read again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from child_process import run_gymtrace, run_python
from collector_scripts import alive, collector_copy, free_port_pair, pids, ports_env, script
from gymtrace import _constants as c

pytestmark = pytest.mark.e2e

# Four finished rollouts of every outcome, and one whose process dies while it runs: its live
# markers (heartbeats every 0.5 s) are all Jaeger has of it, and `gymtrace live` reads it lost.
_HARNESS = """
import os, sys
import gymtrace

class EnvironmentLost(ConnectionError):
    pass

gymtrace.configure(service_name={service!r}, endpoint={endpoint!r}, protocol="grpc", file=False)
with gymtrace.run(run_id={run_id!r}):
    with gymtrace.rollout(rollout_id="r-pass", task_id="t1", repeat=0), gymtrace.episode():
        gymtrace.record_reward(1.0)
    with gymtrace.rollout(rollout_id="r-zero", task_id="t1", repeat=1), gymtrace.episode():
        gymtrace.record_reward(0.0)
    with gymtrace.rollout(rollout_id="r-unscored", task_id="t2", repeat=0), gymtrace.episode():
        pass  # never scored
    with gymtrace.rollout(rollout_id="r-error", task_id="t2", repeat=1):
        for attempt in gymtrace.attempts(1, retry_on=EnvironmentLost, reraise=False):
            with attempt:
                raise EnvironmentLost("environment server went away")
    gymtrace.force_flush()
    with gymtrace.rollout(rollout_id="r-lost", task_id="t3", repeat=0), gymtrace.episode():
        import time
        time.sleep(2.5)  # markers and heartbeats go out
        os._exit(0)  # the process dies with the rollout open
"""

_ROLLOUTS = {
    "r-pass": ("scored", 1.0),
    "r-zero": ("scored", 0.0),
    "r-unscored": ("unscored", None),
    "r-error": ("unscored", None),
    # Its process died with it open: the readers say lost (from its live markers), never scored.
    "r-lost": ("lost", None),
}


def _until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            assert value, f"timed out after {timeout}s waiting for {what}"
            return value
        time.sleep(1)


def _search(query: str, service: str, tags: dict[str, str]) -> set[str]:
    """The rollout IDs of the traces a tag search returns (the docs' API search)."""
    params = urllib.parse.urlencode(
        {"service": service, "tags": json.dumps(tags), "limit": 100, "lookback": "1h"}
    )
    with urllib.request.urlopen(f"{query}/api/traces?{params}", timeout=30) as resp:
        traces = json.load(resp)["data"] or []
    found = set()
    for trace in traces:
        for span in trace["spans"]:
            tag = {t["key"]: t["value"] for t in span["tags"]}
            if tag.get(c.KIND) == c.KIND_ROLLOUT:
                found.add(tag[c.ROLLOUT_ID])
    return found


def _read_back(query: str, run_id: str, service: str) -> dict[str, Any]:
    """What the readers and the docs' searches say about the run, in a comparable form."""
    rollouts = run_gymtrace("rollouts", "--jaeger", query, "--run", run_id, "--json", check=True)
    rows = {r["rollout_id"]: r for r in map(json.loads, rollouts.stdout.splitlines())}
    stats = run_gymtrace("stats", "--jaeger", query, "--run", run_id, "--json", check=True)
    live = run_gymtrace(
        "live", "--jaeger", query, "--run", run_id, "--stalled-after", "1", "--json", check=True
    )
    return {
        "rollouts": {k: (r["outcome"], r["reward"], r["attempts"]) for k, r in rows.items()},
        "stats": json.loads(stats.stdout),
        "live": {r["rollout_id"]: r["state"] for r in map(json.loads, live.stdout.splitlines()) if r},
        "by_id": _search(query, service, {c.ROLLOUT_ID: "r-zero"}),
        "unscored": _search(query, service, {c.ROLLOUT_OUTCOME: "unscored"}),
        "error": _search(query, service, {"error": "true"}),
    }


def _expect(read: dict[str, Any]) -> None:
    assert {k: v[:2] for k, v in read["rollouts"].items()} == _ROLLOUTS
    assert read["stats"]["scored"] == 2 and read["stats"]["unscored"] == 2
    assert read["stats"]["mean_reward"] == 0.5
    assert read["live"] == {"r-lost": c.LIVE_LOST}
    assert read["by_id"] == {"r-zero"}
    assert read["unscored"] == {"r-unscored", "r-error"}
    # The failed attempt's episode is the span with the error status, inside r-error's trace.
    assert read["error"] == {"r-error"}


def _write_run(env: dict[str, str]) -> tuple[str, str, str]:
    run_id = f"e2e-store-{uuid.uuid4().hex[:8]}"
    service = f"store-{uuid.uuid4().hex[:6]}"
    endpoint = f"http://127.0.0.1:{env['GYMTRACE_OTLP_GRPC_PORT']}"
    out = run_python(
        code=_HARNESS.format(service=service, endpoint=endpoint, run_id=run_id),
        env={"GYMTRACE_HEARTBEAT": "0.5", "OTEL_BSP_SCHEDULE_DELAY": "100"},
    )
    assert out.returncode == 0, out.stderr
    return run_id, service, f"http://127.0.0.1:{env['GYMTRACE_JAEGER_QUERY_PORT']}"


def _store_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return ports_env(
        GYMTRACE_JAEGER_DATA_DIR=str(tmp_path / "data"),
        # Every rollout kept, decided a second after its root arrives: the test reads all five.
        GYMTRACE_SAMPLE_PERCENT="100",
        GYMTRACE_DECISION_WAIT_AFTER_ROOT="1s",
        GYMTRACE_UP_TIMEOUT="60",
        **extra,
    )


def _up(copy: Path, storage: str, env: dict[str, str]) -> str:
    up = script(copy, "up", "--storage", storage, env=env)
    assert up.returncode == 0, up.stdout + up.stderr
    return up.stdout


def _down_leaves_nothing(copy: Path, env: dict[str, str]) -> None:
    running = pids(copy)
    down = script(copy, "down", env=env)
    assert down.returncode == 0, down.stdout + down.stderr
    assert not any(alive(pid) for pid in running.values()), down.stdout
    assert not pids(copy)


def _run_restart_read(
    tmp_path: Path, storage: str, env: dict[str, str], kept: str, also: Callable[[], None] | None = None
) -> Path:
    """The run written, read back, read again after ``down`` and ``up`` (``also``: a check of the
    store while the run is in it)."""
    copy = collector_copy(tmp_path)
    try:
        assert kept in _up(copy, storage, env)
        run_id, service, query = _write_run(env)
        seen: list[dict[str, Any]] = []

        def complete() -> dict[str, Any] | None:
            try:
                seen.append(_read_back(query, run_id, service))
            except subprocess.CalledProcessError:
                return None  # nothing searchable yet ("no rollouts found"): OpenSearch refreshes every 2 s
            # r-lost reads lost three heartbeat intervals after its process died: wait for that.
            done = len(seen[-1]["rollouts"]) == len(_ROLLOUTS) and seen[-1]["live"] == {"r-lost": c.LIVE_LOST}
            return seen[-1] if done else None

        before = _until(complete, timeout=90, what=f"the run's rollouts in Jaeger on {storage}")
        _expect(before)
        if also is not None:
            also()
        _down_leaves_nothing(copy, env)
        _up(copy, storage, env)
        assert _read_back(query, run_id, service) == before
        if storage == "badger":
            # A killed Jaeger (no shutdown, no flush) loses nothing already stored either.
            os.kill(pids(copy)["jaeger"], signal.SIGKILL)
            _until(lambda: not alive(pids(copy)["jaeger"]), 10, "Jaeger to die")
            _up(copy, storage, env)
            assert _read_back(query, run_id, service) == before
    finally:
        script(copy, "down", env=env)
    return copy


def test_badger_keeps_rollouts_across_down_up_and_a_killed_jaeger(tmp_path: Path) -> None:
    env = _store_env(tmp_path)
    _run_restart_read(
        tmp_path, "badger", env, kept=f"badger store: kept 168h in {tmp_path / 'data' / 'badger'}"
    )
    assert any((tmp_path / "data" / "badger").rglob("*.vlog"))  # on disk, where it said


def test_opensearch_keeps_rollouts_across_down_up(tmp_path: Path) -> None:
    port = free_port_pair(100)
    env = _store_env(tmp_path, GYMTRACE_OPENSEARCH_PORT=str(port))

    def tuned_as_documented() -> None:
        # collector/up's template: a span's references are fields of its document, not nested
        # documents (one Lucene document a span, not two); the rollouts above were found by their
        # tags all the same, and their traces whole.
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}/gymtrace-jaeger-span-*/_mapping", timeout=30
        ) as r:
            for index in json.load(r).values():
                references = index["mappings"]["properties"]["references"]
                assert references.get("type", "object") == "object", references
        # And its settings, on every span index: the refresh and the translog that
        # collector/README.md's tuning table measured (the local node: fsync every 5 s).
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}/gymtrace-jaeger-span-*/_settings", timeout=30
        ) as r:
            found = json.load(r)
        assert found
        for name, index in found.items():
            settings = index["settings"]["index"]
            assert settings.get("refresh_interval") == "2s", (name, settings)
            assert settings.get("translog", {}).get("durability") == "async", (name, settings)

    copy = _run_restart_read(
        tmp_path,
        "opensearch",
        env,
        kept=f"opensearch store: kept 168h in http://127.0.0.1:{port}",
        also=tuned_as_documented,
    )
    assert "opensearch" not in pids(copy)  # collector/down stopped the node it started
    assert (tmp_path / "data" / "opensearch" / "data" / "nodes").is_dir()
