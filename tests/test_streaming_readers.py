"""The readers stream a run: they hold what each rollout needs, read directories of per-process
files as one run, and read past what a killed writer or a stray file leaves."""

from __future__ import annotations

import fractions
import gc
import gzip
import itertools
import json
import math
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import gymtrace
from built_runs import BuiltRun
from gymtrace import _cli as cli
from gymtrace import attributes as c
from gymtrace._cli import main
from gymtrace._model.spandata import (
    EventData,
    LinkData,
    SpanData,
    TraceFileError,
    encode_otlp_json,
    encode_spandata_json,
    normalize,
    pack_spans,
    read_otlp_json_lines,
    unpack_spans,
)
from gymtrace._model.tracefiles import compressor, member_start, open_lines, trace_files_of, zstd_available
from gymtrace._read import source
from gymtrace._read.check import stream
from gymtrace._read.check.stream import HELD_SPANS, SpreadTooThin, check_files
from gymtrace._read.outcomes import dedupe, final_outcomes
from gymtrace._read.source import fork_context, halves, read_summary_spans
from gymtrace._read.timesplit import rollout_splits, split_json
from gymtrace._read.training import finish_rows, read_training
from gymtrace.testing import CapturedSpans, capture_spans
from training_run import READERS, training_run
from training_state import no_policy_version  # noqa: F401 - an autouse fixture


def _lines(captured: CapturedSpans, per_line: int = 5) -> list[str]:
    spans = list(captured.spans)
    return [json.dumps(encode_otlp_json(spans[i : i + per_line])) for i in range(0, len(spans), per_line)]


@pytest.fixture
def run_file(tmp_path: Path) -> Path:
    with capture_spans() as captured:
        training_run()
    path = tmp_path / "run.jsonl"
    path.write_text("".join(line + "\n" for line in _lines(captured)))
    return path


def _out(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _whole_rows(path: Path) -> list[str]:
    """``rollouts --json`` as the readers computed it before they streamed: from every span."""
    spans = read_otlp_json_lines(path)
    outcomes = final_outcomes(spans)
    training = read_training(dedupe(spans), outcomes)
    finish_rows(training, outcomes)
    splits = rollout_splits(spans, outcomes)  # the time split's parts from every span
    return [
        json.dumps({**o.as_json(), **training.row(o).as_json(), "time_split": split_json(splits[id(o)])})
        for o in outcomes
    ]


def test_streamed_rows_equal_the_rows_read_from_every_span(
    run_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _out(capsys, ["rollouts", "--json", str(run_file)])
    assert code == 0
    assert out.splitlines() == _whole_rows(run_file)
    rows = [json.loads(line) for line in out.splitlines()]
    assert {r["outcome"] for r in rows} == {"scored", "unscored"} and max(r["attempts"] for r in rows) == 2


def _split_run(path: Path) -> Path:
    """Rollout a, in an environment integration (``gym.env.id``): attempt 0 failed (0.4 ms model,
    0.3 ms tool past the model call, 0.3 ms other, of 1 ms), attempt 1 scored (a 0.2 ms seed
    session, a 0.3 ms step span and 0.2 ms more of aggregated steps; another library's chat span
    and a model call, 0.5 ms together; another process's tool span, 0.4 ms; a 0.2 ms verify; 0.2 ms
    other, of 2 ms). Rollout b: a 1.5 ms tool call around a 0.5 ms model call (a subagent) inside
    an agent's step, of 4 ms. Rollout c: sampled out. Rollout d: a killed pass left a model call
    of attempt 0 whose episode never ended; the resume ran attempt 0 again (0.3 ms model of 1 ms)."""
    run = BuiltRun("split")
    a = run.rollout("a")
    first = a.episode(
        0, 1_000, outcome=c.OUTCOME_FAILED, failure=c.FAILURE_INFRASTRUCTURE, gym__env__id="Maze-v0"
    )
    first.child(c.KIND_MODEL_CALL, 0, 400, gen_ai__usage__output_tokens=5)
    first.child(c.KIND_TOOL_CALL, 300, 700)
    second = a.episode(2_000, 4_000, reward=1.0, gym__env__id="Maze-v0", gym__steps__duration__total_ms=0.5)
    second.child(c.KIND_SEED_SESSION, 2_000, 2_200)
    second.child(c.KIND_STEP, 2_200, 2_500)
    second.child(None, 2_500, 2_900, operation=c.OPERATION_CHAT)
    second.child(c.KIND_MODEL_CALL, 2_600, 3_000, gen_ai__usage__output_tokens=11)
    second.child(None, 3_000, 3_400, operation=c.OPERATION_EXECUTE_TOOL, service="env-server")
    second.child(c.KIND_VERIFY, 3_800, 4_000)
    a.end(reward=1.0)
    b = run.rollout("b", repeat=1)
    agent = b.episode(10_000, 14_000, reward=0.0)
    agent.child(c.KIND_STEP, 10_000, 14_000)
    agent.child(c.KIND_TOOL_CALL, 11_000, 13_000)
    agent.child(c.KIND_MODEL_CALL, 11_500, 12_000)
    b.end(reward=0.0)
    run.rollout("c", repeat=2).end(reward=0.5, detail=False, end_us=20_000)
    d = run.rollout("d", repeat=3)
    killed = d.episode(20_000, 21_000)
    killed.child(c.KIND_MODEL_CALL, 20_100, 20_500, gen_ai__usage__output_tokens=3)
    run.spans.remove(killed.span)  # its process was killed before the episode ended
    d.episodes.clear()
    d.episode(30_000, 31_000, reward=1.0).child(c.KIND_MODEL_CALL, 30_100, 30_400)
    d.end(reward=1.0)
    return run.write(path)


def _json_lines(capsys: pytest.CaptureFixture[str], argv: list[str]) -> list[str]:
    code, out, err = _out(capsys, argv)
    assert code == 0 and not err, err
    return out.splitlines()


def _read_by_one_and_two_processes(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, path: Path, argvs: list[list[str]]
) -> tuple[dict[tuple[str, ...], list[str]], dict[tuple[str, ...], list[str]]]:
    """Each reader's output on ``path`` read by one process, then by two (forced: the file is
    small), the time splits worked out by a third beside the outcomes."""
    one = {tuple(argv): _json_lines(capsys, [*argv, str(path)]) for argv in argvs}
    cuts: list[object] = []
    forks: list[bool] = []
    monkeypatch.setattr(source, "PARALLEL_BYTES", 0)
    monkeypatch.setattr(source, "ASIDE_SPANS", 0)
    monkeypatch.setattr(source, "halves", lambda files, share=0.5: cuts.append(files) or halves(files, share))
    aside = source.aside
    monkeypatch.setattr(source, "aside", lambda work, fork: forks.append(fork) or aside(work, fork))
    two = {tuple(argv): _json_lines(capsys, [*argv, str(path)]) for argv in argvs}
    monkeypatch.undo()
    assert len(cuts) == len(argvs)  # each read in two halves
    # Every reader here but stats --by policy_version and group reads the time split, and forks for
    # it; those two start no process.
    splits = [argv for argv in argvs if argv[1:3] not in (["--by", "policy_version"], ["--by", "group"])]
    assert forks == [True] * len(splits)
    return one, two


def _segments(plain: Path, directory: Path, count: int, compressed: bool = False) -> Path:
    """``plain``'s lines as ``count`` segments of about equal lines, as its writer rotates them
    (gzip: each line one member, as the writer appends them), under the name they were configured
    by."""
    directory.mkdir()
    lines = plain.read_bytes().splitlines(keepends=True)
    size = -(-len(lines) // count)
    suffix = ".jsonl.gz" if compressed else ".jsonl"
    for number in range(count):
        name = f"traces{suffix}" if number == 0 else f"traces.{number:06d}{suffix}"
        chunk = lines[number * size : (number + 1) * size]
        (directory / name).write_bytes(
            b"".join(gzip.compress(line) if compressed else line for line in chunk)
        )
    return directory / "traces.jsonl"


def _gzip_segments(plain: Path, directory: Path, count: int) -> Path:
    return _segments(plain, directory, count, compressed=True)


def _members(plain: Path, path: Path, compression: str = "gzip") -> Path:
    """``plain``'s lines in one compressed file, each line a member (frame), as gymtrace's writer
    appends an export a member."""
    member = compressor(compression)
    assert member is not None
    path.write_bytes(b"".join(member(line) for line in plain.read_bytes().splitlines(keepends=True)))
    return path


@pytest.mark.parametrize("compression", ["gzip", "zstd"])
def test_a_compressed_file_is_cut_where_a_member_begins_and_each_part_reads_whole_lines(
    tmp_path: Path, compression: str
) -> None:
    if compression == "zstd" and not zstd_available():
        pytest.skip("zstd needs Python 3.14 or zstandard")
    plain = _split_run(tmp_path / "run.jsonl")
    lines = plain.read_bytes().splitlines(keepends=True)
    member = compressor(compression)
    assert member is not None
    one = _members(plain, tmp_path / f"one.jsonl{'.gz' if compression == 'gzip' else '.zst'}", compression)
    split = halves([one])
    assert split is not None
    [(_, (start, cut))], [(_, (cut_too, end))] = split
    assert (start, cut_too, end) == (0, cut, one.stat().st_size)
    starts = list(itertools.accumulate((len(member(line)) for line in lines), initial=0))
    assert cut in starts[1:-1]  # where a member begins, about halfway
    assert abs(cut / end - 0.5) < 0.2
    with open_lines(one, part=(0, cut)) as first, open_lines(one, part=(cut, end)) as second:
        assert [*first, *second] == lines


def test_a_member_is_found_past_bytes_that_only_look_like_the_start_of_one(tmp_path: Path) -> None:
    plain = _split_run(tmp_path / "run.jsonl")
    member = compressor("gzip")
    assert member is not None
    first, second = (member(line) for line in plain.read_bytes().splitlines(keepends=True)[:2])
    stray = b"\x1f\x8b\x08\x00junk"  # a gzip member's magic number inside other bytes
    # Whole members, but not of whole lines of trace requests: a member of other text, one shorter
    # than a request's start, one cut mid-line (a writer that compresses by blocks of bytes).
    foreign = b"".join(gzip.compress(text) for text in (b"not a trace request\n", b"{", first[:40]))
    foreign += gzip.compress(gzip.decompress(first)[:-1])
    path = tmp_path / "odd.jsonl.gz"
    path.write_bytes(first + stray + foreign + second)
    assert member_start(path, 1) == len(first + stray + foreign)
    assert member_start(path, len(first + stray + foreign) + 1) is None


def test_compressed_input_without_a_member_to_cut_at_is_split_by_whole_files_or_read_by_one_process(
    tmp_path: Path,
) -> None:
    plain = _split_run(tmp_path / "run.jsonl")
    configured = _gzip_segments(plain, tmp_path / "segments", 3)
    files = sorted(configured.parent.iterdir(), key=lambda f: (len(f.name) > len("traces.jsonl.gz"), f.name))
    split = halves(files)
    assert split is not None
    # The middle segment is cut where one of its members begins; the others are read whole.
    first, second = split
    assert [f for f, _ in first] == files[:2] and [f for f, _ in second] == files[1:]
    assert (first[0][1], second[1][1]) == (None, None) and first[1][1] is not None

    one = tmp_path / "one.jsonl.gz"
    one.write_bytes(gzip.compress(plain.read_bytes()))
    assert halves([one]) is None  # compressed whole: no member to cut at, one process
    small = tmp_path / "small.jsonl.gz"
    small.write_bytes(gzip.compress(plain.read_bytes().splitlines(keepends=True)[0]))
    assert halves([one, small]) is None  # whole files, not of comparable size
    other = tmp_path / "other.jsonl.gz"
    other.write_bytes(gzip.compress(plain.read_bytes()))
    assert halves([one, other]) == ([(one, None)], [(other, None)])  # whole files of one size


def test_one_compressed_file_is_read_by_one_process_and_a_segment_named_twice_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = _split_run(tmp_path / "run.jsonl")
    single = tmp_path / "single.jsonl.gz"
    single.write_bytes(gzip.compress(plain.read_bytes()))
    monkeypatch.setattr(source, "PARALLEL_BYTES", 0)
    assert _json_lines(capsys, ["rollouts", "--json", str(single)]) == _whole_rows(plain)
    # check: one compressed file of any size in one process, as the plain file is checked.
    verdict, whole = check_files([single], parallel_from=0), check_files([plain])
    assert (verdict.spans, verdict.problems) == (whole.spans, whole.problems)
    # A segment named beside the name that covers it is read once (the readers would dedupe its
    # outcomes; its spans are not held twice).
    configured = _gzip_segments(plain, tmp_path / "segments", 4)
    named_twice = read_summary_spans([configured, configured.with_name("traces.000001.jsonl.gz")])
    assert len(named_twice.spans) == len(read_summary_spans([configured]).spans)


@pytest.mark.parametrize("layout", ["plain", "gzip-segments", "one-gzip-file"])
def test_the_time_split_streamed_by_one_or_two_processes_is_what_every_span_gives(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, layout: str
) -> None:
    if fork_context() is None:
        pytest.skip("the two-process read needs two cores and fork")
    path = _split_run(tmp_path / "run.jsonl")
    # Rotated gzip segments, and one gzip file of many members, are cut where a member begins.
    given = {
        "plain": path,
        "gzip-segments": _gzip_segments(path, tmp_path / "segments", 4),
        "one-gzip-file": _members(path, tmp_path / "one.jsonl.gz"),
    }[layout]
    one, two = _read_by_one_and_two_processes(capsys, monkeypatch, given, READERS[:2])
    assert two == one

    assert one[("rollouts", "--json")] == _whole_rows(path)
    rows = {r["rollout_id"]: r for r in map(json.loads, one[("rollouts", "--json")])}
    assert rows["a"]["time_split"] == pytest.approx(
        {"model": 0.0009, "tool": 0.0007, "env": 0.0007, "verify": 0.0002, "other": 0.0005}
    )
    assert rows["b"]["time_split"] == pytest.approx(
        {"model": 0.0005, "tool": 0.0015, "env": 0.0, "verify": 0.0, "other": 0.002}
    )
    assert rows["c"]["time_split"] is None
    assert rows["d"]["time_split"] == pytest.approx(
        {"model": 0.0003, "tool": 0.0, "env": 0.0, "verify": 0.0, "other": 0.0007}
    )
    assert (rows["a"]["attempts"], rows["d"]["lost_attempts"], rows["a"]["lost_attempts"]) == (2, [0], [])
    (stats,) = map(json.loads, one[("stats", "--json")])
    assert stats["time_split"] == pytest.approx(
        {"model": 0.0017, "tool": 0.0022, "env": 0.0007, "verify": 0.0002, "other": 0.0032}
    )
    assert stats["time_share"]["tool"] == pytest.approx(0.0022 / 0.008)
    # Rollout durations (a root is 1 us longer than its episodes each side): a 4.002 ms, b 4.002 ms,
    # c 20 ms (its root only), d 1.002 ms (the resume's): nearest rank.
    assert (stats["rollout_seconds_p50"], stats["rollout_seconds_p99"]) == pytest.approx((0.004002, 0.020))
    assert stats["lost_attempts"] == 1
    # d's trace was read again whole (for its lost attempt): its dropped call's tokens count once.
    summary = read_summary_spans([path])
    outcomes = final_outcomes(summary.spans)
    streamed = read_training(dedupe(summary.spans), outcomes, summary.tokens).tokens_by_trace
    every = read_otlp_json_lines(path)
    assert streamed == read_training(dedupe(every), final_outcomes(every)).tokens_by_trace
    assert streamed[rows["d"]["trace_id"]] == 3


def test_every_reader_gives_the_same_json_read_by_one_process_or_two(
    run_file: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    if fork_context() is None:
        pytest.skip("the two-process read needs two cores and fork")
    one, two = _read_by_one_and_two_processes(capsys, monkeypatch, run_file, READERS)
    assert two == one
    (step,) = [json.loads(line) for line in one[("stats", "--by", "train_step", "--json")][:1]]
    assert step["time_split"]["model"] > 0 and step["time_split"]["tool"] > 0


def test_output_tokens_of_the_dropped_model_calls_still_count_once_in_a_file_appended_to_itself(
    run_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _out(capsys, ["stats", "--by", "policy_version", "--json", str(run_file)])
    assert code == 0
    tokens = [json.loads(line)["output_tokens"] for line in out.splitlines()]
    # Attempt 0 of every retried rollout made a model call too.
    assert tokens == [sum(7 + i for i in range(v * 4, v * 4 + 4)) + 7 + v * 4 + 1 for v in range(3)]
    doubled = run_file.with_name("doubled.jsonl")
    doubled.write_text(run_file.read_text() * 2)
    for argv in READERS:
        assert _out(capsys, [*argv, str(doubled)])[1] == _out(capsys, [*argv, str(run_file)])[1], argv


def test_the_summary_readers_hold_no_span_below_an_episode(run_file: Path) -> None:
    summary = read_summary_spans([run_file])
    kinds = {s.attributes.get(c.KIND) for s in summary.spans}
    assert kinds == {c.KIND_RUN, c.KIND_ROLLOUT, c.KIND_EPISODE, c.KIND_TRAIN_STEP, c.KIND_CONSUMED}
    assert len(summary.spans) < len(read_otlp_json_lines(run_file)) / 2


def test_a_directory_of_per_process_files_reads_as_the_one_file_it_was_split_from(
    run_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Each trace's spans spread over both files, as processes sharing rollouts write them.
    directory = tmp_path / "traces"
    directory.mkdir()
    lines = run_file.read_text().splitlines(keepends=True)
    (directory / "trainer.jsonl").write_text("".join(lines[0::2]))
    (directory / "worker.pid-7.jsonl").write_text("".join(lines[1::2]))
    for argv in READERS:
        whole = _out(capsys, [*argv, str(run_file)])
        split = _out(capsys, [*argv, str(directory)])
        assert split == whole, argv
    assert (
        _out(capsys, ["tree", "--rollout", "r-1", str(directory)])[1]
        == _out(capsys, ["tree", "--rollout", "r-1", str(run_file)])[1]
    )


def test_a_foreign_file_in_a_directory_is_named_in_a_warning(
    run_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "traces"
    directory.mkdir()
    (directory / "run.jsonl").write_text(run_file.read_text())
    (directory / "notes.txt").write_text("not a trace\n")
    for argv in (["rollouts", "--json"], ["check"]):
        code, out, err = _out(capsys, [*argv, str(directory)])
        assert code == 0 and out
        assert err.count("warning") == 1 and str(directory / "notes.txt") in err, argv


def test_a_malformed_line_is_an_error_naming_file_and_line(
    run_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = run_file.read_text().splitlines(keepends=True)
    lines[2] = lines[2][: len(lines[2]) // 2] + "\n"
    run_file.write_text("".join(lines))
    for argv in (["rollouts", "--json"], ["stats"], ["check"], ["tree", "--run", "stream"]):
        code, _, err = _out(capsys, [*argv, str(run_file)])
        assert code == 2 and f"{run_file}:3:" in err, argv


def test_a_span_that_ends_past_2_to_the_64_is_an_error_naming_its_line(
    run_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A model call the summary readers drop unread: its end went into the time split's arrays of
    # 64-bit integers and raised OverflowError, a traceback.
    request = json.loads(run_file.read_text().splitlines()[0])
    for span in request["resourceSpans"][0]["scopeSpans"][0]["spans"]:
        span["endTimeUnixNano"] = str(2**64)
    run_file.write_text(json.dumps(request) + "\n" + run_file.read_text())
    for argv in (["rollouts", "--json"], ["stats"], ["stats", "--by", "train_step"]):
        code, _, err = _out(capsys, [*argv, str(run_file)])
        assert code == 2 and f"{run_file}:1:" in err and "2^64" in err, (argv, err)


def test_a_last_line_cut_short_by_a_killed_writer_is_one_warning(
    run_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = run_file.read_text()
    whole = _out(capsys, ["rollouts", "--json", str(run_file)])[1].splitlines()
    last = text.rstrip("\n").rsplit("\n", 1)[1]
    run_file.write_text(text[: -len(last) // 2 - 1])  # half of the last line, no newline
    for argv in (["rollouts", "--json"], ["stats"], ["check"]):
        code, _, err = _out(capsys, [*argv, str(run_file)])
        assert code in (0, 1) and err.count("warning") == 1 and str(run_file) in err, argv
        assert "Traceback" not in err
    rows = _out(capsys, ["rollouts", "--json", str(run_file)])[1].splitlines()
    assert 0 < len(rows) <= len(whole)


def test_a_write_cut_short_then_another_writers_line_is_one_warning_and_the_line_reads(
    run_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A writer killed mid-line (an encoder process, a forked child) leaves its bytes without a
    # newline, and the file's next writer appends a whole line after them: one line, two writes.
    lines = run_file.read_text().splitlines(keepends=True)
    without = tmp_path / "without.jsonl"
    without.write_text("".join([lines[0], *lines[2:]]))
    run_file.write_text("".join([lines[0], lines[1][: len(lines[1]) // 2], *lines[2:]]))
    for argv in (["rollouts", "--json"], ["stats", "--json"], ["check"]):
        code, out, err = _out(capsys, [*argv, str(run_file)])
        assert err.count("warning") == 1 and f"{run_file}:2: a write cut short" in err, (argv, err)
        assert "Traceback" not in err
        # The cut write's spans are gone, the line after it reads whole: as if it had its own line.
        assert (code, out) == _out(capsys, [*argv, str(without)])[:2], argv
    # Only a whole request after the cut is taken: a line that ends cut short too is an error.
    run_file.write_text(
        "".join([lines[0], lines[1][:-40], lines[2][: len(lines[2]) // 2] + "\n", *lines[3:]])
    )
    code, _, err = _out(capsys, ["rollouts", "--json", str(run_file)])
    assert code == 2 and f"{run_file}:2:" in err


def _plain_install(argv: list[str]) -> str:
    """The CLI where orjson cannot be imported (the install without the ``fast`` extra)."""
    script = "import sys; sys.modules['orjson'] = None; from gymtrace._cli import main; sys.exit(main())"
    return subprocess.run(
        [sys.executable, "-c", script, *argv], capture_output=True, text=True, check=True
    ).stdout


@pytest.mark.e2e
def test_the_plain_install_reads_byte_for_byte_what_the_fast_parser_reads(
    run_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("orjson")
    # What orjson refuses and json reads: a NaN reward and a lone surrogate.
    with capture_spans() as captured:
        with gymtrace.rollout(rollout_id="odd", task_id="t"):
            with gymtrace.episode(attributes={"note": float("nan"), "label": "lone \ud800"}):
                gymtrace.record_reward(1.0)
    with run_file.open("a") as f:
        f.write(json.dumps(encode_otlp_json(captured.spans)) + "\n")
    for argv in READERS:
        fast = _out(capsys, [*argv, str(run_file)])[1]
        assert fast and _plain_install([*argv, str(run_file)]) == fast, argv


def _summary(paths: list[Path], parallel_from: int) -> tuple[list[object], dict[str, int], list[str]]:
    warnings: list[str] = []
    summary = read_summary_spans(paths, warnings.append, parallel_from=parallel_from)
    return list(summary.spans), {**summary.tokens.by_trace}, warnings


def test_a_big_input_read_by_two_processes_gives_what_one_reads(run_file: Path, tmp_path: Path) -> None:
    # Appended to itself, the halves are copies: each span's tokens still count once.
    doubled = tmp_path / "doubled.jsonl"
    doubled.write_text(run_file.read_text() * 2 + '{"resourceSpans": [')  # and cut short
    other = tmp_path / "other.jsonl"
    other.write_text(run_file.read_text())
    one = _summary([doubled, other], parallel_from=1 << 60)
    two = _summary([doubled, other], parallel_from=0)
    assert two == one
    assert len(one[2]) == 1 and str(doubled) in one[2][0]


needs_two_cores = pytest.mark.skipif(fork_context() is None, reason="one core, or no fork: no process aside")


@needs_two_cores
def test_work_set_aside_runs_in_a_forked_process_and_what_it_returns_comes_back() -> None:
    here = os.getpid()
    with source.aside(lambda: (os.getpid(), [("rule", "message")]), fork=True) as later:
        there, problems = later()
    assert there != here and problems == [("rule", "message")]
    with source.aside(os.getpid, fork=False) as later:
        assert later() == here


@needs_two_cores
def test_work_set_aside_whose_process_fails_is_done_here_and_raises_here() -> None:
    here = os.getpid()
    done: list[int] = []

    def dies_there() -> str:
        done.append(os.getpid())
        if os.getpid() != here:
            os._exit(3)  # killed, as by the OOM killer: no answer
        return "done here"

    with source.aside(dies_there, fork=True) as later:
        assert later() == "done here"
    assert done == [here]  # the forked process's list is its own

    def raises() -> None:
        raise ValueError("a rule that fails on this input")

    with pytest.raises(ValueError, match="a rule that fails"), source.aside(raises, fork=True) as later:
        later()


@needs_two_cores
def test_leaving_the_block_without_the_result_ends_the_process_set_aside() -> None:
    others = set(multiprocessing.active_children())  # another test's, if any are left
    with source.aside(lambda: time.sleep(30), fork=True):
        (process,) = set(multiprocessing.active_children()) - others
    # Ended, not waited for (it would have slept its 30 s out and exited 0).
    assert process.exitcode == -signal.SIGTERM and process not in multiprocessing.active_children()


class _Freed:
    """Writes to ``path`` when it is freed."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __del__(self) -> None:
        self.path.write_text("freed")


@needs_two_cores
def test_work_apart_answers_from_a_process_that_leaves_without_freeing_what_it_made(tmp_path: Path) -> None:
    here = os.getpid()
    given: list[str] = []
    freed = tmp_path / "freed"

    def work(warn: Any) -> tuple[int, object]:
        warn("first")
        warn("second")
        return os.getpid(), _Freed(freed)

    assert source.apart(work, fork_context(), given.append) not in (None, here)
    assert given == ["first", "second"]  # given here, in order
    assert not freed.exists()  # its process left with it
    assert not multiprocessing.active_children()  # and is gone


@needs_two_cores
def test_work_apart_that_fails_with_a_bad_file_raises_it_here_after_its_warnings() -> None:
    given: list[str] = []

    def work(warn: Any) -> tuple[int, object]:
        warn("a foreign file")
        raise TraceFileError("run.jsonl:3: not a trace gymtrace can read")

    with pytest.raises(TraceFileError, match=r"run\.jsonl:3"):
        source.apart(work, fork_context(), given.append)
    assert given == ["a foreign file"]


@needs_two_cores
def test_work_apart_whose_process_fails_otherwise_is_done_here_and_raises_here() -> None:
    here = os.getpid()
    done: list[int] = []

    def dies_there(warn: Any) -> tuple[str, object]:
        done.append(os.getpid())
        if os.getpid() != here:
            os._exit(3)  # killed, as by the OOM killer: no answer
        warn("once")
        return "done here", None

    given: list[str] = []
    assert source.apart(dies_there, fork_context(), given.append) == "done here"
    assert done == [here] and given == ["once"]  # the forked process's list is its own

    def raises(warn: Any) -> tuple[None, object]:
        raise ValueError("a rule that fails on this input")

    with pytest.raises(ValueError, match="a rule that fails") as raised:
        source.apart(raises, fork_context(), None)
    # Raised here, by the work done here: its traceback is this process's.
    assert raised.traceback[-1].name == "raises"


def test_spans_the_second_process_hands_back_are_the_spans_it_read(run_file: Path) -> None:
    read = read_summary_spans([run_file]).spans
    odd = SpanData(
        "0" * 31 + "1",
        "0" * 15 + "2",
        None,
        "odd",
        1,
        2,
        {"nan": math.nan, "big": 2**70, "seq": (1, "a", True), "map": {"k": [1.5]}},
        events=(EventData("exception", 3, {"exception.type": "ValueError"}),),
        links=(LinkData("0" * 31 + "3", "0" * 15 + "4", {c.LINK_RELATION: "run"}),),
        status="ERROR",
        status_message="boom",
    )
    spans = [*read, odd]
    back = unpack_spans(pack_spans(spans))
    assert repr(back) == repr(spans)  # NaN is not equal to itself: compared as text
    assert back[:-1] == read and back[-1].links == odd.links and back[-1].events == odd.events
    # Text interned where it was read is interned again: a run's keys and IDs held once.
    key = next(iter(back[0].attributes))
    assert sys.intern(key) is key
    # A value marshal does not carry (no decoder makes one) travels pickled.
    unusual = replace(odd, attributes={"ratio": fractions.Fraction(1, 3)})
    assert unpack_spans(pack_spans([unusual])) == [unusual]


def test_the_second_process_reads_its_share_of_a_plain_input_cut_at_a_line(tmp_path: Path) -> None:
    path = tmp_path / "lines.jsonl"
    path.write_bytes(b"".join(b'{"n": %d}\n' % n for n in range(1000)))
    size = path.stat().st_size
    for share in (0.5, source.second_share()):
        split = halves([path], share)
        assert split is not None
        [(_, (start, cut))], [(_, (cut_too, end))] = split
        assert (start, cut, end) == (0, cut_too, size)
        assert path.read_bytes()[cut - 1 : cut] == b"\n"  # whole lines on either side
        assert abs((end - cut) / size - share) < 0.01


@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "gzip"])
def test_a_malformed_line_read_by_the_second_process_is_named_by_its_line_in_the_file(
    run_file: Path, tmp_path: Path, compressed: bool
) -> None:
    lines = run_file.read_text().splitlines(keepends=True)
    bad = len(lines) - 2
    lines[bad] = "{not json\n"
    run_file.write_text("".join(lines))
    path = _members(run_file, tmp_path / "members.jsonl.gz") if compressed else run_file
    if compressed:
        split = halves([path])
        assert split is not None and split[1][0][1] is not None  # the second process reads a part
    for parallel_from in (0, 1 << 60):
        with pytest.raises(TraceFileError, match=f"{path}:{bad + 1}:"):
            read_summary_spans([path], parallel_from=parallel_from)


# -- check, trace by trace ------------------------------------------------------------------------


def _with_violations(captured: CapturedSpans) -> list[SpanData]:
    """The run's spans with two findings: a step that names another rollout than its own, and a
    reward recorded outside any rollout (a trace of its own)."""
    spans = normalize(captured.spans)
    step = next(s for s in spans if s.attributes.get(c.KIND) == c.KIND_STEP)
    wrong = replace(step, attributes={**step.attributes, c.ROLLOUT_ID: "someone-else"})
    loose = replace(
        step,
        trace_id="f" * 32,
        span_id="e" * 16,
        parent_id=None,
        attributes={c.KIND: c.KIND_STEP, c.REWARD: 1.0},
    )
    return [wrong if s is step else s for s in spans] + [loose]


def _write_spans(path: Path, spans: list[SpanData], per_line: int = 5) -> Path:
    path.write_text(
        "".join(
            json.dumps(encode_spandata_json(spans[i : i + per_line])) + "\n"
            for i in range(0, len(spans), per_line)
        )
    )
    return path


def test_check_trace_by_trace_finds_what_the_whole_input_check_finds(tmp_path: Path) -> None:
    with capture_spans() as captured:
        training_run()
    path = _write_spans(tmp_path / "run.jsonl", _with_violations(captured))
    doubled = tmp_path / "doubled.jsonl"
    doubled.write_text(path.read_text() * 2)
    for file in (path, doubled):
        whole = check_files([file], limit=None)
        by_trace = check_files([file], held=40, limit=None)
        assert len(whole.problems) == 3 + (file == doubled)
        assert sorted(by_trace.problems) == sorted(whole.problems)
        assert (by_trace.spans, by_trace.rollouts, by_trace.outside) == (
            whole.spans,
            whole.rollouts,
            whole.outside,
        )
        assert by_trace.notes == whole.notes


def test_check_of_a_trace_spread_too_thin_names_it(tmp_path: Path) -> None:
    with capture_spans() as captured:
        training_run()
    spans = normalize(captured.spans)
    # One rollout's root is in a file not given: its trace never closes.
    root = next(s for s in spans if s.attributes.get(c.KIND) == c.KIND_ROLLOUT)
    path = _write_spans(tmp_path / "run.jsonl", [s for s in spans if s is not root])
    assert check_files([path], held=len(spans)).problems == []
    orphans = sum(1 for s in spans if s.trace_id == root.trace_id) - 1
    with pytest.raises(
        SpreadTooThin, match=f"trace {root.trace_id} is spread too thin.*{orphans} of its spans"
    ):
        check_files([path], held=orphans - 1)
    # With room for it beside the traces that close meanwhile, it is checked with the rest.
    assert check_files([path], held=orphans + 20).problems == []


def test_check_merges_a_directory_of_per_process_files_by_time(tmp_path: Path) -> None:
    with capture_spans() as captured:
        training_run()
    spans = _with_violations(captured)
    one = _write_spans(tmp_path / "run.jsonl", spans)
    # The rollout roots in one process's file, what ran below them in another's: read one file
    # after the other, no trace would meet its root before its limit.
    directory = tmp_path / "traces"
    directory.mkdir()
    roots = [s for s in spans if s.parent_id is None]
    _write_spans(directory / "a-trainer.jsonl", roots)
    _write_spans(directory / "b-worker.jsonl", [s for s in spans if s.parent_id is not None])
    whole = check_files([one], limit=None)
    by_trace = check_files([directory], held=40, limit=None)
    assert sorted(by_trace.problems) == sorted(whole.problems) and len(whole.problems) == 3
    assert (by_trace.spans, by_trace.rollouts) == (whole.spans, whole.rollouts)


def _here(work: Any, context: Any, warn: Any) -> Any:
    """``source.apart`` done in this process: what a test watches of this process's work (what it
    reads, what it forks) happens here."""
    return work(warn or source.ignore_warning)[0]


def _cut_through_a_trace(captured: CapturedSpans, *, straggler: bool = False) -> list[SpanData]:
    """The run's spans (with their findings), a long rollout's trace written across the middle of
    the file, where the checker's two processes split it (``straggler``: the rest of it written
    last)."""
    with gymtrace.rollout(rollout_id="long", task_id="t-long"):
        with gymtrace.episode():
            for _ in range(20):
                with gymtrace.step(), gymtrace.tool_call(tool_name="env.step"):
                    pass
            gymtrace.record_reward(1.0)
    spans = _with_violations(captured)
    long_trace = next(s.trace_id for s in spans if s.attributes.get(c.ROLLOUT_ID) == "long")
    rest = [s for s in spans if s.trace_id != long_trace]
    middle = len(rest) // 2
    long = [s for s in spans if s.trace_id == long_trace]
    # A finding in its first half, which only the first process reads.
    long[0] = replace(long[0], attributes={**long[0].attributes, c.ROLLOUT_ID: "short"})
    if straggler:
        # It began with the run and ended last, its first spans before the cut: the second process
        # reads its root only at the end, long after it read any of its spans.
        root = next(n for n, s in enumerate(long) if s.parent_id is None)
        long[root] = replace(long[root], start_ns=min(s.start_ns for s in spans))
        half = len(long) // 2
        return rest[:middle] + long[:half] + rest[middle:] + long[half:]
    return rest[:middle] + long + rest[middle:]


@pytest.mark.parametrize(
    ("early", "held", "reads"),
    [(1000, 120, 1), (0, 120, 2), (1000, 50, 2)],
    ids=["joined", "second half read again", "a trace too long for half the spans: one process"],
)
def test_check_by_two_processes_finds_what_one_finds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, early: int, held: int, reads: int
) -> None:
    with capture_spans() as captured:
        training_run(rollouts=40)
        spans = _cut_through_a_trace(captured)
    path = _write_spans(tmp_path / "run.jsonl", spans, per_line=1)
    doubled = tmp_path / "doubled.jsonl"
    doubled.write_text(path.read_text() * 2)
    monkeypatch.setattr(stream, "EARLY_SPANS", early)
    monkeypatch.setattr(stream, "apart", _here)
    read: list[object] = []
    spans_of = stream._spans
    monkeypatch.setattr(stream, "_spans", lambda *args: read.append(args) or spans_of(*args))
    for file in (path, doubled):
        one = check_files([file], held=held, limit=None, parallel_from=1 << 60)
        read.clear()
        two = check_files([file], held=held, limit=None, parallel_from=0)
        found = " ".join(one.problems)
        assert two == one and "has 'someone-else'" in found and "has 'short'" in found
        # This process read its half once; the second half again if the halves did not join (a
        # span in both, as in a file appended to itself); the whole if a trace was too long for
        # half the spans held.
        assert len(read) == (reads if file == path else max(reads, 2))


@pytest.mark.parametrize(
    ("margin", "reads"), [(stream.CUT_MARGIN_NS, 1), (-(10**30), 2)], ids=["kept", "not kept"]
)
def test_a_trace_cut_that_the_second_process_reads_to_its_root_last_is_joined_as_begun_before_its_half(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, margin: int, reads: int
) -> None:
    # A straggler: a rollout begun before the cut whose first spans the second process does not read
    # early, and whose root it reads after its last check over the limit (here: none). Kept because
    # it began before the second half did, it is joined with its spans from the first half, as when
    # such a trace was handed back open; not kept, the second half is read again here. The verdict
    # is the same either way.
    with capture_spans() as captured:
        training_run(rollouts=40)
        spans = _cut_through_a_trace(captured, straggler=True)
    path = _write_spans(tmp_path / "run.jsonl", spans, per_line=1)
    monkeypatch.setattr(stream, "EARLY_SPANS", 0)
    monkeypatch.setattr(stream, "CUT_MARGIN_NS", margin)
    monkeypatch.setattr(stream, "apart", _here)
    read: list[object] = []
    spans_of = stream._spans
    monkeypatch.setattr(stream, "_spans", lambda *args: read.append(args) or spans_of(*args))
    one = check_files([path], held=10_000, limit=None, parallel_from=1 << 60)
    read.clear()
    two = check_files([path], held=10_000, limit=None, parallel_from=0)
    found = " ".join(one.problems)
    assert "has 'someone-else'" in found and "has 'short'" in found
    # One process held it all and judged it at once; two judged it trace by trace, in another order.
    assert sorted(two.problems) == sorted(one.problems) and replace(two, problems=[]) == replace(
        one, problems=[]
    )
    assert len(read) == reads


def test_check_by_two_processes_with_the_rollout_rules_forked_finds_what_the_whole_input_check_finds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An input big enough for two processes has its rules over whole rollouts run by a forked
    # process beside the outcomes: what they find comes back (an episode ID a rollout rule finds, the
    # spans a file appended to itself holds twice), with the findings of the tree rules and the notes.
    with capture_spans() as captured:
        training_run(rollouts=40)
    spans = _with_violations(captured)
    episode = next(s for s in spans if s.attributes.get(c.KIND) == c.KIND_EPISODE)
    wrong = replace(episode, attributes={**episode.attributes, c.EPISODE_ID: "not-its-id"})
    path = _write_spans(tmp_path / "run.jsonl", [wrong if s is episode else s for s in spans], per_line=1)
    doubled = tmp_path / "doubled.jsonl"
    doubled.write_text(path.read_text() * 2)
    forked: list[bool] = []
    monkeypatch.setattr(stream, "apart", _here)
    aside = stream.aside
    monkeypatch.setattr(stream, "aside", lambda work, fork: forked.append(fork) or aside(work, fork))
    for file in (path, doubled):
        whole = check_files([file], limit=None)
        two = check_files([file], held=1000, limit=None, parallel_from=0)
        assert "has gym.episode.id='not-its-id'" in " ".join(whole.problems)
        assert any("appears 2 times" in p for p in whole.problems) == (file == doubled)
        assert sorted(two.problems) == sorted(whole.problems)
        assert (two.spans, two.rollouts, two.outside, two.awaiting, two.notes) == (
            whole.spans,
            whole.rollouts,
            whole.outside,
            whole.awaiting,
            whole.notes,
        )
    assert forked == ([True, True] if fork_context() is not None else [False, False])


def test_the_second_process_checks_each_trace_whose_root_it_read_and_hands_back_its_findings(
    run_file: Path,
) -> None:
    # What it hands back is pickled and waited for: a trace read to its root is checked there,
    # beside the first half's read, and only a trace still open at its end comes back as spans.
    whole, _, error = stream._read_second([(run_file, None)], HELD_SPANS)
    assert error is None and whole.open == {} and whole.holding == 0
    assert whole.by_trace is not None
    traces = {span.trace_id for span in read_summary_spans([run_file]).spans}
    assert {trace.trace_id for trace in whole.by_trace.traces} == traces
    # The keys of the spans checked travel packed, and come back as they were.
    back = pickle.loads(pickle.dumps(whole.by_trace))
    assert back.seen == whole.by_trace.seen and len(back.seen) == whole.count
    assert [t.trace_id for t in back.traces] == [t.trace_id for t in whole.by_trace.traces]


def test_check_halves_join_only_when_no_span_was_read_by_both() -> None:
    # Whatever holds a span twice (checked in both halves, open in both, checked in one and open
    # in the other) sends the second half to be read again here, not joined.
    def half(checked: list[SpanData], open_: list[SpanData]) -> Any:
        part = stream._Stream(10, whole=False)
        assert part.by_trace is not None
        part.by_trace.seen = {stream._key(s) for s in checked}
        for span in open_:
            part.open.setdefault(span.trace_id, []).append(span)
        return part

    a, b, c_, d = (SpanData(f"{n:032x}", f"{n:016x}", None, "s", 0, 1, {}) for n in range(1, 5))
    assert stream._read_once(half([a], [b]), half([c_], [d]))
    for first, second in (
        (half([a], []), half([a], [])),
        (half([], [a]), half([], [a])),
        (half([a], []), half([], [a])),
        (half([], [a]), half([a], [])),
    ):
        assert not stream._read_once(first, second)


@pytest.mark.parametrize("layout", ["plain", "gzip", "one-gzip-file"])
def test_check_of_a_rotated_run_is_split_between_two_processes_and_finds_what_one_finds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str
) -> None:
    # Rotation is on by default: a run past 256 MB is segments, and each is one writer's, in order.
    with capture_spans() as captured:
        training_run(rollouts=40)
        spans = _cut_through_a_trace(captured)
    path = _write_spans(tmp_path / "run.jsonl", spans, per_line=1)
    if layout == "one-gzip-file":
        configured, files = _members(path, tmp_path / "one.jsonl.gz"), 1
    else:
        configured, files = _segments(path, tmp_path / "segments", 3, layout == "gzip"), 3
    monkeypatch.setattr(stream, "EARLY_SPANS", 1000)
    read: list[list[tuple[Path, object]]] = []
    monkeypatch.setattr(stream, "apart", _here)
    spans_of = stream._spans
    monkeypatch.setattr(stream, "_spans", lambda parts, warn: read.append(parts) or spans_of(parts, warn))
    one = check_files([path], held=120, limit=None)
    assert one.problems
    read.clear()
    assert check_files([configured], held=120, limit=None, parallel_from=1 << 60) == one
    assert [len(parts) for parts in read] == [files]  # one process: the segments one after another
    read.clear()
    assert check_files([configured], held=120, limit=None, parallel_from=0) == one
    # This process read the first half once (whole segments, then up to a line of a plain one or to
    # a member of a compressed one); the forked one the rest.
    split = halves(trace_files_of([configured]), source.second_share())
    assert split is not None and read == [split[0]]


def test_check_of_a_file_reads_a_reward_event_outside_any_rollout(tmp_path: Path) -> None:
    # The checker decodes a span's events only where a rule reads them: outside any rollout.
    with capture_spans() as captured:
        training_run()
    spans = normalize(captured.spans)
    step = next(s for s in spans if s.attributes.get(c.KIND) == c.KIND_STEP)
    scored = replace(
        step,
        trace_id="f" * 32,
        span_id="e" * 16,
        parent_id=None,
        name="scorer",
        attributes={},
        events=(EventData(c.GEN_AI_EVALUATION_RESULT, 1, {c.GEN_AI_EVALUATION_SCORE_VALUE: 1.0}),),
    )
    path = _write_spans(tmp_path / "run.jsonl", [*spans, scored])
    for held in (HELD_SPANS, 40):
        problems = check_files([path], held=held, limit=None).problems
        assert problems == [
            f"scorer (span {'e' * 16}): reward recorded outside any rollout (no gym.rollout.id)"
        ]


@pytest.mark.parametrize(
    "argv",
    [
        ["tree", "--run", "stream"],
        ["check"],
        ["rollouts", "--json"],
        ["stats"],
        ["timeline", "-o", "{tmp}/run.html"],
        ["report", "-o", "{tmp}/report.html"],
    ],
    ids=lambda argv: argv[0],
)
def test_a_command_that_reads_a_run_runs_without_the_cyclic_collector(
    run_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
) -> None:
    # A reader holds 10^5-10^6 objects that form no cycle; each full pass of the collector walks
    # all of them (at 100,000 rollouts it took a third of timeline's time). Off while the command
    # runs (its arguments parsed, which may collect), on again after it.
    passes: list[int] = []
    running: list[bool] = []
    command = cli.COMMANDS[argv[0]]

    def counted(args: Any) -> int:
        running.append(True)
        try:
            return command(args)
        finally:
            running.clear()

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and running:
            passes.append(info["generation"])

    monkeypatch.setitem(cli.COMMANDS, argv[0], counted)
    argv = [part.replace("{tmp}", str(tmp_path)) for part in argv]
    thresholds = gc.get_threshold()
    gc.callbacks.append(count)
    try:
        gc.set_threshold(10)  # a pass every few allocations, if the collector is on
        code = main([argv[0], str(run_file), *argv[1:]])
    finally:
        gc.set_threshold(*thresholds)
        gc.callbacks.remove(count)
    capsys.readouterr()
    assert code in (0, 1)  # check's answer may be "no"; what matters is how it ran
    assert passes == []
    assert gc.isenabled()
