"""A small training run written through the API, what every summary reader's answer draws on."""

from __future__ import annotations

import gymtrace

# The summary readers' commands whose output the streaming tests compare (the JSON views).
READERS = [
    ["rollouts", "--json"],
    ["stats", "--json"],
    ["stats", "--by", "train_step", "--json"],
    ["stats", "--by", "policy_version", "--json"],
    ["stats", "--by", "group", "--json"],
]


def training_run(rollouts: int = 12, run_id: str = "stream") -> None:
    """A run with retries, unscored rollouts, model calls with tokens, and a train step consuming
    every rollout (a third of them filtered)."""
    keys = []
    with gymtrace.run(run_id=run_id):
        for i in range(rollouts):
            gymtrace.set_policy_version(i // 4)
            with gymtrace.rollout(
                rollout_id=f"r-{i}", task_id=f"t-{i % 3}", group_id=f"g-{i // 4}", group_size=4
            ):
                for attempt in gymtrace.attempts(2, reraise=False):
                    with attempt:
                        with gymtrace.step():
                            with gymtrace.model_call(model="policy") as call:
                                call.record_usage(output_tokens=7 + i)
                            with gymtrace.tool_call(tool_name="env.step"):
                                pass
                        if i % 4 == 1 and attempt.number == 0:
                            raise ConnectionError("environment lost")  # retried
                        if i % 4 == 2:
                            raise KeyError("harness bug")  # unscored
                        with gymtrace.verify():
                            gymtrace.record_reward(float(i % 2))
                keys.append(gymtrace.current().join_keys())
        with gymtrace.train_step(step=0, policy_version=3):
            for n, k in enumerate(keys):
                gymtrace.consume(k, outcome="trained" if n % 3 else "filtered")
