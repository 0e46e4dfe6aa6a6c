"""The real NeMo Gym stack; it reads the trace directory with the CLI's own reader (private), as the CLI does.

The real NeMo Gym 0.7.0 stack, traced with no code: only ``opentelemetry-instrument``.

One stack per module (``gym env start``: a head server, a resources server, ``simple_agent``, a
``legacy_agent`` environment server and an OpenAI model server, plus Ray) against a fake Responses
API upstream in its own process on loopback (tests/support/fake_responses_upstream.py), every
process writing its own file into one trace directory (``GYMTRACE_FILE=DIR/``). Then ``gym eval
run`` three ways: traced, with a failure routed to the sidecar and a resume pass, and with the
driver not traced at all. Everything is read back with the ``gymtrace`` CLI from the directory.

Runs in the NeMo Gym venv that ``scripts/test`` builds (``.venv-nemo``, Python 3.11, nemo-gym
installed with ``--ignore-requires-python``), where ``GYMTRACE_REQUIRE_NEMO_GYM=1`` makes a NeMo
Gym that cannot import a failure; elsewhere it skips, naming the reason.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# The NeMo Gym servers, a model upstream and Ray: left out of `scripts/test --quick`.
pytestmark = pytest.mark.e2e

# Set by scripts/test, which runs this file in the venv it built for it: there a NeMo Gym that
# cannot import is a failure, not a skip (a skipped flagship check would pass, green).
REQUIRE_NEMO_GYM = "GYMTRACE_REQUIRE_NEMO_GYM"


def _import_or_skip(module: str, reason: str) -> Any:
    if os.environ.get(REQUIRE_NEMO_GYM) == "1":
        try:
            return importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - whatever stops the import fails the leg
            pytest.fail(
                f"{REQUIRE_NEMO_GYM}=1 and {module} does not import in {sys.prefix}:"
                f" {type(exc).__name__}: {exc}",
                pytrace=False,
            )
    return pytest.importorskip(module, reason=reason)


nemo_gym = _import_or_skip("nemo_gym", reason="needs nemo-gym 0.7.0 (scripts/test builds .venv-nemo)")
_import_or_skip("opentelemetry.instrumentation", reason="needs gymtrace[nemo-gym]")

from gymtrace._model.spandata import read_otlp_json_lines  # noqa: E402 - after the skips
from gymtrace._model.tracefiles import trace_files  # noqa: E402 - after the skips
from pipeline import free_ports  # noqa: E402

SUPPORT = Path(__file__).parent / "support"
BIN = Path(sys.executable).parent
PACKAGES = Path(nemo_gym.__file__).resolve().parent.parent
DATA = PACKAGES / "resources_servers" / "example_single_tool_call" / "data" / "example.jsonl"
SERVERS = (
    "resources_servers/example_single_tool_call",
    "resources_servers/example_multi_step",
    "responses_api_agents/simple_agent",
    "environment_servers/legacy_agent",
    "responses_api_models/openai_model",
)
AGENT = "example_single_tool_call_simple_agent"
# The second server the stack is tried on: 4 model calls and 4 tool calls a rollout through
# simple_agent, two of them asked for in one response (the fake upstream's _multi_step).
MULTI_STEP = "example_multi_step"
MULTI_STEP_DATA = PACKAGES / "resources_servers" / MULTI_STEP / "data" / "example.jsonl"
MULTI_STEP_AGENT = "example_multi_step_simple_agent"
START_TIMEOUT_S = 240
EVAL_TIMEOUT_S = 180
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"


@dataclass
class Stack:
    root: Path
    traces: Path
    headers: Path
    fail_flag: Path
    hang_flag: Path
    env: dict[str, str]
    head: str  # the head server override: a free port, not NeMo Gym's fixed default 11000
    agent: str = AGENT
    data: Path = DATA
    # `gym env start`, in a process group of its own: the servers (and the model server).
    servers: subprocess.Popen[bytes] | None = None

    def eval_run(self, name: str, *extra: str, limit: int, traced: bool = True) -> Path:
        """``gym eval run`` over ``limit`` tasks x 2 repeats into ``<root>/<name>/rollouts.jsonl``."""
        command, env, output = self.eval_command(name, *extra, limit=limit, traced=traced)
        done = subprocess.run(
            command, cwd=self.root, env=env, capture_output=True, text=True, timeout=EVAL_TIMEOUT_S
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        self.settle()
        return output

    def eval_command(
        self, name: str, *extra: str, limit: int, traced: bool = True
    ) -> tuple[list[str], dict[str, str], Path]:
        output = self.root / name / "rollouts.jsonl"
        command = [
            str(BIN / "gym"),
            "eval",
            "run",
            "--no-serve",
            "--agent",
            self.agent,
            "--input",
            str(self.data),
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
        return command, env, output

    def settle(self, quiet_s: float = 1.5, timeout_s: float = 30.0) -> None:
        """Wait until the servers' files stop growing: their exporters write on their own
        schedule (``OTEL_BSP_SCHEDULE_DELAY``, short here), after the driver has exited."""
        deadline = time.monotonic() + timeout_s
        last, since = -1, time.monotonic()
        while time.monotonic() < deadline:
            size = sum(p.stat().st_size for p in trace_files(self.traces))
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
    # FastAPI's operation spans kept (the switch), so both settings run: multi_step_stack has the default.
    yield from _stack(tmp_path_factory, "example_single_tool_call", AGENT, DATA, operation_spans=True)


@pytest.fixture(scope="module")
def multi_step_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # GYMTRACE_FILE relative, as the docs show it: NeMo Gym starts each server in its own directory.
    yield from _stack(tmp_path_factory, MULTI_STEP, MULTI_STEP_AGENT, MULTI_STEP_DATA, relative=True)


def _stack(
    tmp_path_factory: pytest.TempPathFactory,
    resources_server: str,
    agent: str,
    data: Path,
    *,
    relative: bool = False,
    root: Path | None = None,
    operation_spans: bool = False,
) -> Iterator[Stack]:
    # A given root: a stack started again over what a killed one left (its traces, its outputs).
    root = root or tmp_path_factory.mktemp("nemo_gym_stack")
    traces, headers, fail_flag = root / "traces", root / "upstream_headers.jsonl", root / "fail"
    hang_flag = root / "hang"
    # One venv for every server: NeMo Gym would otherwise build a uv venv per server.
    for server in SERVERS:
        (root / "venvs" / server).mkdir(parents=True, exist_ok=True)
        if not (root / "venvs" / server / ".venv").is_symlink():
            (root / "venvs" / server / ".venv").symlink_to(sys.prefix)
    port_file = root / "upstream.port"
    port_file.unlink(missing_ok=True)
    upstream = subprocess.Popen(
        [
            sys.executable,
            str(SUPPORT / "fake_responses_upstream.py"),
            str(port_file),
            str(headers),
            str(fail_flag),
            str(hang_flag),
        ],
        start_new_session=True,
    )
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "GYMTRACE_FILE": "traces/" if relative else f"{traces}/",
        "GYMTRACE_HEARTBEAT": "1",  # a killed pass's rollouts read lost 3 s after its last beat
        "OTEL_TRACES_EXPORTER": "none",
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_LOGS_EXPORTER": "none",
        "RAY_USAGE_STATS_ENABLED": "0",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
    }
    for name in (
        "OTEL_SERVICE_NAME",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "GYMTRACE_PROPAGATE_TO",
        "GYMTRACE_NEMO_GYM_OPERATION_SPANS",
        "PYTHONPATH",
    ):
        env.pop(name, None)
    if operation_spans:
        env["GYMTRACE_NEMO_GYM_OPERATION_SPANS"] = "true"
    head = f"++head_server.port={free_ports(1)[0]}"  # below the ephemeral range (see free_ports)
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
                    resources_server,
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
        yield Stack(root, traces, headers, fail_flag, hang_flag, env, head, agent, data, servers)
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
    """The run the last fresh pass over ``output`` opened (each fresh pass is a run of its own)."""
    from gymtrace.integrations.nemo_gym import output_passes

    passes = output_passes(output)
    assert passes is not None, f"no traced pass wrote {output}"
    return passes.run_id


def _run_roots(spans: list[Any], run_id: str | None) -> list[Any]:
    """The rollout spans of the run ``run_id`` (each the root of its trace)."""
    return [
        s
        for s in spans
        if s.attributes.get("gym.kind") == "rollout" and s.attributes.get("gym.run.id") == run_id
    ]


def _services_per_rollout(stack: Stack, run_id: str | None) -> dict[str, set[str]]:
    """Each rollout's services, over every span of the traces its rollout spans are in."""
    spans = read_otlp_json_lines(stack.traces)
    roots = _run_roots(spans, run_id)
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

    # A task's repeats are one group: named by the run and the task, its size NeMo Gym's
    # num_repeats (--num-repeats 2), on every span of its rollouts in every process.
    for rollout in rollouts:
        assert (rollout["group_id"], rollout["group_size"]) == (f"{run_id}/task-{rollout['task_id']}", 2)
    spans = read_otlp_json_lines(stack.traces)
    roots = _run_roots(spans, run_id)
    groups: dict[str, set[tuple[str, int]]] = defaultdict(set)
    for root in roots:
        groups[root.attributes["gym.task.id"]].add(
            (root.attributes["gym.group.id"], root.attributes["gym.group.size"])
        )
    assert {task: len(found) for task, found in groups.items()} == {"0": 1, "1": 1, "2": 1, "3": 1}
    assert len({found.pop() for found in groups.values()}) == 4  # each task a group of its own
    for root in roots:
        inside = [s for s in spans if s.trace_id == root.trace_id and "gym.rollout.id" in s.attributes]
        assert {s.attributes.get("gym.group.id") for s in inside} == {root.attributes["gym.group.id"]}
        assert {"example_single_tool_call", "policy_model"} <= {s.service for s in inside}


def _caller(span: Any, by_id: dict[str, Any]) -> Any:
    """The nearest ancestor of ``span`` in another service: the span that sent its request."""
    parent = by_id[span.parent_id]
    while parent.service == span.service:
        parent = by_id[parent.parent_id]
    return parent


def _gym_parent(span: Any, by_id: dict[str, Any]) -> Any:
    """The nearest ancestor of ``span`` that is a gym span (HTTP spans between are skipped)."""
    parent = by_id.get(span.parent_id) if span.parent_id else None
    while parent is not None and "gym.kind" not in parent.attributes:
        parent = by_id.get(parent.parent_id) if parent.parent_id else None
    return parent


def test_a_multi_step_rollout_reads_agent_invocation_turns_steps_with_tokens_nested_by_the_calls(
    multi_step_stack: Stack,
) -> None:
    stack = multi_step_stack
    output = stack.eval_run("glossary", limit=2)
    run_id = _run_of(stack, output)
    rows = _nemo_rows(output)
    assert len(rows) == 4
    spans = read_otlp_json_lines(stack.traces)
    roots = _run_roots(spans, run_id)
    assert {r.attributes["gym.rollout.id"] for r in roots} == _keys(rows)
    for root in roots:
        trace = [s for s in spans if s.trace_id == root.trace_id]
        by_id = {s.span_id: s for s in trace}
        kinds: dict[str, list[Any]] = defaultdict(list)
        for span in trace:
            kinds[str(span.attributes.get("gym.kind"))].append(span)
        label = root.attributes["gym.rollout.id"]

        # run > rollout > episode > invoke_agent (the agent server's /run) > turn > step
        (episode,) = kinds["episode"]
        (invocation,) = kinds["agent_invocation"]
        assert invocation.name == f"invoke_agent {MULTI_STEP_AGENT}"
        assert invocation.service == MULTI_STEP_AGENT
        assert _gym_parent(invocation, by_id) is episode, label
        turns = sorted(kinds["turn"], key=lambda t: t.attributes["gym.turn.number"])
        steps = sorted(kinds["step"], key=lambda t: t.attributes["gym.step.number"])
        # One turn per model response (NeMo Gym's TrajectoryTurn), its one step numbered alike.
        assert [t.attributes["gym.turn.number"] for t in turns] == [1, 2, 3, 4], label
        assert [t.attributes["gym.step.number"] for t in steps] == [1, 2, 3, 4], label
        for turn, step in zip(turns, steps, strict=True):
            assert _gym_parent(turn, by_id) is invocation
            assert _gym_parent(step, by_id) is turn

        # Each step: its model call, then the tool calls that response asked for (two in step 2).
        tools_per_step = []
        for step in steps:
            (model,) = [m for m in kinds["model_call"] if _gym_parent(m, by_id) is step]
            tools = [t for t in kinds["tool_call"] if _gym_parent(t, by_id) is step]
            tools_per_step.append(len(tools))
            assert model.service == "policy_model"
            assert model.attributes["gen_ai.usage.input_tokens"] == 10
            assert model.attributes["gen_ai.usage.output_tokens"] == 5
            assert model.attributes["gen_ai.usage.cache_read.input_tokens"] == 0
            assert model.attributes["gen_ai.usage.reasoning.output_tokens"] == 0
            assert str(model.attributes["gen_ai.response.id"]).startswith("resp_")
            asked = list(model.attributes.get("gen_ai.response.tool_call_ids", ()))
            assert sorted(t.attributes["gen_ai.tool.call.id"] for t in tools) == sorted(asked)
            assert list(model.attributes["gen_ai.response.finish_reasons"]) == (
                ["tool_calls"] if asked else ["stop"]
            )
            for tool in tools:
                assert tool.service == f"{MULTI_STEP}_resources_server"
            # Where the step's requests went, in the order first sent (what check's missing-server
            # note reads when no request waited long enough for a live marker).
            servers = ["policy_model", *([f"{MULTI_STEP}_resources_server"] if tools else [])]
            assert list(step.attributes["gym.step.servers"]) == servers, label
        assert tools_per_step == [1, 2, 1, 0], label

        # Nesting follows the calls: above every server's span (and its own HTTP server span) is
        # the span of the process that sent the request (its client span where an HTTP client
        # instrumentation makes one; none is installed here, so the caller's span in force): the
        # environment server called the agent, the agent every other server, each model call
        # from its step.
        assert _caller(invocation, by_id).service == "example_multi_step_environment_server"
        for span in [*kinds["model_call"], *kinds["tool_call"], *kinds["seed_session"], *kinds["verify"]]:
            assert _caller(span, by_id).service == MULTI_STEP_AGENT, span.name
        for span in kinds["model_call"]:
            assert _caller(span, by_id).attributes.get("gym.kind") == "step"
        (verify,) = kinds["verify"]
        (seed,) = kinds["seed_session"]
        assert _gym_parent(verify, by_id) is episode and _gym_parent(seed, by_id) is episode

    check = stack.cli("check", str(stack.traces))
    assert check.returncode == 0 and check.stdout.startswith("OK:"), check.stdout + check.stderr
    (first,) = [r for r in roots if r.attributes["gym.rollout.id"] == "0-0"]
    tree = stack.cli("tree", str(stack.traces), "--trace", first.trace_id)
    assert tree.returncode == 0, tree.stderr
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "nemo_gym_multi_step_rollout_tree.txt").write_text(tree.stdout + tree.stderr)


FASTAPI_OPERATION_SPANS = {"fastapi.dependencies", "fastapi.endpoint", "fastapi.serialization"}


def _server_spans_and_operations(stack: Stack, name: str) -> tuple[list[Any], list[Any], dict[str, Any]]:
    """One task's rollouts run on ``stack``: FastAPI's server spans of those traces, its operation
    spans, and every span of those traces by ID."""
    output = stack.eval_run(name, limit=1)
    run_id = _run_of(stack, output)
    spans = read_otlp_json_lines(stack.traces)
    traces = {root.trace_id for root in _run_roots(spans, run_id)}
    assert len(traces) == 2  # one task, two repeats
    inside = [s for s in spans if s.trace_id in traces]
    servers = [s for s in inside if s.name.startswith("POST /") and s.span_kind == "SERVER"]
    operations = [s for s in inside if s.name in FASTAPI_OPERATION_SPANS]
    return servers, operations, {s.span_id: s for s in inside}


def test_fastapi_operation_spans_are_off_under_gymtrace_and_kept_by_the_switch(
    stack: Stack, multi_step_stack: Stack
) -> None:
    # Default (multi_step_stack): every request keeps its server span, FastAPI makes none of its
    # three operation spans, and gymtrace's spans inside a request hang from the request's spans.
    servers, operations, by_id = _server_spans_and_operations(multi_step_stack, "no-operation-spans")
    assert len(servers) >= 8 and operations == []
    invocations = [s for s in by_id.values() if s.attributes.get("gym.kind") == "agent_invocation"]
    assert len(invocations) == 2
    for invocation in invocations:
        assert by_id[invocation.parent_id].service == invocation.service  # no orphan

    # GYMTRACE_NEMO_GYM_OPERATION_SPANS=true (stack): all three inside every request.
    servers, operations, by_id = _server_spans_and_operations(stack, "operation-spans")
    assert {s.name for s in operations} == FASTAPI_OPERATION_SPANS
    endpoints = [s for s in operations if s.name == "fastapi.endpoint"]

    def request_of(span: Any) -> str:
        # gymtrace's middleware may open a phase span between the request and its endpoint.
        while span.span_kind != "SERVER":
            span = by_id[span.parent_id]
        return str(span.span_id)

    assert sorted(request_of(e) for e in endpoints) == sorted(s.span_id for s in servers)  # one a request


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
    # The resume pass's attempt is in the rollout's group too.
    assert {e.attributes.get("gym.group.id") for e in episodes} == {f"{run_id}/task-1"}

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

    # The same output imported beside the live trace: refused by default (its spans are in the
    # live trace already: a second copy would read as every attempt recorded twice), and with
    # --run a separate run, which the checker reads beside the live one without a violation.
    refused = stack.cli("import", "nemo-gym", str(output), "-o", str(stack.root / "imported-0.jsonl"))
    assert refused.returncode != 0 and f"traced live as run {run_id}" in refused.stderr, refused.stderr
    assert not (stack.root / "imported-0.jsonl").exists()
    first, second = stack.root / "imported-1.jsonl", stack.root / "imported-2.jsonl"
    for out in (first, second):
        done = stack.cli("import", "nemo-gym", str(output), "-o", str(out), "--run", "imported")
        assert done.returncode == 0, done.stdout + done.stderr
    assert first.read_bytes() == second.read_bytes()
    check = stack.cli("check", str(first), str(stack.traces))
    assert check.returncode == 0, check.stdout + check.stderr
    (imported_stats,) = stack.json_lines("stats", str(first), "--run", "imported")
    assert imported_stats["mean_reward"] == pytest.approx(final_mean)
    imported = {r["rollout_id"]: r for r in stack.json_lines("rollouts", str(first), "--run", "imported")}
    assert set(imported) == set(rollouts)
    for key in failed:
        assert (imported[key]["outcome"], imported[key]["attempts"]) == ("scored", 2)


@contextlib.contextmanager
def _eval_with_task_3_hung(stack: Stack, name: str) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """An eval whose task 3's first model call hangs in the model server: yields the driver and
    its output once both of task 3's rollouts wait there; on the way out the driver is killed if
    still running and the hang released."""
    stack.hang_flag.touch()
    command, env, output = stack.eval_command(name, "+route_failures_to_sidecar=true", limit=4)
    seen = Path(f"{stack.hang_flag}.seen")
    driver = subprocess.Popen(
        command,
        cwd=stack.root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + EVAL_TIMEOUT_S
        while seen.read_text().count("hung") < 2 if seen.exists() else True:
            assert time.monotonic() < deadline and driver.poll() is None, "task 3 never reached the model"
            time.sleep(0.25)
        yield driver, output
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
        stack.hang_flag.unlink(missing_ok=True)


def test_a_killed_pass_leaves_lost_rollouts_and_its_resume_never_lands_in_the_dead_passs_spans(
    stack: Stack,
) -> None:
    with _eval_with_task_3_hung(stack, "killed") as (driver, output):
        stack.settle()
        run_id = _run_of(stack, output)

        # Hung: `gymtrace live` names the step and the server the rollout waits on. The agent's
        # marker of the request going out reaches the file with its exporter's next batch, which a
        # quiet spell in the files does not wait for (CI saw the driver named): read until it has.
        # Bounded at 90 s: a CI run with four lanes on two cores still read the driver after 30.
        def read_live() -> dict[str, Any]:
            return {r["rollout_id"]: r for r in stack.json_lines("live", str(stack.traces), "--run", run_id)}

        live = read_live()
        until = time.monotonic() + 90
        while time.monotonic() < until and not all(
            live.get(key, {}).get("service") == "policy_model" for key in ("3-0", "3-1")
        ):
            time.sleep(0.5)
            live = read_live()
        assert {"3-0", "3-1"} <= set(live), live
        for key in ("3-0", "3-1"):
            # In flight either way: past live's 60 s without progress (a loaded machine can take
            # that long to get here) the hung rollout reads stalled, which is what it is.
            assert live[key]["state"] in ("running", "stalled"), live[key]
            assert (live[key]["step"], live[key]["service"]) == (1, "policy_model"), live[key]
        os.killpg(driver.pid, signal.SIGKILL)  # as a scheduler's kill or an OOM would
        driver.wait(timeout=30)
    time.sleep(4)  # three heartbeat intervals without a beat: the driver is gone
    stack.settle()

    # The killed pass's in-flight rollouts are lost, in rollouts and stats, never in a mean.
    rollouts = {r["rollout_id"]: r for r in stack.json_lines("rollouts", str(stack.traces), "--run", run_id)}
    assert {k for k, r in rollouts.items() if r["outcome"] == "lost"} == {"3-0", "3-1"}, rollouts
    (stats,) = stack.json_lines("stats", str(stack.traces), "--run", run_id)
    assert stats["lost"] == 2
    check = stack.cli("check", str(stack.traces))
    assert "rollout 3-0: lost" in check.stdout and "rollout 3-1: lost" in check.stdout, check.stdout

    # NeMo Gym's resume re-dispatches them at attempt 0; they keep their run, and the new attempt
    # holds only the new pass's work (the dead pass's went on in the servers after the kill).
    stack.eval_run("killed", "+route_failures_to_sidecar=true", "+resume_from_cache=true", limit=4)
    assert _run_of(stack, output) == run_id
    rollouts = {r["rollout_id"]: r for r in stack.json_lines("rollouts", str(stack.traces), "--run", run_id)}
    assert set(rollouts) == _keys(_nemo_rows(output))
    assert all(r["outcome"] == "scored" for r in rollouts.values()), rollouts
    (stats,) = stack.json_lines("stats", str(stack.traces), "--run", run_id)
    assert stats["mean_reward"] == pytest.approx(_nemo_mean(output)) and "lost" not in stats
    # The killed pass stays visible (issue 43): NeMo Gym re-ran 3-0 and 3-1 at attempt 0, and the
    # killed execution is a lost attempt 0 of each, marked beside the one that scored, counted in
    # stats; the rollouts the killed pass finished lost nothing. check passes, noting the
    # interrupted spans.
    lost = {k: r["lost_attempts"] for k, r in rollouts.items() if r["lost_attempts"]}
    assert lost == {"3-0": [0], "3-1": [0]}, rollouts
    assert {r["attempts"] for r in rollouts.values()} == {1}
    assert stats["lost_attempts"] == 2, stats
    check = stack.cli("check", str(stack.traces))
    assert check.returncode == 0, check.stdout
    spans = read_otlp_json_lines(stack.traces)
    by_id = {s.span_id: s for s in spans}
    for key in ("3-0", "3-1"):
        (root,) = [
            s
            for s in spans
            if s.attributes.get("gym.kind") == "rollout"
            and s.attributes.get("gym.rollout.id") == key
            and s.attributes.get("gym.run.id") == run_id
        ]
        # Opened again by the resume pass, which counted no rows: its group's size is the fresh
        # pass's, from the pass log.
        assert (root.attributes["gym.group.id"], root.attributes["gym.group.size"]) == (f"{run_id}/task-3", 2)
        episodes = [
            s for s in spans if s.trace_id == root.trace_id and s.attributes.get("gym.kind") == "episode"
        ]
        assert len(episodes) == 1, key
        under = defaultdict(int)
        for span in spans:
            if span.trace_id == root.trace_id and _gym_ancestors(span, by_id) & {episodes[0].span_id}:
                under[span.attributes.get("gym.kind")] += 1
        # NeMo Gym recorded one seed, 2 model calls and 1 verify for the rollout: so does the trace.
        assert (under["seed_session"], under["model_call"], under["verify"]) == (1, 2, 1), (key, dict(under))


def test_a_run_whose_every_process_was_killed_reads_its_killed_pass_as_lost_attempts_after_the_resume(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # Issue 43: driver, servers and model server SIGKILLed at once while task 3's rollouts were in
    # a model call (nothing runs an exit handler), then the stack started again and the run resumed.
    first = _stack(tmp_path_factory, "example_single_tool_call", AGENT, DATA)
    stack = next(first)
    try:
        with _eval_with_task_3_hung(stack, "all-killed") as (driver, output):
            time.sleep(1.5)  # a heartbeat of the driver, and the servers' batches of what had ended
            assert stack.servers is not None
            for group in (driver.pid, stack.servers.pid):
                os.killpg(group, signal.SIGKILL)  # as a node lost, or an OOM kill of the job
            driver.wait(timeout=30)
            stack.servers.wait(timeout=30)
    finally:
        first.close()  # the fake upstream provider (not part of the run) stops too
    run_id = _run_of(stack, output)

    second = _stack(tmp_path_factory, "example_single_tool_call", AGENT, DATA, root=stack.root)
    stack = next(second)
    try:
        stack.eval_run("all-killed", "+route_failures_to_sidecar=true", "+resume_from_cache=true", limit=4)
    finally:
        second.close()
    stack.settle()
    assert _run_of(stack, output) == run_id
    rollouts = {r["rollout_id"]: r for r in stack.json_lines("rollouts", str(stack.traces), "--run", run_id)}
    assert set(rollouts) == _keys(_nemo_rows(output))
    assert all(r["outcome"] == "scored" for r in rollouts.values()), rollouts
    # The killed pass is what it was: attempt 0 of 3-0 and 3-1, lost, kept under its number (DESIGN
    # section 8: the attempt is _ng_attempt_index, absent: 0) beside the resumed attempt 0 that scored.
    lost = {k: r["lost_attempts"] for k, r in rollouts.items() if r["lost_attempts"]}
    assert lost == {"3-0": [0], "3-1": [0]}, rollouts
    assert {r["attempts"] for r in rollouts.values()} == {1}
    (stats,) = stack.json_lines("stats", str(stack.traces), "--run", run_id)
    assert stats["lost_attempts"] == 2 and "lost" not in stats, stats
    assert stats["mean_reward"] == pytest.approx(_nemo_mean(output))
    # check: no violation from what the killed processes had exported, a note with their count.
    check = stack.cli("check", str(stack.traces))
    assert check.returncode == 0, check.stdout
    for key in ("3-0", "3-1"):
        assert f"rollout {key}: " in check.stdout and "interrupted span(s)" in check.stdout, check.stdout


def _gym_ancestors(span: Any, by_id: dict[str, Any]) -> set[str]:
    found: set[str] = set()
    parent = by_id.get(span.parent_id) if span.parent_id else None
    while parent is not None:
        found.add(parent.span_id)
        parent = by_id.get(parent.parent_id) if parent.parent_id else None
    return found


def test_a_relative_trace_directory_holds_every_process_however_nemo_gym_starts_them(
    multi_step_stack: Stack,
) -> None:
    stack = multi_step_stack
    assert stack.env["GYMTRACE_FILE"] == "traces/"
    output = stack.eval_run("relative", limit=1)
    services = _services_per_rollout(stack, _run_of(stack, output))
    assert set(services) == _keys(_nemo_rows(output))
    for names in services.values():
        assert {
            "gym-eval-run",
            "example_multi_step_environment_server",
            MULTI_STEP_AGENT,
            f"{MULTI_STEP}_resources_server",
            "policy_model",
        } <= names, names
    # Nothing went where each server was started (NeMo Gym's own directory for it).
    assert not list(PACKAGES.glob("*/*/traces")), list(PACKAGES.glob("*/*/traces"))


def test_a_verify_that_raises_is_a_failed_span_with_the_servers_exception_and_its_traceback(
    multi_step_stack: Stack,
) -> None:
    stack = multi_step_stack
    # Task 1's extraction arguments are not JSON: example_multi_step's verify raises, for both repeats.
    stack.fail_flag.touch()
    try:
        output = stack.eval_run("verify_raises", "+route_failures_to_sidecar=true", limit=2)
    finally:
        stack.fail_flag.unlink()
    run_id = _run_of(stack, output)
    spans = read_otlp_json_lines(stack.traces)
    traces = {root.trace_id for root in _run_roots(spans, run_id)}
    verifies = [s for s in spans if s.attributes.get("gym.kind") == "verify" and s.trace_id in traces]
    assert {s.service for s in verifies} == {f"{MULTI_STEP}_resources_server"}
    failed = [s for s in verifies if s.status == "ERROR"]
    assert len(failed) == 2 and len(verifies) == 4, [(s.service, s.status) for s in verifies]
    for span in failed:
        assert span.attributes.get("error.type") == "JSONDecodeError", span
        (event,) = [e for e in span.events if e.name == "exception"]
        assert event.attributes["exception.type"] == "JSONDecodeError"
        assert event.attributes["exception.message"].startswith("Expecting property name"), event
        # The traceback NeMo Gym printed in the server (Starlette's middleware wraps it in an
        # exception group): its handler's frame, down to json's raise.
        stacktrace = event.attributes["exception.stacktrace"]
        assert "Traceback (most recent call last):" in stacktrace, stacktrace
        assert "example_multi_step/app.py" in stacktrace and "in verify" in stacktrace, stacktrace
        assert stacktrace.rstrip().splitlines()[-1].startswith("json.decoder.JSONDecodeError"), stacktrace


def test_the_servers_alone_trace_nemo_gyms_rollouts_each_pass_a_run_of_its_own(stack: Stack) -> None:
    before = {
        s.span_id for s in read_otlp_json_lines(stack.traces) if s.attributes.get("gym.kind") == "rollout"
    }
    output = stack.eval_run("servers_only", limit=2, traced=False)
    spans = read_otlp_json_lines(stack.traces)
    roots = [s for s in spans if s.attributes.get("gym.kind") == "rollout" and s.span_id not in before]
    assert {s.attributes["gym.rollout.id"] for s in roots} == _keys(_nemo_rows(output))
    assert {s.service for s in roots} == {"example_single_tool_call_environment_server"}
    verifies = [
        s
        for s in spans
        if s.attributes.get("gym.kind") == "verify" and s.trace_id in {r.trace_id for r in roots}
    ]
    assert len(verifies) == 4 and all(s.attributes.get("gym.reward") == 1.0 for s in verifies)

    # The same untraced command again: nothing on the wire names the driver's pass, yet the second
    # pass is a run of its own, not pooled with the first into one "(no run)".
    (first_run,) = {s.attributes.get("gym.run.id") for s in roots}
    assert first_run and first_run.startswith("example_single_tool_call_environment_server-"), first_run
    # Each task's repeats are a group of that run; num_repeats is not on the wire, so no size.
    for root in roots:
        assert root.attributes["gym.group.id"] == f"{first_run}/task-{root.attributes['gym.task.id']}"
        assert "gym.group.size" not in root.attributes
    before |= {s.span_id for s in roots}
    stack.eval_run("servers_only_again", limit=2, traced=False)
    again = [
        s
        for s in read_otlp_json_lines(stack.traces)
        if s.attributes.get("gym.kind") == "rollout" and s.span_id not in before
    ]
    (second_run,) = {s.attributes.get("gym.run.id") for s in again}
    assert second_run and second_run != first_run
    stats = {row["run_id"]: row for row in stack.json_lines("stats", str(stack.traces))}
    for run_id in (first_run, second_run):
        assert (stats[run_id]["scored"], stats[run_id]["mean_reward"]) == (4, 1.0), stats[run_id]
    rollouts = stack.json_lines("rollouts", str(stack.traces), "--run", second_run)
    assert {r["rollout_id"] for r in rollouts} == _keys(_nemo_rows(output))


def test_a_trainer_that_traces_itself_gets_nemo_gyms_rollouts_as_traces_of_their_own_linked_to_its_batch(
    stack: Stack,
) -> None:
    # A stand-in for NeMo RL with its telemetry on (tests/support/stand_in_trainer.py: its span
    # and attribute names on the plain OpenTelemetry SDK) drives NeMo Gym through the entry points
    # NeMo Gym gives trainers, its HTTP client sending the batch span's traceparent; the driver is
    # not traced by gymtrace, the servers are.
    before = {
        s.span_id for s in read_otlp_json_lines(stack.traces) if s.attributes.get("gym.kind") == "rollout"
    }
    spans_out = stack.root / "trainer.ndjson"
    env = {k: v for k, v in stack.env.items() if not k.startswith(("GYMTRACE_", "OTEL_"))}
    head_port = stack.head.rsplit("=", 1)[1]
    trainer_args = ["nemo-gym", head_port, str(spans_out), "2", "2", str(stack.data), stack.agent]
    done = subprocess.run(
        [sys.executable, str(SUPPORT / "stand_in_trainer.py"), *trainer_args],
        cwd=stack.root,
        env=env,
        capture_output=True,
        text=True,
        timeout=EVAL_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(results) == 4, done.stdout[-3000:]
    stack.settle()

    trainer = [json.loads(line) for line in spans_out.read_text().splitlines() if line.strip()]
    (batch,) = [t for t in trainer if t["name"] == "rl.grpo.collect_rollouts"]
    trainer_trace = batch["context"]["trace_id"].removeprefix("0x")
    batch_span = batch["context"]["span_id"].removeprefix("0x")
    spans = read_otlp_json_lines(stack.traces)
    roots = [s for s in spans if s.attributes.get("gym.kind") == "rollout" and s.span_id not in before]
    assert sorted(s.attributes["gym.rollout.id"] for s in roots) == ["0-0", "0-1", "1-0", "1-1"]
    for root in roots:
        assert root.parent_id is None and root.trace_id != trainer_trace, root
        assert [
            (link.trace_id, link.span_id, link.attributes.get("gym.link.relation")) for link in root.links
        ] == [(trainer_trace, batch_span, "caller")]
        run_id = root.attributes["gym.run.id"]
        assert root.attributes["gym.group.id"] == f"{run_id}/task-{root.attributes['gym.task.id']}"
        below = {s.attributes.get("gym.kind") for s in spans if s.trace_id == root.trace_id}
        assert {"episode", "seed_session", "model_call", "verify"} <= below, below
    # The trainer's trace holds no gym span (only the servers' HTTP spans of its requests, if any).
    assert not [s for s in spans if s.trace_id == trainer_trace and "gym.kind" in s.attributes]


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
