"""gymtrace.integrations.openai with the real ``openai`` package against an OpenAI-compatible
server in its own process on loopback (tests/_openai_server.py): streaming and not, sync and
async, with tool calls; and beside opentelemetry-instrumentation-openai-v2 (one chat span)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import openai
import pytest
from opentelemetry.trace import SpanKind

import gymtrace
import gymtrace.integrations.openai as gym_openai
from _distributed import services
from gymtrace import attributes as c
from gymtrace.testing import check_trace

TOOLS = [
    {
        "type": "function",
        "function": {"name": "search", "parameters": {"type": "object", "properties": {"query": {}}}},
    }
]
MESSAGES = [{"role": "user", "content": "What is 2 + 40?"}]


@pytest.fixture(scope="module")
def model_server(tmp_path_factory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("openai-server")
    with services(tmp, [("model-server", "app", ["--app", "_openai_server:make_app"])]) as (server,):
        yield server.url


@pytest.fixture
def instrumented() -> Iterator[None]:
    gym_openai.instrument()
    try:
        yield
    finally:
        gym_openai.uninstrument()


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="test", max_retries=0)


def _chat_spans(captured):
    return [s for s in captured.spans if s.name.startswith("chat")]


def test_completion_with_tool_call_is_one_chat_span_with_usage_and_response_details(
    model_server, instrumented
):
    with gymtrace.testing.capture_spans() as captured:
        with gymtrace.rollout(rollout_id="r-oa"), gymtrace.episode(), gymtrace.step():
            reply = _client(model_server).chat.completions.create(
                model="qwen", messages=MESSAGES, tools=TOOLS
            )
    assert reply.choices[0].message.tool_calls[0].function.name == "search"
    (span,) = _chat_spans(captured)
    assert span.name == "chat qwen"
    assert span.kind == SpanKind.CLIENT
    assert span.parent.span_id == captured.one(c.KIND_STEP).context.span_id
    attrs = span.attributes
    assert attrs[c.KIND] == c.KIND_MODEL_CALL
    assert attrs[c.GEN_AI_OPERATION_NAME] == "chat"
    assert attrs[c.GEN_AI_PROVIDER_NAME] == "openai"
    assert attrs[c.GEN_AI_REQUEST_MODEL] == "qwen"
    assert attrs[c.GEN_AI_RESPONSE_MODEL] == "qwen-served"
    assert attrs[c.GEN_AI_RESPONSE_ID] == reply.id
    assert tuple(attrs[c.GEN_AI_RESPONSE_FINISH_REASONS]) == ("tool_calls",)
    assert (attrs[c.GEN_AI_USAGE_INPUT_TOKENS], attrs[c.GEN_AI_USAGE_OUTPUT_TOKENS]) == (900, 7)
    assert attrs[c.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 768
    assert attrs[c.ROLLOUT_ID] == "r-oa"
    assert check_trace(captured.spans) == []
    # The request carried the trace and the identity to the model server.
    seen = httpx.get(f"{model_server}/seen").json()[-1]
    assert seen["traceparent"].split("-")[2] == format(span.context.span_id, "016x")
    assert "gym.rollout.id=r-oa" in seen["baggage"]


def test_stream_span_ends_with_the_stream_and_records_time_to_first_chunk(model_server, instrumented):
    with gymtrace.testing.capture_spans() as captured:
        with gymtrace.rollout(rollout_id="r-st"), gymtrace.episode(), gymtrace.step():
            stream = _client(model_server).chat.completions.create(
                model="qwen", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
            )
            assert _chat_spans(captured) == []  # still open while the caller reads
            text = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
    assert text == "42"
    (span,) = _chat_spans(captured)
    attrs = span.attributes
    assert attrs[c.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] >= 0.02
    assert tuple(attrs[c.GEN_AI_RESPONSE_FINISH_REASONS]) == ("stop",)
    assert attrs[c.GEN_AI_RESPONSE_ID].startswith("chatcmpl-")
    assert (attrs[c.GEN_AI_USAGE_INPUT_TOKENS], attrs[c.GEN_AI_USAGE_OUTPUT_TOKENS]) == (900, 3)
    assert attrs[c.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 768
    assert attrs[c.GEN_AI_REQUEST_STREAM] is True
    assert check_trace(captured.spans) == []


def test_async_stream_with_tool_call_closed_early_still_ends_its_span(model_server, instrumented):
    async def main() -> list[str]:
        client = openai.AsyncOpenAI(base_url=f"{model_server}/v1", api_key="test", max_retries=0)
        names = []
        async with await client.chat.completions.create(
            model="qwen", messages=MESSAGES, tools=TOOLS, stream=True
        ) as stream:
            async for chunk in stream:
                for call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                    names.append(call.function.name)
                    break
                if names:
                    break  # the caller stops reading: the span must still end
        await client.close()
        return names

    with gymtrace.testing.capture_spans() as captured:
        with gymtrace.rollout(rollout_id="r-as"), gymtrace.episode(), gymtrace.step():
            assert asyncio.run(main()) == ["search"]
    (span,) = _chat_spans(captured)
    assert span.status.is_ok
    assert span.attributes[c.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] > 0
    assert check_trace(captured.spans) == []


def test_inside_a_model_call_scope_the_call_records_onto_it(model_server, instrumented):
    with gymtrace.testing.capture_spans() as captured:
        with gymtrace.rollout(rollout_id="r-mc"), gymtrace.episode(), gymtrace.step():
            with gymtrace.model_call(model="qwen", provider="openai"):
                _client(model_server).chat.completions.create(model="qwen", messages=MESSAGES)
    (span,) = _chat_spans(captured)
    assert span.attributes[c.KIND] == c.KIND_MODEL_CALL
    assert span.attributes[c.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 768
    assert tuple(span.attributes[c.GEN_AI_RESPONSE_FINISH_REASONS]) == ("stop",)


def test_server_error_is_recorded_and_raised_unchanged(model_server, instrumented):
    client = openai.OpenAI(base_url=f"{model_server}/nowhere", api_key="test", max_retries=0)
    with gymtrace.testing.capture_spans() as captured:
        with gymtrace.step(), pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="qwen", messages=MESSAGES)
    (span,) = _chat_spans(captured)
    assert span.attributes[c.ERROR_TYPE] == "openai.NotFoundError"


@pytest.mark.parametrize("order", ["gymtrace-first", "openai-v2-first"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_with_openai_v2_instrumentation_there_is_one_chat_span_and_tokens_count_once(
    model_server, order, stream
):
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

    with gymtrace.testing.capture_spans() as captured:
        official = OpenAIInstrumentor()
        if order == "gymtrace-first":
            gym_openai.instrument()
            official.instrument(tracer_provider=captured.tracer_provider)
        else:
            official.instrument(tracer_provider=captured.tracer_provider)
            gym_openai.instrument()
        try:
            with gymtrace.rollout(rollout_id="r-v2"), gymtrace.episode(), gymtrace.step():
                result = _client(model_server).chat.completions.create(
                    model="qwen",
                    messages=MESSAGES,
                    stream=stream,
                    stream_options={"include_usage": True} if stream else openai.NOT_GIVEN,
                )
                if stream:
                    list(result)
        finally:
            # In reverse order: OpenTelemetry's unwrap() removes whichever wrapper is outermost.
            if order == "gymtrace-first":
                official.uninstrument()
                gym_openai.uninstrument()
            else:
                gym_openai.uninstrument()
                official.uninstrument()
    (span,) = _chat_spans(captured)
    assert span.kind == SpanKind.CLIENT
    assert c.KIND not in span.attributes  # the other instrumentation's span is the one
    assert span.attributes[c.ROLLOUT_ID] == "r-v2"  # identity stamped by IdentitySpanProcessor
    tokens = [s.attributes.get(c.GEN_AI_USAGE_INPUT_TOKENS) for s in captured.spans]
    assert [t for t in tokens if t is not None] == [900]
    if order == "gymtrace-first":  # gymtrace runs inside it and enriches its span
        assert span.attributes[c.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 768
        if stream:
            assert span.attributes[c.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] > 0
    assert check_trace(captured.spans) == []


def test_uninstrument_restores_the_plain_client(model_server):
    gym_openai.instrument()
    gym_openai.uninstrument()
    with gymtrace.testing.capture_spans() as captured, gymtrace.step():
        _client(model_server).chat.completions.create(model="qwen", messages=MESSAGES)
    assert _chat_spans(captured) == []


def test_a_stream_abandoned_after_one_chunk_ends_its_span_marked_interrupted(model_server, instrumented):
    import gc

    with gymtrace.testing.capture_spans() as captured:
        with gymtrace.rollout(rollout_id="r-drop"), gymtrace.episode(), gymtrace.step():
            stream = _client(model_server).chat.completions.create(
                model="qwen", messages=MESSAGES, stream=True
            )
            next(iter(stream))  # one chunk, then the caller loses interest and drops the stream
            del stream
            gc.collect()
        (span,) = _chat_spans(captured)
    assert span.attributes[c.INTERRUPTED] is True
    # It ended before its step did: dropped inside the step, it is not left open after the rollout.
    assert span.end_time <= captured.one(c.KIND_STEP).end_time
    assert check_trace(captured.spans) == []


def test_in_a_rollout_head_sampling_dropped_the_calls_tokens_reach_its_summary(
    model_server, instrumented, capture_sampled
):
    from gymtrace.sampling import RolloutSampler

    with capture_sampled(RolloutSampler(0.0)) as captured:
        with gymtrace.rollout(rollout_id="r-oa-dropped"), gymtrace.episode(), gymtrace.step():
            for _ in range(2):
                _client(model_server).chat.completions.create(model="qwen", messages=MESSAGES, tools=TOOLS)
    (summary,) = captured.spans  # no chat span: only the rollout's summary
    assert summary.attributes[c.ROLLOUT_DETAIL] is False
    assert (
        summary.attributes[c.GEN_AI_USAGE_INPUT_TOKENS],
        summary.attributes[c.GEN_AI_USAGE_OUTPUT_TOKENS],
    ) == (
        1800,
        14,
    )
