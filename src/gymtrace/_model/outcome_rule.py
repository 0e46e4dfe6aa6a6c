"""The outcome rule: one pure function from what was recorded about a rollout to its outcome.

Everything that states an outcome calls :func:`decide`: the writer (``_scopes.levels``,
``_scopes.active_scope``), the readers (``_read.outcomes``), the checker (``_read.check``). The rule with
its examples is docs/outcomes.md; as decided here:

- A rollout has at most one reward: its **final attempt's** (the highest number; among facts about
  one attempt, the highest ``order``, then the last given). Completed with a reward: ``scored``;
  failed or cancelled: ``unscored``, never an invented 0; completed without one after that attempt
  (or the rollout outside every episode) was handed to another process: ``pending``; else ``unscored``.
- No episode: one implicit attempt 0, which owns what is recorded on the rollout.
- A reward on the rollout outside every episode scores a completed final attempt without its own.
- What the rule throws away is listed in :attr:`Decision.discarded`, for the writer to say once.
"""

from __future__ import annotations

from typing import NamedTuple

from gymtrace import _constants as c

# Named tuples, not frozen dataclasses: every rollout's end builds a few, and a tuple is built in a
# fraction of the time (benchmarks/overhead.py, nested levels).

# The state of one attempt, as the rule sees it.
COMPLETED = c.OUTCOME_COMPLETED
FAILED = c.OUTCOME_FAILED
CANCELLED = c.OUTCOME_CANCELLED
# Concluded elsewhere and not known here (a rollout root that says ``pending``).
PENDING = c.OUTCOME_PENDING


class Attempt(NamedTuple):
    """One fact about one attempt: its number, how it ended, its reward (``None``: none recorded).

    ``order`` breaks ties between facts about the same attempt (the later one wins): the rollout
    root says 0, outcome records say 1 plus when they ended.
    """

    number: int
    state: str
    reward: float | None = None
    order: tuple[int, ...] = ()
    # Said by the episode itself (its span): a failed or cancelled attempt stays so, whatever a
    # record written elsewhere, without knowing it, says about the same attempt.
    definite: bool = False
    # The episode handed its work to another process (a carrier, or headers injected as a
    # continuation): completed without a reward, its outcome is expected from there.
    handed_off: bool = False


class Facts(NamedTuple):
    """Everything recorded about one rollout that bears on its outcome."""

    attempts: tuple[Attempt, ...] = ()
    # A reward recorded on the rollout itself, outside every episode.
    reward: float | None = None
    # What escaped the rollout outside every episode (an exception's kind), or None.
    failure: str | None = None
    # A carrier or headers were taken on the rollout outside its episodes: the final attempt's
    # outcome may be recorded elsewhere (a hand-off inside an episode is that attempt's own).
    handed_off: bool = False
    # Episodes opened, when more are known than attempt numbers seen (at least the highest + 1).
    started: int = 0


class Decision(NamedTuple):
    """A rollout's outcome: ``scored`` (with ``reward``), ``unscored`` or ``pending``."""

    outcome: str
    reward: float | None
    # The attempt that decided (the final one) and how many attempts the rollout took.
    attempt: int
    attempts: int
    # What was recorded and had to be thrown away, each said in a sentence.
    discarded: tuple[str, ...] = ()

    @property
    def scored(self) -> bool:
        return self.outcome == c.OUTCOME_SCORED


def _final_first(attempt: Attempt) -> tuple[int, tuple[int, ...]]:
    return attempt.number, attempt.order


def decide(facts: Facts) -> Decision:
    """The outcome of the rollout ``facts`` describe (see the module docstring for the rule)."""
    attempts = facts.attempts
    discarded: list[str] = []
    rollout_reward = facts.reward
    if not attempts:
        # No episode: the rollout is its own attempt 0.
        state = FAILED if facts.failure is not None else COMPLETED
        if facts.failure is not None and rollout_reward is not None:
            discarded.append(
                f"reward {rollout_reward:g} was recorded before a failure ({facts.failure}) ended the rollout;"
                " its only attempt failed, and a failed attempt is never scored"
            )
        attempts = (Attempt(0, state, None if facts.failure is not None else rollout_reward),)
        rollout_reward = None
    # One attempt is the common case: every rollout's end runs this. Among facts that tie (an
    # attempt number recorded twice, in the order given), the last recorded is the final one.
    final = attempts[0] if len(attempts) == 1 else max(reversed(attempts), key=_final_first)
    ended = (
        [a for a in attempts if a.definite and a.number == final.number and a.state in (FAILED, CANCELLED)]
        if len(attempts) > 1
        else ()
    )
    if ended and final is not ended[0]:
        if final.reward is not None:
            discarded.append(
                f"reward {final.reward:g} was recorded for attempt {final.number} elsewhere or later,"
                f" but the attempt {ended[0].state}; a {ended[0].state} attempt is never scored"
            )
        final = ended[0]
    reward = final.reward
    for other in attempts:
        if other.reward is None or other.state == PENDING or other.definite:
            continue
        if other.state != COMPLETED:
            discarded.append(
                f"reward {other.reward:g} of attempt {other.number} was recorded before the attempt"
                f" {other.state}; a {other.state} attempt is never scored"
            )
        elif other.number < final.number:
            discarded.append(
                f"attempt {other.number} completed with reward {other.reward:g}, but attempt"
                f" {final.number} followed it; a rollout is scored by its final attempt only"
            )
        elif other is not final and other.number == final.number and other.order == final.order:
            # The same attempt number recorded twice by the writer (facts in recorded order).
            discarded.append(
                f"attempt {other.number} was recorded again after it completed with reward"
                f" {other.reward:g}; attempt numbers are never reused, the last recorded counts"
            )
    if rollout_reward is not None:
        if final.state == COMPLETED and reward is None:
            reward = rollout_reward  # recorded on the rollout while its final episode ran
        elif final.state == COMPLETED:
            discarded.append(
                f"reward {rollout_reward:g} was recorded on the rollout outside its episodes, but its"
                f" final attempt {final.number} has a reward of its own ({reward:g}), which counts"
            )
        else:
            discarded.append(
                f"reward {rollout_reward:g} was recorded on the rollout after its final attempt"
                f" {final.number} {final.state}; a {final.state} attempt is never scored"
            )
    if final.state != COMPLETED:
        reward = None
    if reward is not None:
        outcome = c.OUTCOME_SCORED
    elif final.state == PENDING or (final.state == COMPLETED and (facts.handed_off or final.handed_off)):
        outcome = c.OUTCOME_PENDING
    else:
        outcome = c.OUTCOME_UNSCORED
    count = max(facts.started, max(a.number for a in attempts) + 1 if len(attempts) > 1 else final.number + 1)
    return Decision(outcome, reward, final.number, count, tuple(discarded))


def state_of(outcome: object) -> str:
    """The attempt state a rollout-level outcome (a root's, a record's) stands for."""
    if outcome == c.OUTCOME_SCORED:
        return COMPLETED
    if outcome == c.OUTCOME_PENDING:
        return PENDING
    return FAILED if outcome == c.OUTCOME_UNSCORED else CANCELLED


def warning_text(rollout_id: object, decision: Decision) -> str:
    """The one message for everything the rule discarded of a rollout, with the fix."""
    return (
        f"rollout {rollout_id!r}: " + "; ".join(decision.discarded) + ". Fix: record the reward inside"
        " the final episode (or between it and the rollout's end) and only once the attempt succeeded;"
        " open one gymtrace.rollout() per sample, not one around several episodes that each score"
    )
