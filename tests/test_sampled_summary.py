"""Head sampling and exact figures: a rollout the sampler drops leaves one summary span.

Its episodes, steps and calls stay dropped; the summary (``gym.rollout.detail=false``) carries what
the readers count, so ``stats``, pass@k and the training figures of a run sampled at 0.1 are those
of the same run unsampled.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import gymtrace
from child_process import run_gymtrace, run_python
from gymtrace import attributes as c
from gymtrace.sampling import keep_rollout
from gymtrace.testing import CapturedSpans, check_trace

SAMPLED_RUN = Path(__file__).parent / "support" / "sampled_run.py"
SEED, STEPS, TASKS, REPEATS = 7, 2, 10, 4


def _write_run(path: Path, ratio: str | None) -> None:
    env = {"GYMTRACE_FILE": str(path), "GYMTRACE_STRICT": "true"}
    if ratio is not None:
        env["GYMTRACE_SAMPLE_RATIO"] = ratio
    run_python(str(SAMPLED_RUN), str(SEED), str(STEPS), str(TASKS), str(REPEATS), env=env, check=True)


def _json_lines(*argv: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in run_gymtrace(*argv, check=True).stdout.splitlines()]


def _without(rows: list[dict[str, Any]], *keys: str) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k not in keys} for row in rows]


# What two executions of one seed cannot share: durations (the summary's is its own rollout's,
# checked in process below), trace IDs, the services of the episodes and, from the detail alone,
# the time split. Every count, reward, token and training figure must match.
_NOT_COMPARABLE = (
    "time_split",
    "time_share",
    "trace_id",
    "services",
    "detail",
    "rollouts_with_detail",
    "rollout_seconds_p50",
    "rollout_seconds_p99",
    "rollout_seconds",
    "wasted_seconds",
    "wasted_share",
    "slowest",
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("sampled")
    whole, sampled = folder / "whole.jsonl", folder / "sampled.jsonl"
    _write_run(whole, None)
    _write_run(sampled, "0.1")
    return whole, sampled


def test_a_run_sampled_at_a_tenth_reads_the_same_figures_as_the_whole_run(runs: tuple[Path, Path]) -> None:
    whole, sampled = runs
    (stats_whole,) = _json_lines("stats", str(whole), "--json", "--pass-k", "2")
    (stats_sampled,) = _json_lines("stats", str(sampled), "--json", "--pass-k", "2")
    rollouts = STEPS * TASKS * REPEATS
    assert stats_whole["scored"] + stats_whole["unscored"] == rollouts
    assert 0 < stats_whole["unscored"] < stats_whole["scored"]  # the run has both kinds
    assert _without([stats_sampled], *_NOT_COMPARABLE) == _without([stats_whole], *_NOT_COMPARABLE)
    kept = [
        f"s{s}-t{t}-r{r}"
        for s in range(STEPS)
        for t in range(TASKS)
        for r in range(REPEATS)
        if keep_rollout(f"s{s}-t{t}-r{r}", 0.1)
    ]
    assert 0 < len(kept) < rollouts / 2
    assert stats_whole["rollouts_with_detail"] == rollouts
    assert stats_sampled["rollouts_with_detail"] == len(kept)
    text = run_gymtrace("stats", str(sampled), check=True).stdout
    assert f"{len(kept)} of {rollouts} rollouts with detail" in text, text
    assert "with detail" not in run_gymtrace("stats", str(whole), check=True).stdout

    for view in ("train_step", "policy_version", "group"):
        by_whole = _json_lines("stats", str(whole), "--by", view, "--json")
        by_sampled = _json_lines("stats", str(sampled), "--by", view, "--json")
        assert len(by_whole) > 1
        assert _without(by_sampled, *_NOT_COMPARABLE) == _without(by_whole, *_NOT_COMPARABLE), view
    steps = _json_lines("stats", str(sampled), "--by", "train_step", "--json")
    for step in steps:  # every rollout's duration and tokens are at hand, with or without detail
        if "train_step" in step:
            assert step["wasted_output_tokens"] > 0 and step["slowest"] is not None
        else:
            assert step["rollout_seconds"] > 0 and step["wasted_seconds"] > 0

    rows_whole = _json_lines("rollouts", str(whole), "--json")
    rows_sampled = _json_lines("rollouts", str(sampled), "--json")
    assert _without(rows_sampled, *_NOT_COMPARABLE) == _without(rows_whole, *_NOT_COMPARABLE)
    assert sorted(r["rollout_id"] for r in rows_sampled if r["detail"]) == sorted(kept)


def test_a_sampled_run_passes_check_and_keeps_only_the_kept_rollouts_detail(runs: tuple[Path, Path]) -> None:
    _, sampled = runs
    out = run_gymtrace("check", str(sampled), check=True).stdout
    assert f"{STEPS * TASKS * REPEATS} rollouts, no contract violations" in out, out
    lines = [json.loads(line) for line in sampled.read_text().splitlines()]
    spans = [
        span
        for line in lines
        for resource in line["resourceSpans"]
        for scope in resource["scopeSpans"]
        for span in scope["spans"]
    ]

    def attributes(span: dict[str, Any]) -> dict[str, Any]:
        return {a["key"]: next(iter(a["value"].values())) for a in span.get("attributes", [])}

    below = {c.KIND_EPISODE, c.KIND_MODEL_CALL, c.KIND_VERIFY}
    for span in spans:
        found = attributes(span)
        rollout_id = found.get(c.ROLLOUT_ID)
        if rollout_id is None or keep_rollout(rollout_id, 0.1):
            continue
        # A dropped rollout: its summary and nothing below it (outcome records aside).
        assert found[c.KIND] not in below, found
        if found[c.KIND] == c.KIND_ROLLOUT:
            assert found[c.ROLLOUT_DETAIL] is False


# -- the summary span, in process -------------------------------------------------------------------


@pytest.fixture
def sampled_out(capture_sampled: Any) -> Iterator[CapturedSpans]:
    """A provider whose rollout sampler keeps no rollout (ratio 0), gymtrace's ID generator, and
    an in-memory capture: every rollout here is a dropped one."""
    from gymtrace.sampling import RolloutSampler

    with capture_sampled(RolloutSampler(0.0)) as captured:
        yield captured


def _final(captured: CapturedSpans, rollout_id: str) -> str:
    """A rollout's line in `gymtrace tree` (``captured.tree()``): its own outcome, and after
    ``=> final:`` the final outcome, where an outcome record decided it."""
    (line,) = [line for line in captured.tree().splitlines() if f" rollout={rollout_id} " in line]
    return line


def test_a_dropped_rollout_leaves_one_summary_span_with_its_figures_in_its_own_place(
    sampled_out: CapturedSpans,
) -> None:
    gymtrace.set_policy_version(3)
    before = time.time_ns()
    try:
        with gymtrace.run(run_id="run-summary") as run:
            with gymtrace.rollout(
                rollout_id="r-1", task_id="t-1", repeat=2, group_id="g-1", group_size=4, train_step=5
            ) as rollout:
                for attempt in gymtrace.attempts(2):
                    with attempt, gymtrace.step(), gymtrace.model_call(model="m"):
                        gymtrace.record_usage(input_tokens=100, output_tokens=10)
                        if attempt.index == 0:
                            attempt.fail()
                        else:
                            gymtrace.record_reward(0.75)
                gymtrace.set_policy_version(4)  # the weights changed before it ended
                dropped = (rollout.trace_id, rollout.span_id)
    finally:
        gymtrace.set_policy_version(None)
    after = time.time_ns()
    spans = sampled_out.spans
    summary = next(s for s in spans if s.attributes.get(c.KIND) == c.KIND_ROLLOUT)
    assert sorted(s.attributes[c.KIND] for s in spans) == ["rollout", "run"]  # its detail dropped
    assert dict(summary.attributes) == {
        c.RUN_ID: "run-summary",
        c.ROLLOUT_ID: "r-1",
        c.TASK_ID: "t-1",
        c.ROLLOUT_REPEAT: 2,
        c.GROUP_ID: "g-1",
        c.GROUP_SIZE: 4,
        c.TRAIN_STEP: 5,
        c.POLICY_VERSION: 3,
        c.POLICY_VERSION_END: 4,
        c.KIND: c.KIND_ROLLOUT,
        c.ROLLOUT_ATTEMPTS: 2,
        c.ROLLOUT_OUTCOME: c.OUTCOME_SCORED,
        c.REWARD: 0.75,
        c.GEN_AI_USAGE_INPUT_TOKENS: 200,
        c.GEN_AI_USAGE_OUTPUT_TOKENS: 20,
        c.ROLLOUT_DETAIL: False,
    }
    # Where the rollout's own span would have been: its trace and span IDs, a root linked to the run.
    assert (format(summary.context.trace_id, "032x"), format(summary.context.span_id, "016x")) == dropped
    assert summary.context.trace_flags.sampled and summary.parent is None
    assert [link.context.span_id for link in summary.links] == [int(run.span_id, 16)]
    # Its duration is the rollout's: from its start to its end, inside the block around it.
    assert before <= summary.start_time < summary.end_time <= after
    # Read back as `gymtrace tree` reads it: the summary's own outcome is final.
    line = _final(sampled_out, "r-1")
    assert "outcome=scored attempts=2 reward=0.75 " in line and " detail=False " in line
    assert "=> final:" not in line
    assert check_trace(spans) == []


def test_an_outcome_handed_off_from_a_dropped_rollout_concludes_its_summary(
    sampled_out: CapturedSpans,
) -> None:
    with gymtrace.rollout(rollout_id="r-handed", task_id="t") as rollout, gymtrace.episode() as episode:
        carrier = episode.carrier()  # the episode goes on elsewhere: this rollout ends pending
    with gymtrace.episode(continue_from=carrier):
        gymtrace.record_reward(1.0)
    spans = sampled_out.spans
    summary = next(s for s in spans if s.attributes.get(c.KIND) == c.KIND_ROLLOUT)
    assert summary.attributes[c.ROLLOUT_OUTCOME] == c.OUTCOME_PENDING
    records = [s for s in spans if s.attributes.get(c.KIND) == c.KIND_OUTCOME]
    assert len(records) == 1 and len(spans) == 2  # the continued episode itself stays dropped
    # The record was written under the dropped rollout span, which the summary stands in for.
    assert records[0].parent is not None and records[0].parent.span_id == summary.context.span_id
    assert format(summary.context.span_id, "016x") == rollout.span_id
    line = _final(sampled_out, "r-handed")  # the record concludes it
    assert " detail=False " in line and "=> final: outcome=scored reward=1 " in line
    assert check_trace(spans) == []


def test_a_summary_under_one_trace_per_run_sits_below_the_run(
    sampled_out: CapturedSpans, forget_configure: None
) -> None:
    gymtrace.configure(trace_per="run", file=False)
    with gymtrace.run(run_id="run-one-trace") as run, gymtrace.rollout(rollout_id="r-in-run"):
        with gymtrace.episode():
            gymtrace.record_reward(0.5)
    spans = sampled_out.spans
    summary = next(s for s in spans if s.attributes.get(c.KIND) == c.KIND_ROLLOUT)
    assert format(summary.context.trace_id, "032x") == run.trace_id
    assert summary.parent is not None and format(summary.parent.span_id, "016x") == run.span_id
    assert summary.attributes[c.REWARD] == 0.5 and summary.attributes[c.ROLLOUT_DETAIL] is False
    assert check_trace(spans) == []
