"""A training run across processes, read back from its file: rollout workers in two processes, a
trainer in a third (the demo's asynchronous GRPO run, ``gymtrace.demo.training``), and a step that
consumes 8,192 rollouts. What the trainer did is recorded by the trainer itself, beside the trace,
and compared with what ``gymtrace stats --by train_step`` reads from the file."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from child_process import run_gymtrace, run_python
from gymtrace import attributes as c
from otlp_lines import read_otlp_json_lines

# A consumed record's rollout IDs, one of its parallel array attributes (docs/training.md): part of
# the file's format, not a name gymtrace.attributes exports.
CONSUMED_ROLLOUT_IDS = "gym.consumed.rollout_ids"

PROGRAM = """
import json, sys
from dataclasses import asdict
from gymtrace.demo.training import run_training

result = run_training(run_id="grpo-test", file=sys.argv[1], workers=2, steps=3)
print(json.dumps({"steps": [asdict(s) for s in result.steps], "problems": result.problems}))
"""

BIG_STEP = """
import sys
import gymtrace
from gymtrace import attributes as c

gymtrace.configure(service_name="trainer", file=sys.argv[1])
with gymtrace.run(run_id="big"), gymtrace.train_step(step=0, policy_version=1):
    for n in range(8192):
        gymtrace.consume({c.RUN_ID: "big", c.ROLLOUT_ID: f"{n // 16}-{n % 16}", "trace_id": format(n + 1, "032x"),
                          "rollout_span_id": format(n + 1, "016x"), c.POLICY_VERSION: 0},
                         outcome="trained" if n % 4 else "filtered")
gymtrace.shutdown()
"""


@pytest.fixture(scope="module")
def training_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    path = tmp_path_factory.mktemp("training") / "run.jsonl"
    out = run_python(str(path), code=PROGRAM, timeout=120)
    assert out.returncode == 0, out.stderr
    return path, json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.e2e
def test_every_span_of_every_rollout_in_the_worker_processes_carries_its_version_and_group(
    training_run: tuple[Path, dict[str, Any]],
) -> None:
    path, trainer = training_run
    assert trainer["problems"] == []
    spans = read_otlp_json_lines(path)
    below = [s for s in spans if isinstance(s.attributes.get(c.ROLLOUT_ID), str)]
    roots = [s for s in below if s.attributes.get(c.KIND) == c.KIND_ROLLOUT]
    assert {s.service for s in roots} == {"rollout-worker-0", "rollout-worker-1"}
    [run] = [s for s in spans if s.attributes.get(c.KIND) == c.KIND_RUN]
    assert run.service == "trainer"
    for root in roots:
        # Opened under the trainer's run context carried to the worker: its own trace, linked to the run.
        assert root.parent_id is None and root.trace_id != run.trace_id
        assert [(link.span_id, link.attributes.get(c.LINK_RELATION)) for link in root.links] == [
            (run.span_id, c.RELATION_RUN)
        ]
    kinds = {s.attributes.get(c.KIND) for s in below}
    assert {"rollout", "episode", "seed_session", "step", "model_call", "tool_call", "verify"} <= kinds
    for span in below:
        assert isinstance(span.attributes.get(c.GROUP_ID), str), span.name
        assert isinstance(span.attributes.get(c.POLICY_VERSION), int), span.name
        # The demo names a rollout "{group}-{sample}".
        assert span.attributes[c.ROLLOUT_ID].startswith(span.attributes[c.GROUP_ID] + "-"), span.name


@pytest.mark.e2e
def test_the_rollouts_that_spanned_a_weight_update_say_the_version_they_ended_under(
    training_run: tuple[Path, dict[str, Any]],
) -> None:
    path, _ = training_run
    spans = read_otlp_json_lines(path)
    by_trace: dict[str, list[Any]] = defaultdict(list)
    for span in spans:
        by_trace[span.trace_id].append(span)
    spanned = 0
    for members in by_trace.values():
        roots = [s for s in members if s.attributes.get(c.KIND) == c.KIND_ROLLOUT]
        if not roots:
            continue
        [root] = roots
        start = root.attributes[c.POLICY_VERSION]
        calls = sorted(
            (s for s in members if s.attributes.get(c.KIND) == c.KIND_MODEL_CALL), key=lambda s: s.start_ns
        )
        last = calls[-1].attributes[c.POLICY_VERSION]
        if last != start:
            spanned += 1
            assert root.attributes[c.POLICY_VERSION_END] == last
        else:
            assert c.POLICY_VERSION_END not in root.attributes
    assert spanned >= 1  # the next batch generates while the trainer updates its weights


@pytest.mark.e2e
def test_each_steps_outcomes_wasted_seconds_and_staleness_equal_what_the_trainer_did(
    training_run: tuple[Path, dict[str, Any]],
) -> None:
    path, trainer = training_run
    out = run_gymtrace("stats", "--by", "train_step", "--json", str(path), check=True)
    objects = [json.loads(line) for line in out.stdout.splitlines()]
    steps = [o for o in objects if "train_step" in o]
    [run] = [o for o in objects if "wasted_share" in o]
    assert [s["train_step"] for s in steps] == [r["step"] for r in trainer["steps"]] == [0, 1, 2]
    for step, record in zip(steps, trainer["steps"], strict=True):
        assert step["policy_version"] == record["policy_version"]
        assert {k: v for k, v in step["outcomes"].items() if v} == record["outcomes"]
        assert step["consumed"] == sum(record["outcomes"].values())
        assert step["wasted_seconds"] == pytest.approx(record["wasted_seconds"], abs=1e-5)
        assert step["staleness_max"] == max(record["staleness"])
        assert step["staleness_p50"] == statistics.median(record["staleness"])
    assert {k for r in trainer["steps"] for k in r["outcomes"]} == {"trained", "filtered", "stale", "failed"}
    assert run["unconsumed"] == 0


@pytest.mark.e2e
def test_a_step_consuming_8192_rollouts_keeps_every_one_in_the_file(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    out = run_python(str(path), code=BIG_STEP, timeout=120)
    assert out.returncode == 0, out.stderr
    spans = read_otlp_json_lines(path)
    records = [s for s in spans if s.attributes.get(c.KIND) == c.KIND_CONSUMED]
    assert len(records) == 64 and all(len(r.links) == 128 for r in records)
    ids = [rid for r in records for rid in r.attributes[CONSUMED_ROLLOUT_IDS]]
    assert sorted(ids) == sorted(f"{n // 16}-{n % 16}" for n in range(8192))
    stats = run_gymtrace("stats", "--by", "train_step", "--json", str(path), check=True)
    step = json.loads(stats.stdout.splitlines()[0])
    assert step["consumed"] == 8192
    assert step["outcomes"]["trained"] == 6144 and step["outcomes"]["filtered"] == 2048
    assert step["staleness_max"] == 1


@pytest.mark.e2e
def test_demo_training_prints_the_steps_and_what_the_trainer_did_and_passes_its_check(tmp_path: Path) -> None:
    out = run_gymtrace(
        "demo", "--training", "--file", str(tmp_path / "demo.jsonl"), "--run-id", "g", timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "from 2 worker processes, 3 train steps" in out.stdout
    assert "run g step 2 (policy 2)" in out.stdout and "stale" in out.stdout
    assert "what the trainer did, recorded beside the trace:" in out.stdout
    assert "contract check: OK" in out.stdout
    again = run_gymtrace("stats", "--by", "group", str(tmp_path / "demo.jsonl"), check=True)
    assert "(zero variance); 4 filtered" in again.stdout
