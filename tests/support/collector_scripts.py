"""Run ``collector/up`` and ``collector/down`` as a user does, isolated from the developer's own.

The scripts run from a copy of ``collector/`` (its ``bin/`` linked to the real one) so their
``.run/`` and default ``.data/`` never meet a pipeline the developer has running; every port is a
free one, moved with the one variable per endpoint the scripts and configs share.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from child_process import clean_env
from pipeline import COLLECTOR_DIR, JAEGER_BIN, OTELCOL_BIN, claim_ports, free_ports

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


def collector_copy(tmp_path: Path) -> Path:
    """A copy of ``collector/`` under ``tmp_path`` whose ``bin/`` is the built one."""
    for binary in (JAEGER_BIN, OTELCOL_BIN):
        if not binary.is_file():
            pytest.fail(f"{binary} is missing: run `collector/build --otelcol`", pytrace=False)
    copy = tmp_path / "project" / "collector"
    # copy2 keeps modification times, so `build` sees the linked binaries as up to date.
    shutil.copytree(
        COLLECTOR_DIR,
        copy,
        copy_function=shutil.copy2,
        ignore=shutil.ignore_patterns("bin", ".run", ".data"),
    )
    (copy / "bin").symlink_to(COLLECTOR_DIR / "bin")
    return copy


def free_sampler_base(samplers: int) -> int:
    """A port BASE where every port `up --scale-out` takes (BASE+10i .. +4) is free and claimed."""
    return claim_ports(lambda base: [base + 10 * i + k for i in range(samplers) for k in range(5)])[0]


def free_port_pair(offset: int) -> int:
    """A port P where P and P+offset are both free and claimed (OpenSearch: HTTP and transport)."""
    return claim_ports(lambda base: [base, base + offset])[0]


def ports_env(**extra: str) -> dict[str, str]:
    """A clean environment with every pipeline port on a free one, plus ``extra``."""
    env = dict(zip(PORT_VARIABLES, map(str, free_ports(len(PORT_VARIABLES))), strict=True))
    env["GYMTRACE_SAMPLER_BASE_PORT"] = str(free_sampler_base(samplers=2))
    env.update({"GYMTRACE_UP_TIMEOUT": "30", **extra})
    return clean_env(**env)


def script(copy: Path, name: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``collector/NAME ARGS`` from the copy, output captured."""
    return subprocess.run(
        [str(copy / name), *args], env=env, capture_output=True, text=True, timeout=420, check=False
    )


def pids(copy: Path) -> dict[str, int]:
    """The processes the copy's ``up`` recorded as running, by name."""
    return {p.stem: int(p.read_text()) for p in (copy / ".run").glob("*.pid")}


def alive(pid: int) -> bool:
    """PID exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        # The state follows the command name's closing parenthesis (a name may hold spaces).
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """``predicate()``'s first true value, looked at every second (a refused connection counts as
    not yet: the store or Jaeger restarting); an assertion naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except OSError:
            value = None
        if value or time.monotonic() > deadline:
            assert value, f"timed out after {timeout}s waiting for {what}"
            return value
        time.sleep(1)
