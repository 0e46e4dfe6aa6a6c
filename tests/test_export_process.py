"""The encoder process (``_sdk.export_process``, private): its pipe and its failures, driven directly.

``GYMTRACE_ENCODER=process``: the export queue in an encoder process, fed records over a pipe.

Each test runs an application in its own subprocess (configure() sets the global provider) that
writes OTLP/JSON lines through the real encoder process, then reads the file: every span that
ended is there exactly once, or counted as dropped, whatever happened to either process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import gymtrace
from child_process import clean_env, run_python, spans_in
from gymtrace import attributes as c

# An application: `rollouts` rollouts of one episode and `steps` steps, then what argv[3] says.
APP = """
import json, os, sys, time
import gymtrace
from gymtrace._sdk import setup as _setup
path, rollouts, then = sys.argv[1], int(sys.argv[2]), sys.argv[3]
gymtrace.configure(service_name="encoder-app", file=path, encoder="process")
[queue] = _setup._state.stage.processors()
print(json.dumps({"encoder_pid": queue._proc.pid}), flush=True)

def work(n, prefix="r"):
    for r in range(n):
        with gymtrace.rollout(rollout_id=f"{prefix}{r}", task_id="t", repeat=0):
            with gymtrace.episode() as episode:
                for _ in range(5):
                    with gymtrace.step():
                        pass
                try:
                    with gymtrace.tool_call(tool_name="boom"):
                        raise ValueError("no")
                except ValueError:
                    pass
                episode.record_reward(1.0)

work(rollouts)
if then == "flush":
    from opentelemetry import trace
    with gymtrace.rollout(rollout_id="other", task_id="t", repeat=0):
        with trace.get_tracer("other.library").start_as_current_span("GET /reset") as span:
            span.add_event("retry", {"attempt": 2})
    print(json.dumps({"flushed": gymtrace.force_flush(), "stats": [s.__dict__ for s in gymtrace.export_stats()]}))
elif then == "kill-self":
    time.sleep(1.5)  # the encoder process gets what is pending within the schedule delay
    os.kill(os.getpid(), 9)
elif then == "kill-encoder":
    os.kill(queue._proc.pid, 9)
    time.sleep(0.5)
    work(rollouts, prefix="after")
    print(json.dumps({"flushed": gymtrace.force_flush(), "stats": [s.__dict__ for s in gymtrace.export_stats()]}))
elif then == "straggler":
    proc = queue._proc
    proc.kill()
    proc.wait()
    work(1, prefix="noticed")  # its records meet the dead pipe: the fallback queue takes over
    # A thread that saw the encoder process running just before that (the fast path reads the
    # flag without the lock) appends its record after the fallback took the pending ones.
    queue._ready = True
    with gymtrace.rollout(rollout_id="straggler", task_id="t", repeat=0):
        pass
    queue._ready = False
    flushed = gymtrace.force_flush()
    print(json.dumps({"flushed": flushed, "stats": [s.__dict__ for s in gymtrace.export_stats()]}))
elif then == "fork":
    pid = os.fork()
    if pid == 0:
        work(3, prefix="child")
        gymtrace.force_flush()  # a bare fork's os._exit runs no hook: flush first (docs)
        os._exit(0)
    os.waitpid(pid, 0)
    print(json.dumps({"flushed": gymtrace.force_flush(), "stats": [s.__dict__ for s in gymtrace.export_stats()]}))
elif then == "hang":
    print("hanging", flush=True)
    # Short sleeps: CPython runs a signal's handler between bytecodes, so a SIGTERM that arrives
    # after the print and before one long sleep starts would wait for that sleep to end.
    while True:
        time.sleep(0.05)
"""
SPANS_PER_ROLLOUT = 8  # rollout, episode, 5 steps, the failed tool call


def run_app(tmp_path: Path, rollouts: int, then: str) -> tuple[dict, list[dict]]:
    path = tmp_path / "traces.jsonl"
    out = run_python(str(path), str(rollouts), then, code=APP, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return lines[-1], spans_in(path)


def test_every_span_reaches_the_file_once_with_its_events_status_and_parent(tmp_path: Path) -> None:
    result, spans = run_app(tmp_path, 40, "flush")
    [stats] = result["stats"]
    assert result["flushed"]
    assert stats["finished"] == stats["exported"] == len(spans) == 40 * SPANS_PER_ROLLOUT + 2
    assert stats["queued"] == stats["dropped_queue_full"] == stats["dropped_export_failed"] == 0
    assert len({s["spanId"] for s in spans}) == len(spans)
    by_id = {s["spanId"]: s for s in spans}
    tool = next(s for s in spans if s["name"] == "execute_tool boom")
    assert tool["status"]["code"] == 2 and "ValueError" in tool["status"]["message"]
    assert [e["name"] for e in tool["events"]] == ["exception"]
    assert by_id[by_id[tool["parentSpanId"]]["spanId"]]["name"] == "gym.episode"
    episode = next(s for s in spans if s["name"] == "gym.episode")
    assert {"key": "gym.reward", "value": {"doubleValue": 1.0}} in episode["attributes"]
    [reward] = episode["events"]  # gymtrace's own spans with events take the fast path too
    assert reward["name"] == "gen_ai.evaluation.result"
    assert {"key": "gen_ai.evaluation.score.value", "value": {"doubleValue": 1.0}} in reward["attributes"]
    # Another library's span (the SDK's own class, with an event) under the rollout, stamped.
    other = next(s for s in spans if s["name"] == "GET /reset")
    assert by_id[other["parentSpanId"]]["name"] == "gym.rollout"
    assert {"key": "gym.rollout.id", "value": {"stringValue": "other"}} in other["attributes"]
    assert [e["name"] for e in other["events"]] == ["retry"]


def test_spans_handed_over_survive_the_application_being_killed(tmp_path: Path) -> None:
    # SIGKILL skips every exit hook: the encoder process reads the end of its pipe and still
    # writes what it was sent (the pending records leave within the schedule delay).
    path = tmp_path / "traces.jsonl"
    out = run_python(str(path), "30", "kill-self", code=APP, cwd=tmp_path)
    assert out.returncode == -signal.SIGKILL
    encoder_pid = json.loads(out.stdout.splitlines()[0])["encoder_pid"]
    deadline = time.monotonic() + 20
    while _alive(encoder_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(encoder_pid), "the encoder process outlived its application"
    spans = spans_in(path)
    assert len(spans) == len({s["spanId"] for s in spans}) == 30 * SPANS_PER_ROLLOUT


def test_a_dead_encoder_process_is_counted_and_export_continues_in_the_application(tmp_path: Path) -> None:
    result, spans = run_app(tmp_path, 20, "kill-encoder")
    [stats] = result["stats"]
    assert result["flushed"]
    assert stats["finished"] == 40 * SPANS_PER_ROLLOUT
    # Nothing counted twice, nothing uncounted: what the dead process held is dropped, the rest
    # (everything after it died) written by the application's own queue.
    assert stats["exported"] + stats["dropped_export_failed"] == stats["finished"]
    assert stats["exported"] == len(spans) == len({s["spanId"] for s in spans})
    names = {s["attributes"][0]["value"]["stringValue"] for s in spans if s["name"] == "gym.rollout"}
    assert {f"after{r}" for r in range(20)} <= names


def test_a_span_that_ended_as_the_encoder_died_is_exported_by_the_queue_that_took_over(
    tmp_path: Path,
) -> None:
    # Before: it stayed in the records waiting for a frame, counted as queued after every flush,
    # and dropped only at shutdown.
    result, spans = run_app(tmp_path, 10, "straggler")
    [stats] = result["stats"]
    assert result["flushed"]
    assert stats["queued"] == 0
    assert (
        stats["exported"] + stats["dropped_queue_full"] + stats["dropped_export_failed"] == stats["finished"]
    )
    assert "straggler" in {
        s["attributes"][0]["value"]["stringValue"] for s in spans if s["name"] == "gym.rollout"
    }


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_exports_through_its_own_encoder_and_the_parents_spans_once(tmp_path: Path) -> None:
    result, spans = run_app(tmp_path, 10, "fork")
    [stats] = result["stats"]
    assert result["flushed"]
    assert stats["finished"] == stats["exported"] == 10 * SPANS_PER_ROLLOUT  # the parent's own
    assert len(spans) == len({s["spanId"] for s in spans}) == 13 * SPANS_PER_ROLLOUT


def test_sigterm_flushes_through_the_encoder_process(tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-c", APP, str(path), "25", "hang"],
        cwd=tmp_path,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        while "hanging" not in proc.stdout.readline():
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGTERM
    spans = spans_in(path)
    assert len(spans) == len({s["spanId"] for s in spans}) == 25 * SPANS_PER_ROLLOUT


def test_a_burst_slows_the_application_instead_of_dropping(tmp_path: Path) -> None:
    code = """
import json, sys
import gymtrace
gymtrace.configure(service_name="burst", file=sys.argv[1], encoder="process")
step = gymtrace.step
with gymtrace.rollout(rollout_id="burst", task_id="t", repeat=0):
    with gymtrace.episode():
        for _ in range(20000):
            with step():
                pass
gymtrace.force_flush()
print(json.dumps([s.__dict__ for s in gymtrace.export_stats()]))
"""
    path = tmp_path / "burst.jsonl"
    out = run_python(str(path), code=code, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    [stats] = json.loads(out.stdout.splitlines()[-1])
    assert stats["finished"] == stats["exported"] == len(spans_in(path)) == 20002
    assert stats["dropped_queue_full"] == stats["dropped_export_failed"] == 0


def test_unsampled_spans_are_not_handed_over(tmp_path: Path) -> None:
    code = """
import json, sys
import gymtrace
gymtrace.configure(service_name="sampled", file=sys.argv[1], encoder="process")
for r in range(200):
    with gymtrace.rollout(rollout_id=f"r{r}", task_id="t", repeat=0):
        with gymtrace.step():
            pass
gymtrace.force_flush()
print(json.dumps([s.__dict__ for s in gymtrace.export_stats()]))
"""
    path = tmp_path / "sampled.jsonl"
    out = run_python(str(path), code=code, cwd=tmp_path, env={"GYMTRACE_SAMPLE_RATIO": "0.5"})
    assert out.returncode == 0, out.stderr
    [stats] = json.loads(out.stdout.splitlines()[-1])
    spans = spans_in(path)
    # A kept rollout is whole (rollout and its step); a dropped one leaves its summary span alone.
    details = [s for s in spans if s["name"] == "gym.rollout"]
    kept = sum(1 for s in details if not _is_summary(s))
    assert 0 < kept < 200 and len(details) == 200, len(details)
    assert len(spans) == 2 * kept + (200 - kept)
    assert stats["finished"] == stats["exported"] == len(spans)


def _is_summary(span: dict[str, Any]) -> bool:
    attributes: list[dict[str, Any]] = span["attributes"]
    return any(a["key"] == c.ROLLOUT_DETAIL and a["value"] == {"boolValue": False} for a in attributes)


def test_a_bad_encoder_is_a_clear_error_naming_the_argument_or_variable(tmp_path: Path) -> None:
    with pytest.raises(gymtrace.InvalidArgumentError, match="argument 'encoder'"):
        gymtrace.configure(encoder="subprocess")
    out = run_python(
        code="import gymtrace; gymtrace.configure(file=False)",
        cwd=tmp_path,
        env={"GYMTRACE_ENCODER": "fast", "GYMTRACE_STRICT": "true"},
    )
    assert out.returncode != 0 and "GYMTRACE_ENCODER" in out.stderr and "'fast'" in out.stderr


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie child of an exited parent is reaped by init; /proc says whether it still runs.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


SECRET_APP = """
import json, sys, time
import gymtrace
from gymtrace._sdk import setup as _setup
gymtrace.configure(service_name="secret", endpoint=sys.argv[1], protocol="http/protobuf", file=False,
                   headers={"authorization": "Bearer s3cret-token"}, encoder="process")
[queue] = _setup._state.stage.processors()
with open(f"/proc/{queue._proc.pid}/cmdline", "rb") as f:
    cmdline = f.read().decode(errors="replace")
with gymtrace.rollout(rollout_id="r", task_id="t", repeat=0), gymtrace.episode():
    pass
print(json.dumps({"flushed": gymtrace.force_flush(), "cmdline": cmdline}))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/cmdline"), reason="reads /proc")
def test_exporter_headers_reach_the_collector_but_not_the_encoders_command_line(tmp_path: Path) -> None:
    # A process's arguments are world-readable (ps); exporter headers often carry credentials.
    from otlp_receiver import http_receiver

    with http_receiver() as receiver:
        out = run_python(receiver.endpoint, code=SECRET_APP, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        result = json.loads(out.stdout.strip().splitlines()[-1])
        headers = list(receiver.headers)
        spans = receiver.spans
    assert result["flushed"] and len(spans) == 2
    assert headers and all(h.get("authorization") == "Bearer s3cret-token" for h in headers)
    assert "child_main" in result["cmdline"] and "s3cret" not in result["cmdline"]


# The encoder process confirms spans, then dies before the application applied that report: the
# application's reply thread is held off by the exporter's lock, as a busy machine holds it off by
# not scheduling it, and a write notices the death first.
LATE_REPORT_APP = """
import json, os, sys, time
import gymtrace
from gymtrace._sdk import export_process as ep
from gymtrace._sdk import setup as _setup
from gymtrace._model.spandata import read_otlp_json_lines
path = sys.argv[1]
gymtrace.configure(service_name="late-report", file=path, encoder="process")
[queue] = _setup._state.stage.processors()

def steps(n):
    with gymtrace.rollout(rollout_id="r", task_id="t", repeat=0), gymtrace.episode():
        for _ in range(n):
            with gymtrace.step():
                pass

def lines():
    # Spans written so far (the file is gzip: GYMTRACE_FILE_COMPRESS's default).
    return len(read_otlp_json_lines(path, partial_last_line=True))

steps(100)
assert gymtrace.force_flush()
proc = queue._proc
with queue._lock:
    steps(510)  # two frames of 256 written to the pipe
    queue._outbox.append((0, ep._frame((ep._FLUSH, 999, 5000))))
    queue._write_outbox()
    deadline = time.monotonic() + 60
    while lines() < 614 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # its report (the flush's answer) follows the write at once
    proc.kill()
    proc.wait()
    steps(300)  # a frame's write meets the dead pipe: the death is noticed here, first
reader = queue._reader
print(json.dumps({"flushed": gymtrace.force_flush()}), flush=True)
reader.join(30)  # the late report is applied
print(json.dumps({"lines": lines(), "stats": [s.__dict__ for s in gymtrace.export_stats()]}))
"""


def test_a_report_read_after_the_encoder_died_moves_spans_from_dropped_to_exported_not_twice(
    tmp_path: Path,
) -> None:
    # Before: the death's count used the counts applied so far, and the late report then counted
    # the same 512 spans as exported too: exported + dropped exceeded finished.
    path = tmp_path / "traces.jsonl"
    out = run_python(str(path), code=LATE_REPORT_APP, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert lines[0]["flushed"]
    [stats] = lines[-1]["stats"]
    spans = spans_in(path)
    assert stats["finished"] == 2 + 100 + 2 + 510 + 2 + 300
    assert (
        stats["exported"] + stats["dropped_queue_full"] + stats["dropped_export_failed"] == stats["finished"]
    )
    assert stats["queued"] == 0
    assert stats["exported"] == len(spans) == len({s["spanId"] for s in spans})
