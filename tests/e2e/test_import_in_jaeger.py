"""``gymtrace import --endpoint`` through the real Collector (tail sampling) into Jaeger, read back
by ``gymtrace rollouts --jaeger`` with the same trace IDs a file import writes."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from child_process import run_gymtrace
from gymtrace import _constants as c
from gymtrace._spandata import read_otlp_json_lines
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
