"""What ``gymtrace check`` says beside its verdict: facts about a trace that break no rule.

A rollout still awaiting its outcome from another process, one whose process died (lost), one in
which Ray re-ran a task, a service whose spans are missing from the input. None is a contract
violation, so none is among :func:`gymtrace._read.check.check_spans`' problems; each is a line the
user should read before trusting the numbers.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from gymtrace import _constants as c
from gymtrace._model.spandata import SpanData, normalize
from gymtrace._read.check.training import is_training, training_of
from gymtrace._read.outcomes import RolloutOutcome, dedupe, final_outcomes, interrupted
from gymtrace._read.training import Training
from gymtrace._read.training import training_notes as notes_of

# Each note below reads the final outcomes of ``spans``; a caller that has them already (the
# checker, which says several notes about one input) passes them as ``outcomes``.
Outcomes = Sequence[RolloutOutcome] | None


def _rollout_ids(spans: Iterable[Any], outcome: str, outcomes: Outcomes) -> list[str]:
    """The rollouts whose final outcome (the one every reader reports) is ``outcome``."""
    return [o.rollout_id for o in _outcomes(spans, outcomes) if o.outcome == outcome]


def _outcomes(spans: Iterable[Any], outcomes: Outcomes) -> Sequence[RolloutOutcome]:
    return final_outcomes(spans) if outcomes is None else outcomes


def awaiting_outcomes(spans: Iterable[Any], outcomes: Outcomes = None) -> list[str]:
    """The rollouts whose outcome is still expected from another process (``pending``): not a
    violation of the contract, but the answer may be in a trace file not given."""
    return [
        f"rollout {rollout_id}: pending, its outcome was handed to another process; the outcome"
        " record may be in a file not given (pass every process's file, or the directory)"
        for rollout_id in _rollout_ids(spans, c.OUTCOME_PENDING, outcomes)
    ]


def rerun_notes(spans: Iterable[Any], outcomes: Outcomes = None) -> list[str]:
    """The rollouts in which Ray re-ran a task (``max_retries``): their attempt was not one clean
    run, which only the worker's ``ray.task`` span says otherwise."""
    return [
        f"rollout {o.rollout_id}: Ray re-ran {o.task_reruns} task(s) of attempt {max(o.attempts - 1, 0)}"
        " (max_retries or retry_exceptions: a worker died or raised); the attempt was not one clean run"
        for o in _outcomes(spans, outcomes)
        if o.task_reruns
    ]


def lost_notes(spans: Iterable[Any], outcomes: Outcomes = None) -> list[str]:
    """The rollouts whose process died before they ended (``lost``): no outcome, no violation, but
    a pass that did not finish (a resume pass re-runs them)."""
    return [
        f"rollout {rollout_id}: lost, its process stopped beating before it ended (killed?); a resume"
        " pass re-runs it"
        for rollout_id in _rollout_ids(spans, c.OUTCOME_LOST, outcomes)
    ]


def missing_service_notes(spans: Iterable[Any]) -> list[str]:
    """The rollout traces missing a service that took part (:func:`missing_service_note` of each
    trace of ``spans``)."""
    by_trace: dict[str, list[SpanData]] = defaultdict(list)
    for span in spans:
        if isinstance(span, SpanData):
            by_trace[span.trace_id].append(span)
    return [note for trace_spans in by_trace.values() if (note := missing_service_note(trace_spans))]


def missing_service_note(trace_spans: list[SpanData]) -> str | None:
    """Of a rollout trace (``trace_spans``, one trace's) missing a service that took part: a
    server a NeMo Gym agent's step sent a request to (``gym.step.servers``, or a ``step`` marker's
    ``gym.live.server``) with no span of that server in the trace, or a span whose parent, in the
    process that called it, is not there. The usual cause: that process wrote its trace elsewhere
    (a relative ``GYMTRACE_FILE`` resolved in another working directory)."""
    # One pass (the checker says this of each of 10^5 traces): the rollout, the services present,
    # the servers named, and whether any span's parent is not in the trace.
    rollout = None
    present: set[str] = set()
    servers: set[str] = set()
    ids = {s.span_id for s in trace_spans}
    cut = False
    for s in trace_spans:
        attributes = s.attributes
        if rollout is None and isinstance(attributes.get(c.ROLLOUT_ID), str):
            rollout = attributes[c.ROLLOUT_ID]
        if attributes.get(c.KIND) == c.KIND_LIVE:
            server = attributes.get(c.LIVE_SERVER)
            if isinstance(server, str):
                servers.add(server)
        else:
            present.add(s.service)
        if c.STEP_SERVERS in attributes:
            named = attributes[c.STEP_SERVERS]
            if isinstance(named, (list, tuple)):
                servers.update(name for name in named if isinstance(name, str))
        if not cut and s.parent_id is not None and s.parent_id not in ids:
            cut = True
    if rollout is None:
        return None
    missing = sorted(servers - present)
    if missing:
        return (
            f"rollout {rollout}: no span of {', '.join(missing)}, which took part in it: did that"
            " process write its trace elsewhere (a relative GYMTRACE_FILE)?"
        )
    # A span is interrupted only below a parent not in the trace.
    orphans = interrupted(trace_spans) if cut else []
    if orphans:
        services = ", ".join(sorted({s.service for s in orphans if s.service})) or "an unnamed service"
        return (
            f"rollout {rollout}: {len(orphans)} interrupted span(s) ({services}) whose parents never"
            " arrived: their process was killed before those parents ended (a resume pass re-runs"
            " the rollout), or wrote them elsewhere"
        )
    return None


def training_notes(spans: Iterable[Any], training: Training | None = None) -> list[str]:
    """Rollout IDs a train step consumed that no rollout of the input has: a note, not a violation
    (a tail sampler may have kept the step and dropped the rollout). ``training``: the input's, if
    the caller read it already (then ``spans`` are not read again)."""
    if training is not None:
        return notes_of(training)
    data = dedupe(normalize(spans))
    if not is_training(data):
        return []
    return notes_of(training if training is not None else training_of(data))
