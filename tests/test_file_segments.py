"""The file writer and readers (``_model.tracefiles``, ``_sdk.export_targets``, private), driven directly.

The trace file small on disk: compressed (GYMTRACE_FILE_COMPRESS), in segments
(GYMTRACE_FILE_ROTATE_MB), and read alike by every reader whatever its compression (issue 45).

The same spans go through the real file exporter each way, so any difference in what the readers
print is the writing's or the reading's; the killed-writer and live tests run a real configured
process.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import gymtrace
from child_process import clean_env, run_python
from gymtrace._cli import main
from gymtrace._import.write import write_file
from gymtrace._model import settings as _settings
from gymtrace._model.spandata import from_readable, read_otlp_json_lines
from gymtrace._model.tracefiles import child_path, trace_files, zstd_available
from gymtrace._sdk.children import child_files
from gymtrace._sdk.export_targets import file_exporter
from gymtrace.testing import capture_spans

ROLLOUTS = 40
# Spans per export: each export is one gzip member (zstd frame), as the queue's worker writes them.
EXPORT = 50


def _a_run() -> list[Any]:
    """A small training run through the real API: retries, unscored rollouts, training keys."""
    with capture_spans() as captured:
        with gymtrace.run(run_id="segments"):
            for i in range(ROLLOUTS):
                with gymtrace.rollout(
                    rollout_id=f"r-{i}",
                    task_id=f"t-{i % 5}",
                    repeat=i // 5,
                    group_id=f"g-{i % 5}",
                    train_step=i // 20,
                ):
                    for attempt in gymtrace.attempts(2, reraise=False):
                        with attempt:
                            with gymtrace.agent_invocation(), gymtrace.step():
                                with gymtrace.model_call(model="policy"):
                                    gymtrace.record_usage(input_tokens=20, output_tokens=5)
                                if attempt.number == 0 and i % 7 == 3:
                                    raise ConnectionError("environment lost")  # retried
                            if i % 9 == 4:
                                raise KeyError("harness bug")  # unscored
                            with gymtrace.verify():
                                gymtrace.record_reward(float(i % 3 == 0))
        spans = list(captured.spans)
    return spans


def _write(spans: list[Any], path: Path, compress: str, rotate_bytes: int = 0) -> None:
    exporter = file_exporter(str(path), 64, compress, rotate_bytes)
    for start in range(0, len(spans), EXPORT):
        exporter.export(spans[start : start + EXPORT])
    exporter.shutdown()


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _answers(capsys: pytest.CaptureFixture[str], name: str) -> list[str]:
    found = []
    for argv in (
        ["rollouts", name, "--json"],
        ["stats", name, "--json"],
        ["stats", name, "--by", "group", "--json"],
    ):
        code, out, err = _cli(capsys, *argv)
        assert (code, err) == (0, ""), argv
        found.append(out)
    return found


def test_readers_give_identical_output_on_a_run_written_plain_gzip_zstd_and_rotated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spans = _a_run()
    ways = {"plain": ("none", 0), "gzip": ("gzip", 0), "rotated": ("gzip", 4096)}
    if zstd_available():
        ways["zstd"] = ("zstd", 0)
        ways["zstd rotated"] = ("zstd", 4096)
    answers, sizes = {}, {}
    for way, (compress, rotate) in ways.items():
        folder = tmp_path / way.replace(" ", "-")
        _write(spans, folder / "trace.jsonl", compress, rotate)
        files = trace_files(folder / "trace.jsonl")
        sizes[way] = sum(f.stat().st_size for f in files)
        if rotate:
            assert len(files) >= 3, files  # segment 0 and at least two more
        # The name configured, and the directory, read the same.
        answers[way] = _answers(capsys, str(folder / "trace.jsonl"))
        assert _answers(capsys, str(folder)) == answers[way]
    assert answers["plain"][0].count("\n") == ROLLOUTS
    for way in ways:
        assert answers[way] == answers["plain"], way
    assert sizes["gzip"] <= 0.35 * sizes["plain"]
    if "zstd" in sizes:
        assert sizes["zstd"] <= 0.35 * sizes["plain"]


@pytest.mark.parametrize("compress", ["gzip", "none"])
def test_a_segment_cut_short_reads_with_one_warning_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], compress: str
) -> None:
    spans = _a_run()
    path = tmp_path / "trace.jsonl"
    _write(spans, path, compress, 4096 if compress == "gzip" else 40_000)
    last = trace_files(path)[-1]
    whole = last.read_bytes()
    last.write_bytes(whole[: len(whole) - 40])  # its last member (line) loses its end, as a kill mid-write
    code, out, err = _cli(capsys, "rollouts", str(path), "--json")
    assert code == 0
    assert err.count("\n") == 1 and str(last) in err and "cut short" in err, err
    assert 0 < out.count("\n") <= ROLLOUTS
    # The pictures read it the same way (two passes over the files: still one warning).
    code, _, err = _cli(capsys, "timeline", str(path), "-o", str(tmp_path / "t.html"))
    assert code == 0 and err.count("\n") == 1 and str(last) in err, err
    # Without a warning to give, a reader names the file in its error; while the file is still
    # being written (gymtrace live), the unfinished member is read at the next read.
    with pytest.raises(ValueError, match=re.escape(str(last))):
        read_otlp_json_lines(path)
    assert read_otlp_json_lines(path, partial_last_line=True)


def test_bytes_that_are_not_gzip_are_an_error_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "trace.jsonl.gz"
    path.write_bytes(b'{"resourceSpans": []}\n')
    code, _, err = _cli(capsys, "stats", str(path))
    assert code == 2 and err.count("\n") == 1 and str(path) in err, err


def test_segments_and_child_process_files_are_found_by_one_naming_rule(tmp_path: Path) -> None:
    names = [
        "t.jsonl",
        "t.jsonl.gz",
        "t.000001.jsonl.gz",
        "t.000010.jsonl.gz",
        "t.000002.jsonl.gz",
        "t.pid-7.jsonl.gz",
        "t.pid-7.000001.jsonl.gz",
        "t.pid-8.jsonl",
        "other.jsonl.zst",
        "notes.txt",
    ]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    own = ["t.jsonl", "t.jsonl.gz", "t.000001.jsonl.gz", "t.000002.jsonl.gz", "t.000010.jsonl.gz"]
    assert [f.name for f in trace_files(tmp_path / "t.jsonl")] == own
    assert [f.name for f in trace_files(tmp_path / "t.jsonl.gz")] == own  # a segment-0 name, compressed
    assert [f.name for f in trace_files(tmp_path / "t.000002.jsonl.gz")] == ["t.000002.jsonl.gz"]
    assert child_path(str(tmp_path / "t.jsonl"), 7) == str(tmp_path / "t.pid-7.jsonl")
    assert [Path(f).name for f in child_files(str(tmp_path / "t.jsonl"))] == [
        "t.pid-7.jsonl",
        "t.pid-8.jsonl",
    ]
    assert [f.name for f in trace_files(tmp_path / "t.pid-7.jsonl")] == [
        "t.pid-7.jsonl.gz",
        "t.pid-7.000001.jsonl.gz",
    ]
    warnings: list[str] = []
    listed = [f.name for f in trace_files(tmp_path, warnings.append)]
    assert listed == ["other.jsonl.zst", *own, "t.pid-7.jsonl.gz", "t.pid-7.000001.jsonl.gz", "t.pid-8.jsonl"]
    assert len(warnings) == 1 and "notes.txt" in warnings[0]


def test_import_output_named_gz_appends_a_member_the_readers_read(tmp_path: Path) -> None:
    spans = [from_readable(s) for s in _a_run()]
    out = tmp_path / "imported.jsonl.gz"
    write_file(spans, out, {})
    write_file(spans, out, {})
    assert len(read_otlp_json_lines(out)) == 2 * len(spans)


def test_an_unknown_compression_is_one_line_naming_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Production: one warning line, and the default (telemetry never stops the job).
    code = """
    import gymtrace
    gymtrace.configure(file="t.jsonl")
    with gymtrace.rollout(rollout_id="r"):
        pass
    gymtrace.shutdown()
    """
    done = run_python(code=code, cwd=tmp_path, env={"GYMTRACE_FILE_COMPRESS": "lz4"})
    assert done.returncode == 0
    assert done.stderr.count("\n") == 1 and "GYMTRACE_FILE_COMPRESS='lz4'" in done.stderr, done.stderr
    assert [f.name for f in trace_files(tmp_path / "t.jsonl")] == ["t.jsonl"]  # the default, none
    # Strict mode: an error, its message one line.
    monkeypatch.setenv("GYMTRACE_STRICT", "true")
    monkeypatch.setenv("GYMTRACE_FILE_COMPRESS", "lz4")
    with pytest.raises(gymtrace.InvalidArgumentError) as raised:
        _settings.reload()
    assert "\n" not in str(raised.value) and "GYMTRACE_FILE_COMPRESS" in str(raised.value)
    monkeypatch.delenv("GYMTRACE_STRICT")
    monkeypatch.delenv("GYMTRACE_FILE_COMPRESS")
    _settings.reset()


KILLED_WRITER = """
import os, sys
import gymtrace

ledger = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
gymtrace.configure(service_name="killed-writer", file=sys.argv[1])
with gymtrace.run(run_id="killed"):
    for i in range(1_000_000):
        with gymtrace.rollout(rollout_id=f"r-{i}", task_id="t"), gymtrace.episode():
            with gymtrace.step():
                pass
            with gymtrace.verify():
                gymtrace.record_reward(1.0)
        os.write(ledger, f"r-{i}\\n".encode())  # finished
        if i % 10 == 9:
            gymtrace.force_flush()  # a training loop's step: the last buffer is at most 10 rollouts
"""


def test_a_sigkilled_writers_directory_reads_with_one_warning_and_most_finished_rollouts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    traces, ledger = tmp_path / "traces", tmp_path / "finished.txt"
    env = clean_env(GYMTRACE_FILE_COMPRESS="gzip", GYMTRACE_FILE_ROTATE_MB="0.01", GYMTRACE_ENCODER="thread")
    writer = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, f"{traces}/", str(ledger)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and writer.poll() is None:
            finished = ledger.read_text().count("\n") if ledger.exists() else 0
            if finished >= 400 and len(trace_files(traces)) >= 3:
                break
            time.sleep(0.05)
        assert writer.poll() is None, writer.communicate()[1]
        os.kill(writer.pid, signal.SIGKILL)
    finally:
        writer.kill()
        writer.wait()
    finished_ids = set(ledger.read_text().split())
    # The kill may land between writes: cut the newest segment's last member as a kill mid-write.
    newest = [f for f in trace_files(traces) if f.stat().st_size][-1]
    assert newest.name.endswith(".jsonl.gz")
    data = newest.read_bytes()
    newest.write_bytes(data[: max(1, len(data) - 64)])
    code, out, err = _cli(capsys, "rollouts", str(traces), "--json")
    assert code == 0
    assert err.count("\n") == 1 and str(newest) in err, err
    read = {json.loads(line)["rollout_id"] for line in out.splitlines()}
    assert len(read & finished_ids) >= 0.9 * len(finished_ids), (len(read & finished_ids), len(finished_ids))


LIVE_ACROSS_A_ROTATION = """
import contextlib, io, json, os, sys, time
import gymtrace
from gymtrace._cli import main

path = sys.argv[1]
gymtrace.configure(service_name="follow", file=path)


def look():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["live", path, "--json"]) == 0
    files = sorted(f for f in os.listdir(os.path.dirname(path)) if ".jsonl" in f)
    return {"files": files, "live": [json.loads(line) for line in out.getvalue().splitlines()]}


seen = []
with gymtrace.run(run_id="follow"), gymtrace.rollout(rollout_id="open", task_id="t"), gymtrace.episode():
    with gymtrace.step():
        pass
    # The live thread marks a rollout still open at its next mark (within a second).
    deadline = time.monotonic() + 60
    while not seen or not seen[0]["live"] and time.monotonic() < deadline:
        time.sleep(0.05)
        gymtrace.force_flush()
        seen[:] = [look()]
    for n in range(2, 301):
        with gymtrace.step():
            pass
        if n % 50 == 0:
            gymtrace.force_flush()
            seen.append(look())
    print(json.dumps(seen))
    os._exit(0)  # the rollout never ends: only the live view saw it
"""


def test_live_follows_the_segment_being_written_across_a_rotation(tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    env = {"GYMTRACE_FILE_COMPRESS": "gzip", "GYMTRACE_FILE_ROTATE_MB": "0.002", "GYMTRACE_HEARTBEAT": "30"}
    done = run_python(str(path), code=LIVE_ACROSS_A_ROTATION, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    first, last = seen[0], seen[-1]
    assert first["files"] == ["traces.jsonl.gz"]  # one segment, being written
    assert [(r["rollout_id"], r["state"], r["step"]) for r in first["live"]] == [("open", "running", 1)]
    assert len(last["files"]) >= 2, last["files"]  # rotated meanwhile
    # The rollout's markers are in the first segment, its newest steps in the newest: one view.
    assert [(r["rollout_id"], r["state"], r["step"]) for r in last["live"]] == [("open", "running", 300)]
    steps = [look["live"][0]["step"] for look in seen]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)
