"""The ``gymtrace`` command: ``demo``, ``tree``, ``check``, ``rollouts``, ``stats``, ``live``, ``import``,
``compare``, ``push``, ``timeline`` and ``report``.

The only package that prints. Its grammar is :mod:`.parser`; each subcommand is a module of its own
(``import`` is :mod:`.import_`, ``demo-service`` lives in :mod:`.demo`), and what the reading
subcommands share is :mod:`.common`. Here: :func:`main`, the exit codes, and which module runs
which subcommand.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from gymtrace._cli import check, compare, demo, import_, live, push, report, rollouts, stats, timeline, tree
from gymtrace._cli.parser import make_parser
from gymtrace._model.spandata import TraceFileError

__all__ = ["EXIT_CLOSED_PIPE", "main"]

# The module that runs each subcommand.
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "demo": demo.run,
    "demo-service": demo.run_service,
    "tree": tree.run,
    "check": check.run,
    "rollouts": rollouts.run,
    "stats": stats.run,
    "live": live.run,
    "import": import_.run,
    "compare": compare.run,
    "push": push.run,
    "timeline": timeline.run,
    "report": report.run,
}
# The subcommands that read a run: they hold the spans a run's answer needs (10^5-10^6 objects),
# make no reference cycles worth collecting, and run the cyclic garbage collector's full passes
# over all they hold if it stays on (issue 45).
READERS = frozenset({"tree", "check", "rollouts", "stats", "compare", "timeline", "report"})


# Exit codes (docs/cli.md): 0 success; 1 the answer is "no" (contract violations, nothing found);
# 2 bad usage or an unreadable input (argparse's own convention for usage errors); 130 interrupted;
# 141 the reader of standard output went away (128 + SIGPIPE, what a shell reports for a command
# killed by the signal, as `yes | head -1` is).
EXIT_CLOSED_PIPE = 141


def main(argv: Sequence[str] | None = None) -> int:
    try:
        code = _main(argv)
        # Flushed here, not at interpreter exit, so a reader that went away is noticed below
        # instead of in Python's exit-time flush, which prints "Exception ignored ...".
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        return _closed_pipe()


def _closed_pipe() -> int:
    """Standard output's reader closed the pipe (``gymtrace rollouts --json | head -1``): stop
    quietly, as ``cat`` does. What is still buffered cannot be written anywhere; pointing standard
    output at the null device keeps the interpreter's exit-time flush from failing again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
    return EXIT_CLOSED_PIPE


def _main(argv: Sequence[str] | None) -> int:
    args = make_parser().parse_args(argv)
    try:
        if args.command in READERS:
            from gymtrace._read.source import gc_paused

            with gc_paused():
                return COMMANDS[args.command](args)
        return COMMANDS[args.command](args)
    except BrokenPipeError:
        raise  # an OSError, but not the input's: main() stops quietly
    except (TraceFileError, OSError) as exc:
        print(f"gymtrace {args.command}: {exc}", file=sys.stderr)
        return 2
