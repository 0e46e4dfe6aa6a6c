"""A training run through the real Collector into the real Jaeger, read back: the demo's asynchronous
GRPO run (rollout workers in two processes, a trainer in a third), and a train step that consumes
8,192 rollouts, whose trace the Collector's ``train-step-trace`` rule keeps whatever it samples."""

from __future__ import annotations

import json
import statistics
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from child_process import run_gymtrace, run_python
from gymtrace import _constants as c
from gymtrace._model.spandata import SpanData
from gymtrace._read.jaeger import JaegerClient
from pipeline import Pipeline

WORKERS = ("rollout-worker-0", "rollout-worker-1")

RUN = """
import json, sys
from dataclasses import asdict
from gymtrace.demo.training import run_training

result = run_training(run_id=sys.argv[1], file=sys.argv[2], workers=2, steps=3, endpoint=sys.argv[3])
print(json.dumps({"steps": [asdict(s) for s in result.steps], "rollouts": len(result.decisions)}))
"""

BIG_STEP = """
import sys
import gymtrace
from gymtrace import _constants as c

gymtrace.configure(service_name=sys.argv[2], file=False, endpoint=sys.argv[1])
with gymtrace.run(run_id=sys.argv[3]), gymtrace.train_step(step=0, policy_version=1):
    for n in range(8192):
        gymtrace.consume({c.RUN_ID: sys.argv[3], c.ROLLOUT_ID: f"{n // 16}-{n % 16}",
                          "trace_id": format(n + 1, "032x"), "rollout_span_id": format(n + 1, "016x"),
                          c.POLICY_VERSION: 0})
gymtrace.shutdown()
"""


@pytest.fixture(scope="module")
def keep_all(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    with Pipeline(
        decision_wait="120s",
        decision_wait_after_root="1s",
        sample_percent=100,
        workdir=tmp_path_factory.mktemp("training-pipeline"),
    ) as p:
        yield p


def _spans(client: JaegerClient, run_id: str) -> list[SpanData]:
    return [span for service in (*WORKERS, "trainer") for span in client.search(service, {c.RUN_ID: run_id})]


def test_a_training_run_in_jaeger_carries_versions_and_groups_and_its_steps_read_as_the_trainer_did(
    keep_all: Pipeline, tmp_path: Path
) -> None:
    run_id = f"grpo-{uuid.uuid4().hex[:8]}"
    out = run_python(run_id, str(tmp_path / "run.jsonl"), keep_all.otlp_grpc_endpoint, code=RUN, timeout=120)
    assert out.returncode == 0, out.stderr
    trainer = json.loads(out.stdout.strip().splitlines()[-1])

    for service in WORKERS:
        keep_all.wait_for_traces(service, {c.RUN_ID: run_id}, timeout=90)
    keep_all.wait_for_traces("trainer", {c.RUN_ID: run_id}, count=4, timeout=90)  # the run and 3 steps
    client = JaegerClient(keep_all.query_url)
    deadline = time.monotonic() + 90
    while True:  # every rollout of both workers stored (each is a trace of its own)
        spans = _spans(client, run_id)
        if sum(1 for s in spans if s.attributes.get(c.KIND) == c.KIND_ROLLOUT) >= trainer["rollouts"]:
            break
        assert time.monotonic() < deadline, "not every rollout reached Jaeger"
        time.sleep(1)
    by_trace: dict[str, list[SpanData]] = defaultdict(list)
    for span in spans:
        by_trace[span.trace_id].append(span)
    roots = [s for s in spans if s.attributes.get(c.KIND) == c.KIND_ROLLOUT]
    assert len(roots) == trainer["rollouts"]
    spanned = 0
    for root in roots:
        members = by_trace[root.trace_id]
        assert {s.service for s in members} == {root.service}
        for span in members:
            assert span.attributes[c.GROUP_ID] == root.attributes[c.GROUP_ID], span.name
            assert isinstance(span.attributes[c.POLICY_VERSION], int), span.name
        calls = sorted(
            (s for s in members if s.attributes[c.KIND] == c.KIND_MODEL_CALL), key=lambda s: s.start_ns
        )
        if calls[-1].attributes[c.POLICY_VERSION] != root.attributes[c.POLICY_VERSION]:
            spanned += 1
            assert root.attributes[c.POLICY_VERSION_END] == calls[-1].attributes[c.POLICY_VERSION]
    assert spanned >= 1
    # From a step to its rollouts: each consumed record links to rollout spans Jaeger holds.
    rollout_spans = {(r.trace_id, r.span_id) for r in roots}
    records = [s for s in spans if s.attributes.get(c.KIND) == c.KIND_CONSUMED]
    linked = [(link.trace_id, link.span_id) for record in records for link in record.links]
    assert len(linked) == trainer["rollouts"] and set(linked) == rollout_spans

    stats = run_gymtrace(
        "stats", "--by", "train_step", "--json", "--jaeger", keep_all.query_url, "--run", run_id, check=True
    )
    steps = [json.loads(line) for line in stats.stdout.splitlines() if '"train_step"' in line]
    for step, record in zip(steps, trainer["steps"], strict=True):
        assert step["train_step"] == record["step"] and step["policy_version"] == record["policy_version"]
        assert {k: v for k, v in step["outcomes"].items() if v} == record["outcomes"]
        # Jaeger keeps microseconds: a rollout's seconds may differ by 1 µs at each end.
        assert step["wasted_seconds"] == pytest.approx(record["wasted_seconds"], abs=1e-4)
        assert step["staleness_max"] == max(record["staleness"])
        assert step["staleness_p50"] == statistics.median(record["staleness"])


def test_a_step_consuming_8192_rollouts_is_kept_and_whole_in_jaeger_at_a_zero_sample_share(
    pipeline: Pipeline,
) -> None:
    run_id, service = f"big-{uuid.uuid4().hex[:8]}", f"trainer-{uuid.uuid4().hex[:6]}"
    out = run_python(pipeline.otlp_grpc_endpoint, service, run_id, code=BIG_STEP, timeout=120)
    assert out.returncode == 0, out.stderr
    pipeline.wait_for_traces(
        service, {c.KIND: c.KIND_TRAIN_STEP}, count=1, min_spans=65, timeout=90
    )  # the step and its 64 records: kept by train-step-trace though the sample share is 0
    spans = JaegerClient(pipeline.query_url).search(service, {c.KIND: c.KIND_TRAIN_STEP})
    [step] = [s for s in spans if s.attributes[c.KIND] == c.KIND_TRAIN_STEP]
    records = [s for s in spans if s.attributes[c.KIND] == c.KIND_CONSUMED]
    assert len(records) == 64 and all(r.parent_id == step.span_id for r in records)
    ids: list[Any] = []
    for record in records:
        value = record.attributes[c.CONSUMED_ROLLOUT_IDS]
        ids.extend(json.loads(value) if isinstance(value, str) else value)
        assert len(record.links) == 128
    assert sorted(ids) == sorted(f"{n // 16}-{n % 16}" for n in range(8192))
    assert step.attributes[c.CONSUMED_COUNT] == 8192
