"""gymtrace.integrations.httpx: HttpxTransport sends the trace and the gym identity, and only the
identity as baggage, to a real server process."""

from __future__ import annotations

import httpx
import pytest
from opentelemetry import baggage
from opentelemetry import context as otel_context

import gymtrace
from _distributed import RELAY, services
from gymtrace import attributes as c
from gymtrace.integrations.httpx import HttpxTransport


@pytest.mark.e2e
def test_outgoing_baggage_holds_gym_identity_only(tmp_path):
    with services(tmp_path, [("svc-echo", "app", list(RELAY))]) as (svc,):
        token = otel_context.attach(baggage.set_baggage("user.token", "secret"))
        try:
            with gymtrace.testing.capture_spans(), httpx.Client(transport=HttpxTransport()) as http:
                with gymtrace.rollout(rollout_id="r-bag", task_id="t-1"), gymtrace.episode():
                    sent = http.get(f"{svc.url}/work").json()["baggage"]
        finally:
            otel_context.detach(token)
    keys = {entry.split("=")[0] for entry in sent.split(",")}
    assert keys == {c.ROLLOUT_ID, c.TASK_ID, c.EPISODE_ATTEMPT, c.EPISODE_ID}
