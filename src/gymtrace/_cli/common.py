"""What every reading subcommand shares: the spans it reads and the table it prints.

Trace files (the default file and the files its workers wrote beside it, a Ray run writes one per
worker) or Jaeger's query API, searched by run ID when one is given.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from gymtrace import _constants as c
from gymtrace._model import settings as _settings
from gymtrace._model.environment import DEFAULT_FILE
from gymtrace._model.spandata import SpanData, TraceFileError, read_otlp_json_lines
from gymtrace._sdk.children import child_files


def default_file() -> str:
    return _settings.resolve(file=True).file or DEFAULT_FILE


def read_spans(args: argparse.Namespace) -> list[SpanData]:
    """The spans ``rollouts`` and ``stats`` read: files, or Jaeger (searched by run ID if given)."""
    if args.jaeger:
        from gymtrace._read.jaeger import JaegerClient

        if args.files:
            raise TraceFileError("give trace files or --jaeger, not both")
        found: list[SpanData] = JaegerClient(args.jaeger).search(
            args.service, {c.RUN_ID: args.run} if args.run else {}
        )
        return found
    return read_files(args.files)


def read_files(files: list[str]) -> list[SpanData]:
    """The spans of every file given, read as one (a Ray run writes one per worker, a traced
    service one per process), or of the default file."""
    spans: list[SpanData] = []
    # With no file named: the default file and the files its workers wrote beside it (a worker
    # configured from GYMTRACE_PARENT writes {stem}.pid-{pid}{suffix}), so their outcomes count.
    for path in files or [default_file(), *child_files(default_file())]:
        spans.extend(read_otlp_json_lines(path))
    return spans


def print_table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
