"""import and compare; private where the importers and the readers (pass@k, compare) run in process.

``gymtrace import`` and ``gymtrace compare`` against real records: NeMo Gym's own rollouts,
Harbor's ATIF trajectories, eval logs written here by the real Inspect AI."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest

from gymtrace import attributes as c
from gymtrace._cli import main
from gymtrace._import import nemo_gym as nemo_import
from gymtrace._model.spandata import SpanData, read_otlp_json_lines
from gymtrace._read.check import check_spans
from gymtrace._read.compare import MIN_PAIRED_TASKS, compare
from gymtrace._read.outcomes import final_outcomes
from gymtrace._read.passk import pass_at_k, per_task
from gymtrace._read.stats import summarise
from gymtrace.integrations.nemo_gym import group_id_for, run_id_for_output, trace_id_for
from gymtrace.testing import CapturedSpans
from inspect_eval import run_arith_eval
from records_support import write_nemo_gym_output

DATA = Path(__file__).parent / "data" / "records"


def kinds(spans: list[SpanData], kind: str) -> list[SpanData]:
    return [s for s in spans if s.attributes.get(c.KIND) == kind]


def ids(spans: list[SpanData]) -> list[tuple[str, str, str | None]]:
    return sorted((s.trace_id, s.span_id, s.parent_id) for s in spans)


def imported(fmt: str, *files: Path, out: Path, run: str | None = None) -> list[SpanData]:
    argv = ["import", fmt, *map(str, files), "-o", str(out)]
    assert main([*argv, *(["--run", run] if run else [])]) == 0
    return read_otlp_json_lines(out)


# -- NeMo Gym ---------------------------------------------------------------------------------------


@pytest.fixture
def nemo_gym_output(tmp_path: Path) -> tuple[Path, dict[tuple[int, int], float | None]]:
    """A NeMo Gym output with a failure and a resume pass, and each rollout's final reward as NeMo
    Gym counts it.

    A stack test that runs the real 0.7.0 `gym eval run` twice (the second with
    `+resume_from_cache=true`) can stand in here: return its output path and the rewards of its
    rollouts.jsonl rows (the failed-only keys as None); `mean/reward` in its
    `<stem>_aggregate_metrics.json` is then the mean these tests compare `stats` with."""
    out = tmp_path / "results" / "rollouts.jsonl"
    return out, write_nemo_gym_output(out)


def test_nemo_gym_output_imports_as_checked_traces_whose_stats_are_nemo_gyms(
    nemo_gym_output: tuple[Path, dict[tuple[int, int], float | None]], tmp_path: Path
) -> None:
    out, expected = nemo_gym_output
    spans = imported("nemo-gym", out, out=tmp_path / "traces.jsonl")
    assert check_spans(spans) == []

    run_id = run_id_for_output(out)
    outcomes = {(o.task_id, o.repeat): o for o in final_outcomes(spans)}
    assert {
        (int(t), r): o.reward for (t, r), o in outcomes.items() if t is not None and r is not None
    } == expected
    (stats,) = summarise(spans)
    scored = [v for v in expected.values() if v is not None]
    assert (stats.run_id, stats.scored, stats.unscored) == (run_id, len(scored), 1)
    assert stats.mean_reward == pytest.approx(math.fsum(scored) / len(scored))  # NeMo Gym's mean

    # The resumed rollout: attempt 0 failed (retryable), attempt 1 scored, linked, one trace.
    resumed = outcomes[("1", 0)]
    assert resumed.attempts == 2 and resumed.rollout_id == "1-0"
    assert resumed.trace_id == format(trace_id_for(run_id, "1-0"), "032x")
    episodes = sorted(
        (s for s in kinds(spans, c.KIND_EPISODE) if s.attributes[c.ROLLOUT_ID] == "1-0"),
        key=lambda s: s.attributes[c.EPISODE_ATTEMPT],
    )
    first, second = episodes
    assert first.attributes[c.FAILURE_KIND] == c.FAILURE_INFRASTRUCTURE
    assert first.attributes[c.FAILURE_RETRYABLE] is True
    assert first.attributes[c.ERROR_TYPE] == "ConnectError" and first.status == "ERROR"
    assert [(link.span_id, link.attributes[c.LINK_RELATION]) for link in second.links] == [
        (first.span_id, "retry")
    ]
    (verify,) = [s for s in kinds(spans, c.KIND_VERIFY) if s.parent_id == second.span_id]
    (event,) = verify.events
    assert (
        event.name == c.GEN_AI_EVALUATION_RESULT and event.attributes[c.GEN_AI_EVALUATION_SCORE_VALUE] == 1.0
    )

    # A task's repeats are one group, as the live integration names it: every span of its
    # rollouts carries the group, the rollout its size (the rollouts of the task in the output).
    for span in spans:
        task = span.attributes.get(c.TASK_ID)
        if c.ROLLOUT_ID in span.attributes:
            assert span.attributes[c.GROUP_ID] == group_id_for(run_id, task), span
    for rollout in kinds(spans, c.KIND_ROLLOUT):
        assert rollout.attributes[c.GROUP_SIZE] == 2, rollout
    assert len({r.attributes[c.GROUP_ID] for r in kinds(spans, c.KIND_ROLLOUT)}) == 3

    # The terminal failure: unscored, not retryable.
    (terminal,) = [s for s in kinds(spans, c.KIND_EPISODE) if s.attributes[c.ROLLOUT_ID] == "2-1"]
    assert terminal.attributes[c.FAILURE_KIND] == c.FAILURE_TERMINAL
    assert terminal.attributes[c.FAILURE_RETRYABLE] is False
    assert outcomes[("2", 1)].outcome == c.OUTCOME_UNSCORED


def test_importing_nemo_gym_output_needs_no_integration_extra(
    nemo_gym_output: tuple[Path, dict[tuple[int, int], float | None]], tmp_path: Path
) -> None:
    # `pip install 'gymtrace[sdk]'` has no wrapt (the integrations' extra): the importer shares
    # the NeMo Gym integration's IDs, not its patching.
    from child_process import run_python

    out, _ = nemo_gym_output
    code = (
        "import sys; sys.modules['wrapt'] = None  # as if not installed\n"
        "from gymtrace._cli import main\n"
        "sys.exit(main(['import', 'nemo-gym', sys.argv[1], '-o', sys.argv[2]]))\n"
    )
    done = run_python(str(out), str(tmp_path / "t.jsonl"), code=code)
    assert done.returncode == 0, done.stderr
    assert kinds(read_otlp_json_lines(tmp_path / "t.jsonl"), c.KIND_ROLLOUT)


def test_the_same_record_imported_twice_gives_the_same_trace_and_span_ids(
    nemo_gym_output: tuple[Path, dict[tuple[int, int], float | None]], tmp_path: Path
) -> None:
    out, _ = nemo_gym_output
    first = imported("nemo-gym", out, out=tmp_path / "one.jsonl")
    second = imported("nemo-gym", out, out=tmp_path / "two.jsonl")
    assert ids(first) == ids(second)
    assert [s.attributes for s in sorted(first, key=lambda s: s.span_id)] == [
        s.attributes for s in sorted(second, key=lambda s: s.span_id)
    ]
    # Another run ID: other traces (run and rollout are both in the trace ID).
    other = imported("nemo-gym", out, out=tmp_path / "three.jsonl", run="another-run")
    assert not {s.trace_id for s in other} & {s.trace_id for s in first}


def test_ng_trajectory_keeps_recorded_times_and_tokens_and_counts_its_gaps(
    tmp_path: Path, capsys: Any
) -> None:
    record = DATA / "nemo_gym" / "reasoning_gym_rollouts.jsonl"
    rows = [json.loads(line) for line in record.read_text().splitlines()]
    spans = imported("nemo-gym", record, out=tmp_path / "traces.jsonl")
    assert check_spans(spans) == []
    report = capsys.readouterr().out
    assert f"{len(rows)}  ng_trajectory gap turns_unavailable" in report

    chats = {s.attributes[c.ROLLOUT_ID]: s for s in kinds(spans, c.KIND_MODEL_CALL)}
    for row in rows:
        (call,) = row["ng_trajectory"]["model_calls"]
        chat = chats[f"{row['_ng_task_index']}-{row['_ng_rollout_index']}"]
        assert chat.start_ns == round(call["started_at"] * 1e9)
        assert chat.end_ns == round(call["completed_at"] * 1e9)
        assert chat.attributes[c.GEN_AI_USAGE_INPUT_TOKENS] == call["token_stats"]["prompt_tokens"]
        assert chat.attributes[c.GEN_AI_USAGE_OUTPUT_TOKENS] == call["token_stats"]["completion_tokens"]
        assert c.TIMING not in chat.attributes  # its times are the record's
    # Every span whose times the record lacks says so; the rollout spans the recorded call.
    for span in spans:
        if span.attributes.get(c.KIND) != c.KIND_MODEL_CALL:
            assert span.attributes[c.TIMING] == c.TIMING_SYNTHETIC, span.name
    (stats,) = summarise(spans)
    assert stats.scored == len(rows)
    assert stats.mean_reward == pytest.approx(math.fsum(r["reward"] for r in rows) / len(rows))


def test_a_trajectory_with_subagents_nests_them_and_a_failed_invocation_fails_its_episode(
    tmp_path: Path,
) -> None:
    # The ng_trajectory schema (nemo_gym/rollout_observability.py TrajectoryRecord, v1.0).
    t0 = 1_787_713_218.0
    trajectory = {
        "schema_version": "1.0",
        "task_id": "0",
        "rollout_id": "0-0",
        "invocations": [
            {"kind": "agent_invocation", "invocation_id": "root", "status": "completed"},
            {
                "kind": "agent_invocation",
                "invocation_id": "sub",
                "parent_invocation_id": "root",
                "spawned_by_tool_call_id": "call-1",
                "status": "failed",
                "error_type": "ContextWindowExceeded",
            },
        ],
        "turns": [
            {
                "invocation_id": "root",
                "task_id": "0",
                "rollout_id": "0-0",
                "turn_no": 1,
                "timestamp": t0,
                "step_count": 1,
                "model_calls": [{"model_call_id": "m1"}],
            },
        ],
        "model_calls": [
            {
                "model_call_id": "m1",
                "started_at": t0,
                "completed_at": t0 + 1,
                "response_metadata": {"model": "policy"},
                "token_stats": {"prompt_tokens": 10, "completion_tokens": 5},
            },
            {
                "model_call_id": "m2",
                "started_at": t0 + 2,
                "completed_at": t0 + 3,
                "response_metadata": {"model": "policy"},
                "token_stats": {"prompt_tokens": 20, "completion_tokens": 7},
            },
        ],
        "tool_calls": [
            {
                "kind": "tool_call",
                "invocation_id": "root",
                "tool_call_id": "call-1",
                "tool_name": "delegate",
                "started_at": t0 + 1.5,
                "completed_at": t0 + 4,
                "status": "completed",
            },
        ],
        "gaps": [],
    }
    # m2 belongs to the subagent: its invocation references it.
    trajectory["invocations"][1]["model_calls"] = [{"model_call_id": "m2"}]
    rows = tmp_path / "rollouts.jsonl"
    rows.write_text(
        json.dumps({"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0, "ng_trajectory": trajectory})
        + "\n"
    )
    spans = imported("nemo-gym", rows, out=tmp_path / "traces.jsonl")
    assert check_spans(spans) == []
    by_id = {s.span_id: s for s in spans}

    def parent_kind(span: SpanData) -> str:
        return str(by_id[span.parent_id].attributes[c.KIND]) if span.parent_id else ""

    sub = next(s for s in kinds(spans, c.KIND_AGENT_INVOCATION) if s.attributes[c.GEN_AI_AGENT_ID] == "sub")
    assert parent_kind(sub) == c.KIND_TOOL_CALL and sub.status == "ERROR"
    m1, m2 = sorted(kinds(spans, c.KIND_MODEL_CALL), key=lambda s: s.start_ns)
    assert parent_kind(m1) == c.KIND_TURN and m2.parent_id == sub.span_id
    (episode,) = kinds(spans, c.KIND_EPISODE)
    assert episode.attributes[c.EPISODE_OUTCOME] == c.OUTCOME_FAILED
    assert episode.attributes[c.ERROR_TYPE] == "ContextWindowExceeded"
    (outcome,) = final_outcomes(spans)
    assert outcome.outcome == c.OUTCOME_UNSCORED  # a failed episode is never scored


# -- ATIF -------------------------------------------------------------------------------------------


def test_atif_trajectories_import_with_agent_steps_as_steps_and_tokens_from_their_metrics(
    tmp_path: Path,
) -> None:
    pytest.importorskip("atif")
    files = sorted((DATA / "atif").glob("*.json"))
    spans = imported("atif", *files, out=tmp_path / "traces.jsonl", run="harbor-golden")
    assert check_spans(spans) == []
    assert all(s.attributes[c.TIMING] == c.TIMING_SYNTHETIC for s in spans)  # golden files hold no times
    for path in files:
        record = json.loads(path.read_text())
        rollout = next(o for o in final_outcomes(spans) if o.rollout_id.endswith(path.stem))
        mine = [s for s in spans if s.trace_id == rollout.trace_id]
        agent_steps = [s for s in record["steps"] if s["source"] == "agent"]
        steps = sorted(kinds(mine, c.KIND_STEP), key=lambda s: s.start_ns)
        assert [s.attributes[c.STEP_NUMBER] for s in steps] == list(range(1, len(agent_steps) + 1))
        chats = kinds(mine, c.KIND_MODEL_CALL)
        totals = record["final_metrics"]
        assert sum(s.attributes[c.GEN_AI_USAGE_INPUT_TOKENS] for s in chats) == totals["total_prompt_tokens"]
        assert (
            sum(s.attributes[c.GEN_AI_USAGE_OUTPUT_TOKENS] for s in chats)
            == totals["total_completion_tokens"]
        )
        tools = kinds(mine, c.KIND_TOOL_CALL)
        assert sorted(s.attributes[c.GEN_AI_TOOL_CALL_ID] for s in tools) == sorted(
            call["tool_call_id"] for step in agent_steps for call in step.get("tool_calls") or ()
        )
        (invocation,) = kinds(mine, c.KIND_AGENT_INVOCATION)
        messages = [e for e in invocation.events if e.name == c.EVENT_RECORD_MESSAGE]
        assert [e.attributes[c.RECORD_STEP_ID] for e in messages] == [
            s["step_id"] for s in record["steps"] if s["source"] != "agent"
        ]
        assert rollout.outcome == c.OUTCOME_UNSCORED  # ATIF holds no reward
    assert ids(spans) == ids(imported("atif", *files, out=tmp_path / "again.jsonl", run="harbor-golden"))


# -- Inspect AI -------------------------------------------------------------------------------------


def write_inspect_log(log_dir: Path, fails: dict[tuple[int, int], int], *, target_of: dict[int, str]) -> Any:
    """4 samples x 2 epochs (tests/support/inspect_eval.py); ``fails[(sample, epoch)]`` attempts
    raise first; retry_on_error=1, and a sample that still fails is an error, not the eval's end."""
    pytest.importorskip("inspect_ai")
    return run_arith_eval(log_dir, fails, retries=1, target_of=target_of, fail_on_error=False)


def test_an_inspect_log_with_errors_and_epochs_imports_with_inspects_own_figures(tmp_path: Path) -> None:
    log = write_inspect_log(tmp_path / "logs", {(3, 2): 1, (4, 1): 5}, target_of={2: "5"})
    spans = imported("inspect", tmp_path / "logs", out=tmp_path / "traces.jsonl")
    assert check_spans(spans) == []
    (stats,) = summarise(spans)
    assert stats.run_id == log.eval.run_id
    assert (stats.scored, stats.unscored) == (
        log.results.completed_samples,
        log.results.total_samples - log.results.completed_samples,
    )
    # Inspect's accuracy is the mean over samples of each sample's epoch mean: pass@1 per task.
    outcomes = final_outcomes(spans)
    reductions = {f"arith.{s.sample_id}": s.value for s in log.reductions[0].samples}
    per_sample = per_task(outcomes, 1, 0.5)
    assert per_sample.tasks == pytest.approx(reductions)
    assert per_sample.mean == pytest.approx(log.results.scores[0].metrics["accuracy"].value)

    by_rollout = {o.rollout_id: o for o in outcomes}
    assert by_rollout["arith.3.r1"].attempts == 2 and by_rollout["arith.3.r1"].reward == 1.0
    assert by_rollout["arith.4.r0"].outcome == c.OUTCOME_UNSCORED and by_rollout["arith.4.r0"].attempts == 2
    # Model events at their recorded times, with their tokens.
    sample = next(s for s in log.samples if s.id == 1 and s.epoch == 1)
    (event,) = [e for e in sample.events if e.event == "model"]
    chat = next(s for s in kinds(spans, c.KIND_MODEL_CALL) if s.attributes[c.ROLLOUT_ID] == "arith.1.r0")
    assert chat.start_ns == round(event.timestamp.timestamp() * 1e9)
    assert chat.end_ns == round(event.completed.timestamp() * 1e9)
    assert chat.attributes[c.GEN_AI_USAGE_INPUT_TOKENS] == 11 and c.TIMING not in chat.attributes
    assert ids(spans) == ids(imported("inspect", tmp_path / "logs", out=tmp_path / "again.jsonl"))


# -- compare and pass@k ----------------------------------------------------------------------------


def brute_pass_at_k(n: int, passed: int, k: int) -> float:
    draws = list(itertools.combinations([True] * passed + [False] * (n - passed), k))
    return sum(any(d) for d in draws) / len(draws)


@pytest.mark.parametrize(("n", "k"), [(n, k) for n in range(1, 7) for k in range(1, n + 1)])
def test_pass_at_k_is_the_unbiased_estimator_for_every_k_up_to_n(n: int, k: int) -> None:
    for passed in range(n + 1):
        assert pass_at_k(n, passed, k) == pytest.approx(brute_pass_at_k(n, passed, k))


def write_run(path: Path, rewards: dict[int, list[float | None]]) -> None:
    """A NeMo Gym output: task -> rewards of its repeats (None: a failed attempt, unscored)."""
    main_rows, failures = [], []
    for task, values in rewards.items():
        for repeat, value in enumerate(values):
            row = {"_ng_task_index": task, "_ng_rollout_index": repeat}
            if value is None:
                failures.append(
                    {**row, "_ng_failure_class": "agent_request_failed", "_ng_failure_terminal": True}
                )
            else:
                main_rows.append({**row, "reward": value})
    path.write_text("".join(json.dumps(r) + "\n" for r in main_rows))
    nemo_import.failures_path(path).write_text("".join(json.dumps(r) + "\n" for r in failures))


def compare_json(
    tmp_path: Path,
    a: dict[int, list[float | None]],
    b: dict[int, list[float | None]],
    capsys: Any,
    *extra: str,
) -> dict[str, Any]:
    for name, rewards in (("a", a), ("b", b)):
        write_run(tmp_path / f"{name}.jsonl", rewards)
        assert (
            main(
                [
                    "import",
                    "nemo-gym",
                    str(tmp_path / f"{name}.jsonl"),
                    "-o",
                    str(tmp_path / f"{name}.traces"),
                ]
            )
            == 0
        )
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "a.traces"), str(tmp_path / "b.traces"), "--json", *extra]) == 0
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    return result


def test_compare_prints_the_true_per_task_deltas_flips_and_interval(tmp_path: Path, capsys: Any) -> None:
    a = {0: [1, 1, 1, 1], 1: [0, 0, 1, 0], 2: [1, 0, 1, 0], 3: [0, 0, 0, 0], 4: [1, 1, 0, 1], 5: [0, 1, 0, 1]}
    b = {0: [1, 1, 1, 1], 1: [1, 1, 1, 0], 2: [0, 0, 1, 0], 3: [1, 0, 0, 0], 4: [1, 1, 1, 1], 5: [0, 1, 1, 1]}
    result = compare_json(tmp_path, a, b, capsys, "--pass-k", "2")
    deltas = {int(t): sum(b[t]) / 4 - sum(a[t]) / 4 for t in a}  # type: ignore[arg-type]
    assert {int(t["task_id"]): t["delta"] for t in result["tasks"]} == pytest.approx(deltas)
    assert all(t["a_n"] == t["b_n"] == 4 for t in result["tasks"])
    assert result["delta"] == pytest.approx(sum(deltas.values()) / len(deltas))
    low, high = result["ci95"]
    # Repeats are resampled within tasks too: the interval can reach past the observed deltas.
    assert -1 <= low <= result["delta"] <= high <= 1
    # Task 1: 0.25 -> 0.75 passes in B only; task 2: 0.5 -> 0.25 passes in A only.
    assert (result["fail_to_pass"], result["pass_to_fail"]) == (["1"], ["2"])
    assert result["verdict"] in ("b_better", "inconclusive")
    expected_k = {str(t): brute_pass_at_k(4, int(sum(v)), 2) for t, v in a.items()}  # type: ignore[arg-type]
    assert result["pass_k"]["a"]["tasks"] == pytest.approx(expected_k)
    # Deterministic: the same inputs, the same interval.
    assert compare_json(tmp_path, a, b, capsys, "--pass-k", "2")["ci95"] == [low, high]


def test_compare_joins_tasks_by_id_not_position_and_refuses_when_coverage_differs(
    tmp_path: Path, capsys: Any
) -> None:
    a = {0: [1.0, 1.0], 1: [0.0, 0.0], 2: [0.0, 1.0]}
    b = {2: [0.0, 1.0], 1: [1.0, 1.0], 0: [None, None]}  # other order; task 0 lost to infrastructure
    result = compare_json(tmp_path, a, b, capsys)
    tasks = {t["task_id"]: t for t in result["tasks"]}
    assert tasks["1"]["delta"] == 1.0 and tasks["2"]["delta"] == 0.0
    assert tasks["0"]["delta"] is None and tasks["0"]["b_n"] == 0
    assert result["verdict"] == "refused" and "unscored shares differ" in result["reason"]
    assert compare_json(tmp_path, a, b, capsys, "--max-unscored-gap", "40")["verdict"] != "refused"


def test_compare_gives_no_verdict_from_one_task_with_one_repeat_a_side(tmp_path: Path, capsys: Any) -> None:
    # 0.50 against 0.51 once each said b_better with the interval (0.01, 0.01) (issue 31).
    result = compare_json(tmp_path, {0: [0.5]}, {0: [0.51]}, capsys)
    assert result["delta"] == pytest.approx(0.01)
    assert result["verdict"] == "too_few_tasks" and result["ci95"] is None
    assert f"at least {MIN_PAIRED_TASKS}" in result["reason"]


def test_compare_gives_a_verdict_from_the_minimum_of_paired_tasks(tmp_path: Path, capsys: Any) -> None:
    a = {t: [0.0, 0.0, 0.0] for t in range(MIN_PAIRED_TASKS)}
    b = {t: [1.0, 1.0, 1.0] for t in range(MIN_PAIRED_TASKS)}
    assert compare_json(tmp_path, a, b, capsys)["verdict"] == "b_better"
    fewer = {t: a[t] for t in range(MIN_PAIRED_TASKS - 1)}
    (tmp_path / "fewer").mkdir()  # import appends to its output: another directory, other files
    assert (
        compare_json(tmp_path / "fewer", fewer, {t: b[t] for t in fewer}, capsys)["verdict"]
        == "too_few_tasks"
    )


def test_the_interval_resamples_the_repeats_within_each_task(tmp_path: Path, capsys: Any) -> None:
    # Every task is 0.05 better in B, from 20 coin flips a side: resampling tasks alone sees six
    # equal deltas and an interval of one point (b_better); the repeats' noise says otherwise.
    tasks = range(MIN_PAIRED_TASKS + 2)
    a: dict[int, list[float | None]] = {t: [1.0] * 10 + [0.0] * 10 for t in tasks}
    b: dict[int, list[float | None]] = {t: [1.0] * 11 + [0.0] * 9 for t in tasks}
    result = compare_json(tmp_path, a, b, capsys)
    assert result["delta"] == pytest.approx(0.05)
    low, high = result["ci95"]
    assert low < 0 < high and result["verdict"] == "inconclusive"
    # The same tasks with no noise inside: the interval is the tasks' alone.
    (tmp_path / "steady").mkdir()
    steady = compare_json(
        tmp_path / "steady", {t: [0.5] * 20 for t in tasks}, {t: [0.55] * 20 for t in tasks}, capsys
    )
    assert steady["ci95"] == pytest.approx([0.05, 0.05]) and steady["verdict"] == "b_better"


def _stats_json(path: Path, capsys: Any, *extra: str) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["stats", str(path), "--json", *extra]) == 0
    body: dict[str, Any] = json.loads(capsys.readouterr().out)
    return body


def test_stats_and_compare_give_the_same_pass_at_k_by_one_threshold_rule(tmp_path: Path, capsys: Any) -> None:
    # Rewards exactly at the threshold, and unscored repeats: stats counted 0.5 as a failure (">")
    # and unscored repeats as failures, compare counted 0.5 as a pass (">="), under one name.
    a: dict[int, list[float | None]] = {
        0: [0.5, 0.0, None, 0.0],
        1: [0.0, 0.0, 0.0, None],
        2: [1.0, 0.5, 0.5, 0.0],
    }
    b: dict[int, list[float | None]] = {
        0: [0.0, 0.0, 0.0, 0.0],
        1: [0.5, 0.5, 0.0, 0.0],
        2: [1.0, 1.0, 1.0, 1.0],
    }
    for threshold in ("0.5", "0.75"):
        compared = compare_json(tmp_path, a, b, capsys, "--pass-k", "2", "--pass-threshold", threshold)
        for side, rewards in (("a", a), ("b", b)):
            stats = _stats_json(
                tmp_path / f"{side}.traces", capsys, "--pass-k", "2", "--pass-threshold", threshold
            )
            assert stats["pass_k"] == compared["pass_k"][side]
            expected = {
                str(task): brute_pass_at_k(
                    len(scored := [r for r in values if r is not None]),
                    sum(1 for r in scored if r >= float(threshold)),
                    2,
                )
                for task, values in rewards.items()
            }
            assert stats["pass_k"]["tasks"] == pytest.approx(expected)
            # stats' per-task pass@n: the same estimator and rule, unscored repeats shown beside it.
            assert stats["pass_at_k"]["0"]["unscored"] == (1 if side == "a" else 0)
    # One rule for a task's mean too: task 0's A mean is 1/6 (no pass at 0.5); task 1's B mean is
    # exactly 0.25 ... and at 0.25 it passes, as a repeat at 0.25 would.
    at_quarter = compare_json(tmp_path, a, b, capsys, "--pass-threshold", "0.25")  # the same files again
    assert "1" in at_quarter["fail_to_pass"]
    stats_b = _stats_json(tmp_path / "b.traces", capsys, "--pass-threshold", "0.25", "--pass-k", "1")
    assert stats_b["pass_k"]["tasks"]["1"] == 0.5  # two of four repeats at or above 0.25


def test_compare_of_a_run_with_itself_has_no_difference() -> None:
    outcomes = final_outcomes(
        imported_spans := nemo_import.import_files([DATA / "nemo_gym" / "reasoning_gym_rollouts.jsonl"]).spans
    )
    assert imported_spans
    result = compare(outcomes, outcomes)
    # Five tasks: fewer than a verdict needs, so no interval either.
    assert result.delta == 0.0 and result.verdict == "too_few_tasks" and result.ci95 is None


def test_an_imported_inspect_log_says_what_the_live_integration_traced(
    captured: CapturedSpans, tmp_path: Path
) -> None:
    import gymtrace.integrations.inspect_ai

    gymtrace.integrations.inspect_ai.instrument()
    write_inspect_log(tmp_path / "logs", {(3, 2): 1, (4, 1): 5}, target_of={2: "5"})
    live = captured.data
    spans = imported("inspect", tmp_path / "logs", out=tmp_path / "traces.jsonl")

    def summary(of: list[Any]) -> set[tuple[Any, ...]]:
        return {
            (o.run_id, o.task_id, o.rollout_id, o.repeat, o.outcome, o.reward, o.attempts)
            for o in final_outcomes(of)
        }

    def episodes(of: list[SpanData]) -> set[tuple[Any, ...]]:
        return {
            (
                s.attributes[c.EPISODE_ID],
                s.attributes[c.EPISODE_OUTCOME],
                s.attributes.get(c.FAILURE_KIND),
                s.attributes.get(c.FAILURE_RETRYABLE),
                s.attributes.get(c.ERROR_TYPE),
            )
            for s in kinds(of, c.KIND_EPISODE)
        }

    def tokens(of: list[SpanData]) -> dict[str, int]:
        found: dict[str, int] = {}
        for s in kinds(of, c.KIND_MODEL_CALL):
            key = str(s.attributes[c.ROLLOUT_ID])
            found[key] = found.get(key, 0) + int(s.attributes[c.GEN_AI_USAGE_INPUT_TOKENS])
        return found

    assert summary(spans) == summary(live)
    assert episodes(spans) == episodes(live)
    assert tokens(spans) == tokens(live)


def test_bad_input_gets_a_clear_error_naming_it(tmp_path: Path, capsys: Any) -> None:
    missing = tmp_path / "nowhere.jsonl"
    assert main(["import", "nemo-gym", str(missing), "-o", str(tmp_path / "t.jsonl")]) == 2
    assert str(missing) in capsys.readouterr().err
    broken = tmp_path / "rollouts.jsonl"
    broken.write_text('{"_ng_task_index": 0, "reward": 1}\n{not json\n')
    assert main(["import", "nemo-gym", str(broken), "-o", str(tmp_path / "t.jsonl")]) == 2
    assert f"{broken}:2" in capsys.readouterr().err
    assert not (tmp_path / "t.jsonl").exists()  # nothing half-written
    assert main(["stats", str(tmp_path / "t.jsonl"), "--pass-k", "0"]) == 2
    assert "--pass-k" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["import", "csv", str(broken)])
    assert "invalid choice" in capsys.readouterr().err


def test_a_harbor_job_gives_tasks_rewards_failures_and_phase_times(tmp_path: Path) -> None:
    pytest.importorskip("atif")
    # Harbor's trial layout (harbor/models/trial/paths.py) and TrialResult (result.py).
    job = tmp_path / "job"
    trajectory = (DATA / "atif" / "terminus-2-hello-world-invalid-json.trajectory.json").read_text()
    trials = {
        "hello-world__Ab3": {
            "verifier_result": {"rewards": {"reward": 1.0}},
            "verifier": {
                "started_at": "2026-01-05T10:00:40+00:00",
                "finished_at": "2026-01-05T10:00:45+00:00",
            },
        },
        "hello-world__Zq9": {
            "verifier_result": None,
            "exception_info": {
                "exception_type": "AgentTimeoutError",
                "exception_message": "agent ran past 600s",
                "exception_traceback": "",
                "occurred_at": "2026-01-05T10:10:00+00:00",
            },
        },
    }
    for name, fields in trials.items():
        (job / name / "agent").mkdir(parents=True)
        (job / name / "agent" / "trajectory.json").write_text(trajectory)
        result = {
            "task_name": "hello-world",
            "trial_name": name,
            "started_at": "2026-01-05T10:00:00+00:00",
            "finished_at": "2026-01-05T10:00:50+00:00",
            "agent_execution": {
                "started_at": "2026-01-05T10:00:05+00:00",
                "finished_at": "2026-01-05T10:00:39+00:00",
            },
            **fields,
        }
        (job / name / "result.json").write_text(json.dumps(result))
    spans = imported("atif", job, out=tmp_path / "traces.jsonl")
    assert check_spans(spans) == []
    outcomes = {o.rollout_id: o for o in final_outcomes(spans)}
    assert {k: (o.task_id, o.outcome, o.reward) for k, o in outcomes.items()} == {
        "hello-world__Ab3": ("hello-world", "scored", 1.0),
        "hello-world__Zq9": ("hello-world", "unscored", None),
    }
    failed = next(s for s in kinds(spans, c.KIND_EPISODE) if s.attributes[c.ROLLOUT_ID] == "hello-world__Zq9")
    assert (
        failed.attributes[c.FAILURE_KIND] == c.FAILURE_TIMEOUT
        and failed.attributes[c.ERROR_TYPE] == "AgentTimeoutError"
    )
    (verify,) = kinds(spans, c.KIND_VERIFY)
    assert (verify.start_ns, verify.end_ns) == (1_767_607_240 * 10**9, 1_767_607_245 * 10**9)
    assert c.TIMING not in verify.attributes
    invocation = next(
        s for s in kinds(spans, c.KIND_AGENT_INVOCATION) if s.attributes[c.ROLLOUT_ID] == "hello-world__Ab3"
    )
    assert (invocation.start_ns, invocation.end_ns) == (1_767_607_205 * 10**9, 1_767_607_239 * 10**9)
