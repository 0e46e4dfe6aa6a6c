"""The export queue (``_sdk.export.BatchExporter``, private), driven directly to check its books.

It runs against real exporter stand-ins.

The stand-ins are real :class:`~opentelemetry.sdk.trace.export.SpanExporter` objects (one that
fails N times then succeeds, one that blocks until released, one that raises), fed real SDK spans
from a private ``TracerProvider``. Every test checks the books: ``finished == exported + dropped +
queued``.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

from child_process import run_python, trace_lines
from gymtrace._model import settings as _settings
from gymtrace._model.spandata import read_otlp_json_lines
from gymtrace._sdk import export as _export
from gymtrace._sdk import otlp as _otlp
from gymtrace._sdk import setup as _setup
from gymtrace._sdk.export import BatchExporter, ExportStats
from gymtrace.testing import check_trace


class FlakyExporter(SpanExporter):
    """Fails the first ``failures`` exports (``FAILURE`` or, with ``raise_=True``, an exception)."""

    def __init__(self, failures: int = 0, *, raise_: bool = False) -> None:
        self.failures = failures
        self.raise_ = raise_
        self.calls = 0
        self.attempts: list[str] = []  # span names, every time a span was offered
        self.delivered: list[str] = []
        self.shut_down = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.calls += 1
        self.attempts.extend(s.name for s in spans)
        if self.calls <= self.failures:
            if self.raise_:
                raise ConnectionError("collector is restarting")
            return SpanExportResult.FAILURE
        self.delivered.extend(s.name for s in spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.shut_down = True


class BlockingExporter(SpanExporter):
    """Blocks in ``export`` until ``release`` is set (a Collector that accepts and never answers)."""

    def __init__(self, result: SpanExportResult = SpanExportResult.SUCCESS) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.result = result
        self.delivered: list[str] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.entered.set()
        self.release.wait(30)
        if self.result is SpanExportResult.SUCCESS:
            self.delivered.extend(s.name for s in spans)
        return self.result

    def shutdown(self) -> None:
        return None


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_export, "_BACKOFF_START", 0.01)
    monkeypatch.setattr(_export, "_BACKOFF_MAX", 0.05)


@pytest.fixture
def processors() -> Iterator[list[BatchExporter]]:
    made: list[BatchExporter] = []
    yield made
    for p in made:
        p.shutdown(timeout_millis=100)


def make(
    processors: list[BatchExporter], exporter: SpanExporter, **kwargs: float
) -> tuple[BatchExporter, TracerProvider]:
    options = {"schedule_delay": 0.01, "shutdown_timeout": 1.0, **kwargs}
    bex = BatchExporter(
        exporter,
        name="test",
        max_queue_size=int(options.pop("max_queue_size", 100)),
        max_batch_size=int(options.pop("max_batch_size", 10)),
        max_drain=int(options.pop("max_drain", 0)) or None,
        **options,
    )
    processors.append(bex)
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(bex)  # type: ignore[arg-type]
    return bex, provider


# The worker wakes only for a full batch, never on its timer while a test is still ending the first
# one: tests that count what the queue holds beside the batch in flight need that batch whole (a CI
# run's worker woke mid-loop and took 3 of 5).
WHOLE = {"schedule_delay": 60.0}


def end_spans(provider: TracerProvider, names: Sequence[str]) -> None:
    tracer = provider.get_tracer("test")
    for name in names:
        tracer.start_span(name).end()


def balanced(stats: ExportStats) -> bool:
    return stats.finished == stats.exported + stats.dropped + stats.queued


def wait_until(predicate: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


def test_a_hung_exporter_holds_the_caller_once_then_the_oldest_are_dropped_counting_each(
    processors: list[BatchExporter],
) -> None:
    exporter = BlockingExporter()
    bex, provider = make(processors, exporter, max_queue_size=10, max_batch_size=5, max_wait=0.05, **WHOLE)
    end_spans(provider, [f"a{i}" for i in range(5)])
    assert exporter.entered.wait(5)  # the worker holds a-batch; the queue is empty
    end_spans(provider, [f"b{i}" for i in range(30)])
    assert bex._room.stalled  # the wait ran out: the queue drops until the exporter delivers
    stats = bex.stats()
    assert (stats.finished, stats.queued, stats.dropped_queue_full) == (35, 15, 20)
    assert balanced(stats)
    exporter.release.set()
    assert bex.force_flush(5000)
    assert exporter.delivered == [f"a{i}" for i in range(5)] + [f"b{i}" for i in range(20, 30)]
    stats = bex.stats()
    assert (stats.exported, stats.dropped, stats.queued) == (15, 20, 0)
    assert not bex._room.stalled  # delivered again: the next full queue waits again


def test_a_hung_exporter_costs_the_caller_one_wait_not_one_per_span(processors: list[BatchExporter]) -> None:
    exporter = BlockingExporter()
    bex, provider = make(processors, exporter, max_queue_size=10, max_batch_size=5, max_wait=0.2, **WHOLE)
    end_spans(provider, [f"a{i}" for i in range(5)])
    assert exporter.entered.wait(5)
    started = time.monotonic()
    end_spans(provider, [f"b{i}" for i in range(1010)])
    # A wait per span would be 1,000 x 0.2 s; one wait and then drops is 0.2 s and the loop.
    assert time.monotonic() - started < 60
    stats = bex.stats()
    assert stats.dropped_queue_full == 1000 and balanced(stats)
    exporter.release.set()
    assert bex.force_flush(5000)


class SlowExporter(SpanExporter):
    """Delivers every batch, each a little later (a Collector across a network, a busy disk)."""

    def __init__(self) -> None:
        self.delivered: list[str] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        time.sleep(0.002)
        self.delivered.extend(s.name for s in spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def test_a_burst_past_the_queue_waits_for_an_exporter_that_delivers_and_loses_nothing(
    processors: list[BatchExporter],
) -> None:
    exporter = SlowExporter()
    bex, provider = make(processors, exporter, max_queue_size=10, max_batch_size=5)
    names = [f"s{i}" for i in range(500)]
    end_spans(provider, names)  # 50 queues' worth, ended as fast as the loop goes, mostly mid-export
    assert bex.force_flush(5000)
    stats = bex.stats()
    assert (stats.exported, stats.dropped, stats.queued) == (500, 0, 0)
    assert exporter.delivered == names  # every span once, in order


def test_a_failing_exporter_never_holds_the_caller(processors: list[BatchExporter]) -> None:
    exporter = FlakyExporter(failures=10**9)
    bex, provider = make(processors, exporter, max_queue_size=10, max_batch_size=5, max_wait=600)
    end_spans(provider, ["first"])
    wait_until(lambda: bex.stats().retries >= 1)  # failing: backing off
    end_spans(provider, [f"s{i}" for i in range(200)])  # held for 600 s if it waited
    stats = bex.stats()
    assert stats.dropped_queue_full >= 190 and balanced(stats)


def test_a_refused_connection_never_holds_the_caller_while_the_sdk_retries_it(
    processors: list[BatchExporter],
) -> None:
    # A Collector that is down: gymtrace's OTLP/gRPC exporter is refused at once, and the SDK tries
    # again within the export's timeout (1 + 2 + 4 + 8 + 16 s here). The queue must drop meanwhile.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    exporter = _otlp.grpc_exporter(endpoint=f"127.0.0.1:{port}", insecure=True, timeout=60)
    bex, provider = make(processors, exporter, max_queue_size=10, max_batch_size=5, max_wait=600, **WHOLE)
    end_spans(provider, [f"a{i}" for i in range(5)])
    wait_until(lambda: exporter.attempt_failed)  # refused; the SDK waits to try again
    end_spans(provider, [f"b{i}" for i in range(100)])
    stats = bex.stats()
    # Held, the loop would have gone on only once the export failed for good (a retry counted).
    assert (stats.retries, stats.queued, stats.dropped_queue_full) == (0, 15, 90), stats
    assert balanced(stats) and not bex._room.stalled


def test_an_export_that_times_out_lets_the_held_caller_go_on_dropping_the_oldest(
    processors: list[BatchExporter],
) -> None:
    # A stalled Collector: the export in flight fails at its timeout, the caller held meanwhile
    # goes on at once (not at the end of its wait) and the oldest go, counted.
    exporter = BlockingExporter(result=SpanExportResult.FAILURE)
    bex, provider = make(processors, exporter, max_queue_size=10, max_batch_size=5, max_wait=600)
    end_spans(provider, [f"a{i}" for i in range(5)])
    assert exporter.entered.wait(5)
    threading.Timer(0.2, exporter.release.set).start()  # the export "times out"
    started = time.monotonic()
    end_spans(provider, [f"b{i}" for i in range(40)])  # held until then; 600 s if it waited on
    assert time.monotonic() - started < 60
    stats = bex.stats()
    assert stats.retries >= 1 and stats.dropped_queue_full > 0 and balanced(stats)
    assert not bex._room.stalled  # a failing exporter, not a stall: no wait ran out


def test_failed_batches_are_requeued_and_delivered_once_the_exporter_recovers(
    processors: list[BatchExporter],
) -> None:
    exporter = FlakyExporter(failures=3)
    bex, provider = make(processors, exporter)
    names = [f"s{i}" for i in range(25)]
    end_spans(provider, names)
    assert bex.force_flush(5000)
    stats = bex.stats()
    assert stats.retries == 3 and stats.dropped == 0 and stats.exported == 25
    assert exporter.delivered == names  # every span once, in order
    assert balanced(stats)


def test_an_exporter_that_raises_is_retried_and_nothing_reaches_the_caller(
    processors: list[BatchExporter], caplog: pytest.LogCaptureFixture
) -> None:
    exporter = FlakyExporter(failures=2, raise_=True)
    bex, provider = make(processors, exporter)
    with caplog.at_level(logging.WARNING, logger="gymtrace"):
        end_spans(provider, ["x", "y"])
        assert bex.force_flush(5000)
    assert exporter.delivered == ["x", "y"]
    assert bex.stats().retries == 2
    assert "will be retried" in caplog.text


def test_a_span_is_given_up_after_max_tries_and_counted(
    processors: list[BatchExporter], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_export, "_MAX_TRIES", 3)
    exporter = FlakyExporter(failures=10**9)
    bex, provider = make(processors, exporter)
    end_spans(provider, [f"s{i}" for i in range(7)])
    wait_until(lambda: bex.stats().dropped_export_failed == 7)
    stats = bex.stats()
    assert stats.exported == 0 and stats.queued == 0 and balanced(stats)
    assert sorted(exporter.attempts) == sorted([f"s{i}" for i in range(7)] * 3)
    assert not bex._tries  # no memory kept for spans given up


def test_a_requeued_batch_stays_within_the_bound(processors: list[BatchExporter]) -> None:
    exporter = BlockingExporter(result=SpanExportResult.FAILURE)
    bex, provider = make(processors, exporter, max_queue_size=10, max_batch_size=5)
    end_spans(provider, [f"a{i}" for i in range(5)])
    assert exporter.entered.wait(5)
    end_spans(provider, [f"b{i}" for i in range(10)])  # the queue is full while a-batch fails
    exporter.release.set()
    wait_until(lambda: bex.stats().retries >= 1)
    stats = bex.stats()
    assert len(bex._queue) <= 10 and stats.dropped_queue_full >= 5 and balanced(stats)


def test_unsampled_spans_are_not_queued(processors: list[BatchExporter]) -> None:
    bex = BatchExporter(FlakyExporter(), name="test", schedule_delay=0.01)
    processors.append(bex)
    provider = TracerProvider(sampler=ALWAYS_OFF, shutdown_on_exit=False)
    provider.add_span_processor(bex)  # type: ignore[arg-type]
    end_spans(provider, ["x"] * 5)
    assert bex.stats().finished == 0


def test_force_flush_returns_false_when_the_exporter_hangs(processors: list[BatchExporter]) -> None:
    exporter = BlockingExporter()
    bex, provider = make(processors, exporter)
    end_spans(provider, ["x"])
    t0 = time.monotonic()
    assert bex.force_flush(200) is False
    # It gave up at its timeout: the exporter is released only after, so waiting for it would hang.
    assert time.monotonic() - t0 < 30
    exporter.release.set()


def test_shutdown_is_bounded_with_a_hung_exporter_and_counts_the_batch_once(
    processors: list[BatchExporter], caplog: pytest.LogCaptureFixture
) -> None:
    exporter = BlockingExporter()
    bex, provider = make(processors, exporter, shutdown_timeout=0.3, max_batch_size=4)
    end_spans(provider, [f"s{i}" for i in range(10)])
    assert exporter.entered.wait(5)
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="gymtrace"):
        bex.shutdown()
    elapsed = time.monotonic() - t0
    # Its own 0.3 s flush timeout and the 1 s worker join; the 5 s default would take 6 s, and
    # waiting on the hung export would never end.
    assert elapsed < 5.0
    stats = bex.stats()
    assert (stats.finished, stats.exported, stats.dropped, stats.queued) == (10, 0, 10, 0)
    assert "exported 0 of 10 spans; dropped 10" in caplog.text
    # The hung export completes after the process gave up on it: not counted a second time.
    exporter.release.set()
    wait_until(lambda: not bex._thread.is_alive())  # type: ignore[union-attr]
    assert bex.stats() == stats


def test_a_batch_failing_during_shutdown_is_counted_dropped_not_requeued(
    processors: list[BatchExporter], caplog: pytest.LogCaptureFixture
) -> None:
    exporter = BlockingExporter(result=SpanExportResult.FAILURE)
    bex, provider = make(processors, exporter, shutdown_timeout=0.2, max_batch_size=4)
    end_spans(provider, [f"s{i}" for i in range(10)])
    assert exporter.entered.wait(5)
    # The export fails while shutdown() waits for the worker (within its 1 s join).
    threading.Timer(0.4, exporter.release.set).start()
    with caplog.at_level(logging.WARNING, logger="gymtrace"):
        bex.shutdown()
    stats = bex.stats()
    assert (stats.exported, stats.dropped, stats.queued) == (0, 10, 0), stats
    assert not bex._queue
    assert "dropped 10" in caplog.text


def test_spans_ending_after_shutdown_count_as_finished_and_dropped(processors: list[BatchExporter]) -> None:
    bex, provider = make(processors, FlakyExporter())
    end_spans(provider, ["before"])
    bex.shutdown()
    end_spans(provider, ["after"])
    stats = bex.stats()
    assert (stats.finished, stats.exported, stats.dropped_export_failed) == (2, 1, 1)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_starts_empty_with_its_own_worker(processors: list[BatchExporter]) -> None:
    exporter = FlakyExporter()
    bex, provider = make(processors, exporter, schedule_delay=60.0)  # the parent's spans wait
    end_spans(provider, ["parent-0", "parent-1"])
    assert bex.stats().queued == 2
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        ok = False
        try:
            fresh = bex.stats()
            end_spans(provider, ["child"])
            ok = (
                fresh.finished == 0
                and fresh.queued == 0
                and bex.force_flush(5000)
                and exporter.delivered == ["child"]
                and bex._pid == os.getpid()
            )
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert bex.force_flush(5000)
    assert exporter.delivered == ["parent-0", "parent-1"]


class RecordingExporter(SpanExporter):
    """Delivers everything and remembers how many spans each export() call was handed."""

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.delivered: list[str] = []
        self.gate = threading.Event()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.gate.wait(30)
        self.calls.append(len(spans))
        self.delivered.extend(s.name for s in spans)
        return SpanExportResult.SUCCESS


def test_a_backlog_goes_to_a_draining_exporter_in_one_call_and_in_order(
    processors: list[BatchExporter],
) -> None:
    exporter = RecordingExporter()
    bex, provider = make(processors, exporter, max_queue_size=100, max_batch_size=5, max_drain=100, **WHOLE)
    end_spans(provider, [f"a{i}" for i in range(5)])
    wait_until(lambda: bex.stats().queued == 5 and not bex._queue)  # the worker holds a-batch
    names = [f"b{i}" for i in range(60)]
    end_spans(provider, names)
    exporter.gate.set()
    assert bex.force_flush(5000)
    # The 60 spans queued behind the first batch went out in one call, not twelve of five.
    assert exporter.calls == [5, 60]
    assert exporter.delivered == [f"a{i}" for i in range(5)] + names
    stats = bex.stats()
    assert (stats.exported, stats.dropped) == (65, 0) and balanced(stats)


def test_without_max_drain_each_export_call_gets_at_most_a_batch(processors: list[BatchExporter]) -> None:
    exporter = RecordingExporter()
    bex, provider = make(processors, exporter, max_queue_size=100, max_batch_size=5)
    end_spans(provider, [f"s{i}" for i in range(23)])
    exporter.gate.set()
    assert bex.force_flush(5000)
    assert max(exporter.calls) <= 5 and sum(exporter.calls) == 23


# CartPole-like: a rollout and an episode per 20-odd steps, a span per step, made as fast as the
# process can, into this process's queue (the encoder process's pipe: test_export_auto.py). Beside
# other test lanes the worker's waits for the GIL outlasted a default queue (CI: 5,549 of ~33,000
# dropped); a full queue now holds the loop while the file exporter delivers, so nothing drops
# however slowly the worker gets the CPU, and the books balance.
CARTPOLE_RATE = """
import json, gymtrace
gymtrace.configure(service_name="rate", file="trace.jsonl", encoder="thread")
step = gymtrace.step
done = k = 0
while done < 30000:
    k += 1
    with gymtrace.rollout(rollout_id=f"r{k}", task_id="cartpole", repeat=0), gymtrace.episode():
        for _ in range(22):
            with step():
                pass
            done += 1
gymtrace.force_flush(60000)
s = gymtrace.export_stats()[0]
print(json.dumps({"finished": s.finished, "exported": s.exported, "dropped": s.dropped,
                  "queued": s.queued, "steps": done}))
"""


def test_spans_at_cartpole_rate_through_the_file_exporter_are_all_written_once(tmp_path: Path) -> None:
    out = run_python(code=CARTPOLE_RATE, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr
    stats = json.loads(out.stdout.strip().splitlines()[-1])
    assert stats["finished"] == stats["exported"] + stats["dropped"] and stats["queued"] == 0
    assert stats["finished"] == stats["steps"] * 1 + (stats["steps"] // 22) * 2
    spans = read_otlp_json_lines(tmp_path / "trace.jsonl")
    assert len(spans) == stats["exported"]
    assert len({s.span_id for s in spans}) == len(spans)  # none written twice
    assert stats["dropped"] == 0
    by_id = {s.span_id: s for s in spans}
    steps = [s for s in spans if s.name == "gym.step"]
    assert len(steps) == stats["steps"]
    assert all(s.parent_id is not None and by_id[s.parent_id].name == "gym.episode" for s in steps)
    assert check_trace(spans) == []
    # However deep the backlog a write drained, no line holds more than a batch (512 spans).
    for line in trace_lines(tmp_path / "trace.jsonl"):
        request = json.loads(line)
        count = sum(len(ss["spans"]) for rs in request["resourceSpans"] for ss in rs["scopeSpans"])
        assert 0 < count <= 512


def test_only_exporters_that_split_their_own_output_are_handed_the_whole_backlog(tmp_path: Path) -> None:
    settings = _settings.resolve(
        endpoint="http://127.0.0.1:4317", file=str(tmp_path / "t.jsonl"), console=True
    )
    processors = _setup._processors(settings, None)
    try:
        drains = {p.name: p.max_drain for p in processors}
    finally:
        for p in processors:
            p.shutdown(timeout_millis=100)
    # OTLP splits requests at 4 MiB and the file writes a line per batch; the console exporter
    # (the SDK's) gets batches of the configured size, as the SDK's processor would give it.
    assert drains == {
        "otlp": settings.max_queue_size,
        "file": settings.max_queue_size,
        "console": settings.max_export_batch_size,
    }


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_backlog_sent_as_several_requests_resends_only_what_a_failed_request_held(
    protocol: str, processors: list[BatchExporter], monkeypatch: pytest.MonkeyPatch
) -> None:
    from otlp_receiver import grpc_receiver, http_receiver

    # ~3 KB spans and a 20 KB request bound: the drained batch of 40 goes out as ~7 requests.
    monkeypatch.setattr(_otlp, "MAX_REQUEST_BYTES", 20_000)
    receiver_for = {"grpc": grpc_receiver, "http/protobuf": http_receiver}[protocol]
    with receiver_for(reject={1}) as receiver:  # the second request is refused for good
        if protocol == "grpc":
            exporter = _otlp.grpc_exporter(endpoint=receiver.endpoint, insecure=True)
        else:
            exporter = _otlp.http_exporter(endpoint=receiver.endpoint + "/v1/traces")
        bex, provider = make(
            processors, exporter, max_queue_size=100, max_batch_size=100, max_drain=100, schedule_delay=60.0
        )
        names = [f"s{i}" for i in range(40)]
        tracer = provider.get_tracer("big")
        for name in names:
            tracer.start_span(name, attributes={"payload": "x" * 3000}).end()
        assert bex.force_flush(10_000)
        received = [s.name for s in receiver.spans]
        requests = receiver.requests
    stats = bex.stats()
    assert requests > 3
    # The first request's spans were delivered once; the refused one's and the rest went again.
    assert sorted(received) == sorted(names)
    assert (stats.exported, stats.dropped, stats.retries) == (40, 0, 1) and balanced(stats)


def _file_queue(
    processors: list[BatchExporter], path: Path, *, encode_on_end: bool = True
) -> tuple[BatchExporter, TracerProvider]:
    """The file's queue as configure() builds it, with a worker that waits a minute between
    batches: what it holds is what the spans left behind as they ended."""
    from gymtrace._sdk.export_targets import file_exporter

    bex = BatchExporter(
        file_exporter(str(path)),
        name="file",
        schedule_delay=60.0,
        shutdown_timeout=5.0,
        encode_on_end=encode_on_end,
    )
    processors.append(bex)
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(bex)  # type: ignore[arg-type]
    return bex, provider


@pytest.mark.parametrize("encode_on_end", [True, False], ids=["file queue", "encoder process's queue"])
def test_the_file_queue_frees_each_span_as_it_ends_and_writes_it_as_it_was(
    processors: list[BatchExporter], tmp_path: Path, encode_on_end: bool
) -> None:
    import gc
    import weakref

    bex, provider = _file_queue(processors, tmp_path / "t.jsonl", encode_on_end=encode_on_end)
    ended: list[weakref.ref[ReadableSpan]] = []

    class Watch(SpanProcessor):  # beside the queue: the SDK hands it the same ended span
        def on_end(self, span: ReadableSpan) -> None:
            ended.append(weakref.ref(span))

    provider.add_span_processor(Watch())
    tracer = provider.get_tracer("test")
    gc.disable()  # freed by its last reference going, not by a collection that happened to run
    try:
        for n in range(5):
            span = tracer.start_span(f"s{n}", attributes={"gym.kind": "step", "n": n, "x": 0.5})
            span.add_event("e", {"k": "v"})
            span.end()
            del span
        alive = sum(ref() is not None for ref in ended)
    finally:
        gc.enable()
    assert len(ended) == 5
    assert bex.stats().queued == 5  # none written yet: the worker sleeps
    # The file's queue holds text, which the cyclic collector does not track; the encoder
    # process's queue (fed rebuilt spans, in its own small heap) holds the spans.
    assert alive == (0 if encode_on_end else 5)
    assert bex.force_flush(10_000)
    spans = read_otlp_json_lines(tmp_path / "t.jsonl")
    assert [(s.name, s.attributes["n"], s.attributes["x"]) for s in spans] == [
        (f"s{n}", n, 0.5) for n in range(5)
    ]
    assert all([(e.name, e.attributes) for e in s.events] == [("e", {"k": "v"})] for s in spans)
    assert balanced(bex.stats()) and bex.stats().exported == 5


def test_a_span_that_failed_to_encode_as_it_ended_is_written_by_the_worker_in_its_place(
    processors: list[BatchExporter], tmp_path: Path
) -> None:
    bex, provider = _file_queue(processors, tmp_path / "t.jsonl")
    encode = bex._encode
    assert encode is not None

    def encode_all_but_b(span: ReadableSpan) -> object:
        if span.name == "b":
            raise RuntimeError("an attribute the encoder did not expect")
        return encode(span)

    bex._encode = encode_all_but_b
    end_spans(provider, ["a", "b", "c"])
    assert bex.force_flush(10_000)
    # In order, in one line: a queue may hold text and spans side by side.
    assert [s.name for s in read_otlp_json_lines(tmp_path / "t.jsonl")] == ["a", "b", "c"]
    assert len(trace_lines(tmp_path / "t.jsonl")) == 1
    assert balanced(bex.stats()) and bex.stats().exported == 3 and bex.stats().dropped == 0
