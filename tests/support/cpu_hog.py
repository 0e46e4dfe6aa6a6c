"""CPU contention for the export tests: busy processes beside the application, for one test.

The export queues promise that every span is exported or counted whatever the machine's load;
their tests prove it beside processes that keep every CPU busy (as other CI legs and test files
do) instead of hoping for a quiet machine. Each busy loop is a process of its own, started and
killed by its PID.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest


@contextmanager
def cpu_hogs(count: int | None = None) -> Iterator[list[int]]:
    """``count`` processes (default: one per CPU this process may use) spinning until the block ends."""
    if count is None:
        count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while 1: pass"], stdin=subprocess.DEVNULL)
        for _ in range(count)
    ]
    try:
        yield [hog.pid for hog in hogs]
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()


@pytest.fixture
def cpu_contention() -> Iterator[list[int]]:
    """Every CPU busy with another process for the duration of the test."""
    with cpu_hogs() as pids:
        yield pids
