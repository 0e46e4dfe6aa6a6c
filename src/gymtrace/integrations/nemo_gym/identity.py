"""NeMo Gym's identity as gymtrace names it: NeMo Gym IDs, rollout keys, run, trace and span IDs.

One mapping from what NeMo Gym sends (``_ng_*`` body fields, ``/ng-rollout/<key>`` prefixes) or
stores (``rollouts.jsonl`` rows, the output path) to gymtrace's IDs, shared by the live integration
and ``gymtrace import nemo-gym``: a run traced live and the same run imported afterwards land in the
same traces. Pure functions, no patching: the importer loads this module without NeMo Gym.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from gymtrace import attributes as c
from gymtrace import instrumentation

NEMO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_PLAIN = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.-")
_ENCODED_PREFIX = "x__"
_ESCAPE = re.compile(r"_([0-9A-F]{2})")
_MAX_ATTEMPT = 1_000_000_000
_MAX_GROUP_ID = 256  # gymtrace's limit for an ID (it travels in baggage)
_SERVER_NAME_ENV = "NEMO_GYM_CONFIG_PATH"  # set by `gym env start` for each server it launches
_KEY = re.compile(r"^(\d+)-(\d+)(?:-a(\d+))?$")
_CLI_PREFIXES = ("ng_", "nemo_gym_")  # NeMo Gym's other console scripts (ng_collect_rollouts, ...)


def to_nemo_id(rollout_id: str) -> str:
    """``rollout_id`` as a NeMo Gym ID (unchanged when it already is one; see the module docs)."""
    if NEMO_ID.fullmatch(rollout_id) and "__" not in rollout_id:
        return rollout_id
    body = "".join(chr(b) if b in _PLAIN else f"_{b:02X}" for b in rollout_id.encode("utf-8"))
    return _ENCODED_PREFIX + body


def from_nemo_id(nemo_id: str) -> str:
    """The gymtrace rollout ID a NeMo Gym ID stands for (the inverse of :func:`to_nemo_id`)."""
    if not nemo_id.startswith(_ENCODED_PREFIX):
        return nemo_id
    body = nemo_id[len(_ENCODED_PREFIX) :]
    raw = bytearray()
    position = 0
    for match in _ESCAPE.finditer(body):
        raw += body[position : match.start()].encode("ascii")
        raw.append(int(match.group(1), 16))
        position = match.end()
    raw += body[position:].encode("ascii")
    return raw.decode("utf-8")


# -- NeMo Gym's own identity, read from what it sends or stores ------------------------------------
#
# One mapping for the live integration and for `gymtrace import nemo-gym`: a run traced live and the
# same run imported afterwards must land in the same traces, so both derive their IDs here.


class RolloutIdentity(NamedTuple):
    """A NeMo Gym rollout as gymtrace names it (docs/contract/fixed-names.md, "NeMo Gym identity")."""

    rollout_id: str
    """``gym.rollout.id``: ``_ng_rollout_id`` when set, else ``"{task}-{rollout}"`` (never the
    attempt-qualified capture key that the ``/ng-rollout/`` prefix carries)."""
    task_id: str
    """``gym.task.id``: ``_ng_task_index`` as text."""
    repeat: int | None
    """``gym.rollout.repeat``: ``_ng_rollout_index``."""
    attempt: int
    """``gym.episode.attempt``: ``_ng_attempt_index``, 0 when absent."""


def _index(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 <= value <= _MAX_ATTEMPT else None
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 10:
        number = int(value)
        return number if number <= _MAX_ATTEMPT else None
    return None


def rollout_identity(fields: Mapping[str, Any]) -> RolloutIdentity | None:
    """The rollout a NeMo Gym body (a ``/run`` request, a ``rollouts.jsonl`` row) belongs to, from
    its ``_ng_*`` fields; ``None`` when it carries no task index (not a NeMo Gym rollout)."""
    task = _index(fields.get(c.NEMO_GYM_BODY_TASK_INDEX))
    if task is None:
        return None
    repeat = _index(fields.get(c.NEMO_GYM_BODY_ROLLOUT_INDEX))
    attempt = _index(fields.get(c.NEMO_GYM_BODY_ATTEMPT_INDEX))
    given = fields.get(c.NEMO_GYM_BODY_ROLLOUT_ID)
    if isinstance(given, str) and given and len(given) <= 256 and given.isprintable():
        rollout_id = given
    else:
        rollout_id = f"{task}-{repeat if repeat is not None else 0}"
    return RolloutIdentity(rollout_id, str(task), repeat, attempt if attempt is not None else 0)


def run_id_for_output(path: str | os.PathLike[str]) -> str:
    """The run ID of a ``gym eval run`` that writes ``path``: the same for every pass over that
    output (a ``+resume_from_cache=true`` rerun continues the run) and for a later import of it.

    NeMo Gym stores nothing between passes, so the ID is derived from the output file's absolute
    path: its stem, for people, and a digest of the path, so two outputs never share a run.
    """
    resolved = Path(path).expanduser().resolve()
    digest = hashlib.sha256(str(resolved).encode("utf-8")).hexdigest()[:12]
    return f"{resolved.stem}-{digest}"


def trace_id_for(run_id: str, rollout_id: str) -> int:
    """The trace of one rollout of one run, the same in every pass and every import: 128 bits of
    SHA-256 over both IDs (never 0, which OpenTelemetry reads as invalid)."""
    return instrumentation.deterministic_id("gymtrace/trace", run_id, rollout_id, size=16)


def span_id_for(run_id: str, rollout_id: str, part: str) -> int:
    """A span ID of one rollout of one run (``part``: ``"rollout"``, ``"episode-0"``, ...), the same
    in every pass: what a resume pass links its next attempt to."""
    return instrumentation.deterministic_id("gymtrace/span", run_id, rollout_id, part, size=8)


def group_id_for(run_id: str, task_id: str) -> str:
    """``gym.group.id`` of a task's rollouts in a run: NeMo Gym repeats each task
    ``num_repeats`` times (the same ``_ng_task_index``, ``_ng_rollout_index`` 0, 1, ...), and those
    repeats are one group. ``"{run}/task-{task}"``: one per task in a run, the same in every process
    and pass that derives it, and different in every other run (each collection numbers its tasks
    from 0 again). A run ID too long for the whole to be an ID (256 characters) is shortened to its
    digest."""
    group = f"{run_id}/task-{task_id}"
    if len(group) <= _MAX_GROUP_ID:
        return group
    return f"{hashlib.sha256(run_id.encode('utf-8')).hexdigest()[:24]}/task-{task_id}"


def process_service_name(
    argv: list[str] | None = None, environ: Mapping[str, str] | None = None
) -> str | None:
    """The service name of a NeMo Gym process: its server's name for a server ``gym env start``
    launched, ``gym-eval-run`` (the command, joined) for the CLI; ``None`` for any other process."""
    environ = os.environ if environ is None else environ
    argv = sys.argv if argv is None else argv
    server = environ.get(_SERVER_NAME_ENV)
    if server:
        return server
    program = Path(argv[0]).name if argv and argv[0] else ""
    if program == "gym":
        words = [w for w in argv[1:3] if re.fullmatch(r"[a-z][a-z0-9_-]*", w)]
        return "-".join(["gym", *words])
    if program.startswith(_CLI_PREFIXES):
        return program
    return None


def _attributes(identity: RolloutIdentity) -> dict[str, str | int]:
    values: dict[str, str | int] = {c.ROLLOUT_ID: identity.rollout_id}
    if identity.task_id:
        values[c.TASK_ID] = identity.task_id
    if identity.repeat is not None:
        values[c.ROLLOUT_REPEAT] = identity.repeat
    values[c.EPISODE_ATTEMPT] = identity.attempt
    values[c.EPISODE_ID] = instrumentation.episode_id(identity.rollout_id, identity.attempt)
    return values


def identity_from_key(key: str) -> RolloutIdentity | None:
    """The rollout a ``/ng-rollout/<key>/`` capture key names: ``"{task}-{rollout}"`` with
    ``-a{n}`` after attempt 0, or an explicit ``_ng_rollout_id`` (whose task is not in the key)."""
    match = _KEY.fullmatch(key)
    if match:
        task, repeat, attempt = match.groups()
        return RolloutIdentity(f"{task}-{repeat}", task, int(repeat), int(attempt or 0))
    if not NEMO_ID.fullmatch(key) or len(key) > 256:
        return None
    explicit = re.fullmatch(r"(.+)-a(\d{1,9})", key)
    if explicit:
        return RolloutIdentity(explicit.group(1), "", None, int(explicit.group(2)))
    return RolloutIdentity(key, "", None, 0)


# The driver's run: set by run_from_config for the tasks it starts, read by the /run dispatches (the
