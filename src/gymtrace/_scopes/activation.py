"""The activation's state and its reading: the base of ``ActiveScope`` that everything below it types.

An activation (a ``with`` block, or one call of a decorated function) owns its span, the gym
identity every span below it inherits, and its outcome state (reward, failure, cancellation). What
only some levels own sits in small holders made where that level needs them (``_scopes/state.py``):
a rollout's attempts, an episode's restore and remote-rollout link, a numbering owner's counters.
Here: those fields, the former attribute names of the held state, and what is read from them (the
nearest level, an attempt's facts, the outcome by the one rule). The methods that change the state
are :class:`~gymtrace._scopes.frame.ActiveScope`'s (numbering, in ``_scopes/frame.py``) and
``_scopes/recording.py``'s (what user code records), which take this class, so that they sit above
it in the import graph rather than in one 900-line module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanContext

from gymtrace import _constants as c
from gymtrace._model.outcome_rule import CANCELLED, COMPLETED, FAILED, Attempt, Decision, Facts, decide
from gymtrace._scopes.state import EpisodeState, RolloutState, StepCounter
from gymtrace._scopes.training import TrainState

if TYPE_CHECKING:
    from typing_extensions import Self

# (kind, retryable, message)
Failure = tuple[str, bool, "str | None"]


class Activation:
    """One activation of a gym scope: its span, its identity and its outcome state (the base of
    :class:`~gymtrace._scopes.frame.Self`, which adds the numbering and recording methods).

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
        "train_state",
        "unsampled",
    )

    def __init__(self, kind: str, parent: Self | None, owner: object = None, level: Any = None) -> None:
        self.kind = kind
        # The level's description (a ``_scopes.levels.Level``); None for remote and disabled frames.
        self.level = level
        self.parent = parent
        # The Scope object this is an activation of (None for remote and disabled frames).
        self.owner = owner
        self.span: trace.Span = trace.INVALID_SPAN
        self.identity: dict[str, str | int] = parent.identity if parent is not None else {}
        self.context: otel_context.Context | None = None
        # A rollout's attempts (made by its level, or at a remote rollout's first attempt).
        self.rollout_state: RolloutState[Self] | None = None
        # An episode's restore flag, remote rollout span and start (made by its level).
        self.episode_state: EpisodeState | None = None
        # A numbering owner's turn and step counters, continuation ranges and step statistics
        # (made at its first turn or step, or when a continuation or policy sets them).
        self.counter: StepCounter | None = None
        # A train step's consumed rollouts not yet written (made by its level).
        self.train_state: TrainState | None = None
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
        self.unsampled: tuple[Self, Any] | None = None

    def _rollout(self) -> RolloutState[Self]:
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
    def last_episode(self) -> Self | None:
        """For a rollout: its most recent episode (the final one once the rollout ends)."""
        state = self.rollout_state
        return state.last_episode if state is not None else None

    def nearest(self, *kinds: str) -> Self | None:
        frame: Self | None = self
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
        """For a rollout: what was recorded about it that bears on its outcome (``_model.outcome_rule``)."""
        state = self.rollout_state
        if state is not None:
            final = state.last_episode
            attempts = (*state.earlier_attempts, final.attempt_fact()) if final is not None else ()
            episodes = state.episodes
        else:
            attempts, episodes = (), 0
        # Without episodes the rollout is its own attempt: what ended it is that attempt's failure.
        failure = self.failure[0] if self.failure is not None else None
        if failure is None and self.cancelled:
            failure = c.OUTCOME_CANCELLED
        # Positional: keywords cost a named tuple twice the time, at every rollout's end.
        return Facts(attempts, self.reward, failure, self.handed_off, episodes)

    def decision(self) -> Decision:
        """For a rollout: its outcome by the one rule; for an episode, the outcome it concludes."""
        if self.kind == c.KIND_EPISODE:
            return decide(Facts(attempts=(self.attempt_fact(),)))
        return decide(self.outcome_facts())
