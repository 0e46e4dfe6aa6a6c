"""Metrics beside the spans: the fixed ``gym.*`` instruments, on the global MeterProvider.

Example (what a dashboard reads; ``configure()`` exports them over OTLP next to the spans)::

    gym.rollout.active                      open rollouts of this process (observed at collection)
    gym.rollout.completed{outcome=scored}   each rollout once, with the outcome `gymtrace rollouts` gives
    gym.rollout.reward                      rewards of scored rollouts (an unscored one is never a 0)

The instruments come from ``metrics.get_meter("gymtrace")`` (a no-op until a MeterProvider is set);
each measurement is taken in its span's context (exemplars carry the trace ID); attributes stay
low-cardinality. The process that ran a rollout span counts it once, at the first collection after
it ended, with the decision the readers give (the outcome rule's ``decide_candidates``) for what this process recorded; a
rollout's end only appends a tuple here, handed to the instruments from the observable callback.
See docs/live-and-metrics.md.
"""

from __future__ import annotations

import bisect
import collections
import inspect
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace

from gymtrace import _constants as c
from gymtrace._model import forks as _forks
from gymtrace._model.errors import guard
from gymtrace._model.outcome_rule import CANCELLED, FAILED, Attempt, Decision, decide_candidates

# Seconds: an LLM episode takes seconds to half an hour (NeMo Gym's own buckets end at 30 minutes).
EPISODE_BUCKETS = (0.1, 0.5, 1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0)
# Seconds: a simulator step takes microseconds, a model call plus tools up to minutes.
STEP_BUCKETS = (0.0001, 0.001, 0.005, 0.025, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0)
# Rewards are usually in [0, 1]; the histogram's sum and count give the exact mean whatever they are.
REWARD_BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
# Policy versions between a rollout's start and the step that consumed it: 0 on-policy, a few under
# an off-policy limit; a negative one is a bug `gymtrace check` reports.
STALENESS_BUCKETS = (-1.0, 0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 16.0, 32.0)


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
        self.staleness = histogram(
            c.METRIC_ROLLOUT_STALENESS,
            c.UNIT_VERSION,
            "Policy versions between a rollout's start and the train step that consumed it",
            STALENESS_BUCKETS,
        )
        self.consumed = meter.create_counter(
            c.METRIC_ROLLOUT_CONSUMED,
            unit=c.UNIT_ROLLOUT,
            description="Rollouts consumed by train steps, by training outcome",
        )
        # Observed, not added to: read from the open rollouts at each collection. Its callback also
        # hands what was gathered to the instruments above (see the module docstring). Made last:
        # from here on a collection may call it.
        self.active = meter.create_observable_up_down_counter(
            c.METRIC_ROLLOUT_ACTIVE,
            callbacks=[self._observe_active],
            unit=c.UNIT_ROLLOUT,
            description="Open rollouts of this process",
        )

    def _observe_active(self, options: Any) -> list[metrics.Observation]:
        """``gym.rollout.active``'s callback: the SDK runs it at the start of each collection, before
        it reads the synchronous instruments, so what it hands over is in the same collection."""
        with guard("the gym.* metrics at a collection", may_raise=False):
            flush(self)
        return [metrics.Observation(open_rollouts())]


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


# A candidate as the readers take it: (attributes of a rollout root or outcome record, its end time
# in ns, its span ID as an int); an episode as (attempt, gym.episode.outcome).
Candidate = tuple[Mapping[str, Any], int, int]
EpisodeFact = tuple[object, object]


def _no_open_rollouts() -> int:
    return 0


# How many rollouts are open in this process: handed down by ``_scopes.live``, which reads the engine's
# table of open activations.
open_rollouts: Callable[[], int] = _no_open_rollouts


def _no_rollout_open(trace_id: int, rollout_id: object) -> bool:
    return False


# Whether the rollout of this trace and ID is open in this process (handed down like open_rollouts):
# only then does a record written before its end wait for it here.
rollout_open: Callable[[int, object], bool] = _no_rollout_open

# Rollouts that ended here and wait for the next collection, and outcome records waiting for their
# rollout to end here, at most this many each: past it the oldest is counted (or dropped) by the
# heartbeat thread, so a process whose metrics nobody reads (no MeterProvider) keeps a bounded table.
MAX_WAITING = 10_000


class _Ended:
    """A rollout of this process that ended and is not counted yet."""

    __slots__ = ("candidates", "episodes", "span_context")

    def __init__(
        self, candidates: list[Candidate], episodes: list[EpisodeFact], span_context: trace.SpanContext
    ) -> None:
        self.candidates = candidates
        self.episodes = episodes
        self.span_context = span_context


class _Pending:
    """What the instruments have not been given yet.

    Rollouts wait in ``ended`` (keyed like the readers group them: trace and rollout ID) until a
    collection counts them, so that a record written here meanwhile decides with them; records of a
    rollout still open here (or of one another process owns, which is never counted here) wait in
    ``records``. Episodes append one tuple to ``episodes`` (``deque.append`` is atomic). The
    counters are handed over one call per attribute set, the histograms one call per value in a
    tight loop. Exemplars still carry the trace ID: a counter's is its last rollout's, and each
    histogram bucket is offered the first value that falls in it per hand-over (the SDK keeps one per
    bucket); only span contexts are kept, never spans.
    """

    def __init__(self) -> None:
        self.ended: collections.OrderedDict[tuple[int, object], _Ended] = collections.OrderedDict()
        self.records: collections.OrderedDict[tuple[int, object], _Ended] = collections.OrderedDict()
        # (episode outcome, failure kind or None, seconds, span context)
        self.episodes: collections.deque[tuple[str, str | None, float, trace.SpanContext]] = (
            collections.deque()
        )
        # Consumed rollouts, per consumed record written: ({training outcome: count}, staleness
        # values, the train step's span context).
        self.consumed: collections.deque[tuple[dict[str, int], list[int], trace.SpanContext]] = (
            collections.deque()
        )
        self.table = threading.Lock()  # ended and records
        self.lock = threading.Lock()  # one hand-over at a time (a collection, force_flush, the thread)


_pending = _Pending()


def _context(span_context: trace.SpanContext) -> otel_context.Context:
    return trace.set_span_in_context(trace.NonRecordingSpan(span_context), otel_context.Context())


def rollout_ended(
    trace_id: int,
    rollout_id: object,
    decision: Decision,
    attempts: tuple[Attempt, ...],
    span: trace.Span,
) -> None:
    """A rollout of this process ended with ``decision`` (what its span says) after the episodes
    ``attempts`` (their facts): counted at the next collection, with the records written here."""
    if _instruments is None:
        instruments()  # the observable instrument must exist for the next collection to count it
    root: dict[str, Any] = {
        c.KIND: c.KIND_ROLLOUT,
        c.ROLLOUT_OUTCOME: decision.outcome,
        c.ROLLOUT_ATTEMPTS: decision.attempts,
    }
    if decision.reward is not None:
        root[c.REWARD] = decision.reward
    span_context = span.get_span_context()
    if len(attempts) > 1:
        # Of an attempt number two episodes took (reused), the last recorded speaks for it.
        attempts = tuple({a.number: a for a in attempts}.values())
    episodes: list[EpisodeFact] = [(a.number, a.state) for a in attempts if a.state in (FAILED, CANCELLED)]
    key = (trace_id, rollout_id)
    pending = _pending
    with pending.table:
        early = pending.records.pop(key, None) if pending.records else None
        candidates: list[Candidate] = [(root, time.time_ns(), span_context.span_id)]
        if early is not None:
            candidates += early.candidates
            episodes += early.episodes
        pending.ended[key] = _Ended(candidates, episodes, span_context)


def outcome_recorded(
    trace_id: int,
    rollout_id: object,
    attributes: Mapping[str, Any],
    record: trace.Span,
    episode: EpisodeFact | None = None,
) -> None:
    """An outcome record was written here (``_scopes.active_scope.emit_outcome``): a fact for its rollout's count
    when this process owns the rollout and has not counted it yet, else for nobody (the owner, in
    another process, counts it)."""
    end_ns = getattr(record, "end_time", None)
    span_context = record.get_span_context()
    candidate: Candidate = (
        attributes,
        end_ns if isinstance(end_ns, int) else time.time_ns(),
        span_context.span_id,
    )
    key = (trace_id, rollout_id)
    pending = _pending
    with pending.table:
        target = pending.ended.get(key)
        if target is None:
            target = pending.records.get(key)
            if target is None:
                if not rollout_open(trace_id, rollout_id):
                    # Another process's rollout (a NeMo Gym server's /verify, a remote scorer), or one
                    # counted here already: nothing here will count this fact. Kept, it would stay
                    # until MAX_WAITING pushed it out: a server's heap grown by ten thousand
                    # rollouts, which every full collection of the garbage collector walks.
                    return
                target = pending.records[key] = _Ended([], [], span_context)
                if len(pending.records) > MAX_WAITING:
                    pending.records.popitem(last=False)  # the oldest of an owner that never ends them
        target.candidates.append(candidate)
        if episode is not None:
            target.episodes.append(episode)


def episode_ended(outcome: str, failure: str | None, seconds: float, span: trace.Span) -> None:
    _pending.episodes.append((outcome, failure, seconds, span.get_span_context()))


def consumed(counts: dict[str, int], staleness: list[int], span_context: trace.SpanContext) -> None:
    """A consumed record was written: counted at the next hand-over (one append here; an SDK
    instrument call per consumed rollout would cost more than ``consume()`` may)."""
    _pending.consumed.append((counts, staleness, span_context))


def flush(made: _Instruments | None = None) -> None:
    """Hand everything gathered to the instruments now (a collection, ``force_flush``, exit)."""
    # Made outside the lock: making them registers with the SDK, under its own lock.
    made = made or instruments()
    pending = _pending
    with pending.lock:
        _flush(pending, None, made)


def settle() -> None:
    """The heartbeat thread, each second: episodes now; rollouts only past :data:`MAX_WAITING`
    (they wait for a collection, so that records written here until then decide with them)."""
    made = instruments()
    pending = _pending
    with pending.lock:
        _flush(pending, MAX_WAITING, made)


def _decided(rollout: _Ended) -> tuple[str, float | None]:
    """The outcome and reward the readers give for what this process recorded about the rollout."""
    candidates = rollout.candidates
    if len(candidates) == 1 and not rollout.episodes:
        # Nothing written here but the rollout span: the span's own decision, which is what the
        # rule gives for one candidate (2 µs a rollout saved).
        root = candidates[0][0]
        return str(root[c.ROLLOUT_OUTCOME]), root.get(c.REWARD)
    decision = decide_candidates(candidates, rollout.episodes)
    if decision is None:
        return c.OUTCOME_UNSCORED, None  # not reached: a rollout has its span's candidate
    return decision.outcome, decision.reward


def _take_ended(pending: _Pending, keep: int | None) -> list[_Ended]:
    with pending.table:
        if keep is None:
            taken = list(pending.ended.values())
            pending.ended.clear()
            return taken
        taken = []
        while len(pending.ended) > keep:
            taken.append(pending.ended.popitem(last=False)[1])
        return taken


def _flush(pending: _Pending, keep: int | None, made: _Instruments) -> None:
    completed: dict[str, tuple[int, trace.SpanContext]] = {}
    offered: set[tuple[object, int]] = set()
    for rollout in _take_ended(pending, keep):
        outcome, reward = _decided(rollout)
        span_context = rollout.span_context
        completed[outcome] = (completed.get(outcome, (0, span_context))[0] + 1, span_context)
        if reward is not None and outcome == c.OUTCOME_SCORED:
            made.reward.record(
                reward, **_with(_exemplar(offered, None, REWARD_BUCKETS, reward, span_context))
            )
    episodes: dict[tuple[str, str | None], tuple[int, trace.SpanContext]] = {}
    while pending.episodes:
        outcome, failure, seconds, span_context = pending.episodes.popleft()
        key = (outcome, failure)
        episodes[key] = (episodes.get(key, (0, span_context))[0] + 1, span_context)
        made.episode_duration.record(
            seconds,
            _EPISODE_OUTCOME.get(outcome) or {c.EPISODE_OUTCOME: outcome},
            **_with(_exemplar(offered, outcome, EPISODE_BUCKETS, seconds, span_context)),
        )
    consumed: dict[str, tuple[int, trace.SpanContext]] = {}
    while pending.consumed:
        counts, staleness, span_context = pending.consumed.popleft()
        for outcome, count in counts.items():
            consumed[outcome] = (consumed.get(outcome, (0, span_context))[0] + count, span_context)
        for value in staleness:
            made.staleness.record(
                value, **_with(_exemplar(offered, c.STALENESS, STALENESS_BUCKETS, value, span_context))
            )
    for outcome, (count, span_context) in consumed.items():
        made.consumed.add(count, {c.TRAINING_OUTCOME: outcome}, **_with(_context(span_context)))
    if not (completed or episodes):
        return
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
    # The parent's rollouts are the parent's to count.
    global _pending
    _pending = _Pending()


_forks.in_child(_after_fork_in_child)


def step_ended(seconds: float) -> None:
    """Only with ``GYMTRACE_STEP_METRICS`` (``_scopes.levels.measure_steps`` installs it)."""
    instruments().step_duration.record(seconds)
