"""A small FastAPI server that behaves as the NeMo Gym contract says, served in its own process by
the tests (``serve --role app --app _nemo_gym_server:make_app``).

Every request with only one of ``x-nemo-gym-rollout-id`` / ``x-nemo-gym-attempt-index`` is
answered 409 ``execution_identity_mismatch``; IDs that do not match NeMo Gym's pattern are 422.
``POST /step`` and ``POST /ng-rollout/{key}/step`` echo what identified the execution (headers,
body fields, path key) and what ``gymtrace.current()`` says inside the handler. The server calls
``gymtrace.integrations.nemo_gym.instrument(aliases=True)``, so its GymTraceMiddleware reads the
headers. The middleware is added with ``app.add_middleware`` as the README shows (served with
``--no-gymtrace`` so it is not wrapped around the app a second time): FastAPI's native telemetry
(FastAPI >= 0.16x with an SDK provider) extracts the headers again and attaches a fresh context
around its middleware stack, so a middleware *outside* the FastAPI app would be lost.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from opentelemetry import trace

import gymtrace
import gymtrace.integrations.nemo_gym as nemo_gym
from gymtrace.integrations.asgi import GymTraceMiddleware

ROLLOUT = "x-nemo-gym-rollout-id"
ATTEMPT = "x-nemo-gym-attempt-index"
NEMO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
tracer = trace.get_tracer("tests.nemo_gym")


def make_app() -> FastAPI:
    nemo_gym.instrument(aliases=True)
    app = FastAPI()
    app.add_middleware(GymTraceMiddleware)

    @app.middleware("http")
    async def execution_identity(request: Request, call_next: Any) -> Any:
        present = [h for h in (ROLLOUT, ATTEMPT) if h in request.headers]
        if len(present) == 1:
            return JSONResponse({"error": "execution_identity_mismatch"}, status_code=409)
        if present and not NEMO_ID.fullmatch(request.headers[ROLLOUT]):
            return JSONResponse({"error": "invalid_rollout_id"}, status_code=422)
        return await call_next(request)

    async def _echo(request: Request, key: str | None) -> dict[str, Any]:
        body = await request.json()
        with tracer.start_as_current_span("env.step"):
            here = gymtrace.current()
        return {
            "headers": {h: request.headers.get(h) for h in (ROLLOUT, ATTEMPT)},
            "body": {k: v for k, v in body.items() if k.startswith("_ng_")},
            "key": key,
            "current": {
                "rollout_id": here.rollout_id,
                "attempt": here.attempt,
                "episode_id": here.episode_id,
            },
        }

    @app.post("/step")
    async def step(request: Request) -> dict[str, Any]:
        return await _echo(request, None)

    @app.post("/ng-rollout/{key}/step")
    async def keyed_step(key: str, request: Request) -> dict[str, Any]:
        return await _echo(request, key)

    return app
