"""``gymtrace live``: the open rollouts, from their live markers, as running, stalled or lost.

Example::

    $ gymtrace live traces/ --stalled-after 30
    run      task  rollout  attempt  state    age     idle    step  service
    run-1    t3    t3-r0    1        stalled  312.4s  301.9s  7     env-worker (5b1c…)

A rollout is open while its trace holds ``gym.live`` markers (``_scopes/live.py``) and neither its
rollout span nor its ``end`` marker. Read at ``now``, it is ``lost`` after three heartbeat intervals
with nothing of it (its process is gone), ``stalled`` when alive but without progress for
``--stalled-after`` seconds (no span ended, no step started) or past its episode's ``timeout=``
(``gym.live.overdue``), else ``running``. ``step`` is the last step started: where it hangs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from gymtrace import _constants as c
from gymtrace._model.numbers import read_int
from gymtrace._model.spandata import SpanData, is_marker

# A rollout with no heartbeat for this many intervals is lost (its process is gone).
LOST_AFTER_BEATS = 3
# Seconds without progress after which a live rollout reads stalled, unless --stalled-after says.
DEFAULT_STALLED_AFTER = 60.0


@dataclass(frozen=True)
class LiveRollout:
    """One open rollout; ``--json`` prints these keys (fixed: docs/contract/fixed-names.md)."""

    run_id: str | None
    task_id: str | None
    rollout_id: str
    attempt: int
    state: str
    age_s: float
    idle_s: float
    step: int
    service: str
    trace_id: str = field(default="", compare=False)  # not in --json: the fixed keys above

    def as_json(self) -> dict[str, Any]:
        body = asdict(self)
        del body["trace_id"]
        return body


def live_rollouts(
    spans: Iterable[SpanData],
    *,
    now_ns: int,
    stalled_after: float = DEFAULT_STALLED_AFTER,
    run_id: str | None = None,
) -> list[LiveRollout]:
    """The open rollouts among ``spans`` (markers and whatever else of their traces was read)."""
    by_trace: dict[str, list[SpanData]] = defaultdict(list)
    for span in spans:
        by_trace[span.trace_id].append(span)
    found: list[LiveRollout] = []
    for trace_spans in by_trace.values():
        markers = sorted((s for s in trace_spans if is_marker(s)), key=lambda s: s.end_ns)
        by_rollout: dict[str, list[SpanData]] = defaultdict(list)
        for marker in markers:
            rollout_id = marker.attributes.get(c.ROLLOUT_ID)
            if isinstance(rollout_id, str):
                by_rollout[rollout_id].append(marker)
        for rollout_id, own in by_rollout.items():
            rest = [
                s
                for s in trace_spans
                if not is_marker(s) and s.attributes.get(c.ROLLOUT_ID) in (rollout_id, None)
            ]
            if any(s.attributes.get(c.KIND) == c.KIND_ROLLOUT for s in rest) or any(
                m.attributes.get(c.LIVE_EVENT) == c.LIVE_EVENT_END for m in own
            ):
                continue  # it ended: the readers of finished traces take it from here
            rollout = _read(rollout_id, own, rest, now_ns, stalled_after, trace_spans[0].trace_id)
            if run_id is None or rollout.run_id == run_id:
                found.append(rollout)
    return sorted(found, key=lambda r: (r.run_id or "", r.task_id or "", r.rollout_id))


def _read(
    rollout_id: str,
    markers: list[SpanData],
    rest: list[SpanData],
    now_ns: int,
    stalled_after: float,
    trace_id: str = "",
) -> LiveRollout:
    # A step marker (a NeMo Gym agent's request going out) says where the rollout is, not whether
    # its process lives: the heartbeats of the rollout's own process say that.
    requests = [m for m in markers if m.attributes.get(c.LIVE_EVENT) == c.LIVE_EVENT_STEP]
    markers = [m for m in markers if m.attributes.get(c.LIVE_EVENT) != c.LIVE_EVENT_STEP] or markers
    last = markers[-1]
    interval = float(last.attributes.get(c.LIVE_INTERVAL) or 0.0)
    started = read_int(last.attributes.get(c.LIVE_STARTED), markers[0].start_ns)
    # Progress: a span of the rollout ended, a marker of a start, or a heartbeat with a new step.
    progress = max((s.end_ns for s in rest), default=0)
    step = 0
    for marker in markers:
        new_step = read_int(marker.attributes.get(c.LIVE_STEP), 0)
        if marker.attributes.get(c.LIVE_EVENT) != c.LIVE_EVENT_HEARTBEAT or new_step != step:
            progress = max(progress, marker.end_ns)
        step = new_step
    steps = [s for s in rest if s.attributes.get(c.KIND) == c.KIND_STEP and s.start_ns > last.end_ns]
    if steps:  # steps ended after the last marker: the newest is further on
        step = read_int(max(steps, key=lambda s: s.start_ns).attributes.get(c.STEP_NUMBER), step)
    service = last.service
    instance = last.service_instance or str(last.attributes.get(c.SERVICE_INSTANCE_ID, ""))
    if requests:
        newest = requests[-1]
        progress = max(progress, newest.end_ns)
        step = read_int(newest.attributes.get(c.LIVE_STEP), step) or step
        server = newest.attributes.get(c.LIVE_SERVER)
        if (
            isinstance(server, str)
            and server
            and not any(
                s.start_ns >= newest.end_ns and s.end_ns > newest.end_ns and c.KIND in s.attributes
                for s in rest
            )
        ):
            # No gym span of the rollout that began since that request went out has ended (the
            # server's own HTTP plumbing may have): it hangs there. Earlier work does not count: a
            # server ends its span of the previous request after sending the answer, which on a
            # loaded machine can be after the client sent the next one.
            service, instance = server, ""
    seen = max(last.end_ns, progress)
    attempt = max(read_int(s.attributes.get(c.EPISODE_ATTEMPT), 0) for s in [*markers, *rest])
    # Past its timeout, an attempt stays overdue: any of its markers says so. The deadline's own
    # beat is said the moment it passes, so on a loaded machine the rollout's first marker (which
    # never carries it) can come after it.
    overdue = any(
        m.attributes.get(c.LIVE_OVERDUE) and read_int(m.attributes.get(c.EPISODE_ATTEMPT), 0) == attempt
        for m in markers
    )
    idle_s = max(0.0, (now_ns - progress) / 1e9)
    if interval > 0 and now_ns - seen > LOST_AFTER_BEATS * interval * 1e9:
        state = c.LIVE_LOST
    elif overdue or idle_s > stalled_after:
        state = c.LIVE_STALLED
    else:
        state = c.LIVE_RUNNING
    run = last.attributes.get(c.RUN_ID)
    task = last.attributes.get(c.TASK_ID)
    return LiveRollout(
        run_id=run if isinstance(run, str) else None,
        task_id=task if isinstance(task, str) else None,
        rollout_id=rollout_id,
        attempt=attempt,
        state=state,
        age_s=round(max(0.0, (now_ns - started) / 1e9), 3),
        idle_s=round(idle_s, 3),
        step=step,
        service=service + (f" ({instance[:8]})" if instance else ""),
        trace_id=trace_id,
    )
