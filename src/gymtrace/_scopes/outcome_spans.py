"""Outcome records: ``gym.outcome`` spans for outcomes decided where the rollout span cannot say them.

An episode continued in another process, a reward recorded after a span ended, a rollout attempt
lost with a worker that died: each is written as a ``gym.outcome`` span in the rollout's trace, and
the readers take, per rollout, the candidate with the highest concluded attempt. A rollout that
head sampling dropped has no span to say anything: its summary (:func:`emit_summary`) is one
rollout span written at its end. Apart from the activation because it is the one place that starts
spans outside the scope engine's own start and end, and the one the metrics hear outcome facts from.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanContext
from opentelemetry.trace.status import Status, StatusCode

from gymtrace import _constants as c
from gymtrace._model.environment import GYMTRACE_PARENT
from gymtrace._model.errors import GymTraceError, contract_problem
from gymtrace._model.ids import ROLLOUT_IDENTITY, episode_id
from gymtrace._scopes import metrics as _metrics
from gymtrace._scopes.tracing import active_tracer, pin_for_one_span, unpin_after_one_span

if TYPE_CHECKING:
    from gymtrace._scopes.activation import Activation


def untraced_worker(what: str) -> None:
    """Something was recorded under another process's gym context in a process that exports
    nothing: said once per process, with the fix."""
    contract_problem(
        ("untraced worker", os.getpid()),
        GymTraceError(
            f"{what} was recorded under a gym context continued from another process, in process"
            f" {os.getpid()} where tracing is not configured and no parent settings were inherited"
            f" ({GYMTRACE_PARENT}); it is lost. Fix: call gymtrace.configure() in this process"
            " (e.g. multiprocessing.Pool(initializer=gymtrace.configure)), or start it from a process"
            " that called gymtrace.configure() and keep its environment"
        ),
    )


def _record_identity(frame: Activation, attempt: int) -> dict[str, Any]:
    """A ``gym.outcome`` record's identity and kind, for attempt ``attempt`` of ``frame``'s rollout."""
    # The group too: a record is a span below the rollout, and every such span carries it (issue 44);
    # a reader whose input lacks the rollout span (sampled out, lost) still finds the group here.
    attributes: dict[str, Any] = {
        k: v for k, v in frame.identity.items() if k in ROLLOUT_IDENTITY or k == c.GROUP_ID
    }
    rollout_id = attributes.get(c.ROLLOUT_ID)
    attributes[c.EPISODE_ATTEMPT] = attempt
    if isinstance(rollout_id, str):
        attributes[c.EPISODE_ID] = episode_id(rollout_id, attempt)
    attributes[c.KIND] = c.KIND_OUTCOME
    return attributes


def emit_outcome(frame: Activation, source: str) -> None:
    """Record ``frame``'s outcome (an episode's, or a rollout's) as a ``gym.outcome`` span in the
    rollout's trace: the outcome was decided where the rollout span cannot carry it (see docs/results.md,
    "Late and remote outcomes"). Readers take, per rollout, the candidate with the highest
    concluded attempt, a record beating the rollout root on a tie."""
    tracer = active_tracer()
    if tracer is None:
        untraced_worker("an outcome")
        return
    episode = frame if frame.kind == c.KIND_EPISODE else None
    if episode is not None:
        rollout = episode.parent.nearest(c.KIND_ROLLOUT) if episode.parent is not None else None
    else:
        rollout = frame
    decision = frame.decision()
    attempt = decision.attempt
    attributes = _record_identity(frame, attempt)
    # A record concludes what was recorded: it is never pending itself.
    attributes[c.ROLLOUT_OUTCOME] = c.OUTCOME_SCORED if decision.scored else c.OUTCOME_UNSCORED
    if decision.reward is not None:
        attributes[c.REWARD] = decision.reward
    attributes[c.ROLLOUT_ATTEMPTS] = attempt + 1
    attributes[c.OUTCOME_SOURCE] = source
    if episode is not None and episode.failure is not None:
        attributes[c.FAILURE_KIND] = episode.failure[0]
        attributes[c.FAILURE_RETRYABLE] = episode.failure[1]
    # In the rollout's trace: under the rollout span where it is known, else under the span the
    # context was continued from.
    if rollout is not None:
        parent = rollout.span.get_span_context()
    elif episode is not None and episode.parent_span_context is not None:
        parent = episode.parent_span_context
    else:
        parent = frame.span.get_span_context()
    links = None
    if episode is not None and not episode.remote and episode.span.get_span_context().is_valid:
        links = [trace.Link(episode.span.get_span_context(), {c.LINK_RELATION: c.RELATION_OUTCOME})]
    context = trace.set_span_in_context(trace.NonRecordingSpan(parent), otel_context.Context())
    record = tracer.start_span(c.SPAN_OUTCOME, context=context, attributes=attributes, links=links)
    record.end()
    # A fact for the rollout's count in the process that owns it, if that is this one (_metrics);
    # with the episode's own outcome when its span, ending now, says it (the readers read that too).
    ending = episode is not None and not episode.remote and not episode.ended
    fact = episode.attempt_fact() if ending and episode is not None else None
    _metrics.outcome_recorded(
        record.get_span_context().trace_id,
        attributes.get(c.ROLLOUT_ID),
        attributes,
        record,
        (fact.number, fact.state) if fact is not None else None,
    )


def emit_lost_attempt(rollout: Activation, attempt: int, message: str) -> SpanContext | None:
    """Record attempt ``attempt`` of ``rollout`` as failed (``infrastructure``, retryable) with a
    ``gym.outcome`` span: its run ended without a result and without spans (a worker that died), and
    a re-run goes on. Its context, for the next attempt's ``retry`` link; None when nothing exports."""
    tracer = active_tracer()
    if tracer is None:
        untraced_worker("a lost attempt")
        return None
    attributes = _record_identity(rollout, attempt)
    attributes[c.ROLLOUT_OUTCOME] = c.OUTCOME_UNSCORED
    attributes[c.ROLLOUT_ATTEMPTS] = attempt + 1
    attributes[c.OUTCOME_SOURCE] = c.SOURCE_REMOTE
    attributes[c.FAILURE_KIND] = c.FAILURE_INFRASTRUCTURE
    attributes[c.FAILURE_RETRYABLE] = True
    parent = rollout.span.get_span_context()
    context = trace.set_span_in_context(trace.NonRecordingSpan(parent), otel_context.Context())
    record = tracer.start_span(c.SPAN_OUTCOME, context=context, attributes=attributes)
    record.set_status(Status(StatusCode.ERROR, message))
    record.end()
    # A fact, not a count: the rollout's final outcome is still to come (_metrics).
    _metrics.outcome_recorded(
        record.get_span_context().trace_id, attributes.get(c.ROLLOUT_ID), attributes, record
    )
    found = record.get_span_context()
    return found if found.is_valid else None


def emit_summary(
    dropped: SpanContext,
    attributes: dict[str, Any],
    started_ns: int,
    links: Sequence[trace.Link] | None = None,
    parent: otel_context.Context | None = None,
) -> None:
    """Write the one span a rollout that head sampling dropped leaves: a ``gym.rollout`` span with
    ``attributes`` (its identity, outcome, reward, attempts, token totals, training keys) and
    ``gym.rollout.detail=false``, from ``started_ns`` to now, started like the dropped one (its
    ``links``, under ``parent``), so that counts, rewards, pass@k and the training figures stay
    exact while its episodes, steps and calls stay dropped. The sampler keeps it by that mark.

    It takes the dropped span's own trace and span IDs (when the ID generator is gymtrace's): the
    Collector and Jaeger group it where the rollout's detail would have been, including a
    deterministic trace ID an integration chose for the rollout; an outcome record written under
    the dropped span (a hand-off) and a train step's link to it (``consume``) name that span, and
    find it; and its children, never exported, name it as their parent in no file. Under another
    ID generator it gets IDs of its own and the readers still join the records by rollout ID.
    """
    tracer = active_tracer()
    if tracer is None:
        return
    attributes[c.ROLLOUT_DETAIL] = False
    token = pin_for_one_span(dropped.trace_id, dropped.span_id)
    try:
        summary = tracer.start_span(
            c.SPAN_ROLLOUT,
            context=parent if parent is not None else otel_context.Context(),
            attributes=attributes,
            links=links,
            start_time=started_ns,
        )
    finally:
        unpin_after_one_span(token)
    summary.end()
