"""instrument() against the real inspect-ai package and its built-in mockllm/model (no network)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gymtrace import attributes as c
from gymtrace.testing import CapturedSpans, check_trace

pytest.importorskip("inspect_ai")

import gymtrace.integrations.inspect_ai
from inspect_eval import run_arith_eval


def attrs(span: Any) -> dict[str, Any]:
    return dict(span.attributes or {})


def run_eval(tmp_path: Path, fails: dict[tuple[int, int], int], retries: int) -> Any:
    """4 samples x 2 epochs (tests/support/inspect_eval.py); sample 2 expects "5", so the model
    (always "4") gets it wrong. ``fails[(sample, epoch)]``: how many attempts raise first."""
    gymtrace.integrations.inspect_ai.instrument()
    return run_arith_eval(tmp_path, fails, retries=retries, target_of={2: "5"})


def test_each_sample_epoch_is_a_rollout_scored_from_its_score(
    captured: CapturedSpans, tmp_path: Path
) -> None:
    log = run_eval(tmp_path, {(3, 2): 1}, retries=1)
    assert log.status == "success"

    (run,) = captured.by_kind("run")
    roots = {attrs(s)[c.ROLLOUT_ID]: s for s in captured.by_kind("rollout")}
    expected = {f"arith.{i}.r{r}" for i in range(1, 5) for r in range(2)}
    assert set(roots) == expected
    for rollout_id, root in roots.items():
        a = attrs(root)
        sample = rollout_id.split(".")[1]
        assert a[c.RUN_ID] == attrs(run)[c.RUN_ID] == log.eval.run_id
        assert a[c.TASK_ID] == f"arith.{sample}"
        assert a[c.ROLLOUT_REPEAT] == int(rollout_id[-1])  # epoch - 1
        assert a[c.ROLLOUT_OUTCOME] == "scored"
        assert a[c.REWARD] == (0.0 if sample == "2" else 1.0)  # match(): C -> 1, I -> 0
        # Links to the run; one trace per rollout.
        assert [attrs_of_link(link) for link in root.links] == ["run"]

    # The sample that errored once: attempt 0 failed (retryable, Inspect re-ran it), attempt 1
    # scored, in one rollout and one trace.
    retried = roots["arith.3.r1"]
    assert attrs(retried)[c.ROLLOUT_ATTEMPTS] == 2
    episodes = sorted(
        (s for s in captured.by_kind("episode") if attrs(s)[c.ROLLOUT_ID] == "arith.3.r1"),
        key=lambda s: attrs(s)[c.EPISODE_ATTEMPT],
    )
    assert [attrs(e)[c.EPISODE_OUTCOME] for e in episodes] == ["failed", "completed"]
    assert attrs(episodes[0])[c.FAILURE_RETRYABLE] is True
    assert all(e.context.trace_id == retried.context.trace_id for e in episodes)
    assert [attrs_of_link(link) for link in episodes[1].links] == ["retry"]

    # Model calls are chat spans with usage, inside the episode of their sample.
    chats = captured.by_kind("model_call")
    assert len(chats) == 8
    episode_ids = {s.context.span_id: attrs(s) for s in captured.by_kind("episode")}
    for chat in chats:
        assert chat.name == "chat model"
        assert attrs(chat)[c.GEN_AI_PROVIDER_NAME] == "mockllm"
        assert attrs(chat)[c.GEN_AI_USAGE_INPUT_TOKENS] == 11
        assert attrs(chat)[c.GEN_AI_USAGE_OUTPUT_TOKENS] == 1
        assert chat.parent is not None
        episode = episode_ids[chat.parent.span_id]
        assert episode[c.EPISODE_OUTCOME] == "completed"
        assert attrs(chat)[c.ROLLOUT_ID] == episode[c.ROLLOUT_ID]
    # Scoring is the verify phase, after the solver, inside the still-open episode.
    for verify in captured.by_kind("verify"):
        assert verify.parent is not None and verify.parent.span_id in episode_ids
    # Read back as `gymtrace rollouts` reads it: each rollout's final outcome. Each is its root's
    # (`gymtrace tree` marks "=> final:" a root whose outcome an outcome record decided instead),
    # and no other rollout has a record of its own.
    assert "=> final:" not in captured.tree()
    assert {attrs(s)[c.ROLLOUT_ID] for s in captured.by_kind("outcome")} <= expected
    finals = {
        rollout_id: (
            attrs(root)[c.ROLLOUT_OUTCOME],
            attrs(root).get(c.REWARD),
            attrs(root)[c.ROLLOUT_ATTEMPTS],
        )
        for rollout_id, root in roots.items()
    }
    assert finals == {
        rollout_id: (
            "scored",
            0.0 if rollout_id.split(".")[1] == "2" else 1.0,
            2 if rollout_id == "arith.3.r1" else 1,
        )
        for rollout_id in expected
    }
    assert check_trace(captured) == []

    from readme_tree import check_readme_tree, excerpt

    # One trace at a time: samples run concurrently, so their start order varies.
    shown = [
        excerpt(
            [s for s in captured.spans if s.context.trace_id == roots[r].context.trace_id],
            [(log.eval.run_id, "RUN_ID")],
        )
        for r in ("arith.2.r1", "arith.3.r1")
    ]
    check_readme_tree("inspect_ai", "".join(shown))


def test_a_sample_ending_in_error_is_unscored(captured: CapturedSpans, tmp_path: Path) -> None:
    run_eval(tmp_path, {(1, 1): 5}, retries=1)

    roots = {attrs(s)[c.ROLLOUT_ID]: attrs(s) for s in captured.by_kind("rollout")}
    assert roots["arith.1.r0"][c.ROLLOUT_OUTCOME] == "unscored"
    assert c.REWARD not in roots["arith.1.r0"]
    assert roots["arith.1.r0"][c.ROLLOUT_ATTEMPTS] == 2
    failed = [attrs(s) for s in captured.by_kind("episode") if attrs(s)[c.ROLLOUT_ID] == "arith.1.r0"]
    assert sorted((e[c.EPISODE_ATTEMPT], e[c.FAILURE_RETRYABLE]) for e in failed) == [(0, True), (1, False)]
    assert roots["arith.1.r1"][c.ROLLOUT_OUTCOME] == "scored"
    assert check_trace(captured) == []


def attrs_of_link(link: Any) -> Any:
    return dict(link.attributes or {}).get(c.LINK_RELATION)


def test_score_values_map_to_rewards_by_inspects_rule() -> None:
    reward_of = gymtrace.integrations.inspect_ai.reward_of
    assert [reward_of(v) for v in ("C", "I", "P", "N", "yes", "false", "0.25", 3, True)] == [
        1.0,
        0.0,
        0.5,
        0.0,
        1.0,
        0.0,
        0.25,
        3.0,
        1.0,
    ]
    assert reward_of({"a": 1}) is None and reward_of([1, 0]) is None


def test_bad_scorer_argument_is_named() -> None:
    with pytest.raises(TypeError, match="'scorer'"):
        gymtrace.integrations.inspect_ai.instrument(scorer="")


def test_an_eval_inside_the_callers_run_adds_its_rollouts_to_that_run(
    captured: CapturedSpans, tmp_path: Path
) -> None:
    with gymtrace.run(run_id="campaign-7"):
        run_eval(tmp_path, {}, retries=0)
    assert [attrs(s)[c.RUN_ID] for s in captured.by_kind("run")] == ["campaign-7"]
    rollouts = captured.by_kind("rollout")
    assert len(rollouts) == 8 and {attrs(s)[c.RUN_ID] for s in rollouts} == {"campaign-7"}
    assert check_trace(captured) == []
