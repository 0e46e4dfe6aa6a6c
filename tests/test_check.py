"""The contract checker, on span records built field by field (``_model.spandata``: no public builder).

For each rule a trace it must flag and one it must pass."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path
from typing import Any

import pytest

import gymtrace
from child_process import run_gymtrace, run_python
from gymtrace import attributes as c
from gymtrace._model.spandata import EventData, LinkData, SpanData, encode_spandata_json
from gymtrace.testing import CapturedSpans, check_trace

_ids = itertools.count(1)


def span(
    kind: str | None,
    parent: SpanData | None = None,
    *,
    trace: str = "t1",
    links: tuple[LinkData, ...] = (),
    start: int | None = None,
    **attributes: Any,
) -> SpanData:
    number = next(_ids)
    attrs = dict(attributes)
    if kind is not None:
        attrs[c.KIND] = kind
    begin = start if start is not None else number * 10
    return SpanData(
        trace_id=trace.ljust(32, "0"),
        span_id=f"{number:016x}",
        parent_id=parent.span_id if parent else None,
        name=f"gym.{kind}" if kind else "foreign",
        start_ns=begin,
        end_ns=begin + 1_000_000,
        attributes=attrs,
        links=links,
    )


def link(to: SpanData, relation: str) -> tuple[LinkData, ...]:
    return (LinkData(to.trace_id, to.span_id, {c.LINK_RELATION: relation}),)


def rollout_with(
    *episodes: dict[str, Any], rollout_attrs: dict[str, Any] | None = None, rid: str = "r-1"
) -> list[SpanData]:
    # Like the engine, the root knows how many episodes it ran (gym.rollout.attempts).
    root = span(
        "rollout", **{c.ROLLOUT_ID: rid, c.ROLLOUT_ATTEMPTS: len(episodes), **(rollout_attrs or {})}, start=0
    )
    spans = [root]
    previous = None
    for attempt, extra in enumerate(episodes):
        attrs = {
            c.ROLLOUT_ID: rid,
            c.EPISODE_ATTEMPT: attempt,
            c.EPISODE_ID: rid if attempt == 0 else f"{rid}-a{attempt}",
        }
        attrs.update(extra)
        links = (
            link(previous, "retry")
            if previous is not None and "links" not in extra
            else extra.pop("links", ())
        )
        attrs.pop("links", None)
        ep = span("episode", root, links=links, **attrs)
        spans.append(ep)
        previous = ep
    return spans


OK_EPISODE = {c.EPISODE_OUTCOME: "completed", c.REWARD: 1.0}
FAILED = {c.EPISODE_OUTCOME: "failed", c.FAILURE_KIND: "infrastructure"}


def test_real_trace_from_the_scopes_passes(captured: CapturedSpans) -> None:
    with gymtrace.run(run_id="run"), gymtrace.rollout(rollout_id="r"):
        for attempt in gymtrace.attempts(2):
            with attempt, gymtrace.agent_invocation(agent_name="a"):
                for _ in range(2):
                    with gymtrace.turn(), gymtrace.step():
                        pass
                if attempt.index == 0:
                    attempt.fail()
                else:
                    gymtrace.record_reward(1.0)
    assert check_trace(captured) == []


def test_missing_identity_below_a_rollout_is_flagged() -> None:
    spans = rollout_with({c.EPISODE_OUTCOME: "completed"}, rollout_attrs={c.ROLLOUT_OUTCOME: "unscored"})
    good_child = span("step", spans[1], **{c.ROLLOUT_ID: "r-1", c.EPISODE_ATTEMPT: 0, c.STEP_NUMBER: 1})
    assert check_trace([*spans, good_child]) == []
    bare_foreign = span(None, spans[1])
    problems = check_trace([*spans, good_child, bare_foreign])
    assert any("needs gym.rollout.id='r-1'" in p for p in problems)
    assert any("needs gym.episode.attempt=0" in p for p in problems)


def test_attempts_not_zero_to_n_are_flagged() -> None:
    good = rollout_with(FAILED, OK_EPISODE, rollout_attrs={c.ROLLOUT_OUTCOME: "scored", c.REWARD: 1.0})
    assert check_trace(good) == []
    bad = rollout_with(FAILED, OK_EPISODE, rollout_attrs={c.ROLLOUT_OUTCOME: "scored", c.REWARD: 1.0})
    bad[2] = SpanData(
        **{
            **bad[2].__dict__,
            "attributes": {**bad[2].attributes, c.EPISODE_ATTEMPT: 2, c.EPISODE_ID: "r-1-a2"},
        }
    )
    assert any("attempts are [0, 2], expected 0..1" in p for p in check_trace(bad))


def test_more_than_one_reward_per_rollout_is_flagged() -> None:
    bad = rollout_with(OK_EPISODE, OK_EPISODE, rollout_attrs={c.ROLLOUT_OUTCOME: "scored", c.REWARD: 1.0})
    assert any("2 episodes carry a reward" in p for p in check_trace(bad))


def test_reward_on_a_failed_episode_is_flagged() -> None:
    bad = rollout_with({**FAILED, c.REWARD: 0.0}, rollout_attrs={c.ROLLOUT_OUTCOME: "unscored"})
    assert any("failed episode" in p and "carries a reward" in p for p in check_trace(bad))


def test_scored_rollout_whose_reward_is_not_its_final_episodes_is_flagged() -> None:
    bad = rollout_with(
        FAILED,
        {c.EPISODE_OUTCOME: "completed", c.REWARD: 0.25},
        rollout_attrs={c.ROLLOUT_OUTCOME: "scored", c.REWARD: 1.0},
    )
    assert any("reward 1.0 is not its final episode's" in p for p in check_trace(bad))
    good = rollout_with(
        FAILED,
        {c.EPISODE_OUTCOME: "completed", c.REWARD: 0.25},
        rollout_attrs={c.ROLLOUT_OUTCOME: "scored", c.REWARD: 0.25},
    )
    assert check_trace(good) == []


def test_unscored_rollout_with_a_reward_is_flagged() -> None:
    bad = rollout_with(FAILED, rollout_attrs={c.ROLLOUT_OUTCOME: "unscored", c.REWARD: 0.0})
    assert any("unscored but has gym.reward" in p for p in check_trace(bad))
    good = rollout_with(FAILED, rollout_attrs={c.ROLLOUT_OUTCOME: "unscored"})
    assert check_trace(good) == []


def test_inverted_nesting_is_flagged() -> None:
    step = span("step")
    episode = span("episode", step, **{c.EPISODE_ATTEMPT: 0})
    assert any("inverted nesting, episode inside step" in p for p in check_trace([step, episode]))
    tool = span("tool_call")
    sub = span("agent_invocation", tool)
    assert check_trace([tool, sub]) == []  # a subagent under its tool call is fine


def test_inversion_through_a_foreign_span_is_still_flagged() -> None:
    step = span("step")
    http = span(None, step)
    rollout = span("rollout", http, **{c.ROLLOUT_ID: "r"})
    assert any("rollout inside step" in p for p in check_trace([step, http, rollout]))


def test_restored_episode_without_its_link_is_flagged() -> None:
    bad = rollout_with(
        FAILED,
        {**OK_EPISODE, c.EPISODE_RESTORED: True},
        rollout_attrs={c.ROLLOUT_OUTCOME: "scored", c.REWARD: 1.0},
    )
    assert any("restored episode without a link" in p for p in check_trace(bad))
    good = rollout_with(
        FAILED,
        {**OK_EPISODE, c.EPISODE_RESTORED: True},
        rollout_attrs={c.ROLLOUT_OUTCOME: "scored", c.REWARD: 1.0},
    )
    good[2] = SpanData(**{**good[2].__dict__, "links": link(good[1], "restore")})
    assert check_trace(good) == []


def test_retry_without_a_link_to_the_previous_attempt_is_flagged() -> None:
    bad = rollout_with(
        FAILED, {**OK_EPISODE, "links": ()}, rollout_attrs={c.ROLLOUT_OUTCOME: "scored", c.REWARD: 1.0}
    )
    assert any("attempt 1 without a link" in p for p in check_trace(bad))


def test_turn_and_step_numbers_must_increase_within_an_invocation() -> None:
    agent = span("agent_invocation")
    steps = [span("step", agent, **{c.STEP_NUMBER: n}) for n in (1, 2, 2)]
    assert any("step numbers within" in p and "[1, 2, 2]" in p for p in check_trace([agent, *steps]))
    other = span("agent_invocation")
    fine = [span("step", other, **{c.STEP_NUMBER: n}) for n in (1, 2, 3)]
    assert check_trace([other, *fine]) == []


def test_check_command_exits_nonzero_with_readable_messages(tmp_path: Path) -> None:
    env_file = tmp_path / "bad.jsonl"
    code = f"""
import gymtrace
gymtrace.configure(file={str(env_file)!r})
with gymtrace.step():
    with gymtrace.episode():
        pass
"""
    run_python(code=code, check=True)
    out = run_gymtrace("check", str(env_file))
    assert out.returncode == 1
    assert "contract violation(s)" in out.stdout
    assert "episode inside step" in out.stdout


def test_a_parent_cycle_through_a_rollout_is_reported_not_walked_for_ever(tmp_path: Path) -> None:
    # A malformed file: the rollout's parent is a span whose parent is the rollout.
    rollout = span("rollout", trace="c1", **{c.ROLLOUT_ID: "r-1", c.ROLLOUT_ATTEMPTS: 1})
    below = span(None, rollout, trace="c1", **{c.ROLLOUT_ID: "r-1"})
    cycle = [dataclasses.replace(rollout, parent_id=below.span_id), below]
    path = tmp_path / "cycle.jsonl"
    path.write_text(json.dumps(encode_spandata_json(cycle)) + "\n")
    out = run_gymtrace("check", str(path), timeout=60)
    assert out.returncode == 1, out.stderr
    assert "rollout inside rollout" in out.stdout


def test_check_command_names_a_malformed_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "garbage.jsonl"
    path.write_text('{"resourceSpans": []}\nnot json\n')
    out = run_gymtrace("check", str(path))
    assert out.returncode == 2
    assert f"{path}:2" in out.stderr


@pytest.mark.parametrize("argv", [["demo", "--quiet"], ["demo"]])
def test_demo_exercises_every_case_and_passes_check(tmp_path: Path, argv: list[str]) -> None:
    out = run_gymtrace(*argv, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "contract check: OK" in out.stdout
    # arith-004 is scored in a scorer process (r0) and in a later phase (r1): scored all the same.
    assert "8 rollouts (7 scored, 1 unscored), 12 episodes" in out.stdout
    assert "arith-004/r0     reward=1" in out.stdout and "arith-004/r1     reward=1" in out.stdout
    check = run_gymtrace("check", "gymtrace-traces.jsonl", cwd=tmp_path)
    assert check.returncode == 0, check.stdout
    # It ends with the run's report, beside the trace file.
    (report,) = [Path(line.split()[1]) for line in out.stdout.splitlines() if line.startswith("report: ")]
    assert report.parent == tmp_path.resolve() and "8 rollouts" in out.stdout
    page = report.read_text()
    assert 'class="gymtrace-timeline"' in page and "<h2>Where the time went</h2>" in page
    if "--quiet" not in argv:
        for expected in (
            "restored=True",
            "<-restore",
            "<-retry",
            "outcome=unscored",
            "invoke_agent researcher",
            "failure=infrastructure",
            "@gymtrace-demo-scorer",
            "source=remote",
            "source=late",
            "=> final: outcome=scored",
        ):
            assert expected in out.stdout, expected


# -- late and remote outcomes, runs sharing an ID, numbering across processes, readable output ----


def outcome_record(
    root: SpanData,
    concludes: SpanData | None,
    *,
    attempt: int,
    reward: float | None,
    attempts: int | None = None,
    **overrides: Any,
) -> SpanData:
    rid = root.attributes[c.ROLLOUT_ID]
    attrs: dict[str, Any] = {
        c.ROLLOUT_ID: rid,
        c.EPISODE_ATTEMPT: attempt,
        c.EPISODE_ID: rid if attempt == 0 else f"{rid}-a{attempt}",
        c.ROLLOUT_ATTEMPTS: attempt + 1 if attempts is None else attempts,
        c.ROLLOUT_OUTCOME: "scored" if reward is not None else "unscored",
        c.OUTCOME_SOURCE: "continued",
    }
    if reward is not None:
        attrs[c.REWARD] = reward
    attrs.update(overrides)
    attrs = {k: v for k, v in attrs.items() if v is not None}
    return span("outcome", root, links=link(concludes, "outcome") if concludes else (), start=10**9, **attrs)


def test_stale_rollout_root_is_flagged_unless_an_outcome_record_fixes_it() -> None:
    # Attempt 1 was continued elsewhere after the root ended, and completed with a reward.
    spans = rollout_with(
        FAILED, OK_EPISODE, rollout_attrs={c.ROLLOUT_OUTCOME: "unscored", c.ROLLOUT_ATTEMPTS: 1}
    )
    (problem,) = check_trace(spans)
    assert problem.startswith("rollout r-1: stale rollout root says unscored after attempt 0")
    assert "attempt 1 completed with reward 1" in problem and "no outcome record fixes it" in problem
    fixed = [*spans, outcome_record(spans[0], spans[2], attempt=1, reward=1.0)]
    assert check_trace(fixed) == []
    wrong = [*spans, outcome_record(spans[0], spans[2], attempt=1, reward=None)]
    assert any("outcome record gym.outcome" in p and "says unscored" in p for p in check_trace(wrong))


def test_root_that_says_scored_while_its_last_episode_failed_is_flagged() -> None:
    spans = rollout_with(
        OK_EPISODE, FAILED, rollout_attrs={c.ROLLOUT_OUTCOME: "scored", c.REWARD: 1.0, c.ROLLOUT_ATTEMPTS: 2}
    )
    problems = check_trace(spans)
    assert any(
        "stale rollout root says scored 1.0 after attempt 1, but attempt 1 failed" in p for p in problems
    )


def test_outcome_record_must_carry_identity_and_a_valid_outcome() -> None:
    spans = rollout_with(OK_EPISODE, rollout_attrs={c.ROLLOUT_OUTCOME: "scored", c.REWARD: 1.0})
    assert check_trace([*spans, outcome_record(spans[0], spans[1], attempt=0, reward=1.0)]) == []
    cases = {
        "without gym.episode.attempt": {c.EPISODE_ATTEMPT: None},
        "without gym.rollout.id": {c.ROLLOUT_ID: None},
        "gym.rollout.outcome='maybe'": {c.ROLLOUT_OUTCOME: "maybe"},
        "gym.outcome.source='somewhere'": {c.OUTCOME_SOURCE: "somewhere"},
        "scored outcome record without a numeric gym.reward": {c.REWARD: None},
    }
    for expected, overrides in cases.items():
        bad = outcome_record(spans[0], spans[1], attempt=0, reward=1.0, **overrides)
        assert any(expected in p for p in check_trace([*spans, bad])), expected
    # Written in another process, a record may have no episode span to link to.
    assert check_trace([*spans, outcome_record(spans[0], None, attempt=0, reward=1.0)]) == []


def test_reward_or_verify_outside_any_rollout_is_flagged(captured: CapturedSpans) -> None:
    with gymtrace.verify():
        pass
    assert any("verify span outside any rollout" in p for p in check_trace(captured))
    event = SpanData(
        trace_id="e" * 32,
        span_id="e" * 16,
        parent_id=None,
        name="scorer",
        start_ns=1,
        end_ns=2,
        attributes={},
        events=(EventData(c.GEN_AI_EVALUATION_RESULT, 1, {c.GEN_AI_EVALUATION_SCORE_VALUE: 1.0}),),
    )
    assert any("reward recorded outside any rollout" in p for p in check_trace([event]))


def test_steps_numbered_by_other_processes_are_not_duplicates() -> None:
    agent = span("agent_invocation")

    def step(number: int, process: str) -> SpanData:
        base = span("step", agent, **{c.STEP_NUMBER: number})
        return SpanData(**{**base.__dict__, "service": "worker", "service_instance": process})

    # Each worker process attached the episode's context and numbered its own steps from 1.
    assert check_trace([agent, step(1, "w-1"), step(2, "w-1"), step(1, "w-2")]) == []
    problems = check_trace([agent, step(1, "w-1"), step(1, "w-1")])
    assert any("step numbers within" in p and "recorded by w-1 are [1, 1]" in p for p in problems)


def test_continuations_numbered_from_their_reserved_steps_may_run_in_any_order() -> None:
    from gymtrace._scopes.active_scope import STEP_RANGE

    agent = span("agent_invocation")

    def step(number: int, process: str | None = None) -> SpanData:
        made = span("step", agent, **{c.STEP_NUMBER: number})
        return made if process is None else SpanData(**{**made.__dict__, "service_instance": process})

    # The owner's own steps 1 and 4; it reserved 2 and 3 for two hand-offs, which ran in its own
    # process in the reverse order: 3 (and its further step), then 2. Each part increases.
    own = [step(n) for n in (1, 3, 3 * STEP_RANGE + 1, 2, 2 * STEP_RANGE + 1, 4)]
    assert check_trace([agent, *own]) == []
    # Two one-step continuations in another process, in the reverse order of their numbers.
    assert check_trace([agent, step(1), step(3, "w-1"), step(2, "w-1")]) == []
    # Within one continuation's part the numbers still increase.
    backwards = [step(3), step(3 * STEP_RANGE + 2), step(3 * STEP_RANGE + 1)]
    assert any("(the continuation given step 3)" in p for p in check_trace([agent, *backwards]))


def test_each_rule_shows_three_examples_and_a_count() -> None:
    agent = span("agent_invocation")
    spans = [agent]
    for _ in range(500):
        spans.append(span("step", agent, **{c.STEP_NUMBER: 1}))
    spans += [span("verify") for _ in range(5)]
    problems = check_trace(spans)
    assert len(problems) == 5  # 3 verifies + a count, one numbering problem
    numbering = next(p for p in problems if p.startswith("step numbers"))
    assert len(numbering) < 300 and "(500 in all)" in numbering
    assert problems[3] == "... and 2 more: reward outside any rollout"


def _killed_agent(rollout: str, trace: str) -> list[SpanData]:
    """What a SIGKILLed NeMo Gym agent process had exported of one rollout: its first turn, step
    and model call had ended; the invocation above them never did, so it is not in the input."""
    identity = {c.ROLLOUT_ID: rollout, c.TASK_ID: "4", c.EPISODE_ATTEMPT: 0, c.EPISODE_ID: rollout}
    never_ended = span("agent_invocation", trace=trace, **identity)
    turn = span("turn", never_ended, trace=trace, **identity, **{c.TURN_NUMBER: 1})
    step = span("step", turn, trace=trace, **identity, **{c.STEP_NUMBER: 1})
    chat = span("model_call", step, trace=trace, **identity)
    return [
        SpanData(**{**s.__dict__, "service": "simple_agent", "service_instance": "agent-killed"})
        for s in (turn, step, chat)
    ]


def _resumed(rollout: str, trace: str) -> list[SpanData]:
    identity = {c.ROLLOUT_ID: rollout, c.TASK_ID: "4"}
    root = span(
        "rollout",
        trace=trace,
        **identity,
        **{c.ROLLOUT_ATTEMPTS: 1, c.ROLLOUT_OUTCOME: c.OUTCOME_SCORED, c.REWARD: 1.0},
    )
    episode = span("episode", root, trace=trace, **identity, **{c.EPISODE_ATTEMPT: 0, c.EPISODE_ID: rollout})
    episode = SpanData(**{**episode.__dict__, "attributes": {**episode.attributes, **OK_EPISODE}})
    return [root, episode]


def test_orphans_of_a_killed_process_are_numbered_per_rollout_and_noted_with_their_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Issue 43: every process of a NeMo Gym run SIGKILLed while rollouts 4-0 and 4-1 were in their
    # second model call, then resumed. The killed agent's first steps arrived without their
    # invocation: two rollouts' step 1, which read "[1, 1], not increasing" under one "<none>" owner.
    from gymtrace._cli import main
    from gymtrace._model.spandata import encode_spandata_json

    spans = [
        *_killed_agent("4-0", "a1"),
        *_killed_agent("4-1", "a2"),
        *_resumed("4-0", "a1"),
        *_resumed("4-1", "a2"),
    ]
    assert check_trace(spans) == []
    path = tmp_path / "traces.jsonl"
    path.write_text(json.dumps(encode_spandata_json(spans)) + "\n")
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    for rollout in ("4-0", "4-1"):
        assert (
            f"rollout {rollout}: 3 interrupted span(s) (simple_agent) whose parents never arrived: their"
            " process was killed before those parents ended" in out
        ), out
    # Below one span that never arrived the numbers are still checked.
    again = SpanData(**{**spans[1].__dict__, "span_id": "f" * 16, "start_ns": spans[1].start_ns + 1})
    assert any(
        "step numbers within the owner that never arrived" in p and "of rollout 4-0" in p and "[1, 1]" in p
        for p in check_trace([*spans, again])
    )


def _at(spans: list[SpanData], start: int, **fields: Any) -> list[SpanData]:
    """``spans`` moved to start at ``start`` ns (each 1 µs long), with ``fields`` replaced."""
    return [
        SpanData(**{**s.__dict__, "start_ns": start + 10 * i, "end_ns": start + 10 * i + 1000, **fields})
        for i, s in enumerate(spans)
    ]


def test_a_killed_then_resumed_rollout_counts_its_lost_attempt_in_rollouts_and_stats(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Issue 43: NeMo Gym resumes a killed pass's rollouts under the same attempt number
    # (_ng_attempt_index absent: 0), so the killed pass is attempt 0 too. It is marked lost beside
    # the attempt that scored, never renumbered.
    from gymtrace._cli import main
    from gymtrace._model.spandata import encode_spandata_json

    run = {c.RUN_ID: "run-1"}
    # Of 4-0 the killed agent's finished spans arrived; of 4-1 only the killed driver's live marker
    # (its process never said the rollout ended).
    killed = _at(_killed_agent("4-0", "a1"), 1_000)
    marker = span(
        c.KIND_LIVE,
        trace="a2",
        **run,
        **{
            c.ROLLOUT_ID: "4-1",
            c.LIVE_EVENT: c.LIVE_EVENT_ROLLOUT,
            c.EPISODE_ATTEMPT: 0,
            c.LIVE_INTERVAL: 1.0,
        },
    )
    resumed = _at(_resumed("4-0", "a1"), 50_000) + _at(_resumed("4-1", "a2"), 50_000)
    # A rollout whose agent wrote its file elsewhere: its spans are cut off from the root too, but
    # inside the rollout's own time, so no attempt of it was lost.
    elsewhere = _at(_resumed("5-0", "a3"), 50_000) + _at(_killed_agent("5-0", "a3"), 50_005)
    spans = [
        SpanData(**{**s.__dict__, "attributes": {**s.attributes, **run}})
        for s in [*killed, *_at([marker], 2_000), *resumed, *elsewhere]
    ]
    path = tmp_path / "traces.jsonl"
    path.write_text(json.dumps(encode_spandata_json(spans)) + "\n")

    assert main(["rollouts", str(path), "--json"]) == 0
    rows = {r["rollout_id"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    assert {k: (r["outcome"], r["attempts"], r["lost_attempts"]) for k, r in rows.items()} == {
        "4-0": ("scored", 1, [0]),
        "4-1": ("scored", 1, [0]),
        "5-0": ("scored", 1, []),
    }
    assert main(["stats", str(path), "--json"]) == 0
    (stats,) = map(json.loads, capsys.readouterr().out.splitlines())
    assert (stats["scored"], stats["lost_attempts"], stats["mean_reward"]) == (3, 2, 1.0)
    assert "lost" not in stats  # no rollout was lost: each was run again and scored
    assert main(["rollouts", str(path)]) == 0
    table = capsys.readouterr().out
    assert "1 (+1 lost: attempt 0)" in table, table
    assert main(["tree", str(path)]) == 0
    tree = capsys.readouterr().out
    marked = [line for line in tree.splitlines() if "=> lost attempt 0 (its process was killed" in line]
    assert len(marked) == 1 and "rollout=4-0" in marked[0], (
        tree
    )  # 4-1's evidence is a marker, which tree folds away


def test_a_killed_attempt_is_found_though_its_missing_parents_id_is_a_span_of_another_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The killed process's spans hang from a span that never arrived; a span of another trace that
    # happens to have that span ID must not make them read as whole.
    from gymtrace._cli import main

    killed = _at(_killed_agent("4-0", "a1"), 1_000)
    missing = killed[0].parent_id
    resumed = _at(_resumed("4-0", "a1"), 50_000)
    other_root, other_episode = _at(_resumed("6-0", "b1"), 60_000)
    other_root = dataclasses.replace(other_root, span_id=missing)
    other_episode = dataclasses.replace(other_episode, parent_id=missing)
    path = tmp_path / "traces.jsonl"
    spans = [*killed, *resumed, other_root, other_episode]
    path.write_text(json.dumps(encode_spandata_json(spans)) + "\n")

    assert main(["rollouts", str(path), "--json"]) == 0
    rows = {r["rollout_id"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    assert {k: (r["outcome"], r["lost_attempts"]) for k, r in rows.items()} == {
        "4-0": ("scored", [0]),
        "6-0": ("scored", []),
    }
