"""The environment for child processes the tests start."""

from __future__ import annotations

import os


def clean_env(**overrides: str) -> dict[str, str]:
    """This process's environment without ``OTEL_*``, ``GYMTRACE_*`` and ``PYTEST_*``, plus overrides.

    A child must not inherit the test run's tracing settings, and must not believe it runs under
    pytest (gymtrace raises its own internal errors there instead of logging them).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GYMTRACE_", "PYTEST_"))}
    env.update(overrides)
    return env
