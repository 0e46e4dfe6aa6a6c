"""The live exporter (``GYMTRACE_BACKEND=mlflow|phoenix``) that gymtrace's export queue drives, and
the client for a backend's name that it and ``gymtrace push`` build.

Each span gets the names its server reads on its way out (never on the application's thread: the
export queue's worker does it). Once the server took a batch, the outcome of every rollout the
batch touched is decided again and what changed (a score, an outcome tag, a finished run's counts)
is handed to the :class:`~gymtrace._sdk.backends.scores.ScoreSender`. Nothing here raises into the
application.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Sequence
from functools import partial
from typing import Any

from gymtrace import _constants as c
from gymtrace._model import settings as _settings
from gymtrace._model.spandata import SpanData, from_readable
from gymtrace._read.outcomes import RolloutOutcome
from gymtrace._sdk.backends.client import BackendError, Client, NotYet
from gymtrace._sdk.backends.mlflow import MlflowClient
from gymtrace._sdk.backends.phoenix import PhoenixClient
from gymtrace._sdk.backends.scores import ScoreSender, decided, outcome_inputs
from gymtrace._sdk.export import ExportStats

logger = logging.getLogger("gymtrace")

# Rollouts whose outcome inputs are remembered by a live exporter, for late outcome records; the
# oldest are forgotten first (a record that late is still in the files `gymtrace push` reads).
REMEMBERED_ROLLOUTS = 50_000


def client(backend: str, url: str | None, experiment: str) -> Client:
    """The client of ``backend`` (``mlflow`` or ``phoenix``) at ``url`` (None: the server's own default)."""
    if backend == _settings.BACKEND_MLFLOW:
        return MlflowClient(url, experiment)
    if backend == _settings.BACKEND_PHOENIX:
        return PhoenixClient(url, experiment)
    raise ValueError(f"backend must be one of {_settings.BACKENDS[1:]}, got {backend!r}")


class BackendExporter:
    """An SDK ``SpanExporter`` (duck-typed) for MLflow or Phoenix, driven by gymtrace's export queue.

    ``export()`` runs on the queue's worker thread: it maps and sends the batch, and once the server
    took it, re-decides the outcome of every rollout the batch touched and hands what changed (a
    score, an outcome tag, a finished run's counts) to the :class:`ScoreSender`.
    """

    def __init__(self, backend: str, url: str | None, experiment: str) -> None:
        self.backend = backend
        self.client = client(backend, url, experiment)
        self.sender = ScoreSender(self.client.title)
        self._lock = threading.Lock()
        self._warned = False
        # rollout key -> the spans its outcome is decided from (roots, records, episodes)
        self._inputs: collections.OrderedDict[tuple[Any, ...], list[SpanData]] = collections.OrderedDict()
        self._sent: dict[tuple[Any, ...], tuple[str, float | None, int]] = {}
        self._runs: dict[str, dict[str, RolloutOutcome]] = {}
        self._ended_runs: set[str] = set()

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        data = [s if isinstance(s, SpanData) else from_readable(s) for s in spans]
        data = [s for s in data if s.attributes.get(c.KIND) != c.KIND_LIVE]
        try:
            if data:
                self.client.send(data)
        except (NotYet, BackendError) as exc:
            self._warn(str(exc))
            return SpanExportResult.FAILURE
        self._after_delivery(data)
        return SpanExportResult.SUCCESS

    def _warn(self, why: str) -> None:
        if not self._warned:
            self._warned = True
            logger.warning(
                "gymtrace: %s did not take spans: %s; they are retried, and counted in"
                " gymtrace.export_stats() if dropped (this warning is given once)",
                self.client.where(),
                why,
            )

    def _after_delivery(self, data: list[SpanData]) -> None:
        touched: set[tuple[Any, ...]] = set()
        runs_ended = []
        with self._lock:
            for span in data:
                if (span.attributes.get(c.KIND) == c.KIND_RUN and span.parent_id is None) or (
                    span.name == c.SPAN_RUN and isinstance(span.attributes.get(c.RUN_ID), str)
                ):
                    runs_ended.append(str(span.attributes.get(c.RUN_ID)))
                if not outcome_inputs(span):
                    continue
                key = (span.attributes.get(c.RUN_ID), span.attributes.get(c.ROLLOUT_ID))
                self._inputs.setdefault(key, []).append(span)
                self._inputs.move_to_end(key)
                touched.add(key)
            while len(self._inputs) > REMEMBERED_ROLLOUTS:
                forgotten, _ = self._inputs.popitem(last=False)
                self._sent.pop(forgotten, None)
            inputs = [s for key in touched for s in self._inputs[key]]
        changed_runs = set(runs_ended)
        for outcome, attempt in decided(inputs):
            key = (outcome.run_id, outcome.rollout_id)
            state = (outcome.outcome, outcome.reward, attempt)
            with self._lock:
                if outcome.run_id is not None:
                    self._runs.setdefault(outcome.run_id, {})[outcome.rollout_id] = outcome
                    if outcome.run_id in self._ended_runs:
                        changed_runs.add(outcome.run_id)
                if self._sent.get(key) == state:
                    continue
                self._sent[key] = state
            self._hand_over(outcome, attempt)
        for run_id in changed_runs:
            with self._lock:
                self._ended_runs.add(run_id)
                outcomes = list(self._runs.get(run_id, {}).values())
            self.sender.submit(
                ("run", run_id),
                f"the counts of run {run_id!r}",
                partial(self.client.run_ended, run_id, outcomes),
            )

    def _hand_over(self, outcome: RolloutOutcome, attempt: int) -> None:
        client = self.client
        if isinstance(client, MlflowClient):
            self.sender.submit(
                ("tag", outcome.trace_id, outcome.rollout_id),
                f"the outcome tag of rollout {outcome.rollout_id!r}",
                partial(client.tag_outcome, outcome),
            )
        if outcome.outcome == c.OUTCOME_SCORED and outcome.reward is not None:
            self.sender.submit(
                ("score", outcome.trace_id, outcome.rollout_id),
                f"the reward of rollout {outcome.rollout_id!r}",
                partial(client.score, outcome, attempt),
            )

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.sender.flush(timeout_millis / 1000)

    def shutdown(self) -> None:
        self.sender.shutdown(_settings.active.flush_timeout)


def score_stats(processor: Any) -> ExportStats | None:
    """The score counts of a processor that exports to a backend, else None."""
    exporter = getattr(processor, "exporter", None)
    return exporter.sender.stats() if isinstance(exporter, BackendExporter) else None


def flush_scores(processor: Any, timeout: float) -> bool:
    exporter = getattr(processor, "exporter", None)
    return exporter.force_flush(int(timeout * 1000)) if isinstance(exporter, BackendExporter) else True
