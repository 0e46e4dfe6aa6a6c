"""Where an episode's time went: its wall time cut into ``model``, ``tool``, ``env``, ``verify``
and ``other`` (``time_split`` in docs/report.md).

    >>> episode_split(0, 10_000, [(MODEL, 2_000, 5_000), (MODEL, 3_000, 6_000), (TOOL, 4_000, 8_000)])
    TimeSplit(model=4000, tool=2000, env=0, verify=0, other=4000)

Each part is a union of intervals (concurrent or nested calls count once); where parts overlap, the
first of model > tool > env > verify takes the time; every interval is clipped to the episode
(other processes' clocks); ``other`` is what no part covers, so the parts sum to the episode's
duration exactly (integer nanoseconds). Which span is which part: :func:`part_of`. Steps an
aggregating episode only counted have no times: their total, less the steps that are spans, moves
from ``other`` to ``env``. :class:`EpisodeTimes` takes an episode's spans one at a time, by identity.
"""

from __future__ import annotations

import marshal
import math
import operator
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gymtrace import _constants as c
from gymtrace._model.numbers import read_int
from gymtrace._model.spandata import SpanData

# The parts as small integers, in precedence order (an interval list is a flat array of them).
MODEL, TOOL, ENV, VERIFY, OTHER = range(5)
# A step span: env in an environment integration's episode, else no part (an agent's step is its
# model call and tool calls, which count for themselves).
STEP = 5
PARTS = c.SPLIT_PARTS
_CLAIMING = (MODEL, TOOL, ENV, VERIFY)
_START = operator.itemgetter(1)  # of a (part, start, end) interval

_BY_KIND: dict[str, int] = {
    c.KIND_MODEL_CALL: MODEL,
    c.KIND_TOOL_CALL: TOOL,
    c.KIND_SEED_SESSION: ENV,
    c.KIND_VERIFY: VERIFY,
    c.KIND_STEP: STEP,
}
_BY_OPERATION: dict[str, int] = {
    c.OPERATION_CHAT: MODEL,
    c.OPERATION_TEXT_COMPLETION: MODEL,
    c.OPERATION_GENERATE_CONTENT: MODEL,
    c.OPERATION_EXECUTE_TOOL: TOOL,
}


def part_tables() -> tuple[dict[str, int], dict[str, int]]:
    """The part of each ``gym.kind`` and of each ``gen_ai.operation.name`` (:func:`part_of`'s), for
    the native reader."""
    return dict(_BY_KIND), dict(_BY_OPERATION)


def part_of(kind: object, operation: object) -> int | None:
    """The part a span's time belongs to, from its ``gym.kind`` (else its
    ``gen_ai.operation.name``, for another library's model or tool span); None for none."""
    if kind is not None:
        return _BY_KIND.get(kind) if isinstance(kind, str) else None
    return _BY_OPERATION.get(operation) if isinstance(operation, str) else None


@dataclass(frozen=True, slots=True)
class TimeSplit:
    """Nanoseconds per part; they sum to the duration they split."""

    model: int = 0
    tool: int = 0
    env: int = 0
    verify: int = 0
    other: int = 0

    @property
    def total(self) -> int:
        return self.model + self.tool + self.env + self.verify + self.other

    def parts(self) -> tuple[int, int, int, int, int]:
        return (self.model, self.tool, self.env, self.verify, self.other)

    def __add__(self, other: TimeSplit) -> TimeSplit:
        # Spelled out: a reader adds one per episode of a run (a generator over the parts took
        # twice as long).
        return TimeSplit(
            self.model + other.model,
            self.tool + other.tool,
            self.env + other.env,
            self.verify + other.verify,
            self.other + other.other,
        )

    @classmethod
    def total_of(cls, splits: Sequence[TimeSplit]) -> TimeSplit:
        """The sum of ``splits`` (zeros for none); a rollout's one episode is its own sum."""
        if len(splits) == 1:
            return splits[0]
        return sum(splits, cls())

    def seconds(self) -> dict[str, float]:
        """``{part: seconds}``: what ``time_split`` holds in the readers' JSON."""
        return {name: ns / 1e9 for name, ns in zip(PARTS, self.parts(), strict=True)}


def segments(start: int, end: int, intervals: Iterable[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """The episode ``[start, end)`` cut into ``(part, start, end)`` segments, in time order, each
    owned by the first part (by precedence) that has an interval over it, else ``OTHER``. Intervals
    are ``(part, start, end)`` with a part of ``MODEL``..``VERIFY``; they are clipped to the episode."""
    events: list[tuple[int, int, int]] = []
    for part, s, e in intervals:
        s, e = max(s, start), min(e, end)
        if s < e:
            events.append((s, 1, part))
            events.append((e, -1, part))
    events.sort()
    open_ = [0, 0, 0, 0]
    cut: list[tuple[int, int, int]] = []
    at = start
    i = 0
    while i < len(events):
        time = events[i][0]
        if time > at:
            owner = next((p for p in _CLAIMING if open_[p]), OTHER)
            if cut and cut[-1][0] == owner and cut[-1][2] == at:
                cut[-1] = (owner, cut[-1][1], time)
            else:
                cut.append((owner, at, time))
            at = time
        while i < len(events) and events[i][0] == time:
            open_[events[i][2]] += events[i][1]
            i += 1
    if end > at:
        if cut and cut[-1][0] == OTHER and cut[-1][2] == at:
            cut[-1] = (OTHER, cut[-1][1], end)
        else:
            cut.append((OTHER, at, end))
    return cut


def episode_split(
    start: int, end: int, intervals: Iterable[tuple[int, int, int]], env_untimed: int = 0
) -> TimeSplit:
    """The time split of one episode ``[start, end)`` (nanoseconds) from its spans' intervals
    ``(part, start, end)``; ``env_untimed``: environment time known only as a total (aggregated
    steps, see the module doc), moved from ``other`` to ``env`` up to what ``other`` holds. An
    episode that ends before it starts (a broken clock) has a split of zeros."""
    totals = [0, 0, 0, 0, 0]
    if end > start:
        # Most episodes' calls follow one another: then each interval's time is its part's and the
        # rest is other's, with no sweep (the sweep below gives the same, several times slower).
        at = start
        # In order of start (clipped to the episode, starts keep their order).
        for part, s, e in sorted(intervals, key=_START):
            if s < start:
                s = start
            if e > end:
                e = end
            if s >= e:
                continue  # outside the episode, or empty
            if s < at:
                totals = [0, 0, 0, 0, 0]  # two overlap: precedence decides, in the sweep
                for part, s, e in segments(start, end, intervals):
                    totals[part] += e - s
                break
            totals[part] += e - s
            at = e
        else:
            totals[OTHER] = end - start - sum(totals)
    moved = min(max(0, env_untimed), totals[OTHER])
    totals[ENV] += moved
    totals[OTHER] -= moved
    return TimeSplit(*totals)


# -- the spans of every episode, collected one at a time ---------------------------------------------

EpisodeKey = tuple[str, str, int]  # trace ID, rollout ID, attempt
_NONE: array[int] = array("Q")


def episode_key(span: SpanData) -> EpisodeKey | None:
    """The episode a span belongs to, by the identity every span below an episode carries."""
    rollout_id = span.attributes.get(c.ROLLOUT_ID)
    attempt = read_int(span.attributes.get(c.EPISODE_ATTEMPT))
    if not isinstance(rollout_id, str) or attempt is None:
        return None
    return (span.trace_id, rollout_id, attempt)


def _untimed_env(episode: SpanData, step_ns: int) -> int:
    """The aggregated steps of an environment integration's episode that are no span: their
    recorded total (``gym.steps.duration.total_ms``) less the steps that are spans."""
    total_ms = episode.attributes.get(c.STEPS_DURATION_TOTAL_MS)
    if isinstance(total_ms, bool) or not isinstance(total_ms, (int, float)) or not math.isfinite(total_ms):
        return 0
    return max(0, round(total_ms * 1_000_000) - step_ns)


class EpisodeTimes:
    """The part intervals of every episode of the input, by episode key, fed span by span
    (:meth:`add_span`, or :meth:`add` from a reader that decodes only a few fields); a flat array
    of ``part, start, end`` per episode, so a run of a million spans stays small."""

    __slots__ = ("_intervals",)

    def __init__(self) -> None:
        self._intervals: dict[EpisodeKey, array[int]] = {}

    def add(self, key: EpisodeKey, part: int, start: int, end: int) -> None:
        found = self._intervals.get(key)
        if found is None:
            found = self._intervals[key] = array("Q")
        found.extend((part, start, end))

    def add_span(self, span: SpanData) -> None:
        """Count ``span`` for its episode when it is one of the parts (or a step), by its
        ``gym.kind`` (else ``gen_ai.operation.name``), ``gym.rollout.id`` and
        ``gym.episode.attempt``. (A reader that drops a span unread adds its part with :meth:`add`.)"""
        attributes = span.attributes
        part = part_of(attributes.get(c.KIND), attributes.get(c.GEN_AI_OPERATION_NAME))
        if part is None:
            return
        rollout_id = attributes.get(c.ROLLOUT_ID)
        attempt = read_int(attributes.get(c.EPISODE_ATTEMPT))
        if isinstance(rollout_id, str) and attempt is not None:
            self.add((span.trace_id, rollout_id, attempt), part, span.start_ns, span.end_ns)

    def add_spans(self, spans: Iterable[SpanData]) -> EpisodeTimes:
        for span in spans:
            self.add_span(span)
        return self

    def merge(self, other: EpisodeTimes) -> None:
        """Take in what ``other`` collected (another process's part of the input)."""
        for key, flat in other._intervals.items():
            found = self._intervals.get(key)
            if found is None:
                self._intervals[key] = flat
            else:
                found.extend(flat)

    def packed(self) -> dict[EpisodeKey, bytes]:
        """What :meth:`unpacked` takes back, of built-in values (``marshal`` carries it to another
        process in C)."""
        return {key: flat.tobytes() for key, flat in self._intervals.items()}

    @classmethod
    def unpacked(cls, packed: Mapping[EpisodeKey, bytes]) -> EpisodeTimes:
        times = cls()
        for key, raw in packed.items():
            flat = times._intervals[key] = array("Q")
            flat.frombytes(raw)
        return times

    def intervals(self, episode: SpanData) -> tuple[list[tuple[int, int, int]], int]:
        """The intervals of ``episode``'s spans, and the nanoseconds its step spans took. A step is
        env when the episode is an environment integration's (``gym.env.id``), else left out."""
        key = episode_key(episode)
        flat = self._intervals.get(key, _NONE) if key is not None else _NONE
        # (part, start, end) triples cut from the flat array by slices, in C.
        parts = flat[0::3]
        found = list(zip(parts, flat[1::3], flat[2::3], strict=True))
        if STEP not in parts:
            return found, 0
        steps_are_env = c.ENV_ID in episode.attributes
        kept = []
        steps: set[tuple[int, int]] = set()
        for part, start, end in found:
            if part == STEP:
                if not steps_are_env:
                    continue
                part = ENV
                steps.add((start, end))  # once: a file appended to itself holds it twice
            kept.append((part, start, end))
        return kept, sum(end - start for start, end in steps)

    def split(self, episode: SpanData) -> TimeSplit:
        """The time split of ``episode`` (an episode span) from the spans fed so far."""
        intervals, step_ns = self.intervals(episode)
        untimed = _untimed_env(episode, step_ns) if c.ENV_ID in episode.attributes else 0
        return episode_split(episode.start_ns, episode.end_ns, intervals, untimed)


# -- rollouts and runs --------------------------------------------------------------------------------


def has_detail(root: SpanData | None) -> bool:
    """False for a sampled-out rollout's one remaining span (``gym.rollout.detail = false``)."""
    return root is None or root.attributes.get(c.ROLLOUT_DETAIL) is not False


def unique_episodes(spans: Iterable[SpanData]) -> Iterator[SpanData]:
    """The episode spans among ``spans``, each once (a file appended to itself holds it twice)."""
    seen: set[tuple[str, str]] = set()
    for span in spans:
        if span.attributes.get(c.KIND) == c.KIND_EPISODE and (span.trace_id, span.span_id) not in seen:
            seen.add((span.trace_id, span.span_id))
            yield span


def episodes_by_rollout(spans: Iterable[SpanData]) -> dict[tuple[str, str], list[SpanData]]:
    """Episode spans by (trace ID, rollout ID), in start order."""
    found: dict[tuple[str, str], list[SpanData]] = {}
    for episode in unique_episodes(spans):
        rollout_id = episode.attributes.get(c.ROLLOUT_ID)
        if isinstance(rollout_id, str):
            found.setdefault((episode.trace_id, rollout_id), []).append(episode)
    for episodes in found.values():
        episodes.sort(key=lambda s: (s.start_ns, s.span_id))
    return found


def episode_splits(
    root: SpanData | None, episodes: Sequence[SpanData], times: EpisodeTimes
) -> list[TimeSplit] | None:
    """The time split of each of a rollout's episodes; None when it has no episode in the input,
    or was sampled out (``gym.rollout.detail = false``)."""
    if not episodes or not has_detail(root):
        return None
    return [times.split(episode) for episode in episodes]


def rollout_split(
    root: SpanData | None, episodes: Sequence[SpanData], times: EpisodeTimes
) -> TimeSplit | None:
    """A rollout's time split: the sum of its episodes' (every attempt); None as
    :func:`episode_splits` says."""
    splits = episode_splits(root, episodes, times)
    return None if splits is None else TimeSplit.total_of(splits)


def split_json(split: TimeSplit | None) -> dict[str, float] | None:
    return None if split is None else split.seconds()


def percentile(values: Sequence[float], p: float) -> float | None:
    """The nearest-rank ``p``-th percentile (a value that occurred: the smallest with at least
    ``p`` % of the values at or below it); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def rollout_seconds(root: SpanData | None) -> float | None:
    """A rollout's duration: its root span's (None without one in the input)."""
    return None if root is None else max(0, root.end_ns - root.start_ns) / 1e9


def run_times(splits: Iterable[TimeSplit | None], durations: Iterable[float | None]) -> dict[str, Any]:
    """What ``gymtrace stats`` adds per run: the split summed over its rollouts (seconds) and each
    part's share of it, and the p50 / p99 rollout duration (nearest rank)."""
    total = TimeSplit()
    with_split = 0
    for split in splits:
        if split is not None:
            total += split
            with_split += 1
    seconds = [d for d in durations if d is not None]
    whole = total.total
    return {
        "time_split": total.seconds() if with_split else None,
        "time_share": (
            {name: ns / whole for name, ns in zip(PARTS, total.parts(), strict=True)} if whole else None
        ),
        "rollout_seconds_p50": percentile(seconds, 50),
        "rollout_seconds_p99": percentile(seconds, 99),
    }


def rollout_splits(
    spans: Sequence[SpanData],
    outcomes: Iterable[Any],
    times: EpisodeTimes | None = None,
    *,
    by_rollout: Mapping[tuple[str, str], TimeSplit] | None = None,
) -> dict[int, TimeSplit | None]:
    """Per rollout outcome (by ``id()``, as ``_read.training`` keys its rows), its time split,
    from ``spans`` (the episodes; their parts too unless ``times`` was collected elsewhere, as a
    streaming reader does), or looked up in ``by_rollout`` (:func:`splits_by_rollout`'s) if given."""
    if by_rollout is not None:
        return {
            id(o): by_rollout.get((o.trace_id, o.rollout_id)) if has_detail(o.root) else None
            for o in outcomes
        }
    if times is None:
        times = EpisodeTimes().add_spans(spans)
    episodes = episodes_by_rollout(spans)
    return {
        id(o): rollout_split(o.root, episodes.get((o.trace_id, o.rollout_id), ()), times) for o in outcomes
    }


def splits_by_rollout(spans: Sequence[SpanData], times: EpisodeTimes) -> dict[tuple[str, str], TimeSplit]:
    """The time split of every rollout with an episode among ``spans``, by (trace ID, rollout ID):
    what :func:`rollout_splits` gives a rollout that has detail, worked out without its outcome."""
    return {
        key: split
        for key, episodes in episodes_by_rollout(spans).items()
        if (split := rollout_split(None, episodes, times)) is not None
    }


def pack_splits(splits: Mapping[tuple[str, str], TimeSplit]) -> bytes:
    """``splits`` as bytes for :func:`unpack_splits` in another process: the keys, and every part
    in one flat array, by ``marshal``. Pickling 100,000 splits and reading them back took 0.9 s,
    this 0.25 s."""
    parts = array("q")
    for split in splits.values():
        parts.extend(split.parts())
    return marshal.dumps((list(splits), parts.tobytes()))


def unpack_splits(packed: bytes) -> dict[tuple[str, str], TimeSplit]:
    """The splits :func:`pack_splits` packed."""
    keys, raw = marshal.loads(packed)
    parts = array("q")
    parts.frombytes(raw)
    each = iter(parts)
    return dict(zip(keys, map(TimeSplit, each, each, each, each, each), strict=True))


# -- the figures as text (gymtrace stats, the timeline's and the report's headings) ------------------


def seconds_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}s"


def split_text(split: Mapping[str, float] | None, share: Mapping[str, float] | None = None) -> str:
    """``model 1.2s (40%), tool ...``: a time split (seconds per part) and each part's share of it
    (computed from the split when not given), on one line."""
    if not split:
        return "no time split (no episode spans)"
    if share is None:
        whole = math.fsum(split.values())
        share = {name: (value / whole if whole else 0.0) for name, value in split.items()}
    return ", ".join(f"{name} {seconds_text(split[name])} ({share[name]:.0%})" for name in PARTS)


def times_text(times: Mapping[str, Any]) -> str:
    """A run's time figures (:func:`run_times`) on one line."""
    return (
        f"time: {split_text(times.get('time_split'), times.get('time_share'))}; rollout duration"
        f" p50 {seconds_text(times.get('rollout_seconds_p50'))},"
        f" p99 {seconds_text(times.get('rollout_seconds_p99'))}"
    )
