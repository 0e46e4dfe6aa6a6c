"""CartPole steps per CPU-second: untraced vs ``TraceEnv`` with each step policy.

Each variant runs in a fresh child process (so the exporter thread and the provider of one never
weigh on another), configured with ``gymtrace.configure(file=...)``: the default file exporter.
Rounds interleave the variants so drift hits all alike; CPU time is the whole child process's
(``time.process_time``, the export thread included), and the ratio is against the untraced loop
measured in the same run. A seeded random policy, as a rollout collector's CartPole would run.

    python benchmarks/gymnasium_steps.py [--steps 50000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, sys, time
import gymnasium as gym

variant, steps, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
env = gym.make("CartPole-v1")
if variant != "untraced":
    import gymtrace
    from gymtrace.integrations.gymnasium import TraceEnv

    gymtrace.configure(service_name="bench-cartpole", file=path)
    options = {
        "aggregate": {},
        "sampled": {},
        "first-0": {"sample_first": 0},
        "slowest-1": {"steps": gymtrace.StepPolicy("aggregate", first=1, slowest=1)},
        "aggregate-10": {"sample_first": 10},
        "all": {"steps": "all"},
    }[variant]
    env = TraceEnv(env, **options)
actions = env.action_space
actions.seed(0)
samples = [int(actions.sample()) for _ in range(1024)]
env.reset(seed=0)
start = time.process_time()
episodes = 1
for i in range(steps):
    _, _, terminated, truncated, _ = env.step(samples[i & 1023])
    if terminated or truncated:
        env.reset()
        episodes += 1
if variant != "untraced":
    gymtrace.force_flush()
print(json.dumps({"cpu": time.process_time() - start, "episodes": episodes}))
"""

VARIANTS = ("untraced", "first-0", "aggregate", "slowest-1", "aggregate-10", "sampled", "all")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    results: dict[str, list[float]] = {v: [] for v in VARIANTS}
    episodes: dict[str, list[int]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        for round_number in range(args.rounds):
            for variant in VARIANTS:
                path = str(Path(tmp) / f"{variant}-{round_number}.jsonl")
                out = subprocess.run(
                    [sys.executable, "-c", CHILD, variant, str(args.steps), path],
                    # "sampled": the rollout sampler keeps 1 rollout in 10, whole; the wrapper
                    # passes the other episodes through untraced.
                    env={**os.environ, "GYMTRACE_SAMPLE_RATIO": "0.1"} if variant == "sampled" else None,
                    check=True,
                    capture_output=True,
                    text=True,
                    timeout=600,
                ).stdout
                result = json.loads(out.splitlines()[-1])
                results[variant].append(args.steps / result["cpu"])
                episodes[variant].append(result["episodes"])
    base = statistics.median(results["untraced"])
    print(f"CartPole-v1, {args.steps} steps x {args.rounds} rounds, medians, file exporter, random actions")
    print(f"{'variant':<40} {'steps/CPU-s':>12} {'slowdown':>9} {'µs/episode over untraced':>25}")
    labels = {
        "untraced": "untraced",
        "first-0": "aggregate, sample_first=0",
        "aggregate": "TraceEnv default (aggregate, first=1)",
        "slowest-1": "aggregate, first=1, slowest=1",
        "aggregate-10": "aggregate, sample_first=10",
        "sampled": "default, SAMPLE_RATIO=0.1",
        "all": "steps='all' (span per step)",
    }
    for variant in VARIANTS:
        rate = statistics.median(results[variant])
        # The CPU the variant adds, spread over its episodes (the same actions: the same episodes).
        length = args.steps / statistics.median(episodes[variant])
        extra = (1e6 / rate - 1e6 / base) * length
        print(f"{labels[variant]:<40} {rate:>12,.0f} {base / rate:>8.2f}x {extra:>25.0f}")
    print("target: TraceEnv default <= 1.3x untraced")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
