"""The trace readers on a training run's file: time and peak memory beside the floor.

Run::

    python benchmarks/readers.py                       # 10,000 and 100,000 rollouts
    python benchmarks/readers.py --rollouts 10000      # one size
    python benchmarks/readers.py --keep DIR            # keep the generated files in DIR
    python benchmarks/readers.py --before OLD/src      # and an earlier checkout's readers beside
    python benchmarks/readers.py --compress none gzip zstd   # each run written with each setting

Each size is written through the real API by a child process (``gymtrace.configure(file=...)``):
a run of N rollouts, ~18 spans each (rollout, one episode or two when the first attempt hits an
environment error and is retried, seed session, an agent invocation of four steps, each a model
call and a tool call, verify), a tenth of them retried, a tenth unscored, with policy versions, groups of 8 and a
train step per 256 rollouts consuming them (``gym.consumed`` records). Then, each in a child of its
own so its peak RSS is its own (``resource.getrusage(RUSAGE_CHILDREN)``, by child):

* the floor: ``cat FILES > /dev/null`` (the bytes of the run's files: its segments past
  ``GYMTRACE_FILE_ROTATE_MB``), and parsing every line with the fastest parser
  installed (orjson) and with the standard library's ``json`` alone, holding nothing (a compressed
  run's lines decompressed by the standard library's ``gzip``, or zstd's module, first);
* ``gymtrace rollouts --json``, ``stats``, ``stats --by train_step`` and ``check``: with the native
  reader (``gymtrace_native``, built from ``native/`` by ``scripts/native``) and orjson, when it is
  installed; with orjson alone (the ``fast`` extra; ``GYMTRACE_NATIVE_READER=off``); and as the
  plain install reads (the child's ``sys.modules`` says orjson and the native reader are absent, so
  the readers parse with the standard library's ``json``).

With ``--compress none gzip zstd``, each run is written and read once per
``GYMTRACE_FILE_COMPRESS`` setting (a compressed one under ``DIR/gzip/``, ``DIR/zstd/``), its rows
after the plain run's.

With ``--before SRC`` (the ``src`` directory of another checkout, e.g. made by ``git worktree add``),
each command also runs with that code first on ``sys.path`` (same interpreter and orjson), in a
column of its own: before and after in one run, each against the same floor.

Peak RSS is the largest process's: on a big file the readers fork a second process that reads half
of it meanwhile (both cores); it holds half of what the first holds and exits before it goes on.

Prints numbers only; nothing here asserts a time. On a shared machine read the CPU time beside the
wall time: other work stretches the wall time, less so the CPU time.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gymtrace._model.tracefiles import open_lines, trace_files

PRODUCER = r"""
import sys
import gymtrace

path, n = sys.argv[1], int(sys.argv[2])
gymtrace.configure(service_name="readers-bench", file=path)
PER_STEP, GROUP = 256, 8
with gymtrace.run(run_id="bench"):
    keys = []
    for i in range(n):
        gymtrace.set_policy_version(i // PER_STEP)
        group = i // GROUP
        with gymtrace.rollout(
            rollout_id=f"r-{i}", task_id=f"t-{group % 1000}", repeat=i % GROUP,
            group_id=f"g-{group}", group_size=GROUP, train_step=i // PER_STEP,
        ):
            for attempt in gymtrace.attempts(2, reraise=False):
                with attempt:
                    with gymtrace.seed_session():
                        pass
                    with gymtrace.agent_invocation():
                        for turn in range(4):
                            with gymtrace.step():
                                with gymtrace.model_call(model="policy") as call:
                                    call.record_usage(input_tokens=200, output_tokens=50)
                                with gymtrace.tool_call(tool_name="env.step"):
                                    pass
                            if turn == 0 and attempt.number == 0 and i % 10 == 3:
                                raise ConnectionError("environment lost")  # retried: a second episode
                    if i % 10 == 7:
                        raise KeyError("harness bug")  # not retried: the rollout is unscored
                    with gymtrace.verify():
                        gymtrace.record_reward(float(i % 3 == 0))
            keys.append(gymtrace.current().join_keys())
        if len(keys) == PER_STEP:
            with gymtrace.train_step(step=i // PER_STEP, policy_version=i // PER_STEP):
                for k in keys:
                    gymtrace.consume(k)
            keys = []
gymtrace.shutdown()
"""

# Every line of every file given (a run's segments), parsed and dropped; a compressed file's lines
# decompressed in blocks of 1 MB by the standard library's gzip (zstd's module) and split in C first.
PARSE = r"""
import gzip, io, sys
if sys.argv[1] == "json":
    from json import loads
else:
    from orjson import loads
def lines(path):
    if path.endswith(".gz"):
        f = gzip.open(path, "rb")
    elif path.endswith(".zst"):
        try:
            from compression import zstd
        except ImportError:
            import zstandard as zstd
        f = zstd.open(path, "rb")
    else:
        with open(path, "rb") as f:
            yield from f
        return
    with f:
        rest = b""
        while block := f.read(1 << 20):
            block = rest + block
            end = block.rfind(b"\n") + 1
            yield from io.BytesIO(block[:end])
            rest = block[end:]
        if rest:
            yield rest
for path in sys.argv[2:]:
    for line in lines(path):
        loads(line)
"""

# The plain install: the readers must find neither orjson nor the native reader.
PLAIN = (
    "import sys; sys.modules['orjson'] = None; sys.modules['gymtrace_native'] = None;"
    " from gymtrace._cli import main; sys.exit(main())"
)
FAST = "import sys; from gymtrace._cli import main; sys.exit(main())"
NATIVE_OFF = {"GYMTRACE_NATIVE_READER": "off"}


def timed(
    argv: list[str], src: Path | None = None, env: dict[str, str] | None = None
) -> tuple[float, float, float]:
    """Seconds, CPU seconds (user and system, every process of it) and peak RSS (MB, its largest
    process) of one child process (with ``src`` first on its path and ``env`` in its environment,
    if given); its output is thrown away."""
    script = (
        "import resource, subprocess, sys, time\n"
        "t = time.perf_counter()\n"
        "subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, check=False)\n"
        "u = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
        "print(time.perf_counter() - t, u.ru_utime + u.ru_stime, u.ru_maxrss)\n"
    )
    environ = {**os.environ, **(env or {}), **({"PYTHONPATH": str(src)} if src is not None else {})}
    out = subprocess.run(
        [sys.executable, "-c", script, *argv], capture_output=True, text=True, check=True, env=environ
    )
    seconds, cpu, rss_kb = out.stdout.split()
    return float(seconds), float(cpu), int(rss_kb) / 1024


def generate(path: Path, rollouts: int, compress: str) -> float:
    start = time.perf_counter()
    env = {**os.environ, "GYMTRACE_FILE_COMPRESS": compress}
    subprocess.run([sys.executable, "-c", PRODUCER, str(path), str(rollouts)], check=True, env=env)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, nargs="*", default=[10_000, 100_000])
    parser.add_argument("--keep", type=Path, help="write the runs here and keep them")
    parser.add_argument("--before", type=Path, help="an earlier checkout's src/, timed beside (fast parser)")
    parser.add_argument(
        "--compress",
        nargs="*",
        choices=["none", "gzip", "zstd"],
        default=["none"],
        help="write each run with each GYMTRACE_FILE_COMPRESS setting (default: none)",
    )
    args = parser.parse_args()
    try:
        import orjson  # noqa: F401

        fast = True
    except ImportError:
        fast = False
        print("orjson is not installed (the `fast` extra): the fast-parser rows are left out")
    native = fast and importlib.util.find_spec("gymtrace_native") is not None
    if not native:
        print("the native reader is not installed (scripts/native): its column is left out")
    where = args.keep or Path(tempfile.mkdtemp(prefix="gymtrace-readers-"))
    where.mkdir(parents=True, exist_ok=True)
    commands = {
        "rollouts --json": ["rollouts", "--json"],
        "stats": ["stats"],
        "stats --by train_step": ["stats", "--by", "train_step", "--json"],
        "check": ["check"],
    }
    try:
        print("Each cell: wall time (CPU time of all its processes), peak RSS; times the parse floor's")
        before = " before: `--before` code (orjson) |" if args.before else ""
        print(
            "| rollouts (spans, file) | what | native reader (orjson) | fast parser (orjson) |"
            f" plain install (json) |{before}"
        )
        print("| --- | --- | --- | --- | --- |" + (" --- |" if args.before else ""))
        for compress, n in ((compress, n) for compress in args.compress for n in args.rollouts):
            # The plain runs where they always were (--keep DIR of earlier runs still serves).
            path = (where if compress == "none" else where / compress) / f"run-{n}.jsonl"
            if not any(f.exists() for f in trace_files(path)):
                path.parent.mkdir(parents=True, exist_ok=True)
                made = generate(path, n, compress)
                print(f"(generated {n:,} rollouts, {compress}, in {made:.0f} s)", file=sys.stderr)
            # The run's files: past GYMTRACE_FILE_ROTATE_MB (256 by default, on disk) the file the
            # run was configured with is its first segment of several, and the floors read them
            # all, as the commands do.
            files = [str(f) for f in trace_files(path)]
            spans = 0
            for file in files:
                with open_lines(file) as lines:
                    spans += sum(line.count(b'"startTimeUnixNano"') for line in lines)
            megabytes = sum(os.path.getsize(f) for f in files) / 1e6
            plural = "s" if len(files) > 1 else ""
            written = "" if compress == "none" else f" {compress}"
            size = (
                f"{n:,} ({spans / 1e6:.2f}M spans, {megabytes:,.0f} MB{written} in {len(files)} file{plural})"
            )

            def cell(
                argv: list[str],
                floor: tuple[float, float] | None = None,
                src: Path | None = None,
                env: dict[str, str] | None = None,
            ) -> tuple[str, tuple[float, float]]:
                seconds, cpu, rss = timed(argv, src, env)
                text = f"{seconds:.{2 if seconds < 1 else 1}f} s ({cpu:.{2 if cpu < 1 else 1}f} s CPU), {rss:,.0f} MB"
                if floor:
                    text += f"; {seconds / floor[0]:.1f}x parse ({cpu / floor[1]:.1f}x CPU)"
                return text, (seconds, cpu)

            cat, _ = cell(["cat", *files])
            same = f" {cat} |" if args.before else ""
            print(f"| {size} | floor: read the bytes (`cat`) | {cat} | {cat} | {cat} |{same}")
            fast_parse, fast_floor = (
                cell([sys.executable, "-c", PARSE, "orjson", *files]) if fast else ("-", None)
            )
            plain_parse, plain_floor = cell([sys.executable, "-c", PARSE, "json", *files])
            same = f" {fast_parse} |" if args.before else ""
            print(f"| | floor: parse only | {fast_parse} | {fast_parse} | {plain_parse} |{same}")
            for name, argv in commands.items():
                native_cell = (
                    cell([sys.executable, "-c", FAST, *argv, str(path)], fast_floor)[0] if native else "-"
                )
                fast_cell = (
                    cell([sys.executable, "-c", FAST, *argv, str(path)], fast_floor, env=NATIVE_OFF)[0]
                    if fast
                    else "-"
                )
                plain_cell = cell([sys.executable, "-c", PLAIN, *argv, str(path)], plain_floor)[0]
                before_cell = ""
                if args.before:
                    before_cell = (
                        " "
                        + cell([sys.executable, "-c", FAST, *argv, str(path)], fast_floor, args.before)[0]
                        + " |"
                    )
                print(
                    f"| | `gymtrace {name}` | {native_cell} | {fast_cell} | {plain_cell} |{before_cell}",
                    flush=True,
                )
    finally:
        if args.keep is None:
            shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    main()
