"""gymtrace.integrations.aiohttp: aiohttp_trace_config() sends the trace and the gym identity, and
only the identity as baggage, to a real server process."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

import gymtrace
from _distributed import (
    IDENTITY,
    RELAY,
    assert_one_tree,
    boundary_pairs,
    missing_identity,
    read_services,
    services,
)
from gymtrace import attributes as c
from gymtrace.integrations.aiohttp import aiohttp_trace_config


async def _get_json(url: str) -> Any:
    async with (
        aiohttp.ClientSession(trace_configs=[aiohttp_trace_config()]) as session,
        session.get(url) as response,
    ):
        return await response.json()


@pytest.mark.e2e
def test_aiohttp_requests_continue_the_trace_with_the_identity_in_the_server(tmp_path):
    with services(tmp_path, [("svc-aio", "app", list(RELAY))]) as (svc,):
        with gymtrace.testing.capture_spans() as captured:
            with gymtrace.rollout(rollout_id="r-aio", task_id="t-1"), gymtrace.episode():
                with gymtrace.tool_call(tool_name="remote") as tool:
                    reply = asyncio.run(_get_json(f"{svc.url}/work"))
    assert reply["identity"] == {"rollout_id": "r-aio", "attempt": 0, "run_id": None}
    keys = {entry.split("=")[0] for entry in reply["baggage"].split(",")}
    assert keys == {c.ROLLOUT_ID, c.TASK_ID, c.EPISODE_ATTEMPT, c.EPISODE_ID}

    spans = captured.data + read_services(tmp_path)
    assert_one_tree(spans)
    remote = [s for s in spans if s.service == "svc-aio"]
    assert remote and missing_identity(remote, IDENTITY) == []
    ((parent, _),) = boundary_pairs(spans)
    assert parent.span_id == tool.span_id  # gymtrace makes no HTTP client span of its own
    assert gymtrace.testing.check_trace(spans) == []
