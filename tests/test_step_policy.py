"""The step policy: every step a span, or aggregated with a bounded sample of spans."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import gymtrace
from child_process import run_gymtrace, run_python, trace_lines
from gymtrace import attributes as c
from gymtrace.testing import CapturedSpans, capture_spans, check_trace


@pytest.fixture
def policy(forget_configure: None) -> Iterator[type[gymtrace.StepPolicy]]:
    # The policy a test configures is forgotten after it (gymtrace.testing.reset()).
    yield gymtrace.StepPolicy


def aggregate(**parameters: object) -> None:
    step_policy = gymtrace.StepPolicy("aggregate", **parameters)  # type: ignore[arg-type]
    gymtrace.configure(step_policy=step_policy, file=False)


def steps_of(captured: CapturedSpans) -> list[tuple[int, str | None]]:
    spans = sorted(captured.by_kind("step"), key=lambda s: s.start_time or 0)
    return [(s.attributes[c.STEP_NUMBER], s.attributes.get(c.STEP_KEPT)) for s in spans]


def run_episode(n: int, *, slow: int | None = None, raises: int | None = None) -> None:
    with gymtrace.rollout(rollout_id="r-1", task_id="t", repeat=0), gymtrace.episode():
        for i in range(1, n + 1):
            try:
                with gymtrace.step():
                    if i == slow:
                        time.sleep(0.02)
                    if i == raises:
                        raise ValueError(f"step {i} broke")
            except ValueError:
                pass


def test_aggregate_keeps_the_first_the_slowest_and_counts_every_step(policy) -> None:
    aggregate(first=2, slowest=1)
    with capture_spans() as captured:
        run_episode(10, slow=6)
    kept = steps_of(captured)
    assert kept[:2] == [(1, "first"), (2, "first")] and len(kept) == 3
    number, why = kept[2]
    episode = captured.one("episode").attributes
    assert episode[c.STEPS_POLICY] == "aggregate"
    assert (episode[c.STEPS_COUNT], episode[c.STEPS_SAMPLED]) == (10, 3)
    assert (episode[c.STEPS_FIRST], episode[c.STEPS_SLOWEST]) == (2, 1)
    assert why == "slowest" and episode[c.STEPS_SLOWEST_NUMBER] == number
    assert episode[c.STEPS_DURATION_MAX_MS] >= 20
    assert (
        episode[c.STEPS_DURATION_MIN_MS]
        <= episode[c.STEPS_DURATION_MEAN_MS]
        <= episode[c.STEPS_DURATION_MAX_MS]
    )
    assert episode[c.STEPS_DURATION_TOTAL_MS] == pytest.approx(episode[c.STEPS_DURATION_MEAN_MS] * 10)
    # The slowest step's span has its true times, inside the episode. It is step 6, the one that
    # slept 20 ms, unless a busy machine stalled another step for longer: then that one, and it
    # took at least as long (which a wrong choice, the fastest say, would not).
    slowest = next(s for s in captured.by_kind("step") if s.attributes[c.STEP_NUMBER] == number)
    took = slowest.end_time - slowest.start_time
    assert took >= 20_000_000
    assert took / 1e6 == pytest.approx(episode[c.STEPS_DURATION_MAX_MS], abs=1.0)
    assert slowest.parent.span_id == captured.one("episode").context.span_id
    assert check_trace(captured) == []


def test_a_step_that_raised_is_always_a_span_with_its_exception(policy) -> None:
    aggregate(first=1, slowest=0)
    with capture_spans() as captured:
        run_episode(8, raises=5)
    assert steps_of(captured) == [(1, "first"), (5, "raised")]
    raised = next(s for s in captured.by_kind("step") if s.attributes[c.STEP_NUMBER] == 5)
    assert raised.status.status_code.name == "ERROR"
    assert raised.attributes[c.ERROR_TYPE] == "ValueError"
    assert [e.name for e in raised.events] == ["exception"]
    episode = captured.one("episode").attributes
    assert (episode[c.STEPS_COUNT], episode[c.STEPS_SAMPLED], episode[c.STEPS_ERRORS]) == (8, 2, 1)
    assert check_trace(captured) == []


def test_under_an_agent_invocation_it_owns_the_statistics_and_the_episode_shows_the_policy(policy) -> None:
    aggregate(first=1, slowest=0)

    @gymtrace.step
    def act(i: int) -> int:
        with gymtrace.tool_call(tool_name="move"):
            return i

    with capture_spans() as captured:
        with gymtrace.rollout(rollout_id="r-2", task_id="t", repeat=0), gymtrace.episode():
            with gymtrace.agent_invocation(agent_name="a"):
                assert [act(i) for i in range(5)] == [0, 1, 2, 3, 4]
    invocation = captured.one("agent_invocation")
    assert invocation.attributes[c.STEPS_COUNT] == 5
    assert captured.one("episode").attributes[c.STEPS_POLICY] == "aggregate"
    assert c.STEPS_COUNT not in captured.one("episode").attributes
    # A tool call inside a step without a span nests under the invocation, and keeps its identity.
    tools = captured.by_kind("tool_call")
    assert len(tools) == 5
    parents = sorted(captured.spans, key=lambda s: s.start_time or 0)
    by_id = {s.context.span_id: s.name for s in parents}
    assert [by_id[t.parent.span_id] for t in tools].count("invoke_agent a") == 4
    assert all(t.attributes[c.ROLLOUT_ID] == "r-2" for t in tools)
    assert check_trace(captured) == []


def test_a_sampled_share_of_episodes_keeps_every_step(policy) -> None:
    aggregate(first=0, slowest=0, episode_share=1.0)
    with capture_spans() as captured:
        run_episode(4)
    assert steps_of(captured) == [(1, None), (2, None), (3, None), (4, None)]
    assert captured.one("episode").attributes[c.STEPS_POLICY] == "all"


def test_the_default_policy_makes_every_step_a_span_and_adds_nothing(policy) -> None:
    gymtrace.configure(step_policy=gymtrace.StepPolicy(), file=False)
    with capture_spans() as captured:
        run_episode(3, raises=2)
    assert steps_of(captured) == [(1, None), (2, None), (3, None)]
    assert not [k for k in captured.one("episode").attributes if k.startswith("gym.steps.")]


def test_explicit_step_numbers_stay_true_when_sampled(policy) -> None:
    aggregate(first=1, slowest=0)
    with capture_spans() as captured:
        with gymtrace.rollout(rollout_id="r-3", task_id="t", repeat=0), gymtrace.episode():
            for number in (10, 20, 30):
                with gymtrace.step(number=number):
                    pass
            with pytest.raises(KeyError), gymtrace.step():
                raise KeyError("x")
    assert steps_of(captured) == [(10, "first"), (31, "raised")]
    assert check_trace(captured) == []


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("sometimes", "one of ('all', 'aggregate')"),
        (3, "must be 'all', 'aggregate'"),
        ({"policy": "aggregate", "frist": 2}, "unknown keys ['frist']"),
    ],
)
def test_a_bad_step_policy_is_an_error_naming_it(value: object, problem: str) -> None:
    with pytest.raises(gymtrace.InvalidArgumentError, match="step_policy") as info:
        gymtrace.configure(step_policy=value, file=False)  # type: ignore[arg-type]
    assert not gymtrace.is_configured()  # refused before anything changed
    assert problem in str(info.value)
    with pytest.raises(gymtrace.InvalidArgumentError, match="'first' must be an int >= 0"):
        gymtrace.StepPolicy("aggregate", first=-1)
    with pytest.raises(gymtrace.InvalidArgumentError, match="'episode_share' must be a number in"):
        gymtrace.StepPolicy("aggregate", episode_share=2)


def test_a_bad_variable_warns_and_keeps_every_step_and_never_breaks_the_import(tmp_path: Path) -> None:
    # A typo in the environment is reported like every bad variable, never raised into the
    # application (not even at `import gymtrace`); strict mode raises at configure() instead.
    code = """
    import json, gymtrace
    from gymtrace.testing import capture_spans
    gymtrace.configure(service_name="steps", file=False)
    with capture_spans() as captured:
        with gymtrace.rollout(rollout_id="r", task_id="t", repeat=0), gymtrace.episode():
            for _ in range(3):
                with gymtrace.step():
                    pass
    # The default policy: every step a span, no step statistics on the episode.
    statistics = [k for k in captured.one("episode").attributes if k.startswith("gym.steps.")]
    print(json.dumps({"steps": len(captured.by_kind("step")), "statistics": statistics}))
    """
    out = run_python(
        code=code, cwd=tmp_path, env={"GYMTRACE_STEP_POLICY": "aggregated", "GYMTRACE_STEP_FIRST": "-3"}
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"steps": 3, "statistics": []}
    assert "GYMTRACE_STEP_POLICY='aggregated' is not one of ('all', 'aggregate'); using 'all'" in out.stderr
    assert "GYMTRACE_STEP_FIRST='-3' is not an integer >= 0; using 1" in out.stderr
    strict = run_python(
        code=code, cwd=tmp_path, env={"GYMTRACE_STEP_POLICY": "aggregated", "GYMTRACE_STRICT": "true"}
    )
    assert strict.returncode != 0
    assert "InvalidArgumentError: GYMTRACE_STEP_POLICY must be one of ('all', 'aggregate')" in strict.stderr


def test_the_variables_set_the_policy_and_tree_and_check_read_the_file(tmp_path: Path) -> None:
    code = """
    import json, gymtrace
    gymtrace.configure(service_name="steps", file="trace.jsonl")
    with gymtrace.rollout(rollout_id="r-env", task_id="t", repeat=0):
        with gymtrace.episode():
            for _ in range(50):
                with gymtrace.step():
                    pass
    gymtrace.shutdown()
    print(json.dumps({"ok": True}))
    """
    out = run_python(
        code=code,
        cwd=tmp_path,
        env={"GYMTRACE_STEP_POLICY": "aggregate", "GYMTRACE_STEP_FIRST": "3", "GYMTRACE_STEP_SLOWEST": "2"},
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"ok": True}
    trace_file = tmp_path / "trace.jsonl"
    check = run_gymtrace("check", str(trace_file), cwd=tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr
    tree = run_gymtrace("tree", str(trace_file), cwd=tmp_path)
    assert tree.returncode == 0, tree.stderr
    assert tree.stdout.count("gym.step") == 5  # 3 first + 2 slowest of 50
    assert "steps=50 spans=5" in tree.stdout  # the episode line says the steps are a sample
    lines = [json.loads(line) for line in trace_lines(trace_file)]
    episode = next(
        s
        for line in lines
        for rs in line["resourceSpans"]
        for ss in rs["scopeSpans"]
        for s in ss["spans"]
        if s["name"] == "gym.episode"
    )
    attributes = {a["key"]: a["value"] for a in episode["attributes"]}
    assert attributes[c.STEPS_COUNT] == {"intValue": "50"}
    assert attributes[c.STEPS_POLICY] == {"stringValue": "aggregate"}
