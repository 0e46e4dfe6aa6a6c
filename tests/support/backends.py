"""Real MLflow and Arize Phoenix servers for the backend tests, each from its own virtualenv.

``scripts/test`` builds ``.venv-mlflow`` (``pip install mlflow``) and ``.venv-phoenix``
(``pip install arize-phoenix``) once; a test starts a server on a free loopback port with SQLite in
a temporary directory and stops it (only the process it started) when done::

    with MlflowServer() as server:
        ...export to server.url...
        traces = server.client_json("search_traces", experiment="gymtrace")

Only the standard library is used here; whatever needs the server's own Python client runs in the
server's virtualenv (``run_in_venv``), never in the test's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from gymtrace import _constants as c
from pipeline import REPO_ROOT, free_ports

MLFLOW_PYTHON = REPO_ROOT / ".venv-mlflow" / "bin" / "python"
PHOENIX_PYTHON = REPO_ROOT / ".venv-phoenix" / "bin" / "python"
# Each server answers in ~20 s on an idle machine; a shared CI machine can take several times that.
START_TIMEOUT = 240.0


def missing(python: Path, what: str) -> str | None:
    """Why a server cannot start here (its venv is missing), or None."""
    if not python.exists():
        return f"{python.parent.parent.name} is missing: scripts/test builds it ({what})"
    return None


class Server:
    """A server process on a free loopback port; a context manager that stops it (and only it)."""

    name = "server"
    python: Path

    def __init__(self) -> None:
        self.port = free_ports(1)[0]
        self.url = f"http://127.0.0.1:{self.port}"
        self._dir = tempfile.TemporaryDirectory(prefix=f"gymtrace-{self.name}-")
        self.workdir = Path(self._dir.name)
        self.log = self.workdir / "server.log"
        self.process: subprocess.Popen[bytes] | None = None

    def command(self) -> tuple[list[str], dict[str, str]]:
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

    def __enter__(self) -> Server:
        argv, extra_env = self.command()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GYMTRACE_"))}
        env.update(extra_env)
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                argv, cwd=self.workdir, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited at start:\n{self.tail()}")
            try:
                if self.ready():
                    return self
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"{self.name} did not answer within {START_TIMEOUT:g} s:\n{self.tail()}")

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        process = self.process
        if process is not None and process.poll() is None:
            # The server's own process group (start_new_session): its workers go with it.
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
        self._dir.cleanup()

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=10) as response:
            return json.loads(response.read() or b"null")

    def post(self, path: str, body: Any) -> Any:
        request = urllib.request.Request(
            self.url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read() or b"null")

    def run_in_venv(self, code: str, *args: str) -> Any:
        """Run ``code`` with the server's own Python (its client library); its last stdout line is JSON."""
        done = subprocess.run(
            [str(self.python), "-c", code, self.url, *args],
            capture_output=True,
            text=True,
            timeout=120,
            env={k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GYMTRACE_", "MLFLOW_"))},
        )
        if done.returncode != 0:
            raise RuntimeError(f"{self.name} client failed:\n{done.stderr[-3000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])


class MlflowServer(Server):
    name = "mlflow"
    python = MLFLOW_PYTHON

    def command(self) -> tuple[list[str], dict[str, str]]:
        mlflow = str(self.python.parent / "mlflow")
        return (
            [
                mlflow,
                "server",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--workers",
                "1",
                "--backend-store-uri",
                f"sqlite:///{self.workdir / 'mlflow.db'}",
                "--default-artifact-root",
                str(self.workdir / "artifacts"),
            ],
            {},
        )

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as response:
                return response.status == 200
        except urllib.error.HTTPError:
            return False

    def traces(self, experiment: str, filter_string: str = "", run_id: str = "") -> list[dict[str, Any]]:
        """``search_traces`` through MLflow's own client (of the MLflow run ``run_id`` if given): each
        trace's info, assessments included."""
        return self.run_in_venv(_SEARCH_TRACES, experiment, filter_string, run_id)  # type: ignore[no-any-return]

    def runs(self, experiment: str) -> list[dict[str, Any]]:
        return self.run_in_venv(_SEARCH_RUNS, experiment)  # type: ignore[no-any-return]


_SEARCH_TRACES = """
import json, sys
from mlflow import MlflowClient
url, experiment, filter_string, run_id = sys.argv[1:5]
client = MlflowClient(tracking_uri=url)
exp = client.get_experiment_by_name(experiment)
out = []
if exp is not None:
    traces = client.search_traces(
        locations=[exp.experiment_id], filter_string=filter_string or None, run_id=run_id or None, max_results=500
    )
    for t in traces:
        info = t.info
        out.append({
            "trace_id": info.trace_id,
            "tags": dict(info.tags),
            "metadata": dict(info.trace_metadata),
            "state": str(info.state),
            "assessments": [
                {"name": a.name, "value": a.value, "span_id": a.span_id, "metadata": dict(a.metadata or {}),
                 "valid": a.valid, "id": a.assessment_id}
                for a in info.assessments
            ],
            "spans": [{"name": s.name, "type": s.span_type, "attributes": {k: v for k, v in s.attributes.items() if isinstance(v, (str, int, float, bool))}} for s in t.data.spans],
        })
print(json.dumps(out, default=str))
"""

_SEARCH_RUNS = """
import json, sys
from mlflow import MlflowClient
url, experiment = sys.argv[1:3]
client = MlflowClient(tracking_uri=url)
exp = client.get_experiment_by_name(experiment)
runs = client.search_runs([exp.experiment_id]) if exp is not None else []
print(json.dumps([{"run_id": r.info.run_id, "name": r.info.run_name, "status": r.info.status,
                   "tags": dict(r.data.tags), "metrics": dict(r.data.metrics)} for r in runs]))
"""


class PhoenixServer(Server):
    name = "phoenix"
    python = PHOENIX_PYTHON

    def command(self) -> tuple[list[str], dict[str, str]]:
        grpc_port = free_ports(1)[0]
        return (
            [str(self.python.parent / "phoenix"), "serve"],
            {
                "PHOENIX_PORT": str(self.port),
                "PHOENIX_HOST": "127.0.0.1",
                "PHOENIX_GRPC_PORT": str(grpc_port),
                "PHOENIX_WORKING_DIR": str(self.workdir),
                "PHOENIX_TELEMETRY_ENABLED": "false",
            },
        )

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/healthz", timeout=2) as response:
                return response.status == 200
        except urllib.error.HTTPError:
            return False

    def spans(self, project: str) -> list[dict[str, Any]]:
        """Every span of ``project`` through Phoenix's REST API (``GET /v1/projects/{p}/spans``)."""
        out: list[dict[str, Any]] = []
        cursor = None
        while True:
            query = "?limit=1000" + (f"&cursor={cursor}" if cursor else "")
            try:
                page = self.get(f"/v1/projects/{project}/spans{query}")
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    return []
                raise
            out.extend(page["data"])
            cursor = page.get("next_cursor")
            if not cursor:
                return out

    def run_spans(
        self, project: str, run_id: str, count: int, timeout: float = 120.0
    ) -> list[dict[str, Any]]:
        """The spans of run ``run_id`` in ``project`` once Phoenix holds ``count`` of them (or the
        timeout passed): its OTLP receiver answers before it has written the spans to the
        database, so a read right after a live run may see part of it (a CI run read 142 of 146)."""
        deadline = time.monotonic() + timeout
        while True:
            spans = [s for s in self.spans(project) if s["attributes"].get(c.RUN_ID) == run_id]
            if len(spans) >= count or time.monotonic() > deadline:
                return spans
            time.sleep(0.5)

    def annotations(self, project: str, span_ids: list[str]) -> list[dict[str, Any]]:
        """The span annotations of ``span_ids`` (``GET /v1/projects/{p}/span_annotations``)."""
        out: list[dict[str, Any]] = []
        for start in range(0, len(span_ids), 50):
            query = "&".join(f"span_ids={s}" for s in span_ids[start : start + 50])
            page = self.get(f"/v1/projects/{project}/span_annotations?limit=1000&{query}")
            out.extend(page["data"])
        return out
