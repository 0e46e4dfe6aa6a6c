"""gymtrace.integrations.nemo_gym against a FastAPI server in its own process that behaves as the
NeMo Gym contract says (tests/_nemo_gym_server.py), including the 409 on a lone header."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import aiohttp
import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

import gymtrace
import gymtrace.integrations.nemo_gym as nemo_gym
from _distributed import read_services, services
from gymtrace import attributes as c
from gymtrace.testing import check_trace

NEMO_SERVER = [("nemo-env", "app", ["--app", "_nemo_gym_server:make_app", "--no-gymtrace"])]


@pytest.fixture(scope="module")
def env_server(tmp_path_factory) -> Iterator[tuple[str, object]]:
    tmp = tmp_path_factory.mktemp("nemo-gym")
    with services(tmp, NEMO_SERVER) as (server,):
        yield server.url, tmp


@pytest.fixture
def instrumented() -> Iterator[None]:
    nemo_gym.instrument()
    try:
        yield
    finally:
        nemo_gym.uninstrument()


@pytest.mark.parametrize(
    ("rollout_id", "nemo_id"),
    [
        ("t-7-r0", "t-7-r0"),
        ("task.3_r1", "task.3_r1"),
        ("t-1/r0", "x__t-1_2Fr0"),
        ("a__b", "x__a_5F_5Fb"),
        ("-lead", "x__-lead"),
        ("x__t-1_2Fr0", "x__x_5F_5Ft-1_5F2Fr0"),
        ("épisode 1", "x___C3_A9pisode_201"),
    ],
)
def test_rollout_ids_map_to_nemo_ids_by_the_documented_reversible_rule(rollout_id, nemo_id):
    assert nemo_gym.to_nemo_id(rollout_id) == nemo_id
    assert nemo_gym.NEMO_ID.fullmatch(nemo_id)
    assert nemo_gym.from_nemo_id(nemo_id) == rollout_id


@given(st.text(min_size=1, max_size=40))
def test_every_rollout_id_round_trips_through_a_valid_nemo_id(rollout_id):
    nemo_id = nemo_gym.to_nemo_id(rollout_id)
    assert nemo_gym.NEMO_ID.fullmatch(nemo_id)
    assert nemo_gym.from_nemo_id(nemo_id) == rollout_id


def test_headers_are_both_or_none():
    assert nemo_gym.headers() == {}
    with gymtrace.testing.capture_spans(), gymtrace.rollout(rollout_id="t-1/r0", task_id="4", repeat=2):
        first = nemo_gym.headers()
        with gymtrace.episode(attempt=2):
            retried = nemo_gym.headers()
            fields = nemo_gym.body_fields()
            prefix = nemo_gym.path_prefix()
    assert first == {c.NEMO_GYM_ROLLOUT_HEADER: "x__t-1_2Fr0", c.NEMO_GYM_ATTEMPT_HEADER: "0"}
    assert retried == {c.NEMO_GYM_ROLLOUT_HEADER: "x__t-1_2Fr0", c.NEMO_GYM_ATTEMPT_HEADER: "2"}
    assert fields == {
        "_ng_rollout_id": "x__t-1_2Fr0",
        "_ng_attempt_index": 2,
        "_ng_rollout_index": 2,
        "_ng_task_index": 4,
    }
    assert prefix == "/ng-rollout/x__t-1_2Fr0-a2"


def test_the_server_answers_409_to_a_lone_header(env_server):
    url, _ = env_server
    lone = httpx.post(f"{url}/step", json={}, headers={c.NEMO_GYM_ROLLOUT_HEADER: "r-1"})
    assert lone.status_code == 409
    assert lone.json() == {"error": "execution_identity_mismatch"}


@pytest.mark.parametrize("client", ["httpx", "httpx-async", "aiohttp"])
def test_requests_in_a_gym_scope_carry_both_headers_and_the_server_continues_the_attempt(
    env_server, instrumented, client
):
    url, _ = env_server
    with gymtrace.testing.capture_spans() as captured:
        with gymtrace.rollout(rollout_id="t-7-r1", task_id="t-7", repeat=1):
            with gymtrace.episode() as first:
                first.record_failure(kind="infrastructure", retryable=True)
            with gymtrace.episode():  # the retry: attempt 1
                reply = _post(client, f"{url}/step", {"action": 1})
        outside = _post(client, f"{url}/step", {"action": 2})
    assert reply["headers"] == {c.NEMO_GYM_ROLLOUT_HEADER: "t-7-r1", c.NEMO_GYM_ATTEMPT_HEADER: "1"}
    assert reply["current"] == {"rollout_id": "t-7-r1", "attempt": 1, "episode_id": "t-7-r1-a1"}
    assert outside["headers"] == {c.NEMO_GYM_ROLLOUT_HEADER: None, c.NEMO_GYM_ATTEMPT_HEADER: None}
    assert check_trace(captured.spans) == []


def test_body_fields_and_path_prefix_when_asked(env_server):
    url, _ = env_server
    nemo_gym.instrument(body=True, path=True)
    try:
        with gymtrace.testing.capture_spans(), gymtrace.rollout(rollout_id="t-1/r0", repeat=0):
            with gymtrace.episode(attempt=3):
                reply = httpx.post(f"{url}/step", json={"action": 1, "_ng_task_index": 9}).json()
                via_aiohttp = _post("aiohttp", f"{url}/step", {"action": 1})
    finally:
        nemo_gym.uninstrument()
    for answer in (reply, via_aiohttp):
        assert answer["key"] == "x__t-1_2Fr0-a3"
        assert answer["body"]["_ng_rollout_id"] == "x__t-1_2Fr0"
        assert answer["body"]["_ng_attempt_index"] == 3
        assert answer["body"]["_ng_rollout_index"] == 0
        assert answer["current"]["rollout_id"] == "t-1/r0"  # mapped back on the server
    assert reply["body"]["_ng_task_index"] == 9  # the caller's field wins


def test_a_caller_that_sets_one_header_itself_is_left_alone(env_server, instrumented):
    url, _ = env_server
    with gymtrace.testing.capture_spans(), gymtrace.rollout(rollout_id="r-1"), gymtrace.episode():
        response = httpx.post(f"{url}/step", json={}, headers={c.NEMO_GYM_ROLLOUT_HEADER: "mine"})
    assert response.status_code == 409  # never completed into a pair with another execution's half


@pytest.mark.e2e
def test_server_spans_carry_identity_and_nemo_aliases(tmp_path, monkeypatch):
    with services(tmp_path, NEMO_SERVER) as (server,):
        headers = {c.NEMO_GYM_ROLLOUT_HEADER: "t-9-r0", c.NEMO_GYM_ATTEMPT_HEADER: "2"}
        assert httpx.post(f"{server.url}/step", json={}, headers=headers).status_code == 200
    (step,) = [s for s in read_services(tmp_path) if s.name == "env.step"]
    assert step.attributes[c.ROLLOUT_ID] == "t-9-r0"
    assert step.attributes[c.EPISODE_ATTEMPT] == 2
    assert step.attributes[c.NEMO_GYM_ROLLOUT_ID] == "t-9-r0-a2"


@pytest.mark.e2e
def test_trusted_baggage_wins_over_nemo_headers_and_untrusted_headers_are_ignored(tmp_path, monkeypatch):
    monkeypatch.setenv("GYMTRACE_TRUST_IDENTITY", "none")
    with services(tmp_path, NEMO_SERVER) as (server,):
        headers = {c.NEMO_GYM_ROLLOUT_HEADER: "t-9-r0", c.NEMO_GYM_ATTEMPT_HEADER: "2"}
        reply = httpx.post(f"{server.url}/step", json={}, headers=headers).json()
    assert reply["current"] == {"rollout_id": None, "attempt": None, "episode_id": None}
    spans = read_services(tmp_path)
    assert spans and all(c.ROLLOUT_ID not in s.attributes for s in spans)


def _post(client: str, url: str, body: dict) -> dict:
    if client == "httpx":
        return httpx.post(url, json=body).json()
    if client == "httpx-async":

        async def run_httpx() -> dict:
            async with httpx.AsyncClient() as http:
                return (await http.post(url, json=body)).json()

        return asyncio.run(run_httpx())

    async def run_aiohttp() -> dict:
        async with aiohttp.ClientSession() as session, session.post(url, json=body) as response:
            return await response.json()

    return asyncio.run(run_aiohttp())


# -- NeMo Gym's own identity (shared by the live integration and `gymtrace import nemo-gym`) --------


def test_rollout_identity_is_nemo_gyms_key_without_the_attempt_suffix() -> None:
    row = {"_ng_task_index": 3, "_ng_rollout_index": 1, "_ng_attempt_index": 2, "x": 1}
    assert nemo_gym.rollout_identity(row) == nemo_gym.RolloutIdentity("3-1", "3", 1, 2)


def test_rollout_identity_prefers_the_explicit_rollout_id_and_defaults_attempt_to_zero() -> None:
    row = {"_ng_task_index": "7", "_ng_rollout_index": 0, "_ng_rollout_id": "job-7-0"}
    assert nemo_gym.rollout_identity(row) == nemo_gym.RolloutIdentity("job-7-0", "7", 0, 0)


@pytest.mark.parametrize(
    "row", [{}, {"_ng_task_index": -1}, {"_ng_task_index": True}, {"_ng_task_index": "a"}]
)
def test_rollout_identity_is_none_for_a_body_that_is_no_nemo_gym_rollout(row: dict[str, object]) -> None:
    assert nemo_gym.rollout_identity(row) is None


def test_run_id_for_output_is_stable_across_spellings_of_the_same_path(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    first = nemo_gym.run_id_for_output("out/rollouts.jsonl")
    assert first == nemo_gym.run_id_for_output(tmp_path / "out" / ".." / "out" / "rollouts.jsonl")
    assert first.startswith("rollouts-")
    assert first != nemo_gym.run_id_for_output(tmp_path / "other" / "rollouts.jsonl")


def test_trace_id_for_is_deterministic_and_separates_runs_and_rollouts() -> None:
    one = nemo_gym.trace_id_for("run-a", "0-0")
    assert one == nemo_gym.trace_id_for("run-a", "0-0")
    assert 0 < one < 2**128
    assert len({one, nemo_gym.trace_id_for("run-b", "0-0"), nemo_gym.trace_id_for("run-a", "0-1")}) == 3


@pytest.mark.parametrize(
    ("raised", "failed"),
    [(RuntimeError("tool broke"), True), (asyncio.CancelledError(), False)],
    ids=["error", "cancelled"],
)
def test_a_request_that_raises_through_the_server_middleware_ends_its_phase_span_as_with_would(
    raised: BaseException, failed: bool
) -> None:
    # NeMo Gym answers a handler's exception with HTTP 500 inside the app; what still raises through
    # (a cancelled request, an error of the server's own stack) ends the phase's span as a `with`
    # block would: an error recorded, a cancellation not, the exception the server's to handle.
    from opentelemetry.trace import StatusCode

    from gymtrace import propagation
    from gymtrace.integrations.nemo_gym.server import NeMoGymServerMiddleware

    async def app(scope: object, receive: object, send: object) -> None:
        raise raised

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: object) -> None:
        pass

    middleware = NeMoGymServerMiddleware(app, server_type="resources_servers", server_name="env")
    with gymtrace.testing.capture_spans() as captured:
        with gymtrace.rollout(rollout_id="r-1", task_id="1"), gymtrace.episode():
            carrier = propagation.inject({}, destination=propagation.GYM_INTERNAL)
        headers = [(k.encode(), v.encode()) for k, v in carrier.items()]
        scope = {"type": "http", "method": "POST", "path": "/step_tool", "headers": headers}
        with pytest.raises(type(raised)):
            asyncio.run(middleware(scope, receive, send))
        assert gymtrace.current().rollout_id is None  # nothing of the request's left attached
    (tool,) = [s for s in captured.spans if (s.attributes or {}).get(c.KIND) == c.KIND_TOOL_CALL]
    assert tool.attributes[c.ROLLOUT_ID] == "r-1"
    assert tool.end_time is not None
    assert (tool.status.status_code == StatusCode.ERROR) is failed
    assert [e.attributes["exception.type"] for e in tool.events if e.name == "exception"] == (
        ["RuntimeError"] if failed else []
    )
