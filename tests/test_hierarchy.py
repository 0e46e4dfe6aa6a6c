"""Inverted nesting is reported: once per call site with an attribute, or raised in strict mode."""

from __future__ import annotations

import logging
from typing import Any

import pytest

import gymtrace
from gymtrace import attributes as c
from gymtrace.testing import capture_spans


def test_episode_inside_step_raises_in_strict_mode() -> None:
    with capture_spans(strict=True), gymtrace.step():
        with pytest.raises(gymtrace.HierarchyViolationError, match="episode opened inside step"):
            with gymtrace.episode():
                pass


def test_inversion_is_marked_and_logged_once_per_call_site(caplog: pytest.LogCaptureFixture) -> None:
    @gymtrace.rollout
    def nested_rollout() -> str:
        return "still runs"

    with capture_spans(strict=False) as captured, caplog.at_level(logging.WARNING, "gymtrace"):
        with gymtrace.episode():
            for _ in range(3):
                assert nested_rollout() == "still runs"
            for _ in range(2):
                with gymtrace.run():
                    pass
    rollouts = captured.by_kind("rollout")
    assert [s.attributes[c.HIERARCHY_VIOLATION] for s in rollouts] == ["rollout inside episode"] * 3
    assert [s.attributes[c.HIERARCHY_VIOLATION] for s in captured.by_kind("run")] == [
        "run inside episode"
    ] * 2
    messages = [r.getMessage() for r in caplog.records if "opened inside" in r.getMessage()]
    assert len(messages) == 2  # one per call site, not per call
    assert any("nested_rollout" in m for m in messages)
    assert any("test_hierarchy.py" in m for m in messages)


@pytest.mark.parametrize(
    ("outer", "inner"),
    [
        (lambda: gymtrace.tool_call(tool_name="spawn"), lambda: gymtrace.agent_invocation(agent_name="sub")),
        (lambda: gymtrace.tool_call(tool_name="llm_tool"), lambda: gymtrace.model_call(model="m")),
        (lambda: gymtrace.tool_call(tool_name="composite"), lambda: gymtrace.tool_call(tool_name="part")),
        (lambda: gymtrace.verify(), lambda: gymtrace.model_call(model="judge")),
        (lambda: gymtrace.seed_session(), lambda: gymtrace.tool_call(tool_name="setup")),
        (lambda: gymtrace.rollout(), lambda: gymtrace.step()),  # levels may be skipped
    ],
    ids=["subagent", "llm-tool", "composite-tool", "judge", "setup-tool", "skipped-levels"],
)
def test_allowed_nestings_are_not_violations(outer: Any, inner: Any) -> None:
    with capture_spans(strict=True) as captured, outer(), inner():
        pass
    assert all(c.HIERARCHY_VIOLATION not in s.attributes for s in captured.spans)


def test_subagent_turns_and_steps_nest_under_the_spawning_tool() -> None:
    with capture_spans(strict=True) as captured:
        with gymtrace.episode(), gymtrace.agent_invocation(agent_name="root"), gymtrace.step():
            with gymtrace.tool_call(tool_name="delegate"), gymtrace.agent_invocation(agent_name="sub"):
                with gymtrace.turn(), gymtrace.step():
                    pass
    sub = next(s for s in captured.spans if s.name == "invoke_agent sub")
    tool = captured.one("tool_call")
    assert sub.parent.span_id == tool.get_span_context().span_id
    sub_turn = captured.one("turn")
    assert sub_turn.parent.span_id == sub.get_span_context().span_id
    sub_step = next(
        s for s in captured.by_kind("step") if s.parent.span_id == sub_turn.get_span_context().span_id
    )
    assert sub_step.attributes[c.STEP_NUMBER] == 1  # numbered within the subagent's own invocation
