"""``gymtrace timeline`` and ``gymtrace report`` on a run of 100,000 rollouts: time, memory, the
page's size, and what headless Chromium spends to load and draw it.

Run::

    python benchmarks/timeline.py                        # 100,000 rollouts
    python benchmarks/timeline.py --rollouts 10000       # another size
    python benchmarks/timeline.py --keep DIR             # keep the run and the pages in DIR

The run is written through the real API by child processes, into a directory (``GYMTRACE_FILE=DIR/``
style: one file per process): a driver opens the run and, as the trainer, a train step every
second; ``--workers`` rollout workers (default 4) each run their share of the rollouts as asyncio
tasks, ``--concurrency`` at once (default 16), so a worker's episodes overlap and pack into lanes.
A rollout is ~18 spans (rollout, an episode or two when the first attempt hits an environment
error and is retried, seed session, an agent invocation of four steps, each a model call and a
tool call, verify), a tenth of them retried, a tenth unscored, the shape of
``benchmarks/readers.py`` on issue 45's branch.

Then, each in a child of its own (so its peak RSS is its own, ``RUSAGE_CHILDREN``): the floor
(every line parsed with the standard library's ``json``, nothing kept), ``gymtrace timeline DIR -o
run.html``, ``--format chrome`` and ``gymtrace report``; and headless
Chromium (Debian's, as the browser tests drive it) opens the page: the CPU time of all its
processes from navigation until the timeline says it has drawn, and the page's own clock.

Prints numbers only; nothing here asserts a time. Read the CPU time beside the wall time on a
shared machine.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "support"))  # the browser harness of the e2e tests

DRIVER = r"""
import json, subprocess, sys, time
import gymtrace
from gymtrace import propagation

directory, rollouts, workers, concurrency = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
gymtrace.configure(service_name="trainer", file=f"{directory}/driver.jsonl")
with gymtrace.run(run_id="bench"):
    carrier = json.dumps(propagation.inject({}, destination=propagation.GYM_INTERNAL))
    share = [rollouts // workers + (i < rollouts % workers) for i in range(workers)]
    children = [
        subprocess.Popen([sys.executable, "-c", sys.argv[5], directory, str(i), str(share[i]), str(concurrency), carrier])
        for i in range(workers)
    ]
    step = 0
    while any(child.poll() is None for child in children):
        time.sleep(1.0)
        with gymtrace.train_step(step=step, policy_version=step):
            time.sleep(0.05)
        step += 1
    assert all(child.returncode == 0 for child in children)
gymtrace.shutdown()
"""

WORKER = r"""
import asyncio, json, sys
import gymtrace
from gymtrace import propagation

directory, index, count, concurrency, carrier = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), json.loads(sys.argv[5])
gymtrace.configure(service_name="rollout-worker", file=f"{directory}/worker-{index}.jsonl")


async def rollout(n):
    with gymtrace.rollout(rollout_id=f"w{index}-{n}", task_id=f"t-{n % 1000}", repeat=n % 8):
        for attempt in gymtrace.attempts(2, reraise=False):
            with attempt:
                with gymtrace.seed_session():
                    await asyncio.sleep(0)
                with gymtrace.agent_invocation(agent_name="policy"):
                    for turn in range(4):
                        with gymtrace.step():
                            with gymtrace.model_call(model="policy") as call:
                                await asyncio.sleep(0)  # other rollouts run meanwhile: episodes overlap
                                call.record_usage(input_tokens=200, output_tokens=50)
                            with gymtrace.tool_call(tool_name="env.step"):
                                pass
                        if turn == 0 and attempt.number == 0 and n % 10 == 3:
                            raise ConnectionError("environment lost")  # retried: a second episode
                if n % 10 == 7:
                    raise KeyError("harness bug")  # not retried: the rollout is unscored
                with gymtrace.verify():
                    gymtrace.record_reward(float(n % 3 == 0))


async def main():
    queue = iter(range(count))

    async def lane():
        for n in queue:
            await rollout(n)

    await asyncio.gather(*(lane() for _ in range(concurrency)))


with propagation.attach(carrier):
    asyncio.run(main())
gymtrace.shutdown()
"""


# The floor: every line of the run parsed with the standard library's json, nothing kept.
PARSE = r"""
import json, sys
for path in sys.argv[1:]:
    with open(path, "rb") as f:
        for line in f:
            json.loads(line)
"""


def timed(argv: list[str]) -> tuple[float, float, float]:
    """Seconds, CPU seconds and peak RSS (MB) of one child process; its output thrown away."""
    script = (
        "import resource, subprocess, sys, time\n"
        "t = time.perf_counter()\n"
        "subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, check=True)\n"
        "u = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
        "print(time.perf_counter() - t, u.ru_utime + u.ru_stime, u.ru_maxrss)\n"
    )
    out = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, check=True)
    seconds, cpu, rss_kb = out.stdout.split()
    return float(seconds), float(cpu), int(rss_kb) / 1024


def _tree_cpu(root: int) -> float:
    """CPU seconds (user + system) of ``root`` and every process below it, from /proc."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry.name)] = int(fields[1])
        times[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
    total = 0.0
    for pid, cpu in times.items():
        at = pid
        while at not in (0, 1) and at != root:
            at = parents.get(at, 0)
        if at == root:
            total += cpu
    return total


def chromium_draw(page: Path) -> tuple[float, float, dict[str, object]] | None:
    """Wall and CPU seconds of Chromium (every process of it) from navigation to the timeline
    drawn, and what the page says it drew; None without Chromium."""
    from browser import Browser, find_chromium

    executable = find_chromium()
    if executable is None:
        return None
    with Browser(executable, width=1600, height=1000) as browser:
        pid = browser.pid
        before = _tree_cpu(pid)
        start = time.perf_counter()
        browser.open(page.as_uri())
        figures = browser.wait_for(
            "window.gymtraceTimelines && window.gymtraceTimelines.length"
            " && window.gymtraceTimelines[0].figures.draws > 0 && window.gymtraceTimelines[0].figures",
            timeout=300,
            what="the timeline drawn",
        )
        wall = time.perf_counter() - start
        cpu = _tree_cpu(pid) - before
        figures["page_ms"] = browser.evaluate("Math.round(performance.now())")
    return wall, cpu, figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--keep", type=Path, help="keep the run and the pages here")
    parser.add_argument("--reuse", action="store_true", help="with --keep: read the run kept there before")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="gymtrace-timeline-bench-"))
    run_dir = work / "run"
    start = time.perf_counter()
    reused = bool(args.reuse and args.keep and any(run_dir.glob("*.jsonl")))
    if not reused:
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True)
        subprocess.run(
            [
                sys.executable,
                "-c",
                DRIVER,
                str(run_dir),
                str(args.rollouts),
                str(args.workers),
                str(args.concurrency),
                WORKER,
            ],
            check=True,
            # Plain lines, as the floor below parses them and the figures were first measured.
            env={**os.environ, "GYMTRACE_FILE_COMPRESS": "none"},
        )
    files = sorted(run_dir.glob("*.jsonl"))
    size = sum(f.stat().st_size for f in files)
    spans = 0
    for file in files:  # every span has one start time (events and links have none)
        with open(file, "rb") as f:
            for line in f:
                spans += line.count(b'"startTimeUnixNano"')
    print(
        f"run: {args.rollouts:,} rollouts from {args.workers} workers x {args.concurrency} at once,"
        f" {spans:,} spans in {len(files)} files, {size / 1e6:,.0f} MB, "
        + ("kept from before" if reused else f"written in {time.perf_counter() - start:.0f} s")
    )
    seconds, cpu, rss = timed([sys.executable, "-c", PARSE, *map(str, files)])
    print(f"floor, parse only (json): {seconds:.1f} s ({cpu:.1f} s CPU), peak RSS {rss:,.0f} MB")
    gymtrace = [sys.executable, "-m", "gymtrace"]
    html, chrome, report = work / "run.html", work / "run.json", work / "report.html"
    for label, argv, out in (
        ("timeline (html)", [*gymtrace, "timeline", str(run_dir), "--run", "bench", "-o", str(html)], html),
        (
            "timeline --format chrome",
            [*gymtrace, "timeline", str(run_dir), "--run", "bench", "--format", "chrome", "-o", str(chrome)],
            chrome,
        ),
        ("report", [*gymtrace, "report", str(run_dir), "--run", "bench", "-o", str(report)], report),
    ):
        seconds, cpu, rss = timed(argv)
        print(
            f"{label}: {seconds:.1f} s ({cpu:.1f} s CPU), peak RSS {rss:,.0f} MB, wrote {out.stat().st_size / 1e6:.1f} MB"
        )
    drawn = chromium_draw(html)
    if drawn is None:
        print("chromium: not installed, no browser figures")
    else:
        wall, cpu, figures = drawn
        print(
            f"chromium, timeline page: loaded and drawn in {wall:.1f} s ({cpu:.1f} s CPU, every Chromium process);"
            f" the page's clock {figures['page_ms']} ms; drew {figures['drawn']:,} of {figures['bars']:,} bars in"
            f" {figures['lanes']:,} lanes ({figures['lanesPerRow']} lanes a pixel row), {figures['bands']} train steps"
        )
    print(f"self: peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
