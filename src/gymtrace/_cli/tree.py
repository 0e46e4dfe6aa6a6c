"""``gymtrace tree``: span trees from trace files or from Jaeger, of one trace, rollout or run."""

from __future__ import annotations

import argparse
import sys

from gymtrace import _constants as c
from gymtrace._cli.common import read_files
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
    spans = read_files(args.files)
    if args.trace:
        return [s for s in spans if s.trace_id == args.trace.lower().rjust(32, "0")]
    if args.rollout or args.run:
        key, value = (c.ROLLOUT_ID, args.rollout) if args.rollout else (c.RUN_ID, args.run)
        traces = {s.trace_id for s in spans if s.attributes.get(key) == value}
        return [s for s in spans if s.trace_id in traces]
    return spans


def run(args: argparse.Namespace) -> int:
    from gymtrace._read.render import render_tree

    spans = _load(args)
    if not spans:
        print("no spans found", file=sys.stderr)
        return 1
    print(render_tree(spans, show_ids=args.ids))
    return 0
