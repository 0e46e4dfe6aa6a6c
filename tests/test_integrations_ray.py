"""instrument() on real ray; private where the readers run in process on the files Ray's processes wrote.

A local cluster (``ray.init(num_cpus=2)``) with tasks, an actor, a worker that dies (``os._exit``)
and a task Ray retries.

Ray starts in a child process of its own (one ``ray.init`` for the whole scenario, ~20 s on this
machine), which writes the trace files the test then reads, as a user's driver and workers would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from gymtrace import attributes as c
from gymtrace._model.spandata import SpanData, read_trace_files
from gymtrace._model.tracefiles import trace_files
from gymtrace.testing import check_trace

# A real Ray cluster (its GCS, raylet and workers) per module: left out of `scripts/test --quick`.
pytestmark = pytest.mark.e2e

pytest.importorskip("ray")

SCENARIO = r"""
import io, json, logging, os, sys, time
import ray
import gymtrace
import gymtrace.integrations.ray

out = sys.argv[1]
log = io.StringIO()
logging.getLogger("gymtrace").addHandler(logging.StreamHandler(log))
gymtrace.configure(service_name="ray-driver", file=os.path.join(out, "traces.jsonl"))
# Ray already running, and one function already called, before instrument().
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)


@ray.remote
def early():
    return gymtrace.current().rollout_id


ray.get(early.remote())
# No argument: the workers take the driver's configuration (gymtrace.get_configuration()).
gymtrace.integrations.ray.instrument()


@ray.remote
def play(seed):
    with gymtrace.tool_call(tool_name="simulate"):
        time.sleep(0.001)
    return {"rollout": gymtrace.current().rollout_id, "attempt": gymtrace.current().attempt, "pid": os.getpid()}


@ray.remote(num_returns="streaming")
def stream(n):
    # A generator task stays one (Ray streams it because it is a generator function).
    for i in range(n):
        with gymtrace.tool_call(tool_name="chunk"):
            pass
        yield i


@ray.remote
def outer():
    # A task that calls a task: the worker passes on the identity it was carried with.
    return ray.get(play.remote(9))


@ray.remote(max_retries=2)
def dies_once(marker):
    # The first attempt kills its worker the way a segfault or the OOM killer would.
    if not os.path.exists(marker):
        open(marker, "w").close()
        with gymtrace.tool_call(tool_name="doomed"):
            os._exit(1)
    with gymtrace.tool_call(tool_name="survivor"):
        return "ok"


@ray.remote(max_retries=2)
def episode_dies_once(marker):
    # The rollout's episode runs in the task; the first run's worker dies in the middle of it.
    with gymtrace.episode() as episode:
        with gymtrace.step():
            pass
        if not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(1)
        episode.record_reward(0.75)
    return "ok"


@ray.remote(max_retries=2, retry_exceptions=True)
def episode_raises_once(marker):
    # The same with an exception Ray retries: the first run's failed episode is exported itself.
    with gymtrace.episode() as episode:
        if not os.path.exists(marker):
            open(marker, "w").close()
            raise ConnectionError("the sandbox went away")
        episode.record_reward(0.25)
    return "ok"


@ray.remote
def untouched(x):
    return x * 2


@ray.remote
class Judge:
    def score(self, answer):
        with gymtrace.tool_call(tool_name="judge"):
            return 1.0 if answer == "ok" else 0.0

    async def ping(self):
        return gymtrace.current().rollout_id


@ray.remote
def rollout_in_worker(seed):
    # A step and (in one of them) the reward of the caller's episode, recorded in a worker: each
    # call made at the episode level is a step of its own (its number is reserved at the hand-off).
    with gymtrace.step():
        pass
    if seed == 0:
        with gymtrace.verify():
            gymtrace.record_reward(0.5)


@ray.remote(num_cpus=2)
def split_part(seed):
    # A twelfth of one episode: the whole cluster's CPUs, so the parts run one after another and
    # the same worker process runs several of them (the shape of issue 31's "not increasing").
    with gymtrace.step():
        pass
    with gymtrace.step():
        pass
    return os.getpid()


judge = Judge.remote()
result = {"outside": ray.get(untouched.remote(21))}
with gymtrace.run(run_id="ray-run"):
    with gymtrace.rollout(rollout_id="ray-rollout", task_id="ray-task", repeat=0):
        with gymtrace.episode():
            result["play"] = ray.get([play.remote(i) for i in range(3)])
            result["nested"] = ray.get(outer.remote())
            result["stream"] = [ray.get(ref) for ref in stream.remote(3)]
            result["dies_once"] = ray.get(dies_once.remote(os.path.join(out, "marker")))
            result["ping"] = ray.get(judge.ping.remote())
            result["early"] = ray.get(early.remote())  # exported before instrument(): untraced
            with gymtrace.verify():
                reward = ray.get(judge.score.remote(result["dies_once"]))
                gymtrace.record_reward(reward)
    with gymtrace.rollout(rollout_id="remote-reward", task_id="ray-task", repeat=1):
        with gymtrace.episode():
            ray.get([rollout_in_worker.remote(i) for i in range(2)])
    with gymtrace.rollout(rollout_id="episode-dies", task_id="ray-task", repeat=2):
        result["episode_dies"] = ray.get(episode_dies_once.remote(os.path.join(out, "marker-dies")))
    with gymtrace.rollout(rollout_id="episode-raises", task_id="ray-task", repeat=3):
        result["episode_raises"] = ray.get(episode_raises_once.remote(os.path.join(out, "marker-raises")))
    with gymtrace.rollout(rollout_id="split-episode", task_id="ray-task", repeat=4):
        with gymtrace.episode():
            with gymtrace.step():
                pass
            result["split_pids"] = ray.get([split_part.remote(i) for i in range(12)])
            with gymtrace.step():
                pass
            gymtrace.record_reward(1.0)
ray.shutdown()
gymtrace.shutdown()
result["log"] = log.getvalue()
print(json.dumps(result))
"""


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], list[SpanData], list[Path]]:
    out = tmp_path_factory.mktemp("ray")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GYMTRACE_", "PYTEST_"))}
    env["RAY_AUTH_MODE"] = "disabled"  # a throwaway local cluster on loopback
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCENARIO), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=out,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    files = [f for f in trace_files(out) if f.name.startswith("traces")]
    spans = read_trace_files(files)
    return result, spans, files


def named(spans: list[SpanData], prefix: str) -> list[SpanData]:
    return [s for s in spans if s.name.startswith(prefix)]


def test_tasks_and_actor_methods_continue_the_callers_episode(
    scenario: tuple[dict[str, Any], list[SpanData], list[Path]],
) -> None:
    result, spans, files = scenario
    # The worker saw the caller's identity; the driver's trace files and one per worker process.
    assert [r["rollout"] for r in result["play"]] == ["ray-rollout"] * 3
    assert [r["attempt"] for r in result["play"]] == [0, 0, 0]
    assert result["ping"] == "ray-rollout"
    assert files[0].name == "traces.jsonl" and len(files) >= 2
    assert all(f.name.startswith("traces.ray-") for f in files[1:])

    (rollout,) = [
        s
        for s in spans
        if s.attributes.get(c.ROLLOUT_ID) == "ray-rollout" and s.attributes.get(c.KIND) == "rollout"
    ]
    spans = [s for s in spans if s.trace_id == rollout.trace_id]
    (episode,) = [s for s in spans if s.attributes.get(c.KIND) == "episode"]
    assert rollout.attributes[c.ROLLOUT_OUTCOME] == "scored"
    assert rollout.attributes[c.REWARD] == 1.0
    tasks = named(spans, "ray.task ")
    names = sorted(s.name for s in tasks)
    assert names.count("ray.task play") == 4
    assert result["nested"]["rollout"] == "ray-rollout"
    assert result["stream"] == [0, 1, 2]
    (streamed,) = named(spans, "ray.task stream")
    chunks = [s for s in spans if s.attributes.get(c.GEN_AI_TOOL_NAME) == "chunk"]
    assert len(chunks) == 3 and all(s.parent_id == streamed.span_id for s in chunks)
    assert "ray.task Judge.score" in names and "ray.task Judge.ping" in names
    for task in tasks:
        # Child of the span that was current in the driver; same trace; the identity stamped.
        assert task.trace_id == rollout.trace_id
        assert task.attributes[c.ROLLOUT_ID] == "ray-rollout"
        assert task.attributes[c.RUN_ID] == "ray-run"
        assert task.attributes[c.EPISODE_ATTEMPT] == 0
        assert task.attributes[c.RAY_WORKER_PID] != 0
        assert task.service == "ray-driver"
    by_id = {s.span_id: s for s in spans}
    simulated = [s for s in spans if s.attributes.get(c.GEN_AI_TOOL_NAME) == "simulate"]
    assert len(simulated) == 4
    (outer,) = named(spans, "ray.task outer")
    for tool in simulated:
        assert tool.parent_id is not None and by_id[tool.parent_id].name == "ray.task play"
        assert by_id[tool.parent_id].parent_id in (episode.span_id, outer.span_id)
    assert sum(by_id[t.parent_id].parent_id == outer.span_id for t in simulated) == 1  # type: ignore[index]
    # The verify's actor call nests under the verify span.
    (judge_task,) = named(spans, "ray.task Judge.score")
    assert by_id[judge_task.parent_id].attributes[c.KIND] == "verify"  # type: ignore[index]
    assert check_trace(spans) == []

    from readme_tree import check_readme_tree, excerpt

    check_readme_tree("ray", excerpt(spans))


def test_a_task_whose_worker_died_and_that_ray_retried_is_visible(
    scenario: tuple[dict[str, Any], list[SpanData], list[Path]],
) -> None:
    result, spans, _ = scenario
    assert result["dies_once"] == "ok"
    (retry,) = named(spans, "ray.task dies_once")  # the dead worker's span never ended
    assert retry.attributes[c.RAY_TASK_ATTEMPT] == 1
    (event,) = [e for e in retry.events if e.name == c.EVENT_RAY_TASK_RETRY]
    assert event.attributes[c.RAY_TASK_ATTEMPT] == 1
    assert "attempt 0 ended without a result" in event.attributes["message"]
    tools = [s.attributes[c.GEN_AI_TOOL_NAME] for s in spans if s.attributes.get(c.KIND) == "tool_call"]
    assert "survivor" in tools and "doomed" not in tools  # os._exit lost what it had not flushed
    other = [
        s
        for s in named(spans, "ray.task ")
        if s.name != "ray.task dies_once" and not s.name.startswith("ray.task episode_")  # re-run too
    ]
    assert all(s.attributes[c.RAY_TASK_ATTEMPT] == 0 for s in other)
    # Not only the raw ray.task span knows: the rollout's readers say it too (issue 25).
    from gymtrace._read.check import rerun_notes
    from gymtrace._read.outcomes import final_outcomes
    from gymtrace._read.render import render_tree

    (rollout,) = [o for o in final_outcomes(spans) if o.rollout_id == "ray-rollout"]
    assert rollout.task_reruns == 1 and rollout.as_json()["task_reruns"] == 1
    assert any("rollout ray-rollout: Ray re-ran 1 task(s)" in note for note in rerun_notes(spans))
    assert "=> Ray re-ran 1 task (max_retries" in render_tree(spans)


def _read_back(spans: list[SpanData], rollout_id: str, expected: tuple[str, float, int]) -> list[SpanData]:
    """The rollout's (outcome, reward, attempts) as the readers decide it, and its trace's spans."""
    from gymtrace._read.outcomes import final_outcomes

    (rollout,) = [o for o in final_outcomes(spans) if o.rollout_id == rollout_id]
    assert (rollout.outcome, rollout.reward, rollout.attempts) == expected
    return [s for s in spans if s.trace_id == rollout.trace_id]


def test_an_episode_whose_worker_died_counts_as_a_failed_attempt_before_rays_rerun(
    scenario: tuple[dict[str, Any], list[SpanData], list[Path]],
) -> None:
    # Issue 25: the episode ran in the task, the first run's worker died and Ray re-ran it. Not
    # one clean attempt 0: attempt 0 failed (infrastructure, retryable), attempt 1 its retry.
    result, spans, _ = scenario
    assert result["episode_dies"] == "ok"
    mine = _read_back(spans, "episode-dies", ("scored", 0.75, 2))
    (episode,) = [s for s in mine if s.attributes.get(c.KIND) == "episode"]  # the dead one never ended
    assert episode.attributes[c.EPISODE_ATTEMPT] == 1
    (lost,) = [
        s for s in mine if s.attributes.get(c.KIND) == "outcome" and s.attributes.get(c.EPISODE_ATTEMPT) == 0
    ]
    assert (
        lost.attributes[c.FAILURE_KIND] == "infrastructure" and lost.attributes[c.FAILURE_RETRYABLE] is True
    )
    assert "attempt 0 ended without a result" in lost.status_message
    assert [(link.span_id, link.attributes[c.LINK_RELATION]) for link in episode.links] == [
        (lost.span_id, "retry")
    ]
    assert check_trace(mine) == []


def test_an_episode_ray_retried_after_an_exception_is_counted_once(
    scenario: tuple[dict[str, Any], list[SpanData], list[Path]],
) -> None:
    # retry_exceptions: the first run exported its failed episode itself; the re-run's record of
    # that attempt is the same attempt number, so nothing is counted twice.
    result, spans, _ = scenario
    assert result["episode_raises"] == "ok"
    mine = _read_back(spans, "episode-raises", ("scored", 0.25, 2))
    episodes = sorted((s for s in mine if s.attributes.get(c.KIND) == "episode"), key=lambda s: s.start_ns)
    assert [(s.attributes[c.EPISODE_ATTEMPT], s.attributes[c.EPISODE_OUTCOME]) for s in episodes] == [
        (0, "failed"),
        (1, "completed"),
    ]
    assert check_trace(mine) == []


def test_steps_and_reward_recorded_in_workers_count_as_in_the_driver(
    scenario: tuple[dict[str, Any], list[SpanData], list[Path]],
) -> None:
    _, spans, _ = scenario
    (root,) = [
        s
        for s in spans
        if s.attributes.get(c.ROLLOUT_ID) == "remote-reward" and s.attributes.get(c.KIND) == "rollout"
    ]
    mine = [s for s in spans if s.trace_id == root.trace_id]
    steps = [s for s in mine if s.attributes.get(c.KIND) == "step"]
    assert sorted(s.attributes[c.STEP_NUMBER] for s in steps) == [1, 2]
    outcomes = [s for s in mine if s.name == "gym.outcome"]
    assert outcomes and outcomes[-1].attributes[c.REWARD] == 0.5
    assert check_trace(mine) == []


def test_an_episode_split_over_tasks_one_worker_ran_passes_check(
    scenario: tuple[dict[str, Any], list[SpanData], list[Path]],
) -> None:
    # Each task's steps are numbered as docs/integrations/ray.md says: its first step takes the
    # number reserved when it was called, its further ones N * 1000000 + 1... One worker process
    # ran several tasks, in whatever order Ray chose: check compares the steps of each task.
    result, spans, _ = scenario
    pids = result["split_pids"]
    assert len(pids) == 12 and len(set(pids)) < len(pids)  # some worker ran several parts
    (root,) = [
        s
        for s in spans
        if s.attributes.get(c.ROLLOUT_ID) == "split-episode" and s.attributes.get(c.KIND) == "rollout"
    ]
    mine = [s for s in spans if s.trace_id == root.trace_id]
    numbers = sorted(s.attributes[c.STEP_NUMBER] for s in mine if s.attributes.get(c.KIND) == "step")
    assert len(numbers) == 2 + 12 * 2 and len(set(numbers)) == len(numbers)
    # The driver's own steps: 1, then 14 after the 12 reserved numbers 2..13.
    assert [n for n in numbers if n < 1_000_000] == list(range(1, 15))
    assert sorted(n for n in numbers if n >= 1_000_000) == [b * 1_000_000 + 1 for b in range(2, 14)]
    assert root.attributes[c.ROLLOUT_OUTCOME] == "scored"
    assert check_trace(mine) == []


def test_gymtrace_check_passes_on_the_driver_and_worker_files(
    scenario: tuple[dict[str, Any], list[SpanData], list[Path]],
) -> None:
    _, _, files = scenario
    done = subprocess.run(
        [sys.executable, "-m", "gymtrace", "check", *map(str, files)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no contract violations" in done.stdout


def test_gymtrace_rollouts_reads_the_workers_reward_as_the_rollouts(
    scenario: tuple[dict[str, Any], list[SpanData], list[Path]],
) -> None:
    _, _, files = scenario
    done = subprocess.run(
        [sys.executable, "-m", "gymtrace", "rollouts", "--json", *map(str, files)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {row["rollout_id"]: row for row in map(json.loads, done.stdout.splitlines())}
    remote = rows["remote-reward"]
    assert (remote["outcome"], remote["reward"], remote["attempts"]) == ("scored", 0.5, 1)


def test_calls_outside_gym_scopes_carry_nothing(
    scenario: tuple[dict[str, Any], list[SpanData], list[Path]],
) -> None:
    result, spans, _ = scenario
    assert result["outside"] == 42
    assert named(spans, "ray.task untouched") == []


def test_a_function_called_before_instrument_runs_untraced_and_says_so(
    scenario: tuple[dict[str, Any], list[SpanData], list[Path]],
) -> None:
    result, spans, _ = scenario
    assert result["early"] is None
    assert named(spans, "ray.task early") == []
    assert "called before gymtrace.integrations.ray.instrument()" in result["log"]


def test_bad_configuration_argument_is_named() -> None:
    import gymtrace.integrations.ray

    with pytest.raises(TypeError, match="'configuration'"):
        gymtrace.integrations.ray.instrument({"file": "x"})  # type: ignore[arg-type]


# A driver that exports over OTLP with an API key (issue 31): the key must never become a task
# argument, which Ray stores in its object store and may spill to disk; each worker reads it from
# its own environment. The recorder sits under gymtrace's patch, so it sees the arguments exactly as
# Ray receives them, gymtrace's carrier included.
SECRET = "sk-gymtrace-31-do-not-store"
SECRET_SCENARIO = r"""
import json, os, sys
import ray
import wrapt
import gymtrace
import gymtrace.integrations.ray

endpoint = sys.argv[1]
seen = []


def record(wrapped, instance, args, kwargs):
    seen.append(repr((args, kwargs)))
    return wrapped(*args, **kwargs)


wrapt.wrap_function_wrapper("ray.remote_function", "RemoteFunction._remote", record)
wrapt.wrap_function_wrapper("ray.actor", "ActorMethod._remote", record)
secret_headers = dict([os.environ["OTEL_EXPORTER_OTLP_HEADERS"].split("=", 1)])
config = gymtrace.configure(
    service_name="ray-secret", endpoint=endpoint, protocol="http/protobuf", headers=secret_headers, file=False
)
ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
gymtrace.integrations.ray.instrument(config)


@ray.remote
def work(x):
    with gymtrace.tool_call(tool_name="work"):
        return os.getpid()


@ray.remote
class Scorer:
    def score(self, x):
        with gymtrace.tool_call(tool_name="score"):
            return os.getpid()


scorer = Scorer.remote()
with gymtrace.rollout(rollout_id="r-secret", task_id="t"), gymtrace.episode():
    pids = ray.get([work.remote(1), scorer.score.remote(2)])
ray.shutdown()
gymtrace.shutdown()
print(json.dumps({"seen": seen, "workers": pids, "driver": os.getpid()}))
"""


def test_exporter_headers_never_travel_in_task_arguments_and_workers_read_their_own(tmp_path: Path) -> None:
    from otlp_receiver import http_receiver

    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GYMTRACE_", "PYTEST_"))}
    env["RAY_AUTH_MODE"] = "disabled"
    env["OTEL_EXPORTER_OTLP_HEADERS"] = f"authorization=Bearer {SECRET}"
    with http_receiver() as receiver:
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(SECRET_SCENARIO), receiver.endpoint],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        headers = list(receiver.headers)
        spans = receiver.spans
    result = json.loads(done.stdout.strip().splitlines()[-1])
    carried = [call for call in result["seen"] if "_gymtrace" in call]
    assert len(carried) == 2, result["seen"]  # the task and the actor method carried the episode
    assert all(SECRET not in call and "authorization" not in call.lower() for call in result["seen"])
    # The workers exported their spans with the key from their own environment.
    tasks = [s for s in spans if s.name.startswith(c.SPAN_RAY_TASK)]
    assert {s.attributes[c.RAY_WORKER_PID] for s in tasks} == set(result["workers"])
    assert set(result["workers"]).isdisjoint({result["driver"]})
    assert headers and all(h.get("authorization") == f"Bearer {SECRET}" for h in headers)
    assert {s.attributes.get(c.ROLLOUT_ID) for s in tasks} == {"r-secret"}


def test_headers_given_in_code_are_left_behind_and_that_is_said(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import gymtrace
    from gymtrace.integrations import ray as gym_ray

    monkeypatch.delenv("OTEL_EXPORTER_OTLP_HEADERS", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", raising=False)
    configuration = gymtrace.Configuration(
        service_name="driver",
        endpoint="http://127.0.0.1:4318",
        protocol="http/protobuf",
        headers={"authorization": f"Bearer {SECRET}"},
    )
    with caplog.at_level("WARNING", logger="gymtrace"):
        settings = gym_ray._settings(configuration)
    assert SECRET not in repr(settings)
    assert settings["endpoint"] == "http://127.0.0.1:4318"
    assert any("OTEL_EXPORTER_OTLP_HEADERS" in r.getMessage() for r in caplog.records)
