"""The outcome rule, model-based; private where Hypothesis's traces are encoded and checked in process.

A model-based test of the outcome rule: Hypothesis writes harness programs, gymtrace records them,
and what every reader reports (``gymtrace rollouts --json``, ``stats --json``, ``check``, the
rollout span itself) must equal a small reference model, or a warning must have said, when the
program recorded it, what was thrown away.

The reference model is written from the documented rules (docs/outcomes.md, "The rule", "Right or
loud", "Reused attempt numbers", and docs/results.md, "Late and remote outcomes"), never from
``_outcome_rule``:

- gymtrace numbers a rollout's episodes 0, 1, 2...; an explicit ``attempt=`` is taken as given, and
  one already used is reported when the episode opens and replaces the earlier episode of that
  attempt (the last recorded wins); ``attempts`` is the number of distinct attempt numbers;
- the final attempt is the highest number; it scores with its reward (the last one recorded for
  it: in the episode, in a verify() after it, later on the rollout object, or by a scorer process
  continuing headers of that attempt); failed or cancelled, it is unscored, never 0;
- a final attempt that completed without a reward is pending when it was handed off: headers
  injected inside that episode, or on the rollout outside every episode; a hand-off in another
  attempt is that attempt's only;
- a rollout without episodes is one implicit attempt 0;
- warned: a reward of an attempt that failed, was cancelled or was superseded (by a later attempt,
  or by a later episode of the same attempt), a reward after the final attempt failed, a reward
  before a failure ended a rollout without episodes, and an attempt number given twice.

It runs on the plain SDK path (``capture_spans``: a TracerProvider with the IdentitySpanProcessor
and an in-memory exporter) and under ``gymtrace.configure()`` (its lean spans and file exporter,
in a child process running a batch of programs).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gymtrace
from child_process import run_python
from gymtrace import _cli
from gymtrace._model.spandata import encode_otlp_json, read_otlp_json_lines
from gymtrace._read.check import check_spans
from gymtrace.testing import capture_spans, check_trace
from outcome_programs import ENDINGS, EpisodeSpec, Program, Warnings, run

REWARDS = st.sampled_from([0.0, 0.25, 0.5, 1.0])


@dataclass
class Expected:
    outcome: str
    reward: float | None
    attempts: int
    warned: bool = False
    reasons: list[str] = field(default_factory=list)


def model(program: Program) -> Expected:
    """The documented rules (see the module docstring), written out for the programs above."""
    warned: list[str] = []
    remote = program.remote
    if not program.episodes:
        # One implicit attempt 0: what is recorded on the rollout, later, or by a scorer is its.
        if program.rollout_raises:
            if program.rollout_rewards or program.late is not None:
                warned.append("reward of a rollout whose only attempt failed")
            return Expected("unscored", None, 1, bool(warned), warned)
        rewards = [*program.rollout_rewards, *([program.late] if program.late is not None else [])]
        rewards += [remote[1]] if remote is not None else []
        if rewards:
            return Expected("scored", rewards[-1], 1)
        return Expected("pending" if program.rollout_handoff else "unscored", None, 1)
    # The attempt each episode records: gymtrace's next number, or the one given.
    numbers: list[int] = []
    for spec in program.episodes:
        number = spec.attempt if spec.attempt is not None else max(numbers, default=-1) + 1
        if number in numbers:
            warned.append(f"attempt {number} given again")
        numbers.append(number)
    final_number = max(numbers)
    # Of episodes with the final number, the last recorded is the attempt.
    final_index = max(i for i, n in enumerate(numbers) if n == final_number)
    final = program.episodes[final_index]
    for index, spec in enumerate(program.episodes):
        if not spec.rewards:
            continue
        if spec.ending != "completed":
            warned.append(f"reward of {spec.ending} episode {index}")
        elif index != final_index:
            warned.append(f"reward of superseded episode {index}")
    completed = final.ending == "completed"
    # A verify() after the last episode, and a reward on the rollout object after it ended, score
    # the rollout's last episode: counted when that is the final attempt and it completed.
    later = [*program.after, *([program.late] if program.late is not None else [])]
    last_index = len(program.episodes) - 1
    if later and (last_index != final_index or not completed):
        warned.append("reward after the last episode, which is not a completed final attempt")
        later = []
    attempts = len(set(numbers))
    if not completed:
        return Expected("unscored", None, attempts, bool(warned), warned)
    rewards = [*final.rewards, *later]
    if remote is not None and remote[0] >= 0 and numbers[remote[0]] == final_number:
        rewards.append(remote[1])  # a scorer's record of the final attempt, recorded last
    if rewards:
        return Expected("scored", rewards[-1], attempts, bool(warned), warned)
    handed = final.handoff or program.rollout_handoff
    return Expected("pending" if handed else "unscored", None, attempts, bool(warned), warned)


@st.composite
def programs(draw: st.DrawFn) -> Program:
    count = draw(st.integers(min_value=0, max_value=3))
    if count == 0:
        raises = draw(st.booleans())
        handoff = draw(st.booleans())
        return Program(
            episodes=(),
            rollout_rewards=tuple(draw(st.lists(REWARDS, max_size=2))),
            rollout_raises=raises,
            rollout_handoff=handoff,
            late=draw(st.none() | REWARDS),
            # A scorer continues the rollout's headers (not after a failure: see docs/outcomes.md).
            remote=(-1, draw(REWARDS)) if handoff and not raises and draw(st.booleans()) else None,
        )
    episodes: list[EpisodeSpec] = []
    used: list[int] = []
    for index in range(count):
        # Gymtrace numbers it, or the harness gives a number: one already used, or the next.
        explicit = draw(st.none() | st.integers(min_value=0, max_value=max(used, default=-1) + 1))
        used.append(explicit if explicit is not None else max(used, default=-1) + 1)
        episodes.append(
            EpisodeSpec(
                rewards=tuple(draw(st.lists(REWARDS, max_size=2))),
                ending=draw(st.sampled_from(ENDINGS)),
                handoff=draw(st.booleans()),
                restored=index > 0 and draw(st.booleans()),
                attempt=explicit,
            )
        )
    handed = [i for i, e in enumerate(episodes) if e.handoff]
    return Program(
        episodes=tuple(episodes),
        rollout_handoff=draw(st.booleans()),
        after=tuple(draw(st.lists(REWARDS, max_size=1))),
        late=draw(st.none() | REWARDS),
        # A scorer continues the headers of an episode that handed off: the final one, an
        # earlier (maybe failed) one, or a superseded record of the final attempt.
        remote=(draw(st.sampled_from(handed)), draw(REWARDS)) if handed and draw(st.booleans()) else None,
    )


def _cli_json(*argv: str) -> list[dict[str, object]]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert _cli.main(list(argv)) == 0
    return [json.loads(line) for line in out.getvalue().splitlines()]


def _discards(messages: list[str], rollout_id: str) -> list[str]:
    """The warnings that said something about this rollout's outcome was thrown away."""
    return [m for m in messages if repr(rollout_id) in m or "never scored" in m]


def _assert_reads_back(
    program: Program, expected: Expected, row: dict[str, Any], stats: dict[str, Any] | None
) -> None:
    assert (row["outcome"], row["attempts"]) == (expected.outcome, expected.attempts), (program, row)
    if expected.reward is None:
        assert row["reward"] is None, program
    else:
        assert isinstance(row["reward"], float) and math.isclose(row["reward"], expected.reward), program
    if stats is not None:
        key = str(expected.outcome)
        assert stats[key] == 1 and stats["inputs"] == (1 if key == "scored" else 0), (program, stats)


def _root_agrees(program: Program, expected: Expected, attributes: dict[str, Any]) -> None:
    # The rollout span agrees wherever it could know (nothing came after it ended).
    if program.late is None and program.remote is None:
        assert attributes["gym.rollout.outcome"] == expected.outcome, program
        assert attributes["gym.rollout.attempts"] == expected.attempts, program


MODEL_SETTINGS = settings(
    max_examples=250,
    deadline=None,
    derandomize=True,  # the same programs on every run: CI stays deterministic
    suppress_health_check=[HealthCheck.too_slow],
)


@MODEL_SETTINGS
@given(programs())
def test_on_the_plain_sdk_every_reader_reports_the_models_outcome_or_a_warning_said_why(
    program: Program,
) -> None:
    expected = model(program)
    warnings = Warnings()
    logger = logging.getLogger("gymtrace")
    logger.addHandler(warnings)
    try:
        with capture_spans(strict=False) as captured:
            run(program)
    finally:
        logger.removeHandler(warnings)
    # Said when it was recorded, and only when something was thrown away.
    discards = _discards(warnings.messages, "r-model")
    assert bool(discards) == expected.warned, (program, expected.reasons, warnings.messages)
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "trace.jsonl"
        path.write_text(json.dumps(encode_otlp_json(captured.spans)) + "\n")
        (row,) = _cli_json("rollouts", str(path), "--json")
        (stats,) = _cli_json("stats", str(path), "--json")
    _assert_reads_back(program, expected, row, stats)
    _root_agrees(program, expected, dict(captured.one("rollout").attributes or {}))
    # No trace gymtrace writes fails its own check unless a warning said so when it was written.
    if not expected.warned:
        assert check_trace(captured) == [], program


@settings(
    max_examples=10,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.lists(programs(), min_size=40, max_size=40))
def test_under_configure_every_reader_reports_the_models_outcome_or_a_warning_said_why(
    batch: list[Program],
) -> None:
    # configure() sets up its own provider, lean spans and exporters once per process: a child
    # runs a batch of programs under it, each its own rollout, and writes them to a file.
    with tempfile.TemporaryDirectory() as directory:
        programs_path, trace_path = Path(directory) / "programs.json", Path(directory) / "trace.jsonl"
        programs_path.write_text(json.dumps([p.as_json() for p in batch]))
        support = str(Path(__file__).parent / "support")
        done = run_python(
            "-m",
            "outcome_programs",
            str(programs_path),
            str(trace_path),
            cwd=Path(directory),
            env={"PYTHONPATH": os.pathsep.join([support, os.environ.get("PYTHONPATH", "")])},
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert "internal error" not in done.stderr, done.stderr[-3000:]
        said = json.loads(done.stdout.strip().splitlines()[-1])
        spans = read_otlp_json_lines(trace_path)
        rows = {row["rollout_id"]: row for row in _cli_json("rollouts", str(trace_path), "--json")}
    assert len(rows) == len(batch)
    for index, program in enumerate(batch):
        rollout_id = f"r-model-{index}"
        expected = model(program)
        discards = _discards(said[index], rollout_id)
        assert bool(discards) == expected.warned, (program, expected.reasons, said[index])
        _assert_reads_back(program, expected, rows[rollout_id], None)
        (root,) = [
            s
            for s in spans
            if s.attributes.get("gym.kind") == "rollout" and s.attributes.get("gym.rollout.id") == rollout_id
        ]
        _root_agrees(program, expected, dict(root.attributes))
        if not expected.warned:
            mine = [s for s in spans if s.trace_id == root.trace_id]
            assert check_spans(mine) == [], program


OK, FAILED = "completed", "raise"


@pytest.mark.parametrize(
    ("program", "outcome", "reward", "attempts"),
    [
        # verify() after the episode, still inside the rollout: scores the final episode.
        (Program((EpisodeSpec((), OK, False, False),), after=(1.0,)), "scored", 1.0, 1),
        # No episode: a reward, then a ConnectionError escaping the rollout: unscored, one attempt.
        (Program((), rollout_rewards=(0.5,), rollout_raises=True), "unscored", None, 1),
        # No episode, no error: one implicit attempt.
        (Program((), rollout_rewards=(0.5,)), "scored", 0.5, 1),
        # Handed to a scorer that never answered (its file not given): pending, not unscored.
        (Program((EpisodeSpec((), OK, True, False),)), "pending", None, 1),
        # A scorer's reward for an attempt that failed meanwhile: never a score.
        (Program((EpisodeSpec((), FAILED, True, False),), remote=(0, 1.0)), "unscored", None, 1),
        # Issue 31: attempt 0 given twice, rewards 0.1 then 0.9: the last recorded wins, one attempt
        # (the rollout span, rollouts and stats said 0.1; check said 0.9).
        (
            Program((EpisodeSpec((0.1,), OK, False, False, 0), EpisodeSpec((0.9,), OK, False, False, 0))),
            "scored",
            0.9,
            1,
        ),
        # Issue 31: a failed attempt 0 that had handed off, then attempt 1 completed here without a
        # reward: unscored, never pending forever (the hand-off was attempt 0's).
        (
            Program((EpisodeSpec((), FAILED, True, False), EpisodeSpec((), OK, False, False))),
            "unscored",
            None,
            2,
        ),
        # ... and with a reward, scored; a scorer's record for the failed attempt 0 changes nothing.
        (
            Program(
                (EpisodeSpec((), FAILED, True, False), EpisodeSpec((0.5,), OK, False, False)), remote=(0, 1.0)
            ),
            "scored",
            0.5,
            2,
        ),
        # A scorer's record for the final attempt after the root was scored: recorded last, it wins.
        (Program((EpisodeSpec((0.25,), OK, True, False),), remote=(0, 1.0)), "scored", 1.0, 1),
        # A hand-off on the rollout outside its episodes is the final attempt's.
        (
            Program(
                (EpisodeSpec((), FAILED, False, False), EpisodeSpec((), OK, False, False)),
                rollout_handoff=True,
            ),
            "pending",
            None,
            2,
        ),
    ],
)
def test_the_shapes_the_issue_names_read_back_right(
    program: Program, outcome: str, reward: float | None, attempts: int
) -> None:
    expected = model(program)
    assert (expected.outcome, expected.reward, expected.attempts) == (outcome, reward, attempts)
    with capture_spans(strict=False) as captured:
        run(program)
    root = captured.one("rollout").attributes or {}
    if program.remote is None:
        assert (root["gym.rollout.outcome"], root.get("gym.reward")) == (outcome, reward)
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "trace.jsonl"
        path.write_text(json.dumps(encode_otlp_json(captured.spans)) + "\n")
        (row,) = _cli_json("rollouts", str(path), "--json")
        (stats,) = _cli_json("stats", str(path), "--json")
    assert (row["outcome"], row["reward"], row["attempts"]) == (outcome, reward, attempts)
    assert stats[outcome] == 1 and stats["mean_reward"] == reward
    # check agrees (a scorer's record for an attempt that failed meanwhile is outranked, not
    # stale), unless a warning said what was wrong when it was written.
    if not expected.warned:
        assert check_trace(captured) == [], program


def test_a_reused_attempt_number_is_said_when_it_happens_and_check_agrees_on_the_last(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with capture_spans(strict=False) as captured, caplog.at_level(logging.WARNING, "gymtrace"):
        with gymtrace.rollout(rollout_id="r-reused"):
            with gymtrace.episode(attempt=0):
                gymtrace.record_reward(0.1)
            before = len(caplog.records)
            with gymtrace.episode(attempt=0):
                # Said when the second episode opened, before anything was recorded in it.
                said = [r.getMessage() for r in caplog.records[before:]]
                gymtrace.record_reward(0.9)
    assert any("'r-reused': episode attempt 0 was opened again" in m and "Fix:" in m for m in said)
    root = captured.one("rollout").attributes or {}
    assert (root["gym.rollout.outcome"], root["gym.reward"], root["gym.rollout.attempts"]) == (
        "scored",
        0.9,
        1,
    )
    # check names the reuse (warned when written) and nothing about the outcome: it agrees on 0.9.
    (problem,) = check_trace(captured)
    assert "attempt(s) [0] recorded by more than one episode" in problem and "last recorded counts" in problem


def test_a_reused_attempt_number_raises_in_strict_mode_and_opens_nothing() -> None:
    with capture_spans(strict=True) as captured, gymtrace.rollout(rollout_id="r-strict"):
        with gymtrace.episode():
            gymtrace.record_reward(0.1)
        with (
            pytest.raises(gymtrace.GymTraceError, match="attempt 0 was opened again"),
            gymtrace.episode(attempt=0),
        ):
            pass
    assert len(captured.by_kind("episode")) == 1
    assert (captured.one("rollout").attributes or {})["gym.reward"] == 0.1


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
