"""Integrations take ``tracer_provider=``, as the contrib instrumentations do: their spans go to
the provider they were handed, not to the global one. Real SDK providers, a real model server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import gymtrace
import gymtrace.integrations.openai as gym_openai
from _distributed import services
from gymtrace import attributes as c
from gymtrace.testing import CapturedSpans, check_trace

gym = pytest.importorskip("gymnasium")

from gymtrace.integrations.gymnasium import TraceEnv  # noqa: E402 - after the importorskip


@pytest.fixture
def own() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(gymtrace.IdentitySpanProcessor())  # type: ignore[arg-type]
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


@pytest.fixture(scope="module")
def model_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("openai-server")
    with services(tmp, [("model-server", "app", ["--app", "_openai_server:make_app"])]) as (server,):
        yield server.url


def test_trace_env_spans_go_to_the_provider_it_was_handed(
    captured: CapturedSpans, own: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = own
    env = TraceEnv(gym.make("CartPole-v1"), steps="all", tracer_provider=provider)
    env.reset(seed=1)
    env.action_space.seed(1)
    done = False
    while not done:
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        done = terminated or truncated
    env.close()
    mine = list(exporter.get_finished_spans())
    # A live marker joins them when the episode outlasts the heartbeat thread's next mark (a busy
    # machine): it goes to the same provider, and is no level of its own.
    kinds = sorted({str(s.attributes.get(c.KIND)) for s in mine} - {c.KIND_LIVE})
    assert kinds == ["episode", "rollout", "seed_session", "step", "verify"]
    assert check_trace(mine) == []
    assert captured.spans == []  # nothing reached the provider in force otherwise


def test_openai_chat_spans_go_to_the_provider_instrument_was_handed(
    model_server: str, captured: CapturedSpans, own: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = own
    gym_openai.instrument(tracer_provider=provider)
    try:
        client = openai.OpenAI(base_url=f"{model_server}/v1", api_key="test", max_retries=0)
        client.chat.completions.create(model="qwen", messages=[{"role": "user", "content": "hi"}])
    finally:
        gym_openai.uninstrument()
    (span,) = [s for s in exporter.get_finished_spans() if s.name.startswith("chat")]
    assert span.attributes[c.KIND] == c.KIND_MODEL_CALL
    assert captured.spans == []


@pytest.mark.parametrize(
    "make",
    [
        lambda bad: TraceEnv(gym.make("CartPole-v1"), tracer_provider=bad),
        lambda bad: gym_openai.instrument(tracer_provider=bad),
    ],
    ids=["TraceEnv", "openai.instrument"],
)
def test_a_bad_tracer_provider_is_a_clear_error_naming_the_argument(make: Any) -> None:
    with pytest.raises(gymtrace.InvalidArgumentError, match="tracer_provider"):
        make("not a provider")


def test_the_asgi_middleware_sends_the_handlers_scopes_to_its_provider(
    captured: CapturedSpans, own: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    import asyncio

    from gymtrace.integrations.asgi import GymTraceMiddleware

    provider, exporter = own
    with gymtrace.rollout(rollout_id="r-asgi"), gymtrace.episode():
        headers = [
            (k.encode(), v.encode())
            for k, v in gymtrace.propagation.inject({}, destination="http://127.0.0.1/").items()
        ]

    async def app(scope: Any, receive: Any, send: Any) -> None:
        with gymtrace.step():
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})

    sent: list[Any] = []

    async def receive() -> Any:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/run", "headers": headers}
    asyncio.run(GymTraceMiddleware(app, tracer_provider=provider)(scope, receive, send))
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    (step,) = exporter.get_finished_spans()
    assert step.attributes[c.KIND] == c.KIND_STEP
    assert step.attributes[c.ROLLOUT_ID] == "r-asgi"
    # Only the caller's rollout and episode (opened here, before the request) are in the global one.
    assert sorted(str(s.attributes[c.KIND]) for s in captured.spans) == ["episode", "rollout"]
