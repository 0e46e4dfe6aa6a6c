"""A run with three rollouts for tests/test_live.py: one finishes, one hangs inside a step, one works
without pause. Prints ``ready`` once the hung one is stuck, then runs until it is killed.

Usage: python live_program.py TRACE_FILE|OTLP_GRPC_ENDPOINT   (GYMTRACE_HEARTBEAT and
OTEL_BSP_SCHEDULE_DELAY from the test)
"""

from __future__ import annotations

import contextvars
import sys
import threading
import time

import gymtrace

HUNG_STEP = 3
SERVICE = "live-program"


def finishes() -> None:
    with gymtrace.rollout(rollout_id="finishes", task_id="t0"), gymtrace.episode():
        for _ in range(2):
            with gymtrace.step():
                pass
        gymtrace.record_reward(1.0)


def hangs(stuck: threading.Event) -> None:
    with gymtrace.rollout(rollout_id="hangs", task_id="t1"), gymtrace.episode():
        for number in range(1, HUNG_STEP + 1):
            with gymtrace.step():
                if number == HUNG_STEP:
                    stuck.set()
                    threading.Event().wait()  # a tool call that never returns


def busy() -> None:
    with gymtrace.rollout(rollout_id="busy", task_id="t2"), gymtrace.episode():
        while True:
            with gymtrace.step():
                time.sleep(0.01)


def main() -> None:
    target = sys.argv[1]
    if target.startswith("http"):
        gymtrace.configure(service_name=SERVICE, endpoint=target, protocol="grpc", file=False)
    else:
        gymtrace.configure(service_name=SERVICE, file=target)
    with gymtrace.run(run_id="live-run"):
        finishes()
        stuck = threading.Event()
        # In the run's context (a thread does not inherit it): the rollouts carry its run ID.
        threading.Thread(target=contextvars.copy_context().run, args=(hangs, stuck), daemon=True).start()
        threading.Thread(target=contextvars.copy_context().run, args=(busy,), daemon=True).start()
        stuck.wait()
        print("ready", flush=True)
        threading.Event().wait()  # until SIGKILL


if __name__ == "__main__":
    main()
