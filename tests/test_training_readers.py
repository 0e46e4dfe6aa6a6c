"""Training runs read back; private: main(argv) in process, the consumed records' keys (``_constants``).

`rollouts --json` training keys, `stats --by ...`, and `check`'s rules."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import gymtrace
from gymtrace import _constants as c
from gymtrace._cli import main
from gymtrace._model.spandata import encode_otlp_json
from gymtrace.testing import CapturedSpans, capture_spans, check_trace
from training_state import no_policy_version  # noqa: F401 - an autouse fixture

TOKENS = 10  # output tokens per model call


def _rollout(
    group: str, size: int, sample: int, reward: float, *, update_to: int | None = None
) -> dict[str, Any]:
    with gymtrace.rollout(rollout_id=f"{group}-{sample}", group_id=group, group_size=size):
        with gymtrace.episode():
            with gymtrace.model_call(model="policy") as call:
                call.record_usage(output_tokens=TOKENS)
            if update_to is not None:
                gymtrace.set_policy_version(update_to)  # a weight update mid-rollout
            keys = gymtrace.current().join_keys()
            with gymtrace.verify():
                gymtrace.record_reward(reward)
    return keys


def _training_run() -> None:
    """Version 0 generates group a (4 samples, rewards 1,0,1,0); its last sample sees the update to
    version 1, which generates group b (2 samples, both 1: zero variance) and c-0. Step 1 (version 1)
    trains on a (staleness 1) and filters b (staleness 0); c-0 is never consumed."""
    gymtrace.set_policy_version(0)
    with gymtrace.run(run_id="grpo"):
        a = [
            _rollout("a", 4, n, reward, update_to=1 if n == 3 else None)
            for n, reward in enumerate((1, 0, 1, 0))
        ]
        b = [_rollout("b", 2, n, 1.0) for n in range(2)]
        _rollout("c", 1, 0, 0.5)
        with gymtrace.train_step(step=1):
            for keys in a:
                gymtrace.consume(keys)
            for keys in b:
                gymtrace.consume(keys, outcome="filtered", reason="zero_variance_group")


def _write(captured: CapturedSpans, path: Path) -> Path:
    path.write_text(json.dumps(encode_otlp_json(captured.spans)) + "\n")
    return path


def _json_lines(capsys: pytest.CaptureFixture[str], argv: list[str]) -> list[dict[str, Any]]:
    assert main(argv) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def _seconds(span: Any) -> float:
    return (span.end_time - span.start_time) / 1e9


def test_rollouts_json_rows_carry_group_version_and_what_the_trainer_did(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with capture_spans() as captured:
        _training_run()
    path = _write(captured, tmp_path / "run.jsonl")
    rows = {row["rollout_id"]: row for row in _json_lines(capsys, ["rollouts", "--json", str(path)])}
    assert rows["a-0"]["group_id"] == "a" and rows["a-0"]["group_size"] == 4
    assert (rows["a-0"]["policy_version"], rows["a-0"]["policy_version_end"]) == (0, None)
    assert (rows["a-3"]["policy_version"], rows["a-3"]["policy_version_end"]) == (0, 1)
    assert {k: rows["a-1"][k] for k in ("consumed_by", "training_outcome", "staleness")} == {
        "consumed_by": 1,
        "training_outcome": "trained",
        "staleness": 1,
    }
    assert rows["b-0"]["training_outcome"] == "filtered"
    assert rows["c-0"]["training_outcome"] == "unconsumed" and rows["c-0"]["consumed_by"] is None
    assert rows["c-0"]["policy_version"] == 1


def test_a_rollout_of_a_run_without_train_steps_has_no_training_outcome(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with capture_spans() as captured, gymtrace.run(run_id="eval"), gymtrace.rollout(rollout_id="r"):
        pass
    [row] = _json_lines(capsys, ["rollouts", "--json", str(_write(captured, tmp_path / "eval.jsonl"))])
    assert row["training_outcome"] is None and row["group_id"] is None and row["staleness"] is None


def test_stats_by_train_step_gives_outcomes_wasted_work_staleness_and_the_slowest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with capture_spans() as captured:
        _training_run()
    path = _write(captured, tmp_path / "run.jsonl")
    step, run = _json_lines(capsys, ["stats", "--by", "train_step", "--json", str(path)])
    rollouts = {s.attributes[c.ROLLOUT_ID]: s for s in captured.by_kind("rollout")}
    consumed = [rollouts[f"a-{n}"] for n in range(4)] + [rollouts[f"b-{n}"] for n in range(2)]
    assert step["train_step"] == 1 and step["policy_version"] == 1 and step["consumed"] == 6
    assert step["outcomes"] == {"trained": 4, "filtered": 2, "stale": 0, "aborted": 0, "failed": 0}
    assert step["wasted_seconds"] == pytest.approx(
        sum(_seconds(rollouts[f"b-{n}"]) for n in range(2)), abs=1e-5
    )
    assert step["wasted_output_tokens"] == 2 * TOKENS
    assert step["staleness_p50"] == 1 and step["staleness_max"] == 1  # a: 1, 1, 1, 1; b: 0, 0
    assert step["mean_reward_trained"] == 0.5
    slowest = max(consumed, key=_seconds)
    assert step["slowest"]["rollout_id"] == slowest.attributes[c.ROLLOUT_ID]
    not_trained = sum(_seconds(s) for s in (rollouts["b-0"], rollouts["b-1"], rollouts["c-0"]))
    total = sum(_seconds(s) for s in rollouts.values())
    assert run["run_id"] == "grpo" and run["unconsumed"] == 1
    assert run["wasted_share"] == pytest.approx(not_trained / total, rel=1e-3)
    # And the text form says the same in one line each.
    assert main(["stats", "--by", "train_step", str(path)]) == 0
    text = capsys.readouterr().out
    assert "step 1 (policy 1): 6 consumed (4 trained, 2 filtered)" in text and "1 rollouts unconsumed" in text


def test_stats_by_policy_version_counts_rollouts_tokens_and_those_that_ended_under_a_newer_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with capture_spans() as captured:
        _training_run()
    path = _write(captured, tmp_path / "run.jsonl")
    v0, v1 = _json_lines(capsys, ["stats", "--by", "policy_version", "--json", str(path)])
    assert (v0["policy_version"], v0["rollouts"], v0["ended_under_newer"]) == (0, 4, 1)
    assert v0["mean_reward"] == 0.5
    # a-3's model call ran before the update: its tokens are version 0's.
    assert v0["output_tokens"] == 4 * TOKENS
    assert (v1["policy_version"], v1["rollouts"], v1["ended_under_newer"]) == (1, 3, 0)
    assert v1["output_tokens"] == 3 * TOKENS and v1["mean_reward"] == pytest.approx(2.5 / 3)


def test_stats_by_group_shows_size_members_reward_spread_and_zero_variance(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with capture_spans() as captured:
        _training_run()
    path = _write(captured, tmp_path / "run.jsonl")
    groups = {g["group_id"]: g for g in _json_lines(capsys, ["stats", "--by", "group", "--json", str(path)])}
    a, b = groups["a"], groups["b"]
    assert (a["group_size"], a["members"], a["mean_reward"], a["reward_std"]) == (4, 4, 0.5, 0.5)
    assert a["zero_variance"] is False and a["outcomes"] == {"trained": 4}
    assert b["zero_variance"] is True and b["outcomes"] == {"filtered": 2}
    assert groups["c"]["outcomes"] == {"unconsumed": 1}


def test_a_training_run_as_gymtrace_writes_it_passes_check(captured: CapturedSpans) -> None:
    _training_run()
    assert check_trace(captured.spans) == []


def test_check_reports_a_rollout_trained_twice_and_negative_staleness(captured: CapturedSpans) -> None:
    gymtrace.set_policy_version(5)
    with gymtrace.run(run_id="run"):
        keys = _rollout("g", 1, 0, 1.0)
        with gymtrace.train_step(step=1, policy_version=4):  # older than the rollout's weights
            gymtrace.consume(keys)
        with gymtrace.train_step(step=2, policy_version=6):
            gymtrace.consume(keys)
    problems = check_trace(captured.spans)
    assert any("trained 2 times (train steps 1, 2)" in p for p in problems), problems
    assert any("staleness -1" in p for p in problems), problems


def test_check_reports_a_group_with_more_members_than_its_size(captured: CapturedSpans) -> None:
    with gymtrace.run(run_id="run"):
        for n in range(3):
            _rollout("g", 2, n, 1.0)
    problems = check_trace(captured.spans)
    assert problems == ["group g: 3 rollouts, declared gym.group.size 2"]


def test_check_notes_a_consumed_id_that_no_rollout_of_the_input_has(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with capture_spans() as captured:
        with gymtrace.run(run_id="run"):
            _rollout("g", 1, 0, 1.0)
            with gymtrace.train_step(step=1):
                gymtrace.consume("sampled-out-7")
    assert main(["check", str(_write(captured, tmp_path / "run.jsonl"))]) == 0
    out = capsys.readouterr().out
    assert "rollout sampled-out-7: consumed by a train step but not in the input" in out
    assert "carry no rollout identity" not in out  # the step and its records are no such spans


def test_the_tree_shows_a_train_step_and_counts_its_records_links(captured: CapturedSpans) -> None:
    gymtrace.set_policy_version(0)
    with gymtrace.run(run_id="run"):
        keys = [_rollout("g", 2, n, float(n)) for n in range(2)]
        with gymtrace.train_step(step=4):
            for k in keys:
                gymtrace.consume(k)
    tree = captured.tree()
    assert "gym.train_step [train_step]" in tree and "step=4 policy=0 consumed=2" in tree
    assert "gym.consumed [consumed]" in tree and "rollouts=2 ->2 rollout spans" in tree
    assert "group=g policy=0" in tree  # on the rollout lines


def test_stats_by_train_step_splits_each_steps_time_as_its_consumed_rollouts_sum(
    captured: CapturedSpans, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _training_run()
    path = _write(captured, tmp_path / "run.jsonl")
    rows = {r["rollout_id"]: r for r in _json_lines(capsys, ["rollouts", str(path), "--json"])}
    (step, _run) = _json_lines(capsys, ["stats", "--by", "train_step", str(path), "--json"])
    consumed = [rows[f"a-{n}"] for n in range(4)] + [rows[f"b-{n}"] for n in range(2)]
    for part in c.SPLIT_PARTS:
        assert step["time_split"][part] == pytest.approx(
            sum(r["time_split"][part] for r in consumed), abs=1e-9
        )
    assert step["time_split"]["model"] > 0 and step["time_split"]["verify"] > 0
