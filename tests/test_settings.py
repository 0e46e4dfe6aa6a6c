"""The settings object (``_model.settings``, private: its public side is configure() and reset()).

Precedence, one failure policy for bad values, an atomic configure(), is_configured() and
gymtrace.testing.reset(), and one fork hook for every ID generator."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import gymtrace
from child_process import run_python
from gymtrace._model import errors as _errors
from gymtrace._model import settings as _settings
from gymtrace._model.spandata import read_otlp_json_lines
from gymtrace._scopes import steps as _steps
from gymtrace._sdk import setup as _setup

_VARS = [k for k in os.environ if k.startswith(("OTEL_", "GYMTRACE_"))]


@pytest.fixture(autouse=True)
def _clean_settings(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in _VARS:
        monkeypatch.delenv(name, raising=False)
    gymtrace.testing.reset()
    yield
    gymtrace.testing.reset()


def child_json(code: str, tmp_path: Path, **env: str) -> dict[str, Any]:
    out = run_python(code=code, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    result["stderr"] = out.stderr
    return result


@pytest.mark.parametrize(
    ("name", "raw", "field", "default"),
    [
        ("OTEL_BSP_MAX_QUEUE_SIZE", "lots", "max_queue_size", 8192),
        ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "0", "max_export_batch_size", 512),
        ("OTEL_BSP_SCHEDULE_DELAY", "-5", "schedule_delay", 0.5),
        ("GYMTRACE_FLUSH_TIMEOUT", "soon", "flush_timeout", 5.0),
        ("GYMTRACE_CONTENT_MAX_VALUE_BYTES", "big", "content_max_value_bytes", 16384),
        ("GYMTRACE_SAMPLE_RATIO", "2", "sample_ratio", None),
        ("GYMTRACE_SAMPLE_BY", "episode", "sample_by", "rollout"),
        ("GYMTRACE_TRACE_PER", "episode", "trace_per_run", False),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon", "protocol", "grpc"),
        ("GYMTRACE_ENCODER", "gpu", "encoder", "auto"),
        ("GYMTRACE_FILE_COMPRESS", "lz4", "file_compress", "none"),
        ("GYMTRACE_FILE_ROTATE_MB", "-1", "file_rotate_bytes", 256 << 20),
        ("GYMTRACE_BACKEND", "wandb", "backend", "otlp"),
        ("GYMTRACE_STEP_POLICY", "sometimes", "step_policy", "all"),
        ("GYMTRACE_STEP_FIRST", "-1", "step_first", 1),
        ("GYMTRACE_STEP_SLOWEST", "many", "step_slowest", 1),
        ("GYMTRACE_STEP_EPISODE_SHARE", "1.5", "step_episode_share", 0.0),
        ("GYMTRACE_HEARTBEAT", "-1", "heartbeat", 10.0),
        ("GYMTRACE_PARENT", '{"file": "x.jsonl"}', "parent", None),
    ],
)
def test_a_bad_environment_value_warns_naming_it_and_uses_the_default(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    name: str,
    raw: str,
    field: str,
    default: Any,
) -> None:
    monkeypatch.setenv(name, raw)
    with caplog.at_level(logging.WARNING, logger="gymtrace"):
        settings = _settings.reload()
    assert getattr(settings, field) == default
    assert name in caplog.text and repr(raw) in caplog.text


def test_a_bad_environment_value_raises_in_strict_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GYMTRACE_STRICT", "true")
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "lots")
    with pytest.raises(gymtrace.InvalidArgumentError, match="OTEL_BSP_MAX_QUEUE_SIZE"):
        _settings.reload()


def test_good_environment_values_are_read_once_into_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "100")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "250")
    monkeypatch.setenv("GYMTRACE_TRACE_PER", "RUN")
    monkeypatch.setenv("GYMTRACE_SAMPLE_RATIO", "0.25")
    monkeypatch.setenv("GYMTRACE_SAMPLE_BY", "task")
    settings = _settings.reload()
    assert (settings.max_queue_size, settings.schedule_delay, settings.trace_per_run) == (100, 0.25, True)
    assert (settings.sample_ratio, settings.sample_by) == (0.25, "task")
    assert _settings.active is settings
    monkeypatch.setenv("GYMTRACE_FILE_COMPRESS", "GZip")
    monkeypatch.setenv("GYMTRACE_FILE_ROTATE_MB", "0.5")
    settings = _settings.reload()
    assert (settings.file_compress, settings.file_rotate_bytes) == ("gzip", 1 << 19)
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "7")
    assert _settings.active.max_queue_size == 100  # not read again until configure() or reload()


def test_a_code_override_beats_the_environment_until_it_is_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GYMTRACE_TRACE_PER", "run")
    _settings.reload()
    _settings.override(trace_per_run=False)
    assert _settings.active.trace_per_run is False
    assert _settings.reload().trace_per_run is False  # the override outlives a new reading
    _settings.override(trace_per_run=None)
    assert _settings.active.trace_per_run is True


def test_configure_that_raises_changes_nothing() -> None:
    with pytest.raises(gymtrace.InvalidArgumentError, match="argument 'protocol'"):
        gymtrace.configure(strict=True, protocol="bogus", capture_content="SPAN_ONLY", trace_per="run")
    assert _errors.is_strict() is False
    assert _settings.active.strict is False
    assert _settings.active.trace_per_run is False
    assert _settings.active.capture_content == "NO_CONTENT"
    assert gymtrace.is_configured() is False


def test_a_step_policy_is_chosen_only_by_configure_or_a_valid_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Chosen, it applies where an integration has a default of its own (TraceEnv aggregates).
    assert _steps.chosen_policy() is None
    monkeypatch.setenv("GYMTRACE_STEP_POLICY", "sometimes")
    gymtrace.testing.reset()
    assert _steps.chosen_policy() is None  # a bad value chooses nothing (and was reported)
    monkeypatch.setenv("GYMTRACE_STEP_POLICY", "all")
    gymtrace.testing.reset()
    assert _steps.chosen_policy() == gymtrace.StepPolicy("all")
    monkeypatch.delenv("GYMTRACE_STEP_POLICY")
    gymtrace.testing.reset()
    assert _steps.chosen_policy() is None
    gymtrace.configure(service_name="chooses", file=False, step_policy="aggregate")
    assert _steps.chosen_policy() == gymtrace.StepPolicy("aggregate")
    gymtrace.configure(service_name="chooses", file=False)  # saying nothing keeps the choice
    assert _steps.chosen_policy() == gymtrace.StepPolicy("aggregate")


def test_configure_with_a_bad_content_argument_leaves_strict_mode_off() -> None:
    with pytest.raises(gymtrace.InvalidArgumentError, match="capture_content"):
        gymtrace.configure(strict=True, capture_content="sometimes")
    assert _errors.is_strict() is False


def test_configure_in_strict_mode_rejects_a_bad_environment_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GYMTRACE_FLUSH_TIMEOUT", "soon")
    with pytest.raises(gymtrace.InvalidArgumentError, match="GYMTRACE_FLUSH_TIMEOUT"):
        gymtrace.configure(strict=True)
    assert _errors.is_strict() is False


def test_is_configured_and_reset_forget_the_configuration_and_code_settings(tmp_path: Path) -> None:
    code = """
    import json, gymtrace
    from gymtrace._model import errors as _errors
    from gymtrace._model import settings as _settings
    from gymtrace._content import current_policy
    before = gymtrace.is_configured()
    gymtrace.configure(strict=True, trace_per="run", capture_content="SPAN_ONLY",
                       redact_content=lambda name, value: value, file="first.jsonl")
    during = [gymtrace.is_configured(), _errors.is_strict(), _settings.active.trace_per_run,
              _settings.active.capture_content, current_policy().redact is not None]
    gymtrace.testing.reset()
    after = [gymtrace.is_configured(), _errors.is_strict(), _settings.active.trace_per_run,
             _settings.active.capture_content, current_policy().redact is not None]
    config = gymtrace.configure(file="second.jsonl")
    with gymtrace.rollout(rollout_id="r-1"), gymtrace.episode():
        pass
    gymtrace.force_flush()
    print(json.dumps({"before": before, "during": during, "after": after, "file": config.file}))
    """
    result = child_json(code, tmp_path)
    assert result["before"] is False
    assert result["during"] == [True, True, True, "SPAN_ONLY", True]
    assert result["after"] == [False, False, False, "NO_CONTENT", False]
    assert result["file"] == "second.jsonl"
    assert [s.name for s in read_otlp_json_lines(tmp_path / "second.jsonl")] == ["gym.episode", "gym.rollout"]


def test_a_second_sampler_is_refused_with_a_warning_naming_the_one_that_stays(tmp_path: Path) -> None:
    code = """
    import json, logging, gymtrace
    from gymtrace.sampling import RolloutSampler
    logging.basicConfig(level=logging.WARNING)
    gymtrace.configure(sampler=RolloutSampler(1.0), file="t.jsonl")
    gymtrace.configure(sampler=RolloutSampler(0.0), file="t.jsonl")
    from opentelemetry import trace
    with gymtrace.rollout(rollout_id="r-1"), gymtrace.episode():
        pass
    gymtrace.force_flush()
    print(json.dumps({"sampler": trace.get_tracer_provider().sampler.get_description()}))
    """
    result = child_json(code, tmp_path)
    assert result["sampler"] == "RolloutSampler{ratio=1.0, by=rollout}"
    assert "sampler of a TracerProvider cannot change" in result["stderr"]
    assert "RolloutSampler{ratio=0.0, by=rollout}" in result["stderr"]
    assert "RolloutSampler{ratio=1.0, by=rollout} stays" in result["stderr"]
    assert [s.name for s in read_otlp_json_lines(tmp_path / "t.jsonl")] == [
        "gym.episode",
        "gym.rollout",
    ]  # kept: the first sampler decides


def test_id_generators_share_one_fork_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    registered: list[Any] = []
    monkeypatch.setattr(os, "register_at_fork", lambda **hooks: registered.append(hooks))
    generators = [_setup.make_id_generator() for _ in range(5)]
    assert registered == []
    assert all(g in _setup._GENERATORS for g in generators)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_draws_other_ids_than_its_parent() -> None:
    generator = _setup.make_id_generator()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its next trace ID and leave without running pytest's exit
        os.write(write, str(generator.generate_trace_id()).encode())
        os._exit(0)
    os.close(write)
    child_id = int(os.read(read, 100).decode())
    os.close(read)
    os.waitpid(pid, 0)
    assert child_id != generator.generate_trace_id()


def test_heartbeat_and_step_metrics_resolve_argument_then_variable_then_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert (_settings.active.heartbeat, _settings.active.step_metrics) == (10.0, False)
    monkeypatch.setenv("GYMTRACE_HEARTBEAT", "0.5")
    monkeypatch.setenv("GYMTRACE_STEP_METRICS", "true")
    settings = _settings.reload()
    assert (settings.heartbeat, settings.step_metrics) == (0.5, True)
    gymtrace.configure(file=False, heartbeat=0, step_metrics=False)
    assert (_settings.active.heartbeat, _settings.active.step_metrics) == (0.0, False)
    with pytest.raises(gymtrace.InvalidArgumentError, match="'heartbeat'"):
        gymtrace.configure(file=False, heartbeat=-1)
    with pytest.raises(gymtrace.InvalidArgumentError, match="'step_metrics'"):
        gymtrace.configure(file=False, step_metrics="yes")  # type: ignore[arg-type]


def test_propagate_to_and_a_trace_directory_are_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GYMTRACE_PROPAGATE_TO", " *.Gym.Internal, 10.0.0.7:8000 ,")
    monkeypatch.setenv("GYMTRACE_FILE", f"{tmp_path}/traces/")
    settings = _settings.reload()
    assert settings.propagate_to == ("*.gym.internal", "10.0.0.7:8000")
    # A directory: this process's own file in it, never the directory itself.
    assert settings.file is not None and Path(settings.file).parent == tmp_path / "traces"
    assert Path(settings.file).name.endswith(f"-{os.getpid()}.jsonl")
    monkeypatch.delenv("GYMTRACE_PROPAGATE_TO")
    assert _settings.reload().propagate_to == ()


def test_a_trace_directory_given_to_configure_is_one_file_per_process_as_in_the_environment(
    tmp_path: Path,
) -> None:
    settings = _settings.resolve(file=f"{tmp_path}/traces/")
    assert settings.file is not None and Path(settings.file).parent == tmp_path / "traces"
    assert Path(settings.file).name.endswith(f"-{os.getpid()}.jsonl")


def test_a_backend_sends_otlp_http_protobuf_to_the_base_url_whatever_the_protocol_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # MLflow takes OTLP over HTTP only and Phoenix's HTTP protobuf only: the backend decides.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:5000")
    monkeypatch.setenv("GYMTRACE_BACKEND", "mlflow")
    settings = _settings.resolve()
    assert (settings.backend, settings.experiment) == ("mlflow", "gymtrace")
    assert settings.protocol == "http/protobuf"
    assert settings.endpoint == "http://127.0.0.1:5000/v1/traces"
    assert "otlp" in settings.exporters
    monkeypatch.setenv("GYMTRACE_EXPERIMENT", "rl")
    assert _settings.resolve(backend="phoenix").experiment == "rl"
    assert _settings.resolve(backend="phoenix", experiment="other").experiment == "other"
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT")
    # No endpoint: still the OTLP exporter, to the server's own default port (_export_backends).
    assert "otlp" in _settings.resolve(backend="phoenix").exporters
    with pytest.raises(gymtrace.InvalidArgumentError, match="'backend' must be one of"):
        _settings.resolve(backend="jaeger")
    with pytest.raises(gymtrace.InvalidArgumentError, match="'experiment' must be a non-empty string"):
        _settings.resolve(experiment=" ")


def test_the_secret_never_appears_in_the_settings_repr(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GYMTRACE_IDENTITY_SECRET", "test-secret-7f1c")
    _settings.reload()
    assert _settings.active.trust_identity == "signed"  # a secret alone switches signing on
    assert "test-secret-7f1c" not in repr(_settings.active)
