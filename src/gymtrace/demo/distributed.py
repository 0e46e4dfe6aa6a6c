"""``gymtrace demo --distributed``: one rollout, many processes, one trace.

Starts real processes on 127.0.0.1 (free ports): an agent server, a model server and an
environment server (:mod:`gymtrace.demo.services`), each with its own ``service.name``; this
process is the driver. The environment server dies in the middle of one rollout's first episode;
the driver retries that rollout (attempt 1) against a restarted server.

Spans go over OTLP to the endpoint when one is given (or ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set;
see them in Jaeger); else every process writes its own file of OTLP/JSON lines, and the driver
appends them all to one file (``--file``, ``GYMTRACE_FILE`` or ``./gymtrace-traces.jsonl``). One
file per process: concurrent appends from several processes are only safe when every line is one
``write()``, which buffered text files do not promise for long lines.

:func:`run_distributed` returns what happened; the command line prints it.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gymtrace import _constants as c
from gymtrace._model import environment as env
from gymtrace._model import settings as _settings
from gymtrace._model.spandata import SpanData, read_trace_files
from gymtrace._model.tracefiles import open_lines, trace_files
from gymtrace.demo.services import NODELAY, READY_PREFIX, instrument_clients

# Spans of the servers reach their exporter soon after they end, so a server that dies loses little.
_SERVER_SCHEDULE_DELAY_MS = "200"

TASKS = (
    {"id": "add-2-40", "question": "What is 2 + 40?", "expression": "2 + 40", "expected": "42"},
    {"id": "mul-6-7", "question": "What is 6 * 7?", "expression": "6 * 7", "expected": "42"},
)


def official_instrumentation_available() -> bool:
    try:
        import opentelemetry.instrumentation.asgi
        import opentelemetry.instrumentation.httpx  # noqa: F401
    except ImportError:
        return False
    return True


# -- managing service processes ---------------------------------------------------------------------


class ServiceProcess:
    """One service in its own process on a free loopback port; ``stop()`` always ends it.

    ``argv`` are the arguments after ``python``; the process prints ``GYMTRACE-PORT <port>`` once it
    listens (``gymtrace demo-service`` does).
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        name: str,
        env_overrides: Mapping[str, str] | None = None,
        log_dir: str | None = None,
        startup_timeout: float = 60.0,
    ) -> None:
        self.name = name
        environ = {
            **os.environ,
            env.OTEL_BSP_SCHEDULE_DELAY: _SERVER_SCHEDULE_DELAY_MS,
            **(env_overrides or {}),
        }
        log_dir = log_dir or tempfile.gettempdir()
        self.log_path = Path(log_dir) / f"{name}-{uuid.uuid4().hex[:6]}.log"
        self._log = open(self.log_path, "w", encoding="utf-8")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [sys.executable, *argv],
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=environ,
            start_new_session=True,
        )
        try:
            self.port = self._wait_for_port(startup_timeout)
        except BaseException:
            self.stop()
            raise
        self.url = f"http://127.0.0.1:{self.port}"

    @classmethod
    def demo(cls, role: str, *, service: str, extra: Sequence[str] = (), **kwargs: Any) -> ServiceProcess:
        """A demo service (``agent``, ``model`` or ``env``) traced as ``service``."""
        argv = ["-m", "gymtrace", "demo-service", "--role", role, "--service", service, *extra]
        return cls(argv, name=service, **kwargs)

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
            f"{self.name} server did not start (exit {self.process.poll()}); log: "
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
    restart_env: Callable[[], str],
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
    from gymtrace.integrations.httpx import HttpxTransport

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


@dataclass(frozen=True)
class DistributedResult:
    """What ``run_distributed()`` did: one summary per rollout and where the spans went."""

    run_id: str
    rollouts: list[dict[str, Any]]
    # OTLP: the traces URL and protocol every process exported to; else None.
    endpoint: str | None = None
    protocol: str | None = None
    # Files: the one file all processes' spans were appended to, and those spans.
    file: str | None = None
    spans: list[SpanData] = field(default_factory=list)


def missing_requirements() -> str | None:
    """None when the distributed demo can run here, else what to install."""
    try:
        import httpx  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        return f"pip install 'gymtrace[demo]' ({exc})"
    return None


def run_distributed(
    *,
    run_id: str,
    repeats: int = 1,
    file: str | None = None,
    endpoint: str | None = None,
    protocol: str | None = None,
    crash: bool = True,
    official: bool | None = None,
) -> DistributedResult:
    """Run the distributed demo: start the services, drive the rollouts, stop the services.

    ``endpoint``/``protocol`` (else ``OTEL_EXPORTER_OTLP_*``) send every process's spans over OTLP;
    without an endpoint they are appended to ``file`` (else ``GYMTRACE_FILE``, else the embedded
    default). ``official`` (default: when installed) adds the official HTTP instrumentations.
    """
    import gymtrace

    settings = _settings.resolve(endpoint=endpoint, protocol=protocol, file=False)
    otlp = settings.endpoint is not None
    if official is None:
        official = official_instrumentation_available()
    crash_rollout = rollout_id_for(run_id, TASKS[-1]["id"], 0) if crash else None
    work = tempfile.mkdtemp(prefix="gymtrace-demo-")
    processes: list[ServiceProcess] = []

    def start(role: str, service: str, *extra: str) -> ServiceProcess:
        if otlp:
            assert settings.endpoint is not None
            overrides = {
                env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: settings.endpoint,
                env.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: settings.protocol,
                env.GYMTRACE_FILE: "",
            }
        else:
            overrides = {env.GYMTRACE_FILE: str(Path(work) / f"{service}-{len(processes)}.jsonl")}
        process = ServiceProcess.demo(
            role,
            service=service,
            extra=[*extra, *(["--official"] if official else [])],
            env_overrides=overrides,
            log_dir=work,
        )
        processes.append(process)
        return process

    rollouts: list[dict[str, Any]] = []
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

        if otlp:
            gymtrace.configure(
                service_name="gym-driver", endpoint=settings.endpoint, protocol=settings.protocol, file=False
            )
        else:
            gymtrace.configure(service_name="gym-driver", file=str(Path(work) / "gym-driver.jsonl"))
        if official:
            instrument_clients()
        rollouts = drive(
            agent_url=agent.url,
            model_url=model.url,
            env_url=environments[0].url,
            restart_env=restart_env,
            run_id=run_id,
            repeats=repeats,
        )
    finally:
        gymtrace.force_flush()
        for process in processes:
            process.stop()
        gymtrace.shutdown()
    if otlp:
        return DistributedResult(run_id, rollouts, endpoint=settings.endpoint, protocol=settings.protocol)
    out = file or _settings.resolve(file=True).file or env.DEFAULT_FILE
    spans = merge_trace_files(trace_files(work), out)
    return DistributedResult(run_id, rollouts, file=out, spans=spans)


def merge_trace_files(paths: Sequence[Path], out: str | os.PathLike[str]) -> list[SpanData]:
    """Append whole lines of several OTLP/JSON lines files to ``out``; the spans they hold."""
    spans: list[SpanData] = []
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with open(out, "ab") as target:
        for path in paths:
            if not path.exists():
                continue
            spans.extend(read_trace_files([path]))
            with open_lines(path) as lines:
                for line in lines:
                    if line.strip():
                        target.write(line.rstrip(b"\n") + b"\n")
    return spans
