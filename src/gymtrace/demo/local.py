"""A small simulated gym run, traced with gymtrace's decorators (``gymtrace demo``).

Nothing here talks to a real model or environment: a scripted "model" answers arithmetic and
lookup tasks, an in-memory "environment" seeds a session, runs tools and verifies the answer. The
script makes every case of the vocabulary happen at least once, deterministically:

- a clean rollout, and ``num_repeats`` > 1 (separate rollouts with their own IDs);
- an infrastructure failure followed by a successful retry (attempt 1, linked to attempt 0);
- a rollout that exhausts its attempts and ends *unscored* (no reward, not 0);
- a checkpoint-restored episode (``gym.episode.restored``, linked to the episode it continues);
- a subagent spawned by a tool call;
- a reward recorded in another process (a scorer process that continues the episode from its
  propagated context) and a reward recorded in a later phase, after the rollout span ended: both
  become ``gym.outcome`` records, and every reader counts those rollouts scored.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymtrace
from gymtrace import _constants as c
from gymtrace import propagation
from gymtrace._model.spandata import SpanData, read_otlp_json_lines
from gymtrace._model.tracefiles import open_lines, trace_files
from gymtrace.testing import check_trace


class EnvironmentLost(ConnectionError):
    """The simulated environment server went away (an infrastructure failure, retryable)."""


class EpisodeTimeout(TimeoutError):
    """The simulated episode ran out of time after its last checkpoint."""


@dataclass
class Task:
    task_id: str
    question: str
    answer: str
    tools: tuple[str, ...]
    # What goes wrong, per repeat: {repeat: [failure of attempt 0, failure of attempt 1, ...]}
    script: dict[int, list[str]] = field(default_factory=dict)
    delegate: bool = False
    # Where the answer is scored, per repeat: "remote" (a scorer process) or "late" (after the
    # rollout ended); by default in the episode, by the environment's verify.
    scoring: dict[int, str] = field(default_factory=dict)


TASKS = [
    Task("arith-001", "What is 17 * 23?", "391", ("calculator",), script={1: ["infrastructure"]}),
    Task(
        "arith-002",
        "What is 2 ** 10 - 24?",
        "1000",
        ("calculator",),
        script={0: ["infrastructure"] * 3, 1: ["timeout"]},
    ),
    Task("lookup-003", "Capital of Norway?", "Oslo", ("search", "delegate"), delegate=True),
    Task("arith-004", "What is 6 * 7?", "42", ("calculator",), scoring={0: "remote", 1: "late"}),
]
MAX_ATTEMPTS = 3


@dataclass
class Session:
    task: Task
    failures: list[str]
    attempt: int
    notes: list[str] = field(default_factory=list)


class Environment:
    """An in-memory environment: seed_session, tools, verify."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    @gymtrace.seed_session
    async def seed_session(self, task: Task, failures: list[str], attempt: int) -> Session:
        await asyncio.sleep(0.002)
        return Session(task, failures, attempt)

    @gymtrace.tool_call(
        tool_name=lambda self, session, name, argument: name,
        call_id=lambda self, session, name, argument: f"call-{self.rng.randrange(10**6):06d}",
    )
    async def call_tool(self, session: Session, name: str, argument: str) -> str:
        await asyncio.sleep(0.001)
        failure = session.failures[session.attempt] if session.attempt < len(session.failures) else None
        if failure == "infrastructure" and name != "delegate":
            raise EnvironmentLost(f"environment server for {session.task.task_id} went away")
        if name == "calculator":
            return str(eval(argument, {"__builtins__": {}}))
        if name == "delegate":
            return await subagent(self, session, argument)
        return session.task.answer if "Norway" in argument else "unknown"

    @gymtrace.verify(reward_from="reward")
    async def verify(self, session: Session, answer: str) -> dict[str, Any]:
        await asyncio.sleep(0.001)
        correct = answer.strip() == session.task.answer
        return {"reward": 1.0 if correct else 0.0, "correct": correct}


@gymtrace.model_call(model="scripted-model-1", provider="gymtrace-demo")
async def call_model(messages: list[str], rng: random.Random) -> str:
    await asyncio.sleep(0.002)
    gymtrace.record_usage(
        input_tokens=sum(len(m) for m in messages) // 4 + 12, output_tokens=rng.randrange(8, 40)
    )
    return messages[-1]


@gymtrace.agent_invocation(
    agent_name="researcher", invocation_id=lambda env, session, question: f"sub-{session.task.task_id}"
)
async def subagent(env: Environment, session: Session, question: str) -> str:
    with gymtrace.turn(), gymtrace.step():
        await call_model([question], env.rng)
        return await env.call_tool(session, "search", question)


@gymtrace.agent_invocation(agent_name="solver")
async def solve(env: Environment, session: Session) -> str:
    """A two-turn agent: think (model call), then act (model call + tool call)."""
    task = session.task
    messages = [task.question]
    with gymtrace.turn(), gymtrace.step():
        messages.append(await call_model(messages, env.rng))
    with gymtrace.turn(), gymtrace.step():
        await call_model(messages, env.rng)
        if session.failures[session.attempt : session.attempt + 1] == ["timeout"]:
            raise EpisodeTimeout(f"{task.task_id}: episode timed out after its checkpoint")
        tool = task.tools[-1]
        argument = task.question.split("is ")[-1].rstrip("?") if tool == "calculator" else task.question
        return await env.call_tool(session, tool, argument)


# The scorer process: continues the episode from the propagated headers and records the reward
# there; gymtrace writes it as the rollout's outcome record (source "remote").
_SCORER = """
import json, sys
import gymtrace
from gymtrace import propagation

headers, answer, expected, exporters = json.loads(sys.argv[1])
gymtrace.configure(service_name="gymtrace-demo-scorer", **exporters)
with propagation.attach(headers), gymtrace.verify():
    gymtrace.record_reward(1.0 if answer.strip() == expected else 0.0)
gymtrace.shutdown()
"""


@dataclass
class Scoring:
    """Where the scorer process sends its spans (its own file, merged afterwards; the endpoint)."""

    file: str
    endpoint: str | None = None
    protocol: str | None = None
    # Rollouts left to the later phase: (rollout scope, answer, expected answer).
    later: list[tuple[Any, str, str]] = field(default_factory=list)


async def score_elsewhere(answer: str, expected: str, scoring: Scoring) -> None:
    exporters = {"file": scoring.file, "endpoint": scoring.endpoint, "protocol": scoring.protocol}
    # The scorer process continues this episode: it records the reward (a hand-off, inside the gym).
    carrier = propagation.inject({}, destination=propagation.GYM_INTERNAL, continuation=True)
    argument = json.dumps([carrier, answer, expected, exporters])
    process = await asyncio.create_subprocess_exec(sys.executable, "-c", _SCORER, argument)
    if await process.wait() != 0:
        raise RuntimeError(f"the scorer process exited with {process.returncode}")


async def run_rollout(
    env: Environment, task: Task, repeat: int, run_id: str, scoring: Scoring
) -> float | None:
    failures = task.script.get(repeat, [])
    where = task.scoring.get(repeat)
    rollout_id = f"{run_id}/{task.task_id}/r{repeat}"
    with gymtrace.rollout(rollout_id=rollout_id, task_id=task.task_id, repeat=repeat) as rollout:
        # A timeout after a checkpoint is resumed from that checkpoint, not restarted clean.
        restore = "timeout" in failures
        attempts = gymtrace.attempts(
            MAX_ATTEMPTS, retry_on=(EnvironmentLost, EpisodeTimeout), restore=restore, reraise=False
        )
        reward: float | None = None
        for attempt in attempts:
            async with attempt:
                session = await env.seed_session(task, failures, attempt.index)
                answer = await solve(env, session)
                if where == "remote":
                    await score_elsewhere(answer, task.answer, scoring)
                elif where == "late":
                    scoring.later.append((rollout, answer, task.answer))
                else:
                    result = await env.verify(session, answer)
                    reward = result["reward"]
        # Scored elsewhere or later: this process does not know the reward (the trace does).
        return reward if attempts.succeeded else None


@dataclass
class DemoResult:
    run_id: str
    rewards: dict[str, float | None]


async def run_demo(*, run_id: str, scoring: Scoring, repeats: int = 2, seed: int = 7) -> DemoResult:
    env = Environment(random.Random(seed))
    rewards: dict[str, float | None] = {}
    with gymtrace.run(run_id=run_id):
        jobs = {
            f"{task.task_id}/r{repeat}": run_rollout(env, task, repeat, run_id, scoring)
            for task in TASKS
            for repeat in range(repeats)
        }
        results = await asyncio.gather(*jobs.values())
        rewards = dict(zip(jobs, results, strict=True))
        # The later phase: a batch scorer after the rollouts ended (their spans are final).
        for rollout, answer, expected in scoring.later:
            gymtrace.record_reward(1.0 if answer.strip() == expected else 0.0, scope=rollout)
    return DemoResult(run_id, rewards)


@dataclass
class LocalResult:
    """What ``run_local()`` did: the run's spans read back from the file, checked."""

    run_id: str
    rewards: dict[str, float | None]
    elapsed: float  # seconds the run took
    spans: list[SpanData]
    problems: list[str]  # contract violations (empty when the trace holds)
    file: str
    targets: list[str] = field(default_factory=list)  # where the spans went, e.g. "OTLP/grpc URL"


def run_local(
    *, run_id: str, file: str, repeats: int = 2, endpoint: str | None = None, protocol: str | None = None
) -> LocalResult:
    """Trace the simulated run to ``file`` (and to ``endpoint`` when given), read it back, check it."""
    config = gymtrace.configure(service_name="gymtrace-demo", endpoint=endpoint, protocol=protocol, file=file)
    with tempfile.TemporaryDirectory(prefix="gymtrace-demo-") as work:
        scoring = Scoring(str(Path(work) / "scorer.jsonl"), endpoint=endpoint, protocol=protocol)
        try:
            started = time.perf_counter()
            result = asyncio.run(run_demo(run_id=run_id, scoring=scoring, repeats=repeats))
            elapsed = time.perf_counter() - started
            gymtrace.force_flush()
            _append_lines(scoring.file, file)  # the scorer process's spans join the run's file
            spans = [s for s in read_otlp_json_lines(file) if s.attributes.get(c.RUN_ID) == run_id]
        finally:
            gymtrace.shutdown()
    targets = [
        f"OTLP/{config.protocol} {config.endpoint}" if name == "otlp" else file if name == "file" else name
        for name in config.exporters
    ]
    return LocalResult(run_id, result.rewards, elapsed, spans, check_trace(spans), file, targets)


def _append_lines(source: str, target: str) -> None:
    with open(target, "ab") as out:
        for path in trace_files(source):
            if path.exists():
                with open_lines(path) as lines:
                    out.writelines(line for line in lines if line.strip())
