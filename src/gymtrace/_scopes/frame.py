"""The active scope: :class:`ActiveScope`, one per activation of a gym level, and finding the current one.

:class:`ActiveScope` is the activation's state and its reading (``_scopes/activation.py``, its base)
with the methods that change that state: here the numbering (turn and step numbers, unique across
processes by ranges; attempt numbers, 0-based and never reused; all under one lock), and in
``_scopes/recording.py`` what user code records on it (bound in the class body, so a call costs
what a method defined here costs). So the rules (one reward per rollout, a failed episode is never
scored, attempts are 0-based and never reused) hold in one place.

The activation lives in the OpenTelemetry context under :data:`FRAME_KEY`, so anything that carries
the OpenTelemetry context (``contextvars.copy_context()``, asyncio tasks) carries the gym scope too.
"""

from __future__ import annotations

import threading
from typing import Any

from opentelemetry import context as otel_context

from gymtrace import _constants as c
from gymtrace._model.errors import GymTraceError, contract_problem, data_lost
from gymtrace._scopes import recording as _recording
from gymtrace._scopes.activation import Activation
from gymtrace._scopes.activation import Failure as Failure
from gymtrace._scopes.outcome_spans import emit_lost_attempt as emit_lost_attempt
from gymtrace._scopes.outcome_spans import emit_outcome as emit_outcome
from gymtrace._scopes.outcome_spans import emit_summary as emit_summary
from gymtrace._scopes.outcome_spans import untraced_worker
from gymtrace._scopes.recording import DISABLED_KIND as DISABLED_KIND
from gymtrace._scopes.recording import outside
from gymtrace._scopes.scope_carrier import CARRIER_FORMAT as CARRIER_FORMAT
from gymtrace._scopes.scope_carrier import read_carrier as read_carrier
from gymtrace._scopes.scope_carrier import span_ref as span_ref
from gymtrace._scopes.state import StepCounter
from gymtrace._scopes.tracing import active_tracer, current_context

FRAME_KEY = otel_context.create_key("gymtrace.frame")
# The span of a caller outside the gym (a trainer) whose request this context serves, when that
# request's trace context came without a gym identity this process believes: a rollout opened for
# it starts a trace of its own and links to that span (issue 44), whatever local span (an HTTP
# server span) or stand-in frame the request got here.
CALLER_KEY = otel_context.create_key("gymtrace.caller")

# The kind of the frame that stands for a gym scope of another process (gymtrace.propagation).
REMOTE_KIND = "remote"

# The steps a continuation in another process numbers after its reserved first one: base * this + k
# (issue 25: 12 Ray tasks of one episode numbered 279 steps with 35 distinct numbers). Readable
# (3000002 is continuation 3's second step); room for 999,999 steps in each part of an episode, and,
# two levels of continuation deep (a task, and a task it calls), still within int64. Past either
# limit the numbers may repeat, and that is reported when it happens.
STEP_RANGE = 1_000_000
MAX_STEP_NUMBER = (1 << 63) - 1  # OTLP's intValue

_counter_lock = threading.Lock()


class ActiveScope(Activation):
    """One activation of a gym scope: its span, its identity and its outcome state.

    ``with gymtrace.episode() as ep:`` binds ``ep`` to one; decorated functions reach theirs with
    :func:`gymtrace.current_scope`.
    """

    __slots__ = ()

    # -- what user code records on it, and the rules of where it lands (_scopes/recording.py) --
    set_reward = _recording.set_reward
    set_failure = _recording.set_failure
    fail_unless_classified = _recording.fail_unless_classified
    set_attribute = _recording.set_attribute
    record_reward = _recording.record_reward
    record_failure = _recording.record_failure
    record_usage = _recording.record_usage
    record_content = _recording.record_content
    carrier = _recording.carrier
    hand_off = _recording.hand_off

    # -- numbering (turns, steps, attempts) -------------------------------------------------

    def take_number(self, kind: str, explicit: int | None) -> int:
        """The next turn or step number of this owner (1, 2, 3...), or ``explicit``."""
        with _counter_lock:
            counter = self.counter
            if counter is None:
                counter = self.counter = StepCounter()
            if kind == c.KIND_TURN:
                number = counter.next_turn if explicit is None else explicit
                counter.next_turn = max(counter.next_turn, number + 1)
                return number
            number = counter.next_step if explicit is None else explicit
            counter.next_step = max(counter.next_step, number + 1)
            if counter.jump and explicit is None:
                counter.next_step, counter.jump = counter.jump, 0
                return number
            if not (number >= counter.limit > 0 and explicit is None):
                return number
            counter.limit = 0  # said once
        # Past this part's range (reported outside the lock: strict mode raises).
        contract_problem(
            ("step range", id(self)),
            GymTraceError(
                f"{self.kind} {self.identity.get(c.EPISODE_ID) or self.identity.get(c.ROLLOUT_ID)!r} numbered"
                f" step {number}: more than {STEP_RANGE - 1} steps in one process's part of an episode"
                " that was continued elsewhere, so its step numbers may repeat another part's;"
                " split the work into more hand-offs (each part gets its own range)"
            ),
        )
        return number

    def reserve_step(self) -> int:
        """A step number for work continued in another process (``propagation``): its first step.
        From the first hand-off, this scope's own numbers are bounded by the continuations' ranges."""
        number = self.take_number(c.KIND_STEP, None)
        with _counter_lock:
            counter = self._counter()
            if counter.limit == 0 and counter.next_step < STEP_RANGE:
                counter.limit = STEP_RANGE
        return number

    def continue_steps_from(self, base: int) -> None:
        """A continuation of the caller's scope in another process, given the step number ``base``
        the caller reserved for it: its first step is ``base``; any further steps number from
        ``base * STEP_RANGE + 1``, a range no other continuation and (below ``STEP_RANGE`` steps)
        not the caller itself uses, so the numbers of one episode stay unique across processes."""
        ranged = (base + 1) * STEP_RANGE <= MAX_STEP_NUMBER
        if not ranged:
            contract_problem(
                ("step range", "nested"),
                GymTraceError(
                    f"a continuation given step number {base} has no range of step numbers left within"
                    " int64 (continuations nested more than two levels deep in one episode): its steps"
                    " number on from it and may repeat other parts' numbers"
                ),
            )
        with _counter_lock:
            counter = self._counter()
            counter.next_step = base
            if ranged:
                counter.jump = base * STEP_RANGE + 1
                counter.limit = (base + 1) * STEP_RANGE

    def next_attempt(self) -> int:
        """For a rollout: the attempt number its next episode gets."""
        state = self.rollout_state
        return state.next_attempt if state is not None else 0

    def rerun(self, attempt: int, message: str) -> None:
        """For a rollout: the work here is re-run number ``attempt`` of work continued from another
        process whose earlier run ended without a result (a worker that died). Its episodes number
        from ``attempt``, and the first records attempt ``attempt - 1`` as failed and links to it."""
        with _counter_lock:
            state = self._rollout()
            state.next_attempt = max(state.next_attempt, attempt)
            state.lost_attempt = (attempt - 1, message)

    def take_lost_attempt(self) -> tuple[int, str] | None:
        """For a rollout: the lost attempt :meth:`rerun` noted, once."""
        with _counter_lock:
            state = self.rollout_state
            if state is None:
                return None
            lost, state.lost_attempt = state.lost_attempt, None
        return lost

    def attempt_recorded(self, attempt: int) -> bool:
        """For a rollout: whether an episode of it already took attempt number ``attempt``."""
        state = self.rollout_state
        if state is None or state.last_episode is None:
            return False
        return state.last_episode.attempt == attempt or any(
            a.number == attempt for a in state.earlier_attempts
        )

    def add_episode(self, episode: ActiveScope, attempt: int, reused: bool = False) -> None:
        """For a rollout: ``episode`` is its newest attempt. An attempt number given again
        (``reused``, see :meth:`attempt_recorded`; reported by the caller) records that attempt
        again: the last recorded counts, and it is one attempt."""
        with _counter_lock:
            state = self._rollout()
            state.next_attempt = max(state.next_attempt, attempt + 1)
            if not reused:
                state.episodes += 1
            if state.last_episode is not None:
                state.earlier_attempts.append(state.last_episode.attempt_fact())
            state.last_episode = episode

    def __repr__(self) -> str:
        return f"<ActiveScope {self.kind} {self.identity}>"

    def __reduce_ex__(self, protocol: object) -> Any:
        # An activation is this process's: its span, its place in the context, its locks. What
        # another process (or a later phase) needs is its carrier; say so instead of a lock error.
        raise TypeError(
            f"cannot pickle an ActiveScope ({self.kind} {self.identity.get(c.ROLLOUT_ID)!r}): it is an open"
            " scope of this process. Pass its carrier instead: scope.carrier() (a small JSON-safe dict;"
            " continue with gymtrace.propagation.attach(carrier), or open the next attempt with"
            " gymtrace.episode(continue_from=carrier)), or headers from"
            " gymtrace.propagation.inject({}, destination=url, continuation=True)"
        )


# A stand-in handed to `with ... as s` while tracing is off, so user code that calls
# s.record_reward() or reads s.identity keeps working at no cost.
DISABLED_FRAME = ActiveScope(DISABLED_KIND, None)


def current_frame() -> ActiveScope | None:
    value = current_context().get(FRAME_KEY)
    return value if isinstance(value, ActiveScope) else None


def frame_for(scope: ActiveScope | None, caller: str, kinds: tuple[str, ...]) -> ActiveScope | None:
    """The frame a module-level ``record_*(…, scope=None)`` call acts on: ``scope`` or the current
    one; ``None`` when there is nothing to record (tracing off and no scope given). Outside every gym
    scope the problem is reported as the caller's."""
    if scope is not None:
        return scope
    if active_tracer() is None:
        frame = current_frame()
        if frame is not None and frame.remote:
            untraced_worker(caller)
        return None
    frame = current_frame()
    if frame is None:
        data_lost(GymTraceError(outside(caller, kinds, None)))
    return frame
