"""Bad identity and outcome arguments: a clear error naming the argument in strict mode, a warning
and a dropped attribute otherwise, and never a broken call."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

import gymtrace
from gymtrace import attributes as c
from gymtrace.testing import capture_spans

BAD = [
    (lambda: gymtrace.rollout(rollout_id=123), "rollout", "rollout_id", c.ROLLOUT_ID, "must be a string"),  # type: ignore[arg-type]
    (lambda: gymtrace.rollout(rollout_id=""), "rollout", "rollout_id", c.ROLLOUT_ID, "must not be empty"),
    (lambda: gymtrace.rollout(rollout_id="r\n1"), "rollout", "rollout_id", c.ROLLOUT_ID, "printable"),
    (lambda: gymtrace.rollout(rollout_id="r" * 10_000), "rollout", "rollout_id", c.ROLLOUT_ID, "at most 256"),
    (lambda: gymtrace.rollout(task_id=b"t"), "rollout", "task_id", c.TASK_ID, "must be a string"),  # type: ignore[arg-type]
    (lambda: gymtrace.rollout(repeat=-1), "rollout", "repeat", c.ROLLOUT_REPEAT, ">= 0"),
    (lambda: gymtrace.rollout(repeat=1.5), "rollout", "repeat", c.ROLLOUT_REPEAT, "must be an int"),  # type: ignore[arg-type]
    (lambda: gymtrace.rollout(repeat=True), "rollout", "repeat", c.ROLLOUT_REPEAT, "must be an int"),
    (lambda: gymtrace.episode(attempt=-2), "episode", "attempt", None, ">= 0"),
    (lambda: gymtrace.run(run_id=7), "run", "run_id", None, "must be a string"),  # type: ignore[arg-type]
    (lambda: gymtrace.step(number=0), "step", "number", None, ">= 1"),
    (
        lambda: gymtrace.model_call(model=["gpt"]),
        "model_call",
        "model",
        c.GEN_AI_REQUEST_MODEL,
        "must be a string",
    ),  # type: ignore[arg-type]
]
IDS = [f"{kind}-{argument}-{i}" for i, (_, kind, argument, _, _) in enumerate(BAD)]


@pytest.mark.parametrize(("make", "kind", "argument", "attribute", "problem"), BAD, ids=IDS)
def test_bad_argument_is_an_error_naming_it_in_strict_mode(
    make: Callable[[], Any], kind: str, argument: str, attribute: str | None, problem: str
) -> None:
    with capture_spans(strict=True), pytest.raises(gymtrace.InvalidArgumentError) as info:
        make()
    assert f"gymtrace.{kind}(): argument {argument!r}" in str(info.value)
    assert problem in str(info.value)


@pytest.mark.parametrize(("make", "kind", "argument", "attribute", "problem"), BAD, ids=IDS)
def test_bad_argument_is_warned_and_dropped_and_the_call_still_runs(
    caplog: pytest.LogCaptureFixture,
    make: Callable[[], Any],
    kind: str,
    argument: str,
    attribute: str | None,
    problem: str,
) -> None:
    with capture_spans(strict=False) as captured, caplog.at_level(logging.WARNING, "gymtrace"):
        scope = make()

        @scope
        def work(x: int) -> int:
            return x + 1

        assert work(1) == 2
    (span,) = captured.by_kind(kind)
    if attribute is not None and attribute != c.ROLLOUT_ID:
        assert attribute not in span.attributes
    if attribute == c.ROLLOUT_ID:
        assert (
            span.attributes[c.ROLLOUT_ID] != "" and len(span.attributes[c.ROLLOUT_ID]) <= 256
        )  # a generated ID
    if argument == "number":
        assert span.attributes[c.STEP_NUMBER] == 1  # the bad number dropped, the default used
    warnings = [r.getMessage() for r in caplog.records if f"argument {argument!r}" in r.getMessage()]
    assert len(warnings) == 1 and problem in warnings[0]


def test_bad_value_from_an_identity_callable_is_dropped_at_call_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    @gymtrace.rollout(rollout_id=lambda row: row["id"], task_id=lambda row: row.get("task"))
    def rollout(row: dict[str, Any]) -> str:
        return "ran"

    with capture_spans(strict=False) as captured, caplog.at_level(logging.WARNING, "gymtrace"):
        assert rollout({"id": 42, "task": "t-1"}) == "ran"
    span = captured.one("rollout")
    assert span.attributes[c.TASK_ID] == "t-1"
    assert span.attributes[c.ROLLOUT_ID] != 42
    assert any("argument 'rollout_id' must be a string" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("reward", [float("nan"), float("-inf"), "0.5", None, [1.0]])
def test_bad_reward_is_warned_and_not_recorded(caplog: pytest.LogCaptureFixture, reward: Any) -> None:
    with capture_spans(strict=False) as captured, caplog.at_level(logging.WARNING, "gymtrace"):
        with gymtrace.rollout(rollout_id="r"), gymtrace.episode():
            gymtrace.record_reward(reward)
    assert c.REWARD not in captured.one("episode").attributes
    assert captured.one("rollout").attributes[c.ROLLOUT_OUTCOME] == "unscored"
    assert any("argument 'value'" in r.getMessage() for r in caplog.records)


def test_bad_usage_counts_are_dropped_without_breaking_the_call(caplog: pytest.LogCaptureFixture) -> None:
    with capture_spans(strict=False) as captured, caplog.at_level(logging.WARNING, "gymtrace"):
        with gymtrace.model_call(model="m") as call:
            call.record_usage(input_tokens=-5, output_tokens="many")  # type: ignore[arg-type]
    attributes = captured.one("model_call").attributes
    assert c.GEN_AI_USAGE_INPUT_TOKENS not in attributes
    assert c.GEN_AI_USAGE_OUTPUT_TOKENS not in attributes
