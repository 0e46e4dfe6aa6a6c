"""The three services of ``gymtrace demo --distributed``, each served in its own process.

- the **model** server: a scripted fake model behind an OpenAI-compatible ``/v1/chat/completions``;
- the **environment** server: ``seed_session``, the tools ``search`` and ``calculator``, ``verify``;
  with ``--crash-rollout`` it dies on that rollout's first tool call of attempt 0;
- the **agent** server: runs one episode per ``POST /run`` against the other two.

``gymtrace demo-service --role env --service gym-env`` serves one of them on a free loopback port
and prints ``GYMTRACE-PORT <port>`` once it listens (see
:class:`gymtrace.demo.distributed.ServiceProcess`). Needs ``gymtrace[demo]``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import uuid
from collections.abc import Callable
from typing import Any

from gymtrace import _constants as c

READY_PREFIX = "GYMTRACE-PORT "
MODEL_NAME = "scripted-model"
CRASH_EXIT_CODE = 17

# httpx writes request headers and body in separate writes; with Nagle's algorithm the body waits
# for the server's delayed ACK, ~40 ms per request on Linux loopback.
NODELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
ROLES = ("agent", "model", "env")


# -- the three services --------------------------------------------------------------------------------


def model_app() -> Any:
    """A scripted model: asks for ``search``, then ``calculator``, then answers with the result."""
    from opentelemetry import trace
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    tracer = trace.get_tracer("gymtrace.demo.model")

    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        messages = body.get("messages", [])
        tool_results = [m for m in messages if m.get("role") == "tool"]
        with tracer.start_as_current_span("scripted_model.generate"):
            if len(tool_results) == 0:
                message: dict[str, Any] = _tool_message("search", {"query": messages[-1].get("content", "")})
            elif len(tool_results) == 1:
                expression = json.loads(tool_results[0]["content"]).get("expression", "0")
                message = _tool_message("calculator", {"expression": expression})
            else:
                message = {"role": "assistant", "content": json.loads(tool_results[-1]["content"])["value"]}
        prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in messages)
        return JSONResponse(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
                "object": "chat.completion",
                "model": body.get("model", MODEL_NAME),
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "finish_reason": "tool_calls" if "tool_calls" in message else "stop",
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": 7,
                    "total_tokens": prompt_tokens + 7,
                },
            }
        )

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


def _tool_message(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    call = {
        "id": f"call_{uuid.uuid4().hex[:8]}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def env_app(crash_rollout: str | None = None) -> Any:
    """Environment server. With ``crash_rollout`` it dies (exit 17) on that rollout's first tool
    call of attempt 0, the way an environment host dies mid-episode."""
    from opentelemetry import trace
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    import gymtrace

    tracer = trace.get_tracer("gymtrace.demo.env")
    sessions: dict[str, dict[str, Any]] = {}

    async def seed_session(request: Request) -> JSONResponse:
        body = await request.json()
        with tracer.start_as_current_span("env.reset"):
            session_id = uuid.uuid4().hex[:12]
            sessions[session_id] = {"task": body["task"]}
        return JSONResponse({"session_id": session_id})

    async def tool(request: Request) -> JSONResponse:
        name = request.path_params["name"]
        body = await request.json()
        here = gymtrace.current()  # the identity the caller propagated
        if crash_rollout is not None and here.rollout_id == crash_rollout and here.attempt == 0:
            # Die like a host that goes away mid-episode. The in-flight request span is ended as
            # interrupted first (what a crash handler does), so the trace keeps no orphans.
            in_flight = trace.get_current_span()
            in_flight.set_attribute(c.INTERRUPTED, True)
            in_flight.end()
            gymtrace.force_flush()
            os._exit(CRASH_EXIT_CODE)
        task = sessions[body["session_id"]]["task"]
        arguments = body.get("arguments", {})
        with tracer.start_as_current_span(f"env.tool.{name}"):
            if name == "search":
                result: dict[str, Any] = {"expression": task["expression"]}
            elif name == "calculator":
                a, op, b = str(arguments.get("expression", "0 + 0")).split()
                value = int(a) + int(b) if op == "+" else int(a) * int(b)
                result = {"value": str(value)}
            else:
                return JSONResponse({"error": f"unknown tool {name}"}, status_code=404)
        return JSONResponse(result)

    async def verify(request: Request) -> JSONResponse:
        body = await request.json()
        with tracer.start_as_current_span("env.score"):
            task = sessions.pop(body["session_id"])["task"]
            reward = 1.0 if str(body.get("answer")) == task["expected"] else 0.0
        return JSONResponse({"reward": reward})

    return Starlette(
        routes=[
            Route("/seed_session", seed_session, methods=["POST"]),
            Route("/tools/{name}", tool, methods=["POST"]),
            Route("/verify", verify, methods=["POST"]),
        ]
    )


def agent_app() -> Any:
    """The agent: seed_session, then model and tool calls until an answer, then verify."""
    import httpx
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    import gymtrace
    from gymtrace.integrations.httpx import AsyncHttpxTransport

    client = httpx.AsyncClient(transport=AsyncHttpxTransport(socket_options=NODELAY), timeout=30.0)

    async def run_episode(request: Request) -> JSONResponse:
        body = await request.json()
        task, model_url, env_url = body["task"], body["model_url"], body["env_url"]
        try:
            with gymtrace.seed_session():
                session_id = (await client.post(f"{env_url}/seed_session", json={"task": task})).json()[
                    "session_id"
                ]
            answer = None
            with gymtrace.agent_invocation(agent_name="demo-agent"):
                messages: list[dict[str, Any]] = [{"role": "user", "content": task["question"]}]
                for _ in range(5):
                    with gymtrace.turn(), gymtrace.step():
                        with gymtrace.model_call(model=MODEL_NAME, provider="scripted") as call:
                            reply = (
                                await client.post(
                                    f"{model_url}/v1/chat/completions",
                                    json={"model": MODEL_NAME, "messages": messages},
                                )
                            ).json()
                            usage = reply["usage"]
                            call.record_usage(
                                input_tokens=usage["prompt_tokens"], output_tokens=usage["completion_tokens"]
                            )
                        message = reply["choices"][0]["message"]
                        messages.append(message)
                        if not message.get("tool_calls"):
                            answer = message["content"]
                            break
                        for tool_call in message["tool_calls"]:
                            name = tool_call["function"]["name"]
                            with gymtrace.tool_call(tool_name=name, call_id=tool_call["id"]):
                                result = await client.post(
                                    f"{env_url}/tools/{name}",
                                    json={
                                        "session_id": session_id,
                                        "arguments": json.loads(tool_call["function"]["arguments"]),
                                    },
                                )
                                result.raise_for_status()
                            messages.append(
                                {"role": "tool", "tool_call_id": tool_call["id"], "content": result.text}
                            )
            with gymtrace.verify() as verifying:
                reward = (
                    await client.post(f"{env_url}/verify", json={"session_id": session_id, "answer": answer})
                ).json()["reward"]
                verifying.set_attribute(c.REWARD, reward)
        except httpx.TransportError as exc:
            # The environment is gone: an infrastructure failure the driver may retry.
            return JSONResponse(
                {"error": f"environment unavailable: {type(exc).__name__}", "retryable": True},
                status_code=502,
            )
        return JSONResponse({"reward": reward, "answer": answer})

    return Starlette(routes=[Route("/run", run_episode, methods=["POST"])])


# -- serving one service in this process -------------------------------------------------------------


def wrap_app(app: Any, *, middleware: bool = True, official: bool = False) -> Any:
    """The app as the demo serves it: gymtrace's middleware inside, the official one outside.

    ``middleware=False`` leaves gymtrace's out (to measure its share of a request's cost)."""
    if middleware:
        from gymtrace.integrations.asgi import GymTraceMiddleware

        app = GymTraceMiddleware(app)
    if official:
        from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware

        # One SERVER span per request; the per-message "http send/receive" spans are noise here.
        app = OpenTelemetryMiddleware(app, exclude_spans=["receive", "send"])
    return app


def serve(
    app: Any,
    *,
    service_name: str | None,
    on_ready: Callable[[int], None],
    official: bool = False,
    middleware: bool = True,
    instrument: bool = False,
) -> int:
    """Serve ``app`` on a free loopback port until SIGTERM/SIGINT.

    ``on_ready(port)`` runs once the socket listens (the command line prints the handshake line
    :class:`~gymtrace.demo.distributed.ServiceProcess` waits for). ``service_name`` configures
    tracing under that name (skipped when None); ``official`` adds the official ASGI middleware
    and, with ``instrument``, the official httpx/aiohttp client instrumentations.
    """
    import uvicorn

    import gymtrace

    if service_name is not None:
        gymtrace.configure(service_name=service_name)
    if instrument:
        instrument_clients()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # inherited by accepted connections
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # listening before the port is announced: a client never sees a refused connection
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        wrap_app(app, middleware=middleware, official=official),
        log_level="warning",
        access_log=False,
        lifespan="off",
    )
    server = uvicorn.Server(config)
    # uvicorn shuts down gracefully on SIGTERM and then re-raises the signal to the handler that was
    # installed before it; with the default one the process dies before the `finally` below and the
    # last spans are lost (opentelemetry-python#4813). This handler turns it into SystemExit.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    on_ready(port)
    try:
        server.run(sockets=[sock])
    finally:
        if service_name is not None:
            gymtrace.shutdown()
    return 0


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(0)


def instrument_clients() -> None:
    try:
        from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

        HTTPXClientInstrumentor().instrument()
    except ImportError:
        pass
    try:
        from opentelemetry.instrumentation.aiohttp_client import AioHttpClientInstrumentor

        AioHttpClientInstrumentor().instrument()
    except ImportError:
        pass


def app_for(role: str, *, crash_rollout: str | None = None) -> Any:
    """The ASGI app of a demo role: ``agent``, ``model`` or ``env``."""
    if role == "agent":
        return agent_app()
    if role == "model":
        return model_app()
    if role == "env":
        return env_app(crash_rollout)
    raise ValueError(f"unknown demo role {role!r}; expected one of {ROLES}")
