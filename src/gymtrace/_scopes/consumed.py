"""What a train step consumed: ``gymtrace.consume()`` and the ``gym.consumed`` records it writes.

A ``consume()`` call appends a tuple to its step's list; every
:data:`~gymtrace._constants.CONSUMED_BATCH` entries, and at the step's end, the list becomes one
``gym.consumed`` span, a child of the step, with a link to each rollout span it names and every
entry's facts in parallel arrays (which is what the readers read: no entry depends on a link the
SDK's limits may drop). One writer thread per process builds the records; the step's end waits
for them. A rollout is named by its join keys, or by a bare rollout ID, resolved among the rollouts
of the run that ended in this process to the most recent one not yet consumed (the readers resolve
the others the same way over the trace).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.trace import Link, SpanContext, TraceFlags

from gymtrace import _constants as c
from gymtrace._model import forks as _forks
from gymtrace._model.errors import GymTraceError, contain, contract_problem, guard
from gymtrace._model.ids import id_problem, read_version, report
from gymtrace._scopes import metrics as _metrics
from gymtrace._scopes import training as _training
from gymtrace._scopes.active_scope import current_active_scope
from gymtrace._scopes.tracing import active_tracer

if TYPE_CHECKING:
    from gymtrace._scopes.active_scope import ActiveScope

_OUTCOMES = frozenset(c.TRAINING_OUTCOMES)
# Rollouts of training runs that ended in this process, for bare-ID consume(): at most this many.
MAX_REMEMBERED = 65_536
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)

# (run ID, rollout ID) -> [trace ID, span ID, policy version, consumed], oldest first
_ended: collections.OrderedDict[tuple[object, object], list[list[Any]]] = collections.OrderedDict()
_remembered = 0
_lock = threading.Lock()


def remember(frame: ActiveScope) -> None:
    """A rollout of a training run ended here: a train step here may consume it by its bare ID."""
    global _remembered
    identity = frame.identity
    context = frame.span.get_span_context()
    entry = [context.trace_id, context.span_id, identity.get(c.POLICY_VERSION), False]
    key = (identity.get(c.RUN_ID), identity.get(c.ROLLOUT_ID))
    with _lock:
        _ended.setdefault(key, []).append(entry)
        _remembered += 1
        while _remembered > MAX_REMEMBERED and _ended:
            _remembered -= len(_ended.popitem(last=False)[1])


def forget() -> None:
    """Forget the rollouts remembered (``gymtrace.testing.reset()``)."""
    global _remembered
    with _lock:
        _ended.clear()
        _remembered = 0


def _resolve(run_id: object, rollout_id: str) -> list[Any] | None:
    """The most recent rollout ``rollout_id`` of run ``run_id`` that ended here and is not yet
    consumed, marked consumed; a warning when several match; None when none does."""
    with _lock:
        entries = _ended.get((run_id, rollout_id))
        if not entries:
            return None
        open_ = [e for e in entries if not e[3]]
        if not open_:
            return None
        chosen = open_[-1]
        chosen[3] = True
    if len(open_) > 1:
        contract_problem(
            ("consume ambiguous", rollout_id),
            GymTraceError(
                f"gymtrace.consume({rollout_id!r}): {len(open_)} rollouts of run {run_id!r} with this ID"
                " are not yet consumed; took the most recent. Rollout IDs repeat in training: pass"
                " the rollout's join keys (gymtrace.current().join_keys(), taken in the rollout)"
            ),
        )
    return chosen


def _mark(run_id: object, rollout_id: object, span_id: str) -> None:
    """A rollout consumed by its join keys: not a candidate for a later bare-ID consume."""
    try:
        number = int(span_id, 16)
    except ValueError:
        return
    with _lock:
        for entry in _ended.get((run_id, rollout_id)) or ():
            if entry[1] == number:
                entry[3] = True


def _outside() -> None:
    contract_problem(
        ("consume", "outside a train step"),
        GymTraceError(
            "gymtrace.consume() outside a train step: nothing was recorded. Call it inside"
            " `with gymtrace.train_step(step=...):` (or a function decorated with it)"
        ),
    )


def consume(rollout: str | Mapping[str, Any], outcome: str = c.TRAINED, reason: str | None = None) -> None:
    """Record that the current train step consumed ``rollout``, with ``outcome``."""
    try:
        frame = current_active_scope()
        while frame is not None and frame.kind != c.KIND_TRAIN_STEP:
            frame = frame.parent
        state = frame.train_state if frame is not None else None
        if state is None or frame is None:
            if active_tracer() is not None or frame is not None:
                _outside()
            return
        if outcome not in _OUTCOMES:
            report(
                "consume",
                "outcome",
                f"must be one of {', '.join(c.TRAINING_OUTCOMES)}, got {outcome!r:.60}; the rollout was"
                " not recorded as consumed",
            )
            return
        if reason is not None and (not isinstance(reason, str) or id_problem(reason) is not None):
            report("consume", "reason", f"must be short printable text, got {reason!r:.60}; left out")
            reason = None
        run_id = frame.identity.get(c.RUN_ID)
        by_id = False
        if isinstance(rollout, str):
            if id_problem(rollout) is not None:
                report("consume", "rollout", f"must be a rollout ID or join keys, got {rollout!r:.60}")
                return
            rollout_id = rollout
            found = _resolve(run_id, rollout)
            if found is None:
                trace_id = span_id = ""
                version: object = None
                by_id = True
            else:
                trace_id = format(found[0], "032x")
                span_id = format(found[1], "016x")
                version = found[2]
        elif type(rollout) is dict or isinstance(rollout, Mapping):  # an ABC check costs ~0.3 us
            named = rollout.get(c.ROLLOUT_ID)
            if not isinstance(named, str) or id_problem(named) is not None:
                report(
                    "consume",
                    "rollout",
                    f"join keys need {c.ROLLOUT_ID!r} (gymtrace.current().join_keys() inside the"
                    f" rollout), got {dict(rollout)!r:.120}",
                )
                return
            rollout_id = named
            trace_id = rollout.get("trace_id") or ""
            span_id = rollout.get("rollout_span_id") or ""
            if not isinstance(trace_id, str) or len(trace_id) != 32:
                trace_id = ""
            if not isinstance(span_id, str) or len(span_id) != 16:
                span_id = ""
            raw = rollout.get(c.POLICY_VERSION)
            version = raw if type(raw) is int else read_version(raw)
            if span_id and _ended:
                _mark(rollout.get(c.RUN_ID, run_id), rollout_id, span_id)
        else:
            report(
                "consume",
                "rollout",
                f"must be a rollout ID or join keys, got {type(rollout).__name__} {rollout!r:.60}",
            )
            return
        step_version = state.version
        stale = (
            step_version - version
            if type(step_version) is int and type(version) is int
            else _training.staleness(step_version, version)
        )
        entry = (
            rollout_id,
            trace_id,
            span_id,
            outcome,
            reason or "",
            "" if version is None else str(version),
            stale,
            by_id,
        )
        with state.lock:
            pending = state.pending
            pending.append(entry)
            state.consumed += 1
            full = len(pending) >= c.CONSUMED_BATCH
        if full:
            write_consumed(frame)
    except Exception as error:  # noqa: BLE001 - gymtrace's own failure: errors.contain decides
        contain("gymtrace.consume", error)


def write_consumed(step: ActiveScope, *, final: bool = False) -> None:
    """Hand the step's pending entries to the writer as batches of CONSUMED_BATCH (at the end of
    the step, ``final``, also a short last one, and wait until the step's records are written)."""
    state = step.train_state
    if state is None:
        return
    batch = c.CONSUMED_BATCH
    with state.lock:
        pending = state.pending
        if len(pending) < batch and not (final and pending):
            taken = []
        else:
            cut = len(pending) if final else len(pending) - len(pending) % batch
            taken, state.pending = pending[:cut], pending[cut:]
    tracer = active_tracer() if taken else None
    if tracer is not None and step.span.is_recording():
        for start in range(0, len(taken), batch):
            _writer.submit((tracer, step, state, taken[start : start + batch]))
    if final:
        # The step's trace is complete when it ends (the writer is usually done by then: it ran
        # while the trainer's thread was in its tensor code, without the GIL).
        _writer.drain(FINAL_WAIT)


# Seconds a step's end waits for the writer to finish the step's records.
FINAL_WAIT = 30.0


class _Writer:
    """One daemon thread per process that turns batches of consumed entries into ``gym.consumed``
    spans. The SDK builds a link and checks every array element per entry (~4 µs a rollout, more
    than consume() may cost on the caller's thread), so the caller only appends and hands over."""

    def __init__(self) -> None:
        self.queue: collections.deque[tuple[Any, ActiveScope, _training.TrainState, list[Any]]] = (
            collections.deque()
        )
        self.condition = threading.Condition()
        self.busy = 0
        self.thread: threading.Thread | None = None

    def submit(self, item: tuple[Any, ActiveScope, _training.TrainState, list[Any]]) -> None:
        with self.condition:
            self.queue.append(item)
            self.condition.notify_all()
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="gymtrace-consumed", daemon=True)
                self.thread.start()

    def _run(self) -> None:
        while True:
            with self.condition:
                while not self.queue:
                    self.condition.wait()
                item = self.queue.popleft()
                self.busy += 1
            try:
                with guard("writing gym.consumed records", may_raise=False):
                    _write(*item)
            finally:
                with self.condition:
                    self.busy -= 1
                    self.condition.notify_all()

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every batch handed over is written; False if ``timeout`` passed first."""
        with self.condition:
            return self.condition.wait_for(lambda: not self.queue and not self.busy, timeout)


_writer = _Writer()


def drain(timeout: float | None = None) -> bool:
    """Write every consumed batch handed over (``force_flush``, ``shutdown``, exit)."""
    return _writer.drain(timeout)


def _after_fork_in_child() -> None:
    # The writer thread is the parent's; a child starts its own when it first needs one.
    global _writer
    _writer = _Writer()


_forks.in_child(_after_fork_in_child)


def _write(tracer: Any, step: ActiveScope, state: _training.TrainState, entries: list[Any]) -> None:
    span = step.span
    links = []
    for entry in entries:
        if entry[1] and entry[2]:
            try:
                target = SpanContext(int(entry[1], 16), int(entry[2], 16), True, _SAMPLED)
            except ValueError:
                continue
            # No link attributes: the SDK copies each link's into a BoundedAttributes of its own
            # (2.5x the cost of the link); the record's kind says what its links are.
            links.append(Link(target))
    attributes: dict[str, Any] = {k: v for k, v in step.identity.items() if k in (c.RUN_ID, c.TRAIN_STEP)}
    if state.version is not None:
        attributes[c.POLICY_VERSION] = state.version
    attributes[c.KIND] = c.KIND_CONSUMED
    attributes[c.CONSUMED_COUNT] = len(entries)
    attributes[c.CONSUMED_ROLLOUT_IDS] = [e[0] for e in entries]
    attributes[c.CONSUMED_SPANS] = [f"{e[1]}-{e[2]}" if e[1] and e[2] else "" for e in entries]
    attributes[c.CONSUMED_OUTCOMES] = [e[3] for e in entries]
    attributes[c.CONSUMED_VERSIONS] = [e[5] for e in entries]
    if any(e[4] for e in entries):
        attributes[c.CONSUMED_REASONS] = [e[4] for e in entries]
    if any(e[7] for e in entries):
        attributes[c.CONSUMED_BY_ID] = ["1" if e[7] else "" for e in entries]
    record = tracer.start_span(
        c.SPAN_CONSUMED, context=trace.set_span_in_context(span), attributes=attributes, links=links
    )
    record.end()
    state.records += 1
    counts: dict[str, int] = {}
    for e in entries:
        counts[e[3]] = counts.get(e[3], 0) + 1
    _metrics.consumed(counts, [e[6] for e in entries if e[6] is not None], span.get_span_context())
