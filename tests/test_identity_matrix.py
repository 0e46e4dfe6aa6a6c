"""Where the gym identity goes: every client path and every kind of destination, on the wire.

Issue 31: a request to the public OpenAI API carried ``baggage: gym.run.id=…,gym.rollout.id=…``
from gymtrace's OpenAI integration, and every continued context put the identity into OpenTelemetry
baggage, which every contrib instrumentation forwards to any host. The promise: the gym identity
goes only to the gym's own hosts, and only through gymtrace's injectors; ``traceparent`` goes
everywhere.

Each case makes one real request with a real client from a gym episode (opened here, or continued
from a caller's headers) to one of three destinations:

- ``gym``: ``http://env-1.gym.internal``, a host of ``GYMTRACE_PROPAGATE_TO``;
- ``upstream``: a model server on loopback that the framework marks as outside the gym
  (``instrumentation.gym_destination(False)``, what NeMo Gym's patch says of its model endpoint);
- ``public``: ``http://api.openai.com``.

There is no internet: named hosts are reached through a loopback forward proxy in its own process
(tests/support/recording_proxy.py), which answers itself and records each request's headers. The
client, and so every gymtrace rule, sees the real URL.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import openai
import pytest
import requests
from opentelemetry import baggage
from opentelemetry import context as otel_context
from opentelemetry.instrumentation.aiohttp_client import AioHttpClientInstrumentor
from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
from opentelemetry.instrumentation.requests import RequestsInstrumentor

import gymtrace
from gymtrace import attributes as c
from gymtrace import instrumentation, propagation
from gymtrace.integrations import aiohttp as gym_aiohttp
from gymtrace.integrations import nemo_gym
from gymtrace.integrations import openai as gym_openai
from gymtrace.integrations.httpx import HttpxTransport

PROXY_SCRIPT = Path(__file__).resolve().parent / "support" / "recording_proxy.py"
GYM_HOST = "env-1.gym.internal"
GYM = f"http://{GYM_HOST}"
PUBLIC = "http://api.openai.com"
CASE_HEADER = "x-matrix-case"
ROLLOUT = "customer-123-task-9"
# What a caller upstream in the gym sends: the context continued here (propagation.attach).
INCOMING = {
    "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "baggage": f"gym.run.id=run-m,gym.rollout.id={ROLLOUT},gym.task.id=task-9,gym.episode.attempt=0,"
    f"gym.episode.id={ROLLOUT},tenant=acme",
}


@pytest.fixture(scope="module")
def proxy() -> Iterator[str]:
    process = subprocess.Popen([sys.executable, str(PROXY_SCRIPT)], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture(autouse=True)
def _gym_hosts(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("GYMTRACE_PROPAGATE_TO", GYM_HOST)
    for variable in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(variable, raising=False)
    gymtrace.testing.reset()
    yield
    gymtrace.testing.reset()


# -- the client paths -----------------------------------------------------------------------------------
#
# Each takes (url, proxy or None, case id) and makes one request to url from the current context.


def _openai(url: str, proxy: str | None, case: str) -> None:
    gym_openai.instrument()
    try:
        with httpx.Client(proxy=proxy) as http_client:
            client = openai.OpenAI(
                base_url=f"{url}/v1", api_key="sk-test", http_client=http_client, max_retries=0
            )
            client.chat.completions.create(
                model="matrix-model",
                messages=[{"role": "user", "content": "6 * 7?"}],
                extra_headers={CASE_HEADER: case},
            )
    finally:
        gym_openai.uninstrument()


def _httpx_transport(url: str, proxy: str | None, case: str) -> None:
    with httpx.Client(transport=HttpxTransport(proxy=proxy)) as client:
        client.get(f"{url}/work", headers={CASE_HEADER: case}).raise_for_status()


def _aiohttp_get(url: str, proxy: str | None, case: str, **session: Any) -> None:
    async def go() -> None:
        async with aiohttp.ClientSession(**session) as client:
            async with client.get(f"{url}/work", proxy=proxy, headers={CASE_HEADER: case}) as response:
                response.raise_for_status()

    asyncio.run(go())  # the task runs in a copy of this context: the same gym episode


def _aiohttp_instrument(url: str, proxy: str | None, case: str) -> None:
    gym_aiohttp.instrument()
    try:
        _aiohttp_get(url, proxy, case)
    finally:
        gym_aiohttp.uninstrument()


def _aiohttp_base_url(url: str, proxy: str | None, case: str) -> None:
    # A relative request on a session with a base_url is judged by the base_url's host.
    async def go() -> None:
        async with aiohttp.ClientSession(base_url=url) as client:
            async with client.get("/work", proxy=proxy, headers={CASE_HEADER: case}) as response:
                response.raise_for_status()

    gym_aiohttp.instrument()
    try:
        asyncio.run(go())
    finally:
        gym_aiohttp.uninstrument()


def _aiohttp_trace_config(url: str, proxy: str | None, case: str) -> None:
    _aiohttp_get(url, proxy, case, trace_configs=[gym_aiohttp.aiohttp_trace_config()])


def _inject_with_destination(url: str, proxy: str | None, case: str) -> None:
    target = f"{url}/work"
    headers = propagation.inject({CASE_HEADER: case}, destination=target)
    requests.get(target, headers=headers, proxies={"http": proxy} if proxy else None, timeout=10)


def _inject_without_destination(url: str, proxy: str | None, case: str) -> None:
    headers = propagation.inject({CASE_HEADER: case})
    requests.get(f"{url}/work", headers=headers, proxies={"http": proxy} if proxy else None, timeout=10)


# NeMo Gym's patches add its x-nemo-gym-* headers, not the trace: they run beside gymtrace's trace
# injection (instrument_stack() turns on the aiohttp one), as here.


def _nemo_gym_httpx(url: str, proxy: str | None, case: str) -> None:
    nemo_gym.instrument()
    try:
        _httpx_transport(url, proxy, case)
    finally:
        nemo_gym.uninstrument()


def _nemo_gym_aiohttp(url: str, proxy: str | None, case: str) -> None:
    nemo_gym.instrument()
    try:
        _aiohttp_instrument(url, proxy, case)
    finally:
        nemo_gym.uninstrument()


# The provider of the test's capture: the official instrumentations' spans go there too.
_provider: list[Any] = [None]


@contextmanager
def _official(instrumentor: Any) -> Iterator[None]:
    instrumentor.instrument(tracer_provider=_provider[0])
    try:
        yield
    finally:
        instrumentor.uninstrument()


def _official_httpx(url: str, proxy: str | None, case: str) -> None:
    with _official(HTTPXClientInstrumentor()), httpx.Client(proxy=proxy) as client:
        client.get(f"{url}/work", headers={CASE_HEADER: case}).raise_for_status()


def _official_requests(url: str, proxy: str | None, case: str) -> None:
    with _official(RequestsInstrumentor()):
        proxies = {"http": proxy} if proxy else None
        requests.get(
            f"{url}/work", headers={CASE_HEADER: case}, proxies=proxies, timeout=10
        ).raise_for_status()


def _official_aiohttp(url: str, proxy: str | None, case: str) -> None:
    with _official(AioHttpClientInstrumentor()):
        _aiohttp_get(url, proxy, case)


def _httpx_transport_and_official(url: str, proxy: str | None, case: str) -> None:
    # The official instrumentation wraps the inner transport and injects last: what it sends is
    # what gymtrace's transport let into the context for this destination.
    with _official(HTTPXClientInstrumentor()):
        _httpx_transport(url, proxy, case)


def _openai_and_official_httpx(url: str, proxy: str | None, case: str) -> None:
    # The official httpx instrumentation wraps the openai client's transport and injects last.
    with _official(HTTPXClientInstrumentor()):
        _openai(url, proxy, case)


def _aiohttp_instrument_and_official(url: str, proxy: str | None, case: str) -> None:
    with _official(AioHttpClientInstrumentor()):
        _aiohttp_instrument(url, proxy, case)


# (path, client, how the identity travels to a gym host: "baggage", "baggage+nemo-headers" or None
# for never)
GYMTRACE_PATHS: list[tuple[str, Callable[[str, str | None, str], None], str | None]] = [
    ("openai-integration", _openai, "baggage"),
    ("httpx-transport", _httpx_transport, "baggage"),
    ("aiohttp-instrument", _aiohttp_instrument, "baggage"),
    ("aiohttp-trace-config", _aiohttp_trace_config, "baggage"),
    ("aiohttp-base-url", _aiohttp_base_url, "baggage"),
    ("inject-with-destination", _inject_with_destination, "baggage"),
    ("inject-without-destination", _inject_without_destination, None),  # unknown: denied
    ("nemo-gym-httpx", _nemo_gym_httpx, "baggage+nemo-headers"),
    ("nemo-gym-aiohttp", _nemo_gym_aiohttp, "baggage+nemo-headers"),
    ("httpx-transport+official-httpx", _httpx_transport_and_official, "baggage"),
    ("openai-integration+official-httpx", _openai_and_official_httpx, "baggage"),
    ("aiohttp-instrument+official-aiohttp", _aiohttp_instrument_and_official, "baggage"),
]
OFFICIAL_PATHS: list[tuple[str, Callable[[str, str | None, str], None], str | None]] = [
    ("official-httpx", _official_httpx, None),
    ("official-requests", _official_requests, None),
    ("official-aiohttp", _official_aiohttp, None),
]
DESTINATIONS = ["gym", "upstream", "public"]


@contextmanager
def _in_episode(origin: str) -> Iterator[None]:
    """A gym episode opened here (``local``) or continued from a gym caller's headers, with some
    application baggage in the context (what the official instrumentations inject over gymtrace's
    header when gymtrace does not control the context of the request)."""
    with ExitStack() as stack:
        if origin == "local":
            token = otel_context.attach(baggage.set_baggage("tenant", "acme"))
            stack.callback(otel_context.detach, token)
            stack.enter_context(gymtrace.run(run_id="run-m"))
            stack.enter_context(gymtrace.rollout(rollout_id=ROLLOUT, task_id="task-9"))
            stack.enter_context(gymtrace.episode())
        else:
            stack.enter_context(propagation.attach(INCOMING))
        assert gymtrace.current().rollout_id == ROLLOUT
        yield


def _send(proxy: str, destination: str, client: Callable[[str, str | None, str], None]) -> dict[str, str]:
    """Make one request to ``destination`` and return the headers it arrived with."""
    case = uuid.uuid4().hex
    trace_id = gymtrace.current().trace_id
    if destination == "upstream":
        with instrumentation.gym_destination(False):
            client(proxy, None, case)  # the recording server itself, on loopback, no proxy
    else:
        client(GYM if destination == "gym" else PUBLIC, proxy, case)
    records = [r for r in httpx.get(f"{proxy}/__records__").json() if r["headers"].get(CASE_HEADER) == case]
    assert len(records) == 1, records
    (record,) = records
    expected_host = {"gym": GYM_HOST, "public": "api.openai.com", "upstream": "127.0.0.1"}[destination]
    assert httpx.URL(record["url"]).host == expected_host  # the request went where the client was told
    assert record["proxied"] is (destination != "upstream")
    headers: dict[str, str] = record["headers"]
    # The trace goes everywhere: traceparent names this episode's trace.
    assert headers.get("traceparent", "").startswith(f"00-{trace_id}-"), headers
    return headers


def _gym_entries(headers: dict[str, str]) -> dict[str, str]:
    entries = [e.split(";", 1)[0].strip() for e in headers.get("baggage", "").split(",") if e.strip()]
    return dict(e.split("=", 1) for e in entries if e.startswith("gym."))


def _assert_arrived(headers: dict[str, str], carrier: str | None, destination: str) -> None:
    gym = _gym_entries(headers)
    nemo = {k: v for k, v in headers.items() if k.startswith("x-nemo-gym-")}
    inside = destination == "gym" and carrier is not None
    if inside:
        assert gym.get(c.ROLLOUT_ID) == ROLLOUT, headers
        assert gym.get(c.EPISODE_ATTEMPT) == "0", headers
    else:
        assert gym == {}, f"gym identity sent to {destination}: {headers.get('baggage')}"
    if inside and "nemo-headers" in carrier:
        assert nemo.get(c.NEMO_GYM_ROLLOUT_HEADER), headers
        assert nemo.get(c.NEMO_GYM_ATTEMPT_HEADER) == "0", headers
    else:
        assert nemo == {}, f"NeMo Gym identity headers sent to {destination}: {nemo}"
    # No gymtrace step reservation travels with a plain request (only a continuation asks for one).
    assert "gym.step.base" not in headers.get("baggage", "")


@pytest.mark.parametrize("destination", DESTINATIONS)
@pytest.mark.parametrize("origin", ["local", "continued"])
@pytest.mark.parametrize(("path", "client", "carrier"), GYMTRACE_PATHS, ids=[p[0] for p in GYMTRACE_PATHS])
def test_gymtrace_clients_send_identity_to_gym_hosts_only(
    proxy: str, origin: str, destination: str, path: str, client: Any, carrier: str | None
) -> None:
    with gymtrace.testing.capture_spans() as captured, _in_episode(origin):
        _provider[0] = captured.tracer_provider
        headers = _send(proxy, destination, client)
    _assert_arrived(headers, carrier, destination)


@pytest.mark.parametrize("destination", DESTINATIONS)
@pytest.mark.parametrize("origin", ["local", "continued"])
@pytest.mark.parametrize(("path", "client", "carrier"), OFFICIAL_PATHS, ids=[p[0] for p in OFFICIAL_PATHS])
def test_official_instrumentations_forward_no_gym_identity_anywhere(
    proxy: str, origin: str, destination: str, path: str, client: Any, carrier: str | None
) -> None:
    # They send the context's baggage to every host: the identity must never be baggage here.
    with gymtrace.testing.capture_spans() as captured, _in_episode(origin):
        _provider[0] = captured.tracer_provider
        headers = _send(proxy, destination, client)
    _assert_arrived(headers, carrier, destination)
    # The span the official instrumentation made for the request still carries the identity.
    client_spans = [
        s for s in captured.spans if s.kind.name == "CLIENT" and c.KIND not in (s.attributes or {})
    ]
    assert client_spans, [s.name for s in captured.spans]
    assert all((s.attributes or {}).get(c.ROLLOUT_ID) == ROLLOUT for s in client_spans)


def test_the_matrix_reaches_the_proxy_by_the_public_name(proxy: str) -> None:
    # The harness itself: a request to the public name arrives proxied with that name, and the
    # recorded headers are the ones sent.
    case = uuid.uuid4().hex
    requests.get(f"{PUBLIC}/ping", headers={CASE_HEADER: case}, proxies={"http": proxy}, timeout=10)
    records = [r for r in httpx.get(f"{proxy}/__records__").json() if r["headers"].get(CASE_HEADER) == case]
    assert [(r["url"], r["proxied"]) for r in records] == [(f"{PUBLIC}/ping", True)]
    assert json.dumps(records)  # plain JSON
