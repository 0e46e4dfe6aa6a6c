"""``collector/up`` says ready only when a span sent to the printed endpoint is in Jaeger, names the
broken hop otherwise, and ``collector/down`` stops exactly what it started.

The scripts run from a copy of ``collector/`` (tests/support/collector_scripts.py) on free ports.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from collector_scripts import alive as _alive
from collector_scripts import collector_copy as _collector_copy
from collector_scripts import pids as _pids
from collector_scripts import ports_env as _ports_env
from collector_scripts import script as _script
from collector_scripts import until as _until

pytestmark = pytest.mark.e2e


def test_up_scale_out_is_ready_only_after_its_probes_and_down_stops_exactly_it(tmp_path: Path) -> None:
    copy = _collector_copy(tmp_path)
    env = _ports_env()
    try:
        up = _script(copy, "up", "--scale-out", "2", env=env)
        assert up.returncode == 0, up.stdout + up.stderr
        assert "pipeline ready, probe spans read back from Jaeger" in up.stdout
        assert f"http://127.0.0.1:{env['GYMTRACE_OTLP_GRPC_PORT']}" in up.stdout
        pids = _pids(copy)
        assert set(pids) == {"jaeger", "sampler-1", "sampler-2", "collector"}
        assert all(_alive(pid) for pid in pids.values())
        # The probes are in Jaeger: the direct one, one per sampler and those through the front.
        query = f"http://127.0.0.1:{env['GYMTRACE_JAEGER_QUERY_PORT']}"
        params = urllib.parse.urlencode({"service": "gymtrace-pipeline-probe", "limit": 100})
        with urllib.request.urlopen(f"{query}/api/traces?{params}", timeout=10) as resp:
            probes = json.load(resp)["data"]
        assert len(probes) == 1 + 2 + 2
        # The metrics endpoint `up` prints answers, with the span metrics of the probes it sent
        # through the front (counted there, before sampling).
        metrics = f"http://127.0.0.1:{env['GYMTRACE_PROMETHEUS_PORT']}/metrics"
        assert f"Metrics: {metrics}" in up.stdout
        with urllib.request.urlopen(metrics, timeout=10) as resp:
            assert resp.status == 200

        again = _script(copy, "up", "--scale-out", "2", env=env)  # idempotent: nothing new started
        assert again.returncode == 0, again.stdout + again.stderr
        assert _pids(copy) == pids
    finally:
        down = _script(copy, "down", env=env)
    assert down.returncode == 0, down.stdout + down.stderr
    assert not any(_alive(pid) for pid in pids.values())
    assert not list((copy / ".run").glob("*.pid"))
    assert "not running" in _script(copy, "down", env=env).stdout  # a second down is a no-op


def test_up_names_the_hop_that_loses_the_probe_and_leaves_nothing_running(tmp_path: Path) -> None:
    copy = _collector_copy(tmp_path)
    # The Collector starts and accepts spans, but its exporter reaches for Jaeger where none listens.
    env = _ports_env(GYMTRACE_JAEGER_OTLP_HOST="127.0.0.2", GYMTRACE_UP_TIMEOUT="12")
    up = _script(copy, "up", env=env)
    try:
        assert up.returncode != 0
        hop = f"hop Collector :{env['GYMTRACE_OTLP_HTTP_PORT']} -> Jaeger OTLP/gRPC :{env['GYMTRACE_JAEGER_OTLP_GRPC_PORT']}"
        assert hop in up.stderr and "not in Jaeger" in up.stderr, up.stderr
        assert "pipeline ready" not in up.stdout
        assert not _pids(copy)  # what it started, it stopped
    finally:
        _script(copy, "down", env=env)


def test_down_sees_a_process_whose_name_holds_a_space_end_on_sigterm(tmp_path: Path) -> None:
    # /proc/PID/stat gives the command name in parentheses before the state, and a name may hold a
    # space: split on whitespace, "(a b) Z" read "b)" as the state, so a process that had ended on
    # SIGTERM (a zombie until its parent reaps it) looked alive, and down killed it 20 s later as
    # one that "ignored SIGTERM".
    copy = _collector_copy(tmp_path)
    spaced = tmp_path / "a b"
    spaced.symlink_to(shutil.which("sleep") or "/bin/sleep")
    process = subprocess.Popen([str(spaced), "300"])  # reaped below, after down has looked
    try:
        run = copy / ".run"
        run.mkdir(exist_ok=True)
        (run / "collector.pid").write_text(str(process.pid))
        # As collector/up records it. Popen returns once exec has begun, and the command line reads
        # empty until the new program's arguments are in place: wait for them.
        cmdline = _until(
            lambda: Path(f"/proc/{process.pid}/cmdline").read_bytes(), 30, "sleep's command line"
        )
        (run / "collector.cmd").write_text(cmdline.replace(b"\0", b" ").decode())
        down = _script(copy, "down", env=_ports_env())
        assert down.returncode == 0, down.stdout + down.stderr
        assert f"stopped collector (pid {process.pid})" in down.stdout, down.stdout
        assert "ignored SIGTERM" not in down.stderr, down.stderr
        assert process.wait(timeout=10) == -signal.SIGTERM  # ended by down's TERM, never its KILL
    finally:
        process.kill()
        process.wait()
