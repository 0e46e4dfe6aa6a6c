"""The state each gym level owns, one small slotted holder per concern, apart from the activation.

An :class:`~gymtrace._scopes.active_scope.ActiveScope` exists for every span (a step, a model call), but
most of what a scope can know belongs to a few levels only: a rollout's attempts, an episode's
restore and remote-rollout link, the turn and step counters of whatever numbers them, the step
ranges a continuation in another process shares, the aggregate step policy's statistics. Each is a
holder here, made only where its level needs it (a step scope allocates none of them), so the
activation stays a small object and each concern's fields are named in one place.

The holders carry data only: the rules that change them (one reward per rollout, attempts never
reused, step numbers unique across processes) stay on ``ActiveScope``, under its lock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from opentelemetry.trace import SpanContext

    from gymtrace._model.outcome_rule import Attempt

# The activation class (ActiveScope): a parameter, so this module imports nothing above it.
_Frame = TypeVar("_Frame")


class RolloutState(Generic[_Frame]):
    """A rollout's attempts: made when a rollout opens (or a frame standing for a rollout of another
    process first numbers an attempt)."""

    __slots__ = (
        "counted",
        "earlier_attempts",
        "episodes",
        "last_episode",
        "lost_attempt",
        "next_attempt",
        "opened",
        "policy_start",
        "started_ns",
        "tokens",
    )

    def __init__(self, started_ns: int = 0) -> None:
        # When it started (0: a frame standing for another process's rollout).
        self.started_ns = started_ns
        # The attempt number its next episode gets (0-based, never reused).
        self.next_attempt = 0
        # How many episodes it opened.
        self.episodes = 0
        # Its most recent episode (the final one once the rollout ends).
        self.last_episode: _Frame | None = None
        # What its episodes before the last one ended as (the outcome rule reports a reward they
        # had, which the final attempt supersedes).
        self.earlier_attempts: list[Attempt] = []
        # Continued in a re-run of a task (Ray's max_retries): (the attempt the lost run was, why),
        # until the first episode opened here records it (ActiveScope.rerun()).
        self.lost_attempt: tuple[int, str] | None = None
        # Counted in gym.rollout.completed here, once (_metrics).
        self.counted = False
        # The process's policy version when it started (set_policy_version): ended under another
        # one, it gets gym.policy.version.end.
        self.policy_start: int | str | None = None
        # How its span was started (attributes, links, parent context): a rollout the sampler drops
        # is summed up at its end in one span started the same way (_scopes/outcome_spans.py).
        self.opened: tuple[dict[str, Any], Any, Any] | None = None
        # Dropped by the sampler: the input and output tokens record_usage() was given below it,
        # which its model calls, recording nothing, cannot carry to the readers.
        self.tokens: list[int] | None = None


class EpisodeState:
    """What only an episode knows beyond its attempt: made when an episode opens."""

    __slots__ = ("parent_span_context", "restored", "started_ns")

    def __init__(self, started_ns: int = 0) -> None:
        # When it started: its duration (gym.episode.duration).
        self.started_ns = started_ns
        # Opened from a checkpoint (restored_from=).
        self.restored = False
        # Continued from a carrier in another process: the rollout span it belongs to there.
        self.parent_span_context: SpanContext | None = None


class StepCounter:
    """The turn and step numbers of a numbering owner (run, rollout, episode, agent invocation):
    made at its first turn or step."""

    __slots__ = ("jump", "limit", "next_step", "next_turn", "stats")

    def __init__(self) -> None:
        self.next_turn = 1
        self.next_step = 1
        # The remote continuation's ranges (see ActiveScope.continue_steps_from): a continuation in
        # another process, after its first (reserved) step number, numbers on from ``jump``; once
        # the owner's numbers share the episode with a continuation's range, ``limit`` is the first
        # number that would enter another part's range (0: no such limit).
        self.jump = 0
        self.limit = 0
        # The aggregate step policy's statistics of its steps (_steps.py), or an integration's
        # marker that it counts them itself.
        self.stats: Any = None
