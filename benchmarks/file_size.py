"""The trace file on disk: bytes per span and write cost per span for each ``GYMTRACE_FILE_COMPRESS``.

Run::

    python benchmarks/file_size.py                     # 2,000 rollouts (~36,000 spans), 5 rounds
    python benchmarks/file_size.py --rollouts 500 --rounds 3

A training run of N rollouts, ~18 spans each (the shape of ``benchmarks/readers.py``: rollout, an
episode or two when the first attempt hits an environment error and is retried, seed session, an
agent invocation of four steps, each a model call and a tool call, verify; a tenth retried, a
tenth unscored; groups of 8, policy versions), is made once through the real API into memory
(``gymtrace.testing.capture_spans``). Then:

* **the exporter** (``_sdk/export_targets.file_exporter``, what ``configure()`` builds) writes those
  spans once per setting per round, the settings alternating round by round: bytes per span on
  disk, and CPU per span of its ``export()`` (encode, compress, write: it runs on the export queue's
  worker thread or in the encoder process), median of the rounds, each beside plain's in the same
  run. Two export sizes: 512 spans (a busy run, the queue hands the exporter full batches) and 16
  (a slow agent loop: every export is its own gzip member or zstd frame). ``gzip -6`` is zlib's
  default level, beside level 1, which gymtrace writes (why: the two rows).
* **the application's thread**: the same run made by a child process per setting under
  ``configure(file=...)`` (``GYMTRACE_ENCODER=thread``, the export on a thread of that process):
  CPU of the thread that makes the spans (``time.thread_time``) per span, beside plain's. The
  compression is not on it.

Prints numbers only; nothing here asserts a time. On a shared machine read the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import gymtrace
from gymtrace._model import tracefiles
from gymtrace._model.tracefiles import trace_files, zstd_available
from gymtrace._sdk.export_targets import file_exporter
from gymtrace.testing import capture_spans

RUN = r"""
def make_run(n):
    PER_STEP, GROUP = 256, 8
    with gymtrace.run(run_id="bench"):
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
                                    with gymtrace.model_call(model="policy"):
                                        gymtrace.record_usage(input_tokens=200, output_tokens=50)
                                    with gymtrace.tool_call(tool_name="env.step"):
                                        pass
                                if turn == 0 and attempt.number == 0 and i % 10 == 3:
                                    raise ConnectionError("environment lost")
                        if i % 10 == 7:
                            raise KeyError("harness bug")
                        with gymtrace.verify():
                            gymtrace.record_reward(float(i % 3 == 0))
"""

APPLICATION = (
    r"""
import json, sys, time
import gymtrace
"""
    + RUN
    + r"""
gymtrace.configure(service_name="file-size", file=sys.argv[1])
started = time.thread_time()
make_run(int(sys.argv[2]))
thread = time.thread_time() - started
gymtrace.force_flush()
(stats,) = gymtrace.export_stats()
gymtrace.shutdown()
print(json.dumps({"thread": thread, "spans": stats.exported, "dropped": stats.dropped_queue_full}))
"""
)

# (row, GYMTRACE_FILE_COMPRESS, zlib level for gzip)
SETTINGS: list[tuple[str, str, int]] = [("none", "none", 0), ("gzip", "gzip", 1), ("gzip -6", "gzip", 6)]


def _spans(rollouts: int) -> list[Any]:
    namespace: dict[str, Any] = {"gymtrace": gymtrace}
    exec(RUN, namespace)  # the same code the application rows run
    with capture_spans(strict=False) as captured:
        namespace["make_run"](rollouts)
        return list(captured.spans)


def _write(spans: list[Any], path: Path, compress: str, level: int, per_export: int) -> tuple[int, float]:
    """Bytes on disk and CPU seconds of the exporter writing ``spans`` to ``path``."""
    if level:
        tracefiles._GZIP_LEVEL = level  # the benchmark's own comparison row
    exporter = file_exporter(str(path), 512, compress, 0)
    started = time.process_time()
    for start in range(0, len(spans), per_export):
        exporter.export(spans[start : start + per_export])
    cpu = time.process_time() - started
    exporter.shutdown()
    tracefiles._GZIP_LEVEL = 1
    return sum(f.stat().st_size for f in trace_files(path)), cpu


def _median_rows(rounds: list[dict[str, tuple[int, float]]]) -> dict[str, tuple[int, float]]:
    return {name: (rounds[0][name][0], statistics.median(r[name][1] for r in rounds)) for name in rounds[0]}


def _exporter_table(spans: list[Any], rounds: int, per_export: int, work: Path) -> None:
    results: list[dict[str, tuple[int, float]]] = []
    for n in range(rounds):
        row: dict[str, tuple[int, float]] = {}
        order = SETTINGS if n % 2 == 0 else list(reversed(SETTINGS))
        for name, compress, level in order:
            path = work / f"{name.replace(' ', '')}-{per_export}-{n}" / "t.jsonl"
            row[name] = _write(spans, path, compress, level, per_export)
        results.append(row)
    median = _median_rows(results)
    plain_bytes, plain_cpu = median["none"]
    print(f"\nexporter, {per_export} spans per export ({len(spans):,} spans, median of {rounds} rounds)")
    print(f"{'setting':<10} {'bytes/span':>11} {'x plain':>8} {'write µs/span':>14} {'x plain':>8}")
    for name, _, _ in SETTINGS:
        size, cpu = median[name]
        print(
            f"{name:<10} {size / len(spans):>11.1f} {size / plain_bytes:>8.3f}"
            f" {cpu / len(spans) * 1e6:>14.2f} {cpu / plain_cpu:>8.2f}"
        )


def _application_table(rollouts: int, rounds: int, work: Path) -> None:
    names = [(name, compress) for name, compress, level in SETTINGS if level != 6]  # gymtrace's levels
    seen: dict[str, list[float]] = {name: [] for name, _ in names}
    spans = 0
    for n in range(rounds):
        for name, compress in names if n % 2 == 0 else list(reversed(names)):
            path = work / f"app-{name}-{n}" / "t.jsonl"
            env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GYMTRACE_"))}
            env.update(GYMTRACE_FILE_COMPRESS=compress, GYMTRACE_ENCODER="thread", GYMTRACE_HEARTBEAT="0")
            out = subprocess.run(
                [sys.executable, "-c", APPLICATION, str(path), str(rollouts)],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            result = json.loads(out.stdout.strip().splitlines()[-1])
            spans = result["spans"]
            seen[name].append(result["thread"] / spans)
    plain = statistics.median(seen["none"])
    print(
        f"\napplication's thread under configure(), GYMTRACE_ENCODER=thread ({spans:,} spans, median of {rounds})"
    )
    print(f"{'setting':<10} {'µs/span':>8} {'x plain':>8}")
    for name, _ in names:
        median = statistics.median(seen[name])
        print(f"{name:<10} {median * 1e6:>8.2f} {median / plain:>8.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    if zstd_available():
        SETTINGS.append(("zstd", "zstd", 0))
    else:
        print("zstd: not installed (pip install 'gymtrace[zstd]'), no zstd rows")
    spans = _spans(args.rollouts)
    with tempfile.TemporaryDirectory() as directory:
        work = Path(directory)
        for per_export in (512, 16):
            _exporter_table(spans, args.rounds, per_export, work)
        _application_table(args.rollouts, args.rounds, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
