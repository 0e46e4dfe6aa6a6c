"""``collector/up`` says ready only when a span sent to the printed endpoint is in Jaeger, names the
broken hop otherwise, and ``collector/down`` stops exactly what it started.

The scripts run from a copy of ``collector/`` (its ``bin/`` linked to the real one) so their
``.run/`` never meets a pipeline the developer has running; every port is a free one, moved with
the one variable per endpoint the scripts and configs share.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from child_process import clean_env
from pipeline import COLLECTOR_DIR, JAEGER_BIN, OTELCOL_BIN, free_ports

pytestmark = pytest.mark.e2e


def _collector_copy(tmp_path: Path) -> Path:
    for binary in (JAEGER_BIN, OTELCOL_BIN):
        if not binary.is_file():
            pytest.fail(f"{binary} is missing: run `collector/build --otelcol`", pytrace=False)
    copy = tmp_path / "project" / "collector"
    # copy2 keeps modification times, so `build` sees the linked binaries as up to date.
    shutil.copytree(
        COLLECTOR_DIR, copy, copy_function=shutil.copy2, ignore=shutil.ignore_patterns("bin", ".run")
    )
    (copy / "bin").symlink_to(COLLECTOR_DIR / "bin")
    return copy


def _free_sampler_base(samplers: int) -> int:
    """A port BASE where every port `up --scale-out` takes (BASE+10i .. +3) is free right now."""
    for base in range(21000, 60000, 97):
        wanted = [base + 10 * i + k for i in range(samplers) for k in range(4)]
        socks = []
        try:
            for port in wanted:
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port range for the samplers")


def _ports_env(**extra: str) -> dict[str, str]:
    names = [
        "GYMTRACE_OTLP_GRPC_PORT",
        "GYMTRACE_OTLP_HTTP_PORT",
        "GYMTRACE_COLLECTOR_HEALTH_PORT",
        "GYMTRACE_JAEGER_OTLP_GRPC_PORT",
        "GYMTRACE_JAEGER_OTLP_HTTP_PORT",
        "GYMTRACE_JAEGER_QUERY_PORT",
        "GYMTRACE_JAEGER_QUERY_GRPC_PORT",
        "GYMTRACE_JAEGER_HEALTH_PORT",
        "GYMTRACE_PROMETHEUS_PORT",
    ]
    env = dict(zip(names, map(str, free_ports(len(names))), strict=True))
    env["GYMTRACE_SAMPLER_BASE_PORT"] = str(_free_sampler_base(samplers=2))
    env.update({"GYMTRACE_UP_TIMEOUT": "30", **extra})
    return clean_env(**env)


def _script(copy: Path, name: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(copy / name), *args], env=env, capture_output=True, text=True, timeout=300, check=False
    )


def _pids(copy: Path) -> dict[str, int]:
    return {p.stem: int(p.read_text()) for p in (copy / ".run").glob("*.pid")}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    return state != "Z"


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
