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

Rollouts are counted by the one outcome rule (``_outcome_rule.decide``), the decision the rollout
span or its outcome record carries and ``gymtrace stats`` reads: at the rollout's end when it is
``scored`` or ``unscored``, or, when it ended ``pending`` (handed to another process), where its
outcome is recorded (see ``_frame.emit_outcome``). A frame is counted at most once per process.
"""

from __future__ import annotations

import threading
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace

from gymtrace import _constants as c
from gymtrace import _settings

# Seconds: an LLM episode takes seconds to half an hour (NeMo Gym's own buckets end at 30 minutes).
EPISODE_BUCKETS = (0.1, 0.5, 1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0)
# Seconds: a simulator step takes microseconds, a model call plus tools up to minutes.
STEP_BUCKETS = (0.0001, 0.001, 0.005, 0.025, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0)
# Rewards are usually in [0, 1]; the histogram's sum and count give the exact mean whatever they are.
REWARD_BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


class _Instruments:
    """The instruments, made once from the global meter (a proxy until a provider is set)."""

    def __init__(self) -> None:
        meter = metrics.get_meter(c.METER_NAME)
        self.active = meter.create_up_down_counter(
            c.METRIC_ROLLOUT_ACTIVE, unit=c.UNIT_ROLLOUT, description="Open rollouts of this process"
        )
        self.completed = meter.create_counter(
            c.METRIC_ROLLOUT_COMPLETED,
            unit=c.UNIT_ROLLOUT,
            description="Rollouts by final outcome, counted once when it is known",
        )
        self.reward = meter.create_histogram(
            c.METRIC_ROLLOUT_REWARD,
            unit=c.UNIT_REWARD,
            description="Rewards of scored rollouts",
            explicit_bucket_boundaries_advisory=REWARD_BUCKETS,
        )
        self.episodes = meter.create_counter(
            c.METRIC_EPISODE_COMPLETED,
            unit=c.UNIT_EPISODE,
            description="Episodes by outcome and failure kind",
        )
        self.episode_duration = meter.create_histogram(
            c.METRIC_EPISODE_DURATION,
            unit=c.UNIT_SECONDS,
            description="Episode wall time",
            explicit_bucket_boundaries_advisory=EPISODE_BUCKETS,
        )
        self.step_duration = meter.create_histogram(
            c.METRIC_STEP_DURATION,
            unit=c.UNIT_SECONDS,
            description="Step wall time (GYMTRACE_STEP_METRICS)",
            explicit_bucket_boundaries_advisory=STEP_BUCKETS,
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


def _in(span: trace.Span) -> otel_context.Context:
    # A fresh context holding only the span: the exemplar's trace ID, nothing of the caller's.
    return trace.set_span_in_context(span, otel_context.Context())


def rollout_opened() -> None:
    instruments().active.add(1)


def rollout_closed() -> None:
    instruments().active.add(-1)


def rollout_counted(outcome: str, reward: float | None, span: trace.Span) -> None:
    """One rollout's final outcome (the outcome rule's decision) and, when scored, its reward."""
    made = instruments()
    context = _in(span)
    made.completed.add(1, {c.ROLLOUT_OUTCOME: outcome}, context=context)
    if outcome == c.OUTCOME_SCORED and reward is not None:
        made.reward.record(reward, context=context)


def episode_ended(outcome: str, failure: str | None, seconds: float, span: trace.Span) -> None:
    made = instruments()
    context = _in(span)
    attributes: dict[str, Any] = {c.EPISODE_OUTCOME: outcome}
    if failure is not None:
        attributes[c.FAILURE_KIND] = failure
    made.episodes.add(1, attributes, context=context)
    made.episode_duration.record(seconds, {c.EPISODE_OUTCOME: outcome}, context=context)


def step_ended(seconds: float) -> None:
    """Only with ``GYMTRACE_STEP_METRICS``: the caller checks ``_settings.active.step_metrics``."""
    instruments().step_duration.record(seconds)


def step_metrics_on() -> bool:
    return _settings.active.step_metrics
