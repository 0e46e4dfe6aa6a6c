"""Per-request cost of gymtrace on the wire: its ASGI middleware + client injection, against the
official OpenTelemetry instrumentation alone on the same server.

Copies of the demo's model server run in their own processes on 127.0.0.1, each with the SDK
configured and exporting every span to a file:

- ``plain``: no tracing at all, a plain httpx client (for scale only);
- ``official``: the official ASGI middleware (SERVER span) on the server, the official httpx
  instrumentation (CLIENT span) on a client used inside an episode scope;
- ``gymtrace``: the same, plus ``GymTraceMiddleware`` inside the official middleware and the
  client's requests sent through ``gymtrace.integrations.httpx.HttpxTransport`` (traceparent + identity baggage,
  trust check, identity stamped on the server's spans).

Like for like: the same server code, the same spans, the same exporter. Requests alternate between
the modes in rounds so drift hits all of them alike. Measured per request: CPU time of the server
process (from /proc, user + system), CPU time of this client process (``time.process_time``) and
wall latency; the medians over rounds and the ratios gymtrace/official are printed, measured in
this one run.

    python benchmarks/distributed_overhead.py [--rounds 7] [--requests 300]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))  # serve_app.py
import gymtrace
import serve_app
from gymtrace.demo.distributed import ServiceProcess
from gymtrace.integrations.httpx import HttpxTransport

# httpx writes request headers and body separately; with Nagle's algorithm on, the body waits for
# the server's delayed ACK (~40 ms on Linux loopback), which would swamp everything measured here.
NODELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
BODY = {"model": "scripted-model", "messages": [{"role": "user", "content": "What is 2 + 40?"}]}
TICKS = os.sysconf("SC_CLK_TCK")


def _server_cpu(pid: int) -> float:
    """User + system CPU seconds of a process, from /proc (fields 14 and 15 of stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def _round(
    client: httpx.Client, server: ServiceProcess, requests: int, deadline: float
) -> tuple[float, float, float]:
    """Per request over ``requests`` POSTs: (server CPU s, client CPU s, wall s)."""
    done = 0
    cpu_server, cpu_client, wall = _server_cpu(server.process.pid), time.process_time(), time.perf_counter()
    while done < requests and time.monotonic() < deadline:
        client.post(f"{server.url}/v1/chat/completions", json=BODY).raise_for_status()
        done += 1
    n = max(done, 1)
    return (
        (_server_cpu(server.process.pid) - cpu_server) / n,
        (time.process_time() - cpu_client) / n,
        (time.perf_counter() - wall) / n,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--requests", type=int, default=300, help="requests per round and mode")
    parser.add_argument("--max-seconds", type=float, default=240.0)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="gymtrace-bench-"))
    base_env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "", "OTEL_TRACES_EXPORTER": ""}
    servers: dict[str, ServiceProcess] = {}
    clients: dict[str, httpx.Client] = {}
    try:
        model = [serve_app.PATH, "--app", "gymtrace.demo.services:model_app"]
        servers["plain"] = ServiceProcess(
            [*model, "--no-gymtrace"], name="plain", log_dir=str(work), env_overrides=base_env
        )
        servers["official"] = ServiceProcess(
            [*model, "--no-gymtrace", "--official", "--service", "bench-official"],
            name="bench-official",
            log_dir=str(work),
            env_overrides={**base_env, "GYMTRACE_FILE": str(work / "official.jsonl")},
        )
        servers["gymtrace"] = ServiceProcess(
            [*model, "--official", "--service", "bench-gymtrace"],
            name="bench-gymtrace",
            log_dir=str(work),
            env_overrides={**base_env, "GYMTRACE_FILE": str(work / "gymtrace.jsonl")},
        )
        gymtrace.configure(service_name="bench-client", file=work / "client.jsonl")
        clients["plain"] = httpx.Client(transport=httpx.HTTPTransport(socket_options=NODELAY))
        clients["official"] = httpx.Client(transport=httpx.HTTPTransport(socket_options=NODELAY))
        clients["gymtrace"] = httpx.Client(transport=HttpxTransport(socket_options=NODELAY))
        for name in ("official", "gymtrace"):
            HTTPXClientInstrumentor.instrument_client(clients[name])
        samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name in servers}
        deadline = time.monotonic() + args.max_seconds
        with gymtrace.rollout(rollout_id="bench-r0"), gymtrace.episode(), gymtrace.step():
            for name in servers:  # warm-up: connections, imports, first spans
                _round(clients[name], servers[name], 50, deadline)
            for _ in range(args.rounds):
                for name in servers:
                    samples[name].append(_round(clients[name], servers[name], args.requests, deadline))
    finally:
        for client in clients.values():
            client.close()
        for server in servers.values():
            server.stop()
        gymtrace.shutdown()
    median = {
        name: tuple(statistics.median(s[i] for s in values) for i in range(3))
        for name, values in samples.items()
    }
    print(f"{'':9s} {'server CPU':>11s} {'client CPU':>11s} {'total CPU':>10s} {'latency':>9s}  (µs/request)")
    for name, (server_cpu, client_cpu, wall) in median.items():
        total = server_cpu + client_cpu
        print(
            f"{name:9s} {server_cpu * 1e6:11.0f} {client_cpu * 1e6:11.0f} {total * 1e6:10.0f} {wall * 1e6:9.0f}"
        )
    g, o = median["gymtrace"], median["official"]
    print(f"ratio gymtrace/official server CPU: {g[0] / o[0]:.2f}x")
    print(f"ratio gymtrace/official client CPU: {g[1] / o[1]:.2f}x")
    print(f"ratio gymtrace/official total CPU:  {(g[0] + g[1]) / (o[0] + o[1]):.2f}x")
    print(f"ratio gymtrace/official latency:    {g[2] / o[2]:.2f}x")
    print(f"gymtrace - official total CPU:      {(g[0] + g[1] - o[0] - o[1]) * 1e6:.0f} µs/request")
    return 0


if __name__ == "__main__":
    sys.exit(main())
