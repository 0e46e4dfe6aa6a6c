"""Exceptions are handled exactly like opentelemetry.trace.use_span; generators end cleanly."""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import context as otel_context
from opentelemetry.trace import StatusCode

import gymtrace
from child_process import clean_env, run_python
from gymtrace import attributes as c
from gymtrace.testing import CapturedSpans


class Boom(Exception):
    pass


KINDS: list[tuple[Callable[..., Any], str]] = [
    (gymtrace.run, "run"),
    (gymtrace.rollout, "rollout"),
    (gymtrace.episode, "episode"),
    (gymtrace.seed_session, "seed_session"),
    (gymtrace.verify, "verify"),
    (gymtrace.agent_invocation, "agent_invocation"),
    (gymtrace.turn, "turn"),
    (gymtrace.step, "step"),
    (gymtrace.model_call, "model_call"),
    (gymtrace.tool_call, "tool_call"),
]


def _assert_error_recorded(span: Any, exc_type: type[BaseException]) -> None:
    assert span.status.status_code == StatusCode.ERROR
    assert span.status.description.startswith(exc_type.__name__)
    assert span.attributes[c.ERROR_TYPE].endswith(exc_type.__qualname__)
    assert [e.name for e in span.events] == ["exception"]
    assert span.end_time is not None


@pytest.mark.parametrize(("factory", "kind"), KINDS, ids=[k for _, k in KINDS])
def test_exception_is_recorded_and_reraised_unchanged_by_every_callable_kind(
    captured: CapturedSpans, factory: Callable[..., Any], kind: str
) -> None:
    error = Boom("bad")
    before = otel_context.get_current()

    @factory
    def sync() -> None:
        raise error

    @factory
    async def coro() -> None:
        raise error

    @factory
    def gen() -> Any:
        yield 1
        raise error

    @factory
    async def agen() -> Any:
        yield 1
        raise error

    async def drain(source: Any) -> None:
        async for _ in source:
            pass

    for call in (sync, lambda: asyncio.run(coro()), lambda: list(gen()), lambda: asyncio.run(drain(agen()))):
        with pytest.raises(Boom) as info:
            call()
        assert info.value is error
        assert otel_context.get_current() == before  # the context token was detached
    with pytest.raises(Boom) as info, factory():
        raise error
    assert info.value is error
    spans = captured.by_kind(kind)
    assert len(spans) == 5
    for span in spans:
        _assert_error_recorded(span, Boom)


def test_cancelled_coroutine_ends_span_without_error_status(captured: CapturedSpans) -> None:
    started = asyncio.Event()

    @gymtrace.step
    async def slow() -> None:
        started.set()
        await asyncio.sleep(10)

    async def main() -> None:
        task = asyncio.create_task(slow())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    span = captured.one("step")
    assert span.status.status_code == StatusCode.UNSET
    assert span.end_time is not None


def test_cancelled_episode_has_outcome_cancelled_not_failed(captured: CapturedSpans) -> None:
    async def main() -> None:
        with gymtrace.rollout(rollout_id="r-1"):

            @gymtrace.episode
            async def episode() -> None:
                await asyncio.sleep(10)

            # wait_for, not asyncio.timeout (3.11+): the version matrix runs this on 3.10 too.
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(episode(), 0.01)

    asyncio.run(main())
    episode = captured.one("episode")
    assert episode.attributes[c.EPISODE_OUTCOME] == "cancelled"
    assert c.FAILURE_KIND not in episode.attributes
    assert episode.status.status_code == StatusCode.UNSET
    assert captured.one("rollout").attributes[c.ROLLOUT_OUTCOME] == "unscored"


def test_keyboard_interrupt_ends_span_without_error(captured: CapturedSpans) -> None:
    @gymtrace.episode
    def episode() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        episode()
    span = captured.one("episode")
    assert span.status.status_code == StatusCode.UNSET
    assert span.attributes[c.EPISODE_OUTCOME] == "cancelled"


@pytest.mark.skipif(sys.version_info < (3, 11), reason="asyncio.timeout() is new in Python 3.11")
def test_asyncio_timeout_still_applies_to_a_traced_async_generator(captured: CapturedSpans) -> None:
    # A wrapper that ran each step in its own task would escape the caller's timeout.
    @gymtrace.step
    async def stream() -> Any:
        yield 1
        await asyncio.sleep(10)
        yield 2

    async def main() -> list[int]:
        items: list[int] = []
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                async for item in stream():
                    items.append(item)
        return items

    assert asyncio.run(main()) == [1]
    assert captured.one("step").end_time is not None


def test_early_break_from_generator_is_not_an_error(captured: CapturedSpans) -> None:
    closed: list[bool] = []

    @gymtrace.step
    def numbers() -> Any:
        try:
            yield from range(100)
        finally:
            closed.append(True)

    for n in numbers():
        if n == 2:
            break
    assert closed == [True]
    span = captured.one("step")
    assert span.status.status_code == StatusCode.UNSET
    assert span.events == ()
    assert span.attributes[c.INTERRUPTED] is True  # its work did not finish, and the span says so


def test_early_break_from_async_generator_is_not_an_error(captured: CapturedSpans) -> None:
    @gymtrace.step
    async def numbers() -> Any:
        for i in range(100):
            yield i

    async def main() -> None:
        agen = numbers()
        async for n in agen:
            if n == 2:
                break
        await agen.aclose()

    asyncio.run(main())
    span = captured.one("step")
    assert span.status.status_code == StatusCode.UNSET
    assert span.end_time is not None
    assert span.attributes[c.INTERRUPTED] is True


def test_abandoned_generator_span_ends_on_garbage_collection(captured: CapturedSpans) -> None:
    @gymtrace.step
    def numbers() -> Any:
        yield from range(10)

    gen = numbers()
    next(gen)
    assert captured.by_kind("step") == []  # still open while suspended
    del gen
    gc.collect()
    span = captured.one("step")
    assert span.end_time is not None
    assert span.attributes[c.INTERRUPTED] is True
    assert span.status.status_code == StatusCode.UNSET


def test_generator_span_covers_the_whole_iteration_and_children(captured: CapturedSpans) -> None:
    @gymtrace.episode
    def steps() -> Any:
        for i in range(3):
            with gymtrace.step():
                yield i

    items = []
    for item in steps():
        items.append(item)
        # The consumer runs outside the generator's context between items.
        assert gymtrace.current().kind is None
    assert items == [0, 1, 2]
    episode = captured.one("episode")
    steps_spans = captured.by_kind("step")
    assert len(steps_spans) == 3
    for step in steps_spans:
        assert step.parent.span_id == episode.get_span_context().span_id
        assert episode.start_time <= step.start_time and step.end_time <= episode.end_time


def test_send_and_throw_reach_the_generator_body(captured: CapturedSpans) -> None:
    @gymtrace.step
    def echo() -> Any:
        received = []
        while True:
            try:
                value = yield len(received)
            except ValueError:
                received.append("thrown")
                continue
            if value is None:
                return received
            received.append(value)

    gen = echo()
    assert next(gen) == 0
    assert gen.send("a") == 1
    assert gen.throw(ValueError("x")) == 2
    with pytest.raises(StopIteration) as stop:
        gen.send(None)
    assert stop.value.value == ["a", "thrown"]
    assert captured.one("step").status.status_code == StatusCode.UNSET


def test_asend_and_athrow_reach_the_async_generator_body(captured: CapturedSpans) -> None:
    @gymtrace.step
    async def echo() -> Any:
        total = 0
        while True:
            try:
                value = yield total
            except ValueError:
                total += 100
                continue
            total += value

    async def main() -> list[int]:
        agen = echo()
        out = [await agen.asend(None), await agen.asend(2), await agen.athrow(ValueError("x"))]
        await agen.aclose()
        return out

    assert asyncio.run(main()) == [0, 2, 102]
    assert captured.one("step").end_time is not None


def test_internal_error_never_reaches_user_code(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Outside strict mode a failing identity callable is logged once, the call goes on.

    def broken(x: int) -> str:
        raise RuntimeError("identity callable failed")

    @gymtrace.rollout(rollout_id=broken)
    def rollout(x: int) -> int:
        return x * 2

    with (
        gymtrace.testing.capture_spans(strict=False) as captured,
        caplog.at_level(logging.WARNING, "gymtrace"),
    ):
        assert rollout(2) == 4
        assert rollout(3) == 6
    assert len(captured.by_kind("rollout")) == 2
    internal = [r for r in caplog.records if "internal error" in r.getMessage()]
    assert len(internal) == 1  # logged once, not per call


def test_internal_error_is_loud_in_strict_mode() -> None:
    def broken(x: int) -> str:
        raise RuntimeError("identity callable failed")

    @gymtrace.rollout(rollout_id=broken)
    def rollout(x: int) -> int:
        return x

    with gymtrace.testing.capture_spans(strict=True), pytest.raises(RuntimeError, match="identity callable"):
        rollout(1)
    with gymtrace.testing.capture_spans(strict=False), gymtrace.testing.strict():
        with pytest.raises(RuntimeError, match="identity callable"):
            rollout(1)


def test_a_test_runner_variable_does_not_change_what_gymtrace_does(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A user's test suite runs under pytest (PYTEST_CURRENT_TEST is set): it must run the code
    # production runs, so an internal error is logged, not raised, unless strict mode is asked for
    # (issue 31).
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/test_users.py::test_theirs (call)")

    def broken(x: int) -> str:
        raise RuntimeError("identity callable failed")

    @gymtrace.rollout(rollout_id=broken)
    def rollout(x: int) -> int:
        return x * 2

    with (
        gymtrace.testing.strict(False),
        gymtrace.testing.capture_spans(strict=None),
        caplog.at_level(logging.WARNING, "gymtrace"),
    ):
        assert rollout(2) == 4
    assert any("internal error" in r.getMessage() for r in caplog.records)


def test_strict_mode_reaches_a_child_process_only_through_gymtrace_strict(tmp_path: Path) -> None:
    # The same program under a test runner's variable and with GYMTRACE_STRICT: only the variable
    # gymtrace documents turns its internal errors into exceptions.
    code = """
    import gymtrace
    from gymtrace.testing import capture_spans

    def broken(x):
        raise RuntimeError("identity callable failed")

    with capture_spans(strict=None):
        print("returned", gymtrace.rollout(rollout_id=broken)(lambda x: x * 2)(2))
    """
    runner = run_python(code=code, cwd=tmp_path, env=clean_env(PYTEST_CURRENT_TEST="t.py::t (call)"))
    assert runner.returncode == 0, runner.stderr
    assert "returned 4" in runner.stdout
    assert "internal error" in runner.stderr
    strict = run_python(code=code, cwd=tmp_path, env=clean_env(GYMTRACE_STRICT="true"))
    assert strict.returncode != 0
    assert "RuntimeError: identity callable failed" in strict.stderr


@pytest.mark.parametrize(("factory", "kind"), KINDS, ids=[k for _, k in KINDS])
def test_cancellation_ends_span_without_error_for_every_level_and_async_kind(
    captured: CapturedSpans, factory: Callable[..., Any], kind: str
) -> None:
    @factory
    async def coro() -> None:
        await asyncio.sleep(10)

    @factory
    async def agen() -> Any:
        yield 1
        await asyncio.sleep(10)
        yield 2

    async def drain() -> None:
        async for _ in agen():
            pass

    async def main() -> None:
        for target in (coro, drain):
            task = asyncio.ensure_future(target())
            await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    before = otel_context.get_current()
    asyncio.run(main())
    assert otel_context.get_current() == before
    spans = captured.by_kind(kind)
    assert len(spans) == 2
    for span in spans:
        assert span.status.status_code == StatusCode.UNSET
        assert span.end_time is not None
        assert c.INTERRUPTED not in span.attributes  # cancellation is not a process interruption
        if kind == "episode":
            assert span.attributes[c.EPISODE_OUTCOME] == "cancelled"
