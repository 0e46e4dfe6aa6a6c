"""Helpers for the distributed tests: real service processes and span-tree assertions.

Plain module in tests/support (on the path through pytest's ``pythonpath`` setting); service
processes (``serve_app.py``) import ``_relay_app`` from this directory through ``PYTHONPATH``.
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import serve_app
from gymtrace import _constants as c
from gymtrace._model.spandata import SpanData, read_trace_files
from gymtrace._model.tracefiles import trace_files
from gymtrace.demo.distributed import ServiceProcess

SUPPORT_DIR = Path(__file__).resolve().parent


def clean_env(trace_file: Path) -> dict[str, str]:
    """Environment for a service process: spans to ``trace_file``, no inherited OTLP settings."""
    env = {k: "" for k in os.environ if k.startswith(("OTEL_EXPORTER_OTLP", "OTEL_TRACES_EXPORTER"))}
    env["GYMTRACE_FILE"] = str(trace_file)
    env["PYTHONPATH"] = os.pathsep.join([str(SUPPORT_DIR), os.environ.get("PYTHONPATH", "")])
    return env


@contextmanager
def services(
    tmp_path: Path, specs: Sequence[tuple[str, str, Sequence[str]]]
) -> Iterator[list[ServiceProcess]]:
    """Start one process per ``(service name, role, extra serve args)``; always stopped on exit.

    Role ``app`` serves ``--app module:factory`` with serve_app.py; the demo's roles (``agent``,
    ``model``, ``env``) run as ``gymtrace demo-service``."""
    started: list[ServiceProcess] = []
    try:
        for name, role, extra in specs:
            overrides = clean_env(tmp_path / f"{name}.jsonl")
            if role == "app":
                argv = [serve_app.PATH, *extra, "--service", name]
                started.append(
                    ServiceProcess(argv, name=name, env_overrides=overrides, log_dir=str(tmp_path))
                )
            else:
                started.append(
                    ServiceProcess.demo(
                        role, service=name, extra=list(extra), env_overrides=overrides, log_dir=str(tmp_path)
                    )
                )
        yield started
    finally:
        for process in started:
            process.stop()


RELAY = ("--app", "_relay_app:make_app")
# The service names of `gymtrace demo --distributed`: the driver and the three servers it starts.
SERVICES_OF_THE_DEMO = {"gym-driver", "gym-agent", "gym-model", "gym-env"}


def read_services(tmp_path: Path) -> list[SpanData]:
    return read_trace_files(trace_files(tmp_path))


def by_trace(spans: Iterable[SpanData]) -> dict[str, list[SpanData]]:
    out: dict[str, list[SpanData]] = defaultdict(list)
    for span in spans:
        out[span.trace_id].append(span)
    return out


def assert_one_tree(spans: Sequence[SpanData]) -> SpanData:
    """Exactly one root; every other span's parent is in the set. Returns the root."""
    ids = {s.span_id for s in spans}
    assert len(ids) == len(spans), "duplicate span IDs"
    roots = [s for s in spans if s.parent_id is None]
    orphans = [
        (s.name, s.service, s.parent_id) for s in spans if s.parent_id is not None and s.parent_id not in ids
    ]
    assert len(roots) == 1, f"expected one root, got {[(s.name, s.service) for s in roots]}"
    assert orphans == [], f"spans whose parent is missing: {orphans}"
    return roots[0]


def parent_of(span: SpanData, spans: Sequence[SpanData]) -> SpanData | None:
    return next((s for s in spans if s.span_id == span.parent_id), None)


def ancestors(span: SpanData, spans: Sequence[SpanData]) -> Iterator[SpanData]:
    index = {s.span_id: s for s in spans}
    current = index.get(span.parent_id or "")
    while current is not None:
        yield current
        current = index.get(current.parent_id or "")


def is_http(span: SpanData) -> bool:
    return "http.request.method" in span.attributes or "http.method" in span.attributes


def assert_no_duplicate_http_spans(spans: Sequence[SpanData]) -> None:
    """One HTTP CLIENT span per outgoing request, one HTTP SERVER span per incoming one: an HTTP
    client span has at most one server child and no HTTP client child; an HTTP server span's
    parent is never another HTTP server span."""
    index = {s.span_id: s for s in spans}
    http = [s for s in spans if is_http(s)]
    children = Counter((s.parent_id, s.span_kind) for s in http)
    for span in http:
        if span.span_kind == "CLIENT":
            assert children[(span.span_id, "SERVER")] <= 1, f"two server spans under {span.name}"
            assert children[(span.span_id, "CLIENT")] == 0, f"nested client spans under {span.name}"
        if span.span_kind == "SERVER" and span.parent_id in index:
            parent = index[span.parent_id]
            assert not (is_http(parent) and parent.span_kind == "SERVER"), (
                f"nested server spans at {span.name}"
            )


def boundary_pairs(spans: Sequence[SpanData]) -> list[tuple[SpanData, SpanData]]:
    """(parent, child) pairs whose services differ: the process boundaries of the trace."""
    index = {s.span_id: s for s in spans}
    return [
        (index[s.parent_id], s)
        for s in spans
        if s.parent_id in index and index[s.parent_id].service != s.service
    ]


def missing_identity(spans: Iterable[SpanData], keys: Sequence[str]) -> list[tuple[str, str, str]]:
    return [(s.service, s.name, k) for s in spans for k in keys if k not in s.attributes]


IDENTITY = (c.ROLLOUT_ID, c.EPISODE_ATTEMPT)
