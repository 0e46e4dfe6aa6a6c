"""``gymtrace import``: trajectory records (NeMo Gym output, ATIF, Inspect AI logs) written as traces.

Named ``import_`` because ``import`` is a keyword. The importer of the format given is imported
only when it runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gymtrace import _constants as c
from gymtrace._cli.common import default_file


def run(args: argparse.Namespace) -> int:

    from gymtrace._import import write as _write

    paths = [Path(p) for p in args.records]
    if args.format == "nemo-gym":
        from gymtrace._import import nemo_gym as importer
    elif args.format == "atif":
        from gymtrace._import import atif as importer  # type: ignore[no-redef]
    else:
        from gymtrace._import import inspect as importer  # type: ignore[no-redef]
    try:
        result = importer.import_files(paths, run_id=args.run)
    except (ValueError, ImportError) as exc:
        print(f"gymtrace import: {exc}", file=sys.stderr)
        return 2
    if not result.spans:
        print("gymtrace import: no records found", file=sys.stderr)
        return 1
    resource = {c.RECORD_FORMAT: args.format}
    targets = []
    if args.output or not args.endpoint:
        targets.append(args.output or default_file())
        try:
            _write.write_file(result.spans, targets[-1], resource)
        except ImportError as exc:  # -o x.jsonl.zst without a zstd module
            print(f"gymtrace import: {exc}", file=sys.stderr)
            return 2
    if args.endpoint:
        targets.append(_write.traces_url(args.endpoint))
        _write.send(result.spans, args.endpoint, resource)
    target = " and ".join(targets)
    runs = sorted(
        {str(s.attributes.get(c.RUN_ID)) for s in result.spans if s.attributes.get(c.KIND) == c.KIND_RUN}
    )
    print(
        f"imported {result.rollouts} rollouts of run {', '.join(runs)}: {len(result.spans)} spans"
        f" ({result.synthetic} with synthesised times) to {target}"
    )
    if result.unmapped:
        print(f"not mapped ({sum(result.unmapped.values())}):")
        for what, count in sorted(result.unmapped.items()):
            print(f"  {count:>6}  {what}")
    return 0
