"""A small ASGI app served in its own process by the tests (``serve_app.py --app _relay_app:make_app``)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import httpx
from opentelemetry import baggage, trace
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

import gymtrace
from gymtrace.integrations.aiohttp import aiohttp_trace_config
from gymtrace.integrations.httpx import AsyncHttpxTransport

tracer = trace.get_tracer("tests.relay")


def _identity() -> dict[str, Any]:
    here = gymtrace.current()
    return {"rollout_id": here.rollout_id, "attempt": here.attempt, "run_id": here.run_id}


async def work(request: Request) -> JSONResponse:
    with tracer.start_as_current_span("relay.work"), gymtrace.tool_call(tool_name="relay_tool"):
        pass
    return JSONResponse(
        {
            "identity": _identity(),
            "baggage": request.headers.get("baggage"),
            # What any other instrumentation's propagate.inject() would forward from here.
            "context_baggage": sorted(baggage.get_all()),
        }
    )


async def stream(request: Request) -> StreamingResponse:
    async def chunks() -> Any:
        for number in range(3):
            await asyncio.sleep(0)
            with tracer.start_as_current_span("relay.chunk"):
                yield f"{number}:{gymtrace.current().rollout_id}\n".encode()

    return StreamingResponse(chunks(), media_type="text/plain")


async def forward(request: Request) -> JSONResponse:
    to = request.query_params["to"]
    with tracer.start_as_current_span("relay.forward"):
        if request.query_params.get("client") == "aiohttp":
            import aiohttp

            async with aiohttp.ClientSession(trace_configs=[aiohttp_trace_config()]) as session:
                async with session.get(f"{to}/work") as response:
                    downstream = await response.json()
        else:
            async with httpx.AsyncClient(transport=AsyncHttpxTransport()) as client:
                downstream = (await client.get(f"{to}/work")).json()
    return JSONResponse(
        {"identity": _identity(), "downstream": downstream, "context_baggage": sorted(baggage.get_all())}
    )


async def forward_local(request: Request) -> JSONResponse:
    """An aiohttp request from a gym scope opened here, with the application's own baggage set."""
    import aiohttp
    from opentelemetry import context as otel_context

    to = request.query_params["to"]
    token = otel_context.attach(baggage.set_baggage("user.email", "someone@example.com"))
    try:
        with gymtrace.rollout(rollout_id="r-local"), gymtrace.episode():
            async with aiohttp.ClientSession(trace_configs=[aiohttp_trace_config()]) as session:
                async with session.get(f"{to}/work") as response:
                    downstream = await response.json()
    finally:
        otel_context.detach(token)
    return JSONResponse({"downstream": downstream})


async def rollout(request: Request) -> JSONResponse:
    """One rollout a caller asked for (``?task=T&repeat=N&size=K``), opened in the request's context:
    a gym server that runs rollouts for a trainer."""
    task, repeat = request.query_params["task"], int(request.query_params["repeat"])
    with (
        gymtrace.rollout(
            rollout_id=f"{task}-{repeat}",
            task_id=task,
            repeat=repeat,
            group_id=f"task-{task}",
            group_size=int(request.query_params["size"]),
        ) as scope,
        gymtrace.episode(),
    ):
        with tracer.start_as_current_span("relay.env"), gymtrace.tool_call(tool_name="env.step"):
            pass
        with gymtrace.verify():
            gymtrace.record_reward(1.0)
    return JSONResponse({"trace_id": scope.trace_id, "span_id": scope.span_id})


def make_app() -> Starlette:
    if os.environ.get("RELAY_AIOHTTP_INSTRUMENT"):
        from gymtrace.integrations.aiohttp import instrument

        instrument()
    return Starlette(
        routes=[
            Route("/work", work),
            Route("/stream", stream),
            Route("/forward", forward),
            Route("/forward-local", forward_local),
            Route("/rollout", rollout),
        ]
    )
