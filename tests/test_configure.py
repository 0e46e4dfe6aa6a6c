"""configure(); private where only the internals show it (the resolved settings, the exporters built).

Precedence, the embedded default, politeness toward an existing provider, IDs.

The global TracerProvider can be set once per process, so each case runs in a fresh interpreter.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from child_process import run_python as run_child  # this module's run_python returns JSON
from child_process import wrote
from gymtrace._model import settings as _settings
from gymtrace._model.spandata import read_otlp_json_lines

_OTEL_VARS = [k for k in os.environ if k.startswith(("OTEL_", "GYMTRACE_"))]


def _resolve(**arguments: Any) -> tuple[list[str], str | None, str, str | None]:
    settings = _settings.resolve(**arguments)
    return list(settings.exporters), settings.endpoint, settings.protocol, settings.file


def run_python(code: str, cwd: Path, **env: str) -> dict[str, Any]:
    out = run_child(code=code, cwd=cwd, env=env)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {"stderr": out.stderr}


SMALL_RUN = """
import json, gymtrace
config = gymtrace.configure({args})
with gymtrace.run(run_id="run-1"), gymtrace.rollout(rollout_id="r-1"), gymtrace.episode():
    with gymtrace.step():
        pass
print(json.dumps({{"exporters": list(config.exporters), "file": config.file, "endpoint": config.endpoint,
                  "protocol": config.protocol, "service": config.service_name, "owns": config.owns_provider,
                  "disabled": config.disabled}}))
"""


def test_embedded_default_writes_otlp_json_lines_and_flushes_on_normal_exit(tmp_path: Path) -> None:
    result = run_python(SMALL_RUN.format(args=""), tmp_path)
    assert result["exporters"] == ["file"]
    assert result["file"] == "gymtrace-traces.jsonl"
    assert result["service"] == "gymtrace"
    spans = read_otlp_json_lines(tmp_path / "gymtrace-traces.jsonl")
    assert sorted(s.name for s in spans) == ["gym.episode", "gym.rollout", "gym.run", "gym.step"]
    assert {s.service for s in spans} == {"gymtrace"}
    step = next(s for s in spans if s.name == "gym.step")
    assert step.attributes["gym.rollout.id"] == "r-1"
    assert step.attributes["gym.episode.attempt"] == 0


def test_service_name_argument_beats_environment(tmp_path: Path) -> None:
    assert (
        run_python(SMALL_RUN.format(args="service_name='arg-svc'"), tmp_path, OTEL_SERVICE_NAME="env-svc")[
            "service"
        ]
        == "arg-svc"
    )
    assert (
        run_python(SMALL_RUN.format(args=""), tmp_path, OTEL_SERVICE_NAME="env-svc")["service"] == "env-svc"
    )


def test_gymtrace_file_variable_and_file_argument(tmp_path: Path) -> None:
    result = run_python(SMALL_RUN.format(args=""), tmp_path, GYMTRACE_FILE=str(tmp_path / "env.jsonl"))
    assert result["file"] == str(tmp_path / "env.jsonl")
    assert wrote(tmp_path / "env.jsonl")
    result = run_python(
        SMALL_RUN.format(args=f"file={str(tmp_path / 'arg.jsonl')!r}"),
        tmp_path,
        GYMTRACE_FILE=str(tmp_path / "env2.jsonl"),
    )
    assert result["file"] == str(tmp_path / "arg.jsonl")
    assert not wrote(tmp_path / "env2.jsonl")


def test_sdk_disabled_sets_nothing_up_and_calls_still_work(tmp_path: Path) -> None:
    result = run_python(SMALL_RUN.format(args=""), tmp_path, OTEL_SDK_DISABLED="true")
    assert result["disabled"] is True
    assert not wrote(tmp_path / "gymtrace-traces.jsonl")


def test_sampler_from_environment_is_honoured(tmp_path: Path) -> None:
    run_python(SMALL_RUN.format(args=""), tmp_path, OTEL_TRACES_SAMPLER="always_off")
    path = tmp_path / "gymtrace-traces.jsonl"
    assert not path.exists() or read_otlp_json_lines(path) == []


def test_otlp_exporters_are_built_for_each_protocol(tmp_path: Path) -> None:
    code = """
    import json, gymtrace
    from gymtrace._sdk.setup import _state
    config = gymtrace.configure(endpoint="http://127.0.0.1:1", protocol={protocol!r})
    # The SDK's own exporter class, with gymtrace's lean encoder in front (gymtrace._otel_private.otlp_seams).
    exporters = [
        [type(p.exporter).__mro__[1].__module__, type(p.exporter).__module__]
        for p in _state.stage.processors()
    ]
    print(json.dumps({{"exporters": exporters, "endpoint": config.endpoint}}))
    """
    grpc = run_python(code.format(protocol="grpc"), tmp_path)
    assert grpc == {
        "exporters": [
            ["opentelemetry.exporter.otlp.proto.grpc.trace_exporter", "gymtrace._otel_private.otlp_seams"]
        ],
        "endpoint": "http://127.0.0.1:1",
    }
    http = run_python(code.format(protocol="http/protobuf"), tmp_path)
    assert http == {
        "exporters": [
            ["opentelemetry.exporter.otlp.proto.http.trace_exporter", "gymtrace._otel_private.otlp_seams"]
        ],
        "endpoint": "http://127.0.0.1:1/v1/traces",
    }


def test_configure_never_replaces_the_applications_provider(tmp_path: Path) -> None:
    code = """
    import json, logging
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    logging.basicConfig()
    app_exporter = InMemorySpanExporter()
    app_provider = TracerProvider()
    app_provider.add_span_processor(SimpleSpanProcessor(app_exporter))
    trace.set_tracer_provider(app_provider)
    import gymtrace
    config = gymtrace.configure(endpoint="http://127.0.0.1:1")
    gymtrace.configure(endpoint="http://127.0.0.1:1")  # twice: the processor is added once
    with gymtrace.rollout(rollout_id="r-1"), gymtrace.episode():
        with trace.get_tracer("app").start_as_current_span("app-span"):
            pass
    spans = {s.name: dict(s.attributes) for s in app_exporter.get_finished_spans()}
    print(json.dumps({"same_provider": trace.get_tracer_provider() is app_provider, "owns": config.owns_provider,
                      "spans": spans, "exporters": list(config.exporters)}))
    """
    result = run_python(code, tmp_path)
    assert result["same_provider"] is True
    assert result["owns"] is False
    assert result["exporters"] == []  # no exporter added to the app's provider
    assert result["spans"]["app-span"]["gym.rollout.id"] == "r-1"
    assert result["spans"]["app-span"]["gym.episode.attempt"] == 0
    assert "app-span" in result["spans"] and "gym.rollout" in result["spans"]
    assert not wrote(tmp_path / "gymtrace-traces.jsonl")


def test_configure_is_idempotent_and_reconfigure_swaps_exporters(tmp_path: Path) -> None:
    code = """
    import json, gymtrace
    a = gymtrace.configure(file="a.jsonl")
    b = gymtrace.configure(file="a.jsonl")
    with gymtrace.step(): pass
    c = gymtrace.configure(file="b.jsonl")
    with gymtrace.tool_call(tool_name="t"): pass
    gymtrace.shutdown()
    print(json.dumps({"same": a is b, "c": c.file}))
    """
    result = run_python(code, tmp_path)
    assert result == {"same": True, "c": "b.jsonl"}
    assert [s.name for s in read_otlp_json_lines(tmp_path / "a.jsonl")] == ["gym.step"]
    assert [s.name for s in read_otlp_json_lines(tmp_path / "b.jsonl")] == ["execute_tool t"]


def test_seeded_random_does_not_repeat_trace_ids_across_workers_or_forks(tmp_path: Path) -> None:
    code = """
    import json, os, random, gymtrace
    gymtrace.configure(file=False)
    def ids():
        random.seed(0)  # what RL workers do
        out = []
        for _ in range(3):
            with gymtrace.rollout() as r:
                out.append(r.trace_id)
        return out
    first = ids()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write, json.dumps(ids()).encode()); os._exit(0)
    os.waitpid(pid, 0)
    child = json.loads(os.read(read, 65536))
    print(json.dumps({"first": first, "again": ids(), "child": child}))
    """
    one = run_python(code, tmp_path)
    two = run_python(code, tmp_path)
    all_ids = one["first"] + one["again"] + one["child"] + two["first"]
    assert len(set(all_ids)) == len(all_ids) == 12


@pytest.mark.parametrize(
    ("kwargs", "env", "expected"),
    [
        ({}, {}, (["file"], None, "grpc", "gymtrace-traces.jsonl")),
        (
            {"endpoint": "http://a:4317"},
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://b:4317"},
            (["otlp"], "http://a:4317", "grpc", None),
        ),
        (
            {},
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://b:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
            (["otlp"], "http://b:4318/v1/traces", "http/protobuf", None),
        ),
        (
            {},
            {
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:4318/v1/traces",
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://b:4318",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            },
            (["otlp"], "http://t:4318/v1/traces", "http/protobuf", None),
        ),
        (
            {"protocol": "grpc"},
            {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://b:4317"},
            (["otlp"], "http://b:4317", "grpc", None),
        ),
        ({}, {"OTEL_TRACES_EXPORTER": "console"}, (["console"], None, "grpc", None)),
        ({}, {"OTEL_TRACES_EXPORTER": "none"}, ([], None, "grpc", None)),
        (
            {"file": "x.jsonl"},
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://b:4317"},
            (["otlp", "file"], "http://b:4317", "grpc", "x.jsonl"),
        ),
        ({"file": False}, {"GYMTRACE_FILE": "y.jsonl"}, ([], None, "grpc", None)),
        (
            {},
            {"GYMTRACE_FILE": "y.jsonl", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://b:4317"},
            (["otlp", "file"], "http://b:4317", "grpc", "y.jsonl"),
        ),
    ],
    ids=[
        "default-file",
        "arg-endpoint-wins",
        "env-http-base",
        "traces-endpoint-wins",
        "arg-protocol-wins",
        "console",
        "none",
        "file-and-otlp",
        "file-false",
        "gymtrace-file",
    ],
)
def test_exporter_precedence_is_argument_then_gymtrace_then_otel_then_default(
    monkeypatch: pytest.MonkeyPatch, kwargs: dict[str, Any], env: dict[str, str], expected: tuple[Any, ...]
) -> None:
    for name in _OTEL_VARS:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    exporters, endpoint, protocol, path = _resolve(
        endpoint=kwargs.get("endpoint"),
        protocol=kwargs.get("protocol"),
        file=kwargs.get("file"),
        console=kwargs.get("console"),
    )
    assert (exporters, endpoint if "otlp" in exporters else None, protocol, path) == expected


def test_bad_protocol_is_a_clear_error_naming_the_argument() -> None:
    import gymtrace

    with pytest.raises(gymtrace.InvalidArgumentError, match="argument 'protocol'"):
        _resolve(endpoint=None, protocol="carrier-pigeon", file=None, console=None)


@pytest.mark.parametrize(
    ("argument", "value"),
    [
        ("file", 3),
        ("file", ""),
        ("file", b"trace.jsonl"),
        ("endpoint", 4317),
        ("service_name", ""),
        ("encoder", "gpu"),
    ],
)
def test_a_bad_configure_argument_is_a_clear_error_naming_it(argument: str, value: object) -> None:
    import gymtrace

    with pytest.raises(gymtrace.InvalidArgumentError, match=f"argument '{argument}'"):
        gymtrace.configure(**{argument: value})  # type: ignore[arg-type]
    assert gymtrace.is_configured() is False
