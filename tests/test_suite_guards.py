"""The test suite's own guards: a leg that cannot run what it exists for fails instead of skipping."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from child_process import clean_env

ROOT = Path(__file__).resolve().parent.parent


def _run_nemo_gym_stack(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            str(ROOT / "tests/test_nemo_gym_stack.py"),
        ],
        cwd=ROOT,
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.skipif(importlib.util.find_spec("nemo_gym") is not None, reason="NeMo Gym imports here")
def test_the_nemo_gym_stack_fails_where_it_is_required_and_nemo_gym_does_not_import(tmp_path: Path) -> None:
    # scripts/test runs the stack in .venv-nemo with GYMTRACE_REQUIRE_NEMO_GYM=1: before, a NeMo
    # Gym that stopped importing there skipped the flagship check, and the run stayed green.
    required = _run_nemo_gym_stack(tmp_path, GYMTRACE_REQUIRE_NEMO_GYM="1")
    assert required.returncode != 0, required.stdout
    assert "GYMTRACE_REQUIRE_NEMO_GYM=1 and nemo_gym does not import" in required.stdout
    # Anywhere else (this venv, the matrix legs) it still skips, naming why.
    elsewhere = _run_nemo_gym_stack(tmp_path)
    assert elsewhere.returncode == pytest.ExitCode.NO_TESTS_COLLECTED, elsewhere.stdout  # skipped whole
    assert "1 skipped" in elsewhere.stdout
