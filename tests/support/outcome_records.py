"""Write a ``gym.outcome`` record span with the public OpenTelemetry API, as gymtrace's writer does.

Tests of the readers use this to produce real outcome records in real traces (in-process under
``capture_spans()`` or in a child process with a file exporter), independent of the engine.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace

from gymtrace import _constants as c


def record_outcome(
    tracer: trace.Tracer,
    *,
    parent: trace.SpanContext,
    episode: trace.SpanContext | None,
    rollout_id: str,
    attempt: int,
    attempts: int,
    reward: float | None,
    source: str,
    run_id: str | None = None,
    task_id: str | None = None,
    repeat: int | None = None,
    extra: dict[str, Any] | None = None,
) -> None:
    """One outcome record under ``parent`` (the rollout span, or a propagated span of its trace)."""
    attributes: dict[str, Any] = {
        c.KIND: c.KIND_OUTCOME,
        c.ROLLOUT_ID: rollout_id,
        c.EPISODE_ATTEMPT: attempt,
        c.EPISODE_ID: rollout_id if attempt == 0 else f"{rollout_id}-a{attempt}",
        c.ROLLOUT_ATTEMPTS: attempts,
        c.ROLLOUT_OUTCOME: c.OUTCOME_SCORED if reward is not None else c.OUTCOME_UNSCORED,
        c.OUTCOME_SOURCE: source,
    }
    if reward is not None:
        attributes[c.REWARD] = reward
    for key, value in ((c.RUN_ID, run_id), (c.TASK_ID, task_id), (c.ROLLOUT_REPEAT, repeat)):
        if value is not None:
            attributes[key] = value
    attributes.update(extra or {})
    links = [trace.Link(episode, {c.LINK_RELATION: c.RELATION_OUTCOME})] if episode is not None else []
    ctx = trace.set_span_in_context(trace.NonRecordingSpan(parent), otel_context.Context())
    tracer.start_span(c.SPAN_OUTCOME, context=ctx, attributes=attributes, links=links).end()
