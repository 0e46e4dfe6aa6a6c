"""A model-based test of the outcome rule: Hypothesis writes harness programs, gymtrace records them,
and what every reader reports (``gymtrace rollouts --json``, ``stats --json``, ``check``, the
rollout span itself) must equal a small reference model of the seed's rules, or a warning must have
said, when the program recorded it, what was thrown away.

The reference model below is written from DESIGN.md §1 and §8, not from ``_outcome_rule``: a
rollout has at most one reward, its final attempt's; a failed or cancelled final attempt is
unscored, never 0; a rollout without episodes is one implicit attempt; a reward after the final
episode (inside the rollout, later, or from another process) scores that episode if it completed; a
rollout that handed its episode to another process and has no outcome of its own is pending.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gymtrace
from gymtrace import _cli, propagation
from gymtrace._spandata import encode_otlp_json
from gymtrace.testing import capture_spans, check_trace

# One step of an episode: record a reward, or take the headers another process would continue from.
REWARDS = st.sampled_from([0.0, 0.25, 0.5, 1.0])
ENDINGS = ("completed", "record_failure", "raise", "cancel")


@dataclass(frozen=True)
class EpisodeSpec:
    rewards: tuple[float, ...]
    ending: str
    handoff: bool
    restored: bool


@dataclass(frozen=True)
class Program:
    episodes: tuple[EpisodeSpec, ...]
    # Without episodes: rewards recorded on the rollout itself, and whether an exception escapes it.
    rollout_rewards: tuple[float, ...] = ()
    rollout_raises: bool = False
    # Rewards recorded in a verify() between the last episode and the rollout's end.
    after: tuple[float, ...] = ()
    # A reward recorded after the rollout ended: on the rollout (late) or in a continuation of the
    # final episode's headers (remote, as a scorer process would).
    late: float | None = None
    remote: float | None = None


@dataclass
class Expected:
    outcome: str
    reward: float | None
    attempts: int
    warned: bool = False
    reasons: list[str] = field(default_factory=list)


def model(program: Program) -> Expected:
    """The seed's rules, written out for the programs above."""
    warned: list[str] = []
    if not program.episodes:
        rewards = list(program.rollout_rewards)
        if program.late is not None:
            rewards.append(program.late)
        if program.rollout_raises:
            if program.rollout_rewards or program.late is not None:
                warned.append("reward of a rollout that failed")
            return Expected("unscored", None, 1, bool(warned), warned)
        if not rewards:
            return Expected("unscored", None, 1)
        return Expected("scored", rewards[-1], 1, bool(warned), warned)
    final_index = len(program.episodes) - 1
    for index, episode in enumerate(program.episodes):
        if not episode.rewards:
            continue
        if episode.ending != "completed":
            warned.append(f"reward of {episode.ending} attempt {index}")
        elif index < final_index:
            warned.append(f"reward of superseded attempt {index}")
    final = program.episodes[-1]
    completed = final.ending == "completed"
    later = [*program.after, *([program.late] if program.late is not None else [])]
    if not completed and (program.after or program.late is not None):
        warned.append("reward after a failed final attempt")
    if not completed:
        return Expected("unscored", None, len(program.episodes), bool(warned), warned)
    rewards = [*final.rewards, *later]
    if program.remote is not None:
        rewards.append(program.remote)
    if rewards:
        return Expected("scored", rewards[-1], len(program.episodes), bool(warned), warned)
    handed = any(e.handoff for e in program.episodes)
    return Expected("pending" if handed else "unscored", None, len(program.episodes), bool(warned), warned)


@st.composite
def programs(draw: st.DrawFn) -> Program:
    count = draw(st.integers(min_value=0, max_value=3))
    episodes = tuple(
        EpisodeSpec(
            rewards=tuple(draw(st.lists(REWARDS, max_size=2))),
            ending=draw(st.sampled_from(ENDINGS)),
            handoff=draw(st.booleans()),
            restored=index > 0 and draw(st.booleans()),
        )
        for index in range(count)
    )
    if not episodes:
        return Program(
            episodes=(),
            rollout_rewards=tuple(draw(st.lists(REWARDS, max_size=2))),
            rollout_raises=draw(st.booleans()),
            late=draw(st.none() | REWARDS),
        )
    return Program(
        episodes=episodes,
        after=tuple(draw(st.lists(REWARDS, max_size=1))),
        late=draw(st.none() | REWARDS),
        # A scorer continues the final episode only where it took headers in it.
        remote=draw(st.none() | REWARDS) if episodes[-1].handoff else None,
    )


def run(program: Program) -> None:
    """The harness, written the way people write one: a rollout, its episodes, a scorer."""
    headers: dict[str, str] | None = None
    with contextlib.suppress(ConnectionError), gymtrace.rollout(rollout_id="r-model", task_id="t") as rollout:
        if not program.episodes:
            for value in program.rollout_rewards:
                gymtrace.record_reward(value)
            if program.rollout_raises:
                raise ConnectionError("environment lost")
        for spec in program.episodes:
            try:
                with gymtrace.episode(restored_from=True if spec.restored else None):
                    if spec.handoff:
                        headers = dict(
                            propagation.inject({}, destination=propagation.GYM_INTERNAL, continuation=True)
                        )
                    for value in spec.rewards:
                        gymtrace.record_reward(value)
                    if spec.ending == "record_failure":
                        gymtrace.record_failure("infrastructure", message="sandbox lost")
                    elif spec.ending == "raise":
                        raise ConnectionError("sandbox lost")
                    elif spec.ending == "cancel":
                        raise KeyboardInterrupt
            except (ConnectionError, KeyboardInterrupt):
                pass  # the harness moves on to its next attempt
        for value in program.after:
            with gymtrace.verify():
                gymtrace.record_reward(value)
    if program.late is not None:
        gymtrace.record_reward(program.late, scope=rollout)
    if program.remote is not None and headers is not None:
        with propagation.attach(headers), gymtrace.verify():
            gymtrace.record_reward(program.remote)


def _cli_json(*argv: str) -> list[dict[str, object]]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert _cli.main(list(argv)) == 0
    return [json.loads(line) for line in out.getvalue().splitlines()]


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@settings(
    max_examples=200,
    deadline=None,
    derandomize=True,  # the same programs on every run: CI stays deterministic
    suppress_health_check=[HealthCheck.too_slow],
)
@given(programs())
def test_every_reader_reports_the_reference_models_outcome_or_a_warning_said_why(program: Program) -> None:
    expected = model(program)
    warnings = _Warnings()
    logger = logging.getLogger("gymtrace")
    logger.addHandler(warnings)
    try:
        with capture_spans(strict=False) as captured:
            run(program)
    finally:
        logger.removeHandler(warnings)
    # Said once per rollout, when it was recorded, and only when something was thrown away.
    discards = [m for m in warnings.messages if "r-model" in m or "never scored" in m]
    assert bool(discards) == expected.warned, (program, expected.reasons, warnings.messages)
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "trace.jsonl"
        path.write_text(json.dumps(encode_otlp_json(captured.spans)) + "\n")
        (row,) = _cli_json("rollouts", str(path), "--json")
        (stats,) = _cli_json("stats", str(path), "--json")
    assert (row["outcome"], row["attempts"]) == (expected.outcome, expected.attempts), program
    if expected.reward is None:
        assert row["reward"] is None, program
    else:
        assert isinstance(row["reward"], float) and math.isclose(row["reward"], expected.reward), program
    key = str(expected.outcome)
    assert stats[key] == 1 and stats["inputs"] == (1 if key == "scored" else 0), (program, stats)
    # The rollout span agrees wherever it could know (nothing came after it ended).
    (root,) = captured.by_kind("rollout")
    if program.late is None and program.remote is None:
        assert root.attributes["gym.rollout.outcome"] == expected.outcome, program
    # No trace gymtrace writes fails its own check unless a warning said so when it was written.
    if not expected.warned:
        assert check_trace(captured) == [], program


@pytest.mark.parametrize(
    ("program", "outcome", "reward", "attempts"),
    [
        # verify() after the episode, still inside the rollout: scores the final episode.
        (Program((EpisodeSpec((), "completed", False, False),), after=(1.0,)), "scored", 1.0, 1),
        # No episode: a reward, then a ConnectionError escaping the rollout: unscored, one attempt.
        (Program((), rollout_rewards=(0.5,), rollout_raises=True), "unscored", None, 1),
        # No episode, no error: one implicit attempt.
        (Program((), rollout_rewards=(0.5,)), "scored", 0.5, 1),
        # Handed to a scorer that never answered (its file not given): pending, not unscored.
        (Program((EpisodeSpec((), "completed", True, False),)), "pending", None, 1),
        # A scorer's reward for an attempt that failed meanwhile: never a score.
        (Program((EpisodeSpec((), "raise", True, False),), remote=1.0), "unscored", None, 1),
    ],
)
def test_the_shapes_the_issue_names_read_back_right(
    program: Program, outcome: str, reward: float | None, attempts: int
) -> None:
    expected = model(program)
    assert (expected.outcome, expected.reward, expected.attempts) == (outcome, reward, attempts)
    with capture_spans(strict=False) as captured:
        run(program)
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "trace.jsonl"
        path.write_text(json.dumps(encode_otlp_json(captured.spans)) + "\n")
        (row,) = _cli_json("rollouts", str(path), "--json")
    assert (row["outcome"], row["reward"], row["attempts"]) == (outcome, reward, attempts)


def test_a_reward_on_the_rollout_before_its_episodes_never_beats_the_final_episodes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with capture_spans(strict=False) as captured, caplog.at_level(logging.WARNING, "gymtrace"):
        with gymtrace.rollout(rollout_id="r-early"):
            gymtrace.record_reward(0.3)
            with gymtrace.episode():
                gymtrace.record_reward(1.0)
    root = captured.one("rollout")
    assert (root.attributes["gym.rollout.outcome"], root.attributes["gym.reward"]) == ("scored", 1.0)
    assert any(
        "reward 0.3 was recorded on the rollout outside its episodes" in r.getMessage()
        for r in caplog.records
    )


def test_a_cancelled_rollout_without_episodes_is_unscored_whatever_it_recorded() -> None:
    import asyncio

    async def harness() -> None:
        async with gymtrace.rollout(rollout_id="r-cancelled"):
            gymtrace.record_reward(0.5)
            await asyncio.sleep(10)

    async def main() -> None:
        task = asyncio.create_task(harness())
        await asyncio.sleep(0.01)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    with capture_spans(strict=False) as captured:
        asyncio.run(main())
    root = captured.one("rollout")
    assert root.attributes["gym.rollout.outcome"] == "unscored" and "gym.reward" not in root.attributes
