"""``collector/up``'s storage faults: each is one line on stderr that names the fix, and nothing is
left running (no Jaeger, no Collector, no OpenSearch JVM)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from collector_scripts import alive, collector_copy, free_port_pair, pids, ports_env, script

pytestmark = pytest.mark.e2e


@pytest.fixture
def copy(tmp_path: Path) -> Iterator[Path]:
    copy = collector_copy(tmp_path)
    yield copy
    script(copy, "down", env=ports_env())


def _fails_with(copy: Path, env: dict[str, str], *args: str) -> str:
    """Run `up ARGS`; it must fail with its first stderr line the error, and leave nothing behind."""
    up = script(copy, "up", *args, env=env)
    assert up.returncode != 0, up.stdout
    assert "pipeline ready" not in up.stdout
    assert not pids(copy), "collector/up left processes running"
    # What `build` says when it (re)builds a binary comes first; the error is the next line.
    lines = [line for line in up.stderr.strip().splitlines() if not line.startswith("collector/build:")]
    assert lines, up.stdout
    return lines[0]


def _our_processes(marker: str) -> list[int]:
    """PIDs whose command line mentions MARKER (a path unique to this test): none may outlive up.

    Read from /proc: `ps` cuts a JVM's command line (its class path) before the data path.
    """
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline and alive(int(proc.name)):
            found.append(int(proc.name))
    return found


def test_a_data_directory_that_is_not_writable_is_named_with_its_variable(copy: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    line = _fails_with(copy, ports_env(GYMTRACE_JAEGER_DATA_DIR=str(blocker)))
    assert line == (
        f"collector/up: data directory {blocker}/badger is not writable; "
        "set GYMTRACE_JAEGER_DATA_DIR to a writable directory"
    )


def test_a_port_in_use_is_named_with_its_variable(copy: Path, tmp_path: Path) -> None:
    env = ports_env(GYMTRACE_JAEGER_DATA_DIR=str(tmp_path / "data"))
    port = env["GYMTRACE_JAEGER_QUERY_PORT"]
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", int(port)))
        squatter.listen()
        line = _fails_with(copy, env)
    assert f"port 127.0.0.1:{port} (GYMTRACE_JAEGER_QUERY_PORT) is in use by another program" in line
    assert "set GYMTRACE_JAEGER_QUERY_PORT to a free port" in line


def test_the_opensearch_port_in_use_is_named_before_anything_starts(copy: Path, tmp_path: Path) -> None:
    os_port = free_port_pair(100)
    env = ports_env(GYMTRACE_JAEGER_DATA_DIR=str(tmp_path / "data"), GYMTRACE_OPENSEARCH_PORT=str(os_port))
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", os_port))
        squatter.listen()
        line = _fails_with(copy, env, "--storage", "opensearch")
    assert f"port 127.0.0.1:{os_port} (GYMTRACE_OPENSEARCH_PORT) is in use" in line


def test_an_opensearch_url_that_does_not_answer_is_named(copy: Path, tmp_path: Path) -> None:
    (nobody,) = [free_port_pair(0)]
    env = ports_env(
        GYMTRACE_JAEGER_DATA_DIR=str(tmp_path / "data"), GYMTRACE_OPENSEARCH_URL=f"http://127.0.0.1:{nobody}"
    )
    line = _fails_with(copy, env, "--storage", "opensearch")
    assert f"OpenSearch at http://127.0.0.1:{nobody} is not ready" in line
    assert "GYMTRACE_OPENSEARCH_URL" in line


def test_an_opensearch_node_not_ready_in_time_is_stopped(copy: Path, tmp_path: Path) -> None:
    data = tmp_path / "slow-data"
    env = ports_env(
        GYMTRACE_JAEGER_DATA_DIR=str(data),
        GYMTRACE_OPENSEARCH_PORT=str(free_port_pair(100)),
        # No JVM answers within a second: the wait gives up and must take the node down with it.
        GYMTRACE_OPENSEARCH_TIMEOUT="1",
    )
    line = _fails_with(copy, env, "--storage", "opensearch")
    assert "OpenSearch not ready on http://127.0.0.1:" in line
    assert "raise GYMTRACE_OPENSEARCH_TIMEOUT" in line
    assert _our_processes(str(data)) == []


def test_java_missing_is_named_with_the_fix(copy: Path, tmp_path: Path) -> None:
    no_java = tmp_path / "no-java"
    no_java.mkdir()
    env = ports_env(
        GYMTRACE_JAEGER_DATA_DIR=str(tmp_path / "data"),
        GYMTRACE_OPENSEARCH_PORT=str(free_port_pair(100)),
        JAVA_HOME=str(no_java),
        OPENSEARCH_JAVA_HOME="",
    )
    line = _fails_with(copy, env, "--storage", "opensearch")
    assert line.startswith(f"collector/opensearch: Java missing: {no_java}/bin/java does not exist")
    assert "JAVA_HOME" in line


def test_a_retention_that_is_not_a_duration_is_refused(copy: Path, tmp_path: Path) -> None:
    env = ports_env(GYMTRACE_JAEGER_DATA_DIR=str(tmp_path / "data"), GYMTRACE_TRACE_RETENTION="7d")
    line = _fails_with(copy, env)
    assert line == (
        "collector/up: GYMTRACE_TRACE_RETENTION=7d is not a duration; use hours, minutes or seconds, e.g. 168h"
    )


def test_an_unknown_store_is_refused(copy: Path) -> None:
    line = _fails_with(copy, ports_env(), "--storage", "cassandra")
    assert line == "collector/up: --storage must be memory, badger or opensearch (got 'cassandra')"
