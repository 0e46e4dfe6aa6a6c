"""The contract checker behind ``gymtrace.testing.check_trace`` and ``gymtrace check FILE``.

:func:`check_spans` runs every rule over a trace, in a fixed order, and reports at most
:data:`EXAMPLES` examples per rule and then a count, so a systematic problem in a big trace stays
readable. The rules live by what they judge: single spans and their nesting (:mod:`.spans`), each
rollout as a whole by the outcome rule every reader applies (:mod:`.rollouts`). What the command
says beside the verdict, which breaks no rule, is in :mod:`.notes`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from gymtrace._model.spandata import SpanData, normalize
from gymtrace._read.check.notes import (
    awaiting_outcomes,
    lost_notes,
    missing_service_notes,
    rerun_notes,
    training_notes,
)
from gymtrace._read.check.rollouts import check_rollouts
from gymtrace._read.check.spans import (
    Problem,
    SpanIndex,
    check_episode_links,
    check_identity_below,
    check_kinds_and_nesting,
    check_numbering,
    check_outcome_records,
    check_rewards_inside_rollouts,
    check_shared_run_ids,
)
from gymtrace._read.check.training import check_training
from gymtrace._read.outcomes import dedupe
from gymtrace._read.training import Training

__all__ = [
    "EXAMPLES",
    "awaiting_outcomes",
    "check_spans",
    "lost_notes",
    "missing_service_notes",
    "rerun_notes",
    "training_notes",
]

# Examples shown per rule before "... and N more".
EXAMPLES = 3


def check_spans(spans: Iterable[Any], *, limit: int | None = EXAMPLES) -> list[str]:
    """The contract violations in ``spans``; at most ``limit`` examples per rule plus a count."""
    raw = normalize(spans)
    return _limit(problems_of(raw, dedupe(raw)), limit)


def problems_of(raw: list[SpanData], data: list[SpanData], training: Training | None = None) -> list[Problem]:
    """Every rule over ``raw`` (the spans, without live markers) and ``data`` (each once), in
    order; ``training``: what :func:`.training.training_of` reads from ``data``, if at hand."""
    index = SpanIndex(data)
    problems: list[Problem] = []
    problems += check_shared_run_ids(raw, data)
    problems += check_kinds_and_nesting(index)
    problems += check_identity_below(index)
    problems += check_rewards_inside_rollouts(index)
    problems += check_outcome_records(index)
    problems += check_rollouts(index)
    problems += check_episode_links(index)
    problems += check_numbering(index)
    problems += check_training(data, training)
    return problems


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
