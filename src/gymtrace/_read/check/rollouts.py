"""The contract's rules about each rollout as a whole: its episodes' attempts, its root, its final outcome.

Apart from the span rules (:mod:`.spans`) because they read a rollout through the grouping and the
outcome rule every reader applies (:mod:`gymtrace._read.outcomes`), so the checker never
contradicts ``gymtrace rollouts`` or ``stats``: one rollout's spans at a time, not the span tree.
"""

from __future__ import annotations

import math

from gymtrace import _constants as c
from gymtrace._model.ids import episode_id
from gymtrace._model.outcome_rule import CANCELLED, COMPLETED, FAILED, Attempt, Facts
from gymtrace._model.outcome_rule import decide as decide_outcome
from gymtrace._model.spandata import SpanData
from gymtrace._read.check.spans import Problem, SpanIndex, label
from gymtrace._read.outcomes import (
    RolloutSpans,
    concluded_attempt,
    decide,
    decision_of,
    group_rollouts,
    is_outcome_record,
    last_recorded,
    recorded_order,
)


def check_rollouts(index: SpanIndex) -> list[Problem]:
    problems: list[Problem] = []
    for group in sorted(group_rollouts(index.spans), key=lambda g: (g.rollout_id, g.trace_id)):
        problems += _check_episodes_of(group)
        problems += _check_roots_of(group)
        problems += _check_final_outcome(group)
    return problems


def _check_episodes_of(group: RolloutSpans) -> list[Problem]:
    problems: list[Problem] = []
    rollout_id, episodes = group.rollout_id, group.episodes
    if not episodes:
        return problems
    attempts = sorted(s.attributes.get(c.EPISODE_ATTEMPT, -1) for s in episodes)
    # An attempt whose run left no episode span (a worker that died before Ray re-ran its task) is
    # there as a failed outcome record.
    lost = sorted(
        {
            attempt
            for r in group.records
            if c.FAILURE_KIND in r.attributes
            and r.attributes.get(c.ROLLOUT_OUTCOME) == c.OUTCOME_UNSCORED
            and isinstance(attempt := r.attributes.get(c.EPISODE_ATTEMPT), int)
        }
        - set(attempts)
    )
    reused = sorted({a for a in attempts if attempts.count(a) > 1})
    if reused:
        # Warned (strict: raised) when the second episode opened; every reader takes the last one.
        problems.append(
            (
                "episode attempts",
                f"rollout {rollout_id}: episode attempt(s) {reused} recorded by more than one episode"
                " (an attempt number reused); the last recorded counts",
            )
        )
        attempts = sorted(set(attempts))
    covered = sorted(attempts + lost)
    if covered != list(range(len(covered))):
        problems.append(
            (
                "episode attempts",
                f"rollout {rollout_id}: episode attempts are {attempts}"
                + (f" (and lost: {lost})" if lost else "")
                + f", expected 0..{len(covered) - 1}",
            )
        )
    rewarded = [s for s in last_recorded(episodes).values() if c.REWARD in s.attributes]
    if len(rewarded) > 1:
        problems.append(
            (
                "more than one reward",
                f"rollout {rollout_id}: {len(rewarded)} episodes carry a reward (attempts"
                f" {sorted(int(s.attributes.get(c.EPISODE_ATTEMPT, -1)) for s in rewarded)}); a rollout gets at most one",
            )
        )
    for s in episodes:
        outcome = s.attributes.get(c.EPISODE_OUTCOME)
        if c.REWARD in s.attributes and outcome != c.OUTCOME_COMPLETED:
            problems.append(
                (
                    "reward on a failed episode",
                    f"rollout {rollout_id}: {outcome or 'unfinished'} episode {label(s)} carries a reward;"
                    " failed episodes are never scored",
                )
            )
        attempt = s.attributes.get(c.EPISODE_ATTEMPT)
        if isinstance(attempt, int) and s.attributes.get(c.EPISODE_ID) != episode_id(rollout_id, attempt):
            problems.append(
                (
                    "episode ID",
                    f"rollout {rollout_id}: episode {label(s)} has gym.episode.id={s.attributes.get(c.EPISODE_ID)!r},"
                    f" expected {episode_id(rollout_id, attempt)!r}",
                )
            )
    return problems


def _check_roots_of(group: RolloutSpans) -> list[Problem]:
    """Each root (and record) must be self-consistent: scored with a reward, unscored without."""
    problems: list[Problem] = []
    rollout_id = group.rollout_id
    for rollout in group.roots:
        outcome = rollout.attributes.get(c.ROLLOUT_OUTCOME)
        reward = rollout.attributes.get(c.REWARD)
        if outcome == c.OUTCOME_UNSCORED:
            if reward is not None:
                problems.append(
                    (
                        "unscored with a reward",
                        f"rollout {rollout_id}: unscored but has gym.reward={reward}; an unscored rollout has no reward",
                    )
                )
        elif outcome == c.OUTCOME_SCORED:
            if reward is None:
                problems.append(
                    ("scored without a reward", f"rollout {rollout_id}: scored but has no gym.reward")
                )
        elif outcome == c.OUTCOME_PENDING:
            if reward is not None:
                problems.append(
                    ("pending with a reward", f"rollout {rollout_id}: pending but has gym.reward={reward}")
                )
        elif outcome is not None:
            problems.append(
                ("unknown rollout outcome", f"rollout {rollout_id}: unknown gym.rollout.outcome {outcome!r}")
            )
    return problems


def _episode_fact(episode: SpanData) -> Attempt:
    """What an episode span says about its attempt, for the outcome rule."""
    outcome = episode.attributes.get(c.EPISODE_OUTCOME)
    state = outcome if outcome in (COMPLETED, FAILED) else CANCELLED  # unfinished: no outcome
    reward = episode.attributes.get(c.REWARD)
    number = episode.attributes.get(c.EPISODE_ATTEMPT)
    return Attempt(
        number if isinstance(number, int) else -1,
        state,
        float(reward) if isinstance(reward, (int, float)) and not isinstance(reward, bool) else None,
        recorded_order(episode)[:2],
    )


def _check_final_outcome(group: RolloutSpans) -> list[Problem]:
    """The final outcome (by the rule every reader applies) must agree with the same rule applied
    to the episode spans.

    A root that ended before a later attempt, or before a late reward, is stale; that is fine when
    an outcome record concludes the later attempt, and a violation when nothing fixes it, because
    then every reader reports the stale answer. A root may say ``pending`` where the final episode
    completed without a reward: the outcome was handed to another process.
    """
    decider = decide(group.candidates)
    # What the root and records say by themselves: the checker judges them, not the readers' answer
    # (which the episode spans already correct).
    decided = decision_of(group, episodes=False)
    finished = [e for e in group.episodes if isinstance(e.attributes.get(c.EPISODE_ATTEMPT), int)]
    if decider is None or decided is None or not finished:
        return []
    if decider.attributes.get(c.ROLLOUT_OUTCOME) is None:
        return []  # a root without an outcome never finished; nothing to compare
    expected = decide_outcome(Facts(attempts=tuple(_episode_fact(e) for e in finished)))
    final_attempt = expected.attempt
    final = max((e for e in finished if e.attributes[c.EPISODE_ATTEMPT] == final_attempt), key=recorded_order)
    outcome, reward = decided.outcome, decided.reward
    concluded = concluded_attempt(decider)
    what = f"outcome record {label(decider)}" if is_outcome_record(decider) else "stale rollout root"
    rollout_id = group.rollout_id
    says = f"says {outcome}" + (f" {reward}" if reward is not None else "") + f" after attempt {concluded}"
    found = f"attempt {final_attempt} {final.attributes.get(c.EPISODE_OUTCOME, 'ended')}" + (
        f" with reward {expected.reward:g}" if expected.reward is not None else ""
    )
    fix = "" if is_outcome_record(decider) else " and no outcome record fixes it"
    if concluded < final_attempt:
        return [("stale rollout outcome", f"rollout {rollout_id}: {what} {says}, but {found}{fix}")]
    if is_outcome_record(decider) and final.attributes.get(c.EPISODE_OUTCOME) in (FAILED, CANCELLED):
        # A scorer elsewhere scored an attempt that failed meanwhile, without knowing: the episode
        # span outranks it (docs/outcomes.md, rule 3) in every reader, so nothing reads it wrong.
        return []
    # The final episode completed without a reward: a record may score it (the reward came later,
    # or from another process), and a root may wait for one (pending).
    awaiting = final.attributes.get(c.EPISODE_OUTCOME) == COMPLETED and expected.reward is None
    late_score = awaiting and is_outcome_record(decider)
    if outcome != expected.outcome and not late_score and not (awaiting and outcome == c.OUTCOME_PENDING):
        return [("stale rollout outcome", f"rollout {rollout_id}: {what} {says}, but {found}{fix}")]
    # A record may re-score its attempt: a second reward recorded later counts (and was warned
    # about when it was recorded); a root has no such excuse.
    if (
        expected.reward is not None
        and reward is not None
        and not is_outcome_record(decider)
        and not math.isclose(reward, expected.reward)
    ):
        return [
            (
                "reward not the final episode's",
                f"rollout {rollout_id}: reward {reward} is not its final episode's"
                f" (attempt {final_attempt}: {expected.reward})",
            )
        ]
    return []
