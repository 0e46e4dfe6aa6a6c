"""gymtrace with opentelemetry-api only: no SDK installed, so tracing is off.

These tests run in a separate environment that has ``opentelemetry-api``, ``wrapt`` and ``pytest``
plus gymtrace installed with ``--no-deps``; the main test run deselects them (``-m "not sdkless"``
in pyproject.toml's addopts). From the repository root::

    python3 -m venv .venv-api
    .venv-api/bin/pip install -q opentelemetry-api wrapt pytest
    .venv-api/bin/pip install -q --no-deps -e .
    .venv-api/bin/python -m pytest tests/sdkless -m sdkless --confcutdir=tests/sdkless

``--confcutdir`` keeps ``tests/conftest.py`` (which may use the SDK) out of this run. The first
test fails, rather than skips, when the SDK is importable: selected with ``-m sdkless`` these tests
must prove the API-only promise (``pip install gymtrace`` depends on opentelemetry-api only, as the
README says), and would prove nothing with the SDK present.
"""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator

import pytest

import gymtrace

pytestmark = pytest.mark.sdkless


class Boom(Exception):
    pass


def test_the_sdk_is_not_installed_here() -> None:
    assert importlib.util.find_spec("opentelemetry.sdk") is None, (
        "opentelemetry-sdk is importable: run these tests in the API-only venv (see module docstring)"
    )


def test_import_gymtrace_needs_only_the_api() -> None:
    code = (
        "import sys, gymtrace, gymtrace.testing, gymtrace.propagation;"
        "sdk = sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk'));"
        "assert not sdk, sdk"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# -- decorated callables behave exactly like the undecorated ones ------------------------------------


def plain_function(x: int, *, y: int = 1) -> tuple[int, int]:
    return x, y


def plain_raising(error: BaseException) -> None:
    raise error


async def plain_coroutine(x: int) -> int:
    await asyncio.sleep(0)
    return x * 2


async def plain_coroutine_raising(error: BaseException) -> None:
    await asyncio.sleep(0)
    raise error


def plain_generator(n: int) -> Iterator[int]:
    received = []
    for i in range(n):
        got = yield i
        received.append(got)
    return sum(x for x in received if x is not None)


def plain_generator_raising(error: BaseException) -> Iterator[int]:
    yield 1
    raise error


async def plain_async_generator(n: int) -> AsyncIterator[int]:
    for i in range(n):
        await asyncio.sleep(0)
        yield i


async def plain_async_generator_raising(error: BaseException) -> AsyncIterator[int]:
    yield 1
    raise error


SCOPES = [
    pytest.param(lambda: gymtrace.run, id="bare run"),
    pytest.param(lambda: gymtrace.rollout(rollout_id="r-1", task_id="t", repeat=0), id="rollout"),
    pytest.param(lambda: gymtrace.episode(attempt=0), id="episode"),
    pytest.param(lambda: gymtrace.step, id="bare step"),
    pytest.param(lambda: gymtrace.tool_call(tool_name="search"), id="tool_call"),
    pytest.param(lambda: gymtrace.model_call(model="m", provider="p"), id="model_call"),
    pytest.param(lambda: gymtrace.verify(reward_from="reward"), id="verify"),
]


@pytest.mark.parametrize("scope", SCOPES)
def test_sync_function_returns_and_raises_like_the_original(scope) -> None:
    decorated = scope()(plain_function)
    assert decorated(3, y=4) == plain_function(3, y=4)
    raising = scope()(plain_raising)
    error = Boom("x")
    with pytest.raises(Boom) as caught:
        raising(error)
    assert caught.value is error


@pytest.mark.parametrize("scope", SCOPES)
def test_coroutine_returns_and_raises_like_the_original(scope) -> None:
    decorated = scope()(plain_coroutine)
    assert asyncio.iscoroutinefunction(decorated)
    assert asyncio.run(decorated(5)) == asyncio.run(plain_coroutine(5))
    raising = scope()(plain_coroutine_raising)
    error = Boom("x")
    with pytest.raises(Boom) as caught:
        asyncio.run(raising(error))
    assert caught.value is error


@pytest.mark.parametrize("scope", SCOPES)
def test_generator_yields_receives_returns_and_raises_like_the_original(scope) -> None:
    def drive(gen: Iterator[int]) -> tuple[list[int], object]:
        items = [next(gen)]
        try:
            while True:
                items.append(gen.send(10))
        except StopIteration as stop:
            return items, stop.value

    decorated = scope()(plain_generator)
    assert drive(decorated(4)) == drive(plain_generator(4))
    assert list(decorated(3)) == [0, 1, 2]

    raising = scope()(plain_generator_raising)
    error = Boom("x")
    gen = raising(error)
    assert next(gen) == 1
    with pytest.raises(Boom) as caught:
        next(gen)
    assert caught.value is error

    # throw() reaches the body; close() after an early stop is not an error.
    gen = decorated(5)
    next(gen)
    thrown = Boom("thrown")
    with pytest.raises(Boom) as caught:
        gen.throw(thrown)
    assert caught.value is thrown
    gen = decorated(5)
    next(gen)
    gen.close()


@pytest.mark.parametrize("scope", SCOPES)
def test_async_generator_yields_and_raises_like_the_original(scope) -> None:
    async def collect(agen: AsyncIterator[int]) -> list[int]:
        return [item async for item in agen]

    decorated = scope()(plain_async_generator)
    assert asyncio.run(collect(decorated(4))) == asyncio.run(collect(plain_async_generator(4)))

    raising = scope()(plain_async_generator_raising)
    error = Boom("x")
    with pytest.raises(Boom) as caught:
        asyncio.run(collect(raising(error)))
    assert caught.value is error

    async def stop_early() -> int:
        agen = decorated(10)
        async for item in agen:
            if item == 2:
                break
        await agen.aclose()  # type: ignore[attr-defined]
        return item

    assert asyncio.run(stop_early()) == 2


def test_methods_classmethods_and_staticmethods_keep_working() -> None:
    class Env:
        def __init__(self) -> None:
            self.calls = 0

        @gymtrace.tool_call
        def act(self, x: int) -> int:
            self.calls += 1
            return x + self.calls

        @gymtrace.tool_call
        @classmethod
        def make(cls, x: int) -> tuple[type, int]:
            return cls, x

        @gymtrace.tool_call
        @staticmethod
        def score(x: int) -> int:
            return -x

    env = Env()
    assert env.act(1) == 2
    assert Env.make(3) == (Env, 3)
    assert Env.score(4) == -4
    assert env.score(5) == -5


def test_identity_callables_are_harmless_when_tracing_is_off() -> None:
    @gymtrace.rollout(rollout_id=lambda row: row["id"], task_id=lambda row: row["task"])
    def run_rollout(row: dict[str, str]) -> dict[str, str]:
        return row

    row = {"id": "r-1", "task": "t-1"}
    assert run_rollout(row) is row
    assert row == {"id": "r-1", "task": "t-1"}


# -- `with` / `async with` scopes -------------------------------------------------------------------


def test_with_scopes_nest_and_let_exceptions_through_unchanged() -> None:
    levels = (
        gymtrace.agent_invocation(agent_name="a"),
        gymtrace.turn(),
        gymtrace.step(),
        gymtrace.tool_call(tool_name="t"),
        gymtrace.model_call(model="m"),  # an LLM tool: a model call inside a tool call
    )
    with gymtrace.run(run_id="run-1"), gymtrace.rollout(rollout_id="r-1"), gymtrace.episode() as episode:
        with levels[0], levels[1], levels[2], levels[3], levels[4]:
            value = 42
        with gymtrace.verify():
            gymtrace.record_reward(1.0)
        episode.record_reward(0.5)
    assert value == 42

    error = Boom("x")
    with pytest.raises(Boom) as caught, gymtrace.episode():
        raise error
    assert caught.value is error

    interrupt = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt) as caught_interrupt, gymtrace.step():
        raise interrupt
    assert caught_interrupt.value is interrupt


def test_async_with_scopes_behave_like_with() -> None:
    async def body() -> int:
        async with gymtrace.rollout(rollout_id="r-1"), gymtrace.episode():
            await asyncio.sleep(0)
            return 7

    assert asyncio.run(body()) == 7

    async def raising(error: BaseException) -> None:
        async with gymtrace.step():
            raise error

    error = Boom("x")
    with pytest.raises(Boom) as caught:
        asyncio.run(raising(error))
    assert caught.value is error


def test_current_is_empty_without_tracing() -> None:
    outside = gymtrace.current()
    assert outside.rollout_id is None and outside.trace_id is None
    with gymtrace.rollout(rollout_id="r-1"), gymtrace.episode():
        inside = gymtrace.current()
    # Tracing is off, so there is no scope to report, but the call works and returns a Current.
    assert isinstance(inside, gymtrace.Current)
    assert inside.trace_id is None


def test_propagation_works_without_the_sdk() -> None:
    headers: dict[str, str] = {}
    gymtrace.propagation.inject(headers)
    with gymtrace.propagation.attach(headers):
        pass


# -- configure() says what to install -----------------------------------------------------------------


def test_configure_raises_import_error_naming_the_sdk_extra(monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)  # the default file exporter must not litter the checkout
    for name in list(__import__("os").environ):
        if name.startswith(("OTEL_", "GYMTRACE_")):
            monkeypatch.delenv(name)
    with pytest.raises(ImportError) as caught:
        gymtrace.configure(service_name="api-only")
    assert "gymtrace[sdk]" in str(caught.value)
    assert list(tmp_path.iterdir()) == []


def test_capture_spans_raises_import_error_without_the_sdk() -> None:
    with pytest.raises(ImportError), gymtrace.testing.capture_spans():
        pass


def test_public_modules_import_without_the_sdk_and_rollout_sampler_names_the_extra() -> None:
    # gymtrace.sampling is public: importing it (and its SDK-free keep_rollout) must work API-only;
    # only the SDK sampler itself needs the SDK, and says which extra to install.
    code = (
        "import sys, gymtrace.sampling, gymtrace.instrumentation, gymtrace.attributes;"
        "from gymtrace.sampling import keep_rollout;"
        "assert keep_rollout('r-1', 1.0) and not keep_rollout('r-1', 0.0);"
        "sdk = sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk'));"
        "assert not sdk, sdk\n"
        "try:\n"
        "    from gymtrace.sampling import RolloutSampler\n"
        "except ImportError as exc:\n"
        '    assert "gymtrace[sdk]" in str(exc), exc\n'
        "else:\n"
        "    raise AssertionError('RolloutSampler imported without the SDK')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
