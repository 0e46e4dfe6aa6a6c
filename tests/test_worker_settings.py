"""A worker process where gymtrace was never configured records under the parent's carrier with
the parent's settings (``GYMTRACE_PARENT``), whatever the start method; where that cannot be, one
warning names the fix. Issue 25: a reward recorded in a ``spawn``/``forkserver`` worker vanished."""

from __future__ import annotations

import json
from pathlib import Path

from child_process import run_gymtrace, run_python
from otlp_lines import child_files

_DRIVER = """
import multiprocessing as mp, subprocess, sys
import gymtrace
from gymtrace import propagation

def score(headers, value):
    # The worker never calls gymtrace.configure(): it only continues the driver's episode.
    with propagation.attach(headers), gymtrace.verify():
        gymtrace.record_reward(value)

if __name__ == "__main__":
    gymtrace.configure(service_name="driver", file={path!r})
    for value, method in ((0.25, "spawn"), (0.5, "forkserver")):
        with gymtrace.rollout(rollout_id="r-" + method), gymtrace.episode():
            headers = propagation.inject({{}}, destination=propagation.GYM_INTERNAL, continuation=True)
        process = mp.get_context(method).Process(target=score, args=(headers, value))
        process.start()
        process.join(60)
        assert process.exitcode == 0, process.exitcode
    with gymtrace.rollout(rollout_id="r-subprocess"), gymtrace.episode():
        env = propagation.env_carrier()
    code = (
        "import os, gymtrace\\n"
        "from gymtrace import propagation\\n"
        "with propagation.attach(os.environ), gymtrace.verify():\\n"
        "    gymtrace.record_reward(0.75)\\n"
    )
    import os
    subprocess.run([sys.executable, "-c", code], env={{**os.environ, **env}}, check=True, timeout=60)
    gymtrace.shutdown()
"""


def test_unconfigured_workers_of_every_start_method_record_with_the_parents_settings(tmp_path: Path) -> None:
    driver = tmp_path / "driver.jsonl"
    # A script file: spawn and forkserver workers import the target from __main__ by its path.
    script = tmp_path / "driver.py"
    script.write_text(_DRIVER.format(path=str(driver)))
    out = run_python(str(script), cwd=tmp_path, timeout=180)
    assert out.returncode == 0, out.stderr
    workers = child_files(str(driver))
    assert len(workers) == 3  # one file per worker process, beside the driver's
    files = [str(driver), *map(str, workers)]
    rows = [
        json.loads(line)
        for line in run_gymtrace("rollouts", *files, "--json", check=True).stdout.splitlines()
    ]
    assert sorted((r["rollout_id"], r["outcome"], r["reward"]) for r in rows) == [
        ("r-forkserver", "scored", 0.5),
        ("r-spawn", "scored", 0.25),
        ("r-subprocess", "scored", 0.75),
    ]
    assert run_gymtrace("check", *files).returncode == 0
    # The driver's file alone: each rollout awaits its outcome, and check says where it may be.
    alone = [
        json.loads(line)
        for line in run_gymtrace("rollouts", str(driver), "--json", check=True).stdout.splitlines()
    ]
    assert {r["outcome"] for r in alone} == {"pending"}
    check = run_gymtrace("check", str(driver))
    assert check.returncode == 0 and "3 awaiting an outcome" in check.stdout, check.stdout
    assert "may be in a file not given" in check.stdout


def test_a_worker_with_no_settings_to_inherit_warns_once_naming_the_fix(tmp_path: Path) -> None:
    # Headers from a process that did not export its settings (its environment was not passed on).
    code = """
    import gymtrace
    from gymtrace import propagation
    headers = {
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "baggage": "gym.rollout.id=r-1,gym.episode.attempt=0",
    }
    for value in (0.5, 1.0):
        with propagation.attach(headers), gymtrace.verify():
            gymtrace.record_reward(value)
    """
    out = run_python(code=code, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    lost = [line for line in out.stderr.splitlines() if "it is lost" in line]
    assert len(lost) == 1, out.stderr
    assert "gymtrace.configure()" in lost[0] and "GYMTRACE_PARENT" in lost[0]


def test_check_on_spans_without_any_rollout_says_there_is_nothing_to_check(tmp_path: Path) -> None:
    code = f"""
    import gymtrace
    gymtrace.configure(file={str(tmp_path / "plain.jsonl")!r})
    with gymtrace.step():
        pass
    gymtrace.shutdown()
    """
    assert run_python(code=code, cwd=tmp_path).returncode == 0
    check = run_gymtrace("check", str(tmp_path / "plain.jsonl"))
    assert check.returncode == 1
    assert "nothing to check" in check.stdout and "OK" not in check.stdout


def test_check_says_which_gym_spans_no_rollout_vouches_for(tmp_path: Path) -> None:
    code = f"""
    import gymtrace
    gymtrace.configure(file={str(tmp_path / "mixed.jsonl")!r})
    with gymtrace.rollout(rollout_id="r-1"), gymtrace.episode():
        gymtrace.record_reward(1.0)
    with gymtrace.step():
        pass
    gymtrace.shutdown()
    """
    assert run_python(code=code, cwd=tmp_path).returncode == 0
    check = run_gymtrace("check", str(tmp_path / "mixed.jsonl"))
    assert check.returncode == 0, check.stdout
    assert "1 gym spans carry no rollout identity" in check.stdout


def test_the_commands_read_the_default_file_with_the_files_its_workers_wrote(tmp_path: Path) -> None:
    code = """
    import os, subprocess, sys
    import gymtrace
    from gymtrace import propagation
    gymtrace.configure(service_name="driver")  # the default file, ./gymtrace-traces.jsonl
    with gymtrace.rollout(rollout_id="r-default"), gymtrace.episode():
        env = {**os.environ, **propagation.env_carrier()}
    scorer = (
        "import os, gymtrace\\n"
        "with gymtrace.propagation.attach(os.environ), gymtrace.verify():\\n"
        "    gymtrace.record_reward(0.5)\\n"
    )
    subprocess.run([sys.executable, "-c", scorer], env=env, check=True, timeout=60)
    gymtrace.shutdown()
    """
    out = run_python(code=code, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert len(child_files(str(tmp_path / "gymtrace-traces.jsonl"))) == 1
    (row,) = [
        json.loads(line)
        for line in run_gymtrace("rollouts", "--json", cwd=tmp_path, check=True).stdout.splitlines()
    ]
    assert (row["rollout_id"], row["outcome"], row["reward"]) == ("r-default", "scored", 0.5)
