"""gymtrace.integrations.asgi: GymTraceMiddleware continues the caller's trace and identity, with
services as real processes.

Each test starts its services (tests/support/serve_app.py with tests/support/_relay_app.py) on free
loopback ports, drives them from a gym scope in this process, stops them (they flush on SIGTERM)
and reads every process's spans back. ``official`` runs the services with the official
OpenTelemetry ASGI middleware and httpx/aiohttp client instrumentations installed next to gymtrace's.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

import gymtrace
from _distributed import (
    IDENTITY,
    RELAY,
    assert_no_duplicate_http_spans,
    assert_one_tree,
    boundary_pairs,
    missing_identity,
    read_services,
    services,
)
from gymtrace import attributes as c
from gymtrace.integrations.asgi import GymTraceMiddleware
from gymtrace.integrations.httpx import HttpxTransport

MODES = [
    pytest.param([], id="gymtrace-only"),
    pytest.param(["--official"], id="with-official-instrumentation"),
]


def _client_spans(captured) -> list[Any]:
    # gymtrace.testing's plain records of the captured spans, read as the services' files are read.
    return captured.data


@pytest.mark.e2e
@pytest.mark.parametrize("official", MODES)
@pytest.mark.parametrize("client", ["httpx", "aiohttp"])  # what svc-a calls svc-b with
def test_request_chain_is_one_tree_with_identity_on_every_span(tmp_path, official, client):
    with services(
        tmp_path, [("svc-a", "app", [*RELAY, *official]), ("svc-b", "app", [*RELAY, *official])]
    ) as (
        a,
        b,
    ):
        with gymtrace.testing.capture_spans() as captured, httpx.Client(transport=HttpxTransport()) as http:
            with gymtrace.rollout(rollout_id="r-chain"), gymtrace.episode(attempt=1):
                with gymtrace.tool_call(tool_name="remote") as tool:
                    reply = http.get(f"{a.url}/forward", params={"to": b.url, "client": client}).json()
    assert reply["identity"] == {"rollout_id": "r-chain", "attempt": 1, "run_id": None}
    assert reply["downstream"]["identity"] == reply["identity"]

    spans = _client_spans(captured) + read_services(tmp_path)
    assert {s.trace_id for s in spans} == {tool.trace_id}
    root = assert_one_tree(spans)
    assert root.attributes[c.KIND] == c.KIND_ROLLOUT
    remote = [s for s in spans if s.service in ("svc-a", "svc-b")]
    assert missing_identity(remote, IDENTITY) == []
    assert {s.attributes[c.EPISODE_ATTEMPT] for s in remote} == {1}
    assert_no_duplicate_http_spans(spans)

    # Parentage at each process boundary.
    boundaries = boundary_pairs(spans)
    assert len(boundaries) == 2
    (into_a,) = [(p, s) for p, s in boundaries if s.service == "svc-a"]
    (into_b,) = [(p, s) for p, s in boundaries if s.service == "svc-b"]
    assert into_a[0].span_id == tool.span_id  # the test process makes no HTTP client span
    if official:
        assert into_a[1].span_kind == "SERVER"
        assert into_b[0].span_kind == "CLIENT" and into_b[0].service == "svc-a"
        assert into_b[1].span_kind == "SERVER"
        assert len([s for s in remote if s.span_kind == "SERVER"]) == 2
        assert len([s for s in remote if s.span_kind == "CLIENT"]) == 1
    else:
        # gymtrace makes no HTTP spans: the first span of each service hangs under the caller's.
        assert not [s for s in spans if s.span_kind in ("SERVER", "CLIENT")]
        assert into_b[0].service == "svc-a"


@pytest.mark.e2e
@pytest.mark.parametrize("official", MODES)
def test_streaming_response_spans_stay_in_the_request_trace(tmp_path, official):
    with services(tmp_path, [("svc-stream", "app", [*RELAY, *official])]) as (svc,):
        with gymtrace.testing.capture_spans() as captured, httpx.Client(transport=HttpxTransport()) as http:
            with gymtrace.rollout(rollout_id="r-stream"), gymtrace.episode(), gymtrace.step() as step:
                with http.stream("GET", f"{svc.url}/stream") as response:
                    body = "".join(response.iter_text())
    assert body.splitlines() == ["0:r-stream", "1:r-stream", "2:r-stream"]
    spans = _client_spans(captured) + read_services(tmp_path)
    assert_one_tree(spans)
    chunks = [s for s in spans if s.name == "relay.chunk"]
    assert len(chunks) == 3
    assert missing_identity(chunks, IDENTITY) == []
    entry = [s for s in spans if s.service == "svc-stream" and s.parent_id == step.span_id]
    assert len(entry) == (1 if official else 3)


@pytest.mark.e2e
def test_garbage_trace_headers_do_not_break_the_request(tmp_path):
    with services(tmp_path, [("svc-garbage", "app", [*RELAY, "--official"])]) as (svc,):
        response = httpx.get(
            f"{svc.url}/work",
            headers={
                "traceparent": "00-not-a-trace",
                "baggage": "gym.episode.attempt=-3,gym.rollout.id=%01x,,=",
            },
        )
    assert response.status_code == 200
    assert response.json()["identity"] == {"rollout_id": None, "attempt": None, "run_id": None}
    spans = read_services(tmp_path)
    assert spans and all(c.EPISODE_ATTEMPT not in s.attributes for s in spans)


def test_lifespan_and_other_scopes_pass_through_untouched():
    seen = []

    async def app(scope, receive, send):
        seen.append((scope, gymtrace.current().rollout_id))

    scope = {"type": "lifespan", "asgi": {"version": "3.0"}}
    asyncio.run(GymTraceMiddleware(app)(scope, None, None))  # type: ignore[arg-type]
    assert seen == [(scope, None)]


def test_request_context_is_detached_after_the_request():
    async def app(scope, receive, send):
        assert gymtrace.current().rollout_id == "r-1"

    async def main() -> None:
        scope = {"type": "http", "headers": [(b"baggage", b"gym.rollout.id=r-1")]}
        await GymTraceMiddleware(app)(scope, None, None)  # type: ignore[arg-type]
        assert gymtrace.current().rollout_id is None

    asyncio.run(main())
