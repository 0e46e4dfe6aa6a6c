"""What a forked child redoes of gymtrace's per-process state: one registry of hooks, and the only
caller of ``os.register_at_fork``.

A module whose state belongs to one process (an export thread, a queue, a lock, a random generator
seeded per process, the table of open scopes) registers a function with :func:`in_child`; in a
child forked after that, the functions run in the order they were registered. One that fails is
logged and the others still run: a fork must never fail because of telemetry.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from gymtrace._model.errors import internal_error

_IN_CHILD: list[Callable[[], object]] = []


def in_child(hook: Callable[[], object]) -> Callable[[], object]:
    """Run ``hook`` in every child forked from now on, after the hooks registered before it."""
    _IN_CHILD.append(hook)
    return hook


def _after_fork_in_child() -> None:
    for hook in list(_IN_CHILD):
        try:
            hook()
        except Exception as error:  # noqa: BLE001 - the child goes on; errors.internal_error logs it
            internal_error(f"after fork: {getattr(hook, '__qualname__', hook)!s}", error, may_raise=False)


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_after_fork_in_child)
