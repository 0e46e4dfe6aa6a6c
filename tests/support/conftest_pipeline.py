"""pytest plugin: the session-scoped ``pipeline`` fixture (real Jaeger + gymtrace Collector).

Load it from a conftest.py with ``from conftest_pipeline import *`` (tests/e2e/conftest.py does)
or ``pytest_plugins = ["conftest_pipeline"]`` in the root conftest.py; tests/support is on the path
through pytest's ``pythonpath`` setting.

Every test that uses ``pipeline`` is marked ``e2e`` (deselect with ``-m "not e2e"``). When
``collector/bin/jaeger`` or ``collector/bin/otelcol`` is missing the fixture FAILS, naming the build command; set
``GYMTRACE_SKIP_E2E=1`` to skip end-to-end tests instead (never silently).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from pipeline import JAEGER_BIN, OTELCOL_BIN, Pipeline

__all__ = ["pipeline", "pytest_configure", "pytest_collection_modifyitems"]

# Short enough for tests, long enough that all spans of one small test trace arrive first.
E2E_DECISION_WAIT = "2s"
# 0: only the policy-driven keeps (failed / retried / unscored) survive, so tests can see drops.
E2E_SAMPLE_PERCENT = 0


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "e2e: end-to-end test against a real Jaeger + Collector (collector/build first)"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "pipeline" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.e2e)


def _skip_requested() -> bool:
    return os.environ.get("GYMTRACE_SKIP_E2E", "") not in ("", "0")


@pytest.fixture(scope="session")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    """A running pipeline shared by the session (decision_wait 2s, sample percent 0, upstream Collector).

    Tests share it, so each test must use its own service name / rollout IDs.
    """
    if _skip_requested():
        pytest.skip("GYMTRACE_SKIP_E2E is set: end-to-end tests skipped on request")
    for binary in (JAEGER_BIN, OTELCOL_BIN):
        if not binary.is_file():
            pytest.fail(
                f"end-to-end tests need {binary}; build it with `collector/build --otelcol` "
                "(Go >= 1.26, first build takes minutes) or set GYMTRACE_SKIP_E2E=1 to skip them",
                pytrace=False,
            )
    p = Pipeline(
        decision_wait=E2E_DECISION_WAIT,
        sample_percent=E2E_SAMPLE_PERCENT,
        workdir=tmp_path_factory.mktemp("pipeline"),
    )
    t0 = time.monotonic()
    p.start()
    p.startup_seconds = time.monotonic() - t0  # type: ignore[attr-defined]
    try:
        yield p
    finally:
        p.stop()
