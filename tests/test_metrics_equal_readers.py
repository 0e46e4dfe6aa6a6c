"""The metrics against the readers' own decision (``_read.outcomes``, private), called in process.

The metrics equal the readers: over generated programs, ``gym.rollout.completed`` and
``gym.rollout.reward`` hold exactly what ``gymtrace rollouts`` (``_outcomes.final_outcomes``) decides
from the same spans, each rollout once, read by a reader's own ``collect()`` with no
``gymtrace.force_flush()`` first.

Programs mix what decides an outcome: local rewards, a remote scorer continuing the episode's
carrier (during the rollout or after it), failed, cancelled and retried episodes, explicit and
reused attempt numbers, a verify() after the last episode, late rewards and failures on ended
scopes, hand-offs that leave the rollout pending, episodes continued from a carrier after the
rollout ended, and rollouts that never score.

The global MeterProvider and TracerProvider can be set once per process, so each path runs in its
own child process (this file run as a script): ``sdk``, a TracerProvider built with
``gymtrace.IdentitySpanProcessor`` and an in-memory exporter; ``lean``, ``gymtrace.configure()``
(gymtrace's lean spans) writing a file.
"""

from __future__ import annotations

import contextlib
import math
import random
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

REWARDS = st.sampled_from([0.0, 0.25, 0.5, 0.9, 1.0])
ENDINGS = ("completed", "record_failure", "raise", "cancel")


@dataclass(frozen=True)
class EpisodeSpec:
    rewards: tuple[float, ...]
    ending: str
    handoff: bool
    attempt: int | None  # an explicit attempt number (may repeat an earlier one), or the default
    remote_during: float | None  # a scorer continuing this episode's headers while it runs
    late_failure: bool  # record_failure(scope=episode) after it ended


@dataclass(frozen=True)
class RolloutSpec:
    episodes: tuple[EpisodeSpec, ...]
    rollout_rewards: tuple[float, ...]
    after: tuple[float, ...]  # verify() after the last episode
    late: float | None  # record_reward(scope=rollout) after the rollout ended
    remote_after: float | None  # the scorer, after the rollout ended, on the last headers
    remote_fails: bool  # ... or it records a failure instead
    carrier_after: str | None  # an episode continued from a carrier after the rollout ended


@st.composite
def episodes(draw: st.DrawFn) -> EpisodeSpec:
    handoff = draw(st.booleans())
    return EpisodeSpec(
        rewards=tuple(draw(st.lists(REWARDS, max_size=2))),
        ending=draw(st.sampled_from(ENDINGS)),
        handoff=handoff,
        attempt=draw(st.none() | st.integers(min_value=0, max_value=2)),
        remote_during=draw(st.none() | REWARDS) if handoff else None,
        late_failure=draw(st.booleans()),
    )


@st.composite
def rollouts(draw: st.DrawFn) -> RolloutSpec:
    specs = tuple(draw(st.lists(episodes(), max_size=3)))
    handed = any(e.handoff for e in specs)
    return RolloutSpec(
        episodes=specs,
        rollout_rewards=tuple(draw(st.lists(REWARDS, max_size=1))) if not specs else (),
        after=tuple(draw(st.lists(REWARDS, max_size=1))) if specs else (),
        late=draw(st.none() | REWARDS),
        remote_after=draw(st.none() | REWARDS) if handed else None,
        remote_fails=handed and draw(st.booleans()),
        carrier_after=draw(st.none() | st.sampled_from(["scored", "failed", "unscored"])),
    )


def run_rollout(spec: RolloutSpec, run_index: int, index: int) -> None:
    import gymtrace
    from gymtrace import propagation

    # The episode's carrier, taken on purpose (the hand-off): what a scorer elsewhere continues.
    handed: dict[str, Any] | None = None
    carrier: dict[str, Any] | None = None
    with (
        contextlib.suppress(ConnectionError),
        gymtrace.rollout(rollout_id=f"r{run_index}-{index}", task_id="t") as rollout,
    ):
        for value in spec.rollout_rewards:
            gymtrace.record_reward(value)
        for episode_spec in spec.episodes:
            try:
                with gymtrace.episode(attempt=episode_spec.attempt) as episode:
                    if episode_spec.handoff:
                        handed = episode.carrier()
                        if episode_spec.remote_during is not None:
                            with propagation.attach(handed), gymtrace.verify():
                                gymtrace.record_reward(episode_spec.remote_during)
                    for value in episode_spec.rewards:
                        gymtrace.record_reward(value)
                    if episode_spec.ending == "record_failure":
                        gymtrace.record_failure("infrastructure", message="sandbox lost")
                    elif episode_spec.ending == "raise":
                        raise ConnectionError("sandbox lost")
                    elif episode_spec.ending == "cancel":
                        raise KeyboardInterrupt
            except (ConnectionError, KeyboardInterrupt):
                pass
            if episode_spec.late_failure:
                gymtrace.record_failure("infrastructure", scope=episode, message="found out later")
        for value in spec.after:
            with gymtrace.verify():
                gymtrace.record_reward(value)
        if spec.carrier_after is not None:
            carrier = rollout.carrier()
    if spec.late is not None:
        gymtrace.record_reward(spec.late, scope=rollout)
    if handed is not None and (spec.remote_after is not None or spec.remote_fails):
        with propagation.attach(handed):
            if spec.remote_fails:
                gymtrace.record_failure("infrastructure", message="scorer lost the sandbox")
            elif spec.remote_after is not None:
                with gymtrace.verify():
                    gymtrace.record_reward(spec.remote_after)
    if carrier is not None:
        # Another worker (here, the same process) continues the rollout from its carrier.
        with contextlib.suppress(ConnectionError), gymtrace.episode(continue_from=carrier):
            if spec.carrier_after == "scored":
                gymtrace.record_reward(0.75)
            elif spec.carrier_after == "failed":
                raise ConnectionError("worker lost")


_RUNS = [0]


def metric_points(reader: Any) -> tuple[Counter[str], int, float, list[int], list[int]]:
    """Completed by outcome, reward count, sum and bucket counts, and gym.rollout.active's values."""
    completed: Counter[str] = Counter()
    count, total, buckets, active = 0, 0.0, [], []
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data is not None else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                for p in m.data.data_points:
                    if m.name == "gym.rollout.completed":
                        completed[p.attributes["gym.rollout.outcome"]] += p.value
                    elif m.name == "gym.rollout.reward":
                        count, total, buckets = p.count, p.sum, list(p.bucket_counts)
                    elif m.name == "gym.rollout.active":
                        active.append(p.value)
    return completed, count, total, buckets, active


def check_program(program: list[RolloutSpec], reader: Any, spans: Any) -> None:
    import gymtrace
    from gymtrace._model.errors import set_strict, strict_override
    from gymtrace._read.outcomes import final_outcomes
    from gymtrace._scopes.metrics import REWARD_BUCKETS

    _RUNS[0] += 1
    run_id = f"run-{_RUNS[0]}"
    # Hypothesis seeds the random module alike for every example, and the SDK draws trace and span
    # IDs from it: without this, every example would repeat the IDs of the first.
    random.seed(_RUNS[0])
    previous_strict = strict_override()
    set_strict(False)  # programs misuse on purpose (late failures, reused attempts)
    try:
        with gymtrace.run(run_id=run_id):
            for index, spec in enumerate(program):
                run_rollout(spec, _RUNS[0], index)
    finally:
        set_strict(previous_strict)
    # The reader's own collect(), before any flush: every rollout has ended.
    completed, count, total, buckets, active = metric_points(reader)
    outcomes = final_outcomes(spans(), run_id=run_id)
    assert len(outcomes) == len(program), (program, outcomes)
    expected = Counter(o.outcome for o in outcomes)
    assert +completed == expected, (program, [(o.outcome, o.reward) for o in outcomes])
    rewards = [o.reward for o in outcomes if o.outcome == "scored" and o.reward is not None]
    assert count == len(rewards), (program, rewards)
    assert math.isclose(total, math.fsum(rewards), abs_tol=1e-9), (program, rewards, total)
    if rewards:
        want = [0] * (len(REWARD_BUCKETS) + 1)
        for value in rewards:
            want[sum(1 for bound in REWARD_BUCKETS if value > bound)] += 1
        assert buckets == want, (program, rewards, buckets)
    assert active == [0], active


def main(path: str, examples: int, directory: str) -> None:
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import Counter as SdkCounter
    from opentelemetry.sdk.metrics import Histogram as SdkHistogram
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader

    import gymtrace
    from gymtrace._model.spandata import read_otlp_json_lines

    # Delta: each collection holds what happened since the last one, i.e. one program.
    delta = {SdkCounter: AggregationTemporality.DELTA, SdkHistogram: AggregationTemporality.DELTA}
    reader = InMemoryMetricReader(preferred_temporality=delta)  # type: ignore[arg-type]
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    if path == "sdk":
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(gymtrace.IdentitySpanProcessor())  # type: ignore[arg-type]
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)

        def spans() -> Any:
            return exporter.get_finished_spans()
    else:
        file = Path(directory) / "traces.jsonl"
        gymtrace.configure(service_name="metrics-property", file=str(file), heartbeat=0)

        def spans() -> Any:
            gymtrace.force_flush()  # the spans (the metrics were read before)
            return read_otlp_json_lines(file)

    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,  # the same programs on every run: CI stays deterministic
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    @given(st.lists(rollouts(), min_size=1, max_size=3))
    def property_holds(program: list[RolloutSpec]) -> None:
        check_program(program, reader, spans)

    property_holds()
    gymtrace.shutdown()
    print("ok")


@pytest.mark.parametrize("path", ["sdk", "lean"])
def test_metrics_equal_what_gymtrace_rollouts_decides_over_generated_programs(
    path: str, tmp_path: Path
) -> None:
    from child_process import run_python

    out = run_python(__file__, path, "100", str(tmp_path), cwd=tmp_path, timeout=600)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-6000:]


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
