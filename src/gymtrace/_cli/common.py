"""What every reading subcommand shares: the spans it reads and the table it prints.

Trace files (the default file and the files its workers wrote beside it, a Ray run writes one per
worker) or Jaeger's query API, searched by run ID when one is given.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gymtrace import _constants as c
from gymtrace._model import settings as _settings
from gymtrace._model.environment import DEFAULT_FILE
from gymtrace._model.spandata import SpanData, TraceFileError, read_trace_files
from gymtrace._model.tracefiles import Warn, trace_files_of
from gymtrace._sdk.children import child_files

if TYPE_CHECKING:
    from gymtrace._read.pictures.runview import RunView
    from gymtrace._read.source import Summary


def default_file() -> str:
    return _settings.resolve(file=True).file or DEFAULT_FILE


def warn(message: str) -> None:
    """A problem with the input that the command reads past (a file cut short, a foreign file)."""
    print(f"gymtrace: warning: {message}", file=sys.stderr)


def input_names(files: list[str]) -> list[str]:
    """The names given, or the default file and the files its workers wrote beside it (a worker
    configured from GYMTRACE_PARENT writes {stem}.pid-{pid}{suffix}), so their outcomes count;
    each name stands for its segments too (``input_files``)."""
    return files or [default_file(), *child_files(default_file())]


def input_files(files: list[str], warn: Warn | None = None) -> list[Path]:
    """Every file the names given stand for (``tracefiles.trace_files``: a directory's, a file's
    segments), each once however many names cover it (``gymtrace stats traces*``)."""
    return trace_files_of(input_names(files), warn)


def read_summary(args: argparse.Namespace) -> Summary:
    """What ``rollouts`` and ``stats`` read: only the spans the outcome rule and the training figures
    need (``_read.source``), from files in one streaming pass, or from Jaeger's search (by run ID if
    given), a page of traces at a time."""
    from gymtrace._read.source import read_summary_spans, summary_of_traces

    if args.jaeger:
        return summary_of_traces(jaeger_traces(args))
    return read_summary_spans(input_names(args.files), warn)


def jaeger_traces(args: argparse.Namespace) -> Iterator[list[SpanData]]:
    """The traces of Jaeger's search that ``args`` asks for (``--jaeger``, ``--service``, ``--run``),
    one at a time; when it found none without a service named, a warning that names the services
    it asked and ``--service``."""
    from gymtrace._read.jaeger import JaegerClient

    if args.files:
        raise TraceFileError("give trace files or --jaeger, not both")
    client = JaegerClient(args.jaeger)
    found = 0
    for trace in client.traces(args.service, {c.RUN_ID: args.run} if args.run else {}):
        found += 1
        yield trace
    if not found and not args.service:
        # Jaeger lists a service once its store has indexed the service's name, which on
        # OpenSearch comes a refresh (seconds) after the spans themselves are searchable.
        listed = ", ".join(client.searched[:10]) + (", ..." if len(client.searched) > 10 else "")
        warn(
            f"no trace{f' of run {args.run!r}' if args.run else ''} in the"
            f" {len(client.searched)} services Jaeger lists ({listed or 'none'}); a service is"
            " listed seconds after its first spans are stored: name it with --service"
        )


def read_picture(args: argparse.Namespace) -> RunView:
    """The run ``timeline`` and ``report`` draw: from files in one streaming pass, or from Jaeger's
    search a page of traces at a time (:class:`RunNotFound` when the input does not hold it)."""
    from gymtrace._read.pictures.runview import read_view, view_of_traces

    if args.jaeger:
        return view_of_traces(jaeger_traces(args), args.run, lanes_by=args.lanes)
    return read_view(input_names(args.files), args.run, lanes_by=args.lanes, warn=warn)


def read_files(files: list[str]) -> list[SpanData]:
    """The spans of every file given, read as one (a Ray run writes one per worker, a traced
    service one per process), or of the default file."""
    from gymtrace._read.source import gc_paused

    with gc_paused():
        return read_trace_files(input_files(files, warn), warn=warn)


def print_table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
