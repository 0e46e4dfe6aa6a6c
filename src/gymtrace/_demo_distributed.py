"""``gymtrace demo --distributed``: one rollout, many processes, one trace.

Starts real processes on 127.0.0.1 (free ports): an agent server, a model server (a scripted fake
model behind an OpenAI-compatible ``/v1/chat/completions``) and an environment server
(``seed_session``, the tools ``search`` and ``calculator``, ``verify``), each with its own
``service.name``; this process is the driver. The environment server dies in the middle of one
rollout's first episode; the driver retries that rollout (attempt 1) against a restarted server.

Spans go to ``OTEL_EXPORTER_OTLP_ENDPOINT`` when it is set (see them in Jaeger), else every
process writes its own file of OTLP/JSON lines, and the driver appends them all to the embedded
default file (``GYMTRACE_FILE`` or ``./gymtrace-traces.jsonl``) and prints the cross-process tree.
One file per process: concurrent appends from several processes are only safe when every line is
one ``write()``, which buffered text files do not promise for long lines.

The servers are also used by the tests and the benchmark: ``python -m gymtrace._demo_distributed
serve --role env`` prints ``GYMTRACE-PORT <port>`` once it listens.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gymtrace import _constants as c
from gymtrace import _environment as env

READY_PREFIX = "GYMTRACE-PORT "
MODEL_NAME = "scripted-model"
CRASH_EXIT_CODE = 17
# Spans of the servers reach their exporter soon after they end, so a server that dies loses little.
_SERVER_SCHEDULE_DELAY_MS = "200"

# httpx writes request headers and body in separate writes; with Nagle's algorithm the body waits
# for the server's delayed ACK, ~40 ms per request on Linux loopback.
NODELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]

TASKS = (
    {"id": "add-2-40", "question": "What is 2 + 40?", "expression": "2 + 40", "expected": "42"},
    {"id": "mul-6-7", "question": "What is 6 * 7?", "expression": "6 * 7", "expected": "42"},
)


def _official_instrumentation_available() -> bool:
    try:
        import opentelemetry.instrumentation.asgi
        import opentelemetry.instrumentation.httpx  # noqa: F401
    except ImportError:
        return False
    return True


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
    from gymtrace.http import AsyncHttpxTransport

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


def wrap_app(app: Any, *, gymtrace_middleware: bool = True, official: bool = False) -> Any:
    """The app as the demo serves it: gymtrace's middleware inside, the official one outside."""
    if gymtrace_middleware:
        from gymtrace.asgi import GymTraceMiddleware

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
    official: bool = False,
    gymtrace_middleware: bool = True,
    instrument_clients: bool = False,
) -> int:
    """Serve ``app`` on a free loopback port until SIGTERM/SIGINT; print the port when listening."""
    import uvicorn

    import gymtrace

    if service_name is not None:
        gymtrace.configure(service_name=service_name)
    if instrument_clients:
        _instrument_clients()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # inherited by accepted connections
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # listening before the port is announced: a client never sees a refused connection
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        wrap_app(app, gymtrace_middleware=gymtrace_middleware, official=official),
        log_level="warning",
        access_log=False,
        lifespan="off",
    )
    server = uvicorn.Server(config)
    # uvicorn shuts down gracefully on SIGTERM and then re-raises the signal to the handler that was
    # installed before it; with the default one the process dies before the `finally` below and the
    # last spans are lost (opentelemetry-python#4813). This handler turns it into SystemExit.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    print(f"{READY_PREFIX}{port}", flush=True)
    try:
        server.run(sockets=[sock])
    finally:
        if service_name is not None:
            gymtrace.shutdown()
    return 0


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(0)


def _instrument_clients() -> None:
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


def _serve_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="gymtrace._demo_distributed serve")
    parser.add_argument("--role", choices=("agent", "model", "env", "app"), required=True)
    parser.add_argument("--app", default=None, help="with --role app: module:factory of the ASGI app")
    parser.add_argument("--service", default=None, help="service.name; configure() is skipped when absent")
    parser.add_argument("--crash-rollout", default=None)
    parser.add_argument("--official", action="store_true", help="add the official OpenTelemetry middleware")
    parser.add_argument("--no-gymtrace", action="store_true", help="serve without gymtrace (benchmark)")
    args = parser.parse_args(argv)
    if args.role == "app":
        import importlib

        module, _, factory = str(args.app).partition(":")
        app = getattr(importlib.import_module(module), factory)()
    else:
        factories: dict[str, Any] = {
            "agent": agent_app,
            "model": model_app,
            "env": lambda: env_app(args.crash_rollout),
        }
        app = factories[args.role]()
    return serve(
        app,
        service_name=args.service,
        official=args.official,
        gymtrace_middleware=not args.no_gymtrace,
        instrument_clients=args.official,
    )


# -- managing service processes ---------------------------------------------------------------------


class ServiceProcess:
    """One service in its own process on a free loopback port; ``stop()`` always ends it."""

    def __init__(
        self,
        role: str,
        *,
        service: str | None,
        extra: Sequence[str] = (),
        env_overrides: dict[str, str] | None = None,
        log_dir: str | None = None,
        startup_timeout: float = 60.0,
    ) -> None:
        self.role = role
        self.service = service
        command = [sys.executable, "-m", "gymtrace._demo_distributed", "serve", "--role", role, *extra]
        if service is not None:
            command += ["--service", service]
        environ = {
            **os.environ,
            "OTEL_BSP_SCHEDULE_DELAY": _SERVER_SCHEDULE_DELAY_MS,
            **(env_overrides or {}),
        }
        environ.pop("PYTEST_CURRENT_TEST", None)  # a server is not under test: never raise internally
        log_dir = log_dir or tempfile.gettempdir()
        self.log_path = Path(log_dir) / f"{service or role}-{uuid.uuid4().hex[:6]}.log"
        self._log = open(self.log_path, "w", encoding="utf-8")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=self._log, env=environ, start_new_session=True
        )
        try:
            self.port = self._wait_for_port(startup_timeout)
        except BaseException:
            self.stop()
            raise
        self.url = f"http://127.0.0.1:{self.port}"

    def _wait_for_port(self, timeout: float) -> int:
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout
        buffer = b""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.process.stdout], [], [], 0.2)
            if ready:
                chunk = os.read(self.process.stdout.fileno(), 4096)
                if not chunk:
                    break
                buffer += chunk
                for line in buffer.decode(errors="replace").splitlines():
                    if line.startswith(READY_PREFIX):
                        return int(line[len(READY_PREFIX) :])
            elif self.process.poll() is not None:
                break
        raise RuntimeError(
            f"{self.role} server did not start (exit {self.process.poll()}); log: "
            f"{self.log_path.read_text(errors='replace')[-2000:]}"
        )

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM (the server flushes its spans), then SIGKILL after ``timeout``; the exit code."""
        if self.process.poll() is None:
            try:
                self.process.send_signal(signal.SIGTERM)
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._log.close()
        return self.process.returncode

    def wait_exit(self, timeout: float = 15.0) -> int | None:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None


# -- the driver ------------------------------------------------------------------------------------------


def drive(
    *,
    agent_url: str,
    model_url: str,
    env_url: str,
    restart_env: Any,
    run_id: str,
    tasks: Sequence[dict[str, Any]] = TASKS,
    repeats: int = 1,
    max_attempts: int = 3,
) -> list[dict[str, Any]]:
    """Run every task ``repeats`` times through the agent; retry infrastructure failures.

    ``restart_env()`` returns the URL of a fresh environment server. Returns one summary per rollout.
    """
    import httpx

    import gymtrace
    from gymtrace.http import HttpxTransport

    results: list[dict[str, Any]] = []
    with (
        httpx.Client(transport=HttpxTransport(socket_options=NODELAY), timeout=60.0) as client,
        gymtrace.run(run_id=run_id),
    ):
        for task in tasks:
            for repeat in range(repeats):
                rollout_id = rollout_id_for(run_id, task["id"], repeat)
                summary: dict[str, Any] = {"rollout_id": rollout_id, "attempts": 0, "reward": None}
                with gymtrace.rollout(rollout_id=rollout_id, task_id=task["id"], repeat=repeat) as rollout:
                    for _ in range(max_attempts):
                        summary["attempts"] += 1
                        with gymtrace.episode() as episode:
                            response = client.post(
                                f"{agent_url}/run",
                                json={"task": task, "model_url": model_url, "env_url": env_url},
                            )
                            if response.status_code == 502 and response.json().get("retryable"):
                                episode.record_failure(
                                    c.FAILURE_INFRASTRUCTURE, retryable=True, message=response.json()["error"]
                                )
                                env_url = restart_env()
                                continue
                            response.raise_for_status()
                            episode.record_reward(response.json()["reward"])
                            summary["reward"] = response.json()["reward"]
                            break
                    summary["trace_id"] = rollout.trace_id
                results.append(summary)
    return results


def rollout_id_for(run_id: str, task_id: str, repeat: int) -> str:
    return f"{run_id}-{task_id}-r{repeat}"


def run(argv: list[str] | None = None) -> int:
    """Entry point of ``gymtrace demo --distributed``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="gymtrace demo --distributed", description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=2, help="rollouts per task (default 2)")
    parser.add_argument("--no-crash", action="store_true", help="do not kill the environment server")
    parser.add_argument(
        "--no-official",
        action="store_true",
        help="do not use the official OpenTelemetry HTTP instrumentations even if installed",
    )
    parser.add_argument(
        "--file",
        default=None,
        help="where the spans go (default: GYMTRACE_FILE or "
        f"./{env.DEFAULT_FILE}); ignored when OTEL_EXPORTER_OTLP_ENDPOINT is set",
    )
    parser.add_argument("--run-id", default=None)
    parser.add_argument("--quiet", action="store_true", help="print the summary, not the tree")
    args = parser.parse_args(argv)
    try:
        import httpx  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        print(f"gymtrace demo --distributed needs: pip install 'gymtrace[demo]' ({exc})", file=sys.stderr)
        return 2
    try:
        return _run(args)
    except KeyboardInterrupt:
        print("interrupted; services stopped", file=sys.stderr)
        return 130


def _run(args: argparse.Namespace) -> int:
    import gymtrace

    otlp = bool(
        os.environ.get(env.OTEL_EXPORTER_OTLP_ENDPOINT)
        or os.environ.get(env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)
    )
    official = _official_instrumentation_available() and not args.no_official
    run_id = args.run_id or f"demo-{uuid.uuid4().hex[:8]}"
    crash_rollout = None if args.no_crash else rollout_id_for(run_id, TASKS[-1]["id"], 0)
    work = tempfile.mkdtemp(prefix="gymtrace-demo-")
    processes: list[ServiceProcess] = []

    def start(role: str, service: str, *extra: str) -> ServiceProcess:
        overrides = {} if otlp else {env.GYMTRACE_FILE: str(Path(work) / f"{service}-{len(processes)}.jsonl")}
        process = ServiceProcess(
            role,
            service=service,
            extra=[*extra, *(["--official"] if official else [])],
            env_overrides=overrides,
            log_dir=work,
        )
        processes.append(process)
        return process

    results: list[dict[str, Any]] = []
    driver_file = None if otlp else str(Path(work) / "gym-driver.jsonl")
    try:
        model = start("model", "gym-model")
        environments = [
            start("env", "gym-env", *(["--crash-rollout", crash_rollout] if crash_rollout else []))
        ]
        agent = start("agent", "gym-agent")

        def restart_env() -> str:
            environments[-1].wait_exit()  # the crashed server is gone; make sure before replacing it
            environments.append(start("env", "gym-env"))
            return environments[-1].url

        gymtrace.configure(service_name="gym-driver", file=driver_file if driver_file else False)
        if official:
            _instrument_clients()
        results = drive(
            agent_url=agent.url,
            model_url=model.url,
            env_url=environments[0].url,
            restart_env=restart_env,
            run_id=run_id,
            repeats=args.repeats,
        )
    finally:
        gymtrace.force_flush()
        for process in processes:
            process.stop()
    for summary in results:
        reward = "unscored" if summary["reward"] is None else f"reward={summary['reward']:g}"
        print(
            f"rollout {summary['rollout_id']}: {summary['attempts']} attempt(s), {reward}, "
            f"trace {summary['trace_id']}"
        )
    if otlp:
        print(
            f"spans exported to {os.environ.get(env.OTEL_EXPORTER_OTLP_ENDPOINT) or 'the OTLP endpoint'};"
            f' search Jaeger for the tag gym.rollout.id or run id "{run_id}"'
        )
        return 0
    out = args.file or os.environ.get(env.GYMTRACE_FILE) or env.DEFAULT_FILE
    spans = merge_trace_files(sorted(Path(work).glob("*.jsonl")), out)
    if not args.quiet:
        from gymtrace._render import render_tree

        print(render_tree(spans))
    print(f"{len(spans)} spans from {len({s.service for s in spans})} services appended to {out}")
    return 0


def merge_trace_files(paths: Sequence[Path], out: str | os.PathLike[str]) -> list[Any]:
    """Append whole lines of several OTLP/JSON lines files to ``out``; the spans they hold."""
    from gymtrace._spandata import read_otlp_json_lines

    spans: list[Any] = []
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with open(out, "a", encoding="utf-8") as target:
        for path in paths:
            if not path.exists():
                continue
            spans.extend(read_otlp_json_lines(path))
            for line in path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    target.write(line + "\n")
    return spans


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:
        return _serve_main(argv[1:])
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
