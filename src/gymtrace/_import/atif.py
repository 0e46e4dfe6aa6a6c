"""``gymtrace import atif``: ATIF trajectories (Harbor, NeMo Gym's exporter) as traces.

Each trajectory (validated by the ``atif`` package's models) is one rollout of one episode: an agent
invocation whose agent steps are ``gym.step`` spans (1, 2, 3...) with their model call (tokens from
the step's metrics) and tool calls; user and system steps are ``gym.record.message`` events. ATIF
holds one timestamp per step at most, so the other times are synthesised. A trajectory is scored by
``extra.reward``, or by the verifier of the Harbor trial it sits in (``<trial>/agent/*.json`` beside
``<trial>/result.json``, which also gives the task, rollout ID and phase times, and fails the
episode on an exception without a reward); otherwise it is unscored. The rollout ID is the
``session_id`` (the file's name when several share one), the task ID ``extra.task_id`` or
``extra.task_name`` (else the rollout ID), the run ID by default
:func:`~gymtrace.integrations.nemo_gym.run_id_for_output` of the trajectories' directory.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping
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
    file_time_ns,
    finish,
    invocation,
    model_call,
    rollout_node,
    run_node,
    tool_call,
)
from gymtrace.integrations.nemo_gym import run_id_for_output

SERVICE = "atif"


def _ns(timestamp: str | None) -> int | None:
    if not timestamp:
        return None
    try:
        return round(datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp() * 1e9)
    except ValueError:
        return None


def _files(paths: Iterable[Path]) -> list[tuple[Path, Path]]:
    """(trajectory file, the directory whose run it belongs to)."""
    found: list[tuple[Path, Path]] = []
    for path in paths:
        if path.is_dir():
            found.extend((p, path) for p in sorted(path.rglob("*.json")))
        elif path.exists():
            found.append((path, path.parent))
        else:
            raise ValueError(f"{path}: no such file or directory")
    return found


def import_files(paths: Iterable[Path], *, run_id: str | None = None) -> Imported:
    try:
        from atif import Trajectory
    except ImportError as exc:
        raise ImportError(
            "gymtrace import atif needs the atif package: pip install 'gymtrace[atif]'"
        ) from exc
    from pydantic import ValidationError

    result = Imported()
    loaded: list[tuple[str, Path, Any]] = []
    for path, directory in _files(paths):
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise ValueError(f"{path}: not JSON ({exc})") from exc
        if not (isinstance(raw, dict) and str(raw.get("schema_version", "")).startswith("ATIF")):
            if not _is_harbor_result(path):  # read with the trajectory it describes
                result.unmapped["atif file that is no ATIF trajectory"] += 1
            continue
        try:
            trajectory = Trajectory.model_validate(raw)
        except ValidationError as exc:
            raise ValueError(f"{path}: not a valid ATIF trajectory ({exc.error_count()} errors)") from exc
        loaded.append((run_id or run_id_for_output(directory), path, trajectory))
    trials = {path: _harbor_trial(path) for _, path, _ in loaded}
    sessions = Counter((rid, t.session_id or path.stem) for rid, path, t in loaded if trials[path] is None)
    runs: dict[str, list[Node]] = {}
    files: dict[str, list[Path]] = {}
    for rid, path, trajectory in loaded:
        files.setdefault(rid, []).append(path)
        trial = trials[path]
        if trial is not None:
            rollout_id = str(trial["trial_name"])
        else:
            session = trajectory.session_id or path.stem
            rollout_id = session if sessions[(rid, session)] == 1 else f"{session}.{path.stem}"
            if rollout_id != session:
                result.unmapped[
                    "atif session_id shared by several files (rollout ID takes the file name)"
                ] += 1
        runs.setdefault(rid, []).append(_rollout(rid, rollout_id, trajectory, trial, result))
    for rid, rollouts in runs.items():
        finish(run_node(rid), rollouts, service=SERVICE, result=result, origin_ns=file_time_ns(files[rid]))
    return result


def _reward(extra: Mapping[str, Any] | None) -> float | None:
    value = (extra or {}).get("reward")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


# -- Harbor's trial directory: <trial>/agent/trajectory.json beside <trial>/result.json ------------
#
# Harbor's TrialResult (harbor/models/trial/result.py): task_name, trial_name, verifier_result
# {rewards: {name: number}}, exception_info {exception_type, exception_message}, started_at,
# finished_at, and agent_execution / verifier {started_at, finished_at}.


def _is_harbor_result(path: Path) -> bool:
    return path.name == "result.json" and (path.parent / "agent").is_dir()


def _harbor_trial(trajectory_path: Path) -> Mapping[str, Any] | None:
    """The Harbor trial result beside a trajectory, if there is one."""
    if trajectory_path.parent.name != "agent":
        return None
    path = trajectory_path.parent.parent / "result.json"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if isinstance(raw, dict) and isinstance(raw.get("trial_name"), str) and raw["trial_name"]:
        return raw
    return None


def _phase(trial: Mapping[str, Any] | None, name: str) -> tuple[int | None, int | None]:
    phase = trial.get(name) if trial is not None else None
    if not isinstance(phase, Mapping):
        return None, None
    return _ns(phase.get("started_at")), _ns(phase.get("finished_at"))


def _rollout(
    run_id: str, rollout_id: str, trajectory: Any, trial: Mapping[str, Any] | None, result: Imported
) -> Node:
    extra = trajectory.extra or {}
    task = (trial or {}).get("task_name") or extra.get("task_id") or extra.get("task_name")
    rollout = rollout_node(run_id, rollout_id, str(task) if task is not None else rollout_id, None)
    start, end = (_ns(trial.get("started_at")), _ns(trial.get("finished_at"))) if trial else (None, None)
    attempt = Attempt(0, episode(rollout, 0, start_ns=start, end_ns=end), reward=_reward(extra))
    if trial is not None:
        _trial_outcome(attempt, trial, result)
    agent = trajectory.agent
    agent_start, agent_end = _phase(trial, "agent_execution")
    agent_node = invocation(
        attempt.node, "invocation", agent.name, rollout_id, start_ns=agent_start, end_ns=agent_end
    )
    number = 0
    for step in trajectory.steps:
        if step.source != "agent":
            agent_node.events.append(
                (
                    c.EVENT_RECORD_MESSAGE,
                    _ns(step.timestamp),
                    {c.RECORD_SOURCE: step.source, c.RECORD_STEP_ID: step.step_id},
                )
            )
            continue
        number += 1
        _step(agent_node, number, step, agent.model_name, result)
    if trajectory.continued_trajectory_ref:
        # Continued in another file (after context summarisation): that file imports as a rollout
        # of its own, not as more of this episode.
        result.unmapped["atif continued_trajectory_ref (the continuation is its own rollout)"] += 1
    if trajectory.subagent_trajectories:
        result.unmapped["atif embedded subagent trajectory"] += len(trajectory.subagent_trajectories)
    conclude(rollout, [attempt])
    return rollout


def _trial_outcome(attempt: Attempt, trial: Mapping[str, Any], result: Imported) -> None:
    """The reward Harbor's verifier gave (``rewards["reward"]``), or the exception that ended the
    trial without one."""
    verifier = trial.get("verifier_result")
    rewards = verifier.get("rewards") if isinstance(verifier, Mapping) else None
    attempt.reward = _reward(rewards if isinstance(rewards, Mapping) else None)
    if isinstance(rewards, Mapping) and attempt.reward is None and rewards:
        result.unmapped["harbor rewards without a numeric 'reward' key"] += 1
    attempt.verify_start_ns, attempt.verify_end_ns = _phase(trial, "verifier")
    exception = trial.get("exception_info")
    if not isinstance(exception, Mapping):
        return
    if attempt.reward is not None:
        # Harbor scores a trial its verifier rewarded even after an agent exception (a timeout):
        # the trace keeps Harbor's score, and the report says an exception went with it.
        result.unmapped["harbor exception in a trial its verifier scored"] += 1
        return
    kind = str(exception.get("exception_type") or "Exception")
    attempt.failure_kind = c.FAILURE_TIMEOUT if "Timeout" in kind else c.FAILURE_ERROR
    attempt.retryable = False
    attempt.error_type, attempt.message = kind, str(exception.get("exception_message") or "")


def _step(agent_node: Node, number: int, step: Any, default_model: str | None, result: Imported) -> None:
    node = agent_node.child(
        c.SPAN_STEP,
        f"step:{step.step_id}",
        {c.KIND: c.KIND_STEP, c.STEP_NUMBER: number},
        start_ns=_ns(step.timestamp),
    )
    metrics = step.metrics
    model_call(
        node,
        "model_call",
        step.model_name or default_model,
        input_tokens=metrics.prompt_tokens if metrics is not None else None,
        output_tokens=metrics.completion_tokens if metrics is not None else None,
        cached_input_tokens=metrics.cached_tokens if metrics is not None else None,
        start_ns=_ns(step.timestamp),
    )
    for call in step.tool_calls or ():
        tool_call(node, f"tool:{call.tool_call_id}", call.function_name, call.tool_call_id)
    for observed in step.observation.results if step.observation is not None else ():
        if observed.subagent_trajectory_ref:
            result.unmapped["atif subagent trajectory reference"] += len(observed.subagent_trajectory_ref)
