"""The contract checker behind ``gymtrace.testing.check_trace`` and ``gymtrace check FILE``.

Each rule is a rule of the vocabulary the README describes; each message names the rollout or span
it is about. Nesting comes from the level table (``_levels.LEVELS``), so a new level is checked
without touching this module.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from gymtrace import _constants as c
from gymtrace._ids import episode_id
from gymtrace._levels import LEVELS, NUMBERING_OWNERS, allowed
from gymtrace._spandata import SpanData, normalize


def _label(span: SpanData) -> str:
    return f"{span.name} (span {span.span_id})"


class _Index:
    def __init__(self, spans: list[SpanData]) -> None:
        self.spans = spans
        self.by_id = {s.span_id: s for s in spans}
        self.children: dict[str, list[SpanData]] = defaultdict(list)
        for s in spans:
            if s.parent_id is not None:
                self.children[s.parent_id].append(s)

    def gym_ancestor(self, span: SpanData, kinds: Iterable[str] | None = None) -> SpanData | None:
        """The nearest ancestor with a gym kind (in ``kinds`` if given), through foreign spans."""
        wanted = set(kinds) if kinds is not None else None
        seen = set()
        current = self.by_id.get(span.parent_id) if span.parent_id else None
        while current is not None and current.span_id not in seen:
            seen.add(current.span_id)
            kind = current.attributes.get(c.KIND)
            if kind is not None and (wanted is None or kind in wanted):
                return current
            current = self.by_id.get(current.parent_id) if current.parent_id else None
        return None

    def descendants(self, span: SpanData) -> Iterable[SpanData]:
        stack = list(self.children.get(span.span_id, ()))
        while stack:
            child = stack.pop()
            yield child
            stack.extend(self.children.get(child.span_id, ()))


def check_spans(spans: Iterable[Any]) -> list[str]:
    data = normalize(spans)
    index = _Index(data)
    problems: list[str] = []
    problems += _check_kinds_and_nesting(index)
    problems += _check_identity_below(index)
    problems += _check_rollouts(index)
    problems += _check_episode_links(index)
    problems += _check_numbering(index)
    return problems


def _check_kinds_and_nesting(index: _Index) -> list[str]:
    problems = []
    for span in index.spans:
        kind = span.attributes.get(c.KIND)
        if kind is None:
            continue
        if kind not in c.ALL_KINDS:
            problems.append(f"{_label(span)}: unknown gym.kind {kind!r}")
            continue
        parent = index.gym_ancestor(span)
        if parent is not None:
            parent_kind = parent.attributes.get(c.KIND)
            if parent_kind in LEVELS and kind in LEVELS and not allowed(str(parent_kind), str(kind)):
                problems.append(
                    f"{_label(span)}: inverted nesting, {kind} inside {parent_kind} {_label(parent)}"
                )
        if c.HIERARCHY_VIOLATION in span.attributes:
            problems.append(
                f"{_label(span)}: marked gym.hierarchy.violation={span.attributes[c.HIERARCHY_VIOLATION]!r}"
            )
    return problems


def _check_identity_below(index: _Index) -> list[str]:
    problems = []
    for top_kind, key in ((c.KIND_ROLLOUT, c.ROLLOUT_ID), (c.KIND_EPISODE, c.EPISODE_ATTEMPT)):
        for top in index.spans:
            if top.attributes.get(c.KIND) != top_kind:
                continue
            if key not in top.attributes:
                problems.append(f"{_label(top)}: {top_kind} span without {key}")
                continue
            expected = top.attributes[key]
            for below in index.descendants(top):
                if below.attributes.get(key) != expected:
                    got = below.attributes.get(key, "<missing>")
                    problems.append(
                        f"{_label(below)}: below {top_kind} {_label(top)} it needs {key}={expected!r}, has {got!r}"
                    )
    return problems


def _episodes_by_rollout(index: _Index) -> dict[str, list[SpanData]]:
    grouped: dict[str, list[SpanData]] = defaultdict(list)
    for span in index.spans:
        if span.attributes.get(c.KIND) == c.KIND_EPISODE and isinstance(
            span.attributes.get(c.ROLLOUT_ID), str
        ):
            grouped[span.attributes[c.ROLLOUT_ID]].append(span)
    return grouped


def _check_rollouts(index: _Index) -> list[str]:
    problems = []
    episodes = _episodes_by_rollout(index)
    for rollout_id, group in sorted(episodes.items()):
        attempts = sorted(s.attributes.get(c.EPISODE_ATTEMPT, -1) for s in group)
        if attempts != list(range(len(group))):
            problems.append(
                f"rollout {rollout_id}: episode attempts are {attempts}, expected 0..{len(group) - 1}"
            )
        rewarded = [s for s in group if c.REWARD in s.attributes]
        if len(rewarded) > 1:
            problems.append(
                f"rollout {rollout_id}: {len(rewarded)} episodes carry a reward (attempts"
                f" {sorted(int(s.attributes.get(c.EPISODE_ATTEMPT, -1)) for s in rewarded)}); a rollout gets at most one"
            )
        for s in group:
            outcome = s.attributes.get(c.EPISODE_OUTCOME)
            if c.REWARD in s.attributes and outcome != c.OUTCOME_COMPLETED:
                problems.append(
                    f"rollout {rollout_id}: {outcome or 'unfinished'} episode {_label(s)} carries a reward; failed episodes are never scored"
                )
            attempt = s.attributes.get(c.EPISODE_ATTEMPT)
            if isinstance(attempt, int) and s.attributes.get(c.EPISODE_ID) != episode_id(rollout_id, attempt):
                problems.append(
                    f"rollout {rollout_id}: episode {_label(s)} has gym.episode.id={s.attributes.get(c.EPISODE_ID)!r},"
                    f" expected {episode_id(rollout_id, attempt)!r}"
                )
    for rollout in index.spans:
        if rollout.attributes.get(c.KIND) != c.KIND_ROLLOUT:
            continue
        rollout_id = str(rollout.attributes.get(c.ROLLOUT_ID))
        outcome = rollout.attributes.get(c.ROLLOUT_OUTCOME)
        reward = rollout.attributes.get(c.REWARD)
        # The episodes this rollout span knew of; an attempt continued later in another process
        # (from a carrier) starts after the rollout span ended and is not part of its outcome.
        own = [e for e in episodes.get(str(rollout_id), []) if e.start_ns <= rollout.end_ns]
        final = max(own, key=lambda e: e.attributes.get(c.EPISODE_ATTEMPT, -1)) if own else None
        if outcome == c.OUTCOME_UNSCORED:
            if reward is not None:
                problems.append(
                    f"rollout {rollout_id}: unscored but has gym.reward={reward}; an unscored rollout has no reward"
                )
        elif outcome == c.OUTCOME_SCORED:
            if reward is None:
                problems.append(f"rollout {rollout_id}: scored but has no gym.reward")
            elif final is not None:
                final_reward = final.attributes.get(c.REWARD)
                if final_reward is None or not math.isclose(float(final_reward), float(reward)):
                    problems.append(
                        f"rollout {rollout_id}: reward {reward} is not its final episode's"
                        f" (attempt {final.attributes.get(c.EPISODE_ATTEMPT)}: {final_reward})"
                    )
        elif outcome is not None:
            problems.append(f"rollout {rollout_id}: unknown gym.rollout.outcome {outcome!r}")
        if (
            outcome == c.OUTCOME_UNSCORED
            and final is not None
            and final.attributes.get(c.EPISODE_OUTCOME) == c.OUTCOME_COMPLETED
            and c.REWARD in final.attributes
        ):
            problems.append(
                f"rollout {rollout_id}: unscored although its final episode completed with a reward"
            )
    return problems


def _check_episode_links(index: _Index) -> list[str]:
    problems = []
    for span in index.spans:
        if span.attributes.get(c.KIND) != c.KIND_EPISODE:
            continue
        relations = {link.attributes.get(c.LINK_RELATION) for link in span.links}
        if span.attributes.get(c.EPISODE_RESTORED) is True:
            if c.RELATION_RESTORE not in relations:
                problems.append(
                    f"{_label(span)}: restored episode without a link (relation restore) to the episode it continues"
                )
        elif (span.attributes.get(c.EPISODE_ATTEMPT) or 0) > 0 and c.RELATION_RETRY not in relations:
            problems.append(
                f"{_label(span)}: attempt {span.attributes[c.EPISODE_ATTEMPT]} without a link (relation retry) to the previous attempt"
            )
    return problems


def _check_numbering(index: _Index) -> list[str]:
    problems = []
    owners = NUMBERING_OWNERS
    for kind, key in ((c.KIND_TURN, c.TURN_NUMBER), (c.KIND_STEP, c.STEP_NUMBER)):
        groups: dict[str, list[SpanData]] = defaultdict(list)
        for span in index.spans:
            if span.attributes.get(c.KIND) == kind:
                owner = index.gym_ancestor(span, owners)
                groups[owner.span_id if owner else "<none>"].append(span)
        for owner_id, group in groups.items():
            numbers = [s.attributes.get(key) for s in sorted(group, key=lambda s: (s.start_ns, s.span_id))]
            ints = [n for n in numbers if isinstance(n, int)]
            if len(ints) != len(numbers) or any(a >= b for a, b in itertools.pairwise(ints)):
                owner = index.by_id.get(owner_id)
                where = _label(owner) if owner else "no invocation"
                problems.append(f"{kind} numbers within {where} are {numbers}, not increasing")
    return problems
