"""Thread and process pools that carry the trace and the gym identity into every task.

Example::

    from concurrent.futures import ProcessPoolExecutor
    from gymtrace.integrations.concurrent import map, submit

    with gymtrace.rollout(rollout_id="r-1"), gymtrace.episode():
        with ProcessPoolExecutor(initializer=gymtrace.configure) as pool:
            future = submit(pool, score, answer)       # runs in the rollout, in the worker
            results = list(map(pool, score, answers))

Standard library only. The implementation is :mod:`gymtrace.propagation`'s, whose documented API
these functions are part of: integrations sit above the public API in the import graph
(CONTRIBUTING.md), so the public module cannot import them from here; this module is their home
among the integrations.
"""

from __future__ import annotations

from gymtrace.propagation import ContextCarrier, carry, map, submit

__all__ = ["ContextCarrier", "carry", "map", "submit"]
