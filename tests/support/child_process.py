"""Child processes the tests start: a clean environment and one way to run them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from gymtrace._model.tracefiles import open_lines, trace_files


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


def wrote(path: Path) -> bool:
    """Whether a process configured to write ``path`` wrote any of its segments (``path.gz``, ...)."""
    return any(f.exists() for f in trace_files(path))


def trace_lines(path: Path) -> list[bytes]:
    """The lines of the file a process configured to write ``path`` wrote, all of its segments,
    decompressed (GYMTRACE_FILE_COMPRESS, none by default)."""
    found: list[bytes] = []
    for file in trace_files(path):
        with open_lines(file) as lines:
            found.extend(line for line in lines if line.strip())
    return found


def spans_in(path: Path) -> list[dict[str, object]]:
    """The spans of a file of OTLP/JSON lines a child wrote (none if it wrote no file)."""
    spans: list[dict[str, object]] = []
    # Its segments, whatever their compression (GYMTRACE_FILE_COMPRESS, none by default).
    for file in trace_files(path):
        if not file.exists():
            continue
        with open_lines(file) as lines:
            for line in lines:
                try:
                    request = json.loads(line)
                except json.JSONDecodeError:
                    # A write a killed writer cut short, then another writer's whole line: the
                    # last place a request starts is where the whole one does.
                    start = line.rfind(b'{"resourceSpans":')
                    if start <= 0:
                        raise
                    request = json.loads(line[start:])
                for resource_spans in request["resourceSpans"]:
                    for scope_spans in resource_spans["scopeSpans"]:
                        spans.extend(scope_spans["spans"])
    return spans
