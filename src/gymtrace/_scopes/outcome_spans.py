"""The spans a rollout leaves beside its own: the summary of a rollout head sampling dropped.

A rollout that head sampling dropped has no span to say anything: its summary (:func:`emit_summary`)
is one rollout span written at its end, with the dropped span's IDs. Also the one report of
something recorded in a process that exports nothing (:func:`untraced_worker`). The ``gym.outcome``
records of an entry whose span cannot say its outcome are written by
:mod:`gymtrace._scopes.active_scope`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanContext

from gymtrace import _constants as c
from gymtrace._model.environment import GYMTRACE_PARENT
from gymtrace._model.errors import GymTraceError, contract_problem
from gymtrace._scopes.tracing import active_tracer, pin_for_one_span, unpin_after_one_span


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
