"""The SDK half of :mod:`gymtrace.sampling`: the sampler itself, which subclasses the SDK's.

Imported on first use of ``gymtrace.sampling.RolloutSampler`` (and by ``configure()``), never by
``import gymtrace.sampling``, which works with opentelemetry-api alone.
"""

from __future__ import annotations

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
from gymtrace._model.errors import InvalidArgumentError
from gymtrace._model.ids import keep_rollout
from gymtrace._scopes.tracing import active_tracer


class RolloutSampler(Sampler):
    """Keep a ``ratio`` of rollouts, whole, chosen by a hash of the rollout ID or the task ID; of
    every other rollout, the summary span its end writes (``gym.rollout.detail=false``) and the
    outcome records that conclude it."""

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
        gym_kind = attrs.get(c.KIND)
        if gym_kind == c.KIND_OUTCOME or (
            gym_kind == c.KIND_ROLLOUT and attrs.get(c.ROLLOUT_DETAIL) is False
        ):
            # What keeps a dropped rollout's figures exact: the summary its end writes, and an
            # outcome record that concludes it (a hand-off), though its parent was not sampled.
            parent_state = get_current_span(parent_context).get_span_context().trace_state
            return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes, parent_state)
        if gym_kind == c.KIND_ROLLOUT:
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


def decided_in_advance(rollout_id: str, task_id: str | None) -> bool | None:
    """Whether the active provider's sampler keeps a rollout with these IDs, when it is a
    :class:`RolloutSampler` (which decides by the ID alone); None when nothing records or another
    sampler decides at the span. For a caller that opens the rollout itself and would do nothing
    with a rollout sampled out: skipping its scopes skips its summary span too, so the readers then
    count only the kept share (the Gymnasium integration opens them, for exact counts).
    """
    tracer = active_tracer()
    sampler = getattr(tracer, "sampler", None)
    if type(sampler) is not RolloutSampler:
        return None
    return sampler._keeps(rollout_id, task_id)
