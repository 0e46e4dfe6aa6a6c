"""Runs built span by span, at times the test chooses (integer microseconds from a fixed origin),
so the time split, the timeline and the report can be checked against exact figures.

    run = BuiltRun("r1")
    rollout = run.rollout("r1/t1/0", task="t1")
    episode = rollout.episode(0, 1_000)                    # attempt 0, 0..1 ms
    episode.child(c.KIND_MODEL_CALL, 100, 400)
    rollout.end(reward=1.0)
    run.write(tmp_path / "run.jsonl")
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from gymtrace import _constants as c
from gymtrace._model.spandata import LinkData, SpanData, encode_spandata_json

ORIGIN_NS = 1_760_000_000_000_000_000
_ids = itertools.count(1)


def _span_id() -> str:
    return f"{next(_ids):016x}"


def ns(us: int) -> int:
    return ORIGIN_NS + us * 1_000


def _dotted(attributes: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments as attributes: ``gym__env__id`` is ``gym.env.id``."""
    return {k.replace("__", "."): v for k, v in attributes.items()}


class BuiltEpisode:
    def __init__(self, rollout: BuiltRollout, span: SpanData) -> None:
        self.rollout = rollout
        self.span = span

    def child(
        self,
        kind: str | None,
        start_us: int,
        end_us: int,
        *,
        operation: str | None = None,
        service: str | None = None,
        name: str | None = None,
        **attributes: Any,
    ) -> SpanData:
        """A span of this episode (``kind`` None: another library's, known by ``operation``)."""
        attrs: dict[str, Any] = {k: v for k, v in self.span.attributes.items() if k in c.IDENTITY_KEYS}
        if kind is not None:
            attrs[c.KIND] = kind
        if operation is not None:
            attrs[c.GEN_AI_OPERATION_NAME] = operation
        attrs.update(_dotted(attributes))
        span = SpanData(
            trace_id=self.span.trace_id,
            span_id=_span_id(),
            parent_id=self.span.span_id,
            name=name or f"gym.{kind or operation}",
            start_ns=ns(start_us),
            end_ns=ns(end_us),
            attributes=attrs,
            service=service or self.span.service,
            service_instance="" if service else self.span.service_instance,
        )
        self.rollout.run.spans.append(span)
        return span


class BuiltRollout:
    def __init__(
        self, run: BuiltRun, rollout_id: str, task: str, repeat: int, service: str, instance: str
    ) -> None:
        self.run = run
        self.rollout_id = rollout_id
        self.task = task
        self.repeat = repeat
        self.service = service
        self.instance = instance
        self.trace_id = f"{next(_ids):032x}"
        self.root_id = _span_id()
        self.episodes: list[BuiltEpisode] = []

    def identity(self) -> dict[str, Any]:
        return {
            c.RUN_ID: self.run.run_id,
            c.TASK_ID: self.task,
            c.ROLLOUT_ID: self.rollout_id,
            c.ROLLOUT_REPEAT: self.repeat,
        }

    def episode(
        self,
        start_us: int,
        end_us: int,
        *,
        outcome: str = c.OUTCOME_COMPLETED,
        failure: str | None = None,
        reward: float | None = None,
        service: str | None = None,
        instance: str | None = None,
        **attributes: Any,
    ) -> BuiltEpisode:
        attempt = len(self.episodes)
        attrs: dict[str, Any] = {
            **self.identity(),
            c.EPISODE_ATTEMPT: attempt,
            c.EPISODE_ID: self.rollout_id if attempt == 0 else f"{self.rollout_id}-a{attempt}",
            c.KIND: c.KIND_EPISODE,
            c.EPISODE_OUTCOME: outcome,
        }
        if failure is not None:
            attrs[c.FAILURE_KIND] = failure
        if reward is not None:
            attrs[c.REWARD] = reward
        attrs.update(_dotted(attributes))
        span = SpanData(
            trace_id=self.trace_id,
            span_id=_span_id(),
            parent_id=self.root_id,
            name=c.SPAN_EPISODE,
            start_ns=ns(start_us),
            end_ns=ns(end_us),
            attributes=attrs,
            status="ERROR" if outcome == c.OUTCOME_FAILED else "UNSET",
            service=service or self.service,
            service_instance=self.instance if instance is None else instance,
        )
        self.run.spans.append(span)
        episode = BuiltEpisode(self, span)
        self.episodes.append(episode)
        return episode

    def end(
        self, reward: float | None = None, *, detail: bool | None = None, end_us: int | None = None
    ) -> SpanData:
        """The rollout span, around its episodes: scored with ``reward``, else unscored."""
        spans = [e.span for e in self.episodes]
        start = min(s.start_ns for s in spans) - 1_000 if spans else ns(0)
        end = ns(end_us) if end_us is not None else (max(s.end_ns for s in spans) + 1_000 if spans else start)
        attrs: dict[str, Any] = {
            **self.identity(),
            c.KIND: c.KIND_ROLLOUT,
            c.ROLLOUT_ATTEMPTS: max(1, len(spans)),
            c.ROLLOUT_OUTCOME: c.OUTCOME_SCORED if reward is not None else c.OUTCOME_UNSCORED,
        }
        if reward is not None:
            attrs[c.REWARD] = reward
        if detail is not None:
            attrs[c.ROLLOUT_DETAIL] = detail
        span = SpanData(
            trace_id=self.trace_id,
            span_id=self.root_id,
            parent_id=None,
            name=c.SPAN_ROLLOUT,
            start_ns=start,
            end_ns=end,
            attributes=attrs,
            links=(LinkData(self.run.trace_id, self.run.run_span_id, {c.LINK_RELATION: c.RELATION_RUN}),),
            service=self.service,
            service_instance=self.instance,
        )
        self.run.spans.append(span)
        return span


class BuiltRun:
    def __init__(self, run_id: str, *, start_us: int = 0, end_us: int = 10_000_000) -> None:
        self.run_id = run_id
        self.trace_id = f"{next(_ids):032x}"
        self.run_span_id = _span_id()
        self.spans: list[SpanData] = [
            SpanData(
                trace_id=self.trace_id,
                span_id=self.run_span_id,
                parent_id=None,
                name=c.SPAN_RUN,
                start_ns=ns(start_us),
                end_ns=ns(end_us),
                attributes={c.KIND: c.KIND_RUN, c.RUN_ID: run_id},
                service="driver",
            )
        ]

    def rollout(
        self,
        rollout_id: str,
        *,
        task: str = "t1",
        repeat: int = 0,
        service: str = "worker",
        instance: str = "w1",
    ) -> BuiltRollout:
        return BuiltRollout(self, rollout_id, task, repeat, service, instance)

    def train_step(self, step: int, start_us: int, end_us: int) -> SpanData:
        span = SpanData(
            trace_id=f"{next(_ids):032x}",
            span_id=_span_id(),
            parent_id=None,
            name=c.SPAN_TRAIN_STEP,
            start_ns=ns(start_us),
            end_ns=ns(end_us),
            attributes={c.KIND: c.KIND_TRAIN_STEP, c.RUN_ID: self.run_id, c.TRAIN_STEP: step},
            links=(LinkData(self.trace_id, self.run_span_id, {c.LINK_RELATION: c.RELATION_RUN}),),
            service="trainer",
        )
        self.spans.append(span)
        return span

    def lost(
        self, rollout_id: str, start_us: int, last_us: int, *, task: str = "t1", service: str = "worker"
    ) -> None:
        """A rollout whose process died: live markers at its start and its last heartbeat, nothing else."""
        trace_id = f"{next(_ids):032x}"
        for at, event in ((start_us, c.LIVE_EVENT_ROLLOUT), (last_us, c.LIVE_EVENT_HEARTBEAT)):
            self.spans.append(
                SpanData(
                    trace_id=trace_id,
                    span_id=_span_id(),
                    parent_id=None,
                    name=c.SPAN_LIVE,
                    start_ns=ns(at),
                    end_ns=ns(at),
                    attributes={
                        c.KIND: c.KIND_LIVE,
                        c.RUN_ID: self.run_id,
                        c.TASK_ID: task,
                        c.ROLLOUT_ID: rollout_id,
                        c.EPISODE_ATTEMPT: 0,
                        c.LIVE_EVENT: event,
                        c.LIVE_INTERVAL: 1.0,
                        c.LIVE_STARTED: ns(start_us),
                    },
                    service=service,
                )
            )

    def write(self, path: Path, *, mode: str = "w") -> Path:
        """The run as OTLP/JSON lines, one request per span (as a file exporter writes batches)."""
        with open(path, mode) as f:
            for span in self.spans:
                f.write(json.dumps(encode_spandata_json([span])) + "\n")
        return path
