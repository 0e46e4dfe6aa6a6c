"""``gymtrace import nemo-gym``: the output of ``gym eval run`` (NeMo Gym 0.7) as traces.

What NeMo Gym writes (``nemo_gym/rollout_collection.py``):

- ``<out>.jsonl``: a row per rollout with a result: its ``_ng_*`` identity, ``reward`` (absent:
  unscored, never a zero) and, with observability on, ``ng_trajectory`` (invocations, turns, model
  and tool calls with their times and tokens);
- ``<out>_failures.jsonl``: a row per failed attempt (``_ng_failure_*``); a resume pass re-runs the
  keys whose failures are neither terminal nor out of attempts, with ``_ng_attempt_index`` = the
  number of earlier failures, and appends to both.

Rollouts, groups and the run ID are named as ``gymtrace.integrations.nemo_gym`` names them, so a run
traced live and imported afterwards lands in the same traces.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gymtrace import _constants as c
from gymtrace._import.build import (
    Attempt,
    Imported,
    Node,
    conclude,
    episode,
    file_time_ns,
    finish,
    invocation,
    model_call,
    rollout_node,
    run_node,
    tool_call,
)
from gymtrace._import.build import seconds_to_ns as _ns
from gymtrace._model.numbers import read_int
from gymtrace.integrations.nemo_gym import (
    RolloutIdentity,
    group_id_for,
    output_passes,
    rollout_identity,
    run_id_for_output,
)

SERVICE = "nemo-gym"
FAILURES_SUFFIX = "_failures.jsonl"
# NeMo Gym's own names for the failure classes that say how to retry (rollout_collection.py).
_TIMEOUT_CLASSES = frozenset({"timeout_exceeded"})
_FAILED_TOOL = frozenset({"failed", "timeout", "cancelled"})


class RecordError(ValueError):
    """A record file could not be read; the message names the file and line."""


def failures_path(rollouts: Path) -> Path:
    """The sidecar NeMo Gym writes beside ``rollouts`` (``nemo_gym.path_utils.failures_path_for``)."""
    return rollouts.with_name(rollouts.stem + FAILURES_SUFFIX)


def _rows(path: Path) -> list[dict[str, Any]]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise RecordError(f"{path}:{number}: not a JSON line ({exc})") from exc
            if not isinstance(row, dict):
                raise RecordError(f"{path}:{number}: not a JSON object")
            rows.append(row)
    return rows


@dataclass
class _Rollout:
    identity: RolloutIdentity
    # (declared attempt, order read, row, is a failure row)
    rows: list[tuple[int, int, dict[str, Any], bool]] = field(default_factory=list)


def _reward(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _main_files(paths: Iterable[Path]) -> list[Path]:
    """The rollouts files given, a sidecar given on its own standing for its rollouts file."""
    mains: list[Path] = []
    for path in paths:
        main = (
            path.with_name(path.name[: -len(FAILURES_SUFFIX)] + ".jsonl")
            if path.name.endswith(FAILURES_SUFFIX)
            else path
        )
        if main not in mains:
            mains.append(main)
    return mains


def import_files(paths: Iterable[Path], *, run_id: str | None = None) -> Imported:
    """Every rollouts file (and its sidecar) in ``paths`` as traces; one run per file unless
    ``run_id`` puts them all in one."""
    result = Imported()
    runs: dict[str, dict[str, _Rollout]] = {}
    origins: dict[str, list[Path]] = {}
    order = 0
    for main in _main_files(paths):
        sidecar = failures_path(main)
        if not main.exists() and not sidecar.exists():
            raise RecordError(f"{main}: no such file (nor its sidecar {sidecar.name})")
        traced = output_passes(main) if run_id is None else None
        if traced is not None:
            # Its spans are already in the live trace, under these IDs: a second copy would read as
            # every attempt recorded twice.
            raise RecordError(
                f"{main}: traced live as run {traced.run_id} ({traced.passes} pass(es)); its trace"
                " is in that run's trace files already. To import it as a separate run, give --run ID"
            )
        rid = run_id or run_id_for_output(main)
        rollouts = runs.setdefault(rid, {})
        origins.setdefault(rid, []).extend((main, sidecar))
        for source, failed in ((main, False), (sidecar, True)):
            if not source.exists():
                continue
            for row in _rows(source):
                identity = rollout_identity(row)
                if identity is None:
                    result.unmapped["nemo-gym row without _ng_task_index"] += 1
                    continue
                entry = rollouts.setdefault(identity.rollout_id, _Rollout(identity))
                entry.rows.append((identity.attempt, order, row, failed))
                order += 1
    for rid, rollouts in runs.items():
        # A task's repeats are one group, as the live integration reads them; its size is how many
        # rollouts of it the output holds (its num_repeats, when the collection finished).
        sizes = Counter(entry.identity.task_id for entry in rollouts.values())
        nodes = [_rollout(rid, entry, result, sizes) for entry in rollouts.values()]
        finish(run_node(rid), nodes, service=SERVICE, result=result, origin_ns=file_time_ns(origins[rid]))
    return result


def _rollout(run_id: str, entry: _Rollout, result: Imported, group_sizes: Mapping[str, int]) -> Node:
    identity = entry.identity
    rollout = rollout_node(run_id, identity.rollout_id, identity.task_id, identity.repeat)
    rollout.attributes[c.GROUP_ID] = group_id_for(run_id, identity.task_id)
    rollout.attributes[c.GROUP_SIZE] = group_sizes[identity.task_id]
    rows = sorted(entry.rows, key=lambda r: (r[0], r[1]))
    if [r[0] for r in rows] != list(range(len(rows))):
        # Repeated or missing attempt numbers (rows written by hand, or a pass that lost its
        # sidecar): attempts are renumbered in that order, and the report says so.
        result.unmapped["nemo-gym rollouts renumbered (gaps or repeats in _ng_attempt_index)"] += 1
    attempts: list[Attempt] = []
    scored_rows = 0
    for number, (_, _, row, failed) in enumerate(rows):
        node = episode(rollout, number)
        done = Attempt(number, node)
        trajectory = row.get("ng_trajectory")
        invocation_failed = None
        if isinstance(trajectory, Mapping):
            invocation_failed = _trajectory(node, trajectory, row, result)
        elif trajectory is not None:
            result.unmapped["nemo-gym ng_trajectory that is not an object"] += 1
        reward = _reward(row.get("reward"))
        if failed:
            failure_class = row.get("_ng_failure_class")
            node.attributes[c.NEMO_GYM_FAILURE_CLASS] = str(failure_class)
            if row.get("_ng_failure_terminal"):
                done.failure_kind, done.retryable = c.FAILURE_TERMINAL, False
            elif failure_class in _TIMEOUT_CLASSES:
                done.failure_kind, done.retryable = c.FAILURE_TIMEOUT, True
            else:
                done.failure_kind, done.retryable = c.FAILURE_INFRASTRUCTURE, True
            done.error_type = str(row.get("_ng_failure_type") or failure_class)
            done.message = str(row.get("_ng_failure_message") or "")
            if reward is not None:
                result.unmapped[
                    "nemo-gym reward on a failures-sidecar row (a failed attempt is never scored)"
                ] += 1
        elif invocation_failed is not None:
            done.failure_kind, done.retryable = c.FAILURE_ERROR, False
            done.error_type, done.message = invocation_failed, "an agent invocation failed"
            if reward is not None:
                result.unmapped["nemo-gym reward of a rollout whose agent invocation failed"] += 1
        else:
            scored_rows += reward is not None
            if scored_rows > 1 and reward is not None:
                # A rollout gets at most one reward: the first result row stands.
                result.unmapped["nemo-gym second result row of one rollout"] += 1
                reward = None
            done.reward = reward
        attempts.append(done)
    conclude(rollout, attempts)
    return rollout


def _trajectory(
    episode_node: Node, record: Mapping[str, Any], row: Mapping[str, Any], result: Imported
) -> str | None:
    """Spans for an ``ng_trajectory`` record under its episode; the error type of a failed
    invocation (which fails the episode), else None."""
    invocations = {
        str(i["invocation_id"]): i
        for i in _items(record, "invocations", result)
        if isinstance(i.get("invocation_id"), str)
    }
    tools = {
        str(t["tool_call_id"]): t
        for t in _items(record, "tool_calls", result)
        if isinstance(t.get("tool_call_id"), str)
    }
    agent_ref = _mapping(row.get("agent_ref"))
    agent_name = agent_ref.get("name") if isinstance(agent_ref.get("name"), str) else None
    nodes: dict[str, Node] = {}
    tool_nodes: dict[str, Node] = {}
    failed: list[str] = []

    def agent(inv_id: str, visiting: frozenset[str] = frozenset()) -> Node:
        if inv_id in nodes:
            return nodes[inv_id]
        inv = invocations[inv_id]
        parent = episode_node
        spawned_by, parent_id = inv.get("spawned_by_tool_call_id"), inv.get("parent_invocation_id")
        if (
            isinstance(spawned_by, str)
            and spawned_by in tools
            and tools[spawned_by].get("invocation_id") not in visiting | {inv_id}
        ):
            parent = tool(spawned_by, visiting | {inv_id})
        elif isinstance(parent_id, str) and parent_id in invocations and parent_id not in visiting | {inv_id}:
            parent = agent(parent_id, visiting | {inv_id})
        node = nodes[inv_id] = invocation(parent, f"invocation:{inv_id}", agent_name, inv_id)
        if inv.get("status") == "failed":
            error = str(inv.get("error_type") or "failed")
            node.fail(error)
            failed.append(error)
        return node

    def tool(tool_id: str, visiting: frozenset[str] = frozenset()) -> Node:
        if tool_id in tool_nodes:
            return tool_nodes[tool_id]
        t = tools[tool_id]
        owner = t.get("invocation_id")
        parent = agent(owner, visiting) if isinstance(owner, str) and owner in invocations else episode_node
        name = t.get("tool_name") if isinstance(t.get("tool_name"), str) else None
        start, end = _times(t)
        node = tool_nodes[tool_id] = tool_call(
            parent, f"tool:{tool_id}", name, tool_id, start_ns=start, end_ns=end
        )
        if t.get("status") in _FAILED_TOOL:
            node.fail(str(t.get("error_type") or t.get("status")))
        return node

    for inv_id in invocations:
        agent(inv_id)
    for tool_id in tools:
        tool(tool_id)
    # Turns and the model calls they reference (by call ID, else response ID).
    owner_of_call: dict[str, Node] = {}
    for inv_id, inv in invocations.items():
        for ref in inv.get("model_calls") or ():
            for key in _ref_keys(ref):
                owner_of_call.setdefault(key, nodes[inv_id])
    for turn in sorted(
        _items(record, "turns", result),
        key=lambda t: (str(t.get("invocation_id")), read_int(t.get("turn_no"), 0)),
    ):
        owner = turn.get("invocation_id")
        parent = nodes[owner] if isinstance(owner, str) and owner in nodes else episode_node
        number = read_int(turn.get("turn_no"), 0)
        node = parent.child(
            c.SPAN_TURN, f"turn:{owner}:{number}", {c.KIND: c.KIND_TURN, c.TURN_NUMBER: number}
        )
        for ref in turn.get("model_calls") or ():
            for key in _ref_keys(ref):
                owner_of_call[key] = node
    only = next(iter(nodes.values())) if len(nodes) == 1 else None
    for index, call in enumerate(_items(record, "model_calls", result)):
        meta = _mapping(call.get("response_metadata"))
        owner = next((owner_of_call[k] for k in _ref_keys({**call, **meta}) if k in owner_of_call), None)
        parent = owner or only or episode_node
        stats = _mapping(call.get("token_stats"))
        start, end = _times(call)
        key = str(call["model_call_id"]) if isinstance(call.get("model_call_id"), str) else str(index)
        node = model_call(
            parent,
            f"model_call:{key}",
            meta.get("model") if isinstance(meta.get("model"), str) else None,
            input_tokens=_count(stats.get("prompt_tokens")),
            output_tokens=_count(stats.get("completion_tokens")),
            cached_input_tokens=_count(stats.get("cached_tokens")),
            start_ns=start,
            end_ns=end,
        )
        if isinstance(meta.get("finish_reason"), str):
            node.attributes[c.GEN_AI_RESPONSE_FINISH_REASONS] = (meta["finish_reason"],)
        if isinstance(meta.get("error_category"), str):
            node.fail(meta["error_category"])
    for gap in _items(record, "gaps", result):
        # What the harness itself could not observe: counted, so the report says the trace lacks it.
        result.unmapped[f"ng_trajectory gap {gap.get('code')}"] += 1
    return failed[0] if failed else None


def _items(record: Mapping[str, Any], name: str, result: Imported) -> list[Mapping[str, Any]]:
    value = record.get(name)
    if value is None:
        return []
    if not isinstance(value, list):
        result.unmapped[f"ng_trajectory.{name} that is not a list"] += 1
        return []
    kept = [item for item in value if isinstance(item, Mapping)]
    if len(kept) != len(value):
        result.unmapped[f"ng_trajectory.{name} item that is not an object"] += len(value) - len(kept)
    return kept


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _ref_keys(ref: Any) -> list[str]:
    if not isinstance(ref, Mapping):
        return []
    return [
        f"{name}:{ref[name]}" for name in ("model_call_id", "response_id") if isinstance(ref.get(name), str)
    ]


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _times(item: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """A model or tool call's recorded start and end (``started_at``/``completed_at`` in Unix
    seconds, or a start and ``duration_ms``)."""
    start, end = _ns(item.get("started_at")), _ns(item.get("completed_at"))
    duration = item.get("duration_ms")
    if (
        start is not None
        and end is None
        and isinstance(duration, (int, float))
        and not isinstance(duration, bool)
    ):
        end = start + round(duration * 1e6)
    return start, end
