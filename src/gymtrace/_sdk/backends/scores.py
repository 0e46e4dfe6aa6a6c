"""The scores' machinery, shared by the live exporter and ``gymtrace push``: which outcome each
rollout has, and the thread that sends scores, tags and run counts until they land.

The outcome is the one every reader reports: ``_read.outcomes.final_outcomes`` over the rollout's root,
its ``gym.outcome`` records and its episodes. A rollout scored, then changed by a late or remote
outcome record, gets its score updated; an unscored or pending one gets none.

Scores are sent by one daemon thread per exporter (:class:`ScoreSender`), after the batch holding
the rollout's spans was delivered, and retried until the trace is there (MLflow answers 404 before
it is). What could not be sent is counted (:func:`gymtrace.export_stats`) and warned about once.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gymtrace import _constants as c
from gymtrace._model.spandata import SpanData
from gymtrace._read.outcomes import RolloutOutcome, decision_of, final_outcomes, group_rollouts
from gymtrace._sdk.backends.client import BackendError, NotYet
from gymtrace._sdk.export import ExportStats, wait_until_idle

logger = logging.getLogger("gymtrace")

# How long a score is retried while the server says its trace is not there yet (or is down), and
# the longest pause between two tries.
SCORE_RETRY_SECONDS = 600.0
SCORE_BACKOFF_MAX = 5.0


def outcome_inputs(span: SpanData) -> bool:
    """Whether the outcome rule reads this span: a rollout root, an outcome record, an episode."""
    kind = span.attributes.get(c.KIND)
    return kind in (c.KIND_ROLLOUT, c.KIND_OUTCOME, c.KIND_EPISODE) and c.ROLLOUT_ID in span.attributes


def decided(spans: Iterable[SpanData]) -> list[tuple[RolloutOutcome, int]]:
    """Every rollout's final outcome by the readers' rule, with the attempt that decided it."""
    spans = list(spans)
    attempts = {}
    for group in group_rollouts(spans):
        decision = decision_of(group)
        if decision is not None:
            attempts[(group.run_id, group.rollout_id, group.trace_id)] = decision.attempt
    return [
        (o, attempts.get((o.run_id, o.rollout_id, o.trace_id), max(o.attempts - 1, 0)))
        for o in final_outcomes(spans)
    ]


@dataclass
class _Job:
    key: tuple[str, ...]
    describe: str
    call: Callable[[], None]
    deadline: float
    tries: int = 0
    next_try: float = 0.0


class ScoreSender:
    """One daemon thread that sends scores, tags and run counts, retrying each until it lands.

    A newer job for the same key (a rollout whose outcome changed again) replaces the waiting one,
    so the server sees the latest and never two scores for one rollout.
    """

    def __init__(self, title: str, retry_seconds: float = SCORE_RETRY_SECONDS) -> None:
        self.title = title
        self.retry_seconds = retry_seconds
        self._jobs: collections.OrderedDict[tuple[str, ...], _Job] = collections.OrderedDict()
        self._lock = threading.Condition()
        self._busy = False
        self._stop = False
        self._warned = False
        self._handed = self._sent = self._lost = self._retries = 0
        self._thread = threading.Thread(
            target=self._work, name=f"gymtrace-scores-{title.lower()}", daemon=True
        )
        self._thread.start()

    def submit(self, key: tuple[str, ...], describe: str, call: Callable[[], None]) -> None:
        with self._lock:
            if self._stop:
                self._handed += 1
                self._lose(describe, "the exporter was shut down")
                return
            if key in self._jobs:
                # Replaced before it was sent: the newer one stands for both (counted once).
                del self._jobs[key]
            else:
                self._handed += 1
            self._jobs[key] = _Job(key, describe, call, time.monotonic() + self.retry_seconds)
            self._lock.notify_all()

    def _lose(self, describe: str, why: str) -> None:
        self._lost += 1
        if not self._warned:
            self._warned = True
            logger.warning(
                "gymtrace: could not send %s to %s: %s; scores not sent are counted in"
                " gymtrace.export_stats() (this warning is given once)",
                describe,
                self.title,
                why,
            )

    def _next(self) -> _Job | None:
        with self._lock:
            while True:
                if self._stop and not self._jobs:
                    return None
                now = time.monotonic()
                due = [job for job in self._jobs.values() if job.next_try <= now]
                if due:
                    job = due[0]
                    del self._jobs[job.key]
                    self._busy = True
                    return job
                wait = min((job.next_try for job in self._jobs.values()), default=now + 1.0) - now
                self._lock.wait(max(0.01, min(wait, 1.0)))

    def _work(self) -> None:
        while True:
            job = self._next()
            if job is None:
                return
            outcome: str | None = None
            try:
                job.call()
            except NotYet as exc:
                outcome = str(exc)
            except BackendError as exc:
                with self._lock:
                    self._lose(job.describe, str(exc))
                    self._done()
                continue
            except Exception as exc:  # a bug of ours must not stop the thread or reach the run
                logger.debug("gymtrace: sending %s failed", job.describe, exc_info=True)
                with self._lock:
                    self._lose(job.describe, f"internal error: {exc!r}")
                    self._done()
                continue
            logger.debug("gymtrace: %s to %s: %s", job.describe, self.title, outcome or "sent")
            with self._lock:
                if outcome is None:
                    self._sent += 1
                elif time.monotonic() >= job.deadline or self._stop:
                    self._lose(job.describe, outcome)
                else:
                    self._retries += 1
                    job.tries += 1
                    job.next_try = time.monotonic() + min(SCORE_BACKOFF_MAX, 0.2 * 2**job.tries)
                    # A newer job for the key arrived meanwhile: it wins.
                    if job.key not in self._jobs:
                        self._jobs[job.key] = job
                self._done()

    def _done(self) -> None:
        self._busy = False
        self._lock.notify_all()

    def flush(self, timeout: float) -> bool:
        """Wait until nothing waits to be sent (retries included) or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        with self._lock:
            for job in self._jobs.values():
                job.next_try = 0.0  # a flush is a reason to try again now
            self._lock.notify_all()
            return wait_until_idle(self._lock, lambda: bool(self._jobs or self._busy), deadline)

    def shutdown(self, timeout: float) -> None:
        """Send what waits within ``timeout``, then count what is left as lost."""
        flushed = self.flush(timeout)
        with self._lock:
            self._stop = True
            left = list(self._jobs.values())
            self._jobs.clear()
            for job in left:
                self._lose(job.describe, "still waiting at shutdown" if not flushed else "shut down")
            self._lock.notify_all()
        self._thread.join(timeout=1.0)

    def stats(self) -> ExportStats:
        with self._lock:
            return ExportStats(
                exporter=f"{self.title.lower()} scores",
                finished=self._handed,
                exported=self._sent,
                queued=len(self._jobs) + int(self._busy),
                dropped_queue_full=0,
                dropped_export_failed=self._lost,
                retries=self._retries,
            )
