"""Every way a training process ends: finished spans are exported, open spans end as interrupted.

Each scenario runs a small child process that calls ``gymtrace.configure(file=...)`` (the
embedded-default OTLP/JSON-lines exporter) and records the ID of every span that ends (a
processor appending to a second file with ``os.write``, so it survives any ending). The test reads
the trace file back (with the tests' own OTLP/JSON reader, tests/support/otlp_lines.py) and checks:

- every span that ended is in the file, once;
- the spans that were still open when the process stopped are in the file, marked
  ``gym.interrupted=true``;
- the exit status is the one the same script has without gymtrace (run again with
  ``configure()`` skipped, so the scopes are no-ops).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest

from child_process import clean_env, wrote
from otlp_lines import SpanData, read_otlp_json_lines

TIMEOUT = 60

PRELUDE = textwrap.dedent(
    """
    import os, signal, sys, threading, time
    from pathlib import Path
    import gymtrace
    from opentelemetry import trace

    TRACES, IDS, READY = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    # Python's own SIGINT handler, as a program started from a terminal has: one started from a
    # background job of a non-interactive shell (a CI runner's `cmd &`) inherits SIGINT ignored,
    # and Ctrl-C's usual effect is what these scenarios compare.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    TRACING = os.environ.get("ENDINGS_NO_GYMTRACE") != "1"

    class Recorder:
        def __init__(self, path):
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        def on_start(self, span, parent_context=None): pass
        def _on_ending(self, span): pass
        def on_end(self, span):
            os.write(self.fd, f"{span.context.span_id:016x}\\n".encode())
        def shutdown(self): pass
        def force_flush(self, timeout_millis=30000): return True

    def setup():
        if TRACING:
            gymtrace.configure(service_name="endings", file=TRACES)
            trace.get_tracer_provider().add_span_processor(Recorder(IDS))

    def finished_rollouts(run_id, n=2):
        for i in range(n):
            with gymtrace.rollout(rollout_id=f"{run_id}-{i}", task_id="t", repeat=0):
                with gymtrace.episode():
                    with gymtrace.step():
                        pass

    def open_rollout_in_thread(rollout_id):
        # A rollout still running in another thread when the process ends.
        started = threading.Event()
        def body():
            with gymtrace.rollout(rollout_id=rollout_id, task_id="t", repeat=0):
                with gymtrace.episode():
                    started.set()
                    time.sleep(600)
        threading.Thread(target=body, daemon=True).start()
        started.wait(10)

    def hang_in_rollout(run_id):
        with gymtrace.run(run_id=run_id):
            finished_rollouts(run_id)
            with gymtrace.rollout(rollout_id=f"{run_id}-open", task_id="t", repeat=0):
                with gymtrace.episode():
                    READY.write_text("ready")
                    # Short sleeps: the signal's handler runs between bytecodes, so one long
                    # sleep entered just after the signal arrived would hold it back.
                    while True:
                        time.sleep(0.05)
    """
)

SCENARIOS = {
    "normal_exit": """
        setup()
        gymtrace.run(run_id="normal").__enter__()   # a run nobody ends
        finished_rollouts("normal")
        open_rollout_in_thread("normal-open")
    """,
    "sys_exit": """
        setup()
        open_rollout_in_thread("exit-open")
        with gymtrace.run(run_id="exit"):
            finished_rollouts("exit")
            with gymtrace.rollout(rollout_id="exit-last", task_id="t", repeat=0):
                sys.exit(3)
    """,
    "unhandled_exception": """
        setup()
        open_rollout_in_thread("exc-open")
        with gymtrace.run(run_id="exc"):
            finished_rollouts("exc")
            with gymtrace.rollout(rollout_id="exc-last", task_id="t", repeat=0):
                raise RuntimeError("the training loop crashed")
    """,
    "sigterm": """
        setup()
        hang_in_rollout("term")
    """,
    "sigterm_user_handler": """
        def on_term(signum, frame):
            Path(str(READY) + ".handler").write_text("ran")
            sys.exit(143)
        signal.signal(signal.SIGTERM, on_term)   # before configure(): it must still run
        setup()
        hang_in_rollout("termh")
    """,
    "sigint": """
        setup()
        hang_in_rollout("int")
    """,
    "multiprocessing_fork": """
        import multiprocessing
        def work():
            finished_rollouts("mp-child")
            gymtrace.rollout(rollout_id="mp-child-open", task_id="t", repeat=0).__enter__()
            # returns: multiprocessing leaves the child through os._exit
        setup()
        with gymtrace.run(run_id="mp"):
            finished_rollouts("mp-parent")
            p = multiprocessing.get_context("fork").Process(target=work)
            p.start()
            p.join(30)
            assert p.exitcode == 0, p.exitcode
    """,
    "multiprocessing_worker_configures_itself": """
        import multiprocessing
        def work():
            setup()  # the parent does not trace: the worker configures gymtrace itself
            finished_rollouts("own")
            gymtrace.rollout(rollout_id="own-open", task_id="t", repeat=0).__enter__()
            # returns: multiprocessing leaves the child through os._exit
        p = multiprocessing.get_context("fork").Process(target=work)
        p.start()
        p.join(30)
        assert p.exitcode == 0, p.exitcode
    """,
    "raw_fork": """
        setup()
        finished_rollouts("fork-parent")
        pid = os.fork()
        if pid == 0:
            # A bare fork: no multiprocessing exit hooks. A normal exit runs the atexit hooks the
            # child inherited, which end its open scopes and flush.
            finished_rollouts("fork-child")
            gymtrace.rollout(rollout_id="fork-child-open", task_id="t", repeat=0).__enter__()
            sys.exit(7)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 7, status
    """,
    "raw_fork_os_exit": """
        setup()
        with gymtrace.run(run_id="fork"):
            finished_rollouts("fork-parent")
            pid = os.fork()
            if pid == 0:
                # The one ending gymtrace cannot see: a bare fork's child leaving through os._exit,
                # which runs no hook at all. The documented remedy: flush first.
                finished_rollouts("fork-child")
                gymtrace.force_flush()
                os._exit(7)
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 7, status
    """,
}


def run_child(
    tmp: Path,
    scenario: str,
    *,
    tracing: bool,
    stop: int | None = None,
    signalled: list[float] | None = None,
) -> tuple[int, str]:
    """Run ``scenario`` in a child; with ``stop``, send it that signal once it is ready (and, with
    ``signalled``, note when)."""
    script = tmp / f"{scenario}.py"
    script.write_text(PRELUDE + textwrap.dedent(SCENARIOS[scenario]))
    ready = tmp / f"ready-{tracing}"
    env = clean_env()
    env["GYMTRACE_FLUSH_TIMEOUT"] = "5"
    if not tracing:
        env["ENDINGS_NO_GYMTRACE"] = "1"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp / "traces.jsonl"), str(tmp / "ids.txt"), str(ready)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=tmp,
    )
    if stop is not None:
        deadline = time.monotonic() + TIMEOUT
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ready.exists(), proc.communicate(timeout=TIMEOUT)
        proc.send_signal(stop)
        if signalled is not None:
            signalled.append(time.monotonic())
    try:
        _, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError(f"{scenario}: child did not end within {TIMEOUT}s") from None
    return proc.returncode, err.decode(errors="replace")


def run_both(tmp: Path, scenario: str, stop: int | None = None) -> tuple[int, list[SpanData], str]:
    """Run the scenario without gymtrace, then with it; the exit statuses must match."""
    (tmp / "plain").mkdir()
    plain_code, plain_err = run_child(tmp / "plain", scenario, tracing=False, stop=stop)
    code, err = run_child(tmp, scenario, tracing=True, stop=stop)
    assert code == plain_code, (code, plain_code, err, plain_err)
    assert "gymtrace" not in err or "Traceback" not in err.split("gymtrace", 1)[1][:200], err
    spans = read_otlp_json_lines(tmp / "traces.jsonl") if wrote(tmp / "traces.jsonl") else []
    ended = [line for line in (tmp / "ids.txt").read_text().split()]
    exported = Counter(s.span_id for s in spans)
    duplicates = [i for i, n in exported.items() if n > 1]
    assert not duplicates, f"{scenario}: spans exported more than once: {duplicates}"
    missing = set(ended) - set(exported)
    assert not missing, f"{scenario}: {len(missing)} span(s) ended but not exported\n{err}"
    assert set(exported) == set(ended)
    return code, spans, err


def interrupted(spans: list[SpanData]) -> set[str]:
    """``kind:id`` of every span marked interrupted."""
    out = set()
    for s in spans:
        if s.attributes.get("gym.interrupted") is True:
            kind = s.attributes["gym.kind"]
            key = "gym.run.id" if kind == "run" else "gym.rollout.id"
            out.add(f"{kind}:{s.attributes.get(key)}")
    return out


def names(spans: list[SpanData]) -> Counter[str]:
    return Counter(s.name for s in spans)


def test_normal_exit_ends_the_open_run_and_thread_rollout_as_interrupted(tmp_path: Path) -> None:
    code, spans, _ = run_both(tmp_path, "normal_exit")
    assert code == 0
    assert interrupted(spans) >= {"run:normal", "rollout:normal-open", "episode:normal-open"}
    assert names(spans)["gym.rollout"] == 3


def test_sys_exit_keeps_its_status_and_exports_everything(tmp_path: Path) -> None:
    code, spans, _ = run_both(tmp_path, "sys_exit")
    assert code == 3
    # SystemExit unwinds the main thread's scopes; the other thread's rollout is ended at exit.
    assert interrupted(spans) >= {"run:exit", "rollout:exit-last", "rollout:exit-open"}
    assert names(spans)["gym.rollout"] == 4


def test_unhandled_exception_records_the_error_and_exports_everything(tmp_path: Path) -> None:
    code, spans, err = run_both(tmp_path, "unhandled_exception")
    assert code == 1 and "the training loop crashed" in err
    last = next(s for s in spans if s.attributes.get("gym.rollout.id") == "exc-last")
    assert last.status == "ERROR"
    assert interrupted(spans) >= {"rollout:exc-open", "episode:exc-open"}


def test_sigterm_with_the_default_handler_dies_of_sigterm_after_exporting(tmp_path: Path) -> None:
    code, spans, _ = run_both(tmp_path, "sigterm", stop=signal.SIGTERM)
    assert code == -signal.SIGTERM
    assert interrupted(spans) == {"run:term", "rollout:term-open", "episode:term-open"}
    assert names(spans)["gym.step"] == 2  # the finished rollouts' steps


def test_sigterm_runs_a_handler_installed_before_configure(tmp_path: Path) -> None:
    code, spans, _ = run_both(tmp_path, "sigterm_user_handler", stop=signal.SIGTERM)
    assert code == 143
    assert (tmp_path / "ready-True.handler").read_text() == "ran"
    assert interrupted(spans) == {"run:termh", "rollout:termh-open", "episode:termh-open"}


def test_sigint_unwinds_marks_interrupted_and_keeps_the_status(tmp_path: Path) -> None:
    code, spans, _ = run_both(tmp_path, "sigint", stop=signal.SIGINT)
    assert code == -signal.SIGINT
    assert interrupted(spans) == {"run:int", "rollout:int-open", "episode:int-open"}


def test_multiprocessing_fork_worker_exports_before_os_exit(tmp_path: Path) -> None:
    code, spans, _ = run_both(tmp_path, "multiprocessing_fork")
    assert code == 0
    rollouts = Counter(s.attributes.get("gym.rollout.id") for s in spans if s.name == "gym.rollout")
    assert rollouts == Counter(
        {"mp-parent-0": 1, "mp-parent-1": 1, "mp-child-0": 1, "mp-child-1": 1, "mp-child-open": 1}
    )
    # The child ends only its own open rollout; the parent's run is the parent's (exported once).
    assert interrupted(spans) == {"rollout:mp-child-open"}
    assert names(spans)["gym.run"] == 1


def test_a_multiprocessing_worker_that_configures_itself_exports_before_os_exit(tmp_path: Path) -> None:
    code, spans, _ = run_both(tmp_path, "multiprocessing_worker_configures_itself")
    assert code == 0
    rollouts = Counter(s.attributes.get("gym.rollout.id") for s in spans if s.name == "gym.rollout")
    assert rollouts == Counter({"own-0": 1, "own-1": 1, "own-open": 1})
    assert interrupted(spans) == {"rollout:own-open"}


def test_raw_fork_child_exiting_normally_exports_its_spans(tmp_path: Path) -> None:
    code, spans, _ = run_both(tmp_path, "raw_fork")
    assert code == 0
    rollouts = Counter(s.attributes.get("gym.rollout.id") for s in spans if s.name == "gym.rollout")
    assert rollouts == Counter(
        {"fork-parent-0": 1, "fork-parent-1": 1, "fork-child-0": 1, "fork-child-1": 1, "fork-child-open": 1}
    )
    assert interrupted(spans) == {"rollout:fork-child-open"}


def test_raw_fork_child_that_flushes_before_os_exit_exports_its_spans(tmp_path: Path) -> None:
    code, spans, _ = run_both(tmp_path, "raw_fork_os_exit")
    assert code == 0
    rollouts = {s.attributes.get("gym.rollout.id") for s in spans if s.name == "gym.rollout"}
    assert {"fork-child-0", "fork-child-1", "fork-parent-0", "fork-parent-1"} <= rollouts
    assert names(spans)["gym.run"] == 1


@pytest.mark.parametrize("scenario", ["sigterm"])
def test_flush_at_sigterm_is_bounded(tmp_path: Path, scenario: str) -> None:
    # From the signal, not the start: the child's start-up on a loaded machine is no part of it.
    signalled: list[float] = []
    run_child(tmp_path, scenario, tracing=True, stop=signal.SIGTERM, signalled=signalled)
    assert time.monotonic() - signalled[0] < 5 + 10  # flush timeout + interpreter teardown
