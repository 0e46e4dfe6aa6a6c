"""Live rollouts; private where the markers' writer and the live view (``_scopes.live``, ``_read``) run.

Markers and heartbeats while a rollout is open, `gymtrace live`, the timeouts.

Heartbeats are short here (0.2-0.5 s) so the tests run in seconds; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import gymtrace
from child_process import clean_env, run_gymtrace
from gymtrace import attributes as c
from gymtrace._model import settings as _settings
from gymtrace._model.spandata import from_readable
from gymtrace._read.liveview import live_rollouts
from gymtrace._read.render import render_tree
from gymtrace._scopes import live
from gymtrace.testing import CapturedSpans, capture_spans, check_trace

SUPPORT = Path(__file__).resolve().parent / "support"


@pytest.fixture
def heartbeat() -> Iterator[float]:
    interval = 0.2
    _settings.override(heartbeat=interval)
    yield interval
    _settings.override(heartbeat=None)


def _live(*args: str) -> list[dict[str, Any]]:
    out = run_gymtrace("live", *args, "--json", check=True)
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def _wait_for(predicate: Any, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


def test_a_hung_rollout_reads_stalled_at_its_step_a_busy_one_running_and_both_lost_after_sigkill(
    tmp_path: Path,
) -> None:
    trace_file = tmp_path / "traces.jsonl"
    interval = 0.5
    env = clean_env(GYMTRACE_HEARTBEAT=str(interval), OTEL_BSP_SCHEDULE_DELAY="50")
    program = subprocess.Popen(
        [sys.executable, str(SUPPORT / "live_program.py"), str(trace_file)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert program.stdout is not None and program.stdout.readline().strip() == "ready"

        def stalled() -> list[dict[str, Any]] | None:
            rows = _live(str(tmp_path), "--stalled-after", "2")
            states = {r["rollout_id"]: r["state"] for r in rows}
            return rows if states == {"hangs": c.LIVE_STALLED, "busy": c.LIVE_RUNNING} else None

        rows = _wait_for(stalled)
        assert rows, "the hung rollout never read stalled beside the busy one running"
        by_id = {r["rollout_id"]: r for r in rows}
        assert set(by_id) == {"hangs", "busy"}  # the finished one is not live
        assert by_id["hangs"]["step"] == 3
        assert by_id["busy"]["state"] == c.LIVE_RUNNING
        assert by_id["busy"]["step"] > 3
        for row in rows:
            assert set(row) == {
                "run_id",
                "task_id",
                "rollout_id",
                "attempt",
                "state",
                "age_s",
                "idle_s",
                "step",
                "service",
            }
            assert row["run_id"] == "live-run" and row["attempt"] == 0
            assert row["service"].startswith("live-program")
        # Stalled: idle past 2 s, printed to the millisecond (2.0004 s reads 2.0).
        assert by_id["hangs"]["idle_s"] >= 2 and by_id["hangs"]["age_s"] >= by_id["hangs"]["idle_s"]
    finally:
        program.send_signal(signal.SIGKILL)
        program.wait(timeout=10)
    # Lost once three beats went by without one: read within the wait (20 s, forty beats), never
    # before the three (the reader's start-up under load is no part of it, so no clock is read here).
    rows = _wait_for(
        lambda: (r := _live(str(trace_file))) and all(x["state"] == c.LIVE_LOST for x in r) and r
    )
    assert {r["rollout_id"] for r in rows} == {"hangs", "busy"}
    # Lost past three beats; idle_s is printed to the millisecond, so 1.5004 s reads 1.5.
    assert all(r["idle_s"] >= 3 * interval for r in rows), [(r["rollout_id"], r["idle_s"]) for r in rows]
    # The readers of finished traces see the finished rollout as it ended, and the killed ones as
    # lost (issue 32: a pass that died leaves its rollouts visible), never with an outcome.
    out = run_gymtrace("rollouts", str(trace_file), "--json", check=True)
    outcomes = {r["rollout_id"]: r["outcome"] for r in map(json.loads, out.stdout.splitlines())}
    assert set(outcomes) == {"finishes", "hangs", "busy"}
    assert (outcomes["hangs"], outcomes["busy"]) == (c.OUTCOME_LOST, c.OUTCOME_LOST)
    assert outcomes["finishes"] != c.OUTCOME_LOST


def test_markers_are_folded_away_so_tree_check_and_rollouts_are_unchanged(heartbeat: float) -> None:
    def beats(captured: CapturedSpans) -> int:
        return sum(1 for m in captured.markers if m.attributes[c.LIVE_EVENT] == c.LIVE_EVENT_HEARTBEAT)

    with capture_spans() as captured:
        with gymtrace.rollout(rollout_id="r", task_id="t"), gymtrace.episode():
            with gymtrace.step():
                pass
            assert _wait_for(lambda: beats(captured) >= 2, timeout=20)  # a loaded machine is slow
            gymtrace.record_reward(0.5)
    markers = captured.markers
    assert markers, "no marker was written while the rollout was open"
    assert {m.attributes[c.LIVE_EVENT] for m in markers} >= {c.LIVE_EVENT_ROLLOUT, c.LIVE_EVENT_HEARTBEAT}
    rollout = captured.one(c.KIND_ROLLOUT)
    for marker in markers:
        assert marker.context.trace_id == rollout.context.trace_id
        assert marker.attributes[c.ROLLOUT_ID] == "r" and marker.attributes[c.EPISODE_ATTEMPT] == 0
        assert marker.attributes[c.LIVE_STEP] == 1
        assert marker.attributes[c.LIVE_INTERVAL] == heartbeat
        assert marker.attributes[c.SERVICE_INSTANCE_ID]
    assert markers[-1].attributes[c.LIVE_EVENT] == c.LIVE_EVENT_END
    everything = [*captured.spans, *markers]
    assert check_trace(everything) == []
    assert render_tree([from_readable(s) for s in everything]) == captured.tree()
    # Once the rollout ended, `live` lists nothing, even from the markers alone (a tail sampler
    # may have dropped the rollout's own spans).
    assert live_rollouts([from_readable(s) for s in everything], now_ns=time.time_ns()) == []
    assert live_rollouts([from_readable(m) for m in markers], now_ns=time.time_ns()) == []


def test_a_rollout_shorter_than_a_mark_costs_no_marker(monkeypatch: pytest.MonkeyPatch) -> None:
    # A mark comes at most a second apart; one may still fall inside a rollout on a loaded machine
    # (a CI run marked one of these). Each mark pass sees this thread's one open rollout at most, so
    # the rollouts marked are never more than the passes made: a marker per rollout would be 20.
    passes: list[float] = []
    real_mark = live._mark

    def counted(state: Any, beat: bool, interval: float) -> None:
        passes.append(time.monotonic())
        real_mark(state, beat, interval)

    monkeypatch.setattr(live, "_mark", counted)
    _settings.override(heartbeat=5.0)
    try:
        with capture_spans() as captured:
            for index in range(20):
                with gymtrace.rollout(rollout_id=f"r{index}"), gymtrace.episode():
                    pass
    finally:
        _settings.override(heartbeat=None)
    marked = {m.attributes[c.ROLLOUT_ID] for m in captured.markers}
    assert len(marked) <= len(passes), (marked, passes)
    assert {m.attributes[c.LIVE_EVENT] for m in captured.markers} <= {c.LIVE_EVENT_ROLLOUT, c.LIVE_EVENT_END}


def test_heartbeat_zero_writes_no_marker() -> None:
    _settings.override(heartbeat=0)
    try:
        with capture_spans() as captured, gymtrace.rollout(rollout_id="r"), gymtrace.episode():
            time.sleep(1.3)
    finally:
        _settings.override(heartbeat=None)
    assert captured.markers == []


def test_a_busy_rollout_beats_every_other_interval_an_idle_one_every_interval(
    heartbeat: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each mark waits until both busy rollouts have done their work since the mark before, so what
    # a mark sees does not depend on how the threads get the CPU (a loaded CI run caught the busy
    # one between two steps at most marks, and it beat at each). One busy rollout holds a step open
    # across each mark, a new one each time; the other runs two whole steps between marks and is in
    # none at the mark: only the step number says it was busy.
    lock = threading.Condition()
    marks: list[tuple[int, int]] = []  # (first, last) wall-clock ns of each mark the busy ones waited for
    acted: dict[str, int] = {}  # busy rollout -> the number of marks made when it last acted
    stopped = False
    real_mark = live._mark

    def waited_for(state: Any, beat: bool, interval: float) -> None:
        with lock:
            lock.wait_for(lambda: stopped or all(n == len(marks) for n in acted.values()), timeout=30)
            if stopped:
                return
            first = time.time_ns()
            real_mark(state, beat, interval)
            marks.append((first, time.time_ns()))
            lock.notify_all()

    def busy(rollout_id: str, hold_open: bool) -> None:
        with gymtrace.rollout(rollout_id=rollout_id), gymtrace.episode(), contextlib.ExitStack() as held:
            with lock:
                acted[rollout_id] = len(marks)
            while True:
                with lock:
                    lock.wait_for(lambda: stopped or len(marks) > acted[rollout_id])
                    if stopped:
                        return
                if hold_open:
                    held.close()
                    held.enter_context(gymtrace.step())
                else:
                    for _ in range(2):
                        with gymtrace.step():
                            pass
                with lock:
                    acted[rollout_id] = len(marks)
                    lock.notify_all()

    def idle(enough: threading.Event) -> None:
        with gymtrace.rollout(rollout_id="idle"), gymtrace.episode():
            enough.wait(120)

    monkeypatch.setattr(live, "_mark", waited_for)
    enough = threading.Event()
    threads = [
        threading.Thread(target=busy, args=("busy-in-a-step", True)),
        threading.Thread(target=busy, args=("busy-between-steps", False)),
        threading.Thread(target=idle, args=(enough,)),
    ]
    with capture_spans() as captured:
        for thread in threads:
            thread.start()
        try:

            def idle_beats() -> int:
                with lock:  # each marker written so far then belongs to a mark in the list
                    return len(_beats_per_mark(captured, marks).get("idle", []))

            assert _wait_for(lambda: idle_beats() >= 6, timeout=60)
        finally:
            with lock:
                stopped = True
                lock.notify_all()
            enough.set()
            for thread in threads:
                thread.join()
    beaten = _beats_per_mark(captured, marks)
    idle_marks = beaten["idle"]
    assert idle_marks == list(range(idle_marks[0], idle_marks[0] + len(idle_marks)))  # at every mark
    for rollout_id in ("busy-in-a-step", "busy-between-steps"):
        # Skipped once after each beat, and never twice in a row.
        busy_marks = [n for n in beaten[rollout_id] if n <= idle_marks[-1]]
        assert len(busy_marks) >= 2, (rollout_id, beaten)
        assert all(b - a == 2 for a, b in itertools.pairwise(busy_marks)), (rollout_id, beaten)


def _beats_per_mark(captured: CapturedSpans, marks: list[tuple[int, int]]) -> dict[str, list[int]]:
    """For each rollout, the numbers of the marks at which it beat (by the heartbeat's start time)."""
    beaten: dict[str, list[int]] = {}
    for marker in captured.markers:
        if marker.attributes[c.LIVE_EVENT] != c.LIVE_EVENT_HEARTBEAT:
            continue
        at = next(n for n, (first, last) in enumerate(marks) if first <= marker.start_time <= last)
        beaten.setdefault(marker.attributes[c.ROLLOUT_ID], []).append(at)
    return {rollout_id: sorted(numbers) for rollout_id, numbers in beaten.items()}


def _overdue_beats(captured: CapturedSpans) -> bool:
    return any(m.attributes.get(c.LIVE_OVERDUE) for m in captured.markers)


def test_an_overdue_attempt_reads_stalled_whatever_marker_of_it_comes_after_the_overdue_beat() -> None:
    # The deadline's beat is said the moment it passes; on a loaded machine the rollout's first
    # marker, which carries no overdue flag, came after it (CI, the 3.12 leg): overdue belongs to
    # the attempt, not to its newest marker.
    _settings.override(heartbeat=1.0)
    try:
        with capture_spans() as captured:
            with gymtrace.rollout(rollout_id="slow"), gymtrace.episode(timeout=0.05):
                with gymtrace.step():
                    assert _wait_for(lambda: _overdue_beats(captured), timeout=20)
                markers = [from_readable(m) for m in captured.markers]
                gymtrace.record_reward(1.0)
    finally:
        _settings.override(heartbeat=None)
    beat = next(m for m in markers if m.attributes.get(c.LIVE_OVERDUE))
    later = dataclasses.replace(
        beat,
        end_ns=max(m.end_ns for m in markers) + 1,
        attributes={k: v for k, v in beat.attributes.items() if k != c.LIVE_OVERDUE},
    )
    rows = live_rollouts([*markers, later], now_ns=later.end_ns)
    assert [(r.rollout_id, r.state) for r in rows] == [("slow", c.LIVE_STALLED)]


def test_a_sync_episode_past_its_timeout_is_overdue_and_reads_stalled() -> None:
    _settings.override(heartbeat=1.0)  # lost only after 3 s: a loaded machine cannot fake it here
    try:
        with capture_spans() as captured:
            with gymtrace.rollout(rollout_id="slow"), gymtrace.episode(timeout=0.3):
                with gymtrace.step():
                    # Sync code is never interrupted: it runs on past its timeout and finishes.
                    assert _wait_for(lambda: _overdue_beats(captured), timeout=20)
                # Read while it is open: its markers alone say what `gymtrace live` would.
                rows = live_rollouts([from_readable(m) for m in captured.markers], now_ns=time.time_ns())
                gymtrace.record_reward(1.0)
    finally:
        _settings.override(heartbeat=None)
    episode = captured.one(c.KIND_EPISODE)
    assert [e.name for e in episode.events if e.name == c.EVENT_EPISODE_OVERDUE] == [c.EVENT_EPISODE_OVERDUE]
    assert episode.attributes[c.EPISODE_TIMEOUT] == 0.3
    assert episode.attributes[c.EPISODE_OUTCOME] == c.OUTCOME_COMPLETED
    assert [(r.rollout_id, r.state, r.step) for r in rows] == [("slow", c.LIVE_STALLED, 1)]
    assert captured.one(c.KIND_ROLLOUT).attributes[c.ROLLOUT_OUTCOME] == c.OUTCOME_SCORED


async def _scored_after_a_timeout(started: list[int]) -> None:
    async with gymtrace.rollout(rollout_id="r"):
        for attempt in gymtrace.attempts(3, timeout=0.2):
            async with attempt:
                started.append(attempt.number)
                if attempt.number == 0:
                    await asyncio.sleep(30)  # a call that hangs: cancelled by the timeout
                gymtrace.record_reward(1.0)


def test_an_async_attempt_over_its_timeout_is_cancelled_and_retried_as_attempt_1(
    captured: CapturedSpans,
) -> None:
    started: list[int] = []
    began = time.monotonic()
    asyncio.run(_scored_after_a_timeout(started))
    assert time.monotonic() - began < 25  # attempt 0 was cancelled, not slept out (30 s)
    first, second = sorted(captured.by_kind(c.KIND_EPISODE), key=lambda s: s.attributes[c.EPISODE_ATTEMPT])
    assert started == [0, 1]
    assert first.attributes[c.EPISODE_OUTCOME] == c.OUTCOME_FAILED
    assert first.attributes[c.FAILURE_KIND] == c.FAILURE_TIMEOUT
    assert first.attributes[c.FAILURE_RETRYABLE] is True
    assert second.attributes[c.EPISODE_ATTEMPT] == 1 and second.attributes[c.REWARD] == 1.0
    root = captured.one(c.KIND_ROLLOUT)
    assert root.attributes[c.ROLLOUT_OUTCOME] == c.OUTCOME_SCORED and root.attributes[c.ROLLOUT_ATTEMPTS] == 2
    assert check_trace(captured) == []


def test_the_attempt_timeout_retries_with_tracing_off_too() -> None:
    started: list[int] = []
    asyncio.run(_scored_after_a_timeout(started))
    assert started == [0, 1]


def test_an_async_episode_over_its_timeout_fails_with_kind_timeout(captured: CapturedSpans) -> None:
    @gymtrace.episode(timeout=0.1)
    async def decorated() -> None:
        await asyncio.sleep(30)

    async def main() -> None:
        async with gymtrace.rollout(rollout_id="decorated"):
            with pytest.raises(TimeoutError):
                await decorated()
        async with gymtrace.rollout(rollout_id="block"):
            with pytest.raises(TimeoutError):
                async with gymtrace.episode(timeout=0.1):
                    await asyncio.sleep(30)
        async with gymtrace.rollout(rollout_id="in-time"), gymtrace.episode(timeout=5):
            await asyncio.sleep(0)
            gymtrace.record_reward(1.0)

    asyncio.run(main())
    outcomes = {
        s.attributes[c.ROLLOUT_ID]: (s.attributes[c.EPISODE_OUTCOME], s.attributes.get(c.FAILURE_KIND))
        for s in captured.by_kind(c.KIND_EPISODE)
    }
    assert outcomes == {
        "decorated": (c.OUTCOME_FAILED, c.FAILURE_TIMEOUT),
        "block": (c.OUTCOME_FAILED, c.FAILURE_TIMEOUT),
        "in-time": (c.OUTCOME_COMPLETED, None),
    }


@pytest.mark.parametrize("asyncio_timeout", [True, False], ids=["asyncio.timeout", "python-3.10-timer"])
def test_a_refused_timed_enter_leaves_no_timer_behind(
    monkeypatch: pytest.MonkeyPatch, asyncio_timeout: bool
) -> None:
    # Strict mode refuses an episode inside a step before its body runs; the timer armed for that
    # body must go with it, or it cancels whatever the task awaits next (issue 31).
    if not asyncio_timeout:
        monkeypatch.delattr(asyncio, "timeout", raising=False)
    seconds = 0.1

    async def main() -> str:
        with capture_spans(strict=True), gymtrace.rollout(rollout_id="r"), gymtrace.step():
            with pytest.raises(gymtrace.HierarchyViolationError):
                async with gymtrace.episode(timeout=seconds):
                    raise AssertionError("the body of a refused episode never runs")
        await asyncio.sleep(seconds * 3)  # unrelated work, past the refused episode's timeout
        return "finished"

    assert asyncio.run(main()) == "finished"


@pytest.mark.parametrize("bad", [0, -1, float("nan"), "5", True])
def test_a_bad_timeout_is_refused_naming_the_argument(bad: Any) -> None:
    with pytest.raises(gymtrace.InvalidArgumentError, match="'timeout'"):
        gymtrace.episode(timeout=bad)
    with pytest.raises(gymtrace.InvalidArgumentError, match="'timeout'"):
        gymtrace.attempts(2, timeout=bad)


def test_a_forked_child_marks_its_own_rollouts_not_its_parents(tmp_path: Path) -> None:
    code = """
import contextvars, os, time
import gymtrace
from gymtrace._scopes import live as _live
from gymtrace._model import settings as _settings
from gymtrace.testing import capture_spans
_settings.override(heartbeat=0.2)
with capture_spans() as captured, gymtrace.rollout(rollout_id="parent"), gymtrace.episode():
    time.sleep(0.5)  # the parent's thread is running and watching "parent"
    assert _live._state.thread is not None and _live._state.watched
    pid = os.fork()
    if pid == 0:
        ok = not _live._state.watched and _live._state.thread is None
        captured.clear()
        def child():
            with gymtrace.rollout(rollout_id="child"), gymtrace.episode():
                deadline = time.monotonic() + 20
                while not captured.markers and time.monotonic() < deadline:
                    time.sleep(0.05)
        contextvars.Context().run(child)  # a rollout of its own, not inside the parent's episode
        ids = {m.attributes["gym.rollout.id"] for m in captured.markers}
        os._exit(0 if ok and ids == {"child"} else 3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, status
print("ok")
"""
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=clean_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_a_retry_gets_its_own_marker_and_live_reads_its_attempt(heartbeat: float) -> None:
    def marked(event: str) -> bool:
        return any(m.attributes[c.LIVE_EVENT] == event for m in captured.markers)

    with capture_spans() as captured, gymtrace.rollout(rollout_id="retried"):
        for attempt in gymtrace.attempts(2):
            with attempt:
                if attempt.number == 0:
                    assert _wait_for(lambda: marked(c.LIVE_EVENT_ROLLOUT))
                    raise ConnectionError("sandbox lost")
                assert _wait_for(lambda: marked(c.LIVE_EVENT_EPISODE))
                rows = live_rollouts(
                    [from_readable(s) for s in [*captured.spans, *captured.markers]], now_ns=time.time_ns()
                )
    events = [(m.attributes[c.LIVE_EVENT], m.attributes[c.EPISODE_ATTEMPT]) for m in captured.markers]
    assert events[0] == (c.LIVE_EVENT_ROLLOUT, 0)
    assert (c.LIVE_EVENT_EPISODE, 1) in events
    episode_marker = next(m for m in captured.markers if m.attributes[c.LIVE_EVENT] == c.LIVE_EVENT_EPISODE)
    second = next(s for s in captured.by_kind(c.KIND_EPISODE) if s.attributes[c.EPISODE_ATTEMPT] == 1)
    assert episode_marker.parent is not None and episode_marker.parent.span_id == second.context.span_id
    assert [(r.rollout_id, r.attempt, r.state) for r in rows] == [("retried", 1, c.LIVE_RUNNING)]


def test_live_reads_a_file_still_being_written_up_to_its_last_whole_line(tmp_path: Path) -> None:
    from gymtrace._model.spandata import TraceFileError, encode_otlp_json, read_otlp_json_lines

    with capture_spans() as captured, gymtrace.rollout(rollout_id="r"):
        pass
    whole = json.dumps(encode_otlp_json(captured.spans))
    path = tmp_path / "traces.jsonl"
    path.write_text(whole + "\n" + whole[: len(whole) // 2])  # the writer is mid-line
    assert len(read_otlp_json_lines(path, partial_last_line=True)) == len(captured.spans)
    with pytest.raises(TraceFileError, match=":2:"):
        read_otlp_json_lines(path)


def test_the_timeout_works_without_asyncio_timeout_as_on_python_3_10(
    monkeypatch: pytest.MonkeyPatch, captured: CapturedSpans
) -> None:
    # Python 3.10 has no asyncio.timeout: this test makes 3.11+ look like it (and on 3.10 is that).
    monkeypatch.delattr(asyncio, "timeout", raising=False)
    started: list[int] = []
    asyncio.run(_scored_after_a_timeout(started))
    assert started == [0, 1]
    first = next(s for s in captured.by_kind(c.KIND_EPISODE) if s.attributes[c.EPISODE_ATTEMPT] == 0)
    assert first.attributes[c.FAILURE_KIND] == c.FAILURE_TIMEOUT
    assert captured.one(c.KIND_ROLLOUT).attributes[c.ROLLOUT_OUTCOME] == c.OUTCOME_SCORED


KILLED_AT_ONCE = """
import os, signal, sys, threading, time
import gymtrace
from gymtrace._model.spandata import read_otlp_json_lines

path = sys.argv[1]
gymtrace.configure(service_name="killed", file=path)


def rollout(n):
    with gymtrace.rollout(rollout_id=f"4-{n}", task_id="4", repeat=n), gymtrace.episode():
        with gymtrace.step():
            pass
        threading.Event().wait()  # its second model call, which never returns


with gymtrace.run(run_id="run-killed"):
    import contextvars
    for n in range(2):
        threading.Thread(target=contextvars.copy_context().run, args=(rollout, n), daemon=True).start()
    # Killed outright (SIGKILL, no exit handler) once both rollouts' markers are in the file, or
    # after 30 s: long before the 60 s batch delay would have written anything.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            markers = {s.attributes.get("gym.rollout.id") for s in read_otlp_json_lines(path, partial_last_line=True)
                       if s.attributes.get("gym.kind") == "live"}
        except OSError:
            markers = set()
        if markers >= {"4-0", "4-1"}:
            break
        time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.e2e
def test_a_process_killed_outright_leaves_its_rollouts_markers_so_they_read_lost(tmp_path: Path) -> None:
    # Issue 43: every process of a run SIGKILLed at once left no marker when the kill came within
    # a batch delay of them (they sat in the export queue), so its rollouts read neither live nor
    # lost. A marker is sent as soon as it is written. The batch delay is 60 s here, so nothing but
    # that could have written them before the kill.
    trace_file = tmp_path / "traces.jsonl"
    env = clean_env(GYMTRACE_HEARTBEAT="0.5", OTEL_BSP_SCHEDULE_DELAY="60000")
    done = subprocess.run(
        [sys.executable, "-c", KILLED_AT_ONCE, str(trace_file)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    rows = _wait_for(
        lambda: (r := _live(str(trace_file))) and all(x["state"] == c.LIVE_LOST for x in r) and r, timeout=30
    )
    assert {r["rollout_id"] for r in rows} == {"4-0", "4-1"}, rows
    out = run_gymtrace("rollouts", str(trace_file), "--json", check=True)
    outcomes = {r["rollout_id"]: r["outcome"] for r in map(json.loads, out.stdout.splitlines())}
    assert outcomes == {"4-0": c.OUTCOME_LOST, "4-1": c.OUTCOME_LOST}
