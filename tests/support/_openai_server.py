"""A small OpenAI-compatible chat server, served in its own process by the tests
(``serve --role app --app _openai_server:make_app``).

``POST /v1/chat/completions`` answers like the OpenAI API: with ``tools`` in the request it asks
for one tool call (finish reason ``tool_calls``), otherwise it answers ``"42"`` (``stop``); with
``stream`` it sends Server-Sent Events chunk by chunk, and the usage chunk when
``stream_options.include_usage`` is set. Usage reports 768 of the prompt tokens as cached.
``GET /seen`` returns the headers of the requests received so far.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

PROMPT_TOKENS = 900
CACHED_TOKENS = 768
SEEN: list[dict[str, str]] = []


def _usage(completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": completion_tokens,
        "total_tokens": PROMPT_TOKENS + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": CACHED_TOKENS},
    }


def _tool_call() -> dict[str, Any]:
    return {
        "id": "call-1",
        "type": "function",
        "function": {"name": "search", "arguments": json.dumps({"query": "2 + 40"})},
    }


async def chat(request: Request) -> Any:
    SEEN.append({k: v for k, v in request.headers.items() if k in ("traceparent", "baggage")})
    body = await request.json()
    model = body["model"]
    wants_tool = bool(body.get("tools"))
    response_id = f"chatcmpl-{len(SEEN)}"
    if not body.get("stream"):
        message: dict[str, Any] = {"role": "assistant", "content": None if wants_tool else "42"}
        if wants_tool:
            message["tool_calls"] = [_tool_call()]
        return JSONResponse(
            {
                "id": response_id,
                "object": "chat.completion",
                "created": 1,
                "model": f"{model}-served",
                "choices": [
                    {"index": 0, "message": message, "finish_reason": "tool_calls" if wants_tool else "stop"}
                ],
                "usage": _usage(7),
            }
        )
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

    def chunk(delta: dict[str, Any], finish: str | None = None, usage: Any = None) -> str:
        payload = {
            "id": response_id,
            "object": "chat.completion.chunk",
            "created": 1,
            "model": f"{model}-served",
            "choices": [] if usage else [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        if usage:
            payload["usage"] = usage
        return f"data: {json.dumps(payload)}\n\n"

    async def events() -> Any:
        await asyncio.sleep(0.02)  # a measurable time to first token
        yield chunk({"role": "assistant", "content": ""})
        if wants_tool:
            call = _tool_call()
            yield chunk({"tool_calls": [{"index": 0, **call}]})
            yield chunk({}, "tool_calls")
        else:
            for piece in ("4", "2"):
                yield chunk({"content": piece})
            yield chunk({}, "stop")
        if include_usage:
            yield chunk({}, usage=_usage(3))
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


async def seen(request: Request) -> JSONResponse:
    return JSONResponse(SEEN)


def make_app() -> Starlette:
    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]), Route("/seen", seen)])
