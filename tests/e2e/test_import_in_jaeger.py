"""``gymtrace import --endpoint`` through the real Collector (tail sampling) into Jaeger, read back
by ``gymtrace rollouts --jaeger`` and ``gymtrace compare --jaeger``."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from child_process import run_gymtrace
from gymtrace import _constants as c
from gymtrace._import.nemo_gym import failures_path
from gymtrace._model.spandata import read_otlp_json_lines
from pipeline import Pipeline
from records_support import write_nemo_gym_output


def test_an_imported_nemo_gym_run_reaches_jaeger_with_the_ids_of_a_file_import(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    out = tmp_path / "rollouts.jsonl"
    write_nemo_gym_output(out)
    run_id = f"e2e-import-{uuid.uuid4().hex[:8]}"
    sent = run_gymtrace(
        "import", "nemo-gym", str(out), "--run", run_id, "--endpoint", pipeline.otlp_http_endpoint
    )
    assert sent.returncode == 0, sent.stderr
    written = run_gymtrace("import", "nemo-gym", str(out), "--run", run_id, "-o", str(tmp_path / "t.jsonl"))
    assert written.returncode == 0, written.stderr
    in_file = {
        s.attributes[c.ROLLOUT_ID]: s.trace_id
        for s in read_otlp_json_lines(tmp_path / "t.jsonl")
        if s.attributes.get(c.KIND) == c.KIND_ROLLOUT
    }
    # Tail sampling at 0 % keeps the retried rollout (1-0) and the unscored one (2-1), whole.
    pipeline.wait_for_traces(
        "nemo-gym",
        {c.RUN_ID: run_id, c.KIND: c.KIND_ROLLOUT},
        predicate=lambda traces: len(traces) >= 2,
        timeout=60,
    )
    rows = run_gymtrace("rollouts", "--jaeger", pipeline.query_url, "--run", run_id, "--json", check=True)
    found = {r["rollout_id"]: r for r in map(json.loads, rows.stdout.splitlines())}
    assert {k: (r["outcome"], r["reward"], r["attempts"]) for k, r in found.items()} == {
        "1-0": ("scored", 1.0, 2),
        "2-1": ("unscored", None, 1),
    }
    assert {k: r["trace_id"] for k, r in found.items()} == {k: in_file[k] for k in found}


def test_compare_reads_two_imported_runs_from_jaeger_by_run_id(pipeline: Pipeline, tmp_path: Path) -> None:
    # Every rollout failed once before it was scored, so tail sampling keeps each one whole.
    runs = {"a": {0: 0.0, 1: 1.0, 2: 0.0}, "b": {0: 1.0, 1: 1.0, 2: 0.0}}
    suffix = uuid.uuid4().hex[:8]
    for name, rewards in runs.items():
        out = tmp_path / f"{name}.jsonl"
        out.write_text(
            "".join(
                json.dumps({"_ng_task_index": t, "_ng_rollout_index": 0, "_ng_attempt_index": 1, "reward": r})
                + "\n"
                for t, r in rewards.items()
            )
        )
        failures_path(out).write_text(
            "".join(
                json.dumps(
                    {"_ng_task_index": t, "_ng_rollout_index": 0, "_ng_failure_class": "agent_request_failed"}
                )
                + "\n"
                for t in rewards
            )
        )
        run_id = f"e2e-compare-{name}-{suffix}"
        sent = run_gymtrace(
            "import", "nemo-gym", str(out), "--run", run_id, "--endpoint", pipeline.otlp_http_endpoint
        )
        assert sent.returncode == 0, sent.stderr
        pipeline.wait_for_traces(
            "nemo-gym",
            {c.RUN_ID: run_id, c.KIND: c.KIND_ROLLOUT},
            predicate=lambda traces: len(traces) >= 3,
            timeout=60,
        )
    result = run_gymtrace(
        "compare",
        f"e2e-compare-a-{suffix}",
        f"e2e-compare-b-{suffix}",
        "--jaeger",
        pipeline.query_url,
        "--json",
        check=True,
    )
    found = json.loads(result.stdout)
    assert {t["task_id"]: t["delta"] for t in found["tasks"]} == {"0": 1.0, "1": 0.0, "2": 0.0}
    assert found["fail_to_pass"] == ["0"] and found["pass_to_fail"] == []
