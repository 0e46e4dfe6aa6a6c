"""Training runs: the process's policy version and the values a training run's arguments take.

``gymtrace.set_policy_version(7)`` says which weights this process generates with from now on. Every
span started below a rollout records it (``gym.policy.version``) as it is *when that span starts*,
so a model call made after a mid-rollout weight update shows the new version; the rollout itself
records its start version and, when it ends under another one, ``gym.policy.version.end``
(``_scopes/level_spans.py``). A version is an ``int`` or a ``str``; integer-likes (numpy and torch
scalars) are taken as ``int`` through ``operator.index``, which refuses floats and bools.

The holder of a train step's consumed rollouts (:class:`TrainState`) lives here too, beside the
rollout and episode holders' module, so the activation can hold it without importing the public
``consume`` above it (``_scopes/consume.py``).
"""

from __future__ import annotations

import operator
import threading

from gymtrace._model.ids import id_problem, report
from gymtrace._model.ids import read_version as read_version

# The process's policy version (set_policy_version), None until one is set. Read on every span's
# start below a rollout: a module global, one read.
version: int | str | None = None


def version_problem(value: object) -> tuple[int | str | None, str | None]:
    """``(version, None)`` for a valid policy version, else ``(None, why not)``."""
    if isinstance(value, str):
        problem = id_problem(value)
        return (None, problem) if problem is not None else (value, None)
    if isinstance(value, bool):
        return None, f"must be an int or a str, got bool {value!r}"
    try:
        return operator.index(value), None  # type: ignore[arg-type]  # refused below if not index-like
    except TypeError:
        return None, f"must be an int or a str, got {type(value).__name__} {value!r:.60}"


def check_version(where: str, argument: str, value: object) -> int | str | None:
    """A policy version argument: the version, or None (reported: a warning, raised when strict)."""
    if value is None:
        return None
    checked, problem = version_problem(value)
    if problem is not None:
        report(where, argument, problem)
    return checked


def check_step(where: str, argument: str, value: object) -> int | None:
    """A train step number: an int >= 0 (integer-likes through ``operator.index``), else reported."""
    if value is None:
        return None
    number: int | None = None
    if not isinstance(value, bool):
        try:
            number = operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            number = None
    if number is None or number < 0:
        report(where, argument, f"must be an int >= 0, got {type(value).__name__} {value!r:.60}")
        return None
    return number


def check_group_id(where: str, argument: str, value: object) -> str | None:
    """A group ID: an identifier, or an int (a prompt's index) taken as its decimal text."""
    if value is None:
        return None
    if not isinstance(value, (str, bool)):
        try:
            return str(operator.index(value))  # type: ignore[arg-type]
        except TypeError:
            pass
    problem = id_problem(value)
    if problem is not None:
        report(where, argument, problem)
        return None
    return value  # type: ignore[return-value]  # id_problem() proved it is a str


def set_policy_version(value: int | str | None) -> None:
    """The weights this process generates with from now on (``None``: none known)."""
    global version
    if value is None:
        version = None
        return
    checked = check_version("set_policy_version", "version", value)
    if checked is not None:
        version = checked


def version_text(value: int | str) -> str:
    """A version as it travels in baggage and consumed records."""
    return str(value)


def staleness(step_version: object, rollout_version: object) -> int | None:
    """The consuming step's version minus the rollout's start version, when both are ints."""
    if (
        isinstance(step_version, int)
        and isinstance(rollout_version, int)
        and not isinstance(step_version, bool)
        and not isinstance(rollout_version, bool)
    ):
        return step_version - rollout_version
    return None


class TrainState:
    """A train step's consumed rollouts not yet written, and what it wrote: made when it opens."""

    __slots__ = ("consumed", "lock", "pending", "records", "version")

    def __init__(self, step_version: int | str | None) -> None:
        # The weights the step starts from (its staleness reference).
        self.version = step_version
        # Entries not yet written in a consumed record: (rollout ID, trace ID, span ID, outcome,
        # reason, rollout version text, staleness or None, resolved).
        self.pending: list[tuple[str, str, str, str, str, str, int | None, bool]] = []
        # How many it consumed, and how many records it wrote.
        self.consumed = 0
        self.records = 0
        self.lock = threading.Lock()
