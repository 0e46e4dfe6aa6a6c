"""A real local trace pipeline for end-to-end tests: Jaeger + the gymtrace Collector.

Starts real subprocesses on free loopback ports, as ``collector/up`` does:

* Jaeger all-in-one (``collector/bin/jaeger``) with ``collector/jaeger.yaml`` and one store overlay
  (``jaeger.memory.yaml`` unless ``storage=`` says ``badger`` or ``opensearch``), query API;
* the gymtrace Collector with ``collector/otelcol.yaml`` (tail sampling) on the upstream build
  ``collector/bin/otelcol`` with ``otelcol.upstream.yaml`` (or, with ``collector_bin=JAEGER_BIN``,
  on the Jaeger binary with ``otelcol.health-jaeger.yaml``), exporting to that Jaeger;
* with ``samplers=N``: N such Collectors behind a load-balancing front Collector
  (``collector/otelcol-lb.yaml``, routing by trace ID) on the application's ports.

Ports, ``decision_wait`` and the sample percent are passed through the ``GYMTRACE_*`` environment
variables the configs read, so the YAML files under test are the ones users run.

Only the standard library is used, so this module can be imported from any test::

    with Pipeline(decision_wait="2s", sample_percent=0) as p:
        ...export spans to p.otlp_grpc_endpoint...
        traces = p.wait_for_traces("my-service", tags={"gym.rollout.id": "r-1"})

Build the binary first with ``collector/build``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
COLLECTOR_DIR = REPO_ROOT / "collector"
JAEGER_BIN = COLLECTOR_DIR / "bin" / "jaeger"
OTELCOL_BIN = COLLECTOR_DIR / "bin" / "otelcol"

Trace = dict[str, Any]
Span = dict[str, Any]


class PipelineError(RuntimeError):
    """A pipeline process failed to start, died, or did not become healthy in time, or a query
    failed (``status``: the HTTP status it answered, when there was one)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


# Ports are picked below the kernel's ephemeral range: a port the kernel handed out for port 0
# is also what it hands the next outgoing connection of any process, and in a CI run of parallel
# lanes one took a Collector's port between the pick and the Collector's bind ("address already
# in use"). Below the range only another test's pick can collide, and random picks did: a CI run's
# lanes start a dozen pipelines of 11-25 ports at once, and one sampler's health port had been
# handed to another test too. So every pick is claimed in a file all the test processes of this
# machine share, under a lock, and not handed out again for CLAIM_SECONDS (the window between a
# pick and its bind, and a killed server started again on its ports, are far shorter).
_PORT_FLOOR = 20000
CLAIM_SECONDS = 900.0
_CLAIMS = Path(tempfile.gettempdir()) / "gymtrace-test-ports"
_pick = random.Random()


def _ephemeral_floor() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default, and above what other systems hand out for port 0 here


@contextlib.contextmanager
def _claims() -> Iterator[dict[int, float]]:
    """The ports claimed in the last CLAIM_SECONDS (port -> when), held under an exclusive lock;
    what the body adds is written back."""
    import fcntl

    with open(f"{_CLAIMS}.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            now = time.time()
            claimed: dict[int, float] = {}
            with contextlib.suppress(OSError, ValueError):
                for line in _CLAIMS.read_text().splitlines():
                    port, at = line.split()
                    if now - float(at) < CLAIM_SECONDS:
                        claimed[int(port)] = float(at)
            yield claimed
            temporary = _CLAIMS.with_name(f"{_CLAIMS.name}.{os.getpid()}")
            temporary.write_text("".join(f"{port} {at}\n" for port, at in claimed.items()))
            temporary.replace(_CLAIMS)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def claim_ports(fits: Callable[[int], list[int]], tries: int = 200) -> list[int]:
    """The ports ``fits(base)`` names for the first random base where each is free and claimed by
    no other test (``fits`` returns the ports a base stands for: ``[base]``, ``[base, base+100]``)."""
    ceiling = _ephemeral_floor()
    with _claims() as claimed:
        for _ in range(tries if ceiling - _PORT_FLOOR > 1000 else 0):
            wanted = fits(_pick.randrange(_PORT_FLOOR, ceiling))
            if all(_PORT_FLOOR <= p < ceiling and p not in claimed and _bindable(p) for p in wanted):
                now = time.time()
                claimed.update((p, now) for p in wanted)
                return wanted
    if len(fits(0)) > 1:
        raise RuntimeError(f"no free range of ports below {ceiling} for {len(fits(0))} ports")
    # No room below the ephemeral range on this system: what the kernel gives for port 0.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1]]


def free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1, each claimed so that no other test process on
    this machine is handed it meanwhile."""
    out: list[int] = []
    while len(out) < n:
        out += [p for p in claim_ports(lambda base: [base]) if p not in out]
    return out


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<no log: {exc}>"
    return "\n".join(text.splitlines()[-lines:])


class _Process:
    """One pipeline process: its command, environment, log file and health URL."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], log: Path, health_url: str):
        self.name, self.cmd, self.env, self.log, self.health_url = name, cmd, env, log, health_url
        self.popen: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def start(self, timeout: float) -> None:
        if self.running:
            raise PipelineError(f"{self.name} is already running (pid {self.popen.pid})")
        with open(self.log, "ab") as log:
            log.write(f"--- starting {self.name}: {' '.join(self.cmd)}\n".encode())
            log.flush()
            self.popen = subprocess.Popen(
                self.cmd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Own process group: a Ctrl-C in pytest does not hit it before we stop it cleanly.
                start_new_session=True,
            )
        self.wait_healthy(timeout)

    def wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if not self.running:
                code = self.popen.returncode if self.popen else None
                raise PipelineError(
                    f"{self.name} exited with code {code} before becoming healthy; "
                    f"log {self.log}:\n{_tail(self.log)}"
                )
            try:
                with urllib.request.urlopen(self.health_url, timeout=1) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise PipelineError(
                    f"{self.name} not healthy at {self.health_url} after {timeout:.0f}s; "
                    f"log {self.log}:\n{_tail(self.log)}"
                )
            time.sleep(0.1)

    def signal(self, sig: int) -> None:
        if not self.running:
            raise PipelineError(f"{self.name} is not running")
        self.popen.send_signal(sig)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM (after SIGCONT, in case it is stalled), wait, then SIGKILL."""
        if self.popen is None:
            return
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signal.SIGCONT)
                self.popen.terminate()
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)
        self.popen = None

    def kill(self) -> None:
        if self.popen is None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.popen.kill()
        self.popen.wait(10)
        self.popen = None


class Pipeline:
    """Jaeger + gymtrace Collector(s) as subprocesses on free loopback ports.

    ``decision_wait`` and ``sample_percent`` set the Collector's tail sampling (the production
    defaults are 30m and 10; tests want seconds); ``decision_wait_after_root`` (upstream build
    only) the decision after the root span arrived (production default 5s; None: the config's).
    ``samplers=N`` puts N tail-sampling Collectors behind a load-balancing front Collector.
    ``extra_env`` adds or overrides any ``GYMTRACE_*`` variable the configs read.
    ``storage`` picks Jaeger's store overlay (``collector/jaeger.<storage>.yaml``); memory, the
    default, keeps each test's Jaeger fresh. Badger needs ``GYMTRACE_JAEGER_BADGER_DIR`` and
    OpenSearch ``GYMTRACE_OPENSEARCH_URL`` in ``extra_env``.
    """

    def __init__(
        self,
        *,
        decision_wait: str = "2s",
        decision_wait_after_root: str | None = None,
        sample_percent: float = 100,
        jaeger_bin: os.PathLike[str] | str = JAEGER_BIN,
        collector_bin: os.PathLike[str] | str = OTELCOL_BIN,
        collector_dir: os.PathLike[str] | str = COLLECTOR_DIR,
        workdir: os.PathLike[str] | str | None = None,
        startup_timeout: float = 60.0,
        samplers: int = 0,
        extra_env: Mapping[str, str] | None = None,
        sampler_extra_configs: Mapping[int, list[str]] | None = None,
        storage: str = "memory",
    ):
        self.jaeger_bin = Path(jaeger_bin)
        self.collector_bin = Path(collector_bin)
        self.collector_dir = Path(collector_dir)
        self.decision_wait = decision_wait
        self.sample_percent = sample_percent
        self.startup_timeout = startup_timeout
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="gymtrace-pipeline-"))
        self.workdir.mkdir(parents=True, exist_ok=True)

        (
            self.jaeger_otlp_grpc_port,
            self.jaeger_otlp_http_port,
            self.jaeger_query_port,
            self.jaeger_query_grpc_port,
            self.jaeger_health_port,
            self.otlp_grpc_port,
            self.otlp_http_port,
            self.collector_health_port,
            self.prometheus_port,
            self.collector_metrics_port,
            self.jaeger_metrics_port,
        ) = free_ports(11)

        env = {k: v for k, v in os.environ.items() if not k.startswith("GYMTRACE_")}
        env.update(
            GYMTRACE_JAEGER_HOST="127.0.0.1",
            GYMTRACE_JAEGER_OTLP_GRPC_PORT=str(self.jaeger_otlp_grpc_port),
            GYMTRACE_JAEGER_OTLP_HTTP_PORT=str(self.jaeger_otlp_http_port),
            GYMTRACE_JAEGER_QUERY_PORT=str(self.jaeger_query_port),
            GYMTRACE_JAEGER_QUERY_GRPC_PORT=str(self.jaeger_query_grpc_port),
            GYMTRACE_JAEGER_HEALTH_PORT=str(self.jaeger_health_port),
            GYMTRACE_COLLECTOR_HOST="127.0.0.1",
            GYMTRACE_OTLP_GRPC_PORT=str(self.otlp_grpc_port),
            GYMTRACE_OTLP_HTTP_PORT=str(self.otlp_http_port),
            GYMTRACE_COLLECTOR_HEALTH_PORT=str(self.collector_health_port),
            GYMTRACE_PROMETHEUS_PORT=str(self.prometheus_port),
            # The processes' own counts (otelcol_*), each on its own port; and each Collector's
            # sending queue on disk in this pipeline's directory (otelcol.upstream.yaml).
            GYMTRACE_COLLECTOR_METRICS_PORT=str(self.collector_metrics_port),
            GYMTRACE_JAEGER_METRICS_PORT=str(self.jaeger_metrics_port),
            GYMTRACE_COLLECTOR_QUEUE_DIR=str(self.workdir / "queue-collector"),
            # Span metrics reach the Prometheus endpoint within a second, not the default 5 s.
            GYMTRACE_SPANMETRICS_FLUSH="1s",
            GYMTRACE_DECISION_WAIT=str(decision_wait),
            GYMTRACE_SAMPLE_PERCENT=str(sample_percent),
        )
        if decision_wait_after_root is not None:
            env["GYMTRACE_DECISION_WAIT_AFTER_ROOT"] = decision_wait_after_root
        env.update(extra_env or {})
        self.env = env

        c = self.collector_dir
        self._jaeger = _Process(
            "jaeger",
            [
                str(self.jaeger_bin),
                "--config",
                str(c / "jaeger.yaml"),
                "--config",
                str(c / f"jaeger.{storage}.yaml"),
            ],
            env,
            self.workdir / "jaeger.log",
            f"http://127.0.0.1:{self.jaeger_health_port}/",
        )
        # The upstream build gets the overlay with what only the v0.161 line has; the Jaeger
        # binary (v0.140 components) the one with its own health check extension.
        overlay = (
            "otelcol.upstream.yaml" if self.collector_bin != self.jaeger_bin else "otelcol.health-jaeger.yaml"
        )
        sampler_cmd = [
            str(self.collector_bin),
            "--config",
            str(c / "otelcol.yaml"),
            "--config",
            str(c / overlay),
        ]
        self.samplers: list[_Process] = []
        self.sampler_ports: list[tuple[int, int, int]] = []
        for i in range(samplers):
            grpc, http, health, metrics, own = free_ports(5)
            self.sampler_ports.append((grpc, http, health))
            sampler_env = dict(
                env,
                GYMTRACE_OTLP_GRPC_PORT=str(grpc),
                GYMTRACE_OTLP_HTTP_PORT=str(http),
                GYMTRACE_COLLECTOR_HEALTH_PORT=str(health),
                GYMTRACE_PROMETHEUS_PORT=str(metrics),
                GYMTRACE_COLLECTOR_METRICS_PORT=str(own),
                GYMTRACE_COLLECTOR_QUEUE_DIR=str(self.workdir / f"queue-sampler-{i}"),
            )
            extra = [a for path in (sampler_extra_configs or {}).get(i, []) for a in ("--config", path)]
            self.samplers.append(
                _Process(
                    f"sampler-{i}",
                    sampler_cmd + extra,
                    sampler_env,
                    self.workdir / f"sampler-{i}.log",
                    f"http://127.0.0.1:{health}/",
                )
            )
        if samplers:
            backends = ", ".join(f"127.0.0.1:{grpc}" for grpc, _, _ in self.sampler_ports)
            self._collector = _Process(
                "front",
                [str(self.collector_bin), "--config", str(c / "otelcol-lb.yaml")],
                dict(env, GYMTRACE_SAMPLERS=f"[{backends}]"),
                self.workdir / "front.log",
                f"http://127.0.0.1:{self.collector_health_port}/",
            )
        else:
            self._collector = _Process(
                "collector",
                sampler_cmd,
                env,
                self.workdir / "collector.log",
                f"http://127.0.0.1:{self.collector_health_port}/",
            )

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> Pipeline:
        for binary in {self.jaeger_bin, self.collector_bin}:
            if not binary.is_file():
                raise PipelineError(f"{binary} does not exist; build it with `collector/build --otelcol`")
        try:
            self._jaeger.start(self.startup_timeout)
            for sampler in self.samplers:
                sampler.start(self.startup_timeout)
            self._collector.start(self.startup_timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the Collector(s) (they flush to Jaeger), then Jaeger. Safe to call twice."""
        self._collector.stop()
        for sampler in self.samplers:
            sampler.stop()
        self._jaeger.stop()

    def __enter__(self) -> Pipeline:
        return self.start()

    def __exit__(self, exc_type: object, *_: object) -> None:
        # Keep the logs of a failed block for the post-mortem; tidy up after a clean one.
        if exc_type is None:
            self.cleanup()
        else:
            self.stop()

    def kill_sampler(self, index: int) -> None:
        """SIGKILL one tail-sampling Collector: every trace it held undecided is lost."""
        self.samplers[index].kill()

    def start_sampler(self, index: int) -> None:
        """Start a killed sampler again on the same ports (what a StatefulSet does with a pod)."""
        self.samplers[index].start(self.startup_timeout)

    def kill_collector(self) -> None:
        """SIGKILL the Collector: everything it buffered (tail sampling, batch, queue) is lost."""
        self._collector.kill()

    def start_collector(self) -> None:
        self._collector.start(self.startup_timeout)

    def restart_collector(self) -> None:
        """Graceful stop (SIGTERM, flushes what it can) and start on the same ports."""
        self._collector.stop()
        self._collector.start(self.startup_timeout)

    def stall_collector(self) -> None:
        """SIGSTOP the Collector: its ports stay open but nothing is read (a hung backend)."""
        self._collector.signal(signal.SIGSTOP)

    def resume_collector(self) -> None:
        self._collector.signal(signal.SIGCONT)

    @property
    def collector_running(self) -> bool:
        return self._collector.running

    def logs(self, lines: int = 40) -> str:
        """Tails of both logs, for assertion messages."""
        return "\n".join(
            f"--- {p.name} ({p.log}):\n{_tail(p.log, lines)}"
            for p in (self._jaeger, *self.samplers, self._collector)
        )

    # -- endpoints -------------------------------------------------------------------------------

    @property
    def otlp_grpc_endpoint(self) -> str:
        """For ``OTLPSpanExporter(endpoint=..., insecure=True)`` (gRPC) or OTEL_EXPORTER_OTLP_ENDPOINT."""
        return f"http://127.0.0.1:{self.otlp_grpc_port}"

    @property
    def otlp_http_endpoint(self) -> str:
        """Base URL for OTLP/HTTP, as in OTEL_EXPORTER_OTLP_ENDPOINT (the SDK adds /v1/traces)."""
        return f"http://127.0.0.1:{self.otlp_http_port}"

    @property
    def otlp_http_traces_url(self) -> str:
        """Full URL for the HTTP ``OTLPSpanExporter(endpoint=...)``, which does not add the path."""
        return f"{self.otlp_http_endpoint}/v1/traces"

    @property
    def query_url(self) -> str:
        return f"http://127.0.0.1:{self.jaeger_query_port}"

    @property
    def metrics_url(self) -> str:
        """The Collector's Prometheus scrape endpoint (span metrics + the applications' metrics)."""
        return f"http://127.0.0.1:{self.prometheus_port}/metrics"

    def metrics(self) -> list[tuple[str, dict[str, str], float]]:
        """One scrape of :attr:`metrics_url` as ``(name, labels, value)`` samples."""
        with urllib.request.urlopen(self.metrics_url, timeout=10) as resp:
            return parse_prometheus(resp.read().decode("utf-8"))

    def own_metrics(self, process: str = "collector") -> list[tuple[str, dict[str, str], float]]:
        """One scrape of the Collector's (or ``"jaeger"``'s) own counts, the ``otelcol_*`` metrics."""
        port = self.collector_metrics_port if process == "collector" else self.jaeger_metrics_port
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            return parse_prometheus(resp.read().decode("utf-8"))

    def spans_accepted(self) -> int:
        """Spans the Collector's OTLP receiver accepted since it started (its own count)."""
        return int(
            sum(
                value
                for name, labels, value in self.own_metrics()
                if name in ("otelcol_receiver_accepted_spans", "otelcol_receiver_accepted_spans_total")
                and labels.get("receiver") == "otlp"
            )
        )

    # -- Jaeger query API (v1) ---------------------------------------------------------------------

    def _get(self, path: str, params: Mapping[str, Any] | None = None) -> Any:
        url = self.query_url + path
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                return json.load(resp)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise PipelineError(f"GET {url}: {exc.code} {exc.read()[:500]!r}", exc.code) from exc

    def services(self) -> list[str]:
        return (self._get("/api/services") or {}).get("data") or []

    def find_traces(
        self,
        service: str,
        tags: Mapping[str, Any] | None = None,
        *,
        operation: str | None = None,
        limit: int = 100,
        lookback: str = "1h",
    ) -> list[Trace]:
        """Search ``/api/traces``. All ``tags`` must match on ONE span (Jaeger's rule)."""
        params: dict[str, Any] = {"service": service, "limit": limit, "lookback": lookback}
        if tags:
            params["tags"] = json.dumps({k: str(v) for k, v in tags.items()})
        if operation:
            params["operation"] = operation
        return (self._get("/api/traces", params) or {}).get("data") or []

    def get_trace(self, trace_id: str | int) -> Trace | None:
        """``/api/traces/{id}``; ``trace_id`` as hex or int. None when Jaeger has no such trace."""
        if isinstance(trace_id, int):
            trace_id = format(trace_id, "032x")
        data = (self._get(f"/api/traces/{trace_id}") or {}).get("data") or []
        return data[0] if data else None

    def wait_for_traces(
        self,
        service: str,
        tags: Mapping[str, Any] | None = None,
        *,
        count: int = 1,
        min_spans: int = 1,
        timeout: float = 30.0,
        interval: float = 0.25,
        predicate: Callable[[list[Trace]], bool] | None = None,
    ) -> list[Trace]:
        """Poll until at least ``count`` matching traces (each with ``min_spans`` spans) are
        stored, or ``predicate(traces)`` holds; raise ``TimeoutError`` with what was seen."""
        deadline = time.monotonic() + timeout
        unavailable = ""  # the store's last "not ready" answer
        while True:
            try:
                found = self.find_traces(service, tags)
            except PipelineError as exc:
                # A store still allocating its shards (OpenSearch on a loaded machine) answers 5xx
                # for a while: not an answer yet, keep polling until the timeout.
                if exc.status is None or exc.status < 500:
                    raise
                found, unavailable = [], str(exc)
            traces = [t for t in found if len(t.get("spans", [])) >= min_spans]
            done = predicate(traces) if predicate else len(traces) >= count
            if done:
                return traces
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"after {timeout:.0f}s Jaeger has {len(traces)} trace(s) for service "
                    f"{service!r} tags {dict(tags or {})} (wanted {count} with >= {min_spans} "
                    f"spans); services: {self.services()}"
                    + (f"; last answer: {unavailable}" if unavailable else "")
                    + f"\n{self.logs(20)}"
                )
            time.sleep(interval)

    def cleanup(self) -> None:
        """Stop and remove the temporary work directory (logs) if this object created it."""
        self.stop()
        if self._own_workdir:
            import shutil

            shutil.rmtree(self.workdir, ignore_errors=True)


# -- helpers over Jaeger's v1 JSON -------------------------------------------------------------------


_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Samples of the Prometheus text exposition format (comments and exemplars skipped)."""
    samples: list[tuple[str, dict[str, str], float]] = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        line = line.split(" # ", 1)[0]  # an OpenMetrics exemplar follows " # "
        if "{" in line:
            name, rest = line.split("{", 1)
            label_text, value_text = rest.rsplit("}", 1)
            labels = {k: bytes(v, "utf-8").decode("unicode_escape") for k, v in _LABEL.findall(label_text)}
        else:
            name, value_text = line.split(" ", 1)
            labels = {}
        samples.append((name, labels, float(value_text.split()[0])))
    return samples


def span_tags(span: Span) -> dict[str, Any]:
    """A span's tags as a dict (Jaeger v1 JSON: a list of {key, type, value})."""
    return {t["key"]: t["value"] for t in span.get("tags", [])}


def span_parent_id(span: Span) -> str | None:
    """The span ID of the CHILD_OF reference (the parent), or None for a root."""
    for ref in span.get("references", []):
        if ref.get("refType") == "CHILD_OF":
            return ref["spanID"]
    return None


def span_links(span: Span) -> list[str]:
    """Span IDs of FOLLOWS_FROM references (OTLP links; their attributes are dropped by v1)."""
    return [r["spanID"] for r in span.get("references", []) if r.get("refType") == "FOLLOWS_FROM"]


def span_service(trace: Trace, span: Span) -> str:
    return trace["processes"][span["processID"]]["serviceName"]


def spans_by_name(trace: Trace) -> dict[str, list[Span]]:
    out: dict[str, list[Span]] = {}
    for s in trace.get("spans", []):
        out.setdefault(s["operationName"], []).append(s)
    return out


def same_trace_id(a: str | int, b: str | int) -> bool:
    """Compare trace IDs across forms: Jaeger prints one with zero high 64 bits as 16 hex digits."""
    return (a if isinstance(a, int) else int(a, 16)) == (b if isinstance(b, int) else int(b, 16))


def only(items: Iterable[Any]) -> Any:
    """The single element of ``items`` (AssertionError otherwise)."""
    items = list(items)
    assert len(items) == 1, f"expected exactly one, got {len(items)}: {items!r}"[:2000]
    return items[0]
