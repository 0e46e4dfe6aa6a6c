"""What a gymtrace decorator costs per call, next to the span you would write by hand.

Run::

    python benchmarks/overhead.py           # ~1-2 minutes
    python benchmarks/overhead.py --quick   # ~15 seconds, noisier

Enabled path: every variant runs under one SDK ``TracerProvider`` with gymtrace's
``IdentitySpanProcessor`` (as ``gymtrace.configure()`` installs it) and a ``BatchSpanProcessor``
over an exporter that drops the spans, so export cost does not dominate. The hand-written variant
is ``tracer.start_as_current_span(name, kind=..., attributes=...)`` with the same name, span kind
and attributes gymtrace sets (``gym.kind``, the identity keys, the GenAI keys, the step number);
the nesting variant also reproduces gymtrace's topology (the rollout is a trace root linked to the
run) and its end-of-span attributes. Before timing, one call of each pair is exported and compared,
so the comparison is known to be like for like.

Disabled path: measured in subprocesses, so no global provider leaks in: once with no SDK provider
at all (``active_tracer()`` returns None) and once with an SDK provider under
``OTEL_SDK_DISABLED=true``, against an undecorated call of the same function.

Variants are interleaved (A B, B A, A B, ...), each repeat times a block of many calls with the
garbage collector paused, and the table shows the median over repeats. The ratio is the median of
the per-repeat ratios, which cancels most of the drift of a shared machine. Nothing here asserts a
time: absolute numbers move by +-30 % between runs on a noisy VM; the ratios are what to read.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

TARGET_RATIO = 1.10
TARGET_DISABLED_US = 1.0

RUN_ID, ROLLOUT_ID, TASK_ID = "run-bench", "rollout-bench", "task-bench"
IDENTITY: dict[str, Any] = {
    "gym.run.id": RUN_ID,
    "gym.rollout.id": ROLLOUT_ID,
    "gym.task.id": TASK_ID,
    "gym.rollout.repeat": 0,
    "gym.episode.attempt": 0,
    "gym.episode.id": ROLLOUT_ID,
}


def work(x: int) -> int:
    """The decorated function: as close to free as possible, so the table shows pure overhead."""
    return x


async def awork(x: int) -> int:
    return x


# -- timing ---------------------------------------------------------------------------------------

# CPU time of the whole process (this thread and the batch export thread) by default: on a shared
# machine wall-clock time also counts the time other processes held the CPU, which swamps a
# 10 % difference. --clock wall switches to time.perf_counter_ns().
_clock = time.process_time_ns


def _time_block(fn: Callable[[int], Any], n: int) -> float:
    """Microseconds per call of ``fn(i)`` over ``n`` calls."""
    gc.collect()
    gc.disable()
    try:
        start = _clock()
        for i in range(n):
            fn(i)
        elapsed = _clock() - start
    finally:
        gc.enable()
    return elapsed / n / 1000


def _time_async_block(loop: asyncio.AbstractEventLoop, fn: Callable[[int], Any], n: int) -> float:
    """Microseconds per awaited call, all ``n`` awaited in one coroutine on one event loop."""

    async def body() -> int:
        start = _clock()
        for i in range(n):
            await fn(i)
        return _clock() - start

    gc.collect()
    gc.disable()
    try:
        elapsed = loop.run_until_complete(body())
    finally:
        gc.enable()
    return elapsed / n / 1000


def _interleaved(variants: Sequence[Callable[[], float]], repeats: int) -> list[list[float]]:
    """Run each variant ``repeats`` times, alternating the order every repeat."""
    results: list[list[float]] = [[] for _ in variants]
    order = list(range(len(variants)))
    for r in range(repeats):
        for index in order if r % 2 == 0 else reversed(order):
            results[index].append(variants[index]())
    return results


class Row:
    def __init__(self, name: str, gym: list[float], hand: list[float], spans: int) -> None:
        self.name = name
        self.gym = statistics.median(gym)
        self.hand = statistics.median(hand)
        self.ratio = statistics.median(g / h for g, h in zip(gym, hand, strict=True))
        self.spread = (
            min(g / h for g, h in zip(gym, hand, strict=True)),
            max(g / h for g, h in zip(gym, hand, strict=True)),
        )
        self.spans = spans


# -- the enabled path -----------------------------------------------------------------------------


def _sdk_setup() -> tuple[Any, Any, Any]:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    import gymtrace

    class DropExporter(SpanExporter):
        """Counts spans and drops them; keeps them only while ``keep`` is set (for the check)."""

        def __init__(self) -> None:
            self.kept: list[Any] = []
            self.keep = False
            self.count = 0

        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            self.count += len(spans)
            if self.keep:
                self.kept.extend(spans)
            return SpanExportResult.SUCCESS

        def shutdown(self) -> None:
            return None

    exporter = DropExporter()
    provider = TracerProvider()
    provider.add_span_processor(gymtrace.IdentitySpanProcessor())
    # A queue big enough that no span is dropped (a drop costs ~10 µs and would skew one side).
    provider.add_span_processor(
        BatchSpanProcessor(exporter, max_queue_size=1 << 16, max_export_batch_size=512)
    )
    trace.set_tracer_provider(provider)
    return provider, exporter, provider.get_tracer("bench.handwritten")


def _build_variants(tracer: Any) -> dict[str, Any]:
    """The decorated functions and their hand-written twins."""
    from opentelemetry import trace
    from opentelemetry.trace import Link, SpanKind

    import gymtrace

    v: dict[str, Any] = {}

    # -- one span per call, inside run > rollout > episode > agent_invocation --------------------
    v["gym_step"] = gymtrace.step(work)
    v["gym_tool"] = gymtrace.tool_call(tool_name="search")(work)
    v["gym_astep"] = gymtrace.step(awork)

    step_numbers = itertools.count(1)
    tool_attributes = {
        **IDENTITY,
        "gym.kind": "tool_call",
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "search",
    }

    def hand_step(x: int) -> int:
        attributes = {**IDENTITY, "gym.kind": "step", "gym.step.number": next(step_numbers)}
        with tracer.start_as_current_span("gym.step", attributes=attributes):
            return work(x)

    def hand_tool(x: int) -> int:
        with tracer.start_as_current_span("execute_tool search", attributes=tool_attributes):
            return work(x)

    async def hand_astep(x: int) -> int:
        attributes = {**IDENTITY, "gym.kind": "step", "gym.step.number": next(step_numbers)}
        with tracer.start_as_current_span("gym.step", attributes=attributes):
            return await awork(x)

    v["hand_step"], v["hand_tool"], v["hand_astep"] = hand_step, hand_tool, hand_astep

    def gym_enclosing() -> Any:
        from contextlib import ExitStack

        stack = ExitStack()
        stack.enter_context(gymtrace.run(run_id=RUN_ID))
        stack.enter_context(gymtrace.rollout(rollout_id=ROLLOUT_ID, task_id=TASK_ID, repeat=0))
        stack.enter_context(gymtrace.episode())
        stack.enter_context(gymtrace.agent_invocation(agent_name="bench"))
        return stack

    def hand_enclosing() -> Any:
        from contextlib import ExitStack

        stack = ExitStack()
        run = stack.enter_context(
            tracer.start_as_current_span("gym.run", attributes={"gym.run.id": RUN_ID, "gym.kind": "run"})
        )
        rollout = stack.enter_context(
            tracer.start_as_current_span(
                "gym.rollout",
                context=trace.set_span_in_context(trace.INVALID_SPAN),
                links=[Link(run.get_span_context(), {"gym.link.relation": "run"})],
                attributes={k: v for k, v in IDENTITY.items() if not k.startswith("gym.episode")}
                | {"gym.kind": "rollout"},
            )
        )
        # ExitStack unwinds last-in first-out: a callback pushed right after entering a span runs
        # after the span inside it ended and before its parent ends, which is where gymtrace sets
        # its end-of-span attributes.
        stack.callback(rollout.set_attribute, "gym.rollout.outcome", "unscored")
        stack.callback(rollout.set_attribute, "gym.rollout.attempts", 1)
        episode = stack.enter_context(
            tracer.start_as_current_span("gym.episode", attributes={**IDENTITY, "gym.kind": "episode"})
        )
        stack.callback(episode.set_attribute, "gym.episode.outcome", "completed")
        stack.enter_context(
            tracer.start_as_current_span(
                "invoke_agent bench",
                attributes={
                    **IDENTITY,
                    "gym.kind": "agent_invocation",
                    "gen_ai.operation.name": "invoke_agent",
                    "gen_ai.agent.name": "bench",
                },
            )
        )
        return stack

    v["gym_enclosing"], v["hand_enclosing"] = gym_enclosing, hand_enclosing

    # -- six levels per call: run > rollout > episode > agent_invocation > step > tool_call -------
    g_tool = gymtrace.tool_call(tool_name="search")(work)
    g_step = gymtrace.step(lambda x: g_tool(x))
    g_agent = gymtrace.agent_invocation(agent_name="bench")(lambda x: g_step(x))
    g_episode = gymtrace.episode(lambda x: g_agent(x))
    g_rollout = gymtrace.rollout(rollout_id=ROLLOUT_ID, task_id=TASK_ID, repeat=0)(lambda x: g_episode(x))
    v["gym_nested"] = gymtrace.run(run_id=RUN_ID)(lambda x: g_rollout(x))

    rollout_attributes = {k: v for k, v in IDENTITY.items() if not k.startswith("gym.episode")}
    rollout_attributes["gym.kind"] = "rollout"
    root_context = trace.set_span_in_context(trace.INVALID_SPAN)
    start = tracer.start_as_current_span

    def hand_nested(x: int) -> int:
        # What gymtrace does, by hand: same names, kinds, attributes, topology and end attributes.
        with start("gym.run", attributes={"gym.run.id": RUN_ID, "gym.kind": "run"}) as run:
            links = [Link(run.get_span_context(), {"gym.link.relation": "run"})]
            with start(
                "gym.rollout", context=root_context, links=links, attributes=dict(rollout_attributes)
            ) as ro:
                with start("gym.episode", attributes={**IDENTITY, "gym.kind": "episode"}) as ep:
                    with start(  # noqa: SIM117 - one `with` per level, so it reads like the tree
                        "invoke_agent bench",
                        attributes={
                            **IDENTITY,
                            "gym.kind": "agent_invocation",
                            "gen_ai.operation.name": "invoke_agent",
                            "gen_ai.agent.name": "bench",
                        },
                    ):
                        with start(
                            "gym.step", attributes={**IDENTITY, "gym.kind": "step", "gym.step.number": 1}
                        ):
                            with start("execute_tool search", attributes=tool_attributes):
                                result = work(x)
                    ep.set_attribute("gym.episode.outcome", "completed")
                ro.set_attribute("gym.rollout.attempts", 1)
                ro.set_attribute("gym.rollout.outcome", "unscored")
        return result

    v["hand_nested"] = hand_nested
    v["span_kind"] = SpanKind
    return v


def _check_like_for_like(provider: Any, exporter: Any, v: dict[str, Any]) -> list[str]:
    """Export one call of each pair and compare span names, kinds, attribute keys and parentage."""

    def shape(spans: list[Any]) -> list[tuple[Any, ...]]:
        by_id = {s.context.span_id: s for s in spans}
        out = []
        for s in spans:
            parent = by_id.get(s.parent.span_id).name if s.parent and s.parent.span_id in by_id else None
            out.append((s.name, s.kind, tuple(sorted(s.attributes)), parent, len(s.links)))
        return sorted(out, key=repr)

    def collect(fn: Callable[[], Any]) -> list[Any]:
        provider.force_flush()
        exporter.kept.clear()
        exporter.keep = True
        fn()
        provider.force_flush()
        exporter.keep = False
        return list(exporter.kept)

    problems = []
    for name in ("step", "tool"):
        gym = collect(lambda name=name: _with(v["gym_enclosing"], v[f"gym_{name}"]))
        hand = collect(lambda name=name: _with(v["hand_enclosing"], v[f"hand_{name}"]))
        if shape(gym) != shape(hand):
            problems.append(f"{name}: {shape(gym)} != {shape(hand)}")
    gym = collect(lambda: v["gym_nested"](0))
    hand = collect(lambda: v["hand_nested"](0))
    if shape(gym) != shape(hand):
        problems.append(f"nested: {shape(gym)} != {shape(hand)}")
    return problems


def _with(enclosing: Callable[[], Any], fn: Callable[[int], Any]) -> None:
    with enclosing():
        fn(0)


def bench_enabled(n: int, repeats: int) -> tuple[list[Row], dict[str, float], list[str]]:
    provider, exporter, tracer = _sdk_setup()
    v = _build_variants(tracer)
    problems = _check_like_for_like(provider, exporter, v)

    def sync_pair(gym: Callable[[int], Any], hand: Callable[[int], Any], calls: int) -> list[list[float]]:
        def timed(fn: Callable[[int], Any], enclosing: Callable[[], Any]) -> Callable[[], float]:
            def run() -> float:
                with enclosing():
                    return _time_block(fn, calls)

            return run

        return _interleaved([timed(gym, v["gym_enclosing"]), timed(hand, v["hand_enclosing"])], repeats)

    rows = []
    for _ in range(2):  # warm up caches, the batch thread and the allocator
        sync_pair(v["gym_step"], v["hand_step"], n // 10)
    g, h = sync_pair(v["gym_step"], v["hand_step"], n)
    rows.append(Row("sync    @step", g, h, 1))
    g, h = sync_pair(v["gym_tool"], v["hand_tool"], n)
    rows.append(Row("sync    @tool_call", g, h, 1))

    loop = asyncio.new_event_loop()
    try:

        def async_timed(fn: Callable[[int], Any], enclosing: Callable[[], Any]) -> Callable[[], float]:
            def run() -> float:
                with enclosing():
                    return _time_async_block(loop, fn, n)

            return run

        g, h = _interleaved(
            [
                async_timed(v["gym_astep"], v["gym_enclosing"]),
                async_timed(v["hand_astep"], v["hand_enclosing"]),
            ],
            repeats,
        )
        rows.append(Row("async   @step", g, h, 1))
    finally:
        loop.close()

    nested_n = max(n // 6, 100)
    g, h = _interleaved(
        [lambda: _time_block(v["gym_nested"], nested_n), lambda: _time_block(v["hand_nested"], nested_n)],
        repeats,
    )
    rows.append(Row("nested  6 levels (per call = 6 spans)", g, h, 6))

    # The bare API call, for comparison with REFERENCE.md's performance facts.
    def bare(x: int) -> int:
        with tracer.start_as_current_span("bare"):
            return x

    def bare_attrs(x: int) -> int:
        with tracer.start_as_current_span("bare", attributes={**IDENTITY, "gym.kind": "step"}):
            return x

    b, ba = _interleaved([lambda: _time_block(bare, n), lambda: _time_block(bare_attrs, n)], repeats)
    reference = {"bare": statistics.median(b), "bare_7_attributes": statistics.median(ba)}

    provider.force_flush()
    provider.shutdown()
    return rows, reference, problems


# -- the disabled path (runs in a subprocess) -----------------------------------------------------


def disabled_child(n: int, repeats: int) -> dict[str, float]:
    """Undecorated vs decorated calls with tracing off. Prints JSON for the parent."""
    import gymtrace
    from gymtrace._scopes.tracing import active_tracer

    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider

        trace.set_tracer_provider(TracerProvider())
    assert active_tracer() is None, "tracing should be off in this process"

    step = gymtrace.step(work)
    tool = gymtrace.tool_call(tool_name="search")(work)
    astep = gymtrace.step(awork)
    for fn in (work, step, tool):
        _time_block(fn, n // 10)
    plain, d_step, d_tool = _interleaved(
        [lambda: _time_block(work, n), lambda: _time_block(step, n), lambda: _time_block(tool, n)], repeats
    )
    loop = asyncio.new_event_loop()
    try:
        a_plain, a_step = _interleaved(
            [lambda: _time_async_block(loop, awork, n), lambda: _time_async_block(loop, astep, n)], repeats
        )
    finally:
        loop.close()

    def diff(a: list[float], b: list[float]) -> float:
        return statistics.median(x - y for x, y in zip(a, b, strict=True))

    return {
        "plain": statistics.median(plain),
        "step": statistics.median(d_step),
        "tool": statistics.median(d_tool),
        "step_diff": diff(d_step, plain),
        "tool_diff": diff(d_tool, plain),
        "aplain": statistics.median(a_plain),
        "astep": statistics.median(a_step),
        "astep_diff": diff(a_step, a_plain),
    }


def bench_disabled(n: int, repeats: int, sdk_disabled: bool, clock: str) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    if sdk_disabled:
        env["OTEL_SDK_DISABLED"] = "true"
    out = subprocess.run(
        [sys.executable, __file__, "--clock", clock, "--disabled-child", str(n), str(repeats)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- CLI ----------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations (noisier)")
    parser.add_argument(
        "--clock",
        choices=("cpu", "wall"),
        default="cpu",
        help="process CPU time (default, robust on a shared machine) or wall-clock time",
    )
    parser.add_argument("--disabled-child", nargs=2, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    global _clock
    _clock = time.process_time_ns if args.clock == "cpu" else time.perf_counter_ns

    if args.disabled_child:
        print(json.dumps(disabled_child(*args.disabled_child)))
        return 0

    n, repeats, disabled_n = (2_000, 5, 50_000) if args.quick else (10_000, 9, 300_000)

    import opentelemetry.version

    print(
        f"gymtrace overhead  (Python {sys.version.split()[0]}, opentelemetry {opentelemetry.version.__version__},"
        f" {n} calls x {repeats} repeats, median)"
    )
    print()
    no_sdk = bench_disabled(disabled_n, repeats, sdk_disabled=False, clock=args.clock)
    sdk_off = bench_disabled(disabled_n, repeats, sdk_disabled=True, clock=args.clock)
    rows, reference, problems = bench_enabled(n, repeats)

    print("Enabled: SDK TracerProvider + IdentitySpanProcessor + BatchSpanProcessor(drop exporter)")
    header = (
        f"  {'variant':<40} {'gymtrace µs':>12} {'by hand µs':>11} {'ratio':>7}  {'min..max':>11}  target"
    )
    print(header)
    print("  " + "-" * (len(header) - 2))
    for row in rows:
        ok = "ok" if row.ratio <= TARGET_RATIO else "OVER"
        print(
            f"  {row.name:<40} {row.gym:>12.1f} {row.hand:>11.1f} {row.ratio:>6.2f}x"
            f"  {row.spread[0]:.2f}..{row.spread[1]:.2f}  <= {TARGET_RATIO:.2f}x {ok}"
        )
    print()
    print(
        "  hand-written start_as_current_span alone (same provider): "
        f"{reference['bare']:.1f} µs bare, {reference['bare_7_attributes']:.1f} µs with 7 attributes"
    )
    print(
        f"  like-for-like check of spans (names, kinds, attribute keys, parents, links): "
        f"{'identical' if not problems else 'DIFFERENT'}"
    )
    for problem in problems:
        print(f"    {problem}")
    print()
    print("Disabled: decorated minus undecorated call of the same function (subprocess)")
    print(f"  {'mode':<58} {'undecorated µs':>15} {'decorated µs':>13} {'difference µs':>14}  target")
    for label, d in (("no SDK provider", no_sdk), ("SDK provider, OTEL_SDK_DISABLED=true", sdk_off)):
        for name, base, value, diff in (
            ("sync @step", d["plain"], d["step"], d["step_diff"]),
            ("sync @tool_call", d["plain"], d["tool"], d["tool_diff"]),
            ("async @step (awaited)", d["aplain"], d["astep"], d["astep_diff"]),
        ):
            ok = "ok" if diff <= TARGET_DISABLED_US else "OVER"
            print(
                f"  {label + ', ' + name:<58} {base:>15.3f} {value:>13.3f} {diff:>14.3f}"
                f"  <= {TARGET_DISABLED_US:.1f} {ok}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
