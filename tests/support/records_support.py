"""Records written the way their tools write them, for the import tests (tests/test_records.py,
tests/e2e/test_import_in_jaeger.py)."""

from __future__ import annotations

import json
from pathlib import Path

from gymtrace._import.nemo_gym import failures_path


def write_nemo_gym_output(out: Path) -> dict[tuple[int, int], float | None]:
    """Rows as ``gym eval run`` writes them (nemo_gym/rollout_collection.py, 0.7.0), two passes:

    pass 1: 3 tasks x 2 repeats; task 1 repeat 0 fails (agent_request_failed, retryable), task 2
    repeat 1 fails terminally (_ng_failure_terminal); the rest succeed.
    pass 2 (+resume_from_cache=true): re-runs task 1 repeat 0 with _ng_attempt_index=1; it succeeds.

    Returns each rollout's final reward (None: unscored), what NeMo Gym itself counts.
    """
    rewards = {(0, 0): 1.0, (0, 1): 0.0, (1, 1): 1.0, (2, 0): 0.5}
    main_rows = [
        {
            "_ng_task_index": t,
            "_ng_rollout_index": r,
            "reward": v,
            "agent_ref": {"type": "responses_api_agents", "name": "simple_agent"},
        }
        for (t, r), v in rewards.items()
    ]
    failures = [
        {
            "_ng_task_index": 1,
            "_ng_rollout_index": 0,
            "_ng_failure_class": "agent_request_failed",
            "_ng_failure_type": "ConnectError",
            "_ng_failure_message": "All connection attempts failed",
            "_ng_failure_http_status": None,
        },
        {
            "_ng_task_index": 2,
            "_ng_rollout_index": 1,
            "_ng_failure_class": "skipped",
            "_ng_failure_terminal": True,
            "_ng_failure_type": "SampleSkipped",
            "_ng_failure_message": "sample cannot run",
        },
    ]
    resumed = {"_ng_task_index": 1, "_ng_rollout_index": 0, "_ng_attempt_index": 1, "reward": 1.0}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r) + "\n" for r in main_rows))
    failures_path(out).write_text("".join(json.dumps(r) + "\n" for r in failures))
    with open(out, "a") as f:  # the resume pass appends
        f.write(json.dumps(resumed) + "\n")
    return {**rewards, (1, 0): 1.0, (2, 1): None}
