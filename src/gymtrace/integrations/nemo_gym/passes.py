"""The passes of ``gym eval run`` over one output: the pass log (which run, which pass each
attempt failed in), the driver's run and its ``/run`` dispatches as rollouts or next attempts, and
the runs of servers-only rollouts (the driver untraced).

NeMo Gym stores nothing between passes: a resume pass and a pass that re-runs what a killed pass
left derive their IDs again from here, so they continue the same traces.
"""

from __future__ import annotations

import contextvars
import json
import os
import secrets
import threading
from collections import Counter
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from time import time_ns
from types import MappingProxyType
from typing import Any, NamedTuple

from opentelemetry import context as otel_context

from gymtrace import attributes as c
from gymtrace import instrumentation
from gymtrace.integrations.nemo_gym.identity import (
    RolloutIdentity,
    group_id_for,
    rollout_identity,
    run_id_for_output,
    span_id_for,
    trace_id_for,
)
from gymtrace.integrations.nemo_gym.options import _options
from gymtrace.integrations.nemo_gym.wire import _read_response, _reward_of

_PASS_LOG_SUFFIX = ".gymtrace-passes.jsonl"


class OutputPasses(NamedTuple):
    """The traced passes of ``gym eval run`` over one output, read from its pass log."""

    run_id: str
    """The run the last fresh pass opened (resume passes continue it)."""
    passes: int
    """How many passes that run has had (fresh pass included)."""
    failed_in: Mapping[tuple[str, int], int]
    """``(rollout ID, attempt)`` -> the pass (0-based) in which that attempt failed."""
    group_sizes: Mapping[str, int] = MappingProxyType({})
    """Task ID (``_ng_task_index``) -> how many rows of it the run's collection holds (its
    ``num_repeats``, times its agents under ``fan_out``): ``gym.group.size`` of its rollouts."""


def pass_log_path(output: str | os.PathLike[str]) -> Path:
    """Where the traced passes of ``gym eval run --output OUTPUT`` are logged: a hidden file beside
    it (NeMo Gym stores nothing between passes; gymtrace keeps what a resume pass needs)."""
    resolved = Path(output).expanduser().resolve()
    return resolved.with_name(f".{resolved.name}{_PASS_LOG_SUFFIX}")


def output_passes(output: str | os.PathLike[str]) -> OutputPasses | None:
    """The traced run of ``output`` (its last fresh pass and the resume passes after it), or
    ``None`` when no traced pass wrote it."""
    try:
        lines = pass_log_path(output).read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    run_id: str | None = None
    passes = 0
    failed: dict[tuple[str, int], int] = {}
    sizes: dict[str, int] = {}
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a line a killed pass left half-written
        if not isinstance(entry, dict):
            continue
        if entry.get("pass") == "fresh" and isinstance(entry.get("run_id"), str):
            run_id, passes, failed, sizes = entry["run_id"], 1, {}, {}
        elif entry.get("pass") == "resume" and run_id is not None:
            passes += 1
        elif isinstance(entry.get("failed"), str) and isinstance(entry.get("attempt"), int) and passes:
            failed[(entry["failed"], entry["attempt"])] = passes - 1
        elif isinstance(entry.get("group_sizes"), dict) and passes:
            sizes = {
                task: size
                for task, size in entry["group_sizes"].items()
                if isinstance(size, int) and not isinstance(size, bool) and size > 0
            }
    return OutputPasses(run_id, passes, failed, MappingProxyType(sizes)) if run_id is not None else None


def _log_pass(output: Path, entry: Mapping[str, Any]) -> None:
    with open(pass_log_path(output), "a", encoding="utf-8") as log:
        log.write(json.dumps(entry) + "\n")


# The driver's run: set by run_from_config for the tasks it starts, read by the /run dispatches (the
# environment server also POSTs to /run, to the agent, and opens no rollout for it).
class _Pass(NamedTuple):
    run_id: str
    number: int  # 0 for the fresh pass, then 1, 2... for each resume pass of its run
    failed_in: dict[tuple[str, int], int]  # (rollout ID, attempt) -> the pass it failed in
    output: Path
    # Task ID -> its rows in the collection (gym.group.size): counted when the fresh pass has
    # preprocessed its rows, before any is dispatched; a resume pass reads them from the pass log.
    group_sizes: dict[str, int]


_driver_run: contextvars.ContextVar[_Pass | None] = contextvars.ContextVar(
    "gymtrace_nemo_gym_run", default=None
)


def _episode_part(attempt: int, number: int) -> str:
    """The span ID part of an attempt in a pass: each pass its own, so a pass that re-runs what a
    killed pass left (NeMo Gym re-dispatches it at the same attempt) never lands in its spans."""
    return f"episode-{attempt}" if number == 0 else f"episode-{attempt}/pass-{number}"


async def _dispatch_run(
    wrapped: Any, args: tuple[Any, ...], kwargs: dict[str, Any], this_pass: _Pass, row: RolloutIdentity
) -> Any:
    """One `/run` POST of the driver as a rollout (attempt 0) or the next attempt of one."""
    from contextlib import ExitStack

    import gymtrace

    run_id = this_pass.run_id
    # A task's repeats are one group (identity.group_id_for); its size is what the collection
    # holds of it, when this pass knows (its fresh pass was traced).
    group: dict[str, Any] = {}
    if row.task_id:
        group["group_id"] = group_id_for(run_id, row.task_id)
        size = this_pass.group_sizes.get(row.task_id)
        if size is not None:
            group["group_size"] = size
    trace_id = trace_id_for(run_id, row.rollout_id)
    rollout_span = span_id_for(run_id, row.rollout_id, "rollout")
    stack = ExitStack()
    try:
        stack.enter_context(instrumentation.use_tracer_provider(_options.provider))
        if row.attempt == 0:
            with instrumentation.pinned_ids(trace_id, rollout_span):
                stack.enter_context(
                    gymtrace.rollout(
                        rollout_id=row.rollout_id, task_id=row.task_id, repeat=row.repeat, **group
                    )
                )
            episode = gymtrace.episode(attempt=0)
        else:
            # A resume pass: NeMo Gym stored nothing, the IDs of the rollout and of the attempt that
            # failed are derived again; the attempt joins that trace, linked to it (relation retry).
            identity: dict[str, str | int] = {
                c.RUN_ID: run_id,
                c.ROLLOUT_ID: row.rollout_id,
                c.TASK_ID: row.task_id,
            }
            if row.repeat is not None:
                identity[c.ROLLOUT_REPEAT] = row.repeat
            if "group_id" in group:
                identity[c.GROUP_ID] = group["group_id"]
            carrier = instrumentation.episode_carrier(
                identity,
                next_attempt=row.attempt,
                trace_id=trace_id,
                rollout_span_id=rollout_span,
                episode_span_id=span_id_for(
                    run_id,
                    row.rollout_id,
                    _episode_part(
                        row.attempt - 1,
                        this_pass.failed_in.get(
                            (row.rollout_id, row.attempt - 1), max(0, this_pass.number - 1)
                        ),
                    ),
                ),
            )
            episode = gymtrace.episode(continue_from=carrier)
        part = _episode_part(row.attempt, this_pass.number)
        with instrumentation.pinned_ids(None, span_id_for(run_id, row.rollout_id, part)):
            stack.enter_context(episode)
    except Exception as exc:  # noqa: BLE001 - telemetry must not break the dispatch
        stack.close()
        instrumentation.report_error("gymtrace.integrations.nemo_gym /run", exc)
        return await wrapped(*args, **kwargs)
    with stack:
        try:
            response = await wrapped(*args, **kwargs)
        except Exception:
            _log_failure(this_pass, row)
            raise
        with instrumentation.guard("gymtrace.integrations.nemo_gym /run response"):
            if response.status >= 400:
                _log_failure(this_pass, row)
                gymtrace.record_failure(message=f"/run answered HTTP {response.status}")
            else:
                reward = _reward_of(await _read_response(response))
                if reward is not None:
                    gymtrace.record_reward(reward)
        return response


def _log_failure(this_pass: _Pass, row: RolloutIdentity) -> None:
    """Which pass an attempt failed in, for the resume pass that links its next attempt to it."""
    with instrumentation.guard("gymtrace.integrations.nemo_gym pass log"):
        _log_pass(this_pass.output, {"failed": row.rollout_id, "attempt": row.attempt})


async def _run_from_config(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """`gym eval run`: a fresh pass is a new gym run; a resume pass continues the run of the last
    fresh pass over the same output (no second run span), as its next pass."""
    import gymtrace

    config: Any = args[0] if args else kwargs.get("config")
    try:
        output = Path(config.output_jsonl_fpath).expanduser().resolve()
        earlier = output_passes(output)
        resume = bool(getattr(config, "resume_from_cache", False)) and output.exists()
        sizes: dict[str, int] = {}
        if resume and earlier is not None:
            run_id, number = earlier.run_id, earlier.passes
            failed_in, sizes = dict(earlier.failed_in), dict(earlier.group_sizes)
        elif resume:
            # An output written before passes were logged: its run is the one derived from its path.
            run_id, number, failed_in = run_id_for_output(output), 1, {}
        else:
            # Its own run, even over an output an earlier pass wrote: never that pass's IDs.
            run_id, number, failed_in = f"{run_id_for_output(output)}-{secrets.token_hex(3)}", 0, {}
        output.parent.mkdir(parents=True, exist_ok=True)
        _log_pass(
            output, {"pass": "resume" if resume else "fresh", "run_id": run_id, "started_ns": time_ns()}
        )
    except Exception as exc:  # noqa: BLE001 - telemetry must not break the run
        instrumentation.report_error("gymtrace.integrations.nemo_gym run_from_config", exc)
        return await wrapped(*args, **kwargs)
    token = _driver_run.set(_Pass(run_id, number, failed_in, output, sizes))
    try:
        if resume:
            ctx = instrumentation.continue_scope(otel_context.Context(), {c.RUN_ID: run_id})
            attached = otel_context.attach(ctx)
            try:
                return await wrapped(*args, **kwargs)
            finally:
                otel_context.detach(attached)
        with instrumentation.use_tracer_provider(_options.provider), gymtrace.run(run_id=run_id):
            return await wrapped(*args, **kwargs)
    finally:
        _driver_run.reset(token)


def _preprocess_rows(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``RolloutCollectionHelper._preprocess_rows_from_config``: a fresh pass's rows, every repeat
    of every task (``num_repeats``, per agent, ``fan_out`` applied), before any is dispatched. How
    many rows each task has is its group's size; the pass log keeps it for the resume passes, which
    dispatch only what is left."""
    rows = wrapped(*args, **kwargs)
    this_pass = _driver_run.get()
    if this_pass is None:
        return rows
    with instrumentation.guard("gymtrace.integrations.nemo_gym group sizes"):
        counts: Counter[str] = Counter()
        for row in rows:
            identity = rollout_identity(row) if isinstance(row, Mapping) else None
            if identity is not None:
                counts[identity.task_id] += 1
        this_pass.group_sizes.clear()
        this_pass.group_sizes.update(counts)
        _log_pass(this_pass.output, {"group_sizes": dict(counts)})
    return rows


class _ServersOnlyRuns:
    """The runs of the rollouts a server opens itself (the driver runs untraced): the driver's pass
    is not on the wire, so a pass is told by its rollouts. A rollout attempt this server already
    opened in the current run starts the next run (a second `gym eval run` sends task 0's rollout 0
    again); a next attempt of a rollout (a resume pass) stays in its run. Each run is named by the
    server and the UTC second its first rollout arrived, with a random suffix."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._run_id: str | None = None
        self._seen: set[tuple[str, int]] = set()

    def run_for(self, identity: RolloutIdentity, server: str | None) -> str:
        key = (identity.rollout_id, identity.attempt)
        with self._lock:
            if self._run_id is None or key in self._seen:
                started = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
                self._run_id = f"{server or 'nemo-gym'}-{started}-{secrets.token_hex(2)}"
                self._seen = set()
            self._seen.add(key)
            return self._run_id


_servers_only_runs = _ServersOnlyRuns()
