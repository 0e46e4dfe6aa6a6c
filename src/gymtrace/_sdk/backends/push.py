"""``gymtrace push``: trace files into MLflow or Phoenix, synchronously, with the live exporter's
mapping and clients.

Idempotent: spans are stored by their IDs, scores and tags updated in place, runs found by their
``gym.run.id`` tag, so pushing the same files twice changes nothing. Both servers keep a trace in
the experiment (project) it first arrived in and file later spans of it there, so a trace that
another experiment already holds (traced there live, or pushed there before) goes under new IDs,
derived from (original ID, experiment): pushed twice to the same experiment it still lands on the
same IDs. Each of its spans carries the original trace ID (``gym.push.original_trace_id``), the ID
the files and ``join_keys()`` records hold. What the result reports is read back from the server,
never what was sent. A problem is raised as one line naming the fix (``BackendError``), or
``NotYet`` when the server cannot be reached.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

from gymtrace import _constants as c
from gymtrace._model.ids import deterministic_id
from gymtrace._model.spandata import LinkData, SpanData
from gymtrace._read.outcomes import RolloutOutcome
from gymtrace._sdk.backends.client import Accepted, BackendError, Client, NotYet
from gymtrace._sdk.backends.scores import SCORE_BACKOFF_MAX, decided

# One OTLP request holds at most this many spans (both servers store a request in one transaction).
PUSH_CHUNK = 500
# Namespaces of the IDs a moved trace gets (deterministic_id: a fixed namespace first).
_MOVED_TRACE = "gymtrace/push/trace"
_MOVED_SPAN = "gymtrace/push/span"


@dataclass(frozen=True)
class PushResult:
    """What the server holds of the pushed files, read back through its API after the push."""

    spans: int
    traces: int
    rollouts: int
    scored: int
    runs: tuple[str, ...]
    # Traces that went under new IDs: how many, by the experiment (project) holding their originals
    # ("": none does, an earlier push here gave them those IDs).
    moved: Mapping[str, int]


def moved_trace_id(trace_id: str, experiment: str) -> str:
    """The ID a trace gets when pushed to ``experiment`` while another experiment holds ``trace_id``."""
    return format(deterministic_id(_MOVED_TRACE, trace_id, experiment, size=16), "032x")


def _moved_span_id(trace_id: str, span_id: str, experiment: str) -> str:
    return format(deterministic_id(_MOVED_SPAN, trace_id, span_id, experiment, size=8), "016x")


def move(spans: Sequence[SpanData], traces: Collection[str], experiment: str) -> list[SpanData]:
    """``spans`` with every trace in ``traces`` under its IDs for ``experiment``: trace, span,
    parent and link IDs derived from the originals, each span carrying its original trace ID."""
    traces = set(traces)

    def link(old: LinkData) -> LinkData:
        if old.trace_id not in traces:
            return old
        return dataclasses.replace(
            old,
            trace_id=moved_trace_id(old.trace_id, experiment),
            span_id=_moved_span_id(old.trace_id, old.span_id, experiment),
        )

    out = []
    for span in spans:
        links = tuple(link(x) for x in span.links)
        if span.trace_id not in traces:
            out.append(span if links == span.links else dataclasses.replace(span, links=links))
            continue
        trace = span.trace_id
        out.append(
            dataclasses.replace(
                span,
                trace_id=moved_trace_id(trace, experiment),
                span_id=_moved_span_id(trace, span.span_id, experiment),
                parent_id=_moved_span_id(trace, span.parent_id, experiment) if span.parent_id else None,
                links=links,
                attributes={**span.attributes, c.PUSH_ORIGINAL_TRACE_ID: trace},
            )
        )
    return out


def placed(client: Client, spans: Sequence[SpanData]) -> tuple[list[SpanData], dict[str, int]]:
    """``spans`` under the trace IDs they get in the client's experiment, and how many traces went
    under new IDs by the experiment holding their originals. A trace keeps its IDs unless another
    experiment of the server holds it; one pushed here under new IDs before keeps those."""
    originals = sorted({s.trace_id for s in spans})
    derived = {t: moved_trace_id(t, client.experiment) for t in originals}
    holders = client.holders([*originals, *derived.values()])
    to_move = {
        t
        for t in originals
        if holders.get(derived[t]) == client.experiment
        or holders.get(t, client.experiment) != client.experiment
    }
    # By the experiment holding the originals; "" where none else does (an earlier push here gave
    # the trace its new IDs, and its original has since left the server).
    moved = collections.Counter(
        holders[t] if holders.get(t, client.experiment) != client.experiment else "" for t in to_move
    )
    return (move(spans, to_move, client.experiment) if to_move else list(spans)), dict(moved)


def push(
    client: Client,
    spans: Sequence[SpanData],
    *,
    wait: float = 60.0,
) -> PushResult:
    """Send ``spans`` (read from trace files) and their rollouts' scores, and read back what the
    server holds of them; raises ``BackendError`` with the fix, or ``NotYet`` when the server cannot
    be reached."""
    data = [s for s in spans if s.attributes.get(c.KIND) != c.KIND_LIVE]
    client.prepare()
    data, moved = placed(client, data)
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
    accepted = _read_back(client, data, outcomes, deadline)
    rollouts = [o for o, _ in outcomes if o.trace_id in accepted.traces]
    return PushResult(
        spans=accepted.spans,
        traces=len(accepted.traces),
        rollouts=len(rollouts),
        scored=accepted.scores,
        runs=tuple(sorted({o.run_id for o in rollouts if o.run_id is not None})),
        moved=moved,
    )


def _read_back(
    client: Client,
    data: Sequence[SpanData],
    outcomes: Sequence[tuple[RolloutOutcome, int]],
    deadline: float,
) -> Accepted:
    """What the experiment holds of ``data``, read back until it holds all of it or the deadline
    passes (a server may store spans after it answered); ``BackendError`` naming what is missing."""
    sent: dict[str, set[str]] = collections.defaultdict(set)
    for span in data:
        sent[span.trace_id].add(span.span_id)
    spans = sum(len(ids) for ids in sent.values())
    scored = sum(1 for o, _ in outcomes if o.outcome == c.OUTCOME_SCORED and o.reward is not None)
    pause = 0.2
    while True:
        accepted = client.accepted(sent)
        if accepted.spans >= spans and accepted.scores >= scored:
            return accepted
        if time.monotonic() >= deadline:
            raise BackendError(
                f"{client.where()}, {client.kind} {client.experiment!r}, holds {accepted.spans} of the"
                f" {spans} spans sent ({len(accepted.traces)} of {len(sent)} traces) and"
                f" {accepted.scores} of {scored} rewards: its log says why; push again once it is"
                " fixed (pushing twice changes nothing)"
            )
        time.sleep(pause)
        pause = min(SCORE_BACKOFF_MAX, pause * 2)
