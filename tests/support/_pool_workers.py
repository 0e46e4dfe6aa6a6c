"""Functions run in pool workers by test_propagation.py (importable by spawned processes)."""

from __future__ import annotations

import os

import gymtrace


def configure_worker(path: str) -> None:
    gymtrace.configure(service_name="pool-worker", file=path)


def score(answer: str) -> dict[str, object]:
    with gymtrace.tool_call(tool_name="score"):
        here = gymtrace.current()
    return {"rollout_id": here.rollout_id, "attempt": here.attempt, "pid": os.getpid(), "answer": answer}
