"""End to end: the distributed demo's processes (driver, agent, model, environment) and
the traces they leave, read back from the embedded default file and from a real Jaeger.

The demo kills the environment server in the middle of the first episode of one rollout; the driver
retries it (attempt 1) against a restarted server.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from _distributed import (
    IDENTITY,
    SERVICES_OF_THE_DEMO,
    ancestors,
    assert_no_duplicate_http_spans,
    assert_one_tree,
    boundary_pairs,
    by_trace,
    missing_identity,
)
from child_process import clean_env
from gymtrace import _constants as c
from gymtrace._model.spandata import SpanData, read_otlp_json_lines
from gymtrace.demo.distributed import TASKS, rollout_id_for

SERVICES = SERVICES_OF_THE_DEMO


def _run_demo(args: list[str], env_overrides: dict[str, str]) -> str:
    env = clean_env(**env_overrides)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gymtrace",
            "demo",
            "--distributed",
            "--quiet",
            "--repeats",
            "1",
            *args,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _check_rollouts(traces: dict[str, list[SpanData]], run_id: str) -> None:
    crashed = rollout_id_for(run_id, TASKS[-1]["id"], 0)
    for task in TASKS:
        rollout_id = rollout_id_for(run_id, task["id"], 0)
        (spans,) = [
            t for t in traces.values() if any(s.attributes.get(c.ROLLOUT_ID) == rollout_id for s in t)
        ]
        root = assert_one_tree(spans)
        assert root.attributes[c.KIND] == c.KIND_ROLLOUT and root.service == "gym-driver"
        assert {s.service for s in spans} == SERVICES
        assert {s.attributes.get(c.ROLLOUT_ID) for s in spans} == {rollout_id}
        # Attempt is an episode-level key: every span below an episode has it, in every service.
        assert missing_identity([s for s in spans if s is not root], IDENTITY) == []
        assert_no_duplicate_http_spans(spans)
        for parent, child in boundary_pairs(spans):
            assert (parent.span_kind, child.span_kind) == ("CLIENT", "SERVER"), (parent.name, child.name)
        episodes = sorted(
            (s for s in spans if s.attributes.get(c.KIND) == c.KIND_EPISODE),
            key=lambda s: s.attributes[c.EPISODE_ATTEMPT],
        )
        # Every span's attempt is the attempt of the episode it runs under, whatever the process.
        for span in spans:
            episode = next(
                (a for a in ancestors(span, spans) if a.attributes.get(c.KIND) == c.KIND_EPISODE), None
            )
            if episode is not None:
                assert span.attributes[c.EPISODE_ATTEMPT] == episode.attributes[c.EPISODE_ATTEMPT]
        if rollout_id != crashed:
            assert [e.attributes[c.EPISODE_ATTEMPT] for e in episodes] == [0]
            continue
        # The retry case.
        assert [e.attributes[c.EPISODE_ATTEMPT] for e in episodes] == [0, 1]
        first, second = episodes
        assert first.attributes[c.EPISODE_OUTCOME] == c.OUTCOME_FAILED
        assert first.attributes[c.FAILURE_KIND] == c.FAILURE_INFRASTRUCTURE
        assert second.attributes[c.EPISODE_OUTCOME] == c.OUTCOME_COMPLETED
        assert (
            root.attributes[c.ROLLOUT_ATTEMPTS] == 2
            and root.attributes[c.ROLLOUT_OUTCOME] == c.OUTCOME_SCORED
        )
        assert [link.span_id for link in second.links] == [first.span_id]
        env_attempts = {
            s.attributes[c.EPISODE_ATTEMPT]
            for s in spans
            if s.service == "gym-env" and s.span_kind == "SERVER"
        }
        assert env_attempts == {0, 1}
        interrupted = [s for s in spans if s.attributes.get(c.INTERRUPTED)]
        assert [(s.service, s.attributes[c.EPISODE_ATTEMPT]) for s in interrupted] == [("gym-env", 0)]


def test_demo_rollouts_are_one_tree_across_four_services_with_retry(tmp_path):
    out = tmp_path / "traces.jsonl"
    run_id = "e2e-file"
    stdout = _run_demo(["--file", str(out), "--run-id", run_id], {})
    assert "2 attempt(s), reward=1" in stdout
    _check_rollouts(by_trace(read_otlp_json_lines(out)), run_id)


# -- the same through Jaeger ---------------------------------------------------------------------------


def _from_jaeger(trace: dict) -> list[SpanData]:
    from pipeline import span_parent_id, span_service, span_tags

    spans = []
    for s in trace["spans"]:
        tags = span_tags(s)
        kind = str(tags.pop("span.kind", "internal")).upper()
        attributes = {k: v for k, v in tags.items() if not k.startswith(("otel.", "span.", "error"))}
        spans.append(
            SpanData(
                trace_id=s["traceID"].rjust(32, "0"),
                span_id=s["spanID"],
                parent_id=span_parent_id(s),
                name=s["operationName"],
                start_ns=s["startTime"] * 1000,
                end_ns=(s["startTime"] + s["duration"]) * 1000,
                attributes=attributes,
                links=tuple(
                    _Link(r["spanID"]) for r in s.get("references", []) if r["refType"] == "FOLLOWS_FROM"
                ),
                service=span_service(trace, s),
                span_kind=kind,
            )
        )
    return spans


class _Link:
    def __init__(self, span_id: str) -> None:
        self.span_id = span_id
        self.attributes: dict = {}


@pytest.mark.e2e
def test_demo_rollouts_in_jaeger_are_one_tree_per_rollout(pipeline):
    # Straight to Jaeger's OTLP receiver: the Collector's e2e tail sampling keeps only failed or
    # retried rollouts (sample percent 0), and this test needs the successful ones too.
    run_id = "e2e-jaeger"
    _run_demo(
        ["--run-id", run_id],
        {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{pipeline.jaeger_otlp_grpc_port}"},
    )
    traces: dict[str, list[SpanData]] = {}
    for task in TASKS:
        rollout_id = rollout_id_for(run_id, task["id"], 0)
        # Wait until every service's spans of the rollout's trace are stored.
        found = pipeline.wait_for_traces(
            "gym-driver",
            {c.ROLLOUT_ID: rollout_id},
            timeout=60,
            predicate=lambda ts: (
                len(ts) == 1 and {p["serviceName"] for p in ts[0]["processes"].values()} >= SERVICES
            ),
        )
        full = pipeline.get_trace(found[0]["traceID"])
        assert full is not None
        traces[full["traceID"]] = _from_jaeger(full)
    _check_rollouts(traces, run_id)
