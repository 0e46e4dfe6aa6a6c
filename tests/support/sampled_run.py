"""A small training run written through the real API, the same for a seed whatever is sampled.

    python sampled_run.py SEED STEPS TASKS REPEATS

Configured from the environment (``GYMTRACE_FILE``, ``GYMTRACE_SAMPLE_RATIO``, ...). Each train
step generates ``TASKS`` groups of ``REPEATS`` rollouts (policy version = step), each with up to
three attempts (an infrastructure failure is retried, a terminal one leaves it unscored, and some
rollouts run out of attempts), a model call that records tokens and a reward from a few values;
then the step consumes them, a zero-variance group as ``filtered``. Every random draw comes from
the seed and none depends on what tracing records, so two runs of one seed did the same work.
"""

from __future__ import annotations

import random
import sys

import gymtrace


class TerminalError(Exception):
    """Not infrastructure: the loop does not retry it and the rollout is unscored."""


def main(seed: int, steps: int, tasks: int, repeats: int) -> None:
    rng = random.Random(seed)
    gymtrace.configure()
    with gymtrace.run(run_id=f"sampled-{seed}"):
        for step in range(steps):
            gymtrace.set_policy_version(step)
            rewards: dict[str, list[float | None]] = {}
            for task in range(tasks):
                group = f"s{step}-t{task}"
                for repeat in range(repeats):
                    rollout_id = f"{group}-r{repeat}"
                    reward: float | None = None
                    with gymtrace.rollout(
                        rollout_id=rollout_id,
                        task_id=f"t{task}",
                        repeat=repeat,
                        group_id=group,
                        group_size=repeats,
                        train_step=step,
                    ):
                        for attempt in gymtrace.attempts(3, reraise=False):
                            with attempt:
                                with gymtrace.model_call(model="m"):
                                    gymtrace.record_usage(
                                        input_tokens=rng.randrange(50, 100),
                                        output_tokens=rng.randrange(5, 40),
                                    )
                                draw = rng.random()
                                if draw < 0.25:
                                    attempt.fail()  # infrastructure: retried
                                    continue
                                if draw < 0.3:
                                    raise TerminalError("bad answer format")
                                with gymtrace.verify():
                                    reward = rng.choice((0.0, 0.5, 1.0))
                                    gymtrace.record_reward(reward)
                    rewards.setdefault(group, []).append(reward)
            with gymtrace.train_step(step=step, policy_version=step):
                for group, values in rewards.items():
                    flat = len({v for v in values if v is not None}) <= 1
                    for repeat, value in enumerate(values):
                        if value is None:
                            gymtrace.consume(f"{group}-r{repeat}", outcome="failed")
                        elif flat:
                            gymtrace.consume(
                                f"{group}-r{repeat}", outcome="filtered", reason="zero_variance_group"
                            )
                        else:
                            gymtrace.consume(f"{group}-r{repeat}")
    gymtrace.shutdown()


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:5]))
