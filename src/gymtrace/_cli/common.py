"""What every reading subcommand shares: the spans it reads and the table it prints.

Trace files (the default file and the files its workers wrote beside it, a Ray run writes one per
worker) or Jaeger's query API, searched by run ID when one is given.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from gymtrace import _constants as c
from gymtrace._model import settings as _settings
from gymtrace._model.environment import DEFAULT_FILE
from gymtrace._model.spandata import SpanData, TraceFileError, read_trace_files
from gymtrace._model.tracefiles import Warn, trace_files
from gymtrace._sdk.children import child_files


def default_file() -> str:
    return _settings.resolve(file=True).file or DEFAULT_FILE


def warn(message: str) -> None:
    """A problem with the input that the command reads past (a file cut short, a foreign file)."""
    print(f"gymtrace: warning: {message}", file=sys.stderr)


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
    # With no file named: the default file and the files its workers wrote beside it (a worker
    # configured from GYMTRACE_PARENT writes {stem}.pid-{pid}{suffix}), so their outcomes count;
    # each name stands for its segments too.
    return read_trace_files(input_files(files, warn), warn=warn)


def input_files(files: list[str], warn: Warn | None = None) -> list[Path]:
    """Every file the names given stand for (``tracefiles.trace_files``: a directory's, a file's
    segments), each once however many names cover it (``gymtrace stats traces*``)."""
    names = files or [default_file(), *child_files(default_file())]
    return list(dict.fromkeys(f for name in names for f in trace_files(name, warn)))


def print_table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
