"""The demo, exported over OTLP through the real Collector into the real Jaeger, read back."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from child_process import run_gymtrace
from gymtrace import _constants as c
from gymtrace._model.spandata import SpanData
from gymtrace._read.check import check_spans
from gymtrace._read.jaeger import JaegerClient
from pipeline import Pipeline, Trace, span_tags

SERVICE = "gymtrace-demo"
# With the Collector's sample percent at 0 only the policy keeps survive: the retried rollout, the
# unscored one (failed attempts), the restored one, the two scored outside their rollout span (their
# roots say unscored; the outcome record in the same trace says scored), and the run's own trace
# (always kept, so every rollout's run reference leads somewhere); the clean rollouts are dropped.
KEPT = {"arith-001/r1", "arith-002/r0", "arith-002/r1", "arith-004/r0", "arith-004/r1"}
# arith-004/r0 is scored by a scorer process; every other span is the demo's own.
SCORER = "gymtrace-demo-scorer"


def _run_demo(pipeline: Pipeline, protocol: str, tmp_path: Path) -> str:
    run_id = f"e2e-{protocol.split('/')[0]}-{uuid.uuid4().hex[:8]}"
    endpoint = pipeline.otlp_grpc_endpoint if protocol == "grpc" else pipeline.otlp_http_endpoint
    out = run_gymtrace(
        "demo",
        "--quiet",
        "--endpoint",
        endpoint,
        "--protocol",
        protocol,
        "--run-id",
        run_id,
        "--file",
        str(tmp_path / "demo.jsonl"),
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return run_id


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    # The tail sampler as in production: it decides a trace a second after its root arrived, with a
    # long upper bound. The shared pipeline decides 2 s after the FIRST span, which a loaded machine
    # outlasts while the demo's scorer process starts: the rollout it scores was then decided (and
    # dropped) before its outcome record arrived.
    with Pipeline(
        decision_wait="120s",
        decision_wait_after_root="1s",
        sample_percent=0,
        workdir=tmp_path_factory.mktemp("demo-pipeline"),
    ) as p:
        yield p


def _all_kept_complete(traces: list[Trace]) -> bool:
    complete = set()
    for trace in traces:
        tags = [span_tags(span) for span in trace["spans"]]
        kinds = {t.get(c.KIND) for t in tags}
        root = next((t for t in tags if t.get(c.KIND) == "rollout"), None)
        if root is None:
            continue
        key = f"{root[c.TASK_ID]}/r{root[c.ROLLOUT_REPEAT]}"
        if key.startswith("arith-004") and "outcome" not in kinds:
            continue
        if key == "arith-004/r0" and "verify" not in kinds:
            continue
        complete.add(key)
    return complete >= KEPT


def _rollouts_in_jaeger(pipeline: Pipeline, run_id: str) -> dict[str, list[SpanData]]:
    client = JaegerClient(pipeline.query_url)
    # Wait for what the test reads, not a count: the run's own trace counts too, and on a loaded
    # machine the scorer's spans (verify, outcome) reach the Collector after the demo's.
    pipeline.wait_for_traces(SERVICE, {c.RUN_ID: run_id}, predicate=_all_kept_complete, timeout=90)
    # Past the Collector's decision_wait the dropped traces are decided too: still only these.
    time.sleep(3)
    spans = client.search(SERVICE, {c.RUN_ID: run_id})
    by_trace: dict[str, list[SpanData]] = {}
    for span in spans:
        by_trace.setdefault(span.trace_id, []).append(span)
    rollouts = {}
    runs = [spans for spans in by_trace.values() if [s.attributes[c.KIND] for s in spans] == ["run"]]
    assert len(runs) == 1, by_trace  # the run's one-span trace, kept by the run-trace rule
    for trace_spans in by_trace.values():
        (root,) = [s for s in trace_spans if s.parent_id is None]
        if root.attributes[c.KIND] == "run":
            continue
        assert root.attributes[c.KIND] == "rollout"
        key = f"{root.attributes[c.TASK_ID]}/r{root.attributes[c.ROLLOUT_REPEAT]}"
        rollouts[key] = trace_spans
    return rollouts


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_demo_reaches_jaeger_as_one_tree_per_kept_rollout(
    pipeline: Pipeline, protocol: str, tmp_path: Path
) -> None:
    run_id = _run_demo(pipeline, protocol, tmp_path)
    rollouts = _rollouts_in_jaeger(pipeline, run_id)
    assert set(rollouts) == KEPT  # tail sampling: failed/retried/unscored kept, clean ones dropped
    for key, spans in rollouts.items():
        assert check_spans(spans) == [], key
        rollout = next(s for s in spans if s.attributes[c.KIND] == "rollout")
        by_id = {s.span_id: s for s in spans}
        for span in spans:
            assert span.service == (
                SCORER
                if key == "arith-004/r0" and span.attributes[c.KIND] in ("verify", "outcome")
                else SERVICE
            )
            assert span.attributes[c.RUN_ID] == run_id
            assert span.attributes[c.ROLLOUT_ID] == rollout.attributes[c.ROLLOUT_ID]
            if span is not rollout:
                assert span.parent_id in by_id  # every parent arrived: a complete tree
        kinds = sorted({s.attributes[c.KIND] for s in spans})
        assert kinds == sorted(
            ["rollout", "episode", "seed_session", "agent_invocation", "turn", "step", "model_call"]
            + ["tool_call"]
            + (["verify"] if key not in ("arith-002/r0", "arith-004/r1") else [])
            + (["outcome"] if key.startswith("arith-004") else [])
        )

    retried = sorted(
        (s for s in rollouts["arith-001/r1"] if s.attributes[c.KIND] == "episode"),
        key=lambda s: s.attributes[c.EPISODE_ATTEMPT],
    )
    assert [e.attributes[c.EPISODE_OUTCOME] for e in retried] == ["failed", "completed"]
    assert [link.span_id for link in retried[1].links] == [retried[0].span_id]
    assert any(e.name == "exception" for e in retried[0].events)
    (evaluation,) = [e for e in retried[1].events if e.name == c.GEN_AI_EVALUATION_RESULT]
    assert evaluation.attributes[c.GEN_AI_EVALUATION_SCORE_VALUE] == 1.0
    assert evaluation.attributes[c.GEN_AI_EVALUATION_NAME] == "reward"

    restored = sorted(
        (s for s in rollouts["arith-002/r1"] if s.attributes[c.KIND] == "episode"),
        key=lambda s: s.attributes[c.EPISODE_ATTEMPT],
    )
    assert restored[1].attributes[c.EPISODE_RESTORED] is True
    assert [link.span_id for link in restored[1].links] == [restored[0].span_id]

    unscored = next(s for s in rollouts["arith-002/r0"] if s.attributes[c.KIND] == "rollout")
    assert unscored.attributes[c.ROLLOUT_OUTCOME] == "unscored"
    assert c.REWARD not in unscored.attributes
    assert unscored.attributes[c.ROLLOUT_ATTEMPTS] == 3

    tree = run_gymtrace("tree", "--jaeger", pipeline.query_url, "--run", run_id, check=True).stdout
    assert tree.count("gym.rollout [rollout]") == 5
    assert tree.count("=> final: outcome=scored") == 2  # the outcome records decide arith-004
    for expected in ("outcome=unscored", "<-retry", "<-restore", "restored=True", "reward=1"):
        assert expected in tree, expected
    rollout_id = unscored.attributes[c.ROLLOUT_ID]
    one = run_gymtrace("tree", "--jaeger", pipeline.query_url, "--rollout", rollout_id, check=True).stdout
    assert one.count("gym.rollout [rollout]") == 1 and "outcome=unscored" in one
    by_trace = run_gymtrace(
        "tree", "--jaeger", pipeline.query_url, "--trace", unscored.trace_id, check=True
    ).stdout
    assert by_trace == one
    # The pictures read the run from Jaeger too: the five rollouts the sampler kept, two services.
    chrome = tmp_path / "timeline.json"
    drawn = run_gymtrace(
        "timeline", "--jaeger", pipeline.query_url, "--run", run_id, "--format", "chrome", "-o", str(chrome),
        check=True,
    ).stdout  # fmt: skip
    assert drawn.startswith(f"run {run_id}: 5 rollouts, "), drawn
    events = json.loads(chrome.read_text())["traceEvents"]
    episodes = [e for e in events if e.get("cat") == "episode"]
    assert {e["name"].split(" a")[0] for e in episodes} == {
        s.attributes[c.ROLLOUT_ID]
        for spans in rollouts.values()
        for s in spans
        if s.attributes[c.KIND] == "rollout"
    }
    report = tmp_path / "report.html"
    run_gymtrace("report", "--jaeger", pipeline.query_url, "--run", run_id, "-o", str(report), check=True)
    assert "data-figure=\"rollouts\" data-value='5'" in report.read_text()
