"""Child processes the tests start: a clean environment and one way to run them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path


def clean_env(**overrides: str) -> dict[str, str]:
    """This process's environment without ``OTEL_*``, ``GYMTRACE_*`` and ``PYTEST_*``, no live
    markers, plus overrides.

    A child must not inherit the test run's tracing settings (strict mode included: a child is
    strict only when its test passes ``GYMTRACE_STRICT="true"``).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GYMTRACE_", "PYTEST_"))}
    # No live markers unless a test asks for them (GYMTRACE_HEARTBEAT=...): many children count the
    # spans they export exactly, and a rollout open past a second would add markers
    # (docs/live-and-metrics.md). The live tests set the interval they read.
    env["GYMTRACE_HEARTBEAT"] = "0"
    env.update(overrides)
    return env


def run_python(
    *args: str,
    code: str | None = None,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    check: bool = False,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """``python -c CODE`` (dedented) or ``python ARGS...`` in a clean environment, output captured."""
    argv = (
        [sys.executable, "-c", textwrap.dedent(code), *args] if code is not None else [sys.executable, *args]
    )
    return subprocess.run(
        argv,
        cwd=cwd,
        env=clean_env(**(env or {})),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=check,
    )


def run_gymtrace(
    *argv: str, cwd: Path | None = None, check: bool = False, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """The ``gymtrace`` command line, as a user would run it."""
    return run_python("-m", "gymtrace", *argv, cwd=cwd, check=check, timeout=timeout)


def spans_in(path: Path) -> list[dict[str, object]]:
    """The spans of a file of OTLP/JSON lines a child wrote (none if it wrote no file)."""
    spans: list[dict[str, object]] = []
    if not path.exists():
        return spans
    for line in path.read_text().splitlines():
        for resource_spans in json.loads(line)["resourceSpans"]:
            for scope_spans in resource_spans["scopeSpans"]:
                spans.extend(scope_spans["spans"])
    return spans
