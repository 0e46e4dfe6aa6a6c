"""``gymtrace push``: trace files sent to MLflow or Arize Phoenix, each rollout's reward as its score."""

from __future__ import annotations

import argparse
import sys

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
    where = f"experiment {args.experiment!r}" if args.backend == "mlflow" else f"project {args.experiment!r}"
    print(
        f"pushed {result.spans} spans, {result.rollouts} rollouts ({result.scored} with a reward) of"
        f" run(s) {', '.join(result.runs) or '-'} to {target.where()}, {where}"
    )
    return 0
