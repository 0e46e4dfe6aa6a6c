"""The contract checker behind ``gymtrace.testing.check_trace`` and ``gymtrace check FILE``.

Each rule is a rule of the vocabulary docs/concepts.md describes; each message names the rollout or span
it is about. Nesting comes from the level table (``_levels.LEVELS``), so a new level is checked
without touching this module. A rule reports at most :data:`EXAMPLES` examples and then a count, so
a systematic problem in a big trace stays readable. Rollout outcomes are judged by the rule every
reader applies (``_outcomes.py``), so the checker never contradicts ``gymtrace rollouts`` or
``stats``.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from gymtrace import _constants as c
from gymtrace._model.ids import episode_id
from gymtrace._model.outcome_rule import CANCELLED, COMPLETED, FAILED, Attempt, Facts
from gymtrace._model.outcome_rule import decide as decide_outcome
from gymtrace._model.spandata import SpanData, is_marker, normalize
from gymtrace._read.outcomes import (
    RolloutSpans,
    concluded_attempt,
    decide,
    decision_of,
    dedupe,
    final_outcomes,
    group_rollouts,
    is_outcome_record,
    last_recorded,
    recorded_order,
)
from gymtrace._scopes.frame import STEP_RANGE
from gymtrace._scopes.levels import LEVELS, NUMBERING_OWNERS, allowed

# Examples shown per rule before "... and N more".
EXAMPLES = 3

# A problem is (rule, message); the rule groups messages for the examples-and-count limit.
Problem = tuple[str, str]


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


def check_spans(spans: Iterable[Any], *, limit: int | None = EXAMPLES) -> list[str]:
    """The contract violations in ``spans``; at most ``limit`` examples per rule plus a count."""
    raw = normalize(spans)
    data = dedupe(raw)
    index = _Index(data)
    problems: list[Problem] = []
    problems += _check_shared_run_ids(raw, data)
    problems += _check_kinds_and_nesting(index)
    problems += _check_identity_below(index)
    problems += _check_rewards_inside_rollouts(index)
    problems += _check_outcome_records(index)
    problems += _check_rollouts(index)
    problems += _check_episode_links(index)
    problems += _check_numbering(index)
    return _limit(problems, limit)


def _limit(problems: list[Problem], limit: int | None) -> list[str]:
    by_rule: dict[str, list[str]] = defaultdict(list)
    for rule, message in problems:
        by_rule[rule].append(message)
    result = []
    for rule, messages in by_rule.items():
        if limit is None or len(messages) <= limit:
            result += messages
        else:
            result += messages[:limit]
            result.append(f"... and {len(messages) - limit} more: {rule}")
    return result


def _check_shared_run_ids(raw: list[SpanData], data: list[SpanData]) -> list[Problem]:
    """Two runs with one run ID (a re-run appended to the same file), said as exactly that.

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
    duplicated = len(raw) - len(data)
    if duplicated and not any(copies[run_id] > len(spans) for run_id, spans in runs.items()):
        problems.append(
            (
                "duplicate spans",
                f"{duplicated} span(s) appear more than once (same trace and span ID): file appended twice?",
            )
        )
    return problems


def _check_kinds_and_nesting(index: _Index) -> list[Problem]:
    problems: list[Problem] = []
    for span in index.spans:
        kind = span.attributes.get(c.KIND)
        if kind is None:
            continue
        if kind not in c.ALL_KINDS:
            problems.append(("unknown gym.kind", f"{_label(span)}: unknown gym.kind {kind!r}"))
            continue
        parent = index.gym_ancestor(span)
        if parent is not None and kind != c.KIND_OUTCOME:
            parent_kind = parent.attributes.get(c.KIND)
            if parent_kind == c.KIND_OUTCOME:
                problems.append(
                    ("inverted nesting", f"{_label(span)}: {kind} inside an outcome record {_label(parent)}")
                )
            elif parent_kind in LEVELS and kind in LEVELS and not allowed(str(parent_kind), str(kind)):
                problems.append(
                    (
                        "inverted nesting",
                        f"{_label(span)}: inverted nesting, {kind} inside {parent_kind} {_label(parent)}",
                    )
                )
        if c.HIERARCHY_VIOLATION in span.attributes:
            problems.append(
                (
                    "hierarchy violation",
                    f"{_label(span)}: marked gym.hierarchy.violation={span.attributes[c.HIERARCHY_VIOLATION]!r}",
                )
            )
    return problems


def _check_identity_below(index: _Index) -> list[Problem]:
    problems: list[Problem] = []
    for top_kind, key in ((c.KIND_ROLLOUT, c.ROLLOUT_ID), (c.KIND_EPISODE, c.EPISODE_ATTEMPT)):
        for top in index.spans:
            if top.attributes.get(c.KIND) != top_kind:
                continue
            if key not in top.attributes:
                problems.append(("missing identity", f"{_label(top)}: {top_kind} span without {key}"))
                continue
            expected = top.attributes[key]
            for below in index.descendants(top):
                # An outcome record under its rollout names the attempt it concludes, not "none".
                if is_outcome_record(below) and top_kind == c.KIND_ROLLOUT and key == c.EPISODE_ATTEMPT:
                    continue
                if below.attributes.get(key) != expected:
                    got = below.attributes.get(key, "<missing>")
                    problems.append(
                        (
                            f"identity below {top_kind}",
                            f"{_label(below)}: below {top_kind} {_label(top)} it needs {key}={expected!r}, has {got!r}",
                        )
                    )
    return problems


def _has_reward(span: SpanData) -> bool:
    return c.REWARD in span.attributes or any(e.name == c.GEN_AI_EVALUATION_RESULT for e in span.events)


def _check_rewards_inside_rollouts(index: _Index) -> list[Problem]:
    """A reward or a verify span needs a rollout: without one no reader can count it."""
    problems: list[Problem] = []
    for span in index.spans:
        if isinstance(span.attributes.get(c.ROLLOUT_ID), str):
            continue
        if span.attributes.get(c.KIND) == c.KIND_VERIFY:
            problems.append(
                (
                    "reward outside any rollout",
                    f"{_label(span)}: verify span outside any rollout (no {c.ROLLOUT_ID})",
                )
            )
        elif _has_reward(span):
            problems.append(
                (
                    "reward outside any rollout",
                    f"{_label(span)}: reward recorded outside any rollout (no {c.ROLLOUT_ID})",
                )
            )
    return problems


def _check_outcome_records(index: _Index) -> list[Problem]:
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
            problems.append((rule, f"{_label(span)}: outcome record without {', '.join(missing)}"))
            continue
        rollout_id, attempt, attempts = (
            attrs[c.ROLLOUT_ID],
            attrs[c.EPISODE_ATTEMPT],
            attrs[c.ROLLOUT_ATTEMPTS],
        )
        outcome, reward = attrs[c.ROLLOUT_OUTCOME], attrs.get(c.REWARD)
        if not isinstance(attempt, int) or attempt < 0 or not isinstance(rollout_id, str):
            problems.append((rule, f"{_label(span)}: outcome record with gym.episode.attempt={attempt!r}"))
            continue
        if attrs[c.EPISODE_ID] != episode_id(rollout_id, attempt):
            problems.append(
                (
                    rule,
                    f"{_label(span)}: outcome record has gym.episode.id={attrs[c.EPISODE_ID]!r},"
                    f" expected {episode_id(rollout_id, attempt)!r}",
                )
            )
        if not isinstance(attempts, int) or attempts < attempt + 1:
            problems.append(
                (
                    rule,
                    f"{_label(span)}: outcome record of attempt {attempt} says gym.rollout.attempts={attempts!r}",
                )
            )
        if outcome == c.OUTCOME_SCORED and not isinstance(reward, (int, float)):
            problems.append((rule, f"{_label(span)}: scored outcome record without a numeric gym.reward"))
        elif outcome == c.OUTCOME_UNSCORED and reward is not None:
            problems.append((rule, f"{_label(span)}: unscored outcome record with gym.reward={reward}"))
        elif outcome not in (c.OUTCOME_SCORED, c.OUTCOME_UNSCORED):
            problems.append((rule, f"{_label(span)}: outcome record with gym.rollout.outcome={outcome!r}"))
        if attrs[c.OUTCOME_SOURCE] not in c.OUTCOME_SOURCES:
            problems.append(
                (rule, f"{_label(span)}: outcome record with gym.outcome.source={attrs[c.OUTCOME_SOURCE]!r}")
            )
        # The link to the concluded episode is not required: a record written in another process
        # (under attach()) or for a whole rollout has no local episode span to link to; its
        # identity names the attempt.
    return problems


def _check_rollouts(index: _Index) -> list[Problem]:
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
                    f"rollout {rollout_id}: {outcome or 'unfinished'} episode {_label(s)} carries a reward;"
                    " failed episodes are never scored",
                )
            )
        attempt = s.attributes.get(c.EPISODE_ATTEMPT)
        if isinstance(attempt, int) and s.attributes.get(c.EPISODE_ID) != episode_id(rollout_id, attempt):
            problems.append(
                (
                    "episode ID",
                    f"rollout {rollout_id}: episode {_label(s)} has gym.episode.id={s.attributes.get(c.EPISODE_ID)!r},"
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
    what = f"outcome record {_label(decider)}" if is_outcome_record(decider) else "stale rollout root"
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


def awaiting_outcomes(spans: Iterable[Any]) -> list[str]:
    """The rollouts whose outcome is still expected from another process (``pending``): not a
    violation of the contract, but the answer may be in a trace file not given."""
    return [
        f"rollout {o.rollout_id}: pending, its outcome was handed to another process; the outcome"
        " record may be in a file not given (pass every process's file, or the directory)"
        for o in final_outcomes(spans)
        if o.outcome == c.OUTCOME_PENDING
    ]


def rerun_notes(spans: Iterable[Any]) -> list[str]:
    """The rollouts in which Ray re-ran a task (``max_retries``): their attempt was not one clean
    run, which only the worker's ``ray.task`` span says otherwise."""
    return [
        f"rollout {o.rollout_id}: Ray re-ran {o.task_reruns} task(s) of attempt {max(o.attempts - 1, 0)}"
        " (max_retries or retry_exceptions: a worker died or raised); the attempt was not one clean run"
        for o in final_outcomes(spans)
        if o.task_reruns
    ]


def _check_episode_links(index: _Index) -> list[Problem]:
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
                        f"{_label(span)}: restored episode without a link (relation restore) to the episode it continues",
                    )
                )
        elif (span.attributes.get(c.EPISODE_ATTEMPT) or 0) > 0 and c.RELATION_RETRY not in relations:
            problems.append(
                (
                    "episode links",
                    f"{_label(span)}: attempt {span.attributes[c.EPISODE_ATTEMPT]} without a link (relation retry)"
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


def _check_numbering(index: _Index) -> list[Problem]:
    """Turn and step numbers increase within each part of an owner that one process recorded.

    A part is the owner's own steps, or one continuation's (a Ray task, an ``attach()`` block):
    continuations run in any order, several in one worker process, each numbering from the step
    number its hand-off reserved, so only the steps of one part are compared. Turns are not
    handed off: the turns of one owner recorded by one process are one part.
    """
    problems: list[Problem] = []
    owners = NUMBERING_OWNERS
    for kind, key in ((c.KIND_TURN, c.TURN_NUMBER), (c.KIND_STEP, c.STEP_NUMBER)):
        by_process: dict[tuple[str, str], list[SpanData]] = defaultdict(list)
        for span in index.spans:
            if span.attributes.get(c.KIND) == kind:
                owner = index.gym_ancestor(span, owners)
                by_process[(owner.span_id if owner else "<none>", _process(span))].append(span)
        for (owner_id, process), spans in by_process.items():
            owner = index.by_id.get(owner_id)
            foreign = owner is None or _process(owner) != process
            numbers = [s.attributes.get(key) for s in spans]
            base_numbers = {n // STEP_RANGE for n in numbers if isinstance(n, int) and n >= STEP_RANGE}
            parts: dict[int, list[SpanData]] = defaultdict(list)
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
                where = _label(owner) if owner else "no invocation"
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


def lost_notes(spans: Iterable[Any]) -> list[str]:
    """The rollouts whose process died before they ended (``lost``): no outcome, no violation, but
    a pass that did not finish (a resume pass re-runs them)."""
    return [
        f"rollout {o.rollout_id}: lost, its process stopped beating before it ended (killed?); a resume"
        " pass re-runs it"
        for o in final_outcomes(spans)
        if o.outcome == c.OUTCOME_LOST
    ]


def missing_service_notes(spans: Iterable[Any]) -> list[str]:
    """The rollout traces missing a service that took part: a request a NeMo Gym agent sent to a
    server (its ``step`` marker) with no span of that server in the trace, or a span whose parent,
    in the process that called it, is not there. The usual cause: that process wrote its trace
    elsewhere (a relative ``GYMTRACE_FILE`` resolved in another working directory)."""
    by_trace: dict[str, list[SpanData]] = defaultdict(list)
    for span in spans:
        if isinstance(span, SpanData):
            by_trace[span.trace_id].append(span)
    notes = []
    for trace_spans in by_trace.values():
        rollout = next(
            (
                s.attributes[c.ROLLOUT_ID]
                for s in trace_spans
                if isinstance(s.attributes.get(c.ROLLOUT_ID), str)
            ),
            None,
        )
        if rollout is None:
            continue
        present = {s.service for s in trace_spans if not is_marker(s)}
        ids = {s.span_id for s in trace_spans}
        servers = {
            str(s.attributes[c.LIVE_SERVER])
            for s in trace_spans
            if is_marker(s) and isinstance(s.attributes.get(c.LIVE_SERVER), str)
        }
        missing = sorted(servers - present)
        orphans = sum(1 for s in trace_spans if not is_marker(s) and s.parent_id and s.parent_id not in ids)
        if missing:
            notes.append(
                f"rollout {rollout}: no span of {', '.join(missing)}, which took part in it: did that"
                " process write its trace elsewhere (a relative GYMTRACE_FILE)?"
            )
        elif orphans:
            notes.append(
                f"rollout {rollout}: {orphans} span(s) whose parent is not in the input: a process"
                " that took part wrote elsewhere, or was killed before its spans ended"
            )
    return notes
