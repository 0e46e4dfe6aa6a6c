"""The command line's manners: ``--version``, quiet on a closed pipe, documented exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import gymtrace
from child_process import clean_env, run_gymtrace, run_python


@pytest.fixture(scope="module")
def many_rollouts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trace file whose ``rollouts --json`` output (~1,500 lines, ~300 kB) is far larger than a
    pipe's buffer, so a reader that stops after one line closes the pipe under a writing gymtrace."""
    path = tmp_path_factory.mktemp("cli") / "traces.jsonl"
    run_python(
        code=f"""
        import gymtrace
        gymtrace.configure(service_name="cli", file={str(path)!r}, endpoint=None)
        with gymtrace.run(run_id="run-1"):
            for i in range(1500):
                with gymtrace.rollout(rollout_id=f"r-{{i}}", task_id=f"t-{{i % 7}}"), gymtrace.episode():
                    with gymtrace.verify():
                        gymtrace.record_reward(1.0)
        gymtrace.shutdown()
        """,
        check=True,
    )
    return path


def test_version_prints_the_package_version() -> None:
    result = run_gymtrace("--version", check=True)
    assert result.stdout.strip() == f"gymtrace {gymtrace.__version__}"


def test_piping_rollouts_into_head_prints_no_error(many_rollouts: Path) -> None:
    result = subprocess.run(
        ["bash", "-c", f'"{sys.executable}" -m gymtrace rollouts "{many_rollouts}" --json | head -1'],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,  # head's status: the pipeline's
    )
    assert json.loads(result.stdout)["run_id"] == "run-1"
    assert result.stderr == ""


def test_a_closed_pipe_ends_gymtrace_quietly_with_the_sigpipe_status(many_rollouts: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-m", "gymtrace", "rollouts", str(many_rollouts), "--json"],
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert child.stdout is not None and child.stderr is not None
    first = child.stdout.readline()
    child.stdout.close()  # the reader goes away while gymtrace still has ~300 kB to write
    stderr = child.stderr.read()
    assert child.wait(timeout=120) == 141
    assert json.loads(first)["rollout_id"].startswith("r-")
    assert stderr == b""


def test_exit_codes_say_found_not_found_and_bad_input(many_rollouts: Path, tmp_path: Path) -> None:
    assert run_gymtrace("check", str(many_rollouts)).returncode == 0
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert run_gymtrace("rollouts", str(empty)).returncode == 1
    missing = run_gymtrace("rollouts", str(tmp_path / "missing.jsonl"))
    assert missing.returncode == 2
    assert "missing.jsonl" in missing.stderr
    assert run_gymtrace("no-such-command").returncode == 2
