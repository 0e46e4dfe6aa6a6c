"""The readers (``_read.outcomes``, ``_read.stats``, private), called in process on real traces.

Readers of finished traces agree on each rollout's final outcome (root or outcome record).

Traces are real: produced by gymtrace under ``capture_spans()`` or by a child process with the
file exporter; outcome records are real spans written through the OpenTelemetry API
(``outcome_records.record_outcome``) in the rollout's trace.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace

import gymtrace
from child_process import run_gymtrace, run_python
from gymtrace import attributes as c
from gymtrace._read.outcomes import final_outcomes
from gymtrace._read.stats import summarise
from gymtrace.testing import CapturedSpans, capture_spans, check_trace
from outcome_records import record_outcome


class EnvironmentLost(ConnectionError):
    pass


def _rollout(rollout_id: str, *, task: str = "t", repeat: int = 0, reward: float | None = 1.0) -> None:
    """One rollout of one attempt: scored ``reward``, or failed by infrastructure when None."""
    with gymtrace.rollout(rollout_id=rollout_id, task_id=task, repeat=repeat):
        for attempt in gymtrace.attempts(1, retry_on=EnvironmentLost, reraise=False):
            with attempt:
                if reward is None:
                    raise EnvironmentLost("environment server went away")
                with gymtrace.verify():
                    gymtrace.record_reward(reward)


def _unverified_rollout(rollout_id: str) -> tuple[trace.SpanContext, trace.SpanContext]:
    """A rollout whose episode completes unscored; returns (rollout, episode) span contexts."""
    with gymtrace.rollout(rollout_id=rollout_id, task_id="t", repeat=0):
        rollout_ctx = trace.get_current_span().get_span_context()
        with gymtrace.episode():
            episode_ctx = trace.get_current_span().get_span_context()
    return rollout_ctx, episode_ctx


def _tracer(captured: CapturedSpans) -> trace.Tracer:
    return captured.tracer_provider.get_tracer("outcome-writer")


def test_a_rollout_without_records_is_what_its_root_says(captured: CapturedSpans) -> None:
    with gymtrace.run(run_id="run-1"):
        _rollout("r-1", reward=0.5)
    (outcome,) = final_outcomes(captured.spans)
    assert (outcome.run_id, outcome.task_id, outcome.rollout_id, outcome.repeat) == ("run-1", "t", "r-1", 0)
    assert (outcome.outcome, outcome.reward, outcome.attempts, outcome.source) == ("scored", 0.5, 1, "root")
    assert len(outcome.services) == 1


def test_a_late_outcome_record_decides_over_the_stale_root(captured: CapturedSpans) -> None:
    with gymtrace.run(run_id="run-1"):
        with gymtrace.rollout(rollout_id="r-late", task_id="t", repeat=0) as rollout:
            with gymtrace.episode():
                pass  # the solver; the scorer runs in a later phase
    gymtrace.record_reward(1.0, scope=rollout)  # gymtrace writes the outcome record
    assert len(captured.by_kind(c.KIND_OUTCOME)) == 1
    root = captured.one("rollout")
    assert root.attributes[c.ROLLOUT_OUTCOME] == "unscored"  # immutable once ended
    (outcome,) = final_outcomes(captured.spans)
    assert (outcome.outcome, outcome.reward, outcome.attempts, outcome.source) == ("scored", 1.0, 1, "late")
    assert check_trace(captured) == []
    tree = captured.tree()
    record_line = next(line for line in tree.splitlines() if "gym.outcome" in line)
    root_line = next(line for line in tree.splitlines() if "gym.rollout" in line)
    assert record_line.index("gym.outcome") > root_line.index("gym.rollout")  # a child of the root
    assert "source=late" in record_line and "reward=1" in record_line
    assert "=> final: outcome=scored reward=1 attempts=1" in root_line


def test_a_record_of_an_earlier_attempt_does_not_override_a_later_root(captured: CapturedSpans) -> None:
    with gymtrace.rollout(rollout_id="r-2", task_id="t", repeat=0):
        rollout_ctx = trace.get_current_span().get_span_context()
        for attempt in gymtrace.attempts(2, retry_on=EnvironmentLost, reraise=False):
            with attempt:
                if attempt.index == 0:
                    episode_ctx = trace.get_current_span().get_span_context()
                    raise EnvironmentLost("lost")
                gymtrace.record_reward(0.25)
    record_outcome(
        _tracer(captured),
        parent=rollout_ctx,
        episode=episode_ctx,
        rollout_id="r-2",
        attempt=0,
        attempts=1,
        reward=None,
        source="remote",
    )
    (outcome,) = final_outcomes(captured.spans)
    assert (outcome.outcome, outcome.reward, outcome.attempts, outcome.source) == ("scored", 0.25, 2, "root")
    assert check_trace(captured) == []


def test_among_records_of_one_attempt_the_one_that_ended_last_wins(captured: CapturedSpans) -> None:
    rollout_ctx, episode_ctx = _unverified_rollout("r-3")
    for reward in (0.0, 0.75):
        record_outcome(
            _tracer(captured),
            parent=rollout_ctx,
            episode=episode_ctx,
            rollout_id="r-3",
            attempt=0,
            attempts=1,
            reward=reward,
            source="late",
        )
    (outcome,) = final_outcomes(captured.spans)
    assert (outcome.outcome, outcome.reward) == ("scored", 0.75)


def test_a_rollout_known_only_from_its_outcome_record_still_counts(captured: CapturedSpans) -> None:
    rollout_ctx, episode_ctx = _unverified_rollout("r-4")
    captured.clear()  # the root and the episode are "in another file"
    record_outcome(
        _tracer(captured),
        parent=rollout_ctx,
        episode=episode_ctx,
        run_id="run-9",
        task_id="t",
        repeat=3,
        rollout_id="r-4",
        attempt=0,
        attempts=1,
        reward=1.0,
        source="remote",
    )
    (outcome,) = final_outcomes(captured.spans)
    assert (outcome.run_id, outcome.task_id, outcome.repeat) == ("run-9", "t", 3)
    assert (outcome.outcome, outcome.reward, outcome.source) == ("scored", 1.0, "remote")
    assert [s.run_id for s in summarise(captured.spans)] == ["run-9"]


def test_a_record_without_the_run_id_still_joins_its_rollout_in_the_same_trace(
    captured: CapturedSpans,
) -> None:
    with gymtrace.run(run_id="run-1"):
        rollout_ctx, episode_ctx = _unverified_rollout("r-5")
    record_outcome(
        _tracer(captured),
        parent=rollout_ctx,
        episode=episode_ctx,
        rollout_id="r-5",
        attempt=0,
        attempts=1,
        reward=0.5,
        source="late",
    )
    (outcome,) = final_outcomes(captured.spans)
    assert (outcome.run_id, outcome.outcome, outcome.reward) == ("run-1", "scored", 0.5)


def test_mean_reward_is_over_scored_rollouts_unless_failed_count_as_zero(captured: CapturedSpans) -> None:
    with gymtrace.run(run_id="run-1"):
        _rollout("r-failed", reward=None)  # its only attempt failed with an infrastructure error
        _rollout("r-scored", reward=1.0)
    assert captured.by_kind("episode")[0].attributes[c.FAILURE_KIND] == "infrastructure"
    (default,) = summarise(captured.spans)
    assert (default.scored, default.unscored, default.inputs, default.mean_reward) == (1, 1, 1, 1.0)
    (as_zero,) = summarise(captured.spans, failed_as_zero=True)
    assert (as_zero.scored, as_zero.unscored, as_zero.inputs, as_zero.mean_reward) == (1, 1, 2, 0.5)
    # Nothing was written into the trace: the unscored rollout still has no reward.
    unscored = [r for r in captured.by_kind("rollout") if r.attributes[c.ROLLOUT_OUTCOME] == "unscored"]
    assert len(unscored) == 1 and c.REWARD not in unscored[0].attributes


def test_pass_at_k_per_task_with_repeats(captured: CapturedSpans) -> None:
    with gymtrace.run(run_id="run-1"):
        for repeat, reward in enumerate((0.0, 0.5, None)):
            _rollout(f"a/r{repeat}", task="a", repeat=repeat, reward=reward)
        for repeat in range(2):
            _rollout(f"b/r{repeat}", task="b", repeat=repeat, reward=0.0)
        _rollout("c/r0", task="c", repeat=0, reward=1.0)  # one repeat: no pass@k
    (stats,) = summarise(captured.spans)
    # pass@n over the scored repeats (the unbiased estimator with k = n), a repeat passing at or
    # above the threshold (0.5); task a's unscored repeat is shown, not counted as a failure.
    assert {(p.task_id, p.k, p.passed, p.unscored, p.value) for p in stats.pass_at_k} == {
        ("a", 2, 1, 1, 1.0),
        ("b", 2, 0, 0, 0.0),
    }
    (strict,) = summarise(captured.spans, pass_threshold=0.6)
    assert {(p.task_id, p.passed) for p in strict.pass_at_k} == {("a", 0), ("b", 0)}
    assert stats.as_json()["pass_at_k"]["a"] == {"k": 2, "n": 2, "passed": 1, "unscored": 1, "value": 1.0}


def test_two_runs_sharing_a_run_id_are_named_not_reported_as_attempt_violations() -> None:
    with capture_spans() as captured:
        for _ in range(2):  # the same script run twice into one input
            with gymtrace.run(run_id="run-1"):
                for repeat in range(2):
                    _rollout(f"t-1/r{repeat}", repeat=repeat, reward=1.0)
        problems = check_trace(captured)
    assert problems == ["2 runs share run ID run-1: appended re-run?"]
    stats = summarise(captured.spans)
    assert [(s.run_id, s.runs_sharing_id, s.scored) for s in stats] == [("run-1", 2, 2), ("run-1", 2, 2)]
    assert len({s.run_span_id for s in stats}) == 2
    assert len(final_outcomes(captured.spans)) == 4


def test_with_one_trace_per_run_each_rollout_names_the_run_span_it_sits_below() -> None:
    from gymtrace._scopes.levels import set_trace_per

    set_trace_per("run")
    try:
        with capture_spans() as captured:
            for _ in range(2):  # the same script run twice into one input: one run ID, two run spans
                with gymtrace.run(run_id="run-1"):
                    for repeat in range(2):
                        _rollout(f"t/r{repeat}", repeat=repeat, reward=1.0)
    finally:
        set_trace_per("rollout")
    runs = {s.span_id for s in captured.data if s.attributes[c.KIND] == c.KIND_RUN}
    rollouts = [s for s in captured.data if s.attributes[c.KIND] == c.KIND_ROLLOUT]
    assert len(runs) == 2 and all(s.parent_id is not None and not s.links for s in rollouts)
    outcomes = final_outcomes(captured.spans)
    assert Counter(o.run_span_id for o in outcomes) == {run: 2 for run in runs}
    assert {s.run_span_id: s.scored for s in summarise(captured.spans)} == {run: 2 for run in runs}


def test_spans_appearing_twice_are_read_once_and_named(captured: CapturedSpans) -> None:
    with gymtrace.run(run_id="run-1"):
        _rollout("r-1", reward=1.0)
    doubled = captured.data * 2
    assert len(final_outcomes(doubled)) == 1
    assert check_trace(doubled) == ["run run-1 appears 2 times (the same spans): file appended twice?"]


# -- the command line, on files written by real processes ----------------------------------------

_FAILED_AND_SCORED = """
import gymtrace
gymtrace.configure(service_name="harness", file={path!r})

class EnvironmentLost(ConnectionError):
    pass

with gymtrace.run(run_id="run-1"):
    for name, fails in (("r-failed", True), ("r-scored", False)):
        with gymtrace.rollout(rollout_id=name, task_id=name, repeat=0):
            for attempt in gymtrace.attempts(1, retry_on=EnvironmentLost, reraise=False):
                with attempt:
                    if fails:
                        raise EnvironmentLost("environment server went away")
                    with gymtrace.verify():
                        gymtrace.record_reward(1.0)
gymtrace.shutdown()
"""


@pytest.fixture
def failed_and_scored(tmp_path: Path) -> Path:
    path = tmp_path / "traces.jsonl"
    run_python(code=_FAILED_AND_SCORED.format(path=str(path)), check=True)
    return path


def test_stats_command_applies_the_denominator_rule(failed_and_scored: Path) -> None:
    out = run_gymtrace("stats", str(failed_and_scored), check=True).stdout
    assert "run run-1: 2 rollouts, 1 scored, 1 unscored; mean 1 over 1 input (scored only)" in out
    out = run_gymtrace("stats", str(failed_and_scored), "--failed-as-zero", check=True).stdout
    assert "mean 0.5 over 2 inputs (scored and unscored as 0)" in out
    (line,) = run_gymtrace("stats", str(failed_and_scored), "--json", check=True).stdout.splitlines()
    stats = json.loads(line)
    assert {k: stats[k] for k in ("run_id", "scored", "unscored", "inputs", "mean_reward")} == {
        "run_id": "run-1",
        "scored": 1,
        "unscored": 1,
        "inputs": 1,
        "mean_reward": 1.0,
    }


def test_rollouts_command_prints_one_line_per_rollout(failed_and_scored: Path) -> None:
    lines = run_gymtrace("rollouts", str(failed_and_scored), "--json", check=True).stdout.splitlines()
    rows = [json.loads(line) for line in lines]
    fixed = ("run_id", "task_id", "rollout_id", "repeat", "outcome", "reward", "attempts")
    assert [{k: row[k] for k in fixed} for row in rows] == [
        {
            "run_id": "run-1",
            "task_id": "r-failed",
            "rollout_id": "r-failed",
            "repeat": 0,
            "outcome": "unscored",
            "reward": None,
            "attempts": 1,
        },
        {
            "run_id": "run-1",
            "task_id": "r-scored",
            "rollout_id": "r-scored",
            "repeat": 0,
            "outcome": "scored",
            "reward": 1.0,
            "attempts": 1,
        },
    ]
    assert [row["services"] for row in rows] == [["harness"], ["harness"]]
    text = run_gymtrace("rollouts", str(failed_and_scored), check=True).stdout.splitlines()
    assert text[0].split() == [
        "RUN", "TASK", "ROLLOUT", "REPEAT", "OUTCOME", "REWARD", "ATTEMPTS", "RAN", "IN", "DECIDED", "BY"
    ]  # fmt: skip
    assert text[1].split() == [
        "run-1",
        "r-failed",
        "r-failed",
        "0",
        "unscored",
        "-",
        "1",
        "harness",
        "root",
    ]
    assert text[2].split() == ["run-1", "r-scored", "r-scored", "0", "scored", "1", "1", "harness", "root"]
    other = run_gymtrace("rollouts", str(failed_and_scored), "--run", "run-2")
    assert other.returncode == 1 and "no rollouts found" in other.stderr


_HARNESS = """
import json, os, subprocess, sys
import gymtrace
from gymtrace import propagation
gymtrace.configure(service_name="harness", file={path!r})
with gymtrace.run(run_id="run-1"):
    with gymtrace.rollout(rollout_id="r-remote", task_id="t", repeat=0):
        with gymtrace.episode():
            # The reward is computed by a reward server in another process.
            env = {{**os.environ, **propagation.env_carrier()}}
            subprocess.run([sys.executable, "-c", {child!r}], env=env, check=True)
gymtrace.shutdown()
"""

_REWARD_SERVER = """
import os
import gymtrace
from gymtrace import propagation
gymtrace.configure(service_name="reward-server", file={path!r})
# Continue the harness's episode from the propagated context and score it here.
with propagation.attach(dict(os.environ)):
    with gymtrace.step():
        pass
    with gymtrace.verify():
        gymtrace.record_reward(1.0)
gymtrace.shutdown()
"""


def test_a_reward_recorded_in_another_process_is_the_rollouts(tmp_path: Path) -> None:
    harness, server = tmp_path / "harness.jsonl", tmp_path / "server.jsonl"
    child = _REWARD_SERVER.format(path=str(server))
    out = run_python(code=_HARNESS.format(path=str(harness), child=child))
    assert out.returncode == 0, out.stderr
    rows = [
        json.loads(line)
        for line in run_gymtrace(
            "rollouts", str(harness), str(server), "--json", check=True
        ).stdout.splitlines()
    ]
    assert [(r["rollout_id"], r["outcome"], r["reward"], r["source"]) for r in rows] == [
        ("r-remote", "scored", 1.0, "remote")
    ]
    assert rows[0]["services"] == ["harness"]
    # Without the reward server's file the harness's own root is all there is: it handed the
    # episode to the server and has no outcome of its own, so it is pending, never unscored.
    alone = json.loads(run_gymtrace("rollouts", str(harness), "--json", check=True).stdout)
    assert (alone["outcome"], alone["reward"]) == ("pending", None)
    lone_check = run_gymtrace("check", str(harness))
    assert lone_check.returncode == 0, lone_check.stdout
    assert "rollout r-remote: pending" in lone_check.stdout
    assert "may be in a file not given" in lone_check.stdout
    stats = json.loads(run_gymtrace("stats", str(harness), "--json", check=True).stdout)
    assert (stats["pending"], stats["scored"], stats["unscored"], stats["mean_reward"]) == (1, 0, 0, None)
    check = run_gymtrace("check", str(harness), str(server))
    assert check.returncode == 0, check.stdout
    tree = run_gymtrace("tree", str(harness), "--run", "run-1", check=True).stdout
    assert "gym.outcome" not in tree  # the record is in the other file
    both = _tree_of(harness, server)
    assert "gym.outcome [outcome]" in both and "@reward-server" in both
    assert "=> final: outcome=scored reward=1" in both


def _tree_of(*paths: Path) -> str:
    # Read together, as a Ray run's or a set of services' per-process files are.
    return run_gymtrace("tree", *map(str, paths), check=True).stdout


def test_readme_quickstart_run_twice_into_one_file_is_named_as_a_re_run(tmp_path: Path) -> None:
    import re

    readme = (Path(__file__).parent.parent / "README.md").read_text()
    quickstart = re.findall(r"```python\n(.*?)```", readme, flags=re.DOTALL)[0]
    for _ in range(2):
        run_python(code=quickstart, cwd=tmp_path, check=True)
    out = run_gymtrace("check", "gymtrace-traces.jsonl", cwd=tmp_path)
    assert out.returncode == 1
    assert "2 runs share run ID run-1: appended re-run?" in out.stdout
    assert "attempts are" not in out.stdout
    stats = run_gymtrace("stats", "gymtrace-traces.jsonl", cwd=tmp_path, check=True).stdout.splitlines()
    runs = [line for line in stats if line.startswith("run ")]
    assert len(runs) == 2 and all("2 runs share run ID run-1: appended re-run?" in s for s in runs)
    rows = run_gymtrace("rollouts", "gymtrace-traces.jsonl", "--json", cwd=tmp_path, check=True).stdout
    assert len(rows.splitlines()) == 4


def test_check_output_shows_three_examples_per_rule_and_a_count(tmp_path: Path) -> None:
    path = tmp_path / "many.jsonl"
    code = f"""
import gymtrace
gymtrace.configure(file={str(path)!r})
for _ in range(50):
    with gymtrace.verify():
        pass
gymtrace.shutdown()
"""
    run_python(code=code, check=True)
    out = run_gymtrace("check", str(path))
    assert out.returncode == 1
    lines = [line for line in out.stdout.splitlines() if line.startswith("  - ")]
    assert len(lines) == 4, out.stdout
    assert all("verify span outside any rollout" in line for line in lines[:3])
    assert lines[3] == "  - ... and 47 more: reward outside any rollout"


_POOL_HARNESS = """
import os, subprocess, sys
import gymtrace
from gymtrace import propagation
gymtrace.configure(service_name="harness", file={path!r})
with gymtrace.run(run_id="run-1"), gymtrace.rollout(rollout_id="r-pool", task_id="t", repeat=0):
    with gymtrace.episode():
        env = {{**os.environ, **propagation.env_carrier()}}
        workers = [
            subprocess.Popen([sys.executable, "-c", {worker!r}, f"{{os.path.dirname({path!r})}}/w{{n}}.jsonl"], env=env)
            for n in range(2)
        ]
        assert [w.wait() for w in workers] == [0, 0]
        gymtrace.record_reward(1.0)
gymtrace.shutdown()
"""

_POOL_WORKER = """
import os, sys
import gymtrace
from gymtrace import propagation
gymtrace.configure(service_name="worker", file=sys.argv[1])
with propagation.attach(dict(os.environ)):
    # One step per worker: numbering several steps under one attach() is the writer's.
    with gymtrace.step():
        pass
gymtrace.shutdown()
"""


def test_steps_of_worker_processes_of_one_service_pass_check(tmp_path: Path) -> None:
    harness = tmp_path / "harness.jsonl"
    out = run_python(code=_POOL_HARNESS.format(path=str(harness), worker=_POOL_WORKER))
    assert out.returncode == 0, out.stderr
    files = [str(harness), str(tmp_path / "w0.jsonl"), str(tmp_path / "w1.jsonl")]
    check = run_gymtrace("check", *files)
    assert check.returncode == 0, check.stdout
    assert "OK:" in check.stdout
    tree = _tree_of(*(Path(f) for f in files))
    assert tree.count("gym.step [step]") == 2 and "@worker" in tree


def test_jaeger_reader_keeps_error_type_and_knows_outcome_links() -> None:
    from gymtrace._read.jaeger import spans_from_jaeger

    def tag(key: str, value: Any, kind: str = "string") -> dict[str, Any]:
        return {"key": key, "type": kind, "value": value}

    # The shape of one element of "data" in Jaeger's v1 /api/traces answer.
    trace_json = {
        "traceID": "ab" * 16,
        "processes": {"p1": {"serviceName": "harness", "tags": [tag(c.SERVICE_INSTANCE_ID, "i-1")]}},
        "spans": [
            {
                "traceID": "ab" * 16,
                "spanID": "01" * 8,
                "operationName": "gym.episode",
                "processID": "p1",
                "startTime": 1,
                "duration": 2,
                "references": [],
                "tags": [
                    tag(c.KIND, "episode"),
                    tag("error", True, "bool"),
                    tag(c.ERROR_TYPE, "builtins.ConnectionError"),
                    tag("otel.status_code", "ERROR"),
                ],
            },
            {
                "traceID": "ab" * 16,
                "spanID": "02" * 8,
                "operationName": "gym.outcome",
                "processID": "p1",
                "startTime": 5,
                "duration": 1,
                "references": [{"refType": "FOLLOWS_FROM", "traceID": "ab" * 16, "spanID": "01" * 8}],
                "tags": [tag(c.KIND, "outcome")],
            },
        ],
    }
    episode, record = spans_from_jaeger(trace_json)
    assert episode.attributes[c.ERROR_TYPE] == "builtins.ConnectionError"
    assert "error" not in episode.attributes and episode.status == "ERROR"
    assert episode.service_instance == "i-1"
    assert [(link.span_id, link.attributes[c.LINK_RELATION]) for link in record.links] == [
        ("01" * 8, "outcome")
    ]


_FIRST_ATTEMPT = """
import json, sys
import gymtrace
gymtrace.configure(service_name="node-a", file=sys.argv[1])
with gymtrace.run(run_id="run-1"), gymtrace.rollout(rollout_id="r-moved", task_id="t", repeat=0) as rollout:
    with gymtrace.episode():
        gymtrace.record_failure("infrastructure")
    carrier = rollout.carrier()
gymtrace.shutdown()
print(json.dumps(carrier))
"""

_NEXT_ATTEMPT = """
import json, sys
import gymtrace
gymtrace.configure(service_name="node-b", file=sys.argv[1])
with gymtrace.episode(continue_from=json.loads(sys.argv[2])), gymtrace.verify():
    gymtrace.record_reward(0.75)
gymtrace.shutdown()
"""


def test_an_attempt_continued_in_another_process_is_the_final_outcome(tmp_path: Path) -> None:
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    carrier = run_python(str(first), code=_FIRST_ATTEMPT, check=True).stdout.strip()
    run_python(str(second), carrier, code=_NEXT_ATTEMPT, check=True)
    (row,) = map(
        json.loads,
        run_gymtrace("rollouts", str(first), str(second), "--json", check=True).stdout.splitlines(),
    )
    assert (row["outcome"], row["reward"], row["attempts"], row["source"]) == ("scored", 0.75, 2, "continued")
    assert row["services"] == ["node-a", "node-b"]
    text = run_gymtrace("rollouts", str(first), str(second), check=True).stdout
    assert "0@node-a 1@node-b" in text
    stats = json.loads(run_gymtrace("stats", str(first), str(second), "--json", check=True).stdout)
    assert (stats["scored"], stats["unscored"], stats["mean_reward"]) == (1, 0, 0.75)
    assert run_gymtrace("check", str(first), str(second)).returncode == 0
    # The root alone (node-a's file) still says what node-a knew.
    alone = json.loads(run_gymtrace("rollouts", str(first), "--json", check=True).stdout)
    assert (alone["outcome"], alone["attempts"]) == ("unscored", 1)
