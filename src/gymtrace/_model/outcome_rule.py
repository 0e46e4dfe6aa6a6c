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

import math
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from gymtrace import _constants as c
from gymtrace._model.numbers import read_int

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


# -- candidates: a rollout's root and outcome records, as attributes -------------------------------
#
# Here, beside the rule, not in the readers: the readers apply it to spans, and the gym.* rollout
# metrics (``_scopes.metrics``) to what the process that owns the rollout recorded, without
# importing the readers (and the span model) into every traced process.


def _reward(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    reward = float(value)
    return reward if math.isfinite(reward) else None


def concluded(attributes: Mapping[str, Any]) -> int:
    """The attempt a candidate concludes: a record names it, a root knows ``attempts - 1``."""
    if attributes.get(c.KIND) == c.KIND_OUTCOME:
        attempt = read_int(attributes.get(c.EPISODE_ATTEMPT))
        return attempt if attempt is not None else -1
    attempts = read_int(attributes.get(c.ROLLOUT_ATTEMPTS))
    return attempts - 1 if attempts is not None else -1


def candidate_order(attributes: Mapping[str, Any], end_ns: int, span_number: int) -> tuple[int, ...]:
    """Among candidates concluding the same attempt: a record beats the root, then the later one."""
    return (int(attributes.get(c.KIND) == c.KIND_OUTCOME), end_ns, span_number)


def fact_of(attributes: Mapping[str, Any], order: tuple[int, ...]) -> Attempt:
    """What a rollout root or outcome record says about the attempt it concludes, for the rule."""
    outcome = attributes.get(c.ROLLOUT_OUTCOME)
    reward = _reward(attributes.get(c.REWARD)) if outcome == c.OUTCOME_SCORED else None
    # A root that says scored without a usable reward has no score to give.
    state = FAILED if outcome == c.OUTCOME_SCORED and reward is None else state_of(outcome)
    return Attempt(concluded(attributes), state, reward, order)


def decide_candidates(
    candidates: Iterable[tuple[Mapping[str, Any], int, int]], episodes: Iterable[tuple[object, object]] = ()
) -> Decision | None:
    """The outcome rule over a rollout's candidates, each (attributes of its root or an outcome
    record, end time in ns, span ID as an int), and its episodes, each (``gym.episode.attempt``,
    ``gym.episode.outcome``) in the order they were recorded (of two with one attempt number, the
    later speaks for it); None without candidates. The readers call it with spans, and the
    metrics (``_scopes.metrics``) with what the process that owns the rollout recorded about it."""
    facts = []
    started = 0
    for attributes, end_ns, span_number in candidates:
        started = max(started, read_int(attributes.get(c.ROLLOUT_ATTEMPTS)) or 0)
        facts.append(fact_of(attributes, candidate_order(attributes, end_ns, span_number)))
    if not facts:
        return None
    # An episode span that says its attempt failed or was cancelled outranks a record that scored
    # the attempt without knowing (written in another process, or later). Of an attempt number
    # that two episodes took (reused), only the last recorded speaks for it, as in the writer.
    last: dict[int, object] = {}
    for number, outcome in episodes:
        attempt = read_int(number)
        if attempt is not None:
            last[attempt] = outcome
    for attempt, outcome in last.items():
        if outcome in (FAILED, CANCELLED):
            facts.append(Attempt(attempt, str(outcome), None, (-1,), definite=True))
    return decide(Facts(attempts=tuple(facts), started=started))
