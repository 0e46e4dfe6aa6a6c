"""The engine's bookkeeping of open spans and its reports of misuse.

Every activation whose span started and has not ended is in :data:`OPEN`, so a process being stopped
ends them as interrupted (``_sdk/lifecycle.py``) and the heartbeat thread sees which spans of a
rollout are still open. Beside it, what the engine says when something goes wrong: the per-level
texts it reports its own failures with, and the report of a level opened where the nesting order
forbids it. Apart from the Scope object because the lifecycle and the live markers read them
without the engine's activation code.
"""

from __future__ import annotations

import sys

from gymtrace import _constants as c
from gymtrace._model.errors import HierarchyViolationError, contract_problem, guard
from gymtrace._scopes import live as _live
from gymtrace._scopes import steps as _steps
from gymtrace._scopes.active_scope import ActiveScope
from gymtrace._scopes.levels import LEVELS

# Every activation whose span has started and not ended, so that a process being stopped can end
# them as interrupted instead of losing them (see _lifecycle). Insertion order: outermost first.
OPEN: dict[int, ActiveScope] = {}
# The heartbeat thread tells from this table which spans of a rollout ended since its last beat.
_live.open_scopes = OPEN

# Where gymtrace failed, per level, made once: these paths run for every span and catch their own
# failures (errors.contain) rather than enter a guard.
STARTING = {kind: f"starting gymtrace.{kind}" for kind in LEVELS}
ENDING = {kind: f"ending gymtrace.{kind}" for kind in LEVELS}


def forget_open_scopes() -> None:
    """In a forked child: the open scopes are the parent's, which ends and exports them."""
    OPEN.clear()


def end_open_scopes(reason: str) -> int:
    """End every open gym span, innermost first, marked ``gym.interrupted``. Returns how many."""
    ended = 0
    for frame in reversed(list(OPEN.values())):
        if OPEN.pop(id(frame), None) is None:
            continue  # its own code ended it meanwhile
        try:
            # The process is ending: a failure here must not stop the others from ending.
            with guard(f"ending open spans at {reason}", may_raise=False):
                frame.cancelled = True
                frame.span.set_attribute(c.INTERRUPTED, True)
                finish = frame.level.finish if frame.level is not None else None
                if finish is not None:
                    finish(frame)
                counter = frame.counter
                if counter is not None and counter.stats is not None:
                    _steps.write_owner(frame)
        finally:
            frame.ended = True
            frame.span.end()
            ended += 1
    return ended


def report_violation(kind: str, parent_kind: str, site: object) -> None:
    if site is None:
        # A `with` block: the site is the user's line that opened it. Walk out of gymtrace's frames.
        frame = sys._getframe(1)
        while frame.f_back is not None and frame.f_globals.get("__name__", "").startswith("gymtrace."):
            frame = frame.f_back
        where = f"{frame.f_code.co_filename}:{frame.f_lineno}"
        key: object = where
    else:
        where = f"{getattr(site, '__module__', '?')}.{getattr(site, '__qualname__', site)}"
        key = site
    contract_problem(
        ("hierarchy", key, kind, parent_kind),
        HierarchyViolationError(
            f"{kind} opened inside {parent_kind} at {where}: gym levels nest run > rollout > episode >"
            " seed_session/verify > agent_invocation > turn > step > model_call/tool_call (a train_step"
            " sits beside the rollouts, under the run, and may hold the rollouts it generates)"
        ),
    )
