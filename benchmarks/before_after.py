"""``benchmarks/perf.py`` on two versions of gymtrace in one run: is any row worse after a change?

Run from the repository (after ``collector/build`` for the live-Collector rows)::

    python benchmarks/before_after.py --base 2fe661f [--rounds 3] [--only forms --only live]

It checks the base revision out into a temporary git worktree, then runs each tree's own
``benchmarks/perf.py --quick`` (each with its own ``src`` first on ``PYTHONPATH``, so the children
perf.py starts import that tree's gymtrace), alternating base and head round by round so that load
on the machine falls on both alike. It prints every row of perf.py's "cost targets" table with the
median figure before and after and their ratio. Rows are perf.py's own ratios or µs differences
against a baseline measured in the same perf.py run; nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NUMBER = re.compile(r"[-+]?\d[\d,]*\.?\d*")


def cost_rows(output: str) -> dict[str, float]:
    """The "cost targets" table of perf.py's output: metric -> the first number it measured."""
    rows: dict[str, float] = {}
    lines = output.splitlines()
    try:
        start = lines.index("cost targets") + 3  # the title, the header, the rule
    except ValueError:
        return rows
    for line in lines[start:]:
        if not line.startswith("  ") or len(line) < 90:
            break
        metric, measured = line[2:90].strip(), line[90 + 15 + 13 :].strip()
        match = NUMBER.search(measured)
        if metric and match:
            rows[metric] = float(match.group().replace(",", ""))
    return rows


def run(tree: Path, sections: list[str]) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GYMTRACE_"))}
    env["PYTHONPATH"] = str(tree / "src")
    command = [sys.executable, str(tree / "benchmarks" / "perf.py"), "--quick"]
    for section in sections:
        command += ["--only", section]
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"perf.py in {tree} failed:\n{done.stderr[-3000:]}")
    return cost_rows(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the git revision to compare against")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--only", action="append", default=None, help="perf.py sections (default: forms, live)"
    )
    args = parser.parse_args()
    sections = args.only or ["forms", "live"]
    with tempfile.TemporaryDirectory(prefix="gymtrace-base-") as scratch:
        base = Path(scratch) / "base"
        subprocess.run(
            ["git", "worktree", "add", "--detach", "-q", str(base), args.base], cwd=ROOT, check=True
        )
        try:
            binaries = ROOT / "collector" / "bin"
            if binaries.is_dir() and not (base / "collector" / "bin").exists():
                (base / "collector" / "bin").symlink_to(binaries)
            before: dict[str, list[float]] = {}
            after: dict[str, list[float]] = {}
            for round_ in range(args.rounds):
                order = [(base, before), (ROOT, after)]
                for tree, into in order if round_ % 2 == 0 else order[::-1]:
                    for metric, value in run(tree, sections).items():
                        into.setdefault(metric, []).append(value)
                print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, check=False)
    print(f"perf.py --quick {' '.join('--only ' + s for s in sections)}: base {args.base} vs this tree,"
          f" medians of {args.rounds} alternating rounds")  # fmt: skip
    print(f"  {'row':<88} {'before':>10} {'after':>10} {'after/before':>13}")
    for metric in after:
        b = statistics.median(before.get(metric, [float("nan")]))
        a = statistics.median(after[metric])
        ratio = a / b if b else float("nan")
        print(f"  {metric:<88} {b:>10.3f} {a:>10.3f} {ratio:>12.2f}x")


if __name__ == "__main__":
    main()
