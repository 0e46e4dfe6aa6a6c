"""One Collector config for every distribution: it validates on the Jaeger binary and upstream."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

COLLECTOR = Path(__file__).resolve().parent.parent.parent / "collector"
JAEGER = COLLECTOR / "bin" / "jaeger"
OTELCOL = COLLECTOR / "bin" / "otelcol"


def _validate(binary: Path, *configs: str) -> subprocess.CompletedProcess[str]:
    if not binary.is_file():
        if os.environ.get("GYMTRACE_SKIP_E2E", "") not in ("", "0"):
            pytest.skip("GYMTRACE_SKIP_E2E is set")
        pytest.fail(f"{binary} is missing: run `collector/build --otelcol`", pytrace=False)
    args = [str(binary), "validate"]
    for config in configs:
        args += ["--config", str(COLLECTOR / config)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GYMTRACE_")}
    return subprocess.run(args, capture_output=True, text=True, timeout=120, check=False, env=env)


@pytest.mark.parametrize(
    ("binary", "configs"),
    [
        (JAEGER, ("jaeger.yaml", "jaeger.badger.yaml")),
        (JAEGER, ("jaeger.yaml", "jaeger.memory.yaml")),
        (JAEGER, ("jaeger.yaml", "jaeger.opensearch.yaml")),
        (JAEGER, ("otelcol.yaml", "otelcol.health-jaeger.yaml")),
        (OTELCOL, ("otelcol.yaml", "otelcol.upstream.yaml")),
        (OTELCOL, ("otelcol-lb.yaml",)),
    ],
    ids=[
        "jaeger-badger",
        "jaeger-memory",
        "jaeger-opensearch",
        "collector-on-jaeger",
        "collector-on-upstream",
        "loadbalancer-on-upstream",
    ],
)
def test_config_validates(binary: Path, configs: tuple[str, ...]) -> None:
    out = _validate(binary, *configs)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_broken_config_fails_validation(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        (COLLECTOR / "otelcol.yaml").read_text().replace("memory_limiter:", "memory_limitr:", 1)
    )
    out = _validate(JAEGER, str(broken), "otelcol.health-jaeger.yaml")
    assert out.returncode != 0


def test_every_listener_is_bound_to_loopback_by_default() -> None:
    for config in (
        "jaeger.yaml",
        "otelcol.yaml",
        "otelcol-lb.yaml",
        "otelcol.health-jaeger.yaml",
        "otelcol.upstream.yaml",
    ):
        lines = [line.split("#")[0] for line in (COLLECTOR / config).read_text().splitlines()]
        endpoints = [line for line in lines if "endpoint:" in line]
        assert endpoints, config
        for line in endpoints:
            assert "0.0.0.0" not in line, (config, line)
            assert "127.0.0.1" in line or "localhost" in line, (config, line)
    compose = (COLLECTOR / "docker-compose.yaml").read_text()
    for line in compose.splitlines():
        if line.strip().startswith('- "') and ":" in line and line.count(":") >= 2:
            assert line.strip().startswith('- "127.0.0.1:'), line
