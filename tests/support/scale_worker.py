"""One load-generating process of the scale-out test: many rollouts over OTLP, and a local copy.

    python tests/support/scale_worker.py ENDPOINT RUN_ID COUNT FILE LONG_SECONDS

Runs COUNT rollouts of run RUN_ID, 8 at a time, exported over OTLP/gRPC to ENDPOINT and to the
OTLP/JSON lines FILE (what was sent, span for span, for the test to compare with Jaeger). The
rollout's index picks its shape (see ``shape``): clean and scored, retried (attempt 0 fails), long
and retried (outlives the Collector's wait after a root), unscored (no reward), or late (scored 2 s
after the rollout ended, through its carrier: a ``gym.outcome`` record arriving after the
Collector decided the trace).
"""

from __future__ import annotations

import asyncio
import sys

import gymtrace
from gymtrace import propagation


class EnvironmentLost(ConnectionError):
    """The simulated infrastructure failure that makes an attempt retried."""


def shape(index: int) -> str:
    return {0: "retried", 1: "unscored", 2: "long", 3: "late"}.get(index % 10, "clean")


async def one_rollout(run_id: str, index: int, long_seconds: float, gate: asyncio.Semaphore) -> None:
    kind = shape(index)
    headers: dict[str, str] = {}
    async with gate:
        with gymtrace.rollout(rollout_id=f"{run_id}/{kind}-{index}", task_id=f"task-{index % 7}", repeat=0):
            for attempt in gymtrace.attempts(max_attempts=2, retry_on=EnvironmentLost):
                async with attempt:
                    with gymtrace.agent_invocation(agent_name="solver"), gymtrace.turn(), gymtrace.step():
                        with gymtrace.model_call(model="toy", provider="local"):
                            await asyncio.sleep(long_seconds if kind == "long" and attempt.number else 0.05)
                        if kind in ("retried", "long") and attempt.number == 0:
                            raise EnvironmentLost("sandbox went away")
                    # Scored later from these headers: a hand-off inside the gym.
                    headers = propagation.inject({}, destination=propagation.GYM_INTERNAL, continuation=True)
                    with gymtrace.verify():
                        if kind not in ("unscored", "late"):
                            gymtrace.record_reward(1.0)
    if kind == "late":
        await asyncio.sleep(2.0)
        with propagation.attach(headers), gymtrace.verify():
            gymtrace.record_reward(0.5)


async def main(run_id: str, count: int, long_seconds: float) -> None:
    gate = asyncio.Semaphore(8)
    with gymtrace.run(run_id=run_id):
        await asyncio.gather(*(one_rollout(run_id, i, long_seconds, gate) for i in range(count)))


if __name__ == "__main__":
    endpoint, run_id, count, file, long_seconds = sys.argv[1:6]
    gymtrace.configure(service_name="gymtrace-scale", endpoint=endpoint, file=file)
    asyncio.run(main(run_id, int(count), float(long_seconds)))
    gymtrace.shutdown()
