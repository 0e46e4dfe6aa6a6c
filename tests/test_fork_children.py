"""Forked children without process-wide patching: ``os._exit`` stays the standard library's, and a
child's spans still arrive through multiprocessing's own exit hooks, with gymtrace's locks new in
the child. Real ``fork`` children, real files, real sockets."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest

from child_process import run_python, wrote
from gymtrace._model.spandata import read_otlp_json_lines


def _rollouts(path: Path) -> Counter[str]:
    spans = read_otlp_json_lines(path) if wrote(path) else []
    return Counter(str(s.attributes.get("gym.rollout.id")) for s in spans if s.name == "gym.rollout")


def test_os_exit_is_the_standard_librarys_after_configure_and_in_forked_children(tmp_path: Path) -> None:
    traces = tmp_path / "traces.jsonl"
    result = run_python(
        code=f"""
        import multiprocessing, os, posix, signal, sys, warnings
        import gymtrace

        # Python 3.12+ warns on every fork of a process with threads (gymtrace's export worker is
        # one); what this test reads on stderr is anything gymtrace itself says.
        warnings.filterwarnings("ignore", ".*multi-threaded.*fork", DeprecationWarning)

        def same():
            return os._exit is posix._exit

        def child(queue):
            queue.put(("multiprocessing child", same()))
            with gymtrace.rollout(rollout_id="mp-child", task_id="t"):
                pass

        gymtrace.configure(service_name="forks", file={str(traces)!r})
        print("after configure", same())
        queue = multiprocessing.get_context("fork").SimpleQueue()
        p = multiprocessing.get_context("fork").Process(target=child, args=(queue,))
        p.start()
        p.join(30)
        print(*queue.get())
        print("multiprocessing exit code", p.exitcode)
        pid = os.fork()
        if pid == 0:
            os.write(1, f"bare fork child {{same()}}\\n".encode())
            os._exit(0)
        os.waitpid(pid, 0)
        print("after the fork", same())
        """,
        check=True,
        timeout=120,
    )
    lines = result.stdout.splitlines()
    assert "after configure True" in lines
    assert "multiprocessing child True" in lines
    assert "bare fork child True" in lines
    assert "after the fork True" in lines
    assert "multiprocessing exit code 0" in lines
    # Without any patching, the multiprocessing child's span still arrived (its exit is os._exit).
    assert _rollouts(traces) == Counter({"mp-child": 1})
    assert result.stderr == ""


def test_a_child_forked_while_the_file_exporter_writes_exits_at_once_with_its_spans(tmp_path: Path) -> None:
    # The file exporter's lock held by the parent's export worker at the fork used to stay held in
    # the child forever: its exit flush waited out GYMTRACE_FLUSH_TIMEOUT (5 s) and lost its spans.
    # Here the parent holds that lock itself across the fork, which is the same state, every time.
    traces = tmp_path / "traces.jsonl"
    result = run_python(
        code=f"""
        import multiprocessing, time
        import gymtrace
        from gymtrace._sdk import setup as _setup

        def child():
            for i in range(3):
                with gymtrace.rollout(rollout_id=f"child-{{i}}", task_id="t"):
                    pass

        gymtrace.configure(service_name="forks", file={str(traces)!r})
        for i in range(1500):
            with gymtrace.rollout(rollout_id=f"parent-{{i}}", task_id="t"):
                pass
        gymtrace.force_flush()
        [queue] = _setup._state.stage.processors()
        exporter = getattr(queue, "exporter", None) or queue._queue.exporter
        with exporter._lock:
            p = multiprocessing.get_context("fork").Process(target=child)
            started = time.monotonic()
            p.start()
        p.join(30)
        print("child exit", p.exitcode, round(time.monotonic() - started, 2))
        """,
        env={"GYMTRACE_FLUSH_TIMEOUT": "5", "GYMTRACE_ENCODER": "thread"},
        check=True,
        timeout=120,
    )
    [line] = [line for line in result.stdout.splitlines() if line.startswith("child exit")]
    _, _, code, seconds = line.split()
    assert code == "0"
    assert float(seconds) < 4.0, result.stdout  # far below the 5 s timeout it used to wait out
    rollouts = _rollouts(traces)
    assert {rollouts[f"child-{i}"] for i in range(3)} == {1}
    assert sum(n for r, n in rollouts.items() if r.startswith("parent-")) == 1500


def test_a_child_whose_exit_flush_times_out_says_so_once(tmp_path: Path) -> None:
    # A Collector that accepts the connection and never answers: the child's exit flush cannot
    # finish within GYMTRACE_FLUSH_TIMEOUT, and that is reported, once, on the gymtrace logger.
    started = time.monotonic()
    result = run_python(
        code="""
        import logging, multiprocessing, socket
        import gymtrace

        logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")
        silent = socket.socket()
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)   # accepted by the kernel, never read or answered
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"

        def child():
            for i in range(5):
                with gymtrace.rollout(rollout_id=f"child-{i}", task_id="t"):
                    pass

        gymtrace.configure(service_name="forks", endpoint=endpoint, protocol="http/protobuf", file=False)
        p = multiprocessing.get_context("fork").Process(target=child)
        p.start()
        p.join(60)
        print("child exit", p.exitcode)
        """,
        env={"GYMTRACE_FLUSH_TIMEOUT": "0.5", "GYMTRACE_ENCODER": "thread"},
        timeout=120,
    )
    assert "child exit 0" in result.stdout, result.stderr
    reports = [line for line in result.stderr.splitlines() if "exit flush did not finish" in line]
    assert len(reports) == 1, result.stderr
    assert reports[0].startswith("gymtrace WARNING")
    assert time.monotonic() - started < 60


@pytest.mark.parametrize("encoder", ["thread", "auto", "process"])
def test_a_bare_fork_child_that_leaves_through_os_exit_keeps_the_rollouts_it_finished(
    tmp_path: Path, encoder: str
) -> None:
    # The usual end of an os.fork() child is os._exit(), which runs no exit hook: before, its
    # rollouts were still in the queue (the worker exports every 500 ms) and were lost, silently.
    # Now each one is exported as it ends; only a rollout still open at os._exit is lost.
    traces = tmp_path / "traces.jsonl"
    result = run_python(
        code=f"""
        import multiprocessing, os, warnings
        import gymtrace
        from gymtrace._sdk import setup as _setup

        warnings.filterwarnings("ignore", ".*multi-threaded.*fork", DeprecationWarning)
        gymtrace.configure(service_name="forks", file={str(traces)!r}, encoder={encoder!r})
        with gymtrace.rollout(rollout_id="parent", task_id="t"):
            pass

        def mp_child(queue):
            queue.put(getattr(_setup._state.stage, "_flush_rollouts", None))

        queue = multiprocessing.get_context("fork").SimpleQueue()
        p = multiprocessing.get_context("fork").Process(target=mp_child, args=(queue,))
        p.start()
        p.join(30)
        print("multiprocessing child flushes per rollout", queue.get())
        pid = os.fork()
        if pid == 0:
            for i in range(3):
                with gymtrace.rollout(rollout_id=f"child-{{i}}", task_id="t"), gymtrace.episode():
                    for _ in range(5):
                        with gymtrace.step():
                            pass
            os._exit(0)
        os.waitpid(pid, 0)
        print("parent flushes per rollout", getattr(_setup._state.stage, "_flush_rollouts", None))
        """,
        check=True,
        timeout=120,
    )
    assert _rollouts(traces) == Counter({"parent": 1, "child-0": 1, "child-1": 1, "child-2": 1})
    steps = [s for s in read_otlp_json_lines(traces) if s.name == "gym.step"]
    assert len(steps) == 15
    # Only the bare fork's child pays for a flush per rollout: a multiprocessing child flushes at
    # its exit, and the parent's binding is unchanged.
    lines = result.stdout.splitlines()
    assert "multiprocessing child flushes per rollout False" in lines
    assert "parent flushes per rollout False" in lines


def test_a_fork_hook_that_fails_is_logged_and_the_hooks_after_it_still_run() -> None:
    out = run_python(
        code="""
import logging, os
from gymtrace._model import forks
ran = []
def fails():
    raise RuntimeError("a hook that fails")
forks.in_child(fails)
forks.in_child(lambda: ran.append("after"))
logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
pid = os.fork()
if pid == 0:
    print("child ran", ran, flush=True)
    os._exit(0)
os.waitpid(pid, 0)
print("parent ran", ran, flush=True)
"""
    )
    assert out.returncode == 0, out.stderr
    assert "child ran ['after']" in out.stdout and "parent ran []" in out.stdout
    assert "a hook that fails" in out.stderr
