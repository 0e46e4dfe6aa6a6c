"""``gymtrace tree``: span trees from trace files or from Jaeger, of one trace, rollout or run."""

from __future__ import annotations

import argparse
import sys

from gymtrace import _constants as c
from gymtrace._cli.common import input_files, read_files, warn
from gymtrace._model.spandata import SpanData


def _load(args: argparse.Namespace) -> list[SpanData]:
    if args.jaeger:
        from gymtrace._read.jaeger import JaegerClient

        client = JaegerClient(args.jaeger)
        if args.trace:
            return client.trace(args.trace)
        tags = {c.ROLLOUT_ID: args.rollout} if args.rollout else {c.RUN_ID: args.run} if args.run else {}
        found: list[SpanData] = client.search(args.service, tags)
        return found
    if not (args.trace or args.rollout or args.run):
        return read_files(args.files)
    from gymtrace._read.source import spans_of_traces, traces_matching

    # Streamed: only the spans of the traces asked for are decoded and held (one pass for a trace
    # ID, two for a rollout or run: which traces, then their spans).
    files = input_files(args.files, warn)
    if args.trace:
        return spans_of_traces(files, {args.trace.lower().rjust(32, "0")}, warn)
    key, value = (c.ROLLOUT_ID, args.rollout) if args.rollout else (c.RUN_ID, args.run)
    traces = traces_matching(files, key, value, warn)
    # The second pass reads what the first did: what it read past is told once.
    return spans_of_traces(files, traces, lambda _: None) if traces else []


def run(args: argparse.Namespace) -> int:
    from gymtrace._read.render import render_tree

    spans = _load(args)
    if not spans:
        print("no spans found", file=sys.stderr)
        return 1
    print(render_tree(spans, show_ids=args.ids))
    return 0
