"""Gym identity reaches every span below its scope: across await, tasks, threads and generators."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import gymtrace
from gymtrace import attributes as c
from gymtrace.testing import CapturedSpans
from tree_asserts import assert_child

IDENTITY = {
    c.RUN_ID: "run-1",
    c.TASK_ID: "task-1",
    c.ROLLOUT_ID: "r-1",
    c.ROLLOUT_REPEAT: 2,
    c.EPISODE_ATTEMPT: 0,
    c.EPISODE_ID: "r-1",
}


def _identity(span: Any) -> dict[str, Any]:
    return {k: span.attributes[k] for k in c.IDENTITY_KEYS if k in span.attributes}


def test_identity_is_on_every_span_below_the_episode_including_foreign_spans(captured: CapturedSpans) -> None:
    foreign = captured.tracer_provider.get_tracer("httpx-like-client")
    with gymtrace.run(run_id="run-1"), gymtrace.rollout(rollout_id="r-1", task_id="task-1", repeat=2):
        with gymtrace.episode():
            with gymtrace.agent_invocation(agent_name="a"), gymtrace.step():
                with gymtrace.model_call(model="m"):
                    with foreign.start_as_current_span("POST /v1/chat/completions"):
                        pass
    below_episode = [s for s in captured.spans if s.attributes.get(c.KIND) not in ("run", "rollout")]
    assert len(below_episode) == 5
    for span in below_episode:
        assert _identity(span) == IDENTITY, span.name
    http = next(s for s in captured.spans if s.name.startswith("POST"))
    assert c.KIND not in http.attributes  # identity, not a gym kind
    assert_child(http, captured.one("model_call"))


def test_each_level_carries_its_own_and_the_enclosing_identity(captured: CapturedSpans) -> None:
    with gymtrace.run(run_id="run-1"), gymtrace.rollout(rollout_id="r-1", task_id="task-1", repeat=2):
        with gymtrace.episode():
            pass
    assert _identity(captured.one("run")) == {c.RUN_ID: "run-1"}
    assert _identity(captured.one("rollout")) == {
        c.RUN_ID: "run-1",
        c.TASK_ID: "task-1",
        c.ROLLOUT_ID: "r-1",
        c.ROLLOUT_REPEAT: 2,
    }
    assert _identity(captured.one("episode")) == IDENTITY


def test_foreign_span_outside_gym_scopes_gets_no_identity(captured: CapturedSpans) -> None:
    foreign = captured.tracer_provider.get_tracer("other")
    with gymtrace.rollout(rollout_id="r-1"):
        pass
    with foreign.start_as_current_span("unrelated"):
        pass
    unrelated = next(s for s in captured.spans if s.name == "unrelated")
    assert _identity(unrelated) == {}


def test_thousand_concurrent_asyncio_rollouts_keep_their_own_identity(captured: CapturedSpans) -> None:
    foreign = captured.tracer_provider.get_tracer("client")

    @gymtrace.rollout(rollout_id=lambda i: f"r-{i}", task_id=lambda i: f"t-{i % 10}")
    async def rollout(i: int) -> tuple[str | None, int | None]:
        @gymtrace.episode
        async def episode() -> tuple[str | None, int | None]:
            for _ in range(2):
                with gymtrace.step():
                    await asyncio.sleep(0)  # interleave with every other rollout
                    with foreign.start_as_current_span("call"):
                        await asyncio.sleep(0)
            now = gymtrace.current()
            return now.rollout_id, now.attempt

        return await episode()

    async def main() -> list[tuple[str | None, int | None]]:
        return await asyncio.gather(*(rollout(i) for i in range(1000)))

    results = asyncio.run(main())
    assert results == [(f"r-{i}", 0) for i in range(1000)]
    spans = captured.spans
    assert len(spans) == 1000 * 6
    by_id = {s.get_span_context().span_id: s for s in spans}
    rollout_of_trace = {
        s.get_span_context().trace_id: s.attributes[c.ROLLOUT_ID]
        for s in spans
        if s.attributes.get(c.KIND) == "rollout"
    }
    for span in spans:
        rollout_id = span.attributes[c.ROLLOUT_ID]
        # No cross-talk: identity, trace and parent all belong to the same rollout.
        assert rollout_of_trace[span.get_span_context().trace_id] == rollout_id
        assert span.attributes[c.TASK_ID] == f"t-{int(rollout_id[2:]) % 10}"
        if span.parent is not None:
            assert by_id[span.parent.span_id].attributes[c.ROLLOUT_ID] == rollout_id


def test_thread_pool_workers_inherit_identity_with_copy_context(captured: CapturedSpans) -> None:
    @gymtrace.tool_call
    def work(i: int) -> str | None:
        return gymtrace.current().rollout_id

    with gymtrace.rollout(rollout_id="r-threads"), gymtrace.episode(), ThreadPoolExecutor(4) as pool:
        # The documented one-liner: run the task inside a copy of the caller's context.
        futures = [pool.submit(contextvars.copy_context().run, work, i) for i in range(8)]
        results = [f.result() for f in futures]
    assert results == ["r-threads"] * 8
    episode = captured.one("episode")
    for tool in captured.by_kind("tool_call"):
        assert tool.attributes[c.ROLLOUT_ID] == "r-threads"
        assert_child(tool, episode)


def test_plain_thread_without_context_copy_has_no_identity(captured: CapturedSpans) -> None:
    seen: list[str | None] = []
    with gymtrace.rollout(rollout_id="r-1"):
        thread = threading.Thread(target=lambda: seen.append(gymtrace.current().rollout_id))
        thread.start()
        thread.join()
    assert seen == [None]  # threads start with an empty context; see the copy_context one-liner


def test_generator_resumed_in_another_context_keeps_its_own_identity(captured: CapturedSpans) -> None:
    @gymtrace.episode
    def actions() -> Any:
        for _ in range(3):
            with gymtrace.step():
                pass
            yield gymtrace.current().rollout_id

    with gymtrace.rollout(rollout_id="r-gen"):
        gen = actions()
        first = next(gen)
    # Resumed outside the rollout, and inside another one: the body still sees its own rollout.
    second = next(gen)
    with gymtrace.rollout(rollout_id="r-other"):
        third = next(gen)
        assert gymtrace.current().rollout_id == "r-other"  # nothing leaked out of the generator
    assert (first, second, third) == ("r-gen", "r-gen", "r-gen")
    assert list(gen) == []
    episode = captured.one("episode")
    for step in captured.by_kind("step"):
        assert step.attributes[c.ROLLOUT_ID] == "r-gen"
        assert_child(step, episode)


def test_async_generator_resumed_from_another_task_keeps_its_identity(captured: CapturedSpans) -> None:
    @gymtrace.episode
    async def actions() -> Any:
        for _ in range(2):
            await asyncio.sleep(0)
            yield gymtrace.current().rollout_id

    async def main() -> list[str | None]:
        with gymtrace.rollout(rollout_id="r-agen"):
            agen = actions()
            first = await agen.__anext__()
        second = await asyncio.create_task(agen.__anext__())  # type: ignore[arg-type]
        rest = [x async for x in agen]
        return [first, second, *rest]

    assert asyncio.run(main()) == ["r-agen", "r-agen"]
    assert captured.one("episode").attributes[c.ROLLOUT_ID] == "r-agen"


def test_current_gives_join_keys_for_the_trajectory_record(captured: CapturedSpans) -> None:
    with gymtrace.run(run_id="run-1"), gymtrace.rollout(rollout_id="r-1", task_id="t", repeat=0) as rollout:
        with gymtrace.episode() as episode:
            keys = gymtrace.current().join_keys()
    assert keys == {
        c.RUN_ID: "run-1",
        c.TASK_ID: "t",
        c.ROLLOUT_ID: "r-1",
        c.ROLLOUT_REPEAT: 0,
        c.EPISODE_ATTEMPT: 0,
        c.EPISODE_ID: "r-1",
        "trace_id": episode.trace_id,
        # What a train step's link to the rollout needs (gymtrace.consume), added in issue 44.
        "rollout_span_id": rollout.span_id,
    }
    assert gymtrace.current().join_keys() == {}


def test_episode_ids_follow_the_attempt(captured: CapturedSpans) -> None:
    with gymtrace.rollout(rollout_id="r-9"):
        for _ in range(3):
            with gymtrace.episode():
                pass
    ids = sorted(
        (s.attributes[c.EPISODE_ATTEMPT], s.attributes[c.EPISODE_ID]) for s in captured.by_kind("episode")
    )
    assert ids == [(0, "r-9"), (1, "r-9-a1"), (2, "r-9-a2")]


def test_one_scope_object_shared_by_concurrent_tasks_ends_each_span_on_time(captured: CapturedSpans) -> None:
    shared = gymtrace.tool_call(tool_name="shared")
    span_ids: dict[str, str] = {}

    async def task(name: str, delay: float) -> None:
        async with shared as scope:
            span_ids[name] = scope.span_id
            await asyncio.sleep(delay)

    async def main() -> None:
        await asyncio.gather(task("quick", 0.01), task("slow", 0.05))

    asyncio.run(main())
    by_id = {format(s.get_span_context().span_id, "016x"): s for s in captured.by_kind("tool_call")}
    quick, slow = by_id[span_ids["quick"]], by_id[span_ids["slow"]]
    assert quick.end_time < slow.end_time  # each task ended its own span, not the other's
    assert quick.parent is None and slow.parent is None  # neither became the other's parent


def test_with_blocks_leave_nothing_behind_in_a_long_lived_context(captured: CapturedSpans) -> None:
    # A training loop runs for days in one context; each `with gymtrace.step():` is a new Scope.
    def loop() -> int:
        before = len(contextvars.copy_context())
        for _ in range(1000):
            with gymtrace.step():
                pass
        return len(contextvars.copy_context()) - before

    assert contextvars.copy_context().run(loop) <= 1
