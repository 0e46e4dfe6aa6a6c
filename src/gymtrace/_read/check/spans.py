"""The contract's rules about single spans and how they nest, and the index they read the trace by.

Each rule is a rule of the vocabulary docs/concepts.md describes; each message names the span it
is about. Nesting comes from the level table (``_scopes.levels.LEVELS``), so a new level is checked
without touching this module. The rules that judge a whole rollout (its attempts, root and final
outcome) are in :mod:`.rollouts`; both return problems to the driver in :mod:`gymtrace._read.check`,
which limits the examples per rule.
"""

from __future__ import annotations

import functools
import itertools
from collections import defaultdict
from collections.abc import Collection, Iterable

from gymtrace import _constants as c
from gymtrace._model.ids import episode_id
from gymtrace._model.spandata import SpanData
from gymtrace._read.outcomes import is_outcome_record
from gymtrace._scopes.active_scope import STEP_RANGE
from gymtrace._scopes.levels import LEVELS, NUMBERING_OWNERS, allowed

# A problem is (rule, message); the rule groups messages for the examples-and-count limit.
Problem = tuple[str, str]


def label(span: SpanData) -> str:
    """How a message names a span: its name and span ID."""
    return f"{span.name} (span {span.span_id})"


class SpanIndex:
    """The spans of a trace by ID and by parent, for the rules that walk up or down the tree."""

    def __init__(self, spans: list[SpanData]) -> None:
        self.spans = spans

    # Made when a rule first walks the tree: the rules over whole rollouts read the spans alone, and
    # at 100,000 rollouts the maps of every rollout-level span cost them ~0.2 s.
    @functools.cached_property
    def by_id(self) -> dict[str, SpanData]:
        return {s.span_id: s for s in self.spans}

    @functools.cached_property
    def children(self) -> dict[str, list[SpanData]]:
        children: dict[str, list[SpanData]] = defaultdict(list)
        for s in self.spans:
            if s.parent_id is not None:
                children[s.parent_id].append(s)
        return children

    def gym_ancestor(self, span: SpanData, kinds: Collection[str] | None = None) -> SpanData | None:
        """The nearest ancestor with a gym kind (in ``kinds`` if given), through foreign spans."""
        by_id = self.by_id
        current = by_id.get(span.parent_id) if span.parent_id else None
        # At most one step per span: a parent cycle (not this index's to judge) ends the walk.
        for _ in range(len(by_id)):
            if current is None:
                return None
            kind = current.attributes.get(c.KIND)
            if kind is not None and (kinds is None or kind in kinds):
                return current
            current = by_id.get(current.parent_id) if current.parent_id else None
        return None

    def missing_ancestor(self, span: SpanData) -> str | None:
        """The ID of the nearest ancestor of ``span`` that is not in the input (a span its process
        never ended: killed), or None when its parents lead to a root that is."""
        seen = set()
        current: SpanData | None = span
        while current is not None and current.parent_id is not None and current.span_id not in seen:
            seen.add(current.span_id)
            parent = self.by_id.get(current.parent_id)
            if parent is None:
                return current.parent_id
            current = parent
        return None

    def descendants(self, span: SpanData) -> Iterable[SpanData]:
        """The spans below ``span``, each once: a parent cycle through it (a malformed file) ends
        the walk instead of going round it for ever."""
        seen = {span.span_id}
        stack = list(self.children.get(span.span_id, ()))
        while stack:
            child = stack.pop()
            if child.span_id in seen:
                continue
            seen.add(child.span_id)
            yield child
            stack.extend(self.children.get(child.span_id, ()))


def check_shared_run_ids(
    raw: list[SpanData], data: list[SpanData], *, duplicated: int | None = None
) -> list[Problem]:
    """Two runs with one run ID (a re-run appended to the same file), said as exactly that.

    ``duplicated``: the spans read more than once, where ``raw`` is not every span read (the
    checker that streams holds only the rollout-level spans; it counts the copies itself).

    The rollout checks below tell the runs' rollouts apart by trace, so the re-run does not also
    show up as a flood of attempt violations; here it is named once, with its likely cause.
    """
    problems: list[Problem] = []
    runs: dict[str, list[SpanData]] = defaultdict(list)
    for span in data:
        run_id = span.attributes.get(c.RUN_ID)
        if span.attributes.get(c.KIND) == c.KIND_RUN and isinstance(run_id, str):
            runs[run_id].append(span)
    copies: dict[str, int] = defaultdict(int)
    for span in raw:
        run_id = span.attributes.get(c.RUN_ID)
        if span.attributes.get(c.KIND) == c.KIND_RUN and isinstance(run_id, str):
            copies[run_id] += 1
    for run_id, spans in sorted(runs.items()):
        if len(spans) > 1:
            problems.append(
                ("runs sharing a run ID", f"{len(spans)} runs share run ID {run_id}: appended re-run?")
            )
        elif copies[run_id] > 1:
            problems.append(
                (
                    "runs sharing a run ID",
                    f"run {run_id} appears {copies[run_id]} times (the same spans): file appended twice?",
                )
            )
    # A file appended twice without a run span: every span twice, found by its IDs.
    if duplicated is None:
        duplicated = len(raw) - len(data)
    if duplicated and not any(copies[run_id] > len(spans) for run_id, spans in runs.items()):
        problems.append(
            (
                "duplicate spans",
                f"{duplicated} span(s) appear more than once (same trace and span ID): file appended twice?",
            )
        )
    return problems


def check_kinds_and_nesting(index: SpanIndex) -> list[Problem]:
    problems: list[Problem] = []
    for span in index.spans:
        kind = span.attributes.get(c.KIND)
        if kind is None:
            continue
        if kind not in c.ALL_KINDS and kind not in LEVELS:  # a level declared since: known too
            problems.append(("unknown gym.kind", f"{label(span)}: unknown gym.kind {kind!r}"))
            continue
        parent = index.gym_ancestor(span)
        if parent is not None and kind != c.KIND_OUTCOME:
            parent_kind = parent.attributes.get(c.KIND)
            if parent_kind == c.KIND_OUTCOME:
                problems.append(
                    ("inverted nesting", f"{label(span)}: {kind} inside an outcome record {label(parent)}")
                )
            elif parent_kind in LEVELS and kind in LEVELS and not allowed(str(parent_kind), str(kind)):
                problems.append(
                    (
                        "inverted nesting",
                        f"{label(span)}: inverted nesting, {kind} inside {parent_kind} {label(parent)}",
                    )
                )
        if c.HIERARCHY_VIOLATION in span.attributes:
            problems.append(
                (
                    "hierarchy violation",
                    f"{label(span)}: marked gym.hierarchy.violation={span.attributes[c.HIERARCHY_VIOLATION]!r}",
                )
            )
    return problems


def check_identity_below(index: SpanIndex) -> list[Problem]:
    problems: list[Problem] = []
    for top_kind, key in ((c.KIND_ROLLOUT, c.ROLLOUT_ID), (c.KIND_EPISODE, c.EPISODE_ATTEMPT)):
        for top in index.spans:
            if top.attributes.get(c.KIND) != top_kind:
                continue
            if key not in top.attributes:
                problems.append(("missing identity", f"{label(top)}: {top_kind} span without {key}"))
                continue
            expected = top.attributes[key]
            for below in index.descendants(top):
                if below.attributes.get(key) != expected:
                    got = below.attributes.get(key, "<missing>")
                    problems.append(
                        (
                            f"identity below {top_kind}",
                            f"{label(below)}: below {top_kind} {label(top)} it needs {key}={expected!r}, has {got!r}",
                        )
                    )
    return problems


def _has_reward(span: SpanData) -> bool:
    return c.REWARD in span.attributes or any(e.name == c.GEN_AI_EVALUATION_RESULT for e in span.events)


def check_rewards_inside_rollouts(index: SpanIndex) -> list[Problem]:
    """A reward or a verify span needs a rollout: without one no reader can count it."""
    problems: list[Problem] = []
    for span in index.spans:
        if isinstance(span.attributes.get(c.ROLLOUT_ID), str):
            continue
        if span.attributes.get(c.KIND) == c.KIND_VERIFY:
            problems.append(
                (
                    "reward outside any rollout",
                    f"{label(span)}: verify span outside any rollout (no {c.ROLLOUT_ID})",
                )
            )
        elif _has_reward(span):
            problems.append(
                (
                    "reward outside any rollout",
                    f"{label(span)}: reward recorded outside any rollout (no {c.ROLLOUT_ID})",
                )
            )
    return problems


def check_outcome_records(index: SpanIndex) -> list[Problem]:
    """An outcome record is only counted when it says which rollout and attempt it concludes."""
    problems: list[Problem] = []
    rule = "invalid outcome record"
    for span in index.spans:
        if not is_outcome_record(span):
            continue
        attrs = span.attributes
        missing = [
            k
            for k in (
                c.ROLLOUT_ID,
                c.EPISODE_ATTEMPT,
                c.EPISODE_ID,
                c.ROLLOUT_ATTEMPTS,
                c.ROLLOUT_OUTCOME,
                c.OUTCOME_SOURCE,
            )
            if k not in attrs
        ]
        if missing:
            problems.append((rule, f"{label(span)}: outcome record without {', '.join(missing)}"))
            continue
        rollout_id, attempt, attempts = (
            attrs[c.ROLLOUT_ID],
            attrs[c.EPISODE_ATTEMPT],
            attrs[c.ROLLOUT_ATTEMPTS],
        )
        outcome, reward = attrs[c.ROLLOUT_OUTCOME], attrs.get(c.REWARD)
        if not isinstance(attempt, int) or attempt < 0 or not isinstance(rollout_id, str):
            problems.append((rule, f"{label(span)}: outcome record with gym.episode.attempt={attempt!r}"))
            continue
        if attrs[c.EPISODE_ID] != episode_id(rollout_id, attempt):
            problems.append(
                (
                    rule,
                    f"{label(span)}: outcome record has gym.episode.id={attrs[c.EPISODE_ID]!r},"
                    f" expected {episode_id(rollout_id, attempt)!r}",
                )
            )
        if not isinstance(attempts, int) or attempts < attempt + 1:
            problems.append(
                (
                    rule,
                    f"{label(span)}: outcome record of attempt {attempt} says gym.rollout.attempts={attempts!r}",
                )
            )
        if outcome == c.OUTCOME_SCORED and not isinstance(reward, (int, float)):
            problems.append((rule, f"{label(span)}: scored outcome record without a numeric gym.reward"))
        elif outcome == c.OUTCOME_UNSCORED and reward is not None:
            problems.append((rule, f"{label(span)}: unscored outcome record with gym.reward={reward}"))
        elif outcome not in (c.OUTCOME_SCORED, c.OUTCOME_UNSCORED):
            problems.append((rule, f"{label(span)}: outcome record with gym.rollout.outcome={outcome!r}"))
        if attrs[c.OUTCOME_SOURCE] not in c.OUTCOME_SOURCES:
            problems.append(
                (rule, f"{label(span)}: outcome record with gym.outcome.source={attrs[c.OUTCOME_SOURCE]!r}")
            )
        # The link to the concluded episode is not required: a record written in another process
        # (under attach()) or for a whole rollout has no local episode span to link to; its
        # identity names the attempt.
    return problems


def check_episode_links(index: SpanIndex) -> list[Problem]:
    problems: list[Problem] = []
    for span in index.spans:
        if span.attributes.get(c.KIND) != c.KIND_EPISODE:
            continue
        relations = {link.attributes.get(c.LINK_RELATION) for link in span.links}
        if span.attributes.get(c.EPISODE_RESTORED) is True:
            if c.RELATION_RESTORE not in relations:
                problems.append(
                    (
                        "episode links",
                        f"{label(span)}: restored episode without a link (relation restore) to the episode it continues",
                    )
                )
        elif (span.attributes.get(c.EPISODE_ATTEMPT) or 0) > 0 and c.RELATION_RETRY not in relations:
            problems.append(
                (
                    "episode links",
                    f"{label(span)}: attempt {span.attributes[c.EPISODE_ATTEMPT]} without a link (relation retry)"
                    " to the previous attempt",
                )
            )
    return problems


def _process(span: SpanData) -> str:
    """The process that recorded ``span``: its service.instance.id, else its service name."""
    return span.service_instance or span.service


def _step_part(number: int, base_numbers: set[int], foreign: bool) -> int:
    """The part of an owner's steps a step number belongs to (docs/outcomes.md, "Step numbers
    across processes"): 0, the owner's own; ``N``, the continuation given the reserved number
    ``N`` (its first step ``N``, its further ones from ``N * STEP_RANGE + 1``). A number below
    ``STEP_RANGE`` is a continuation's first step when it opens a range of further steps, or when
    it was recorded by another process than the owner's (a continuation of one step)."""
    if number >= STEP_RANGE:
        return number // STEP_RANGE
    return number if foreign or number in base_numbers else 0


def _no_owner(span: SpanData, key: str) -> str:
    """How a message names the owner of steps that have none in the input."""
    missing = key.rsplit("/", 1)[-1]
    rollout = span.attributes.get(c.ROLLOUT_ID)
    of = f" of rollout {rollout}" if isinstance(rollout, str) else ""
    return f"the owner that never arrived (span {missing}){of}" if missing else f"no invocation{of}"


def check_numbering(index: SpanIndex) -> list[Problem]:
    """Turn and step numbers increase within each part of an owner that one process recorded.

    A part is the owner's own steps, or one continuation's (a Ray task, an ``attach()`` block):
    continuations run in any order, several in one worker process, each numbering from the step
    number its hand-off reserved, so only the steps of one part are compared. Turns are not
    handed off: the turns of one owner recorded by one process are one part.
    """
    problems: list[Problem] = []
    owners = NUMBERING_OWNERS
    # A span's owner depends on its parent only, and a turn's steps share one.
    owner_below: dict[str | None, SpanData | None] = {}
    for kind, key in ((c.KIND_TURN, c.TURN_NUMBER), (c.KIND_STEP, c.STEP_NUMBER)):
        by_process: dict[tuple[str, str], list[SpanData]] = defaultdict(list)
        for span in index.spans:
            if span.attributes.get(c.KIND) == kind:
                if span.parent_id in owner_below:
                    owner = owner_below[span.parent_id]
                else:
                    owner = owner_below[span.parent_id] = index.gym_ancestor(span, owners)
                if owner is not None:
                    owned_by = owner.span_id
                else:
                    # No owner in the input: its process was killed before the owner ended, or
                    # there is none. The steps below one span that never arrived (one rollout's
                    # agent invocation) are numbered together, never with another rollout's,
                    # which numbers from 1 too (issue 43: [1, 1] from two killed rollouts).
                    owned_by = f"<none>/{span.trace_id}/{index.missing_ancestor(span) or ''}"
                by_process[(owned_by, _process(span))].append(span)
        for (owner_id, process), spans in by_process.items():
            owner = index.by_id.get(owner_id)
            foreign = owner is None or _process(owner) != process
            numbers = [s.attributes.get(key) for s in spans]
            base_numbers = {n // STEP_RANGE for n in numbers if isinstance(n, int) and n >= STEP_RANGE}
            parts: dict[int, list[SpanData]] = defaultdict(list)
            if not base_numbers and (kind != c.KIND_STEP or not foreign):
                parts[0] = spans  # the common case: one part, the owner's own (_step_part says 0)
            else:
                for span, number in zip(spans, numbers, strict=True):
                    if kind == c.KIND_STEP and isinstance(number, int):
                        parts[_step_part(number, base_numbers, foreign)].append(span)
                    else:
                        parts[0].append(span)
            for part, group in sorted(parts.items()):
                shown_numbers = [
                    s.attributes.get(key) for s in sorted(group, key=lambda s: (s.start_ns, s.span_id))
                ]
                ints = [n for n in shown_numbers if isinstance(n, int)]
                if len(ints) == len(shown_numbers) and all(a < b for a, b in itertools.pairwise(ints)):
                    continue
                where = label(owner) if owner else _no_owner(spans[0], owner_id)
                shown = (
                    shown_numbers
                    if len(shown_numbers) <= 12
                    else [*shown_numbers[:10], "...", f"({len(shown_numbers)} in all)"]
                )
                by = f" recorded by {process}" if process else ""
                of = f" (the continuation given step {part})" if part else ""
                problems.append(
                    (
                        f"{kind} numbering",
                        f"{kind} numbers within {where}{of}{by} are {shown}, not increasing",
                    )
                )
    return problems


# The kinds a tree rule may say something of just because they are there: an outcome record (its
# own rule) and a live marker (folded away before the rules, so not expected here).
_ALWAYS_JUDGED = frozenset({c.KIND_OUTCOME, c.KIND_LIVE})


class _Unclear(Exception):
    """What :func:`plainly_clean` leaves to the rules: a parent cycle."""


def plainly_clean(spans: list[SpanData]) -> bool:
    """True only if none of the tree rules (nesting, identity, rewards, outcome records, episode
    links, numbering) can find a problem in ``spans``, one trace each span once; checked in one
    pass over the trace, for the checker that judges 10^5 traces. False says nothing: the rules
    themselves judge the trace.

    Each test is a sufficient condition of one rule, never its statement: the identity below a
    rollout (an episode) holds when every span whose parent has a rollout ID (an attempt) has the
    same; numbering holds when the turns and the steps of each owner recorded by one process
    increase in start order. Anything rarer (an outcome record, a missing owner, a parent cycle, a
    value of an unexpected type) is left to the rules."""
    try:
        return _plainly_clean(spans)
    except _Unclear:
        return False


def _plainly_clean(spans: list[SpanData]) -> bool:
    # Read once per span: local names.
    KIND, ROLLOUT_ID, ATTEMPT = c.KIND, c.ROLLOUT_ID, c.EPISODE_ATTEMPT
    by_id = {s.span_id: s for s in spans}
    # The nearest span with a gym kind at or above a span ID (None: none), shared by its children.
    gym_at: dict[str | None, SpanData | None] = {None: None}
    numbered: dict[tuple[str, str, str], list[tuple[int, str, int]]] = {}
    for span in spans:
        attributes = span.attributes
        kind = attributes.get(KIND)
        if c.HIERARCHY_VIOLATION in attributes:
            return False
        rollout_id = attributes.get(ROLLOUT_ID)
        if type(rollout_id) is not str and (kind == c.KIND_VERIFY or _has_reward(span)):
            return False
        parent = by_id.get(span.parent_id)  # type: ignore[arg-type]
        if parent is not None:
            above = parent.attributes
            if above.get(ROLLOUT_ID) is not None and rollout_id != above[ROLLOUT_ID]:
                return False
            if above.get(ATTEMPT) is not None and attributes.get(ATTEMPT) != above[ATTEMPT]:
                return False
        if kind is None:
            continue
        if (
            type(kind) is not str
            or kind in _ALWAYS_JUDGED
            or (kind not in c.ALL_KINDS and kind not in LEVELS)
        ):
            return False
        if kind == c.KIND_ROLLOUT and rollout_id is None:
            return False
        if kind == c.KIND_EPISODE:
            attempt = attributes.get(ATTEMPT)
            if type(attempt) is not int:
                return False
            restored = attributes.get(c.EPISODE_RESTORED) is True
            if restored or attempt > 0:
                relations = {link.attributes.get(c.LINK_RELATION) for link in span.links}
                if (c.RELATION_RESTORE if restored else c.RELATION_RETRY) not in relations:
                    return False
        up = None
        if parent is not None:
            up = parent if parent.attributes.get(KIND) is not None else _gym_at(span.parent_id, by_id, gym_at)
        if up is not None:
            parent_kind = up.attributes[KIND]
            if type(parent_kind) is not str or parent_kind in _ALWAYS_JUDGED:
                return False
            if parent_kind in LEVELS and kind in LEVELS and not allowed(parent_kind, kind):
                return False
        if kind == c.KIND_STEP or kind == c.KIND_TURN:
            number = attributes.get(c.STEP_NUMBER if kind == c.KIND_STEP else c.TURN_NUMBER)
            if type(number) is not int:
                return False
            owner = up
            for _ in by_id:  # at most one step per span: a cycle ends the walk
                if owner is None or owner.attributes[KIND] in NUMBERING_OWNERS:
                    break
                owner = _gym_at(owner.parent_id, by_id, gym_at)
            if owner is None or owner.attributes[KIND] not in NUMBERING_OWNERS:
                return False
            # The rule parts a group (the continuations another process recorded, each numbering
            # from its reserved step) and asks each part to increase: so it does if the whole does.
            group = (kind, owner.span_id, _process(span))
            numbered.setdefault(group, []).append((span.start_ns, span.span_id, number))
    for group_numbers in numbered.values():
        group_numbers.sort()
        for (_, _, a), (_, _, b) in itertools.pairwise(group_numbers):
            if not a < b:
                return False
    return True


def _gym_at(
    span_id: str | None, by_id: dict[str, SpanData], gym_at: dict[str | None, SpanData | None]
) -> SpanData | None:
    """The nearest span with a gym kind at or above ``span_id`` (None: none); remembered in
    ``gym_at`` for every span walked through."""
    walked = []
    current = span_id
    for _ in range(len(by_id) + 1):
        if current in gym_at:
            found = gym_at[current]
            break
        span = by_id.get(current) if current is not None else None
        if span is None:
            found = None
            break
        walked.append(current)
        if span.attributes.get(c.KIND) is not None:
            found = span
            break
        current = span.parent_id
    else:
        raise _Unclear
    for walked_id in walked:
        gym_at[walked_id] = found
    return found
