"""Fault injection against the real Collector and Jaeger: every span is delivered or counted.

Each scenario runs a training-loop stand-in (``tests/support/fault_worker.py``) in its own subprocess,
exporting over OTLP/gRPC to a real Collector (``collector/otelcol.yaml`` with tail sampling at 100 %)
in front of a real Jaeger, and injects a fault between the worker's phases: the Collector not up
yet, killed (SIGKILL) and started again, stalled (SIGSTOP) with a small queue, dead at exit, and
the worker itself stopped by SIGTERM. Then it counts:

- **finished**: spans the worker's export queue accepted (``gymtrace.export_stats()``), checked
  against the span IDs a recording processor saw end;
- **received**: DISTINCT span IDs Jaeger stores for the worker's service (a batch retried after a
  timeout may arrive twice);
- **dropped**: what the queue reports it dropped;

and asserts ``received + dropped == finished`` (a stalled Collector may still take in a request
that timed out, whose spans were counted dropped: there, at least ``finished``, see
``assert_accounted``) and that Jaeger holds no span that did not finish.

The Collector is killed only after Jaeger holds everything exported so far: spans the Collector
acknowledged and then lost in its own memory (tail sampling holds them ``decision_wait``) are
beyond what any client can count, and are not what this suite measures.

Every scenario runs three times: export on a thread of the worker (``GYMTRACE_ENCODER=thread``),
in an encoder process (``process``), and with the default ``auto`` moving from the first to the
second after the worker's first rollout, so the fault meets spans on both paths at once.

Bounded: workloads are fixed counts, every wait and subprocess has a timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from child_process import clean_env
from gymtrace._sdk.export import _ROOM_WAIT
from gymtrace._sdk.export_auto import _cpus
from pipeline import JAEGER_BIN, Pipeline, PipelineError, span_tags

WORKER = Path(__file__).resolve().parents[1] / "support" / "fault_worker.py"
SPANS_PER_ROLLOUT = 9
WORKER_TIMEOUT = 120.0
JAEGER_WAIT = 30.0


@pytest.fixture(scope="module")
def pipe(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    """This module's own pipeline: tail sampling keeps 100 %, so every span should reach Jaeger."""
    if os.environ.get("GYMTRACE_SKIP_E2E", "") not in ("", "0"):
        pytest.skip("GYMTRACE_SKIP_E2E is set: end-to-end tests skipped on request")
    if not JAEGER_BIN.is_file():
        pytest.fail(f"{JAEGER_BIN} is missing: run `collector/build` (or set GYMTRACE_SKIP_E2E=1)")
    p = Pipeline(decision_wait="1s", sample_percent=100, workdir=tmp_path_factory.mktemp("faults"))
    p.start()
    try:
        yield p
    finally:
        p.stop()


@pytest.fixture(params=["thread", "process", "auto"])
def encoder(request: pytest.FixtureRequest) -> str:
    """Every scenario with the export queue on a thread of the worker, in an encoder process, and
    with the default (``auto``) moving from the one to the other after the first rollout."""
    if request.param == "auto" and _cpus() < 2:
        pytest.skip("auto never moves with one CPU (tests/test_export_auto.py covers that)")
    return str(request.param)


@pytest.fixture
def pipeline_ok(pipe: Pipeline) -> Iterator[Pipeline]:
    """Every test leaves the Collector running and not stalled, whatever it did to it."""
    yield pipe
    with contextlib.suppress(PipelineError):  # not running
        pipe.resume_collector()
    if not pipe.collector_running:
        pipe.start_collector()


class Worker:
    """One ``fault_worker.py`` subprocess and its control directory."""

    def __init__(
        self,
        tmp: Path,
        endpoint: str,
        *,
        phases: str,
        env: dict[str, str] | None = None,
        extra: tuple[str, ...] = (),
        encoder: str = "thread",
    ):
        self.service = f"faults-{uuid.uuid4().hex[:10]}"
        self.control = tmp / "control"
        self.control.mkdir()
        self.ids = tmp / "ids.txt"
        self.stdout = tmp / "stdout.txt"
        self.stderr = tmp / "stderr.txt"
        full_env = clean_env(**(env or {}), GYMTRACE_ENCODER=encoder)
        self.moves = encoder == "auto"
        if self.moves:
            extra = (*extra, "--move-at-once")
        with open(self.stdout, "wb") as out, open(self.stderr, "wb") as err:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    str(WORKER),
                    "--service",
                    self.service,
                    "--endpoint",
                    endpoint,
                    "--phases",
                    phases,
                    "--control",
                    str(self.control),
                    "--ids",
                    str(self.ids),
                    *extra,
                ],
                stdout=out,
                stderr=err,
                env=full_env,
                cwd=tmp,
            )

    def wait_file(self, name: str, timeout: float = WORKER_TIMEOUT) -> Path:
        path = self.control / name
        deadline = time.monotonic() + timeout
        while not path.exists():
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited {self.proc.returncode} before {name}:\n{self.logs()}")
            if time.monotonic() > deadline:
                self.proc.kill()
                raise AssertionError(f"worker did not write {name} within {timeout}s:\n{self.logs()}")
            time.sleep(0.05)
        return path

    def wait_phase(self, phase: int) -> dict[str, Any]:
        state: dict[str, Any] = json.loads(self.wait_file(f"phase-{phase}.json").read_text())
        self.assert_moved(state)
        return state

    def assert_moved(self, state: dict[str, Any]) -> None:
        """Under auto the export moved after the first rollout, and stays moved."""
        if self.moves:
            assert state["encoders"] == ["process"], (state, self.logs())

    def go(self, phase: int) -> None:
        (self.control / f"go-{phase}").write_text("")

    def look_until(
        self, phase: int, counts: dict[str, Any], done: Callable[[dict[str, Any]], bool]
    ) -> dict[str, Any]:
        """After ``phase`` (``counts`` its export stats), run the LOOKS phases of no rollouts that
        follow it, ~1 s apart, until ``done(counts)``; the last counts. The looks not needed are
        released too, so ``go(phase + LOOKS)`` starts the phase of rollouts after them."""
        looked = 0
        while not done(counts) and looked < LOOKS:
            time.sleep(1)
            self.go(phase + looked)
            looked += 1
            counts = self.wait_phase(phase + looked)["stats"][0]
        for rest in range(phase + looked, phase + LOOKS):
            self.go(rest)
        return counts

    def finish(self, timeout: float = WORKER_TIMEOUT) -> dict[str, Any]:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError(f"worker did not finish within {timeout}s:\n{self.logs()}") from None
        assert self.proc.returncode == 0, f"worker exited {self.proc.returncode}:\n{self.logs()}"
        result: dict[str, Any] = json.loads(self.stdout.read_text().strip().splitlines()[-1])
        self.assert_moved(result)
        # (d) tracing never made user code raise, whatever the Collector did.
        assert result["user_errors"] == 0, self.logs()
        return result

    def finished_ids(self) -> set[int]:
        return {int(line, 16) for line in self.ids.read_text().split()}

    def logs(self) -> str:
        return f"--- stdout\n{self.stdout.read_text()[-3000:]}\n--- stderr\n{self.stderr.read_text()[-6000:]}"


def received_spans(p: Pipeline, service: str) -> dict[int, dict[str, Any]]:
    """Every span Jaeger stores for ``service``, by span ID (duplicates collapse)."""
    spans: dict[int, dict[str, Any]] = {}
    for trace in p.find_traces(service, limit=100_000):
        for span in trace.get("spans", []):
            spans[int(span["spanID"], 16)] = span
    return spans


def wait_received(
    p: Pipeline, service: str, at_least: int, timeout: float = JAEGER_WAIT
) -> dict[int, dict[str, Any]]:
    """Poll Jaeger until it holds ``at_least`` distinct spans of ``service``, then let late
    arrivals settle (so a duplicate or an unexpected span would be seen too)."""
    deadline = time.monotonic() + timeout
    while True:
        spans = received_spans(p, service)
        if len(spans) >= at_least or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    time.sleep(1.5)  # > decision_wait: anything still in the Collector arrives
    return received_spans(p, service)


def only_stats(result: dict[str, Any]) -> dict[str, Any]:
    (stats,) = result["stats"]
    assert stats["exporter"] == "otlp"
    return dict(stats)


def assert_accounted(
    p: Pipeline, worker: Worker, result: dict[str, Any], *, late: bool = False
) -> dict[str, Any]:
    """received + dropped == finished, and nothing received that did not finish.

    ``late``: the Collector was stalled (SIGSTOP), not killed. A request that timed out at the
    worker was still in the Collector's socket, and on SIGCONT its server may take it in (it times
    the request from when it reads it): those spans were counted dropped, since the worker cannot
    know, and arrive too. Then every span counted exported must arrive, and received + dropped may
    exceed finished (loss over-counted), never fall short of it (loss uncounted). Seen beside CPU
    hogs: 90 of 140 spans counted dropped arrived so."""
    stats = only_stats(result)
    finished_ids = worker.finished_ids()
    assert stats["queued"] == 0, stats
    assert len(finished_ids) == stats["finished"], (len(finished_ids), stats)
    dropped = stats["dropped_queue_full"] + stats["dropped_export_failed"]
    received = wait_received(p, worker.service, stats["finished"] - dropped)
    strangers = set(received) - finished_ids
    assert not strangers, f"{len(strangers)} span(s) in Jaeger that never finished"
    if late:
        assert stats["exported"] + dropped == stats["finished"], stats  # the books
        assert len(received) >= stats["exported"], (
            f"received {len(received)} < exported {stats['exported']} (dropped {dropped}); {stats}\n"
            f"{worker.logs()}\n{p.logs(20)}"
        )
    else:
        assert len(received) + dropped == stats["finished"], (
            f"received {len(received)} + dropped {dropped} != finished {stats['finished']}; {stats}\n"
            f"{worker.logs()}\n{p.logs(20)}"
        )
    stats["received"] = len(received)
    return stats


def wait_drained(p: Pipeline, worker: Worker, phase_state: dict[str, Any]) -> None:
    """Wait until Jaeger holds every span finished so far, so the Collector holds nothing."""
    finished = phase_state["stats"][0]["finished"]
    received = wait_received(p, worker.service, finished)
    assert len(received) == finished, (len(received), phase_state)


# How often a fault test reads the worker's counts while the Collector is down or stalled.
LOOKS = 10


def test_collector_not_up_at_start_gets_everything_once_it_starts(
    pipeline_ok: Pipeline, tmp_path: Path, encoder: str
) -> None:
    p = pipeline_ok
    p.kill_collector()
    # ~2 s of rollouts before the Collector is up: the queue tries (and fails) several times.
    worker = Worker(
        tmp_path,
        p.otlp_grpc_endpoint,
        phases="15" + ",0" * LOOKS + ",15",  # phases of no rollouts report the counts so far
        env={"OTEL_EXPORTER_OTLP_TIMEOUT": "1"},
        extra=("--pace", "0.12"),
        encoder=encoder,
    )
    early = worker.wait_phase(0)["stats"][0]
    assert early["exported"] == 0 and early["finished"] == 15 * SPANS_PER_ROLLOUT, early
    # Down until an export has failed and waits to be retried: on a loaded machine the first
    # attempt can come after the ~2 s of rollouts (a CI run started the Collector before it).
    early = worker.look_until(0, early, lambda counts: counts["retries"] > 0)
    assert early["retries"] > 0 and early["exported"] == 0, early
    p.start_collector()
    worker.go(LOOKS)
    result = worker.finish()
    stats = assert_accounted(p, worker, result)
    assert stats["dropped_queue_full"] == stats["dropped_export_failed"] == 0, stats
    assert stats["received"] == 30 * SPANS_PER_ROLLOUT + 1  # + the run span
    assert stats["retries"] > 0, stats


def test_collector_killed_mid_run_and_restarted_loses_nothing_that_fit(
    pipeline_ok: Pipeline, tmp_path: Path, encoder: str
) -> None:
    p = pipeline_ok
    worker = Worker(
        tmp_path,
        p.otlp_grpc_endpoint,
        # Phases of no rollouts between the two halves: each reports the counts so far.
        phases="15,15" + ",0" * LOOKS + ",15",
        env={"OTEL_EXPORTER_OTLP_TIMEOUT": "1"},
        encoder=encoder,
    )
    wait_drained(p, worker, worker.wait_phase(0))
    p.kill_collector()
    worker.go(0)
    during = worker.wait_phase(1)["stats"][0]
    assert during["exported"] == 15 * SPANS_PER_ROLLOUT, during  # nothing got through while it was dead
    # Dead until an export has failed and waits to be retried. A fixed 1.5 s was not always enough
    # on a loaded machine: the Collector was back before the first attempt, and nothing retried.
    during = worker.look_until(1, during, lambda counts: counts["retries"] > 0)
    assert during["retries"] > 0, during
    p.start_collector()
    worker.go(LOOKS + 1)
    result = worker.finish()
    stats = assert_accounted(p, worker, result)
    assert stats["dropped_queue_full"] == stats["dropped_export_failed"] == 0, stats
    assert stats["received"] == 45 * SPANS_PER_ROLLOUT + 1
    assert stats["retries"] > 0, stats


def test_stalled_collector_with_a_small_queue_drops_are_counted(
    pipeline_ok: Pipeline, tmp_path: Path, encoder: str
) -> None:
    p = pipeline_ok
    worker = Worker(
        tmp_path,
        p.otlp_grpc_endpoint,
        # Phases of no span read the counts later on (see below), then the last 10 rollouts.
        phases="10,60" + ",0" * LOOKS + ",10",
        env={"OTEL_BSP_MAX_QUEUE_SIZE": "200", "OTEL_EXPORTER_OTLP_TIMEOUT": "1"},
        encoder=encoder,
    )
    wait_drained(p, worker, worker.wait_phase(0))
    p.stall_collector()
    try:
        worker.go(0)
        during = worker.wait_phase(1)["stats"][0]
        # A full queue holds the caller while an export is in flight (issue 47) until it fails at
        # its 1 s timeout; then the oldest spans go, counted. In an encoder process that happens
        # once it has read the phase from its pipe, which a loaded machine delays: look again
        # every 2 s, still stalled.
        for look in range(1, LOOKS + 1):
            if during["dropped_queue_full"]:
                worker.go(look)
                worker.wait_phase(look + 1)
                continue
            time.sleep(2)
            worker.go(look)
            during = worker.wait_phase(look + 1)["stats"][0]
    finally:
        p.resume_collector()
    assert during["dropped_queue_full"] > 0, during
    worker.go(LOOKS + 1)
    result = worker.finish()
    stats = assert_accounted(p, worker, result, late=True)
    assert stats["dropped_queue_full"] > 0, stats
    # A stalled Collector holds a rollout (~3 ms of work) once, no longer than the export's timeout
    # and never past the room wait: not a wait per span (tests/test_export_queue.py counts them).
    assert result["max_rollout_seconds"] < _ROOM_WAIT + 1.0, result


def test_sigterm_mid_rollout_delivers_finished_and_interrupted_spans(
    pipeline_ok: Pipeline, tmp_path: Path, encoder: str
) -> None:
    p = pipeline_ok
    worker = Worker(tmp_path, p.otlp_grpc_endpoint, phases="5", extra=("--hang",), encoder=encoder)
    worker.wait_phase(0)
    worker.go(0)
    worker.wait_file("hanging")
    worker.proc.send_signal(signal.SIGTERM)
    try:
        code = worker.proc.wait(20)
    except subprocess.TimeoutExpired:
        worker.proc.kill()
        raise AssertionError("worker did not die of SIGTERM") from None
    assert code == -signal.SIGTERM, worker.logs()
    finished = worker.finished_ids()
    # 5 rollouts + the hung run, rollout, episode, agent invocation and step, ended as interrupted.
    assert len(finished) == 5 * SPANS_PER_ROLLOUT + 5
    received = wait_received(p, worker.service, len(finished))
    assert set(received) == finished, worker.logs()
    interrupted = {
        s["operationName"] for s in received.values() if span_tags(s).get("gym.interrupted") is True
    }
    assert {"gym.run", "gym.rollout", "gym.episode", "gym.step", "invoke_agent worker"} <= interrupted


def test_dead_collector_at_exit_leaves_within_flush_timeout_and_logs_drops(
    pipeline_ok: Pipeline, tmp_path: Path, encoder: str
) -> None:
    p = pipeline_ok
    p.kill_collector()
    flush_timeout = 2.0
    worker = Worker(
        tmp_path,
        p.otlp_grpc_endpoint,
        phases="10",
        env={"GYMTRACE_FLUSH_TIMEOUT": str(flush_timeout), "OTEL_EXPORTER_OTLP_TIMEOUT": "1"},
        extra=("--final-flush", "0"),
        encoder=encoder,
    )
    result = worker.finish()
    exit_seconds = time.time() - result["main_returned_at"]
    # A bound, not a speed: the flush timeout, the exporter's shutdown and the interpreter's
    # teardown, with room for a loaded 2-core machine (CI measured 4.5 s for this 2 s timeout).
    # Unbounded, the exporter's retries against the dead Collector keep the process ~60 s.
    assert exit_seconds < flush_timeout + 8.0, (exit_seconds, worker.logs())
    finished = 10 * SPANS_PER_ROLLOUT + 1
    match = re.search(r"exported (\d+) of (\d+) spans; dropped (\d+)", worker.stderr.read_text())
    assert match, worker.logs()
    assert [int(g) for g in match.groups()] == [0, finished, finished], worker.logs()
