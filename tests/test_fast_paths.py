"""The fast paths (``_otel_private``, private): each use of a private OpenTelemetry name is active.

Active, that is, on the versions gymtrace is tested with.

A release that removes what one uses does not break gymtrace (each falls back to the public path),
but it must not make gymtrace slower silently either: this test fails, naming the fast path, what
disappeared and what runs instead. Run on the oldest and the newest OpenTelemetry the extras allow
(scripts/test's version matrix).
"""

from __future__ import annotations

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

from gymtrace._otel_private import otlp_seams as _otlp
from gymtrace._sdk import setup as _setup

PATHS = {path.name: path for path in _setup.fast_paths()}


def test_every_private_use_is_registered() -> None:
    assert sorted(PATHS) == [
        "context variable",
        "encoder-process records from span fields",
        "global provider read",
        "lean OTLP/HTTP export",
        "lean OTLP/gRPC export",
        "lean spans",
        "span fields read directly",
    ]


@pytest.mark.parametrize("name", sorted(PATHS))
def test_the_fast_path_is_active_on_this_opentelemetry(name: str) -> None:
    path = PATHS[name]
    assert path.active, (
        f"{path.name} ({path.module}) is off: this OpenTelemetry lacks {', '.join(path.missing)};"
        f" gymtrace now runs {path.fallback}. Adapt {path.module} to the new release, or raise the"
        " floor in pyproject.toml and say so in CHANGELOG.md."
    )


def test_a_missing_seam_is_named_and_the_sdk_exporter_is_used_instead() -> None:
    class Renamed(OTLPSpanExporter):
        _translate_data = None  # type: ignore[assignment]  # what a release renaming it looks like

    missing = _otlp._grpc_seams_missing(Renamed)
    assert missing == ["OTLPSpanExporter._translate_data()"]
    assert _otlp._grpc_seams_missing(OTLPSpanExporter) == []
