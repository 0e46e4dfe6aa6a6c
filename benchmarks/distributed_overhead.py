"""Per-request cost of gymtrace's ASGI middleware + httpx injection over real loopback HTTP.

Three copies of the demo's model server run in their own processes on 127.0.0.1:

- ``plain``: no tracing at all; a plain httpx client;
- ``sdk``: the OpenTelemetry SDK configured (the handler's span is recorded and exported to a
  file), no gymtrace middleware; a plain httpx client;
- ``gymtrace``: the same plus ``GymTraceMiddleware``; the client sends every request through
  ``gymtrace.integrations.httpx.HttpxTransport`` inside an episode scope, so traceparent and identity baggage
  are injected, extracted and stamped on the server's span.

Requests alternate between the three in rounds so drift hits all of them alike; the count is
bounded (``--rounds`` x ``--requests``) and so is the time (``--max-seconds``). Prints the median
per-request latency of each and the ratios, measured in this one run.

    python benchmarks/distributed_overhead.py [--rounds 5] [--requests 200]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))  # serve_app.py
import gymtrace
import serve_app
from gymtrace.demo.distributed import ServiceProcess
from gymtrace.integrations.httpx import HttpxTransport

# httpx writes request headers and body separately; with Nagle's algorithm on, the body waits for
# the server's delayed ACK (~40 ms on Linux loopback), which would swamp everything measured here.
NODELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
BODY = {"model": "scripted-model", "messages": [{"role": "user", "content": "What is 2 + 40?"}]}


def _round(client: httpx.Client, url: str, requests: int, deadline: float) -> float:
    """Mean seconds per request over ``requests`` POSTs (fewer if the deadline passes)."""
    done = 0
    start = time.perf_counter()
    while done < requests and time.monotonic() < deadline:
        client.post(f"{url}/v1/chat/completions", json=BODY).raise_for_status()
        done += 1
    return (time.perf_counter() - start) / max(done, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--requests", type=int, default=200, help="requests per round and mode")
    parser.add_argument("--max-seconds", type=float, default=120.0)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="gymtrace-bench-"))
    base_env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "", "OTEL_TRACES_EXPORTER": ""}
    servers: dict[str, ServiceProcess] = {}
    try:
        model = [serve_app.PATH, "--app", "gymtrace.demo.services:model_app"]
        servers["plain"] = ServiceProcess(
            [*model, "--no-gymtrace"], name="plain", log_dir=str(work), env_overrides=base_env
        )
        servers["sdk"] = ServiceProcess(
            [*model, "--no-gymtrace", "--service", "bench-sdk"],
            name="bench-sdk",
            log_dir=str(work),
            env_overrides={**base_env, "GYMTRACE_FILE": str(work / "sdk.jsonl")},
        )
        servers["gymtrace"] = ServiceProcess(
            [*model, "--service", "bench-gymtrace"],
            name="bench-gymtrace",
            log_dir=str(work),
            env_overrides={**base_env, "GYMTRACE_FILE": str(work / "gym.jsonl")},
        )
        gymtrace.configure(service_name="bench-client", file=work / "client.jsonl")
        plain_client = httpx.Client(transport=httpx.HTTPTransport(socket_options=NODELAY))
        gym_client = httpx.Client(transport=HttpxTransport(socket_options=NODELAY))
        clients = {"plain": plain_client, "sdk": plain_client, "gymtrace": gym_client}
        samples: dict[str, list[float]] = {name: [] for name in servers}
        deadline = time.monotonic() + args.max_seconds
        with gymtrace.rollout(rollout_id="bench"), gymtrace.episode():
            for name in servers:  # warm-up: connections, imports, first spans
                _round(clients[name], servers[name].url, 20, deadline)
            for _ in range(args.rounds):
                for name in servers:
                    samples[name].append(_round(clients[name], servers[name].url, args.requests, deadline))
        plain_client.close()
        gym_client.close()
    finally:
        for server in servers.values():
            server.stop()
        gymtrace.shutdown()
    median = {name: statistics.median(values) for name, values in samples.items()}
    for name, seconds in median.items():
        print(
            f"{name:9s} {seconds * 1e6:8.0f} µs/request  (rounds: "
            + ", ".join(f"{v * 1e6:.0f}" for v in samples[name])
            + ")"
        )
    print(f"ratio gymtrace/plain: {median['gymtrace'] / median['plain']:.2f}x")
    print(f"ratio gymtrace/sdk:   {median['gymtrace'] / median['sdk']:.2f}x  (gymtrace's own share)")
    print(f"gymtrace - sdk:       {(median['gymtrace'] - median['sdk']) * 1e6:.0f} µs/request")
    return 0


if __name__ == "__main__":
    sys.exit(main())
