"""gymtrace under ``opentelemetry-instrument``: a configurator and instrumentors, no code.

Example (the NeMo Gym stack, traced with settings from the environment only)::

    pip install 'gymtrace[nemo-gym]'
    export GYMTRACE_FILE=traces/                 # or OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4317
    opentelemetry-instrument gym env start --resources-server example_single_tool_call ...
    opentelemetry-instrument gym eval run --no-serve --agent ... --output out/rollouts.jsonl

``opentelemetry-instrument`` loads the configurator named ``gymtrace`` (entry point group
``opentelemetry_configurator``; ``OTEL_PYTHON_CONFIGURATOR=gymtrace`` picks it when several are
installed), which calls :func:`gymtrace.configure` from the ``OTEL_*`` / ``GYMTRACE_*`` variables,
and every instrumentor (group ``opentelemetry_instrumentor``), each active only where its library
is installed. Processes that are not a NeMo Gym server or command and belong to Ray (its workers,
dashboard, monitors, which inherit the environment) are left alone: nothing is configured or
patched there, so they start as fast as without gymtrace.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Collection
from typing import Any

try:
    from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "gymtrace.integrations.autoinstrument needs opentelemetry-instrumentation: pip install 'gymtrace[nemo-gym]'"
    ) from exc

import gymtrace
from gymtrace.integrations import nemo_gym

__all__ = ["GymTraceConfigurator", "NeMoGymInstrumentor", "absolute_trace_file", "is_helper_process"]


def is_helper_process(argv: list[str] | None = None) -> bool:
    """A process gymtrace leaves alone under ``opentelemetry-instrument``: one of Ray's own (a worker,
    the dashboard, a monitor), which inherits the instrumented command's environment."""
    argv = sys.argv if argv is None else argv
    program = argv[0] if argv else ""
    parts = program.replace("\\", "/").split("/")
    return program.startswith("ray::") or ("ray" in parts[:-1] and "site-packages" in parts)


def absolute_trace_file(environ: Any = None) -> str:
    """``GYMTRACE_FILE`` made absolute against this process's working directory, and written back
    into ``environ`` (default ``os.environ``), so every process this command starts writes where
    the command was started: NeMo Gym starts each server in its own directory, where a relative
    path would scatter the trace (one directory per server)."""
    environ = os.environ if environ is None else environ
    given = str(environ.get(_FILE, ""))
    if not given or os.path.isabs(given):
        return given
    # expanduser first ("~/traces/"); a trailing separator (a directory) survives abspath only by hand.
    absolute = os.path.abspath(os.path.expanduser(given))
    if given.endswith(("/", os.sep)):
        absolute += os.sep
    environ[_FILE] = absolute
    return absolute


_FILE = "GYMTRACE_FILE"  # gymtrace._model.environment.GYMTRACE_FILE (integrations use the public API only)


class GymTraceConfigurator:
    """The ``gymtrace`` configurator: :func:`gymtrace.configure` from the environment, with the
    service named after the NeMo Gym server or command unless ``OTEL_SERVICE_NAME`` names it."""

    def configure(self, **kwargs: Any) -> None:
        if is_helper_process():
            return
        service = None if os.environ.get("OTEL_SERVICE_NAME") else nemo_gym.process_service_name()
        directory = absolute_trace_file()
        if service and directory.endswith(("/", os.sep)):
            # One file per process, named after the server it belongs to (not ``app.py-PID``).
            safe = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in service)
            gymtrace.configure(
                service_name=service, file=os.path.join(directory, f"{safe}-{os.getpid()}.jsonl")
            )
            return
        gymtrace.configure(service_name=service)


class NeMoGymInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """NeMo Gym's driver and servers (:func:`gymtrace.integrations.nemo_gym.instrument_stack`),
    in NeMo Gym's processes only."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return ("nemo-gym >= 0.7",)

    def _instrument(self, **kwargs: Any) -> None:
        # opentelemetry-instrument skips the dependency check (skip_dep_check): check here that
        # NeMo Gym is there, and that this is one of its processes.
        if importlib.util.find_spec("nemo_gym") is None or is_helper_process():
            return
        if nemo_gym.process_service_name() is None:
            return
        nemo_gym.instrument_stack(tracer_provider=kwargs.get("tracer_provider"))

    def _uninstrument(self, **kwargs: Any) -> None:
        nemo_gym.uninstrument_stack()
