"""MLflow 3 as a backend: experiment, runs, trace tags and the ``reward`` assessment, over its REST API.

The ``x-mlflow-experiment-id`` header (the experiment ``GYMTRACE_EXPERIMENT``, created if missing)
and ``x-mlflow-run-id`` (an MLflow run per gym run, found by its ``gym.run.id`` tag, its counts and
mean reward logged when the gym run ends) go with every request of spans. The reward is an
assessment (``log_feedback``), created once and updated in place; the outcome the rule decided is
written back as the trace's tags when it differs from what the root said.
"""

from __future__ import annotations

import base64
import collections
import threading
import time
import urllib.parse
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from gymtrace import _constants as c
from gymtrace._model import settings as _settings
from gymtrace._model.spandata import SpanData
from gymtrace._read.outcomes import RolloutOutcome
from gymtrace._sdk.backends.client import (
    Accepted,
    BackendError,
    Client,
    NotYet,
    Response,
    detail,
    http_request,
    scored_span,
)

# Trace IDs per lookup request (a GET's URL holds them).
_BATCH = 50
# How long after creating its run a process looks again for an older run of the same gym run.
_SETTLE_SECONDS = 1.0


class MlflowClient(Client):
    backend = _settings.BACKEND_MLFLOW

    def __init__(self, url: str | None, experiment: str) -> None:
        super().__init__(url, experiment)
        self.experiment_id: str | None = None
        self._runs: dict[str, str] = {}
        # Held across the search and the create: two threads must not create two runs for one.
        self._lock = threading.Lock()

    def _api(self, method: str, path: str, body: Any = None) -> Response:
        return http_request(method, self.base + path, body)

    def prepare(self) -> None:
        if self.experiment_id is not None:
            return
        found = self._api(
            "GET",
            "/api/2.0/mlflow/experiments/get-by-name?"
            + urllib.parse.urlencode({"experiment_name": self.experiment}),
        )
        body = found.body if isinstance(found.body, dict) else {}
        if found.status == 200 and "experiment" in body:
            experiment = body["experiment"]
            if experiment.get("lifecycle_stage") == "deleted":
                raise BackendError(
                    f"the MLflow experiment {self.experiment!r} at {self.base} is deleted: restore it"
                    " (mlflow experiments restore) or pick another name (GYMTRACE_EXPERIMENT, --experiment)"
                )
            self.experiment_id = str(experiment["experiment_id"])
            return
        if found.status == 404 and body.get("error_code") == "RESOURCE_DOES_NOT_EXIST":
            created = self._api("POST", "/api/2.0/mlflow/experiments/create", {"name": self.experiment})
            if created.status == 200 and isinstance(created.body, dict):
                self.experiment_id = str(created.body["experiment_id"])
                return
            if isinstance(created.body, dict) and created.body.get("error_code") == "RESOURCE_ALREADY_EXISTS":
                # Another process (a worker of this run) created it meanwhile: find it again.
                return self.prepare()
            if created.status >= 500:
                raise NotYet(f"{self.where()}: creating experiment {self.experiment!r}: {detail(created)}")
            raise BackendError(
                f"{self.where()} could not create the experiment {self.experiment!r}: {detail(created)};"
                " pick another name (GYMTRACE_EXPERIMENT, --experiment)"
            )
        if found.status >= 500:
            raise NotYet(f"{self.where()}: {detail(found)}")
        raise BackendError(
            f"{self.base} is not an MLflow tracking server (GET /api/2.0/mlflow/experiments/get-by-name"
            f" answered {found.status}): point the endpoint at MLflow's base URL, or set the backend"
            " that runs there (GYMTRACE_BACKEND, --backend)"
        )

    def run_of(self, run_id: str) -> str:
        """The MLflow run of gym run ``run_id``: found by its tag, else created."""
        with self._lock:
            known = self._runs.get(run_id)
            if known is None:
                known = self._runs[run_id] = self._find_or_create_run(run_id)
            return known

    def _find_or_create_run(self, run_id: str) -> str:
        search, oldest = self._search_runs(run_id)
        if search.status >= 400:
            raise (NotYet if search.status >= 500 else BackendError)(
                f"{self.where()}: searching runs: {detail(search)}"
            )
        if oldest is not None:
            return oldest
        created = self._api(
            "POST",
            "/api/2.0/mlflow/runs/create",
            {
                "experiment_id": self.experiment_id,
                "run_name": run_id,
                "start_time": int(time.time() * 1000),
                "tags": [{"key": c.RUN_ID, "value": run_id}],
            },
        )
        if created.status != 200 or not isinstance(created.body, dict):
            raise (NotYet if created.status >= 500 else BackendError)(
                f"{self.where()}: creating the run of {run_id!r}: {detail(created)}"
            )
        mlflow_run = str(created.body["run"]["info"]["run_id"])
        # Another process of the same gym run (a worker, a scorer) may have searched and created
        # at the same moment: every process keeps the oldest run, and deletes its own if not it.
        # The oldest is by the start time each process sent, so a run that started first can be
        # created just after this process looked (a CI run kept two): look once more a moment later.
        for pause in (0.0, _SETTLE_SECONDS):
            time.sleep(pause)
            _, oldest = self._search_runs(run_id)
            if oldest is not None and oldest != mlflow_run:
                self._api("POST", "/api/2.0/mlflow/runs/delete", {"run_id": mlflow_run})
                return oldest
        return mlflow_run

    def _search_runs(self, run_id: str) -> tuple[Response, str | None]:
        """The search for the MLflow runs tagged with gym run ``run_id``: the answer, and the oldest
        run it found (None when it found none or failed). The oldest is the one every process keeps."""
        assert self.experiment_id is not None
        search = self._api(
            "POST",
            "/api/2.0/mlflow/runs/search",
            {
                "experiment_ids": [self.experiment_id],
                "filter": f"tags.`{c.RUN_ID}` = '{_quote(run_id)}'",
                "max_results": 50,
            },
        )
        runs = search.body.get("runs", []) if search.status == 200 and isinstance(search.body, dict) else []
        keys = [(int(r["info"].get("start_time", 0)), str(r["info"]["run_id"])) for r in runs]
        return search, min(keys)[1] if keys else None

    def send(self, spans: Sequence[SpanData]) -> None:
        self.prepare()
        assert self.experiment_id is not None
        # x-mlflow-run-id links the traces whose roots a request holds to that run: one request per run.
        by_run: dict[str | None, list[SpanData]] = collections.defaultdict(list)
        for span in spans:
            run_id = span.attributes.get(c.RUN_ID)
            by_run[run_id if isinstance(run_id, str) else None].append(span)
        for run_id, group in by_run.items():
            headers = {c.MLFLOW_EXPERIMENT_HEADER: self.experiment_id}
            if run_id is not None:
                headers[c.MLFLOW_RUN_HEADER] = self.run_of(run_id)
            self._post_spans(group, headers)

    def holders(self, trace_ids: Sequence[str]) -> dict[str, str]:
        out: dict[str, str] = {}
        names: dict[str, str] = {}
        for start in range(0, len(trace_ids), _BATCH):
            chunk = [f"tr-{t}" for t in trace_ids[start : start + _BATCH]]
            found = self._api("POST", "/api/3.0/mlflow/traces/batchGetInfos", {"trace_ids": chunk})
            self._check(found, "looking up trace IDs")
            for info in (found.body or {}).get("trace_infos", []):
                experiment = str(
                    info.get("trace_location", {}).get("mlflow_experiment", {}).get("experiment_id")
                )
                if experiment not in names:
                    names[experiment] = self._experiment_name(experiment)
                out[str(info["trace_id"]).removeprefix("tr-")] = names[experiment]
        return out

    def _experiment_name(self, experiment_id: str) -> str:
        if experiment_id == self.experiment_id:
            return self.experiment
        found = self._api(
            "GET",
            "/api/2.0/mlflow/experiments/get?" + urllib.parse.urlencode({"experiment_id": experiment_id}),
        )
        body = found.body if isinstance(found.body, dict) else {}
        return str(body.get("experiment", {}).get("name") or f"#{experiment_id}")

    def accepted(self, spans: Mapping[str, Collection[str]]) -> Accepted:
        self.prepare()
        assert self.experiment_id is not None
        ids = sorted(spans)
        held, traces, scores = 0, set(), 0
        for start in range(0, len(ids), _BATCH):
            query = urllib.parse.urlencode(
                [("trace_ids", f"tr-{t}") for t in ids[start : start + _BATCH]]
                + [("experiment_ids", self.experiment_id)]
            )
            found = self._api("GET", "/api/3.0/mlflow/traces/batchGet?" + query)
            self._check(found, "reading back traces")
            for trace in (found.body or {}).get("traces", []):
                info = trace.get("trace_info", {})
                trace_id = str(info.get("trace_id", "")).removeprefix("tr-")
                if trace_id not in spans:
                    continue
                # OTLP JSON from protobuf: span IDs in base64.
                stored = {base64.b64decode(s.get("span_id", "")).hex() for s in trace.get("spans", [])}
                mine = stored & set(spans[trace_id])
                if mine:
                    traces.add(trace_id)
                    held += len(mine)
                scores += sum(1 for a in info.get("assessments", []) if _is_reward(a))
        return Accepted(held, frozenset(traces), scores)

    def _check(self, response: Response, doing: str) -> None:
        if response.status != 200 or not isinstance(response.body, dict):
            raise (NotYet if response.status >= 500 else BackendError)(
                f"{self.where()}: {doing}: {detail(response)}"
            )

    def _trace_info(self, trace_id: str) -> dict[str, Any]:
        found = self._api("GET", f"/api/3.0/mlflow/traces/tr-{trace_id}")
        if found.status == 404:
            raise NotYet(f"{self.where()} has no trace tr-{trace_id} yet")
        if found.status != 200 or not isinstance(found.body, dict):
            raise (NotYet if found.status >= 500 else BackendError)(
                f"{self.where()}: reading trace tr-{trace_id}: {detail(found)}"
            )
        return found.body.get("trace", {}).get("trace_info", {})  # type: ignore[no-any-return]

    def _scores(self, outcome: RolloutOutcome) -> list[dict[str, Any]]:
        """gymtrace's ``reward`` assessments of this rollout on its trace."""
        info = self._trace_info(outcome.trace_id)
        return [
            a
            for a in info.get("assessments", [])
            if _is_reward(a) and (a.get("metadata") or {}).get(c.ROLLOUT_ID) == outcome.rollout_id
        ]

    def _sent_reward(self, outcome: RolloutOutcome) -> float | None:
        try:
            mine = self._scores(outcome)
        except (NotYet, BackendError):
            return None
        value = mine[0].get("feedback", {}).get("value") if mine else None
        return float(value) if isinstance(value, (int, float)) else None

    def score(self, outcome: RolloutOutcome, attempt: int) -> None:
        assert outcome.reward is not None
        span_id = scored_span(outcome)
        metadata = {c.ROLLOUT_ID: outcome.rollout_id, c.SCORE_ATTEMPT: str(attempt)}
        mine = self._scores(outcome)
        feedback = {"value": outcome.reward}
        if mine:
            current = mine[0]
            if current.get("feedback", {}).get("value") == outcome.reward and (
                current.get("metadata") or {}
            ).get(c.SCORE_ATTEMPT) == str(attempt):
                return  # already says this: `gymtrace push` twice changes nothing
            response = self._api(
                "PATCH",
                f"/api/3.0/mlflow/traces/tr-{outcome.trace_id}/assessments/{current['assessment_id']}",
                {
                    "assessment": {
                        "assessment_id": current["assessment_id"],
                        "trace_id": f"tr-{outcome.trace_id}",
                        "feedback": feedback,
                        "metadata": metadata,
                    },
                    "update_mask": "feedback,metadata",
                },
            )
        else:
            assessment: dict[str, Any] = {
                "assessment_name": c.SCORE_REWARD,
                "trace_id": f"tr-{outcome.trace_id}",
                "source": {"source_type": "CODE", "source_id": c.SCORE_SOURCE},
                "feedback": feedback,
                "metadata": metadata,
            }
            if span_id is not None:
                assessment["span_id"] = span_id
            response = self._api(
                "POST",
                f"/api/3.0/mlflow/traces/tr-{outcome.trace_id}/assessments",
                {"assessment": assessment},
            )
        if response.status == 404:
            raise NotYet(f"{self.where()} has no trace tr-{outcome.trace_id} yet")
        if response.status >= 400:
            raise (NotYet if response.status >= 500 else BackendError)(
                f"{self.where()} refused the reward of rollout {outcome.rollout_id}: {detail(response)}"
            )

    def tag_outcome(self, outcome: RolloutOutcome) -> None:
        root = outcome.root
        if outcome.outcome == c.OUTCOME_PENDING or (root is not None and root.parent_id is not None):
            return  # no outcome yet; or the rollout is not its trace's root (GYMTRACE_TRACE_PER=run)
        if (
            root is not None
            and root.attributes.get(c.ROLLOUT_OUTCOME) == outcome.outcome
            and root.attributes.get(c.ROLLOUT_ATTEMPTS) == outcome.attempts
        ):
            return  # the root said it already (its mlflow.traceTag.* attributes)
        for key, value in ((c.ROLLOUT_OUTCOME, outcome.outcome), (c.ROLLOUT_ATTEMPTS, str(outcome.attempts))):
            response = self._api(
                "PATCH", f"/api/2.0/mlflow/traces/tr-{outcome.trace_id}/tags", {"key": key, "value": value}
            )
            if response.status == 404:
                raise NotYet(f"{self.where()} has no trace tr-{outcome.trace_id} yet")
            if response.status >= 400:
                raise (NotYet if response.status >= 500 else BackendError)(
                    f"{self.where()}: tagging trace tr-{outcome.trace_id}: {detail(response)}"
                )

    def run_ended(self, run_id: str, outcomes: Sequence[RolloutOutcome]) -> None:
        self.prepare()
        mlflow_run = self.run_of(run_id)
        scored = [o.reward for o in outcomes if o.outcome == c.OUTCOME_SCORED and o.reward is not None]
        pending = 0
        for outcome in outcomes:
            if outcome.outcome != c.OUTCOME_PENDING:
                continue
            # Pending here, perhaps scored by an outcome record another process sent: its score
            # on the trace says so.
            reward = self._sent_reward(outcome)
            if reward is None:
                pending += 1
            else:
                scored.append(reward)
        counts = {
            c.MLFLOW_RUN_METRIC_SCORED: float(len(scored)),
            c.MLFLOW_RUN_METRIC_UNSCORED: float(sum(o.outcome == c.OUTCOME_UNSCORED for o in outcomes)),
            c.MLFLOW_RUN_METRIC_PENDING: float(pending),
        }
        if scored:
            counts[c.MLFLOW_RUN_METRIC_MEAN_REWARD] = sum(scored) / len(scored)
        now = int(time.time() * 1000)
        logged = self._api(
            "POST",
            "/api/2.0/mlflow/runs/log-batch",
            {
                "run_id": mlflow_run,
                "metrics": [{"key": k, "value": v, "timestamp": now, "step": 0} for k, v in counts.items()],
            },
        )
        ended = self._api(
            "POST",
            "/api/2.0/mlflow/runs/update",
            {"run_id": mlflow_run, "status": "FINISHED", "end_time": now},
        )
        for response in (logged, ended):
            if response.status >= 400:
                raise (NotYet if response.status >= 500 else BackendError)(
                    f"{self.where()}: logging the counts of run {run_id!r}: {detail(response)}"
                )


def _is_reward(assessment: Mapping[str, Any]) -> bool:
    """A ``reward`` assessment gymtrace wrote."""
    return (
        assessment.get("assessment_name") == c.SCORE_REWARD
        and assessment.get("source", {}).get("source_id") == c.SCORE_SOURCE
    )


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")
