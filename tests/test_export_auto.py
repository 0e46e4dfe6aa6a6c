"""The encoder's move from thread to process (``_sdk.export_auto``, private: it has no public handle).

``GYMTRACE_ENCODER=auto`` (the default): the thread queue until spans come fast, then the encoder
process, with every span delivered exactly once across the move.

Each test runs an application in its own subprocess (configure() sets the global provider) that
writes OTLP/JSON lines, then reads the file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from child_process import run_python, spans_in
from cpu_hog import cpu_contention  # noqa: F401 - a fixture
from gymtrace._model.environment import GYMTRACE_ENCODER_CONFIG

APP = """
import json, os, signal, sys, threading, time
import gymtrace
from gymtrace._sdk import setup as _setup
path, steps, then, window = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
if window:
    # The tests of what follows the move make it happen at any rate: on a loaded machine the loop
    # may not reach the default rate, and what they prove must not depend on the machine's speed.
    from gymtrace._sdk import export_auto as _export_auto
    _export_auto.UPGRADE_WINDOW = float(window)
if then == "one-cpu":
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
gymtrace.configure(service_name="auto-app", file=path)
[queue] = _setup._state.stage.processors()

def loop(rollout_id, n, every=None):
    with gymtrace.rollout(rollout_id=rollout_id, task_id="t", repeat=0):
        with gymtrace.episode() as episode:
            for i in range(n):
                with gymtrace.step():
                    pass
                if every is not None and not i & 255:
                    every()
            episode.record_reward(1.0)

stopped = []

def starve_encoder():
    # The encoder process starved of CPU, as beside busy processes, but whatever the machine's
    # load: stopped from its first report until this side had to drop a frame, then let go.
    if len(stopped) == 2:
        return
    if not stopped:
        if not (queue._starting or queue._process is not None):
            return
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (queue._process is not None and queue._process._heard):
            time.sleep(0.01)
        if queue._process is None:
            stopped.extend((None, None))  # it never started: the test's assertions say so
            return
        stopped.append(queue._process._proc.pid)
        os.kill(stopped[0], signal.SIGSTOP)
    elif queue.stats().dropped_queue_full:
        os.kill(stopped[0], signal.SIGCONT)
        stopped.append(True)

def pause_encoder():
    # The encoder process paused for 4 s (a machine busy elsewhere, a long GC pause in its
    # exporter) while the loop goes on: the frames fill their bound, and the loop must wait.
    if stopped or queue._process is None or not queue._process._heard:
        return
    stopped.append(queue._process._proc.pid)
    os.kill(stopped[0], signal.SIGSTOP)
    threading.Timer(4.0, os.kill, (stopped[0], signal.SIGCONT)).start()

try:
    every = {"starve-fork": starve_encoder, "pause": pause_encoder}.get(then)
    loop("first", steps, every)
finally:
    if stopped and stopped[0] is not None:
        os.kill(stopped[0], signal.SIGCONT)  # never leave it stopped
    if os.environ.get("LOOP_DONE"):
        open(os.environ["LOOP_DONE"], "w").close()  # a held encoder process may go on now
# The queue's worker looks at the rate before each batch it takes, and a move starts on a thread
# of its own: wait until the worker took everything and no move is under way, not a fixed time.
deadline = time.monotonic() + 60
while time.monotonic() < deadline and (
    getattr(queue, "_starting", False) or (queue._thread if hasattr(queue, "encoder") else queue).stats().queued
):
    time.sleep(0.02)
moved = getattr(queue, "encoder", "thread")
if then == "kill-encoder":
    os.kill(queue._process._proc.pid, 9)
    time.sleep(0.5)
    loop("after", 200)
elif then in ("fork", "starve-fork"):
    pid = os.fork()
    if pid == 0:
        loop("child", 300)
        gymtrace.force_flush()  # a bare fork's os._exit runs no hook: flush first (docs)
        os._exit(0)
    os.waitpid(pid, 0)
flushed = gymtrace.force_flush()
print(json.dumps({"moved": moved, "flushed": flushed, "kind": type(queue).__name__,
                  "stats": [s.__dict__ for s in gymtrace.export_stats()]}))
"""


# Seconds within which UPGRADE_SPANS spans must end for the move: for the tests of what follows it.
ANY_RATE = "600"


def run_app(
    tmp_path: Path, steps: int, then: str = "", window: str = "", **env: str
) -> tuple[dict, list[dict]]:
    path = tmp_path / "traces.jsonl"
    out = run_python(str(path), str(steps), then, window, code=APP, cwd=tmp_path, env=env or None)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1]), spans_in(path)


def assert_exported_or_counted(result: dict, spans: list[dict], finished: int) -> dict:
    """Every span that ended is exported or counted as dropped, none is still queued after the
    flush, and none is written twice."""
    [stats] = result["stats"]
    assert result["flushed"]
    assert stats["finished"] == finished, stats
    assert stats["queued"] == 0, stats
    assert stats["exported"] + stats["dropped_queue_full"] + stats["dropped_export_failed"] == finished, stats
    assert len(spans) == len({s["spanId"] for s in spans})
    return stats


def assert_each_span_once(stats: dict, spans: list[dict], expected: int) -> None:
    assert stats["finished"] == stats["exported"] == len(spans) == expected
    assert stats["queued"] == stats["dropped_queue_full"] == stats["dropped_export_failed"] == 0
    assert len({s["spanId"] for s in spans}) == len(spans)


def test_a_slow_loop_stays_on_the_thread_queue(tmp_path: Path) -> None:
    result, spans = run_app(tmp_path, 500)
    assert result["kind"] == "AutoExporter" and result["moved"] == "thread"
    assert result["flushed"]
    assert_each_span_once(result["stats"][0], spans, 502)


def test_a_fast_loop_moves_to_the_encoder_process_and_every_span_arrives_once(tmp_path: Path) -> None:
    result, spans = run_app(tmp_path, 30_000)
    assert result["moved"] == "process"
    # Spans ended before the move were written by the thread queue, the rest by the encoder
    # process: together each exactly once. On a busy machine the loop can outrun the encoder and
    # fill the bounded queue: what it drops is counted (CI saw 3,584 of 30,002), never lost.
    stats = assert_exported_or_counted(result, spans, 30_002)
    assert stats["dropped_export_failed"] == 0 and len(spans) == stats["exported"]
    steps = [s for s in spans if s["name"] == "gym.step"]
    numbers = sorted(
        int(a["value"]["intValue"]) for s in steps for a in s["attributes"] if a["key"] == "gym.step.number"
    )
    assert len(set(numbers)) == len(numbers) and set(numbers) <= set(range(1, 30_001))
    if stats["dropped_queue_full"] == 0:
        # Nothing dropped: one episode whose 30,000 steps all point at it.
        assert_each_span_once(stats, spans, 30_002)
        [episode] = [s for s in spans if s["name"] == "gym.episode"]
        assert {s["parentSpanId"] for s in steps} == {episode["spanId"]}
        assert numbers == list(range(1, 30_001))


def _encoder_start(tmp_path: Path, then: str, until_loop_done: bool = False) -> str:
    """A PYTHONPATH whose sitecustomize holds the encoder process (only it has the config variable)
    for 3 s before it reads its pipe, as a fresh virtualenv compiling its imports does; then it
    goes on (``then="listen"``) or dies (``then="die"``). With ``until_loop_done`` the hold lasts
    until the app's loop has ended too (at most 60 s): beside CPU hogs the loop can outlast 3 s."""
    slow = tmp_path / "slow-start"
    slow.mkdir()
    hold = "time.sleep(3)"
    if until_loop_done:
        done = tmp_path / "loop-done"
        hold += f"\n    end = time.monotonic() + 60\n    while not os.path.exists({str(done)!r}) and time.monotonic() < end:\n        time.sleep(0.05)"
    (slow / "sitecustomize.py").write_text(
        f"import os, time\nif {GYMTRACE_ENCODER_CONFIG!r} in os.environ:\n    {hold}\n"
        + ("    os._exit(1)\n" if then == "die" else "")
    )
    return os.pathsep.join(p for p in (str(slow), os.environ.get("PYTHONPATH", "")) if p)


@pytest.mark.usefixtures("cpu_contention")
def test_a_move_to_an_encoder_process_slow_to_start_loses_no_span(tmp_path: Path) -> None:
    # CI saw 8,176 of 30,002 spans dropped here, in a fresh virtualenv. Held longer than the whole
    # loop, the encoder process gets every span after the move once it listens, and none is dropped.
    result, spans = run_app(
        tmp_path,
        30_000,
        window=ANY_RATE,
        PYTHONPATH=_encoder_start(tmp_path, "listen", until_loop_done=True),
        LOOP_DONE=str(tmp_path / "loop-done"),
    )
    assert result["moved"] == "process"
    assert result["flushed"]
    assert_each_span_once(result["stats"][0], spans, 30_002)


@pytest.mark.usefixtures("cpu_contention")
def test_an_encoder_process_that_dies_before_it_listens_loses_only_what_reached_its_pipe(
    tmp_path: Path,
) -> None:
    result, spans = run_app(tmp_path, 30_000, window=ANY_RATE, PYTHONPATH=_encoder_start(tmp_path, "die"))
    # The flush waited for the queue that took over (it says whether it finished, not what was lost).
    assert result["flushed"]
    [stats] = result["stats"]
    # Every span is in the file or counted: the frames that waited for the pipe go to a queue in
    # this process instead (all at once: what exceeds its bound is counted as queue-full), and only
    # what the 1 MiB pipe held (records of ~160 bytes) went down with the process.
    assert stats["finished"] == 30_002, stats
    assert stats["queued"] == 0, stats
    assert stats["exported"] + stats["dropped_queue_full"] + stats["dropped_export_failed"] == 30_002, stats
    assert len(spans) == len({s["spanId"] for s in spans}) == stats["exported"]
    assert 0 < stats["dropped_export_failed"] <= (1 << 20) // 100
    assert stats["exported"] >= 8192  # at least the fallback queue's bound of them


def test_pinned_to_the_thread_a_fast_loop_never_moves(tmp_path: Path) -> None:
    result, spans = run_app(tmp_path, 30_000, GYMTRACE_ENCODER="thread")
    assert result["kind"] == "BatchExporter" and result["moved"] == "thread"
    # Pinned, the loop can outrun the thread's encoder on a busy machine and fill the bounded queue
    # (CI saw 13,136 of 30,002 exported): what it drops is counted, never lost or written twice.
    stats = assert_exported_or_counted(result, spans, 30_002)
    assert stats["dropped_export_failed"] == 0 and len(spans) == stats["exported"]
    if stats["dropped_queue_full"] == 0:
        assert_each_span_once(stats, spans, 30_002)


@pytest.mark.usefixtures("cpu_contention")
def test_after_the_move_a_dead_encoder_is_counted_and_export_continues(tmp_path: Path) -> None:
    # Beside busy processes, as on the CI machine where this failed: what the application's side
    # dropped while the starved encoder process lagged (whole frames, counted queue-full) was left
    # out of the sum; and a report of the dead process read after its death was counted twice.
    result, spans = run_app(tmp_path, 30_000, "kill-encoder", window=ANY_RATE)
    assert result["moved"] == "process"
    # What the dead process had not confirmed is counted dropped. It may have written some of it
    # before the SIGKILL (nothing can tell): those are in the file too. Nothing is written twice,
    # and every span is in the file or counted.
    stats = assert_exported_or_counted(result, spans, 30_002 + 202)
    assert stats["exported"] <= len(spans)
    assert stats["finished"] - len(spans) <= stats["dropped_export_failed"]
    rollouts = {
        a["value"]["stringValue"]
        for s in spans
        if s["name"] == "gym.rollout"
        for a in s["attributes"]
        if a["key"] == "gym.rollout.id"
    }
    assert "after" in rollouts


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.usefixtures("cpu_contention")
def test_a_child_forked_after_the_move_exports_its_own_spans_once(tmp_path: Path) -> None:
    result, spans = run_app(tmp_path, 30_000, "fork", window=ANY_RATE)
    assert result["moved"] == "process"
    assert_parent_and_child_exported_once(result, spans)


def test_a_burst_waits_for_a_paused_encoder_process_instead_of_dropping(tmp_path: Path) -> None:
    # Issue 47: the pipe used to wait 100 ms per frame and then drop whole frames of 256 once
    # its bound was full; now the loop waits for the encoder process (up to 5 s per stall), so a
    # 4 s pause costs time, not spans.
    # A queue of 512 (frames past 512 records are past the bound) overflows within the pause.
    result, spans = run_app(tmp_path, 20_000, "pause", window=ANY_RATE, OTEL_BSP_MAX_QUEUE_SIZE="512")
    assert result["moved"] == "process"
    assert_each_span_once(result["stats"][0], spans, 20_002)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_after_the_parent_dropped_frames_exports_its_own_spans_once(tmp_path: Path) -> None:
    # What failed once beside CPU hogs ("exported 26,930 of 30,002", nothing queued: 3,072 counted
    # dropped, 12 frames of 256): the parent's starved encoder process lagged, the parent dropped
    # whole frames, counted as queue-full, and the test had asserted none was. Here the encoder
    # process is stopped until a frame is dropped, so that case runs every time, not under load.
    result, spans = run_app(tmp_path, 30_000, "starve-fork", window=ANY_RATE)
    assert result["moved"] == "process"
    stats = assert_parent_and_child_exported_once(result, spans)
    assert stats["dropped_queue_full"] > 0, stats


def assert_parent_and_child_exported_once(result: dict, spans: list[dict]) -> dict:
    """The parent's spans are in the file or counted (beside busy processes its encoder process
    may lag, and whole frames are dropped, counted), and what it counts exported is in the file,
    once; the child's rollout is in the file, once, and nothing of the parent's is written twice."""
    parent = [s for s in spans if not _in(s, "child")]
    stats = assert_exported_or_counted(result, parent, 30_002)
    assert stats["exported"] == len(parent), stats
    assert len([s for s in spans if _in(s, "child")]) == 302
    assert len({s["spanId"] for s in spans}) == len(spans)
    return stats


def _in(span: dict, rollout_id: str) -> bool:
    return {"key": "gym.rollout.id", "value": {"stringValue": rollout_id}} in span["attributes"]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity")
def test_a_fast_loop_with_one_cpu_stays_on_the_thread_queue(tmp_path: Path) -> None:
    # A second process would compete with the application for its only CPU.
    result, spans = run_app(tmp_path, 30_000, "one-cpu")
    assert result["moved"] == "thread"
    assert_each_span_once(result["stats"][0], spans, 30_002)


@pytest.mark.parametrize(
    ("cpu_max", "expected"),
    [("50000 100000", 1), ("250000 100000", 3), ("max 100000", None), ("garbage", None)],
)
def test_a_cgroup_cpu_quota_bounds_the_cpus_counted(
    cpu_max: str, expected: int | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gymtrace._sdk import export_auto as _export_auto

    monkeypatch.setattr(_export_auto, "_CGROUP_CPU_MAX", str(tmp_path / "missing"))
    unlimited = _export_auto._cpus()
    (tmp_path / "cpu.max").write_text(cpu_max + "\n")
    monkeypatch.setattr(_export_auto, "_CGROUP_CPU_MAX", str(tmp_path / "cpu.max"))
    assert _export_auto._cpus() == (unlimited if expected is None else min(unlimited, expected))
