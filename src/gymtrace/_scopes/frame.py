"""The active-scope state: one :class:`ActiveScope` per activation of a gym level.

An activation (a ``with`` block, or one call of a decorated function) owns its span, the gym
identity every span below it inherits, and its outcome state (reward, failure, cancellation). What
only some levels own sits in small holders made where that level needs them (``_scopes/state.py``):
a rollout's attempts, an episode's restore and remote-rollout link, a numbering owner's counters.
The rules that change them are the class's methods: here the activation,
its reading, its outcome by the one rule and its numbering (turns, steps and attempts, under one
lock); in ``_scopes/recording.py`` what user code records on it, bound in the class body. So the
rules (one reward per rollout, a failed episode is never scored, attempts are 0-based and never
reused) hold in one place.

The activation lives in the OpenTelemetry context under :data:`FRAME_KEY`, so anything that carries
the OpenTelemetry context (``contextvars.copy_context()``, asyncio tasks) carries the gym scope too.
"""

from __future__ import annotations

import threading
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanContext

from gymtrace import _constants as c
from gymtrace._identity.scope_carrier import CARRIER_FORMAT as CARRIER_FORMAT
from gymtrace._identity.scope_carrier import read_carrier as read_carrier
from gymtrace._identity.scope_carrier import span_ref as span_ref
from gymtrace._model.errors import GymTraceError, contract_problem, data_lost
from gymtrace._model.outcome_rule import CANCELLED, COMPLETED, FAILED, Attempt, Decision, Facts, decide
from gymtrace._scopes import recording as _recording
from gymtrace._scopes.outcome_spans import emit_lost_attempt as emit_lost_attempt
from gymtrace._scopes.outcome_spans import emit_outcome as emit_outcome
from gymtrace._scopes.outcome_spans import untraced_worker
from gymtrace._scopes.recording import DISABLED_KIND as DISABLED_KIND
from gymtrace._scopes.recording import outside
from gymtrace._scopes.state import EpisodeState, RolloutState, StepCounter
from gymtrace._scopes.tracing import active_tracer, current_context

FRAME_KEY = otel_context.create_key("gymtrace.frame")

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

# (kind, retryable, message)
Failure = tuple[str, bool, "str | None"]


class ActiveScope:
    """One activation of a gym scope: its span, its identity and its outcome state.

    ``with gymtrace.episode() as ep:`` binds ``ep`` to one; decorated functions reach theirs with
    :func:`gymtrace.current_scope`.
    """

    # The activation's own state (every level has it) and one holder per level-owned concern
    # (_scopes/state.py), None until a level that owns it needs it: a step allocates none.
    __slots__ = (
        "attempt",
        "cancelled",
        "context",
        "counter",
        "ended",
        "episode_state",
        "failure",
        "handed_off",
        "identity",
        "kind",
        "level",
        "owner",
        "parent",
        "remote",
        "reward",
        "rollout_state",
        "span",
        "step_timing",
        "thread",
        "token",
        "unsampled",
    )

    def __init__(
        self, kind: str, parent: ActiveScope | None, owner: object = None, level: Any = None
    ) -> None:
        self.kind = kind
        # The level's description (a ``_levels.Level``); None for remote and disabled frames.
        self.level = level
        self.parent = parent
        # The Scope object this is an activation of (None for remote and disabled frames).
        self.owner = owner
        self.span: trace.Span = trace.INVALID_SPAN
        self.identity: dict[str, str | int] = parent.identity if parent is not None else {}
        self.context: otel_context.Context | None = None
        # A rollout's attempts (made by its level, or at a remote rollout's first attempt).
        self.rollout_state: RolloutState | None = None
        # An episode's restore flag, remote rollout span and start (made by its level).
        self.episode_state: EpisodeState | None = None
        # A numbering owner's turn and step counters, continuation ranges and step statistics
        # (made at its first turn or step, or when a continuation or policy sets them).
        self.counter: StepCounter | None = None
        # A carrier or continuation headers were taken in this episode (or on this rollout outside
        # its episodes): the attempt's outcome may come from there (see hand_off()).
        self.handed_off = False
        # The outcome state of whichever level records one (episode, rollout, verify).
        self.attempt: int | None = None
        self.reward: float | None = None
        self.failure: Failure | None = None
        self.cancelled = False
        # Its span has ended: what is recorded now is a late outcome.
        self.ended = False
        # It stands for a scope of another process (gymtrace.propagation): it has no span here.
        self.remote = False
        # A step under the aggregate step policy (_steps.py): (statistics, number, start time in ns,
        # whether it is a span).
        self.step_timing: tuple[Any, int, int, bool] | None = None
        # Entered by a `with` block: the token of the context it attached, which its exit detaches.
        self.token: object = None
        # Entered by a `with` block: the thread that entered it, so that an exit in another context
        # ends this thread's activation of a shared scope object, never another thread's.
        self.thread = 0
        # On a step's parent: the steps the aggregate policy did not sample that are open in a
        # `with` block, innermost first, as (frame, the ones below) or None. They attach nothing,
        # so their exit finds them here, on the frame that is current.
        self.unsampled: tuple[ActiveScope, Any] | None = None

    def _rollout(self) -> RolloutState:
        """Its rollout state, made at first use (a frame standing for another process's rollout)."""
        state = self.rollout_state
        if state is None:
            state = self.rollout_state = RolloutState()
        return state

    def _episode(self) -> EpisodeState:
        state = self.episode_state
        if state is None:
            state = self.episode_state = EpisodeState()
        return state

    def _counter(self) -> StepCounter:
        counter = self.counter
        if counter is None:
            counter = self.counter = StepCounter()
        return counter

    # -- the level-owned state under its former names (read rarely: never on a hot path) -------

    @property
    def counted(self) -> bool:
        """For a rollout: counted in ``gym.rollout.completed`` by this process."""
        state = self.rollout_state
        return state is not None and state.counted

    @counted.setter
    def counted(self, value: bool) -> None:
        self._rollout().counted = value

    @property
    def lost_attempt(self) -> tuple[int, str] | None:
        """For a rollout continued in a re-run of a task: (the attempt the lost run was, why), until
        the first episode opened here records it (see :meth:`rerun`)."""
        state = self.rollout_state
        return state.lost_attempt if state is not None else None

    @lost_attempt.setter
    def lost_attempt(self, value: tuple[int, str] | None) -> None:
        self._rollout().lost_attempt = value

    @property
    def started_ns(self) -> int:
        """For a rollout or episode: when it started (ns since the epoch)."""
        state = self.episode_state or self.rollout_state
        if state is None or not state.started_ns:
            raise AttributeError("started_ns: set only on rollouts and episodes")
        return state.started_ns

    @started_ns.setter
    def started_ns(self, value: int) -> None:
        (self._episode() if self.kind == c.KIND_EPISODE else self._rollout()).started_ns = value

    @property
    def restored(self) -> bool:
        """For an episode: opened from a checkpoint (``restored_from=``)."""
        state = self.episode_state
        return state is not None and state.restored

    @restored.setter
    def restored(self, value: bool) -> None:
        self._episode().restored = value

    @property
    def parent_span_context(self) -> SpanContext | None:
        """For an episode continued from a carrier: the rollout span it belongs to (elsewhere)."""
        state = self.episode_state
        return state.parent_span_context if state is not None else None

    @parent_span_context.setter
    def parent_span_context(self, value: SpanContext | None) -> None:
        self._episode().parent_span_context = value

    @property
    def step_stats(self) -> Any:
        """For a step owner: its steps' statistics under a step policy that counts (_steps.py)."""
        counter = self.counter
        return counter.stats if counter is not None else None

    @step_stats.setter
    def step_stats(self, value: Any) -> None:
        self._counter().stats = value

    @property
    def step_jump(self) -> int:
        """A continuation in another process: after its first (reserved) step number, where its next
        steps number from (see :meth:`continue_steps_from`); 0 once used."""
        counter = self.counter
        return counter.jump if counter is not None else 0

    @step_jump.setter
    def step_jump(self, value: int) -> None:
        self._counter().jump = value

    @property
    def step_limit(self) -> int:
        """Once this scope's step numbers share the episode with a continuation's range: the first
        number that would enter another part's range (0: no such limit)."""
        counter = self.counter
        return counter.limit if counter is not None else 0

    @step_limit.setter
    def step_limit(self, value: int) -> None:
        self._counter().limit = value

    # -- reading -------------------------------------------------------------------------------

    @property
    def trace_id(self) -> str:
        return trace.format_trace_id(self.span.get_span_context().trace_id)

    @property
    def span_id(self) -> str:
        return trace.format_span_id(self.span.get_span_context().span_id)

    @property
    def attempts_started(self) -> int:
        """For a rollout: how many episodes it has opened."""
        state = self.rollout_state
        return state.episodes if state is not None else 0

    @property
    def steps_started(self) -> int:
        """For a step owner: the number of the last step started below it (0: none yet)."""
        counter = self.counter
        return counter.next_step - 1 if counter is not None else 0

    @property
    def last_episode(self) -> ActiveScope | None:
        """For a rollout: its most recent episode (the final one once the rollout ends)."""
        state = self.rollout_state
        return state.last_episode if state is not None else None

    def nearest(self, *kinds: str) -> ActiveScope | None:
        frame: ActiveScope | None = self
        while frame is not None:
            if frame.kind in kinds:
                return frame
            frame = frame.parent
        return None

    def attempt_fact(self) -> Attempt:
        """For an episode: how it ended (so far), as the outcome rule reads it."""
        if self.cancelled:
            state = CANCELLED
        elif self.failure is not None:
            state = FAILED
        else:
            state = COMPLETED
        return Attempt(
            self.attempt if self.attempt is not None else 0, state, self.reward, (), False, self.handed_off
        )

    def outcome_facts(self) -> Facts:
        """For a rollout: what was recorded about it that bears on its outcome (``_outcome_rule``)."""
        state = self.rollout_state
        final = state.last_episode if state is not None else None
        attempts = (
            (*state.earlier_attempts, final.attempt_fact()) if state is not None and final is not None else ()
        )
        # Without episodes the rollout is its own attempt: what ended it is that attempt's failure.
        failure = self.failure[0] if self.failure is not None else None
        if failure is None and self.cancelled:
            failure = c.OUTCOME_CANCELLED
        # Positional: keywords cost a named tuple twice the time, at every rollout's end.
        return Facts(attempts, self.reward, failure, self.handed_off, self.attempts_started)

    def decision(self) -> Decision:
        """For a rollout: its outcome by the one rule; for an episode, the outcome it concludes."""
        if self.kind == c.KIND_EPISODE:
            return decide(Facts(attempts=(self.attempt_fact(),)))
        return decide(self.outcome_facts())

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
        last = state.last_episode if state is not None else None
        return (
            state is not None
            and last is not None
            and (last.attempt == attempt or any(a.number == attempt for a in state.earlier_attempts))
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
