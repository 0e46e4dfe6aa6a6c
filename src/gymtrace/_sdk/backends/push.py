"""``gymtrace push``: trace files into MLflow or Phoenix, synchronously, with the live exporter's
mapping and clients.

Idempotent: spans are stored by their IDs, scores and tags updated in place, runs found by their
``gym.run.id`` tag, so pushing the same files twice changes nothing. A problem is raised as one
line naming the fix (``BackendError``), or ``NotYet`` when the server cannot be reached.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from gymtrace import _constants as c
from gymtrace._model.spandata import SpanData
from gymtrace._read.outcomes import RolloutOutcome
from gymtrace._sdk.backends.client import Client, NotYet
from gymtrace._sdk.backends.scores import SCORE_BACKOFF_MAX, decided

# One OTLP request holds at most this many spans (both servers store a request in one transaction).
PUSH_CHUNK = 500


@dataclass(frozen=True)
class PushResult:
    spans: int
    rollouts: int
    scored: int
    runs: tuple[str, ...]


def push(
    client: Client,
    spans: Sequence[SpanData],
    *,
    wait: float = 60.0,
) -> PushResult:
    """Send ``spans`` (read from trace files) and their rollouts' scores; raises ``BackendError``
    with the fix, or ``NotYet`` when the server cannot be reached. Idempotent: spans are stored by
    their IDs, scores and tags updated in place, runs found by their ``gym.run.id`` tag."""
    data = [s for s in spans if s.attributes.get(c.KIND) != c.KIND_LIVE]
    client.prepare()
    for start in range(0, len(data), PUSH_CHUNK):
        client.send(data[start : start + PUSH_CHUNK])
    outcomes = decided(data)
    deadline = time.monotonic() + wait
    jobs: list[tuple[str, Callable[[], None]]] = []
    for outcome, attempt in outcomes:
        jobs.append(
            (f"the outcome tag of rollout {outcome.rollout_id!r}", partial(client.tag_outcome, outcome))
        )
        if outcome.outcome == c.OUTCOME_SCORED and outcome.reward is not None:
            jobs.append(
                (
                    f"the reward of rollout {outcome.rollout_id!r}",
                    partial(client.score, outcome, attempt),
                )
            )
    by_run: dict[str, list[RolloutOutcome]] = collections.defaultdict(list)
    for outcome, _ in outcomes:
        if outcome.run_id is not None:
            by_run[outcome.run_id].append(outcome)
    for run_id, run_outcomes in by_run.items():
        jobs.append((f"the counts of run {run_id!r}", partial(client.run_ended, run_id, run_outcomes)))
    pause = 0.2
    for describe, call in jobs:
        while True:
            try:
                call()
                break
            except NotYet as exc:
                if time.monotonic() >= deadline:
                    raise NotYet(f"{describe}: {exc}") from exc
                time.sleep(pause)
                pause = min(SCORE_BACKOFF_MAX, pause * 2)
    scored = sum(1 for o, _ in outcomes if o.outcome == c.OUTCOME_SCORED)
    return PushResult(len(data), len(outcomes), scored, tuple(sorted(by_run)))
