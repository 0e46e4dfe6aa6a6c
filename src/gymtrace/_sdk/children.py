"""What a configured process hands the child processes it starts: its settings, in the
environment (``GYMTRACE_PARENT``), and the trace file each child writes beside its own.

A worker that never calls ``configure()`` then exports what it records the same way as its parent
(``setup.configure_from_parent`` reads the variable back). The CLI finds the children's files with
:func:`child_files`.
"""

from __future__ import annotations

import json
import os

from gymtrace._model import environment as env
from gymtrace._model import settings as _settings
from gymtrace._model.tracefiles import child_path, first_segment, trace_files


def export_to_children(settings: _settings.Settings, service_name: str) -> None:
    """Leave the settings just applied in the environment every child process inherits
    (``GYMTRACE_PARENT``): a worker that never calls configure() then exports what it records under
    this process's carriers the same way (issue 25). Headers and secrets stay out: the environment
    of a child (a sandbox) is readable by whatever runs there."""
    exporters = settings.exporters
    file = settings.file if "file" in exporters else None
    parent = {
        "pid": os.getpid(),
        "service_name": service_name or None,
        "endpoint": settings.endpoint if "otlp" in exporters else None,
        "protocol": settings.protocol if "otlp" in exporters else None,
        "file": os.path.abspath(file) if file else None,
        "console": "console" in exporters,
        "strict": settings.strict,
        "trace_per": "run" if settings.trace_per_run else "rollout",
        "backend": settings.backend,
        "experiment": settings.experiment,
    }
    os.environ[env.GYMTRACE_PARENT] = json.dumps(parent)


def child_file(path: str, pid: int | None = None) -> str:
    """The trace file a child process writes when its parent writes ``path``: a directory stays the
    directory (one file per process already), a file gets a sibling per process
    (``tracefiles.child_path``), because processes appending to one file could interleave their
    lines."""
    if path.endswith(("/", os.sep)) or os.path.isdir(path):
        return path
    return child_path(path, pid if pid is not None else os.getpid())


def child_files(path: str) -> list[str]:
    """The files :func:`child_file` gave the children of a process that writes ``path``: one name
    per child, which names its segments too (``tracefiles.trace_files``)."""
    own = set(trace_files(path))
    children = (first_segment(f) for f in trace_files(path, children=True) if f not in own)
    return [str(f) for f in dict.fromkeys(children)]


def forget_exported_settings() -> None:
    """After shutdown: children started from now on must not configure from settings no longer in
    force (only the variable this process wrote is removed, not one it inherited)."""
    raw = os.environ.get(env.GYMTRACE_PARENT)
    if raw and f'"pid": {os.getpid()},' in raw:
        del os.environ[env.GYMTRACE_PARENT]
