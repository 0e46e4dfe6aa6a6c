"""One final outcome per rollout, from finished spans.

Every reader of a finished trace (``tree``, ``check``, ``rollouts``, ``stats``, the demo) asks
:func:`final_outcomes`, so they never disagree. Ended spans are immutable: an outcome decided
outside the rollout span is a ``gym.outcome`` record span. Each candidate is one fact for
``_model.outcome_rule.decide``, the function the writer used:

- the candidates are the rollout's root (concluding attempt ``gym.rollout.attempts - 1``) and its
  outcome records (concluding ``gym.episode.attempt``); the highest attempt wins, a record beats the
  root on a tie, and among records the last ended; a ``pending`` root no record concludes stays
  ``pending``; the attempts are the highest ``gym.rollout.attempts`` of all;
- a rollout is keyed by run ID, rollout ID and the trace of its root, so a re-run appended to the
  same file with the same IDs is not mixed into the first.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from time import time_ns
from typing import Any

from gymtrace import _constants as c
from gymtrace._model.numbers import read_int
from gymtrace._model.outcome_rule import (
    Attempt,
    Decision,
    candidate_order,
    concluded,
    decide_candidates,
    fact_of,
)
from gymtrace._model.spandata import SpanData, from_readable, is_marker, normalize
from gymtrace._read.liveview import live_rollouts
from gymtrace._read.timesplit import has_detail

# Where an outcome came from when the rollout root decided it (an outcome record says its own).
SOURCE_ROOT = "root"
# ... and a lost rollout's, from its live markers.
SOURCE_LIVE = "live"


def dedupe(spans: Iterable[Any]) -> list[SpanData]:
    """The spans, each (trace ID, span ID) once: a file appended to itself holds every span twice."""
    seen: set[tuple[str, str]] = set()
    unique = []
    for span in normalize(spans):
        key = (span.trace_id, span.span_id)
        if key not in seen:
            seen.add(key)
            unique.append(span)
    return unique


def is_outcome_record(span: SpanData) -> bool:
    return span.attributes.get(c.KIND) == c.KIND_OUTCOME


def concluded_attempt(candidate: SpanData) -> int:
    """The attempt a candidate concludes: a record names it, a root knows ``attempts - 1``."""
    return concluded(candidate.attributes)


def _span_number(candidate: SpanData) -> int:
    try:
        return int(candidate.span_id, 16)
    except ValueError:
        return 0


def _order(candidate: SpanData) -> tuple[int, ...]:
    return candidate_order(candidate.attributes, candidate.end_ns, _span_number(candidate))


def candidate_fact(candidate: SpanData) -> Attempt:
    """What a rollout root or outcome record says about the attempt it concludes, for the rule."""
    return fact_of(candidate.attributes, _order(candidate))


def decide(candidates: Iterable[SpanData]) -> SpanData | None:
    """The candidate (rollout root or outcome record) that holds the rollout's final outcome: the
    one whose fact the outcome rule takes as the final attempt's."""
    return max(candidates, key=lambda s: (concluded_attempt(s), _order(s)), default=None)


def decision_of(group: RolloutSpans, *, episodes: bool = True) -> Decision | None:
    """The outcome rule over a rollout's root and outcome records (and, unless ``episodes=False``,
    the episode spans that say their attempt failed); None when it has no root and no record."""
    return decide_candidates(
        ((s.attributes, s.end_ns, _span_number(s)) for s in group.candidates),
        (
            (e.attributes.get(c.EPISODE_ATTEMPT), e.attributes.get(c.EPISODE_OUTCOME))
            for e in sorted(group.episodes, key=recorded_order)
        )
        if episodes
        else (),
    )


def recorded_order(episode: SpanData) -> tuple[int, int, str]:
    """The order episodes of one rollout were recorded in: the writer takes an attempt number when
    the episode opens, so of two episodes with one number the later-started is the later record."""
    return (episode.start_ns, episode.end_ns, episode.span_id)


def last_recorded(episodes: Iterable[SpanData]) -> dict[int, SpanData]:
    """Per attempt number, the episode recorded last (see :func:`recorded_order`)."""
    found: dict[int, SpanData] = {}
    for episode in sorted(episodes, key=recorded_order):
        attempt = read_int(episode.attributes.get(c.EPISODE_ATTEMPT))
        if attempt is not None:
            found[attempt] = episode
    return found


@dataclass(frozen=True)
class RolloutOutcome:
    """The final outcome of one rollout, wherever it was recorded."""

    run_id: str | None
    task_id: str | None
    rollout_id: str
    repeat: int | None
    outcome: str  # "scored", "unscored" or "pending"
    reward: float | None  # None unless scored
    attempts: int
    # The service each attempt's episode ran in, by attempt ("" where no episode span is at hand).
    services: tuple[str, ...]
    # "root", or the gym.outcome.source of the outcome record that decided.
    source: str
    trace_id: str
    # The gym.run span this rollout belongs to (its link or ancestor), when the input holds it; it
    # tells apart two runs that share a run ID.
    run_span_id: str | None = None
    # Task executions Ray re-ran inside this rollout's episodes (max_retries, retry_exceptions).
    task_reruns: int = 0
    # The attempt numbers executed in a process that was killed before they ended, and run again
    # under the same number by a later pass (a NeMo Gym resume): lost, kept under their own number.
    lost_attempts: tuple[int, ...] = ()
    # False when the input holds only its summary (gym.rollout.detail=false: head sampling dropped
    # its episodes and steps); its outcome, reward, attempts and duration are exact all the same.
    detail: bool = True
    decided_by: SpanData | None = field(default=None, compare=False, repr=False)
    root: SpanData | None = field(default=None, compare=False, repr=False)

    def as_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "task_id": self.task_id,
            "rollout_id": self.rollout_id,
            "repeat": self.repeat,
            "outcome": self.outcome,
            "reward": self.reward,
            "attempts": self.attempts,
            "services": list(self.services),
            "source": self.source,
            "trace_id": self.trace_id,
            "task_reruns": self.task_reruns,
            "lost_attempts": list(self.lost_attempts),
            "detail": self.detail,
        }


@dataclass
class RolloutSpans:
    """Everything the input holds about one rollout: its roots, outcome records and episodes."""

    run_id: str | None
    rollout_id: str
    trace_id: str
    roots: list[SpanData] = field(default_factory=list)
    records: list[SpanData] = field(default_factory=list)
    episodes: list[SpanData] = field(default_factory=list)
    # Task executions Ray re-ran (``ray.task.attempt >= 1``): a worker died or raised meanwhile.
    reruns: list[SpanData] = field(default_factory=list)

    @property
    def candidates(self) -> list[SpanData]:
        return [*self.roots, *self.records]


def group_rollouts(spans: Iterable[Any]) -> list[RolloutSpans]:
    """Rollout roots, outcome records and episodes grouped by run ID, rollout ID and trace.

    Expects deduplicated spans (:func:`dedupe`). A group without a root joins the one group with a
    root of the same rollout in the same trace (its spans lack the run ID), or else of the same run
    and rollout: an outcome record written under a context that lost the trace still belongs to
    its rollout.
    """
    groups: dict[tuple[str | None, str, str], RolloutSpans] = {}
    kinds = (c.KIND_ROLLOUT, c.KIND_OUTCOME, c.KIND_EPISODE)
    for span in spans:
        attributes = span.attributes
        kind = attributes.get(c.KIND)
        if kind not in kinds:
            attempt = attributes.get(c.RAY_TASK_ATTEMPT)  # read only where present: most spans
            if attempt is None or (read_int(attempt) or 0) < 1:
                continue
        rollout_id = attributes.get(c.ROLLOUT_ID)
        if rollout_id.__class__ is not str:
            continue
        run_id = attributes.get(c.RUN_ID)
        run_id = run_id if run_id.__class__ is str else None
        key = (run_id, rollout_id, span.trace_id)
        group = groups.get(key)
        if group is None:
            group = groups[key] = RolloutSpans(run_id, rollout_id, span.trace_id)
        if kind == c.KIND_ROLLOUT:
            group.roots.append(span)
        elif kind == c.KIND_OUTCOME:
            group.records.append(span)
        elif kind == c.KIND_EPISODE:
            group.episodes.append(span)
        else:
            group.reruns.append(span)
    with_root: dict[tuple[str | None, str], list[RolloutSpans]] = defaultdict(list)
    in_trace: dict[tuple[str, str], list[RolloutSpans]] = defaultdict(list)
    for group in groups.values():
        if group.roots:
            with_root[(group.run_id, group.rollout_id)].append(group)
            in_trace[(group.rollout_id, group.trace_id)].append(group)
    result = []
    for group in groups.values():
        if not group.roots:
            # Same rollout in the same trace (a span that lacks the run ID), else same run and
            # rollout in another trace.
            owners = in_trace.get((group.rollout_id, group.trace_id)) or with_root.get(
                (group.run_id, group.rollout_id), []
            )
            if len(owners) == 1:
                owners[0].records.extend(group.records)
                owners[0].episodes.extend(group.episodes)
                owners[0].reruns.extend(group.reruns)
                continue
        result.append(group)
    return result


def _run_span_ids(spans: list[SpanData]) -> dict[str, str]:
    """For each span below a gym.run span (run-per-trace topology), that run span's ID."""
    # Only a rollout with a parent can be below a run span: in a training run each rollout is the
    # root of its own trace (linked to its run), and no span is mapped by its ID.
    rollouts = [s for s in spans if s.parent_id and s.attributes.get(c.KIND) == c.KIND_ROLLOUT]
    if not rollouts:
        return {}
    by_id = {s.span_id: s for s in spans}
    found: dict[str, str] = {}
    for span in rollouts:
        seen = set()
        parent = by_id.get(span.parent_id) if span.parent_id else None
        while parent is not None and parent.span_id not in seen:
            seen.add(parent.span_id)
            if parent.attributes.get(c.KIND) == c.KIND_RUN:
                found[span.span_id] = parent.span_id
                break
            parent = by_id.get(parent.parent_id) if parent.parent_id else None
    return found


def _run_span_of(root: SpanData | None, ancestors: Mapping[str, str]) -> str | None:
    if root is None:
        return None
    if root.span_id in ancestors:
        return ancestors[root.span_id]
    for link in root.links:
        if link.attributes.get(c.LINK_RELATION) == c.RELATION_RUN:
            return link.span_id
    return None


def _services(episodes: list[SpanData], attempts: int) -> tuple[str, ...]:
    if attempts == 1 and len(episodes) == 1:  # the common case: one attempt, its episode
        attempt = read_int(episodes[0].attributes.get(c.EPISODE_ATTEMPT))
        if attempt == 0:
            return (episodes[0].service,)
    by_attempt: dict[int, str] = {}
    for episode in sorted(episodes, key=lambda s: s.start_ns):
        attempt = read_int(episode.attributes.get(c.EPISODE_ATTEMPT))
        if attempt is not None and attempt >= 0:
            by_attempt.setdefault(attempt, episode.service)
    count = max(attempts, max(by_attempt, default=-1) + 1)
    return tuple(by_attempt.get(a, "") for a in range(count))


def outcome_of(group: RolloutSpans, ancestors: Mapping[str, str] | None = None) -> RolloutOutcome | None:
    """The final outcome of one rollout, or None when the input holds no root and no record."""
    candidates = group.candidates
    # One candidate (a root, nearly every rollout) decides without being compared.
    decider = candidates[0] if len(candidates) == 1 else decide(candidates)
    decision = decision_of(group)
    if decider is None or decision is None:
        return None
    attempts = decision.attempts
    roots = group.roots
    root = (roots[0] if len(roots) == 1 else max(roots, key=lambda s: s.end_ns)) if roots else None
    # Identity: the root's if at hand, else the deciding record's (both carry it).
    identity = root.attributes if root is not None else decider.attributes
    task_id = identity.get(c.TASK_ID)
    return RolloutOutcome(
        run_id=group.run_id,
        task_id=task_id if isinstance(task_id, str) else None,
        rollout_id=group.rollout_id,
        repeat=read_int(identity.get(c.ROLLOUT_REPEAT)),
        outcome=decision.outcome,
        reward=decision.reward,
        attempts=attempts,
        services=_services(group.episodes, attempts),
        source=str(decider.attributes.get(c.OUTCOME_SOURCE, "record"))
        if is_outcome_record(decider)
        else SOURCE_ROOT,
        trace_id=group.trace_id,
        run_span_id=_run_span_of(root, ancestors or {}),
        task_reruns=len(group.reruns),
        detail=has_detail(root),
        decided_by=decider,
        root=root,
    )


def final_outcomes(
    spans: Iterable[Any], *, run_id: str | None = None, data: list[SpanData] | None = None
) -> list[RolloutOutcome]:
    """The final outcome of every rollout in ``spans`` (of run ``run_id`` if given), in start order.
    ``data``: ``dedupe(spans)``, if the caller has it (a reader that reads on from it)."""
    raw = [s if isinstance(s, SpanData) else from_readable(s) for s in spans]
    if data is None:
        data = dedupe(raw)  # without the live markers, which only lost_rollouts reads
    ancestors = _run_span_ids(data)
    outcomes = []
    evidence = _lost_evidence(raw)
    for group in group_rollouts(data):
        if run_id is not None and group.run_id != run_id:
            continue
        found = outcome_of(group, ancestors)
        if found is not None:
            if found.root is not None and found.trace_id in evidence:
                cut, markers = evidence[found.trace_id]
                lost = lost_attempts(cut, markers, found.rollout_id, found.root)
                if lost:
                    found = replace(found, lost_attempts=lost)
            outcomes.append(found)
    # Only a trace with live markers can hold a rollout known from them alone.
    marked = {trace_id for trace_id, (_, markers) in evidence.items() if markers}
    if marked:
        outcomes.extend(lost_rollouts([s for s in raw if s.trace_id in marked], run_id=run_id))

    def started(o: RolloutOutcome) -> tuple[int, str, int, str]:
        first = o.root if o.root is not None else o.decided_by
        return (first.start_ns if first is not None else 0, o.task_id or "", o.repeat or 0, o.rollout_id)

    return sorted(outcomes, key=started)


def _lost_evidence(raw: list[SpanData]) -> dict[str, tuple[list[SpanData], list[SpanData]]]:
    """For each trace with spans cut off from its root or with live markers, those spans and those
    markers (what :func:`lost_attempts` reads). Most traces have neither, and are found so in one
    pass over every span rather than a map per trace."""
    # A span ID in two traces keeps one of them here: its children in the other are looked at
    # again below (interrupted() decides), never taken for whole.
    trace_of = {s.span_id: s.trace_id for s in raw}
    wanted = {
        s.trace_id
        for s in raw
        if (s.parent_id is not None and trace_of.get(s.parent_id) != s.trace_id) or is_marker(s)
    }
    if not wanted:
        return {}
    traces: dict[str, list[SpanData]] = defaultdict(list)
    for span in raw:
        if span.trace_id in wanted:
            traces[span.trace_id].append(span)
    return {
        trace_id: (interrupted(spans), [s for s in spans if is_marker(s)])
        for trace_id, spans in traces.items()
    }


def lost_rollouts(spans: list[SpanData], *, run_id: str | None = None) -> list[RolloutOutcome]:
    """The rollouts ``spans`` know only from live markers whose process is gone (``gymtrace live``
    says ``lost``: killed, so they never ended and recorded no outcome), as outcomes ``lost``."""
    marked = {s.trace_id for s in spans if is_marker(s)}
    if not marked:
        return []
    lost = []
    # Only the traces with markers can hold one (live_rollouts groups whatever it is given).
    spans = [s for s in spans if s.trace_id in marked]
    for live in live_rollouts(spans, now_ns=time_ns(), run_id=run_id):
        if live.state != c.LIVE_LOST:
            continue
        lost.append(
            RolloutOutcome(
                run_id=live.run_id,
                task_id=live.task_id,
                rollout_id=live.rollout_id,
                repeat=None,
                outcome=c.OUTCOME_LOST,
                reward=None,
                attempts=live.attempt + 1,
                services=(),
                source=SOURCE_LIVE,
                trace_id=live.trace_id,
            )
        )
    return lost


def interrupted(trace_spans: list[SpanData]) -> list[SpanData]:
    """The spans of one trace cut off from its root: below a span that is not in the input, the
    span a killed process never ended (its children had ended, so they were exported)."""
    by_id = {s.span_id: s for s in trace_spans}
    if all(s.parent_id is None or s.parent_id in by_id for s in trace_spans):
        return []  # the common case, one look each (a reader asks it of 10^5 traces)
    cut: dict[str, bool] = {}

    def is_cut(span: SpanData) -> bool:
        chain: list[str] = []
        current: SpanData | None = span
        answer = False
        while current is not None:
            if current.span_id in cut:
                answer = cut[current.span_id]
                break
            chain.append(current.span_id)
            if current.parent_id is None:
                break
            if current.parent_id not in by_id:
                answer = True
                break
            current = by_id[current.parent_id]
            if current.span_id in chain:  # a cycle: not this reader's to judge
                break
        for span_id in chain:
            cut[span_id] = answer
        return answer

    return [s for s in trace_spans if not is_marker(s) and is_cut(s)]


def lost_attempts(
    cut: list[SpanData], markers: list[SpanData], rollout_id: str, root: SpanData
) -> tuple[int, ...]:
    """The attempts of ``rollout_id`` that a killed process was running before the pass whose root
    is ``root`` ran it again (NeMo Gym re-runs them under the same attempt number after
    ``+resume_from_cache=true``): the attempt of its interrupted spans (``cut``, of its trace), and
    of its live ``markers`` from a process that never said the rollout ended, all over before
    ``root`` started. A span cut off from the root in the middle of the rollout is a process that
    wrote its file elsewhere, not a lost attempt."""
    lost: set[int] = set()
    for span in cut:
        if span.attributes.get(c.ROLLOUT_ID) == rollout_id and span.end_ns <= root.start_ns:
            attempt = read_int(span.attributes.get(c.EPISODE_ATTEMPT))
            if attempt is not None:
                lost.add(attempt)
    by_process: dict[str, list[SpanData]] = defaultdict(list)
    for span in markers:
        if span.attributes.get(c.ROLLOUT_ID) == rollout_id:
            by_process[span.service_instance or span.service].append(span)
    for markers in by_process.values():
        ended = any(m.attributes.get(c.LIVE_EVENT) == c.LIVE_EVENT_END for m in markers)
        if not ended and max(m.end_ns for m in markers) <= root.start_ns:
            lost.update(
                a for a in (read_int(m.attributes.get(c.EPISODE_ATTEMPT)) for m in markers) if a is not None
            )
    return tuple(sorted(lost))
