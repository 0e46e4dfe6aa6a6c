"""gymtrace.integrations.concurrent: thread and process pools carry the trace and the gym identity;
the helpers stay importable from gymtrace.propagation."""

from __future__ import annotations

import multiprocessing
import os
import pickle
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

from opentelemetry import trace

import _pool_workers
import gymtrace
from gymtrace import attributes as c
from gymtrace import propagation
from gymtrace.integrations import concurrent
from otlp_lines import read_otlp_json_lines


def _id(span) -> str:
    return trace.format_span_id(span.get_span_context().span_id)


def _parent(span) -> str | None:
    return trace.format_span_id(span.parent.span_id) if span.parent is not None else None


def test_propagation_keeps_the_pool_helpers_of_its_documented_api():
    for name in ("ContextCarrier", "carry", "map", "submit"):
        assert getattr(propagation, name) is getattr(concurrent, name)


def test_thread_pool_worker_spans_are_children_of_the_submitting_scope():
    with gymtrace.testing.capture_spans() as captured, ThreadPoolExecutor(max_workers=2) as pool:
        with gymtrace.rollout(rollout_id="r-t"), gymtrace.episode(attempt=2), gymtrace.step():
            futures = [concurrent.submit(pool, _threaded_tool, n) for n in range(3)]
            mapped = list(concurrent.map(pool, _threaded_tool, [7]))
            results = [f.result() for f in futures] + mapped
    step = captured.one(c.KIND_STEP)
    tools = captured.by_kind(c.KIND_TOOL_CALL)
    assert len(tools) == 4
    assert {_parent(t) for t in tools} == {_id(step)}
    assert {(r[0], r[1]) for r in results} == {("r-t", 2)}


def _threaded_tool(n: int) -> tuple[str | None, int | None, int]:
    with gymtrace.tool_call(tool_name="threaded"):
        here = gymtrace.current()
    return here.rollout_id, here.attempt, n


def test_thread_pool_worker_without_helper_has_no_identity():
    # The reason the helper exists (opentelemetry-python-contrib#1010): pools do not copy context.
    with gymtrace.testing.capture_spans(), ThreadPoolExecutor(max_workers=1) as pool:
        with gymtrace.rollout(rollout_id="r-t"):
            assert pool.submit(lambda: gymtrace.current().rollout_id).result() is None
            assert concurrent.submit(pool, lambda: gymtrace.current().rollout_id).result() == "r-t"
            assert propagation.submit(pool, lambda: gymtrace.current().rollout_id).result() == "r-t"


def test_context_carrier_pickles_as_headers_only():
    with gymtrace.testing.capture_spans(), gymtrace.rollout(rollout_id="r-p"), gymtrace.episode():
        carried = concurrent.carry(len)
        state = pickle.loads(pickle.dumps(carried)).__getstate__()
    assert state["fn"] is len
    assert set(state["headers"]) == {"traceparent", "baggage"}


def test_process_pool_worker_spans_join_the_trace_with_identity(tmp_path):
    out = tmp_path / "worker.jsonl"
    with (
        gymtrace.testing.capture_spans(),
        ProcessPoolExecutor(
            max_workers=2,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_pool_workers.configure_worker,
            initargs=(str(out),),
        ) as pool,
        gymtrace.rollout(rollout_id="r-proc"),
        gymtrace.episode(attempt=1),
        gymtrace.step() as step,
    ):
        results = [concurrent.submit(pool, _pool_workers.score, a).result(timeout=120) for a in "ab"]
    assert {(r["rollout_id"], r["attempt"]) for r in results} == {("r-proc", 1)}
    assert all(r["pid"] != os.getpid() for r in results)
    spans = read_otlp_json_lines(out)
    assert len(spans) == 2
    assert {(s.trace_id, s.parent_id) for s in spans} == {(step.trace_id, step.span_id)}
    assert {s.attributes[c.EPISODE_ATTEMPT] for s in spans} == {1}
    assert {s.service for s in spans} == {"pool-worker"}
