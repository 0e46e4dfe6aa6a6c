"""``gymtrace demo --distributed`` honours every option ``gymtrace demo`` has: spans go to the
``--endpoint`` over the ``--protocol`` (a real OTLP receiver here, not the file), ``--run-id`` names
the run, ``--quiet`` leaves the tree out, ``--file`` and ``--repeats`` shape the file run."""

from __future__ import annotations

from pathlib import Path

import pytest

from _distributed import SERVICES_OF_THE_DEMO, assert_one_tree, by_trace
from child_process import run_gymtrace, wrote
from gymtrace import attributes as c
from gymtrace.testing import check_trace
from otlp_lines import as_readable, read_otlp_json_lines
from otlp_receiver import grpc_receiver, http_receiver

# The distributed demo starts its services as real servers: left out of `scripts/test --quick`.
pytestmark = pytest.mark.e2e

RECEIVERS = {"grpc": grpc_receiver, "http/protobuf": http_receiver}


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_distributed_demo_sends_every_process_spans_to_the_endpoint_not_the_file(
    tmp_path: Path, protocol: str
) -> None:
    with RECEIVERS[protocol]() as receiver:
        out = run_gymtrace(
            "demo", "--distributed", "--repeats", "1", "--run-id", "run-otlp", "--quiet",
            "--endpoint", receiver.endpoint, "--protocol", protocol,
            cwd=tmp_path, timeout=300,
        )  # fmt: skip
        assert out.returncode == 0, out.stdout + out.stderr
        spans = receiver.spans
    assert not wrote(tmp_path / "gymtrace-traces.jsonl")
    assert f"spans exported to OTLP/{protocol} {receiver.endpoint}" in out.stdout
    assert {s.service for s in spans} == SERVICES_OF_THE_DEMO
    rollouts = [s for s in spans if s.attributes.get(c.KIND) == c.KIND_ROLLOUT]
    assert sorted(s.attributes[c.ROLLOUT_ID] for s in rollouts) == [
        "run-otlp-add-2-40-r0",
        "run-otlp-mul-6-7-r0",
    ]
    assert {s.attributes[c.RUN_ID] for s in spans if c.RUN_ID in s.attributes} == {"run-otlp"}
    for trace in by_trace([s for s in spans if s.attributes.get(c.KIND) != c.KIND_RUN]).values():
        assert_one_tree(trace)
    assert check_trace(spans) == []


def test_distributed_demo_writes_the_file_with_run_id_and_repeats_and_quiet_drops_the_tree(
    tmp_path: Path,
) -> None:
    out = run_gymtrace(
        "demo", "--distributed", "--repeats", "2", "--run-id", "run-file", "--quiet",
        "--file", str(tmp_path / "demo.jsonl"),
        cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert not [line for line in out.stdout.splitlines() if line.startswith("trace ")]  # no tree
    assert out.stdout.count("rollout run-file-") == 4  # 2 tasks x 2 repeats
    spans = read_otlp_json_lines(tmp_path / "demo.jsonl")
    assert not wrote(tmp_path / "gymtrace-traces.jsonl")
    assert {s.service for s in spans} == SERVICES_OF_THE_DEMO
    repeats = {s.attributes[c.ROLLOUT_REPEAT] for s in spans if s.attributes.get(c.KIND) == c.KIND_ROLLOUT}
    assert repeats == {0, 1}
    assert check_trace(as_readable(spans)) == []
    # It ends with the run's report beside the file, as the local demo does: its four rollouts,
    # from the spans of every service.
    (line,) = [line for line in out.stdout.splitlines() if line.startswith("report: ")]
    report = Path(line.split()[1])
    assert report == (tmp_path / "gymtrace-report-run-file.html").resolve()
    page = report.read_text()
    assert 'class="gymtrace-timeline"' in page and "run-file" in page
    assert "data-figure=\"rollouts\" data-value='4'" in page
