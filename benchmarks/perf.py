"""The cost targets' table, measured side by side in one run: cost at env-step scale and on export.

Run (after ``collector/build`` for the live-Collector rows)::

    python benchmarks/perf.py            # ~8 minutes (cartpole alone ~4)
    python benchmarks/perf.py --quick    # ~1-2 minutes, noisier
    python benchmarks/perf.py --peers    # also the peer decorators (creates one venv per peer)

Every row is a ratio of CPU time (``time.process_time``: the application's threads *and* the
export thread, since they share the GIL) measured in the same run, mostly in fresh subprocesses
so one configuration cannot leak into the next; variants alternate round by round and the median
is printed. Absolute times drift +-30 % on a shared VM; the ratios are what to read. Nothing here
asserts a time.

Sections:

- **forms**: ``with step()`` and ``@step`` disabled (no SDK, and ``OTEL_SDK_DISABLED=true``) over
  a bare call, six nested levels, enabled ``with`` vs ``@step``, and ``@step`` under
  ``configure()`` vs a stock SDK span with the same name and attributes (no exporter either side).
- **cartpole**: a Gymnasium CartPole loop, steps per CPU-second untraced vs traced: a
  ``with gymtrace.step()`` per ``env.step()`` (file exporter, no exporter, OTLP to a live Collector,
  each step policy, ``OTEL_SDK_DISABLED=true``) and the Gymnasium integration ``TraceEnv`` (its
  default step policy and every step a span). Two workloads: random actions (episodes of ~22
  steps, so the fixed per-episode spans dominate) and a balancing controller that keeps the pole
  up for the whole 500-step TimeLimit, as a trained policy does. The untraced baseline never
  imports gymtrace; the action choice runs in every loop. From the two episode lengths the
  integration's cost is split into µs per episode and µs per step, which predicts any length.
  Last, a span and an ``env.step()`` timed alone, alternating one by one, and alternating in
  blocks of 100. Alternating one by one, each slows the other, and the slowdown fades when many
  of each run together, as warm processor caches would make it (this VM exposes no performance
  counters to confirm the cause): why a span costs more per step in the loop than on its own.
  Then the spans every traced episode has (rollout, episode, seed_session, verify with a reward)
  made alone through the file exporter, beside what the 1.3x target leaves of an untraced
  random-action episode: a floor under any Gymnasium wrapper's per-episode cost.
- **export**: the export path against one live OTLP/gRPC receiver (the project's Collector build,
  ``collector/bin/jaeger``, with a ``debug`` exporter): 20,000 spans made as fast as possible,
  CPU per delivered span, and the highest paced span rate with zero drops; gymtrace's pipeline vs
  the stock ``BatchSpanProcessor`` + OTLP exporter, the same span-making code on both sides.
- **live** (``--only live``): what live markers, heartbeats and the ``gym.*`` metrics add
  (docs/live-and-metrics.md): a rollout with one scored episode, and a step, under
  ``configure()`` with no exporter, in child processes alternating between ``GYMTRACE_HEARTBEAT=0``
  without a MeterProvider (off) and the default heartbeat with an SDK MeterProvider (on; an
  in-memory reader, so collection is not in the timing). The per-rollout difference is the cost;
  the per-step ratio shows nothing is added per step while ``GYMTRACE_STEP_METRICS`` is off.
  Last, one marker span made alone (what a rollout open past a mark pays per marker).
- **backends** (``--only backends``): a rollout with one scored episode under ``configure()`` over
  OTLP/HTTP vs with ``backend="mlflow"`` and ``backend="phoenix"`` (docs/integrations/backends.md),
  CPU of the caller's thread alone (``time.thread_time``): the mapping and the scores run on the
  exporter's threads. The endpoint is a closed loopback port, so no server's speed enters the
  figure (the export threads fail and back off, off the caller's thread).
- **training** (``--only training``): a training run's keys (docs/training.md) under ``configure()``
  with no exporter: a rollout with one scored episode and a model call, plain vs with ``group_id``,
  ``group_size``, ``train_step`` and a process policy version (the CPU added per rollout); then
  ``consume()`` with join keys, 8,192 in one train step: the caller's thread per call
  (``time.thread_time``) and the whole process per call (the writer thread that builds the
  ``gym.consumed`` spans included, and the step's wait for it at its end).
- **sampling** (``--only sampling``): head sampling (``GYMTRACE_SAMPLE_RATIO``) on a rollout of ~15
  spans (an agent's three steps with a model call and a tool call each, a verify, one rollout in
  five retried) under ``configure()`` with the file exporter on the application's thread: CPU and
  bytes written per rollout at 1.0, 0.1 and 0 (every rollout dropped, each leaving its summary
  span), and at 0 with the summary switched off, as a dropped rollout was before it left one.
- **peers** (``--peers``): Traceloop ``@task``, Logfire ``@instrument``, Langfuse ``@observe`` and
  OpenInference's ``@tracer.chain``, each installed into its own virtualenv (not a gymtrace
  dependency), content capture off and on. As the targets were first measured: the peer in its own process
  and ``@gymtrace.step`` under ``configure()`` in another (same venv), each against the same
  hand-written span; the figure with gymtrace under the peer's provider in the peer's process is
  printed beside it, labelled "same process" (``benchmarks/peers.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "support"))  # the harness: pipeline.py

from _child import run_json  # noqa: E402 - benchmarks/_child.py, beside this script

# -- shared child-process prelude -------------------------------------------------------------------

PRELUDE = r"""
import asyncio, gc, json, os, statistics, sys, time
clock = time.process_time_ns

def time_block(fn, n):
    gc.collect(); gc.disable()
    try:
        start = clock()
        for i in range(n):
            fn(i)
        return (clock() - start) / n / 1000
    finally:
        gc.enable()

def time_async_block(loop, fn, n):
    async def body():
        start = clock()
        for i in range(n):
            await fn(i)
        return clock() - start
    gc.collect(); gc.disable()
    try:
        return loop.run_until_complete(body()) / n / 1000
    finally:
        gc.enable()

def interleaved(variants, repeats):
    names = list(variants)
    out = {name: [] for name in names}
    for r in range(repeats):
        for name in (names if r % 2 == 0 else names[::-1]):
            out[name].append(variants[name]())
    return out

def work(x):
    return x

async def awork(x):
    return x

IDENTITY = {"gym.run.id": "run-bench", "gym.rollout.id": "rollout-bench", "gym.task.id": "task-bench",
            "gym.rollout.repeat": 0, "gym.episode.attempt": 0, "gym.episode.id": "rollout-bench"}
"""


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GYMTRACE_"))}
    env.update(extra)
    return env


def run_child(
    code: str, *args: str, env: dict[str, str] | None = None, python: str | None = None, timeout: float = 900
) -> Any:
    return run_json(
        python or sys.executable,
        PRELUDE + textwrap.dedent(code),
        args,
        child_env() if env is None else env,
        timeout,
    )


def med(values: Sequence[float]) -> float:
    return statistics.median(values)


# -- forms --------------------------------------------------------------------------------------------

DISABLED_CODE = r"""
import gymtrace
from gymtrace._scopes.tracing import active_tracer
if os.environ.get("OTEL_SDK_DISABLED") == "true":
    gymtrace.configure()
assert active_tracer() is None
n, repeats = int(sys.argv[1]), int(sys.argv[2])
step, run, rollout, episode, agent, tool = (gymtrace.step, gymtrace.run, gymtrace.rollout,
    gymtrace.episode, gymtrace.agent_invocation, gymtrace.tool_call)
dstep = gymtrace.step(work)

def with_step(x):
    with step():
        return x

def nested_with(x):
    with run(run_id="r"):
        with rollout(rollout_id="ro", task_id="t", repeat=0):
            with episode():
                with agent(agent_name="a"):
                    with step():
                        with tool(tool_name="search"):
                            return x

g_tool = tool(tool_name="search")(work)
g_step = step(lambda x: g_tool(x))
g_agent = agent(agent_name="a")(lambda x: g_step(x))
g_episode = episode(lambda x: g_agent(x))
g_rollout = rollout(rollout_id="ro", task_id="t", repeat=0)(lambda x: g_episode(x))
nested_decorated = run(run_id="r")(lambda x: g_rollout(x))
def bare_nested(x):  # the same six Python calls, undecorated
    return (lambda x: (lambda x: (lambda x: (lambda x: (lambda x: work(x))(x))(x))(x))(x))(x)

async def async_with_step(x):
    async with step():
        return x

variants = {"bare": lambda: time_block(work, n), "decorated": lambda: time_block(dstep, n),
            "with": lambda: time_block(with_step, n),
            "bare6": lambda: time_block(bare_nested, n // 6),
            "nested_with": lambda: time_block(nested_with, n // 6),
            "nested_decorated": lambda: time_block(nested_decorated, n // 6)}
for v in variants.values():
    v()
res = interleaved(variants, repeats)
loop = asyncio.new_event_loop()
ares = interleaved({"abare": lambda: time_async_block(loop, awork, n),
                    "awith": lambda: time_async_block(loop, async_with_step, n)}, repeats)
def diff(a, b):
    return statistics.median(x - y for x, y in zip(a, b))
print(json.dumps({"with": diff(res["with"], res["bare"]), "decorated": diff(res["decorated"], res["bare"]),
                  "nested_with": diff(res["nested_with"], res["bare6"]),
                  "nested_decorated": diff(res["nested_decorated"], res["bare6"]),
                  "async_with": diff(ares["awith"], ares["abare"]),
                  "bare": statistics.median(res["bare"])}))
"""

ENABLED_CODE = r"""
import gymtrace
from opentelemetry.sdk.trace import TracerProvider
gymtrace.configure(service_name="bench-forms", file=False)
assert not gymtrace.export_stats(), "no exporter on the gymtrace side"
n, repeats = int(sys.argv[1]), int(sys.argv[2])
stock = TracerProvider().get_tracer("bench.stock")  # no processor, no exporter
decorated = gymtrace.step(work)
step = gymtrace.step
def with_step(x):
    with step():
        return x
numbers = iter(range(1, 10**9))
def stock_span(x):
    attributes = {**IDENTITY, "gym.kind": "step", "gym.step.number": next(numbers)}
    with stock.start_as_current_span("gym.step", attributes=attributes):
        return x
def under_episode(fn):
    def run():
        with gymtrace.rollout(rollout_id="rollout-bench", task_id="task-bench", repeat=0):
            with gymtrace.episode():
                with gymtrace.agent_invocation(agent_name="bench"):
                    return time_block(fn, n)
    return run
variants = {"decorated": under_episode(decorated), "with": under_episode(with_step),
            "stock": lambda: time_block(stock_span, n)}
for v in variants.values():
    v()
res = interleaved(variants, repeats)
ratio = lambda a, b: statistics.median(x / y for x, y in zip(res[a], res[b]))
print(json.dumps({"with_vs_decorated": ratio("with", "decorated"), "decorated_vs_stock": ratio("decorated", "stock"),
                  "decorated_us": statistics.median(res["decorated"]), "stock_us": statistics.median(res["stock"])}))
"""


def forms(quick: bool) -> dict[str, Any]:
    n, repeats = (20_000, 5) if quick else (100_000, 9)
    no_sdk = run_child(DISABLED_CODE, str(n), str(repeats))
    sdk_off = run_child(DISABLED_CODE, str(n), str(repeats), env=child_env(OTEL_SDK_DISABLED="true"))
    # The enabled target is a 2 % ratio: twice the spans per block and twice the blocks of the
    # first runs, so that the median of ratios moves less from run to run on a shared machine.
    en = run_child(ENABLED_CODE, str(n // 10), str(2 * repeats + 1))
    print("forms (µs over a bare call; disabled = no SDK | OTEL_SDK_DISABLED=true)")
    for key, label in (
        ("with", "with step()"),
        ("async_with", "async with step()"),
        ("decorated", "@step"),
        ("nested_with", "six nested with levels"),
        ("nested_decorated", "six nested decorated levels"),
    ):
        print(f"  disabled {label:<30} {no_sdk[key]:+7.3f} | {sdk_off[key]:+7.3f}")
    print(
        f"  enabled  with step() / @step = {en['with_vs_decorated']:.3f}x;  @step / stock SDK span ="
        f" {en['decorated_vs_stock']:.2f}x  ({en['decorated_us']:.1f} vs {en['stock_us']:.1f} µs)"
    )
    return {
        "disabled_with": max(no_sdk["with"], sdk_off["with"]),
        "disabled_async_with": max(no_sdk["async_with"], sdk_off["async_with"]),
        "disabled_nested": max(no_sdk["nested_with"], sdk_off["nested_with"]),
        "with_vs_decorated": en["with_vs_decorated"],
        "decorated_vs_stock": en["decorated_vs_stock"],
    }


# -- live markers, heartbeats and metrics ---------------------------------------------------------------

LIVE_CODE = r"""
mode, n, steps, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
if mode == "on":
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
import gymtrace
gymtrace.configure(service_name="bench-live", file=False, heartbeat=0 if mode == "off" else 10)
rollout, episode, step, reward = gymtrace.rollout, gymtrace.episode, gymtrace.step, gymtrace.record_reward

def one_rollout(i):
    with rollout(rollout_id="r", task_id="t"), episode():
        reward(1.0)

def rollouts():
    # force_flush() hands the counts gathered to the instruments, as the heartbeat thread does
    # each second: that deferred work is part of what a rollout costs.
    start = clock()
    for i in range(n):
        one_rollout(i)
    gymtrace.force_flush()
    return (clock() - start) / n / 1000

def one_step(i):
    with step():
        pass

def stepping():
    with rollout(rollout_id="r"), episode():
        return time_block(one_step, steps)

result = interleaved({"rollout": rollouts, "step": stepping}, repeats)
out = {k: statistics.median(v) for k, v in result.items()}
if mode == "on":
    from gymtrace._scopes import live as _live
    from gymtrace._scopes import tracing as _tracing
    with rollout(rollout_id="m") as open_rollout:
        watched = _live._Watched(open_rollout, time.time_ns())
        tracer = _tracing.active_tracer()
        state = _live._state
        start = clock()
        for i in range(n):
            _live._emit(tracer, state, watched, "heartbeat", open_rollout.span, 0, 10.0)
        out["marker"] = (clock() - start) / n / 1000
print(json.dumps(out))
"""


def live(quick: bool) -> dict[str, float]:
    n, steps, repeats, rounds = (2_000, 20_000, 3, 2) if quick else (10_000, 100_000, 5, 4)
    runs: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
    for index in range(rounds):
        for mode in ("off", "on") if index % 2 == 0 else ("on", "off"):
            runs[mode].append(run_child(LIVE_CODE, mode, str(n), str(steps), str(repeats)))
    off = {key: med([r[key] for r in runs["off"]]) for key in ("rollout", "step")}
    on = {key: med([r[key] for r in runs["on"]]) for key in ("rollout", "step", "marker")}
    added = on["rollout"] - off["rollout"]
    print("live (µs; off = GYMTRACE_HEARTBEAT=0 and no MeterProvider, on = default heartbeat + SDK metrics)")
    print(
        f"  rollout + scored episode      off {off['rollout']:7.2f}  on {on['rollout']:7.2f}  added {added:+6.2f}"
    )
    print(
        f"  step (step metrics off)       off {off['step']:7.3f}  on {on['step']:7.3f}"
        f"  ratio {on['step'] / off['step']:.3f}x"
    )
    print(f"  one marker span, made alone   {on['marker']:.2f}")
    return {"added": added, "step_ratio": on["step"] / off["step"], "marker": on["marker"]}


# -- backends ---------------------------------------------------------------------------------------

BACKEND_CODE = r"""
backend, n, repeats, endpoint = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
import gymtrace
gymtrace.configure(service_name="bench-backend", backend=backend, endpoint=endpoint, protocol="http/protobuf",
                   file=False, encoder="thread", heartbeat=0)
rollout, episode, reward = gymtrace.rollout, gymtrace.episode, gymtrace.record_reward
thread_clock = time.thread_time_ns

def rollouts():
    start = thread_clock()
    for i in range(n):
        with rollout(rollout_id=f"r{i}", task_id="t"), episode():
            reward(1.0)
    return (thread_clock() - start) / n / 1000

print(json.dumps({"rollout": statistics.median(rollouts() for _ in range(repeats))}))
"""


def backends(quick: bool) -> dict[str, float]:
    n, repeats, rounds = (1_000, 3, 2) if quick else (5_000, 5, 4)
    endpoint = f"http://127.0.0.1:{free_port()}"
    names = ("otlp", "mlflow", "phoenix")
    runs: dict[str, list[float]] = {name: [] for name in names}
    for index in range(rounds):
        for name in names if index % 2 == 0 else tuple(reversed(names)):
            runs[name].append(run_child(BACKEND_CODE, name, str(n), str(repeats), endpoint)["rollout"])
    cost = {name: med(values) for name, values in runs.items()}
    print(
        "backends (µs of the caller's thread per rollout with one scored episode, OTLP/HTTP to a closed port)"
    )
    for name in names:
        print(f"  {name:8s} {cost[name]:7.2f}  added over otlp {cost[name] - cost['otlp']:+6.2f}")
    return {name: cost[name] - cost["otlp"] for name in names[1:]} | {"otlp": cost["otlp"]}


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- cartpole -----------------------------------------------------------------------------------------

CARTPOLE_CODE = r"""
import gymnasium
loop_kind, n = sys.argv[1], int(sys.argv[2])
kwargs = json.loads(sys.argv[3])
workload = sys.argv[4]  # "random" actions or the "balance" controller
traced = loop_kind != "untraced"
if traced:
    import gymtrace
    gymtrace.configure(service_name="bench-cartpole", **kwargs)
env = gymnasium.make("CartPole-v1")
if loop_kind.startswith("integration"):
    # The Gymnasium integration: rollout > episode per env episode, steps by its step policy.
    from gymtrace.integrations.gymnasium import TraceEnv
    steps = loop_kind.partition(":")[2]
    env = TraceEnv(env, **({"steps": steps} if steps else {}))
env.reset(seed=0)
env.action_space.seed(0)
sample = env.action_space.sample

if workload == "random":
    def act(obs):
        return sample()  # episodes of ~22 steps
else:
    def act(obs):
        # Pushes toward where the pole falls (angle plus half its angular velocity): keeps it up
        # for the whole 500-step TimeLimit, as a trained CartPole policy does.
        return 1 if obs[2] + 0.5 * obs[3] > 0 else 0

def plain_loop(steps):
    # Untraced, or the integration (which traces inside env.step/reset).
    done = episodes = 0
    while done < steps:
        obs, _ = env.reset()
        episodes += 1
        while True:
            obs, _, term, trunc, _ = env.step(act(obs))
            done += 1
            if term or trunc or done >= steps:
                break
    return episodes

def hand_loop(steps):
    # As a new user writes it: a rollout and episode per env episode, a step per env.step().
    step = gymtrace.step
    done = episodes = 0
    while done < steps:
        episodes += 1
        with gymtrace.rollout(rollout_id=f"cartpole-{episodes}", task_id="CartPole-v1", repeat=0):
            with gymtrace.episode():
                obs, _ = env.reset()
                while True:
                    with step():
                        obs, _, term, trunc, _ = env.step(act(obs))
                    done += 1
                    if term or trunc or done >= steps:
                        break
    return episodes

loop = hand_loop if loop_kind == "hand" else plain_loop
loop(2000)  # warm up
if traced:
    gymtrace.force_flush()
gc.collect()
start = time.process_time()
episodes = loop(n)
if traced:
    gymtrace.force_flush()
cpu = time.process_time() - start
stats = gymtrace.export_stats() if traced else []
encoder_cpu = 0.0
if traced:
    import resource
    gymtrace.shutdown()  # waits for an encoder process (if one ran): its CPU is then in RUSAGE_CHILDREN
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    encoder_cpu = usage.ru_utime + usage.ru_stime  # its start-up and the warm-up included
print(json.dumps({"steps_per_s": n / cpu, "episodes": episodes, "dropped": sum(s.dropped for s in stats),
                  "exported": sum(s.exported for s in stats), "encoder_us_per_step": encoder_cpu / (n + 2000) * 1e6}))
"""

# Why a span costs more in the loop than alone: one process, no exporter, µs of CPU per step.
INTERLEAVE_CODE = r"""
import gymnasium
import gymtrace
gymtrace.configure(service_name="bench-interleave", file=False)
n = int(sys.argv[1])
env = gymnasium.make("CartPole-v1")
env.reset(seed=0)
env.action_space.seed(0)
sample = env.action_space.sample
step = gymtrace.step

def spans(k):
    for _ in range(k):
        with step():
            pass

def steps(k):
    for _ in range(k):
        _, _, term, trunc, _ = env.step(sample())
        if term or trunc:
            env.reset()

def blocks(size):
    def run(count):
        for _ in range(count // size):
            spans(size)
            steps(size)
    return run

variants = {"span": spans, "env": steps, "interleaved": blocks(1), "blocks of 100": blocks(100)}
out = {name: [] for name in variants}
with gymtrace.rollout(rollout_id="interleave", task_id="CartPole-v1", repeat=0):
    with gymtrace.episode():
        for fn in variants.values():
            fn(2000)  # warm up
        for _ in range(5):
            for name, fn in variants.items():
                gc.collect()
                start = clock()
                fn(n)
                out[name].append((clock() - start) / n / 1000)
print(json.dumps({name: statistics.median(v) for name, v in out.items()}))
"""


# What no Gymnasium wrapper can do without: the spans each traced episode has (a rollout with an
# episode, the reset as seed_session, the return as the reward at verify), made with nothing else
# in the loop, through the same configure() and file exporter as the integration's rows.
CONTRACT_CODE = r"""
import gymtrace
gymtrace.configure(service_name="bench-contract", file="trace.jsonl")
n, repeats = int(sys.argv[1]), int(sys.argv[2])
rollout, episode, seed_session, verify = gymtrace.rollout, gymtrace.episode, gymtrace.seed_session, gymtrace.verify
# A new rollout ID per episode, as TraceEnv makes them (time_block's i repeats every round, and a
# repeated ID would reuse a shared scope that TraceEnv's rollouts never can).
made = iter(range(10**9))

def two(i):
    with rollout(rollout_id=f"contract-{next(made)}", task_id="CartPole-v1", repeat=i):
        with episode():
            pass

def four(i):
    with rollout(rollout_id=f"contract-{next(made)}", task_id="CartPole-v1", repeat=i):
        with episode():
            with seed_session():
                pass
            with verify() as v:
                v.record_reward(22.0)

variants = {"two": lambda: time_block(two, n), "four": lambda: time_block(four, n)}
for v in variants.values():
    v()
res = interleaved(variants, repeats)
gymtrace.force_flush()
print(json.dumps({name: statistics.median(values) for name, values in res.items()}))
"""


def contract_spans(quick: bool, untraced_episode_us: float) -> dict[str, float]:
    """The spans every traced episode has, alone: µs of CPU per episode, beside the 1.3x budget."""
    r = run_child(CONTRACT_CODE, str(2_000 if quick else 5_000), str(3 if quick else 7))
    budget = 0.3 * untraced_episode_us
    print(
        "cartpole, the spans each traced episode has, made alone (file exporter, no environment; µs of CPU)"
    )
    print(f"  rollout > episode                                {r['two']:7.1f} per episode")
    print(f"  rollout > episode > seed_session, verify         {r['four']:7.1f} per episode")
    print(f"  what <= 1.3x leaves of a random-action episode   {budget:7.1f}  (0.3 x {untraced_episode_us:.0f} µs untraced)")  # fmt: skip
    return {**r, "budget": budget}


def interleave(quick: bool) -> dict[str, float]:
    """A `with step()` span and an env.step(), alone, one after the other, and in blocks of 100."""
    r = run_child(INTERLEAVE_CODE, str(10_000 if quick else 50_000))
    print("cartpole, one span per env.step(): the two alone and together (no exporter; µs of CPU per step)")
    print(f"  env.step() alone                                 {r['env']:7.2f}")
    print(f"  `with step()` alone (in an episode)              {r['span']:7.2f}")
    print(f"  one span, then one env.step(), repeated          {r['interleaved']:7.2f}"
          f"  (sum of the two alone: {r['env'] + r['span']:.2f})")  # fmt: skip
    print(f"  100 spans, then 100 env.step(), repeated         {r['blocks of 100']:7.2f}")
    return r


WORKLOADS = {
    "random": "random actions",
    "balance": "balancing controller",
}
# Variants also measured on the balancing controller: the baseline and the integration's rows, so
# the per-episode and per-step costs can be told apart (two episode lengths, two unknowns).
# The default encoder (auto) moves a fast loop's export to an encoder process; pinned to the
# application's thread, the same rows show what that saves.
THREAD = "GYMTRACE_ENCODER=thread"
BALANCE_VARIANTS = (
    "untraced",
    "integration default policy, file exporter",
    f"integration default policy, file, {THREAD}",
    "integration every step, file exporter",
    "integration default policy, OTLP live Collector",
    "integration every step, OTLP live Collector",
)


def _has_integration() -> bool:
    try:
        import gymtrace.integrations.gymnasium  # noqa: F401
    except ImportError:
        return False
    return True


def _has_encoder_process() -> bool:
    from gymtrace._model import environment as _environment

    return hasattr(_environment, "GYMTRACE_ENCODER")


def _has_step_policy() -> bool:
    from gymtrace._model import environment as _environment

    return hasattr(_environment, "GYMTRACE_STEP_POLICY") and "step_policy" in _configure_arguments()


def _configure_arguments() -> set[str]:
    import inspect

    import gymtrace

    return set(inspect.signature(gymtrace.configure).parameters)


def cartpole(quick: bool, endpoint: str | None) -> dict[str, Any]:
    """Both workloads; returns ``{workload: {variant: (slowdown, dropped)}}`` plus, under
    ``"overhead"``, each integration variant's (per-episode µs, per-step µs) of CPU, and under
    ``"untraced_episode_us"`` each workload's untraced episode in µs of CPU."""
    n, rounds = (10_000, 3) if quick else (50_000, 5)
    file = {"file": "trace.jsonl"}
    otlp = {"endpoint": endpoint, "file": False}
    aggregate = {"GYMTRACE_STEP_POLICY": "aggregate"}
    thread = {"GYMTRACE_ENCODER": "thread"}
    # name -> (loop, configure() kwargs, environment)
    variants: dict[str, tuple[str, dict[str, Any], dict[str, str]]] = {
        "untraced": ("untraced", {}, {}),
        "with step(), OTEL_SDK_DISABLED=true": ("hand", {}, {"OTEL_SDK_DISABLED": "true"}),
        "with step(), every step, no exporter": ("hand", {"file": False}, {}),
        "with step(), every step, file exporter": ("hand", file, {}),
    }
    if _has_step_policy():
        variants["with step(), step policy aggregate, file"] = ("hand", file, aggregate)
    if _has_integration():
        variants["integration default policy, file exporter"] = ("integration", file, {})
        variants["integration every step, file exporter"] = ("integration:all", file, {})
        if _has_encoder_process():
            variants[f"integration default policy, file, {THREAD}"] = ("integration", file, thread)
    if endpoint is not None:
        variants["with step(), every step, OTLP live Collector"] = ("hand", otlp, {})
        if _has_encoder_process():
            variants[f"with step(), every step, OTLP, {THREAD}"] = ("hand", otlp, thread)
        if _has_integration():
            variants["integration every step, OTLP live Collector"] = ("integration:all", otlp, {})
            variants["integration default policy, OTLP live Collector"] = ("integration", otlp, {})
    runs = [(workload, name) for workload in WORKLOADS for name in variants]
    runs = [(w, name) for w, name in runs if w == "random" or name in BALANCE_VARIANTS]
    results: dict[tuple[str, str], list[dict[str, Any]]] = {run: [] for run in runs}
    for r in range(rounds):
        for workload, name in runs if r % 2 == 0 else runs[::-1]:
            loop, kwargs, extra = variants[name]
            results[workload, name].append(
                run_child(CARTPOLE_CODE, loop, str(n), json.dumps(kwargs), workload, env=child_env(**extra))
            )
    out: dict[str, Any] = {}
    lengths: dict[str, float] = {}
    per_step: dict[tuple[str, str], float] = {}  # median CPU µs per step
    for workload, label in WORKLOADS.items():
        base = [r["steps_per_s"] for r in results[workload, "untraced"]]
        lengths[workload] = length = med([n / r["episodes"] for r in results[workload, "untraced"]])
        print(
            f"cartpole, {label} (mean episode {length:.0f} steps; {n} steps x {rounds} rounds;"
            " steps per CPU-second, slowdown vs untraced)"
        )
        out[workload] = {}
        out.setdefault("untraced_episode_us", {})[workload] = length * 1e6 / med(base)
        for w, name in runs:
            if w != workload:
                continue
            rates = [r["steps_per_s"] for r in results[workload, name]]
            slow = med([b / x for b, x in zip(base, rates, strict=True)])
            dropped = max(r["dropped"] for r in results[workload, name])
            encoder = med([r.get("encoder_us_per_step", 0.0) for r in results[workload, name]])
            # The encoder process's own CPU is not the application's; printed beside it, not hidden.
            beside = f"  (+ encoder process {encoder:.1f} µs/step)" if encoder else ""
            print(f"  {name:<48} {med(rates):>10,.0f} steps/s  {slow:5.2f}x  dropped {dropped}{beside}")
            out[workload][name] = (slow, dropped)
            # Overhead over the untraced loop of the same round, µs of CPU per step.
            per_step[workload, name] = med([1e6 / x - 1e6 / b for b, x in zip(base, rates, strict=True)])
    # overhead per step = per_episode / length + per_step_cost, at two lengths: solve for both.
    short, long = lengths["random"], lengths["balance"]
    out["overhead"] = {}
    if long > short:
        print("cartpole, traced cost derived from both workloads (µs of CPU; predicts any episode length)")
        for name in variants:
            if name == "untraced" or ("balance", name) not in per_step:
                continue
            o_short, o_long = per_step["random", name], per_step["balance", name]
            step_us = (o_long * long - o_short * short) / (long - short)
            episode_us = (o_short - step_us) * short
            print(f"  {name:<48} {episode_us:7.0f} µs per episode + {step_us:5.2f} µs per step")
            out["overhead"][name] = (episode_us, step_us)
    return out


# -- export path ----------------------------------------------------------------------------------------

EXPORT_CODE = r"""
import threading
from opentelemetry import trace
pipeline, endpoint, what = sys.argv[1], sys.argv[2], sys.argv[3]
delivered = [0]
if pipeline.startswith("gymtrace"):
    import gymtrace
    if pipeline.endswith("-drop"):
        # The export path as before issue 47: a full queue (the thread queue, the encoder
        # process's pipe) drops the oldest at once instead of holding the caller (export.RoomWait;
        # read when the queues are made, and handed to the encoder process with their settings).
        from gymtrace._sdk import export
        export._ROOM_WAIT = 0
    gymtrace.configure(service_name="bench-export", endpoint=endpoint, file=False,
                       **({"encoder": "thread"} if pipeline.startswith("gymtrace-thread") else {}))
    def counts():
        s = gymtrace.export_stats()[0]
        return s.exported, s.dropped
    flush = gymtrace.force_flush
else:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    class Counting(OTLPSpanExporter):
        def export(self, spans):
            result = super().export(spans)
            if result.name == "SUCCESS":
                delivered[0] += len(spans)
            return result
    provider = TracerProvider(resource=Resource.create({"service.name": "bench-export"}))
    provider.add_span_processor(BatchSpanProcessor(Counting(endpoint=endpoint, insecure=True)))
    trace.set_tracer_provider(provider)
    made = [0]
    def counts():
        return delivered[0], made[0] - delivered[0]
    flush = provider.force_flush
tracer = trace.get_tracer("bench.export")
ATTRS = {**IDENTITY, "gym.kind": "step", "gen_ai.operation.name": "execute_tool"}

def make(count):
    start = tracer.start_as_current_span
    for i in range(count):
        with start("gym.step", attributes=ATTRS):
            pass
    if not pipeline.startswith("gymtrace"):
        made[0] += count

make(500); flush(); time.sleep(0.2)
base_exported, base_dropped = counts()
if what == "burst":
    n = int(sys.argv[4])
    cpu0, thread0 = time.process_time(), time.thread_time()
    make(n)
    thread_cpu = time.thread_time() - thread0
    flush(60000)
    cpu = time.process_time() - cpu0
    exported, dropped = counts()
    encoder_cpu = 0.0
    if pipeline.startswith("gymtrace"):
        import resource
        gymtrace.shutdown()  # waits for an encoder process (if one ran): its CPU is then in RUSAGE_CHILDREN
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        encoder_cpu = usage.ru_utime + usage.ru_stime  # start-up and warm-up included
    print(json.dumps({"made": n, "delivered": exported - base_exported, "dropped": dropped - base_dropped,
                      "cpu_per_span_us": cpu / max(1, exported - base_exported) * 1e6,
                      "thread_cpu_per_span_us": thread_cpu / n * 1e6,
                      "encoder_cpu_per_span_us": encoder_cpu / max(1, exported - base_exported) * 1e6}))
else:
    rates = [int(r) for r in sys.argv[4].split(",")]
    seconds = float(sys.argv[5])
    best, stop = 0, ""
    for rate in rates:
        exported0, dropped0 = counts()
        total = int(rate * seconds)
        t0 = time.perf_counter()
        made_now = 0
        while made_now < total:
            due = min(total, int((time.perf_counter() - t0) * rate) + 1)
            if due > made_now:
                make(due - made_now)
                made_now = due
            else:
                time.sleep(0.0005)
        elapsed = time.perf_counter() - t0
        flush(60000)
        exported, dropped = counts()
        achieved = total / elapsed
        if dropped - dropped0 or exported - exported0 < total:
            stop = f"drops at {rate}/s"
            break
        best = max(best, achieved)
        if achieved < 0.9 * rate:
            stop = f"the application could not make {rate}/s"  # CPU-bound: drops were not the limit
            break
    else:
        stop = "end of ladder"
    print(json.dumps({"best_rate": best, "stop": stop}))
"""

RECEIVER_CONFIG = """
extensions:
  healthcheckv2:
    use_v2: false
    endpoint: 127.0.0.1:{health}
    path: /
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:{grpc}
      http:
        endpoint: 127.0.0.1:{http}
exporters:
  debug:
    verbosity: basic
    sampling_initial: 1
    sampling_thereafter: 1000000
service:
  extensions: [healthcheckv2]
  telemetry:
    logs:
      level: warn
    metrics:
      level: none
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [debug]
"""


class Receiver:
    """The project's Collector build (collector/bin/jaeger) as a bare OTLP receiver."""

    def __init__(self) -> None:
        from pipeline import JAEGER_BIN, free_ports

        self.binary = JAEGER_BIN
        self.grpc, self.http, self.health = free_ports(3)
        self.tmp = tempfile.TemporaryDirectory()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def available(self) -> bool:
        return self.binary.exists()

    def __enter__(self) -> Receiver:
        config = Path(self.tmp.name) / "receiver.yaml"
        config.write_text(RECEIVER_CONFIG.format(grpc=self.grpc, http=self.http, health=self.health))
        log = open(Path(self.tmp.name) / "receiver.log", "wb")
        self.proc = subprocess.Popen([str(self.binary), "--config", str(config)], stdout=log, stderr=log)
        deadline = time.monotonic() + 60
        import urllib.request

        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.health}/", timeout=1):
                    break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    text = (Path(self.tmp.name) / "receiver.log").read_text(errors="replace")[-3000:]
                    self.__exit__()  # never leave a half-started receiver behind
                    raise RuntimeError("receiver did not start:\n" + text) from None
                time.sleep(0.2)
        return self

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.grpc}"

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.tmp.cleanup()


def bursts(
    pipelines: list[str], rounds: int, endpoint: str, n: int, env: dict[str, str]
) -> dict[str, list[dict[str, Any]]]:
    """``n`` spans made as fast as possible through each pipeline (EXPORT_CODE), every round, the
    order reversed every other round so that neither side always runs first."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in pipelines}
    for r in range(rounds):
        for name in pipelines if r % 2 == 0 else pipelines[::-1]:
            runs[name].append(run_child(EXPORT_CODE, name, endpoint, "burst", str(n), env=env))
    return runs


def export_path(quick: bool, endpoint: str) -> dict[str, Any]:
    n, rounds = (20_000, 2) if quick else (20_000, 4)
    env = child_env(OTEL_EXPORTER_OTLP_INSECURE="true")
    pipelines = ("stock", "gymtrace") + (("gymtrace-thread",) if _has_encoder_process() else ())
    burst = bursts(list(pipelines), rounds, endpoint, n, env)
    print(f"export path (live OTLP/gRPC receiver; {n} spans made as fast as possible, {rounds} rounds)")
    out: dict[str, Any] = {}
    for name in pipelines:
        b = burst[name]
        encoder = med([x.get("encoder_cpu_per_span_us", 0.0) for x in b])
        print(
            f"  {name:<16} delivered {min(x['delivered'] for x in b):>6}..{max(x['delivered'] for x in b):<6}"
            f" dropped {max(x['dropped'] for x in b):>6}  process CPU per delivered span"
            f" {med([x['cpu_per_span_us'] for x in b]):6.1f} µs  app-thread CPU per span"
            f" {med([x['thread_cpu_per_span_us'] for x in b]):6.1f} µs"
            + (f"  encoder process {encoder:.1f} µs (start-up included)" if encoder else "")
        )
    out["cpu_ratio"] = med(
        [
            g["cpu_per_span_us"] / s["cpu_per_span_us"]
            for g, s in zip(burst["gymtrace"], burst["stock"], strict=True)
        ]
    )
    out["thread_ratio"] = med(
        [
            g["thread_cpu_per_span_us"] / s["thread_cpu_per_span_us"]
            for g, s in zip(burst["gymtrace"], burst["stock"], strict=True)
        ]
    )
    # The encoder process's CPU (if the default moved there) is not the application's: shown beside.
    out["with_encoder_ratio"] = med(
        [
            (g["cpu_per_span_us"] + g["encoder_cpu_per_span_us"]) / s["cpu_per_span_us"]
            for g, s in zip(burst["gymtrace"], burst["stock"], strict=True)
        ]
    )
    out["delivered"] = min(x["delivered"] for x in burst["gymtrace"])
    out["stock_delivered"] = min(x["delivered"] for x in burst["stock"])
    if "gymtrace-thread" in burst:
        p = burst["gymtrace-thread"]
        out["thread"] = {
            "cpu_ratio": med(
                [g["cpu_per_span_us"] / s["cpu_per_span_us"] for g, s in zip(p, burst["stock"], strict=True)]
            ),
            "delivered": min(x["delivered"] for x in p),
        }
    print(
        f"  gymtrace / stock: process CPU per delivered span {out['cpu_ratio']:.2f}x, app thread {out['thread_ratio']:.2f}x"
    )
    # Up to rates no Python process makes spans at: the ladder ends where a pipeline drops or the
    # application cannot keep up, not before (gymtrace passed 40,000/s, then the ladder's top).
    ladder = (
        "2000,4000,6000,7000,8000,9000,10000,11000,12000,14000,16000,18000,20000,24000,28000,32000,"
        "40000,48000,56000,64000,80000"
    )
    seconds = "1.5" if quick else "3"
    ladders = {
        name: run_child(EXPORT_CODE, name, endpoint, "ladder", ladder, seconds, env=env) for name in pipelines
    }
    rates = {name: r["best_rate"] for name, r in ladders.items()}
    out["rate_ratio"] = rates["gymtrace"] / rates["stock"] if rates["stock"] else float("inf")
    print(
        f"  highest paced rate with zero drops ({seconds}s per step of {ladder}/s): stock"
        f" {rates['stock']:,.0f}/s (stopped: {ladders['stock']['stop']}), gymtrace {rates['gymtrace']:,.0f}/s"
        f" (stopped: {ladders['gymtrace']['stop']}): {out['rate_ratio']:.2f}x"
    )
    if "thread" in out:
        thread_rate = rates["gymtrace-thread"]
        out["thread"]["rate_ratio"] = thread_rate / rates["stock"] if rates["stock"] else float("inf")
        print(
            f"  {THREAD}: {thread_rate:,.0f}/s (stopped: {ladders['gymtrace-thread']['stop']}):"
            f" {out['thread']['rate_ratio']:.2f}x the stock SDK"
        )
    return out


def burst(quick: bool, endpoint: str) -> dict[str, Any]:
    """Issue 47: 100,000 spans made as fast as the API allows into a live receiver, with the
    default encoder (``auto``: the thread queue, then the encoder process's pipe) and with the
    thread queue alone: a full queue holding the caller while the exporter delivers (now) against
    dropping the oldest at once (before), alternated round by round in one run."""
    n, rounds = 100_000, 2 if quick else 4
    env = child_env(OTEL_EXPORTER_OTLP_INSECURE="true")
    encoders = {"auto": "gymtrace", "thread": "gymtrace-thread"}
    names = [name + tail for name in encoders.values() for tail in ("", "-drop")]
    runs = bursts(names, rounds, endpoint, n, env)
    print(f"burst (live OTLP/gRPC receiver; {n:,} spans made as fast as possible, {rounds} rounds)")
    out: dict[str, Any] = {}
    for encoder, name in encoders.items():
        for tail, label in (("-drop", "before (a full queue drops)"), ("", "now (a full queue waits)")):
            b = runs[name + tail]
            print(
                f"  {encoder:<6} {label:<27} dropped {min(x['dropped'] for x in b):>6}..{max(x['dropped'] for x in b):<6}"
                f" app-thread CPU per span {med([x['thread_cpu_per_span_us'] for x in b]):6.2f} µs"
                f"  process CPU per delivered span {med([x['cpu_per_span_us'] for x in b]):6.2f} µs"
            )
        ratio = med(
            [
                now["thread_cpu_per_span_us"] / before["thread_cpu_per_span_us"]
                for now, before in zip(runs[name], runs[name + "-drop"], strict=True)
            ]
        )
        out[encoder] = {
            "dropped": max(x["dropped"] for x in runs[name]),
            "dropped_before": max(x["dropped"] for x in runs[name + "-drop"]),
            "thread_ratio": ratio,
        }
        print(f"  {encoder:<6} now / before, app-thread CPU per span (same run): {ratio:.3f}x")
    return out


# -- peers ----------------------------------------------------------------------------------------------

from peers import PEERS, peer_rows  # noqa: E402 - benchmarks/peers.py, after the sys.path setup

# -- the table ------------------------------------------------------------------------------------------


def table(rows: list[tuple[str, str, str, str, bool | None]]) -> None:
    print()
    print("cost targets")
    header = f"  {'metric':<88} {'today':>14} {'target':>12} {'measured':>18}"
    print(header)
    print("  " + "-" * (len(header) - 2))
    for metric, today, target, measured, ok in rows:
        mark = "" if ok is None else ("  ok" if ok else "  MISSED")
        print(f"  {metric:<88} {today:>14} {target:>12} {measured:>18}{mark}")


def print_fast_paths() -> None:
    """Which of gymtrace's uses of private OpenTelemetry names this installation runs (the numbers
    below hold only with all of them active; CONTRIBUTING.md lists what each is worth)."""
    from gymtrace._sdk.setup import fast_paths

    print("fast paths (private OpenTelemetry names, checked by capability at import)")
    for path in fast_paths():
        state = "active" if path.active else f"OFF, missing {', '.join(path.missing)}; runs {path.fallback}"
        print(f"  {path.name:<44} {path.module:<26} {state}")


# -- training ---------------------------------------------------------------------------------------

TRAINING_CODE = r"""
n, repeats = int(sys.argv[1]), int(sys.argv[2])
import gymtrace
from gymtrace import _constants as c
gymtrace.configure(service_name="bench-training", file=False, heartbeat=0)
rollout, episode, model_call, verify, reward = (gymtrace.rollout, gymtrace.episode, gymtrace.model_call,
    gymtrace.verify, gymtrace.record_reward)

def plain():
    gymtrace.set_policy_version(None)
    start = clock()
    for i in range(n):
        with rollout(rollout_id=f"r{i}", task_id="t"), episode():
            with model_call(model="policy"):
                pass
            with verify():
                reward(1.0)
    return (clock() - start) / n / 1000

def training():
    gymtrace.set_policy_version(3)
    start = clock()
    for i in range(n):
        with rollout(rollout_id=f"r{i}", task_id="t", group_id=f"p{i // 16}", group_size=16, train_step=3), episode():
            with model_call(model="policy"):
                pass
            with verify():
                reward(1.0)
    return (clock() - start) / n / 1000

result = interleaved({"plain": plain, "training": training}, repeats)
out = {k: statistics.median(v) for k, v in result.items()}
keys = [{c.RUN_ID: "run", c.ROLLOUT_ID: f"{k // 16}-{k % 16}", "trace_id": format(k + 1, "032x"),
         "rollout_span_id": format(k + 1, "016x"), c.POLICY_VERSION: 1} for k in range(8192)]
thread, process = [], []
for _ in range(repeats):
    with gymtrace.run(run_id="run"):
        start_process = clock()
        with gymtrace.train_step(step=1, policy_version=2):
            start_thread = time.thread_time_ns()
            for k in keys:
                gymtrace.consume(k)
            thread.append((time.thread_time_ns() - start_thread) / len(keys) / 1000)
        process.append((clock() - start_process) / len(keys) / 1000)
out["consume_thread"], out["consume_process"] = statistics.median(thread), statistics.median(process)
print(json.dumps(out))
"""


def training(quick: bool) -> dict[str, float]:
    n, repeats = (2_000, 3) if quick else (10_000, 5)
    r = run_child(TRAINING_CODE, str(n), str(repeats))
    added = r["training"] - r["plain"]
    print("training (µs of CPU; configure() with no exporter)")
    print(
        f"  rollout + episode + model call + verify   plain {r['plain']:7.2f}  with training keys"
        f" {r['training']:7.2f}  added {added:+6.2f}"
    )
    print(
        f"  consume() with join keys, 8,192 in one step: caller's thread {r['consume_thread']:.2f},"
        f" whole process (writer thread included) {r['consume_process']:.2f}"
    )
    return {"added": added, "consume_thread": r["consume_thread"], "consume_process": r["consume_process"]}


# -- head sampling: what a dropped rollout costs and writes ------------------------------------------

SAMPLING_CODE = r"""
mode, n, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
import gymtrace
if mode == "nothing":
    # A dropped rollout as it was before it left a summary: the same code with the summary and its
    # token totals switched off.
    from gymtrace._scopes import level_spans, recording
    level_spans._summarise = lambda *args: None
    recording._count_dropped_tokens = lambda *args: None
gymtrace.configure(service_name="bench-sampling", file=path, heartbeat=0, encoder="thread")
rollout, episode, agent, step, model_call, tool_call, verify = (gymtrace.rollout, gymtrace.episode,
    gymtrace.agent_invocation, gymtrace.step, gymtrace.model_call, gymtrace.tool_call, gymtrace.verify)
usage, reward, attempts = gymtrace.record_usage, gymtrace.record_reward, gymtrace.attempts
gymtrace.set_policy_version(1)

def one(i):
    # ~15 spans: an agent's three steps (a model call and a tool call each) and a verify, and
    # one rollout in five retried after an infrastructure failure.
    with rollout(rollout_id=f"r{i}", task_id=f"t{i % 64}", repeat=i // 64, group_id=f"g{i // 8}",
                 group_size=8, train_step=i // 512):
        for attempt in attempts(2):
            with attempt:
                with agent(agent_name="bench"):
                    for _ in range(3):
                        with step():
                            with model_call(model="policy"):
                                usage(input_tokens=100, output_tokens=20)
                            with tool_call(tool_name="search"):
                                pass
                if attempt.index == 0 and i % 5 == 0:
                    attempt.fail()
                    continue
                with verify():
                    reward(1.0)

def size():
    return os.path.getsize(path) if os.path.exists(path) else 0  # no file: nothing was written yet

for i in range(300):  # warm up
    one(10**7 + i)
gymtrace.force_flush()
before = size()
gc.collect()
start = clock()
for i in range(n):
    one(i)
gymtrace.force_flush()
cpu = (clock() - start) / n / 1000
written = size() - before
stats = gymtrace.export_stats()
gymtrace.shutdown()
print(json.dumps({"us": cpu, "bytes": written / n, "dropped": sum(s.dropped for s in stats)}))
"""

# (label, GYMTRACE_SAMPLE_RATIO, mode)
SAMPLING_VARIANTS = (
    ("whole", "1", "summary"),
    ("sampled", "0.1", "summary"),
    ("dropped", "0", "summary"),
    ("nothing", "0", "nothing"),
)


def sampling(quick: bool) -> dict[str, float]:
    """Head sampling (GYMTRACE_SAMPLE_RATIO): CPU and bytes per rollout at 1.0, 0.1 and 0 (every
    rollout dropped, each leaving its summary span), and 0 with the summary switched off (a dropped
    rollout as it was before: nothing recorded), file exporter on the application's thread."""
    n, rounds = (2_000, 3) if quick else (6_000, 5)
    runs: dict[str, list[dict[str, float]]] = {label: [] for label, _, _ in SAMPLING_VARIANTS}
    with tempfile.TemporaryDirectory() as folder:
        for index in range(rounds):
            order = SAMPLING_VARIANTS if index % 2 == 0 else SAMPLING_VARIANTS[::-1]
            for label, ratio, mode in order:
                path = os.path.join(folder, f"{label}-{index}.jsonl")
                env = child_env(GYMTRACE_SAMPLE_RATIO=ratio)
                runs[label].append(run_child(SAMPLING_CODE, mode, str(n), path, env=env))
    cpu = {label: med([r["us"] for r in found]) for label, found in runs.items()}
    size = {label: med([r["bytes"] for r in found]) for label, found in runs.items()}

    # Ratios round by round (the same machine load on both sides), then their median.
    def ratio(a: str, b: str, key: str = "us") -> float:
        return med([x[key] / y[key] for x, y in zip(runs[a], runs[b], strict=True)])

    print(
        f"sampling (µs of CPU and bytes per rollout of ~15 spans, file exporter; {n} rollouts x {rounds} rounds)"
    )
    for label, ratio_text, mode in SAMPLING_VARIANTS:
        what = {"summary": "", "nothing": ", summary switched off (before)"}[mode]
        print(f"  ratio {ratio_text:<4}{what:<34} {cpu[label]:8.1f} µs  {size[label]:8.0f} B")
    out = {
        "sampled_vs_whole": ratio("sampled", "whole"),
        "bytes_sampled_vs_whole": ratio("sampled", "whole", "bytes"),
        "dropped_vs_whole": ratio("dropped", "whole"),
        "dropped_vs_nothing": ratio("dropped", "nothing"),
        "dropped_added_us": med(
            [x["us"] - y["us"] for x, y in zip(runs["dropped"], runs["nothing"], strict=True)]
        ),
        "dropped_us": cpu["dropped"],
        "summary_bytes": size["dropped"],
        "lost": max(r["dropped"] for found in runs.values() for r in found),
    }
    print(
        f"  0.1 / 1.0: CPU {out['sampled_vs_whole']:.2f}x, bytes {out['bytes_sampled_vs_whole']:.2f}x;"
        f" a dropped rollout {out['dropped_vs_whole']:.2f}x a whole one, {out['dropped_vs_nothing']:.2f}x"
        f" ({out['dropped_added_us']:+.1f} µs) one that records nothing; spans lost {out['lost']}"
    )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations (noisier)")
    parser.add_argument("--peers", action="store_true", help="also the peer decorators (slow first time)")
    parser.add_argument(
        "--only",
        action="append",
        choices=["forms", "cartpole", "export", "burst", "live", "backends", "training", "sampling", "peers"],
        help="one section",
    )
    args = parser.parse_args(argv)
    only = set(
        args.only
        or ["forms", "cartpole", "export", "burst", "live", "backends", "training", "sampling"]
        + (["peers"] if args.peers else [])
    )
    t0 = time.monotonic()
    import opentelemetry.version

    print(
        f"gymtrace perf  (Python {sys.version.split()[0]}, opentelemetry {opentelemetry.version.__version__},"
        f" CPU time, medians of interleaved rounds)"
    )
    print_fast_paths()
    rows: list[tuple[str, str, str, str, bool | None]] = []
    if "forms" in only:
        f = forms(args.quick)
        rows += [
            ("disabled `with step()` over bare call (worse of no SDK / SDK off)", "+2.4 µs",
             "<= +0.3 µs", f"{f['disabled_with']:+.3f} µs", f["disabled_with"] <= 0.3),
            ("disabled `async with step()` over bare await", "+2.6 µs", "<= +0.3 µs",
             f"{f['disabled_async_with']:+.3f} µs", f["disabled_async_with"] <= 0.3),
            ("disabled, six nested `with` levels", "+16 µs", "<= +2 µs",
             f"{f['disabled_nested']:+.2f} µs", f["disabled_nested"] <= 2),
            ("enabled `with step()` vs `@step`", "1.15x", "<= 1.02x",
             f"{f['with_vs_decorated']:.3f}x", f["with_vs_decorated"] <= 1.02),
            ("`@step` (configure()) vs stock SDK span, same name+attributes, no exporter", "1.13x",
             "<= 0.7x", f"{f['decorated_vs_stock']:.2f}x", f["decorated_vs_stock"] <= 0.7),
        ]  # fmt: skip
    if "live" in only:
        lv = live(args.quick)
        rows += [
            ("live markers + heartbeats + gym.* metrics, added per rollout (one scored episode)",
             "not measured", "<= 20 µs", f"{lv['added']:+.2f} µs", lv["added"] <= 20),
            ("  per step while GYMTRACE_STEP_METRICS is off, on vs off", "", "1.00x",
             f"{lv['step_ratio']:.3f}x", None),
        ]  # fmt: skip
    if "training" in only:
        t = training(args.quick)
        rows += [
            ("training keys (group, size, step, policy version), added per rollout", "not measured", "",
             f"{t['added']:+.2f} µs", None),
            ("consume() with join keys, caller's thread per call (8,192 in one step)", "not measured",
             "<= 5 µs", f"{t['consume_thread']:.2f} µs", t["consume_thread"] <= 5),
            ("  the same, whole process per call (the writer thread included)", "", "",
             f"{t['consume_process']:.2f} µs", None),
        ]  # fmt: skip
    if "sampling" in only:
        sm = sampling(args.quick)
        rows += [
            ("GYMTRACE_SAMPLE_RATIO=0.1, file bytes vs the same run at 1.0", "", "<= 0.3x",
             f"{sm['bytes_sampled_vs_whole']:.2f}x", sm["bytes_sampled_vs_whole"] <= 0.3),
            ("  CPU per rollout, 0.1 vs 1.0", "", "", f"{sm['sampled_vs_whole']:.2f}x", None),
            ("a dropped rollout (its summary span) vs one that records nothing", "not measured", "",
             f"{sm['dropped_vs_nothing']:.2f}x ({sm['dropped_added_us']:+.1f} µs)", None),
            ("  a dropped rollout vs a whole one (~15 spans)", "", "", f"{sm['dropped_vs_whole']:.2f}x", None),
        ]  # fmt: skip
    receiver = Receiver()
    if "backends" in only:
        b = backends(args.quick)
        worst = max(b["mlflow"], b["phoenix"])
        rows.append(
            ("GYMTRACE_BACKEND=mlflow|phoenix, caller's thread per rollout, added over otlp", "not measured",
             "<= 20 µs", f"mlflow {b['mlflow']:+.2f}, phoenix {b['phoenix']:+.2f} µs", worst <= 20)
        )  # fmt: skip
    live_collector = receiver.available and bool({"cartpole", "export"} & only)
    if not receiver.available:
        print(f"(no {receiver.binary}: run collector/build for the live-Collector rows)")
    with receiver if live_collector else _nothing():
        if "cartpole" in only:
            c = cartpole(args.quick, receiver.endpoint if live_collector else None)
            interleave(args.quick)
            floor = contract_spans(args.quick, c["untraced_episode_us"]["random"])
            for workload, label, today in (
                ("random", "random actions (~22-step episodes)", "11.8x"),
                ("balance", "balancing controller (500-step episodes)", "not measured"),
            ):
                default = c[workload].get("integration default policy, file exporter")
                metric = f"CartPole, integration default policy, file, {label}"
                if default is None:  # the integration is not installed: the with-step loop, aggregated
                    default = c[workload].get("with step(), step policy aggregate, file", (float("nan"), 0))
                    metric = f"CartPole, with step() loop, aggregate policy, file, {label}"
                rows.append((metric, today, "<= 1.3x", f"{default[0]:.2f}x", default[0] <= 1.3))
                if workload == "random":
                    # The floor under this row: the spans every episode has, made alone, beside
                    # what the target leaves of a whole episode for everything tracing adds.
                    rows.append(
                        ("  (its episode's rollout, episode, seed_session and verify spans made alone, vs what"
                         " 1.3x leaves)", "", "", f"{floor['four']:.0f} vs {floor['budget']:.0f} µs", None)
                    )  # fmt: skip
            # The target's "today" (15x) was a `with gymtrace.step()` per env.step(), as a new user
            # writes it: that loop is the target row; the integration's is printed beneath it.
            for workload, label in (("random", "random actions"), ("balance", "balancing controller")):
                opted = c[workload].get(f"integration default policy, file, {THREAD}")
                if opted is not None:
                    rows.append(
                        (f"  ({THREAD}, {label})", "", "", f"{opted[0]:.2f}x", None)
                    )  # fmt: skip
            hand = c["random"].get("with step(), every step, OTLP live Collector")
            if hand is not None:
                rows.append(
                    ("CartPole, every step a span, OTLP to a live Collector, random actions", "15x, drops", "<= 4x, 0 drops",
                     f"{hand[0]:.2f}x, {hand[1]} dropped", hand[0] <= 4 and hand[1] == 0)
                )  # fmt: skip
            opted = c["random"].get(f"with step(), every step, OTLP, {THREAD}")
            if opted is not None:
                rows.append(
                    (f"  the same with {THREAD}", "", "<= 4x, 0 drops",
                     f"{opted[0]:.2f}x, {opted[1]} dropped", opted[0] <= 4 and opted[1] == 0)
                )  # fmt: skip
            for workload, label in (("random", "random actions"), ("balance", "balancing controller")):
                integration = c.get(workload, {}).get("integration every step, OTLP live Collector")
                if integration is not None:
                    rows.append(
                        (f"  (the Gymnasium integration, every step a span, {label})", "", "",
                         f"{integration[0]:.2f}x, {integration[1]} dropped", None)
                    )  # fmt: skip
        if "export" in only and live_collector:
            e = export_path(args.quick, receiver.endpoint)
            rows += [
                ("application-process CPU per delivered span vs stock SDK + OTLP", "0.90x", "<= 0.5x",
                 f"{e['cpu_ratio']:.2f}x", e["cpu_ratio"] <= 0.5),
                ("  (application thread alone)", "", "", f"{e['thread_ratio']:.2f}x", None),
                ("  (application and encoder process together)", "", "", f"{e['with_encoder_ratio']:.2f}x", None),
                ("spans delivered of 20,000 made as fast as possible (stock: ~10,200)", "~14,800",
                 "all 20,000", f"{e['delivered']:,} (stock {e['stock_delivered']:,})", e["delivered"] == 20_000),
                ("highest zero-drop span rate vs stock SDK + OTLP", "not measured", ">= 2x",
                 f"{e['rate_ratio']:.2f}x", e["rate_ratio"] >= 2),
            ]  # fmt: skip
            if "thread" in e:
                p = e["thread"]
                rows += [
                    (f"  {THREAD}: application-process CPU per delivered span", "", "<= 0.5x",
                     f"{p['cpu_ratio']:.2f}x", p["cpu_ratio"] <= 0.5),
                    (f"  {THREAD}: spans delivered of 20,000", "", "all 20,000", f"{p['delivered']:,}",
                     p["delivered"] == 20_000),
                    (f"  {THREAD}: highest zero-drop span rate", "", ">= 2x", f"{p['rate_ratio']:.2f}x",
                     p["rate_ratio"] >= 2),
                ]  # fmt: skip
    if "burst" in only and receiver.available:
        with Receiver() as own:  # its own: a Receiver is entered once
            bu = burst(args.quick, own.endpoint)
        for encoder, b in bu.items():
            rows += [
                (f"100,000 spans as fast as the API allows, encoder {encoder}: dropped", "up to a few thousand",
                 "0", f"{b['dropped']:,} (before: {b['dropped_before']:,})", b["dropped"] == 0),
                ("  application thread CPU per span, now vs before (same run)", "1.00x", "<= 1.10x",
                 f"{b['thread_ratio']:.3f}x", b["thread_ratio"] <= 1.10),
            ]  # fmt: skip
    if "peers" in only:
        for metric, today, target, measured, ok in peer_rows(args.quick):
            rows.append((metric, today, target, measured, ok))
    table(rows)
    print(f"\ntotal {time.monotonic() - t0:.0f}s; peers measured: {'yes' if 'peers' in only else 'no (--peers)'}"
          f" ({', '.join(PEERS)})")  # fmt: skip
    return 0


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


if __name__ == "__main__":
    sys.exit(main())
