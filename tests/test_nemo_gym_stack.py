"""The real NeMo Gym 0.7.0 stack, traced with no code: only ``opentelemetry-instrument``.

One stack per module (``gym env start``: a head server, a resources server, ``simple_agent``, a
``legacy_agent`` environment server and an OpenAI model server, plus Ray) against a fake Responses
API upstream in its own process on loopback (tests/support/fake_responses_upstream.py), every
process writing its own file into one trace directory (``GYMTRACE_FILE=DIR/``). Then ``gym eval
run`` three ways: traced, with a failure routed to the sidecar and a resume pass, and with the
driver not traced at all. Everything is read back with the ``gymtrace`` CLI from the directory.

Runs in the NeMo Gym venv that ``scripts/test`` builds (``.venv-nemo``, Python 3.11, nemo-gym
installed with ``--ignore-requires-python``); elsewhere it skips, naming the reason.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

nemo_gym = pytest.importorskip("nemo_gym", reason="needs nemo-gym 0.7.0 (scripts/test builds .venv-nemo)")
pytest.importorskip("opentelemetry.instrumentation", reason="needs gymtrace[nemo-gym]")

from gymtrace._spandata import read_otlp_json_lines  # noqa: E402 - after the skips

SUPPORT = Path(__file__).parent / "support"
BIN = Path(sys.executable).parent
PACKAGES = Path(nemo_gym.__file__).resolve().parent.parent
DATA = PACKAGES / "resources_servers" / "example_single_tool_call" / "data" / "example.jsonl"
SERVERS = (
    "resources_servers/example_single_tool_call",
    "responses_api_agents/simple_agent",
    "environment_servers/legacy_agent",
    "responses_api_models/openai_model",
)
AGENT = "example_single_tool_call_simple_agent"
START_TIMEOUT_S = 240
EVAL_TIMEOUT_S = 180
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"


@dataclass
class Stack:
    root: Path
    traces: Path
    headers: Path
    fail_flag: Path
    env: dict[str, str]
    head: str  # the head server override: a free port, not NeMo Gym's fixed default 11000

    def eval_run(self, name: str, *extra: str, limit: int, traced: bool = True) -> Path:
        """``gym eval run`` over ``limit`` tasks x 2 repeats into ``<root>/<name>/rollouts.jsonl``."""
        output = self.root / name / "rollouts.jsonl"
        command = [
            str(BIN / "gym"),
            "eval",
            "run",
            "--no-serve",
            "--agent",
            AGENT,
            "--input",
            str(DATA),
            "--limit",
            str(limit),
            "--num-repeats",
            "2",
            "--output",
            str(output),
            self.head,
            *extra,
        ]
        if traced:
            command = [str(BIN / "opentelemetry-instrument"), *command]
            env = self.env
        else:
            env = {k: v for k, v in self.env.items() if not k.startswith(("GYMTRACE_", "OTEL_"))}
        done = subprocess.run(
            command, cwd=self.root, env=env, capture_output=True, text=True, timeout=EVAL_TIMEOUT_S
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        self.settle()
        return output

    def settle(self, quiet_s: float = 1.5, timeout_s: float = 30.0) -> None:
        """Wait until the servers' files stop growing: their exporters write on their own
        schedule (``OTEL_BSP_SCHEDULE_DELAY``, short here), after the driver has exited."""
        deadline = time.monotonic() + timeout_s
        last, since = -1, time.monotonic()
        while time.monotonic() < deadline:
            size = sum(p.stat().st_size for p in self.traces.glob("*.jsonl"))
            if size != last:
                last, since = size, time.monotonic()
            elif time.monotonic() - since >= quiet_s:
                return
            time.sleep(0.25)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gymtrace", *args], capture_output=True, text=True, timeout=120
        )

    def json_lines(self, *args: str) -> list[dict[str, Any]]:
        done = self.cli(*args, "--json")
        assert done.returncode == 0, done.stderr
        return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def _wait_for(path: Path, text: str, process: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        if process.poll() is not None:
            break
        time.sleep(0.5)
    log = path.read_text(errors="replace") if path.exists() else ""
    raise AssertionError(f"{text!r} not seen in {timeout}s (exit {process.poll()}):\n{log[-4000:]}")


def _stop(process: subprocess.Popen[Any]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("nemo_gym_stack")
    traces, headers, fail_flag = root / "traces", root / "upstream_headers.jsonl", root / "fail"
    # One venv for every server: NeMo Gym would otherwise build a uv venv per server.
    for server in SERVERS:
        (root / "venvs" / server).mkdir(parents=True)
        (root / "venvs" / server / ".venv").symlink_to(sys.prefix)
    port_file = root / "upstream.port"
    upstream = subprocess.Popen(
        [
            sys.executable,
            str(SUPPORT / "fake_responses_upstream.py"),
            str(port_file),
            str(headers),
            str(fail_flag),
        ],
        start_new_session=True,
    )
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "GYMTRACE_FILE": f"{traces}/",
        "OTEL_TRACES_EXPORTER": "none",
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_LOGS_EXPORTER": "none",
        "RAY_USAGE_STATS_ENABLED": "0",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
    }
    for name in ("OTEL_SERVICE_NAME", "OTEL_EXPORTER_OTLP_ENDPOINT", "GYMTRACE_PROPAGATE_TO", "PYTHONPATH"):
        env.pop(name, None)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        head = f"++head_server.port={probe.getsockname()[1]}"
    servers = None
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        port = port_file.read_text().strip()
        log = root / "env_start.log"
        with open(log, "wb") as out:
            servers = subprocess.Popen(
                [
                    str(BIN / "opentelemetry-instrument"),
                    str(BIN / "gym"),
                    "env",
                    "start",
                    "--resources-server",
                    "example_single_tool_call",
                    "--model-type",
                    "openai_model",
                    "--model",
                    "fake-model",
                    "--model-url",
                    f"http://127.0.0.1:{port}/v1",
                    "--model-api-key",
                    "not-a-key",
                    "+skip_venv_if_present=true",
                    f"+uv_venv_dir={root / 'venvs'}",
                    head,
                ],
                cwd=root,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        _wait_for(log, "All 4 / 4 servers ready", servers, START_TIMEOUT_S)
        yield Stack(root, traces, headers, fail_flag, env, head)
    finally:
        if servers is not None:
            _stop(servers)
        _stop(upstream)


def _nemo_rows(output: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in output.read_text().splitlines() if line.strip()]


def _nemo_mean(output: Path) -> float:
    """The mean reward NeMo Gym itself reports for ``output`` (its aggregate metrics file)."""
    metrics = json.loads(output.with_name(output.stem + "_aggregate_metrics.json").read_text())
    (agent,) = [m for m in metrics if m.get("agent_ref", {}).get("name") == AGENT]
    return float(agent["agent_metrics"]["mean/reward"])


def _keys(rows: list[dict[str, Any]]) -> set[str]:
    return {f"{r['_ng_task_index']}-{r['_ng_rollout_index']}" for r in rows}


def _run_of(stack: Stack, output: Path) -> str:
    from gymtrace.integrations.nemo_gym import run_id_for_output

    return run_id_for_output(output)


def _services_per_rollout(stack: Stack, run_id: str | None) -> dict[str, set[str]]:
    """Each rollout's services, over every span of the traces its rollout spans are in."""
    spans = read_otlp_json_lines(stack.traces)
    roots = [
        s
        for s in spans
        if s.attributes.get("gym.kind") == "rollout" and s.attributes.get("gym.run.id") == run_id
    ]
    traces: dict[str, set[str]] = defaultdict(set)
    for root in roots:
        traces[root.attributes["gym.rollout.id"]].add(root.trace_id)
    services: dict[str, set[str]] = {}
    for rollout_id, trace_ids in traces.items():
        assert len(trace_ids) == 1, f"rollout {rollout_id} is in {len(trace_ids)} traces"
        services[rollout_id] = {s.service for s in spans if s.trace_id in trace_ids}
    return services


def test_a_traced_run_is_nemo_gyms_rollouts_one_trace_each_across_services(stack: Stack) -> None:
    output = stack.eval_run("clean", limit=4)
    run_id = _run_of(stack, output)
    rows = _nemo_rows(output)
    assert len(rows) == 8

    rollouts = stack.json_lines("rollouts", str(stack.traces), "--run", run_id)
    assert {r["rollout_id"] for r in rollouts} == _keys(rows)
    by_key = {f"{r['_ng_task_index']}-{r['_ng_rollout_index']}": r["reward"] for r in rows}
    for rollout in rollouts:
        assert (rollout["outcome"], rollout["attempts"]) == ("scored", 1), rollout
        assert rollout["reward"] == by_key[rollout["rollout_id"]]
        assert rollout["task_id"] == rollout["rollout_id"].split("-")[0]

    (stats,) = stack.json_lines("stats", str(stack.traces), "--run", run_id)
    assert stats["mean_reward"] == pytest.approx(_nemo_mean(output))
    assert stats["inputs"] == 8

    services = _services_per_rollout(stack, run_id)
    assert set(services) == _keys(rows)
    for rollout_id, names in services.items():
        # The driver, the resources server (seed, tool, verify) and the model server at least.
        assert {"gym-eval-run", "example_single_tool_call", "policy_model"} <= names, (rollout_id, names)


def test_a_failure_then_a_resume_pass_reads_as_a_second_attempt_of_the_same_rollout(stack: Stack) -> None:
    stack.fail_flag.touch()  # the upstream answers 400 for task 1 ("going out ...") until removed
    output = stack.eval_run("resumed", "+route_failures_to_sidecar=true", limit=3)
    first_mean = _nemo_mean(output)
    failed = {
        f"{r['_ng_task_index']}-{r['_ng_rollout_index']}"
        for r in _nemo_rows(output.with_name("rollouts_failures.jsonl"))
    }
    assert failed == {"1-0", "1-1"}
    stack.fail_flag.unlink()
    stack.eval_run("resumed", "+route_failures_to_sidecar=true", "+resume_from_cache=true", limit=3)
    final_mean = _nemo_mean(output)
    assert final_mean != first_mean  # the resume pass changed NeMo Gym's answer; the trace follows

    run_id = _run_of(stack, output)
    rollouts = {r["rollout_id"]: r for r in stack.json_lines("rollouts", str(stack.traces), "--run", run_id)}
    assert set(rollouts) == _keys(_nemo_rows(output))
    for key in failed:
        assert (rollouts[key]["outcome"], rollouts[key]["attempts"], rollouts[key]["reward"]) == (
            "scored",
            2,
            1,
        )
    (stats,) = stack.json_lines("stats", str(stack.traces), "--run", run_id)
    assert stats["mean_reward"] == pytest.approx(final_mean)

    # Both attempts in one trace, the second linked (retry) to the first.
    spans = read_otlp_json_lines(stack.traces)
    episodes = [
        s
        for s in spans
        if s.attributes.get("gym.kind") == "episode"
        and s.attributes.get("gym.run.id") == run_id
        and s.attributes.get("gym.rollout.id") == "1-0"
    ]
    by_attempt = {e.attributes["gym.episode.attempt"]: e for e in episodes}
    assert sorted(by_attempt) == [0, 1]
    assert by_attempt[0].attributes["gym.episode.outcome"] == "failed"
    assert by_attempt[0].trace_id == by_attempt[1].trace_id
    assert [(link.span_id, link.attributes.get("gym.link.relation")) for link in by_attempt[1].links] == [
        (by_attempt[0].span_id, "retry")
    ]

    # The model call that failed upstream is a failed span in the failed attempt.
    failed_calls = [
        s
        for s in spans
        if s.attributes.get("gym.kind") == "model_call"
        and s.attributes.get("gym.run.id") == run_id
        and s.attributes.get("gym.rollout.id") == "1-0"
    ]
    assert {(s.attributes["gym.episode.attempt"], s.status) for s in failed_calls} >= {
        (0, "ERROR"),
        (1, "UNSET"),
    }

    tree = stack.cli("tree", str(stack.traces), "--rollout", "1-0")
    assert tree.returncode == 0, tree.stderr
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "nemo_gym_resumed_rollout_tree.txt").write_text(tree.stdout)

    # The same output imported afterwards (issue 28): checked traces whose stats are NeMo Gym's,
    # the resumed rollout two attempts in the trace the live run used, the same IDs every time.
    first, second = stack.root / "imported-1.jsonl", stack.root / "imported-2.jsonl"
    for out in (first, second):
        done = stack.cli("import", "nemo-gym", str(output), "-o", str(out))
        assert done.returncode == 0, done.stdout + done.stderr
    assert first.read_bytes() == second.read_bytes()
    check = stack.cli("check", str(first))
    assert check.returncode == 0, check.stdout + check.stderr
    (imported_stats,) = stack.json_lines("stats", str(first), "--run", run_id)
    assert imported_stats["mean_reward"] == pytest.approx(final_mean)
    imported = {r["rollout_id"]: r for r in stack.json_lines("rollouts", str(first), "--run", run_id)}
    assert set(imported) == set(rollouts)
    for key in failed:
        assert (imported[key]["outcome"], imported[key]["attempts"]) == ("scored", 2)
        assert imported[key]["trace_id"] == rollouts[key]["trace_id"]


def test_the_servers_alone_still_trace_nemo_gyms_rollouts(stack: Stack) -> None:
    before = {
        s.span_id for s in read_otlp_json_lines(stack.traces) if s.attributes.get("gym.kind") == "rollout"
    }
    output = stack.eval_run("servers_only", limit=2, traced=False)
    spans = read_otlp_json_lines(stack.traces)
    roots = [s for s in spans if s.attributes.get("gym.kind") == "rollout" and s.span_id not in before]
    assert {s.attributes["gym.rollout.id"] for s in roots} == _keys(_nemo_rows(output))
    assert all("gym.run.id" not in s.attributes for s in roots)
    assert {s.service for s in roots} == {"example_single_tool_call_environment_server"}
    verifies = [
        s
        for s in spans
        if s.attributes.get("gym.kind") == "verify" and s.trace_id in {r.trace_id for r in roots}
    ]
    assert len(verifies) == 4 and all(s.attributes.get("gym.reward") == 1.0 for s in verifies)


def test_the_whole_trace_directory_passes_check_and_no_upstream_request_carried_gym_identity(
    stack: Stack,
) -> None:
    stack.eval_run("last", limit=1)  # so this test stands alone too
    check = stack.cli("check", str(stack.traces))
    assert check.returncode == 0 and check.stdout.startswith("OK:"), check.stdout + check.stderr

    requests = [json.loads(line) for line in stack.headers.read_text().splitlines()]
    assert requests, "the upstream saw no request"
    for request in requests:
        headers = {k.lower(): v for k, v in request["headers"].items()}
        assert "gym." not in headers.get("baggage", ""), headers
        assert not [k for k in headers if k.startswith("x-nemo-gym")], headers
    # The trace context does go upstream: only the identity stays inside the gym.
    assert all("traceparent" in {k.lower() for k in r["headers"]} for r in requests)


def test_ray_helpers_write_no_trace_files(stack: Stack) -> None:
    files = sorted(p.name for p in stack.traces.iterdir())
    assert files and not [
        f for f in files if "ray" in f.lower() or f.startswith(("default_worker", "python"))
    ], files
    servers = {f.rsplit("-", 1)[0] for f in files}
    assert {"gym-env-start", "example_single_tool_call", "policy_model"} <= servers, files
