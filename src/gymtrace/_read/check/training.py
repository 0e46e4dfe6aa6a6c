"""The training rules: what ``gymtrace check`` reports about train steps and what they consumed.

A rollout trained twice, a staleness below zero (a rollout started under a newer version than the
step that consumed it), a group with more members than its ``gym.group.size``: each is a violation.
A consumed rollout ID that no rollout of the input has is a note (it may be sampled out), in
:mod:`.notes`. The joining is :func:`gymtrace._read.training.read_training`'s, as the readers do it.
"""

from __future__ import annotations

from collections.abc import Sequence

from gymtrace import _constants as c
from gymtrace._model.spandata import SpanData
from gymtrace._read.outcomes import RolloutOutcome, final_outcomes
from gymtrace._read.training import Training, read_training, training_problems

Problem = tuple[str, str]


def is_training(spans: Sequence[SpanData]) -> bool:
    """Whether the input holds anything of a training run (train steps, records, groups)."""
    return any(
        s.attributes.get(c.KIND) in (c.KIND_TRAIN_STEP, c.KIND_CONSUMED) or c.GROUP_ID in s.attributes
        for s in spans
    )


def training_of(spans: Sequence[SpanData], outcomes: Sequence[RolloutOutcome] | None = None) -> Training:
    """The training read from deduplicated ``spans`` (and their final outcomes, if at hand)."""
    return read_training(spans, final_outcomes(spans) if outcomes is None else outcomes)


def check_training(spans: Sequence[SpanData], training: Training | None = None) -> list[Problem]:
    """The training violations of deduplicated ``spans`` (none without training spans);
    ``training``: theirs, if the caller read it already."""
    if not is_training(spans):
        return []
    return training_problems(training if training is not None else training_of(spans))
