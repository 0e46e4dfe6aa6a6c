"""A simulated asynchronous GRPO run (``gymtrace demo --training``), rollout workers in processes.

Nothing here trains anything: a trainer process hands groups of rollouts (``samples`` per prompt) to
``workers`` rollout-worker processes and, one step off-policy, trains on each step's batch while the
workers already generate the next one. After each step its weights change: the workers read the
new version before each model call (``set_policy_version``), so rollouts in flight at an update end
under a newer version than they started with. The trainer consumes every rollout with its join
keys, which travel with the rollout's data: ``failed`` when it has no reward, ``stale`` past the
off-policy limit (a slow group held back two steps), ``filtered`` for a zero-variance group
(dynamic sampling), else ``trained``. It also records, independently of the trace, what it did,
so the demo (and its test) can compare ``gymtrace stats --by train_step`` with it.

The workers are forked before anything is configured (each configures its own exporter), which
needs the ``fork`` start method (Linux, macOS).
"""

from __future__ import annotations

import multiprocessing
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

# The off-policy limit: a rollout more than this many versions older than the step is stale.
MAX_STALENESS = 1
# A group of step 0 the workers are slow with: the trainer gets it only at step 2 (stale there).
SLOW_GROUP = 0
# Every sample of this group gets the same reward: zero variance, filtered out.
ZERO_VARIANCE_GROUP = 3
# (step, group, sample) whose episode fails: it has no reward.
FAILING = (1, 1, 3)
# (step, group, sample) still running when the trainer's weights change: after its first model call
# it tells the trainer, which publishes its first update only then, and waits for that update, so
# at least one rollout ends under a newer version whatever the timing.
IN_FLIGHT_AT_UPDATE = (1, 0, 0)


class EnvironmentError_(RuntimeError):
    """The simulated environment failed (an episode failure, so the rollout has no reward)."""


@dataclass
class StepRecord:
    """What the trainer did in one step, recorded beside the trace (not read from it)."""

    step: int
    policy_version: int
    outcomes: dict[str, int] = field(default_factory=dict)
    wasted_seconds: float = 0.0
    staleness: list[int] = field(default_factory=list)


@dataclass
class TrainingResult:
    run_id: str
    file: str
    steps: list[StepRecord]
    # The trainer's decision per rollout ID: (step, outcome, staleness).
    decisions: dict[str, tuple[int, str, int]]
    spans: list[SpanData]
    problems: list[str]
    workers: int
    elapsed: float


def _reward(step: int, group: int, sample: int) -> float:
    if group == ZERO_VARIANCE_GROUP:
        return 1.0
    return float((sample + group + step) % 2)


def _sync_weights(version: Any) -> None:
    """The worker's weight sync: the version the trainer published, from now on."""
    gymtrace.set_policy_version(version.value)


def _await_update(version: Any, seen: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while version.value <= seen and time.monotonic() < deadline:
        time.sleep(0.001)


def _generate(job: dict[str, Any], version: Any, in_flight: Any) -> dict[str, Any]:
    step, group, sample, samples = job["step"], job["group"], job["sample"], job["samples"]
    _sync_weights(version)
    started_under = version.value
    keys: dict[str, Any] = {}
    reward: float | None = None
    with propagation.attach(job["carrier"]):
        try:
            with gymtrace.rollout(
                rollout_id=f"s{step}-g{group}-{sample}",
                task_id=f"prompt-{step}-{group}",
                repeat=sample,
                group_id=f"s{step}-g{group}",
                group_size=samples,
                train_step=step,
            ) as rollout:
                started = getattr(rollout.span, "start_time", None) or time.time_ns()
                keys = gymtrace.current().join_keys()
                with gymtrace.episode():
                    with gymtrace.seed_session():
                        time.sleep(0.001)
                    for turn in range(2):
                        if turn == 1 and (step, group, sample) == IN_FLIGHT_AT_UPDATE:
                            in_flight.set()
                            _await_update(version, started_under)
                        _sync_weights(version)  # a weight update may land between model calls
                        with gymtrace.step():
                            with gymtrace.model_call(model="policy", provider="gymtrace-demo") as call:
                                time.sleep(0.003)
                                call.record_usage(input_tokens=120, output_tokens=40 + turn * 10)
                            with gymtrace.tool_call(tool_name="env.step"):
                                time.sleep(0.001)
                    if (step, group, sample) == FAILING:
                        raise EnvironmentError_("the sandbox crashed")
                    with gymtrace.verify():
                        reward = _reward(step, group, sample)
                        gymtrace.record_reward(reward)
        except EnvironmentError_:
            reward = None
    ended = getattr(rollout.span, "end_time", None) or time.time_ns()
    return {
        "keys": keys,
        "step": step,
        "group": group,
        "reward": reward,
        "seconds": (ended - started) / 1e9,
    }


def _worker(
    index: int,
    file: str,
    endpoint: str | None,
    protocol: str | None,
    jobs: Any,
    results: Any,
    version: Any,
    in_flight: Any,
) -> None:
    gymtrace.configure(
        service_name=f"rollout-worker-{index}", file=file, endpoint=endpoint, protocol=protocol
    )
    try:
        while True:
            job = jobs.get()
            if job is None:
                break
            results.put(_generate(job, version, in_flight))
    finally:
        gymtrace.shutdown()


def _decide(item: dict[str, Any], batch: list[dict[str, Any]], version: int) -> tuple[str, str | None, int]:
    """The trainer's rule: (outcome, reason, staleness)."""
    started = item["keys"].get(c.POLICY_VERSION)
    staleness = version - started if isinstance(started, int) else 0
    if item["reward"] is None:
        return c.OUTCOME_FAILED, "no_reward", staleness
    if staleness > MAX_STALENESS:
        return c.STALE, "off_policy_limit", staleness
    rewards = {i["reward"] for i in batch if i["group"] == item["group"] and i["step"] == item["step"]}
    rewards.discard(None)
    if len(rewards) == 1:
        return c.FILTERED, "zero_variance_group", staleness
    return c.TRAINED, None, staleness


def run_training(
    *,
    run_id: str,
    file: str,
    workers: int = 2,
    steps: int = 3,
    groups: int = 4,
    samples: int = 4,
    endpoint: str | None = None,
    protocol: str | None = None,
) -> TrainingResult:
    """Run the simulated training run, trace it to ``file`` (the workers' spans appended) and to
    ``endpoint`` over OTLP when given, read the file back and check it."""
    context = multiprocessing.get_context("fork")
    jobs, results, version = context.Queue(), context.Queue(), context.Value("i", 0)
    in_flight = context.Event()
    with tempfile.TemporaryDirectory(prefix="gymtrace-training-") as work:
        worker_files = [str(Path(work) / f"worker-{i}.jsonl") for i in range(workers)]
        # Forked before this process configures anything: each worker sets up its own exporter.
        processes = [
            context.Process(
                target=_worker,
                args=(i, worker_files[i], endpoint, protocol, jobs, results, version, in_flight),
                daemon=True,
            )
            for i in range(workers)
        ]
        for process in processes:
            process.start()
        started = time.perf_counter()
        gymtrace.configure(service_name="trainer", file=file, endpoint=endpoint, protocol=protocol)
        records: list[StepRecord] = []
        decisions: dict[str, tuple[int, str, int]] = {}
        try:
            with gymtrace.run(run_id=run_id):
                carrier = propagation.inject({}, destination=propagation.GYM_INTERNAL)
                pending: dict[int, int] = {}

                def submit(step: int) -> None:
                    for group in range(groups):
                        for sample in range(samples):
                            jobs.put(
                                {
                                    "step": step,
                                    "group": group,
                                    "sample": sample,
                                    "samples": samples,
                                    "carrier": carrier,
                                }
                            )
                    pending[step] = groups * samples

                arrived: dict[int, list[dict[str, Any]]] = {}

                def collect(step: int) -> list[dict[str, Any]]:
                    while pending.get(step, 0) > 0:
                        item = results.get(timeout=60)
                        arrived.setdefault(item["step"], []).append(item)
                        pending[item["step"]] -= 1
                    return arrived.pop(step, [])

                submit(0)
                held: list[dict[str, Any]] = []
                for step in range(steps):
                    batch = collect(step)
                    if step == 0 and steps > 2:
                        held = [i for i in batch if i["group"] == SLOW_GROUP]
                        batch = [i for i in batch if i["group"] != SLOW_GROUP]
                    if step == 2:
                        batch += held
                    if step + 1 < steps:
                        submit(step + 1)  # one step off-policy: the next batch generates meanwhile
                    record = StepRecord(step, version.value)
                    with gymtrace.train_step(step=step, policy_version=version.value):
                        for item in batch:
                            outcome, reason, staleness = _decide(item, batch, version.value)
                            gymtrace.consume(item["keys"], outcome=outcome, reason=reason)
                            record.outcomes[outcome] = record.outcomes.get(outcome, 0) + 1
                            record.staleness.append(staleness)
                            if outcome != c.TRAINED:
                                record.wasted_seconds += item["seconds"]
                            decisions[item["keys"][c.ROLLOUT_ID]] = (step, outcome, staleness)
                        time.sleep(0.02)  # the optimizer step
                    if step == 0 and steps > 1:
                        in_flight.wait(timeout=10)  # publish once a rollout of the next batch runs
                    records.append(record)
                    with version.get_lock():
                        version.value += 1  # the new weights reach the workers' next model calls
        finally:
            for _ in processes:
                jobs.put(None)
            for process in processes:
                process.join(timeout=30)
            gymtrace.shutdown()
        elapsed = time.perf_counter() - started
        with open(file, "ab") as out:
            for path in (f for worker_file in worker_files for f in trace_files(worker_file)):
                if path.exists():
                    with open_lines(path) as lines:
                        out.writelines(line for line in lines if line.strip())
    spans = [s for s in read_otlp_json_lines(file) if s.attributes.get(c.RUN_ID) == run_id]
    return TrainingResult(run_id, file, records, decisions, spans, check_trace(spans), workers, elapsed)
