"""``gymtrace import inspect``: Inspect AI eval logs (``.eval`` or ``.json``) as traces.

Mapped exactly as :mod:`gymtrace.integrations.inspect_ai` maps a live eval: the eval is a run
(Inspect's run ID), sample x epoch a rollout (``{task}.{sample}.r{epoch - 1}``), each attempt an
episode. ``error_retries`` are the earlier attempts, failed (``error``, retryable: Inspect re-ran
them); a sample that ended in error is unscored; the reward is the first scorer's value through
Inspect's own ``value_to_float``. Model and tool events become ``chat`` and ``execute_tool`` spans
at their recorded times; the scorers' span is the ``gym.verify`` span. Inspect keeps no times for
the failed attempts: theirs are synthesised.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

from gymtrace import _constants as c
from gymtrace._import.build import (
    Attempt,
    Imported,
    Node,
    conclude,
    episode,
    finish,
    model_call,
    rollout_node,
    run_node,
    tool_call,
)
from gymtrace.integrations.inspect_ai import SampleError, _safe, reward_of

SERVICE = "inspect_ai"
_ERROR_TYPE = f"{SampleError.__module__}.{SampleError.__qualname__}"
# Events that are the structure the spans already show (the scorers' span is the verify span).
_STRUCTURE = frozenset({"span_begin", "span_end", "model", "tool", "score", "sample_init"})


def _ns(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return None
    if isinstance(value, datetime):
        return round(value.timestamp() * 1e9)
    return None


def _logs(paths: Iterable[Path]) -> list[tuple[Path, bool]]:
    """(log file, whether it was found in a directory rather than named)."""
    found: list[tuple[Path, bool]] = []
    for path in paths:
        if path.is_dir():
            found.extend((p, True) for p in sorted(path.iterdir()) if p.suffix in (".eval", ".json"))
        elif path.exists():
            found.append((path, False))
        else:
            raise ValueError(f"{path}: no such file or directory")
    return found


def import_files(paths: Iterable[Path], *, run_id: str | None = None) -> Imported:
    """Every eval log in ``paths`` (files, or directories of logs) as traces: one run per log's
    Inspect run ID, or all in ``run_id``."""
    from inspect_ai.log import read_eval_log

    result = Imported()
    runs: dict[str, tuple[Node, list[Node]]] = {}
    for path, listed in _logs(paths):
        try:
            log = read_eval_log(str(path))
        except Exception as exc:  # Inspect raises many kinds for a file it cannot read
            if not listed:
                raise ValueError(f"{path}: not an Inspect eval log ({exc})") from exc
            # A log directory also holds Inspect's own index files (logs.json): counted, skipped.
            result.unmapped["inspect file in a log directory that is no eval log"] += 1
            continue
        rid = run_id or log.eval.run_id
        if rid not in runs:
            runs[rid] = (
                run_node(rid, start_ns=_ns(log.stats.started_at), end_ns=_ns(log.stats.completed_at)),
                [],
            )
        task = _safe(log.eval.task)
        for sample in log.samples or ():
            runs[rid][1].append(_rollout(rid, task, sample, result))
    for run, rollouts in runs.values():
        finish(run, rollouts, service=SERVICE, result=result)
    return result


def _rollout(run_id: str, task: str, sample: Any, result: Imported) -> Node:
    repeat = max(int(sample.epoch) - 1, 0)
    task_id = f"{task}.{_safe(sample.id)}"
    rollout = rollout_node(run_id, f"{task_id}.r{repeat}", task_id, repeat)
    attempts = []
    for number, error in enumerate(sample.error_retries or ()):
        attempts.append(
            Attempt(
                number,
                episode(rollout, number),
                failure_kind=c.FAILURE_ERROR,
                retryable=True,
                error_type=_ERROR_TYPE,
                message=str(error.message),
            )
        )
    number = len(attempts)
    final = Attempt(
        number, episode(rollout, number, start_ns=_ns(sample.started_at), end_ns=_ns(sample.completed_at))
    )
    _events(final, sample.events or (), result)
    if sample.error is not None:
        final.failure_kind, final.retryable = c.FAILURE_ERROR, False
        final.error_type, final.message = _ERROR_TYPE, str(sample.error.message)
    else:
        scores = sample.scores or {}
        if scores:
            value = next(iter(scores.values())).value
            final.reward = reward_of(value)
            if final.reward is None:
                result.unmapped["inspect score with no single reward (list or dict value)"] += 1
    attempts.append(final)
    conclude(rollout, attempts)
    return rollout


def _events(attempt: Attempt, events: Iterable[Any], result: Imported) -> None:
    node = attempt.node
    scorers: str | None = None
    for index, event in enumerate(events):
        kind = event.event
        if kind == "model":
            _model_call(node, index, event)
        elif kind == "tool":
            _tool_call(node, index, event)
        elif kind == "span_begin" and event.type == "scorers":
            scorers, attempt.verify_start_ns = event.id, _ns(event.timestamp)
        elif kind == "span_end" and scorers is not None and event.id == scorers:
            attempt.verify_end_ns = _ns(event.timestamp)
        elif kind not in _STRUCTURE:
            result.unmapped[f"inspect {kind} event"] += 1


def _model_call(episode_node: Node, index: int, event: Any) -> None:
    provider, _, model = str(event.model).partition("/")
    usage = getattr(event.output, "usage", None)
    node = model_call(
        episode_node,
        f"model_call:{event.uuid or index}",
        model or provider,
        provider=provider if model else None,
        input_tokens=usage.input_tokens if usage is not None else None,
        output_tokens=usage.output_tokens if usage is not None else None,
        start_ns=_ns(event.timestamp),
        end_ns=_ns(event.completed),
    )
    if event.error:
        node.fail("inspect_ai.ModelError", str(event.error))


def _tool_call(episode_node: Node, index: int, event: Any) -> None:
    node = tool_call(
        episode_node,
        f"tool:{event.id or index}",
        str(event.function),
        str(event.id),
        start_ns=_ns(event.timestamp),
        end_ns=_ns(event.completed),
    )
    if event.error is not None:
        node.fail(str(event.error.type), str(event.error.message))
