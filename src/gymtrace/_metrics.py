"""Metrics beside the spans: the six ``gym.*`` instruments of DESIGN.md §8, on the global MeterProvider.

Example (what a dashboard reads; ``configure()`` exports them over OTLP next to the spans)::

    gym.rollout.active                      open rollouts of this process
    gym.rollout.completed{outcome=scored}   rollouts counted once, when their final outcome is known
    gym.rollout.reward                      rewards of scored rollouts (an unscored one is never a 0)

Instrumentation depends on the OpenTelemetry metrics API only: the instruments come from
``metrics.get_meter("gymtrace")``, which is a no-op until the application (or ``configure()``)
sets a MeterProvider, and follows the provider once it is set. Every measurement is taken in the
context of the span it describes, so an SDK exemplar carries that span's trace ID. Attributes stay
low-cardinality: outcomes and failure kinds, never rollout or task IDs.

The counters are added up in this process and handed to the SDK at most a second later (see
:class:`_Pending`): read them after ``gymtrace.force_flush()``. The histograms are recorded at once.

Rollouts are counted by the one outcome rule (``_outcome_rule.decide``), the decision the rollout
span or its outcome record carries and ``gymtrace stats`` reads: at the rollout's end when it is
``scored`` or ``unscored``, or, when it ended ``pending`` (handed to another process), where its
outcome is recorded (see ``_frame.emit_outcome``). A frame is counted at most once per process.
"""

from __future__ import annotations

import bisect
import collections
import inspect
import os
import threading
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace

from gymtrace import _constants as c

# Seconds: an LLM episode takes seconds to half an hour (NeMo Gym's own buckets end at 30 minutes).
EPISODE_BUCKETS = (0.1, 0.5, 1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0)
# Seconds: a simulator step takes microseconds, a model call plus tools up to minutes.
STEP_BUCKETS = (0.0001, 0.001, 0.005, 0.025, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0)
# Rewards are usually in [0, 1]; the histogram's sum and count give the exact mean whatever they are.
REWARD_BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


# Checked by capability, once: opentelemetry-api before 1.28 has neither a measurement's
# ``context`` (the exemplar's span) nor histogram bucket advice; without them the instruments
# still count (and an SDK that has exemplars needs a newer API anyway).
_TAKES_CONTEXT = "context" in inspect.signature(metrics.Counter.add).parameters
_TAKES_BUCKETS = (
    "explicit_bucket_boundaries_advisory" in inspect.signature(metrics.Meter.create_histogram).parameters
)


def _buckets(bounds: tuple[float, ...]) -> dict[str, Any]:
    return {"explicit_bucket_boundaries_advisory": bounds} if _TAKES_BUCKETS else {}


def _with(context: otel_context.Context) -> dict[str, Any]:
    return {"context": context} if _TAKES_CONTEXT else {}


class _Instruments:
    """The instruments, made once from the global meter (a proxy until a provider is set)."""

    def __init__(self) -> None:
        meter = metrics.get_meter(c.METER_NAME)

        def histogram(name: str, unit: str, description: str, bounds: tuple[float, ...]) -> metrics.Histogram:
            return meter.create_histogram(name, unit=unit, description=description, **_buckets(bounds))

        self.active = meter.create_up_down_counter(
            c.METRIC_ROLLOUT_ACTIVE, unit=c.UNIT_ROLLOUT, description="Open rollouts of this process"
        )
        self.completed = meter.create_counter(
            c.METRIC_ROLLOUT_COMPLETED,
            unit=c.UNIT_ROLLOUT,
            description="Rollouts by final outcome, counted once when it is known",
        )
        self.episodes = meter.create_counter(
            c.METRIC_EPISODE_COMPLETED,
            unit=c.UNIT_EPISODE,
            description="Episodes by outcome and failure kind",
        )
        self.reward = histogram(
            c.METRIC_ROLLOUT_REWARD, c.UNIT_REWARD, "Rewards of scored rollouts", REWARD_BUCKETS
        )
        self.episode_duration = histogram(
            c.METRIC_EPISODE_DURATION, c.UNIT_SECONDS, "Episode wall time", EPISODE_BUCKETS
        )
        self.step_duration = histogram(
            c.METRIC_STEP_DURATION, c.UNIT_SECONDS, "Step wall time (GYMTRACE_STEP_METRICS)", STEP_BUCKETS
        )


_instruments: _Instruments | None = None
_lock = threading.Lock()


def instruments() -> _Instruments:
    global _instruments
    made = _instruments
    if made is None:
        with _lock:
            made = _instruments
            if made is None:
                made = _instruments = _Instruments()
    return made


def reset() -> None:
    """Make the instruments again from the global meter (tests that swap the MeterProvider)."""
    global _instruments
    with _lock:
        _instruments = None


# A context with no span: the SDK's trace-based exemplar filter offers no exemplar for it.
_NO_EXEMPLAR = otel_context.Context()

# Attribute sets made once (the SDK hashes what it is given; building them is ours to save).
_ROLLOUT_OUTCOME = {outcome: {c.ROLLOUT_OUTCOME: outcome} for outcome in c.ROLLOUT_OUTCOMES}
_EPISODE_OUTCOME = {
    outcome: {c.EPISODE_OUTCOME: outcome}
    for outcome in (c.OUTCOME_COMPLETED, c.OUTCOME_FAILED, c.OUTCOME_CANCELLED)
}


class _Pending:
    """What the instruments have not been given yet.

    An SDK instrument call costs 3-7 µs alone, and about 10 µs between a rollout's other work
    (each evicts the other from the processor's caches, as ``benchmarks/perf.py`` shows for spans
    and env steps): one call per instrument per rollout was 35 µs a rollout against a 20 µs budget.
    So a rollout or an episode appends one tuple here (``deque.append`` is atomic: no lock), and
    the heartbeat thread (``_live``) hands them over at most a second later, at
    ``gymtrace.force_flush()`` and at exit: the counters one call per attribute set, the
    histograms one call per value in a tight loop. Exemplars still carry the trace ID: a counter's
    is its last rollout's, and each histogram bucket is offered the first value that falls in it
    per flush (the SDK keeps one per bucket); only span contexts are kept, never spans.
    """

    def __init__(self) -> None:
        # (rollout outcome, reward or None, span context)
        self.completed: collections.deque[tuple[str, float | None, trace.SpanContext]] = collections.deque()
        # (episode outcome, failure kind or None, seconds, span context)
        self.episodes: collections.deque[tuple[str, str | None, float, trace.SpanContext]] = (
            collections.deque()
        )
        self.active = 0  # gym.rollout.active as last added
        self.reported = False  # whether it was added at all (a 0 makes the series exist)
        self.lock = threading.Lock()  # one flush at a time (the thread, force_flush, exit)


_pending = _Pending()


def _context(span_context: trace.SpanContext) -> otel_context.Context:
    return trace.set_span_in_context(trace.NonRecordingSpan(span_context), otel_context.Context())


def rollout_counted(outcome: str, reward: float | None, span: trace.Span) -> None:
    """One rollout's final outcome (the outcome rule's decision) and, when scored, its reward."""
    scored = reward if outcome == c.OUTCOME_SCORED else None
    _pending.completed.append((outcome, scored, span.get_span_context()))


def episode_ended(outcome: str, failure: str | None, seconds: float, span: trace.Span) -> None:
    _pending.episodes.append((outcome, failure, seconds, span.get_span_context()))


def flush(active: int) -> None:
    """Hand what was gathered since the last flush to the instruments, and ``gym.rollout.active``
    its change to ``active`` (the rollouts open now, which ``_live`` counts): see :class:`_Pending`."""
    pending = _pending
    with pending.lock:
        _flush(pending, active)


def _flush(pending: _Pending, active: int) -> None:
    made: _Instruments | None = None
    completed: dict[str, tuple[int, trace.SpanContext]] = {}
    offered: set[tuple[object, int]] = set()
    while pending.completed:
        outcome, reward, span_context = pending.completed.popleft()
        completed[outcome] = (completed.get(outcome, (0, span_context))[0] + 1, span_context)
        if reward is not None:
            made = made or instruments()
            made.reward.record(
                reward, **_with(_exemplar(offered, None, REWARD_BUCKETS, reward, span_context))
            )
    episodes: dict[tuple[str, str | None], tuple[int, trace.SpanContext]] = {}
    while pending.episodes:
        outcome, failure, seconds, span_context = pending.episodes.popleft()
        key = (outcome, failure)
        episodes[key] = (episodes.get(key, (0, span_context))[0] + 1, span_context)
        made = made or instruments()
        made.episode_duration.record(
            seconds,
            _EPISODE_OUTCOME.get(outcome) or {c.EPISODE_OUTCOME: outcome},
            **_with(_exemplar(offered, outcome, EPISODE_BUCKETS, seconds, span_context)),
        )
    change, pending.active = active - pending.active, active
    first = not pending.reported and bool(change or completed or episodes)
    if not (change or first or completed or episodes):
        return
    made = made or instruments()
    if change or first:
        pending.reported = True
        made.active.add(change)
    for outcome, (count, span_context) in completed.items():
        attributes = _ROLLOUT_OUTCOME.get(outcome) or {c.ROLLOUT_OUTCOME: outcome}
        made.completed.add(count, attributes, **_with(_context(span_context)))
    for (outcome, failure), (count, span_context) in episodes.items():
        attributes = {c.EPISODE_OUTCOME: outcome}
        if failure is not None:
            attributes[c.FAILURE_KIND] = failure
        made.episodes.add(count, attributes, **_with(_context(span_context)))


def _exemplar(
    offered: set[tuple[object, int]],
    series: object,
    bounds: tuple[float, ...],
    value: float,
    span_context: trace.SpanContext,
) -> otel_context.Context:
    """The span's context for the first value of a flush in its bucket (the exemplar), else none."""
    key = (series, bisect.bisect_left(bounds, value))
    if key in offered:
        return _NO_EXEMPLAR
    offered.add(key)
    return _context(span_context)


def _after_fork_in_child() -> None:
    # The parent's counts are the parent's to add.
    global _pending
    _pending = _Pending()


os.register_at_fork(after_in_child=_after_fork_in_child)


def step_ended(seconds: float) -> None:
    """Only with ``GYMTRACE_STEP_METRICS`` (``_levels.measure_steps`` installs it)."""
    instruments().step_duration.record(seconds)
