"""``gymtrace push``: trace files sent to MLflow or Arize Phoenix, each rollout's reward as its score."""

from __future__ import annotations

import argparse
import sys

from gymtrace import _constants as c
from gymtrace._cli.common import read_files


def run(args: argparse.Namespace) -> int:
    from gymtrace._sdk.backends import BackendError, NotYet, client, push

    spans = read_files(args.files)
    if not spans:
        print("gymtrace push: no spans in the files given", file=sys.stderr)
        return 1
    target = client(args.backend, args.endpoint, args.experiment)
    try:
        result = push(target, spans)
    except BackendError as exc:
        print(f"gymtrace push: {exc}", file=sys.stderr)
        return 2
    except NotYet as exc:
        print(
            f"gymtrace push: {target.where()} cannot be reached or has not stored the spans ({exc}): start"
            " it, check --endpoint, and push again (pushing twice changes nothing)",
            file=sys.stderr,
        )
        return 2
    except ImportError as exc:
        print(f"gymtrace push: needs gymtrace[sdk] (the OTLP protobuf messages): {exc}", file=sys.stderr)
        return 2
    # What the server holds, read back through its API (never what was sent).
    line = (
        f"{target.where()}, {target.kind} {args.experiment!r}, holds {result.spans} spans in"
        f" {result.traces} traces: {result.rollouts} rollouts ({result.scored} with a reward) of"
        f" run(s) {', '.join(result.runs) or '-'}"
    )
    elsewhere = {name: n for name, n in result.moved.items() if name}
    if elsewhere:
        holders = " and ".join(
            f"{target.kind} {name!r} holds" + (f" {n} of" if len(elsewhere) > 1 else "")
            for name, n in sorted(elsewhere.items())
        )
        line += (
            f"; {sum(elsewhere.values())} traces under new IDs, as {holders} their original IDs"
            f" (each span carries its original as {c.PUSH_ORIGINAL_TRACE_ID})"
        )
    if result.moved.get(""):
        line += f"; {result.moved['']} traces under the new IDs an earlier push gave them"
    print(line)
    return 0
