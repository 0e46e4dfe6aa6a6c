"""One run as the pictures draw it: a bar per episode in a lane, train steps as bands, the slowest
1 % of rollouts marked, and the figures ``gymtrace stats`` prints.

Lanes (``--lanes``): ``worker`` (the default) packs each process's episodes (``service.name`` and
``service.instance.id``) into as few lanes as keep them from overlapping (in start order, each takes
the lane that freed first, else a new one); an episode spread over processes sits in the lane of
the one that opened it. ``rollout``: a lane per rollout, its attempts one after another.

A rollout only live markers know (``lost``) is a bar to its process's last sign of life; a
sampled-out rollout (``gym.rollout.detail = false``) is its rollout span, without a split.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gymtrace import _constants as c
from gymtrace._model.numbers import read_int
from gymtrace._model.spandata import SpanData
from gymtrace._model.tracefiles import Warn
from gymtrace._read.outcomes import RolloutOutcome, final_outcomes, last_recorded
from gymtrace._read.pictures.reading import RunInput, read_run_input, run_input_of_traces
from gymtrace._read.stats import RunStats, members_of, summarise
from gymtrace._read.timesplit import (
    EpisodeTimes,
    TimeSplit,
    episode_splits,
    episodes_by_rollout,
    has_detail,
    rollout_seconds,
    run_times,
)

LANES_WORKER = "worker"
LANES_ROLLOUT = "rollout"
LANE_CHOICES = (LANES_WORKER, LANES_ROLLOUT)
# The share of rollouts outlined as the slowest (at least one).
SLOWEST_SHARE = 0.01
NO_RUN = "(no run)"


class RunNotFound(ValueError):
    """The run asked for is not in the input (or none was named and it holds several)."""


def run_name(run_id: str | None) -> str:
    return NO_RUN if run_id is None else run_id


def select_run(runs: Iterable[str | None], run_id: str | None) -> str | None:
    """The run to draw: ``run_id`` when the input holds it; without one, the input's only run.
    :class:`RunNotFound` names the runs present otherwise (one line)."""
    present = sorted(runs, key=lambda r: (r is None, r or ""))
    listed = ", ".join(run_name(r) for r in present) or "none"
    if run_id is not None:
        if run_id not in present:
            raise RunNotFound(f"no run {run_id!r} in the input; runs present: {listed}")
        return run_id
    if len(present) > 1:
        raise RunNotFound(f"the input holds {len(present)} runs, name one with --run: {listed}")
    return present[0] if present else None


@dataclass
class Bar:
    """One episode (or a lost or sampled-out rollout's one span of time)."""

    rollout: int  # index into RunView.rollouts
    attempt: int
    start_ns: int
    end_ns: int
    process: tuple[str, str]  # service.name, service.instance.id
    outcome: str  # the episode's, or "lost"
    failure: str | None = None
    restored: bool = False
    split: TimeSplit | None = None
    episode: SpanData | None = None  # None for a lost or sampled-out rollout
    lane: int = -1


@dataclass
class RolloutRow:
    outcome: RolloutOutcome
    start_ns: int
    end_ns: int
    split: TimeSplit | None
    failure: str | None = None  # of its last failed episode, or "lost"
    slowest: bool = False

    @property
    def seconds(self) -> float:
        return max(0, self.end_ns - self.start_ns) / 1e9


@dataclass(frozen=True)
class Band:
    """A train step: ``[start, end)`` across every lane."""

    step: int | None
    policy_version: Any
    start_ns: int
    end_ns: int


@dataclass
class RunView:
    run_id: str | None
    lanes_by: str
    # Every final outcome of the run (the figures and compare read these), and those drawn.
    outcomes: list[RolloutOutcome] = field(default_factory=list)
    rollouts: list[RolloutRow] = field(default_factory=list)
    bars: list[Bar] = field(default_factory=list)
    lanes: list[str] = field(default_factory=list)
    bands: list[Band] = field(default_factory=list)
    stats: RunStats | None = None
    # The stats line's time figures (``_read.timesplit.run_times``): time_split, time_share, p50, p99.
    times: dict[str, Any] = field(default_factory=dict)
    runs_sharing_id: int = 1
    # The parts of every episode's time (the Chrome format draws where each part fell).
    episode_times: EpisodeTimes = field(default_factory=EpisodeTimes)

    @property
    def name(self) -> str:
        return run_name(self.run_id)

    @property
    def start_ns(self) -> int:
        return min((*(b.start_ns for b in self.bars), *(b.start_ns for b in self.bands)), default=0)

    @property
    def end_ns(self) -> int:
        return max((*(b.end_ns for b in self.bars), *(b.end_ns for b in self.bands)), default=0)

    @property
    def slowest(self) -> list[RolloutRow]:
        return sorted((r for r in self.rollouts if r.slowest), key=lambda r: -r.seconds)


def _process(span: SpanData) -> tuple[str, str]:
    return (span.service, span.service_instance)


def _episode_bars(
    index: int, episodes: Sequence[SpanData], splits: Sequence[TimeSplit] | None
) -> Iterable[Bar]:
    final = last_recorded(episodes)
    for n, episode in enumerate(episodes):
        attributes = episode.attributes
        attempt = read_int(attributes.get(c.EPISODE_ATTEMPT), 0)
        if final.get(attempt) is not episode:
            continue  # an attempt number reused: the later episode speaks for it, as in the outcome rule
        failure = attributes.get(c.FAILURE_KIND)
        yield Bar(
            rollout=index,
            attempt=attempt,
            start_ns=episode.start_ns,
            end_ns=episode.end_ns,
            process=_process(episode),
            outcome=str(attributes.get(c.EPISODE_OUTCOME, "")),
            failure=failure if isinstance(failure, str) else None,
            restored=attributes.get(c.EPISODE_RESTORED) is True,
            split=splits[n] if splits is not None else None,
            episode=episode,
        )


def _lost_bar(index: int, outcome: RolloutOutcome, markers: Sequence[SpanData]) -> Bar | None:
    own = [m for m in markers if m.attributes.get(c.ROLLOUT_ID) == outcome.rollout_id]
    if not own:
        return None
    start = min(read_int(m.attributes.get(c.LIVE_STARTED), m.start_ns) for m in own)
    last = max(own, key=lambda m: m.end_ns)
    return Bar(
        index,
        max(0, outcome.attempts - 1),
        start,
        last.end_ns,
        _process(last),
        c.OUTCOME_LOST,
        c.OUTCOME_LOST,
    )


def _pack(bars: list[Bar], lanes_by: str, rollouts: list[RolloutRow]) -> list[str]:
    """Each bar's lane (see the module doc); the lanes' labels."""
    if lanes_by == LANES_ROLLOUT:
        order = sorted(range(len(rollouts)), key=lambda i: (rollouts[i].start_ns, i))
        lane_of = {index: lane for lane, index in enumerate(order)}
        for bar in bars:
            bar.lane = lane_of[bar.rollout]
        return [rollouts[i].outcome.rollout_id for i in order]
    by_process: dict[tuple[str, str], list[Bar]] = defaultdict(list)
    for bar in bars:
        by_process[bar.process].append(bar)
    labels: list[str] = []
    for process in sorted(by_process):
        free: list[tuple[int, int]] = []  # (end of its last bar, lane) of this process's lanes
        first = len(labels)
        for bar in sorted(by_process[process], key=lambda b: (b.start_ns, b.end_ns)):
            if free and free[0][0] <= bar.start_ns:
                _, lane = heapq.heappop(free)
            else:
                lane = len(labels)
                labels.append("")
            bar.lane = lane
            heapq.heappush(free, (bar.end_ns, lane))
        service, instance = process
        name = (service or "(no service)") + (f" {instance[:8]}" if instance else "")
        count = len(labels) - first
        for n in range(first, len(labels)):
            labels[n] = name if count == 1 else f"{name} #{n - first + 1}"
    return labels


def _mark_slowest(rows: list[RolloutRow]) -> None:
    if not rows:
        return
    count = max(1, math.ceil(len(rows) * SLOWEST_SHARE))
    for row in sorted(rows, key=lambda r: -r.seconds)[:count]:
        row.slowest = True


def _failure(outcome: RolloutOutcome, episodes: Sequence[SpanData]) -> str | None:
    """Why a rollout has no reward: its process was lost, or its last failed episode's kind."""
    if outcome.outcome == c.OUTCOME_LOST:
        return c.OUTCOME_LOST
    if outcome.outcome != c.OUTCOME_UNSCORED:
        return None
    failed = [
        e for e in episodes if e.attributes.get(c.EPISODE_OUTCOME) in (c.OUTCOME_FAILED, c.OUTCOME_CANCELLED)
    ]
    if not failed:
        return None
    kind = failed[-1].attributes.get(c.FAILURE_KIND) or failed[-1].attributes.get(c.EPISODE_OUTCOME)
    return str(kind)


def build_view(
    spans: Sequence[SpanData], times: EpisodeTimes, run_id: str | None, *, lanes_by: str = LANES_WORKER
) -> RunView:
    """Run ``run_id`` of ``spans`` (its episodes' parts in ``times``) as the pictures draw it."""
    outcomes = [o for o in final_outcomes(spans) if o.run_id == run_id]
    view = RunView(run_id=run_id, lanes_by=lanes_by, outcomes=outcomes, episode_times=times)
    episodes = episodes_by_rollout(spans)
    markers: dict[str, list[SpanData]] = defaultdict(list)
    for span in spans:
        kind = span.attributes.get(c.KIND)
        if kind == c.KIND_LIVE:
            markers[span.trace_id].append(span)
        elif kind == c.KIND_TRAIN_STEP and span.attributes.get(c.RUN_ID) == run_id:
            step = read_int(span.attributes.get(c.TRAIN_STEP))
            view.bands.append(Band(step, span.attributes.get(c.POLICY_VERSION), span.start_ns, span.end_ns))
    view.bands.sort(key=lambda b: (b.start_ns, b.step if b.step is not None else -1))
    for o in outcomes:
        own = episodes.get((o.trace_id, o.rollout_id), [])
        splits = episode_splits(o.root, own, times)
        index = len(view.rollouts)
        row = RolloutRow(o, 0, 0, None if splits is None else TimeSplit.total_of(splits), _failure(o, own))
        if o.root is not None and (not own or not has_detail(o.root)):
            bars = [
                Bar(
                    index, max(0, o.attempts - 1), o.root.start_ns, o.root.end_ns, _process(o.root), o.outcome
                )
            ]
        elif o.outcome == c.OUTCOME_LOST and not own:
            lost = _lost_bar(index, o, markers.get(o.trace_id, ()))
            bars = [lost] if lost is not None else []
        else:
            bars = list(_episode_bars(index, own, splits))
        if not bars and o.root is None:
            continue  # nothing of it to draw (a record whose rollout is in a file not given)
        row.start_ns = o.root.start_ns if o.root is not None else min(b.start_ns for b in bars)
        row.end_ns = o.root.end_ns if o.root is not None else max(b.end_ns for b in bars)
        view.rollouts.append(row)
        view.bars.extend(bars)
    _mark_slowest(view.rollouts)
    view.lanes = _pack(view.bars, lanes_by, view.rollouts)
    found = summarise(outcomes=outcomes)
    if found:
        view.stats = found[0]
        view.runs_sharing_id = found[0].runs_sharing_id
        members = members_of(found[0], outcomes)
        drawn = {id(r.outcome): r.split for r in view.rollouts}
        view.times = run_times(
            [drawn.get(id(o)) for o in members], [rollout_seconds(o.root) for o in members]
        )
    return view


def read_view(
    paths: Iterable[str | Path], run_id: str | None, *, lanes_by: str = LANES_WORKER, warn: Warn | None = None
) -> RunView:
    """Run ``run_id`` of the files (or directories) ``paths``, read and drawn; :class:`RunNotFound`
    when the input does not hold it (or, with no run named, holds several). ``warn``: told what the
    reader reads past (a file a killed writer cut short is read up to the cut, a foreign file in a
    directory)."""
    return _view_of(read_run_input(paths, run_id=run_id, warn=warn), run_id, lanes_by)


def view_of_traces(
    traces: Iterable[list[SpanData]], run_id: str | None, *, lanes_by: str = LANES_WORKER
) -> RunView:
    """Run ``run_id`` of whole traces given one at a time (Jaeger's search), as :func:`read_view`
    reads and draws it from files."""
    return _view_of(run_input_of_traces(traces, run_id=run_id), run_id, lanes_by)


def _view_of(found: RunInput, run_id: str | None, lanes_by: str) -> RunView:
    chosen = select_run(found.runs, run_id)
    return build_view(found.spans, found.times, chosen, lanes_by=lanes_by)
