"""``gymtrace live``: the open rollouts, running, stalled or lost, from their live markers.

Reads files that their processes are still writing: a last line caught mid-write is read next time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from gymtrace import _constants as c
from gymtrace._cli.common import input_files, print_table
from gymtrace._model.spandata import SpanData, TraceFileError, read_trace_files


def run(args: argparse.Namespace) -> int:
    from gymtrace._read.liveview import live_rollouts

    if args.stalled_after < 0:
        print("gymtrace live: --stalled-after must be >= 0 seconds", file=sys.stderr)
        return 2
    if args.jaeger:
        from gymtrace._read.jaeger import JaegerClient

        if args.files:
            raise TraceFileError("give trace files or --jaeger, not both")
        tags: dict[str, str] = {c.KIND: c.KIND_LIVE}
        if args.run:
            tags[c.RUN_ID] = args.run
        spans: list[SpanData] = JaegerClient(args.jaeger).search(args.service, tags)
    else:
        # Files its processes are still writing: a last line caught mid-write is read next time.
        # Every segment, so a rollout whose markers began before a rotation is still followed.
        spans = read_trace_files(input_files(args.files), partial_last_line=True)
    rollouts = live_rollouts(spans, now_ns=time.time_ns(), stalled_after=args.stalled_after, run_id=args.run)
    if args.json:
        for rollout in rollouts:
            print(json.dumps(rollout.as_json()))
        return 0
    if not rollouts:
        print("no open rollouts")
        return 0
    rows = [
        (
            r.run_id or "-",
            r.task_id or "-",
            r.rollout_id,
            str(r.attempt),
            r.state,
            f"{r.age_s:.1f}s",
            f"{r.idle_s:.1f}s",
            str(r.step),
            r.service or "-",
        )
        for r in rollouts
    ]
    print_table(("RUN", "TASK", "ROLLOUT", "ATTEMPT", "STATE", "AGE", "IDLE", "STEP", "SERVICE"), rows)
    return 0
