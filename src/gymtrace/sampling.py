"""Head sampling that keeps or drops whole rollouts, consistently in every process.

Example::

    from gymtrace.sampling import RolloutSampler
    gymtrace.configure(sampler=RolloutSampler(0.1, by="task"))   # or GYMTRACE_SAMPLE_RATIO=0.1

The decision for a rollout is a hash of its rollout ID (``by="rollout"``) or of its task ID
(``by="task"``, which keeps or drops a whole GRPO group together). Every span below a rollout
follows the rollout's decision through its parent, across processes too, since the sampled flag
travels in ``traceparent``; a retried attempt or an episode continued hours later from a carrier
is decided by the same hash. Spans outside rollouts (runs, unrelated spans) are always kept.

This module needs the OpenTelemetry SDK (``pip install 'gymtrace[sdk]'``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_ON,
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
)
from opentelemetry.trace import Link, SpanKind, get_current_span
from opentelemetry.util.types import Attributes

from gymtrace import _constants as c
from gymtrace._errors import InvalidArgumentError
from gymtrace._tracing import active_tracer

__all__ = ["RolloutSampler", "keep_rollout"]

_SCALE = float(2**64)


def keep_rollout(key: str, ratio: float) -> bool:
    """The sampling decision for a rollout or task ID: stable across processes and languages."""
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / _SCALE < ratio


class RolloutSampler(Sampler):
    """Keep a ``ratio`` of rollouts, whole, chosen by a hash of the rollout ID or the task ID."""

    def __init__(self, ratio: float, *, by: str = "rollout", fallback: Sampler | None = None) -> None:
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0.0 <= ratio <= 1.0:
            raise InvalidArgumentError(
                f"RolloutSampler: argument 'ratio' must be a number in [0, 1], got {ratio!r}"
            )
        if by not in ("rollout", "task"):
            raise InvalidArgumentError(
                f"RolloutSampler: argument 'by' must be 'rollout' or 'task', got {by!r}"
            )
        self.ratio = float(ratio)
        self.by = by
        # Below a rollout (and outside any): follow the parent; roots outside rollouts are kept.
        self._parent_based = ParentBased(fallback or ALWAYS_ON)

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: Any = None,
    ) -> SamplingResult:
        attrs = attributes or {}
        if attrs.get(c.KIND) == c.KIND_ROLLOUT:
            keep = self._keeps(attrs.get(c.ROLLOUT_ID), attrs.get(c.TASK_ID))
            if keep is not None:
                parent_state = get_current_span(parent_context).get_span_context().trace_state
                return SamplingResult(
                    Decision.RECORD_AND_SAMPLE if keep else Decision.DROP,
                    attributes if keep else None,
                    parent_state,
                )
        return self._parent_based.should_sample(parent_context, trace_id, name, kind, attributes, links)

    def get_description(self) -> str:
        return f"RolloutSampler{{ratio={self.ratio}, by={self.by}}}"

    def _keeps(self, rollout_id: object, task_id: object) -> bool | None:
        """Whether the rollout with these IDs is kept: by its task ID under ``by="task"`` when it
        has one, else by its rollout ID; None without a string ID to decide by."""
        key = (task_id if self.by == "task" else None) or rollout_id
        return keep_rollout(key, self.ratio) if isinstance(key, str) else None


def _decided_in_advance(rollout_id: str, task_id: str | None) -> bool | None:
    """Whether the active provider's sampler keeps a rollout with these IDs, when it is a
    :class:`RolloutSampler` (which decides by the ID alone); None when nothing records or another
    sampler decides at the span. For a caller that opens the rollout itself and would do nothing
    with a rollout sampled out (the Gymnasium integration): it skips the rollout's whole span path.
    """
    tracer = active_tracer()
    sampler = getattr(tracer, "sampler", None)
    if type(sampler) is not RolloutSampler:
        return None
    return sampler._keeps(rollout_id, task_id)
