"""MLflow 3 and Arize Phoenix as trace backends: ``GYMTRACE_BACKEND=mlflow|phoenix`` and ``gymtrace push``.

Both servers take OTLP/HTTP protobuf at ``/v1/traces`` and keep every ``gym.*`` attribute, but their
UIs and searches read names of their own. This module adds those names to each span on its way out
(never on the application's thread: the export queue's worker does it), and turns each scored
rollout's reward into the server's own score, named ``reward``:

- **MLflow**: the ``x-mlflow-experiment-id`` header (the experiment ``GYMTRACE_EXPERIMENT``, created
  if missing) and ``x-mlflow-run-id`` (an MLflow run per gym run, its counts and mean reward logged
  when the gym run ends); a span type on every span (``mlflow.spanType``); on each trace's root the
  trace tags ``gym.run.id``, ``gym.task.id``, ``gym.rollout.id``, ``gym.rollout.outcome``,
  ``gym.rollout.attempts`` and a trace name (``mlflow.traceTag.*`` attributes, which MLflow's OTLP
  ingestion turns into tags) and a session per task (``session.id``). The reward is an assessment
  (``log_feedback``), created once and updated in place.
- **Phoenix**: the project ``GYMTRACE_EXPERIMENT`` (resource attribute
  ``openinference.project.name``), ``openinference.span.kind`` on every span (``gym.verify`` an
  evaluator), session and metadata on each trace's root. The reward is a span annotation on the
  rollout's root, whose name and identifier make a second one an update.

The outcome is the one every reader reports: ``_outcomes.final_outcomes`` over the rollout's root,
its ``gym.outcome`` records and its episodes. A rollout scored, then changed by a late or remote
outcome record, gets its score updated; an unscored or pending one gets none.

Scores are sent by one daemon thread per exporter, after the batch holding the rollout's spans was
delivered, and retried until the trace is there (MLflow answers 404 before it is). Nothing here
raises into the application: what could not be sent is counted (:func:`gymtrace.export_stats`) and
warned about once. ``gymtrace push`` uses the same mapping and clients synchronously, over trace
files, and reports a problem as one line naming the fix.

Talks HTTP only (the standard library's ``urllib``): neither server's client package is needed.
"""

from __future__ import annotations

import collections
import json
import logging
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from gymtrace import _constants as c
from gymtrace._model import settings as _settings
from gymtrace._model.spandata import SpanData, from_readable
from gymtrace._read.outcomes import RolloutOutcome, decision_of, final_outcomes, group_rollouts
from gymtrace._sdk.export import ExportStats

logger = logging.getLogger("gymtrace")

# Where each server listens when no endpoint is given (their own defaults).
DEFAULT_URLS = {
    _settings.BACKEND_MLFLOW: "http://localhost:5000",
    _settings.BACKEND_PHOENIX: "http://localhost:6006",
}
TITLES = {_settings.BACKEND_MLFLOW: "MLflow", _settings.BACKEND_PHOENIX: "Phoenix"}
TRACES_PATH = "/v1/traces"
# Generous: a server on SQLite holds a request while it stores a large batch (and this runs off
# the application's threads).
HTTP_TIMEOUT = 30.0
# How long a score is retried while the server says its trace is not there yet (or is down), and
# the longest pause between two tries.
SCORE_RETRY_SECONDS = 600.0
SCORE_BACKOFF_MAX = 5.0
# Rollouts whose outcome inputs are remembered by a live exporter, for late outcome records; the
# oldest are forgotten first (a record that late is still in the files `gymtrace push` reads).
REMEMBERED_ROLLOUTS = 50_000
# One OTLP request holds at most this many spans (both servers store a request in one transaction).
PUSH_CHUNK = 500

# -- the mapping ------------------------------------------------------------------------------------

_MLFLOW_TYPES = {
    c.KIND_RUN: "WORKFLOW",
    c.KIND_ROLLOUT: "WORKFLOW",
    c.KIND_EPISODE: "CHAIN",
    c.KIND_SEED_SESSION: "CHAIN",
    c.KIND_AGENT_INVOCATION: "AGENT",
    c.KIND_TURN: "CHAIN",
    c.KIND_STEP: "CHAIN",
    c.KIND_MODEL_CALL: "CHAT_MODEL",
    c.KIND_TOOL_CALL: "TOOL",
    c.KIND_VERIFY: "EVALUATOR",
    c.KIND_OUTCOME: "EVALUATOR",
}
_OPENINFERENCE_KINDS = {
    c.KIND_RUN: "CHAIN",
    c.KIND_ROLLOUT: "CHAIN",
    c.KIND_EPISODE: "CHAIN",
    c.KIND_SEED_SESSION: "CHAIN",
    c.KIND_AGENT_INVOCATION: "AGENT",
    c.KIND_TURN: "CHAIN",
    c.KIND_STEP: "CHAIN",
    c.KIND_MODEL_CALL: "LLM",
    c.KIND_TOOL_CALL: "TOOL",
    c.KIND_VERIFY: "EVALUATOR",
    c.KIND_OUTCOME: "EVALUATOR",
}
# Spans gymtrace did not make (an instrumentation's GenAI spans): by their GenAI operation.
_MLFLOW_OPERATIONS = {
    c.OPERATION_CHAT: "CHAT_MODEL",
    "text_completion": "LLM",
    "generate_content": "LLM",
    "embeddings": "EMBEDDING",
    c.OPERATION_EXECUTE_TOOL: "TOOL",
    c.OPERATION_INVOKE_AGENT: "AGENT",
    "create_agent": "AGENT",
}
_OPENINFERENCE_OPERATIONS = {
    c.OPERATION_CHAT: "LLM",
    "text_completion": "LLM",
    "generate_content": "LLM",
    "embeddings": "EMBEDDING",
    c.OPERATION_EXECUTE_TOOL: "TOOL",
    c.OPERATION_INVOKE_AGENT: "AGENT",
    "create_agent": "AGENT",
}
_TAGGED = (c.RUN_ID, c.TASK_ID, c.ROLLOUT_ID, c.ROLLOUT_OUTCOME, c.ROLLOUT_ATTEMPTS)


def _kind(span: SpanData, kinds: Mapping[str, str], operations: Mapping[str, str]) -> str:
    kind = span.attributes.get(c.KIND)
    if isinstance(kind, str) and kind in kinds:
        return kinds[kind]
    operation = span.attributes.get(c.GEN_AI_OPERATION_NAME)
    return operations.get(operation, "UNKNOWN") if isinstance(operation, str) else "UNKNOWN"


def session_of(attributes: Mapping[str, Any]) -> str | None:
    """A session per task of a run: every repeat of a task, side by side."""
    run_id, task_id = attributes.get(c.RUN_ID), attributes.get(c.TASK_ID)
    if isinstance(task_id, str):
        return f"{run_id}/{task_id}" if isinstance(run_id, str) else task_id
    return None


def trace_name(attributes: Mapping[str, Any]) -> str | None:
    task_id, repeat = attributes.get(c.TASK_ID), attributes.get(c.ROLLOUT_REPEAT)
    rollout_id, run_id = attributes.get(c.ROLLOUT_ID), attributes.get(c.RUN_ID)
    if isinstance(task_id, str):
        return f"{task_id} #{repeat}" if isinstance(repeat, int) else task_id
    if isinstance(rollout_id, str):
        return rollout_id
    return f"run {run_id}" if isinstance(run_id, str) else None


def mapped_attributes(backend: str, span: SpanData) -> dict[str, Any]:
    """The attributes the backend reads, added to (never replacing) the span's own."""
    attributes = span.attributes
    extra: dict[str, Any] = {}
    root = span.parent_id is None
    if backend == _settings.BACKEND_MLFLOW:
        extra[c.MLFLOW_SPAN_TYPE] = _kind(span, _MLFLOW_TYPES, _MLFLOW_OPERATIONS)
        if root:
            # MLflow's OTLP ingestion turns a root span's mlflow.traceTag.<key> into trace tags.
            for key in _TAGGED:
                value = attributes.get(key)
                # "pending" means decided elsewhere or later: an outcome record's process tags the
                # trace then, and a root arriving after it must not overwrite that tag.
                if value is not None and value != c.OUTCOME_PENDING:
                    extra[c.MLFLOW_TRACE_TAG_PREFIX + key] = str(value)
            name = trace_name(attributes)
            if name is not None:
                extra[c.MLFLOW_TRACE_TAG_PREFIX + c.MLFLOW_TRACE_NAME] = name
    else:
        extra[c.OPENINFERENCE_SPAN_KIND] = _kind(span, _OPENINFERENCE_KINDS, _OPENINFERENCE_OPERATIONS)
        if root:
            metadata = {key: attributes[key] for key in (*_TAGGED, c.ROLLOUT_REPEAT) if key in attributes}
            if metadata:
                extra[c.OPENINFERENCE_METADATA] = json.dumps(metadata, sort_keys=True)
    if root and c.SESSION_ID not in attributes:
        session = session_of(attributes)
        if session is not None:
            extra[c.SESSION_ID] = session
    return {k: v for k, v in extra.items() if k not in attributes}


def encode_request(backend: str, experiment: str, spans: Sequence[SpanData]) -> bytes:
    """An OTLP ``ExportTraceServiceRequest`` (protobuf) of ``spans``, mapped for ``backend``."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.trace.v1 import trace_pb2

    request = ExportTraceServiceRequest()
    by_resource: dict[tuple[str, str], list[SpanData]] = collections.defaultdict(list)
    for span in spans:
        by_resource[(span.service, span.service_instance)].append(span)
    for (service, instance), group in by_resource.items():
        resource_spans = request.resource_spans.add()
        resource = {"service.name": service or "gymtrace"}
        if instance:
            resource["service.instance.id"] = instance
        if backend == _settings.BACKEND_PHOENIX:
            resource[c.OPENINFERENCE_PROJECT] = experiment
        _fill(resource_spans.resource.attributes, resource)
        scope_spans = resource_spans.scope_spans.add()
        scope_spans.scope.name = "gymtrace"
        for span in group:
            out = scope_spans.spans.add()
            out.trace_id = bytes.fromhex(span.trace_id)
            out.span_id = bytes.fromhex(span.span_id)
            if span.parent_id:
                out.parent_span_id = bytes.fromhex(span.parent_id)
            out.name = span.name
            out.kind = _SPAN_KINDS.get(span.span_kind, trace_pb2.Span.SPAN_KIND_INTERNAL)
            out.start_time_unix_nano = span.start_ns
            out.end_time_unix_nano = span.end_ns
            _fill(out.attributes, {**span.attributes, **mapped_attributes(backend, span)})
            for event in span.events:
                added = out.events.add()
                added.name, added.time_unix_nano = event.name, event.time_ns
                _fill(added.attributes, event.attributes)
            for link in span.links:
                added_link = out.links.add()
                added_link.trace_id = bytes.fromhex(link.trace_id)
                added_link.span_id = bytes.fromhex(link.span_id)
                _fill(added_link.attributes, link.attributes)
            out.status.code = _STATUS_CODES.get(span.status, 0)
            if span.status_message:
                out.status.message = span.status_message
    return bytes(request.SerializeToString())


_SPAN_KINDS = {"INTERNAL": 1, "SERVER": 2, "CLIENT": 3, "PRODUCER": 4, "CONSUMER": 5}
_STATUS_CODES = {"UNSET": 0, "OK": 1, "ERROR": 2}


def _fill(target: Any, attributes: Mapping[str, Any] | None) -> None:
    for key, value in (attributes or {}).items():
        if value is None:
            continue
        item = target.add()
        item.key = key
        _any_value(item.value, value)


def _any_value(target: Any, value: Any) -> None:
    if isinstance(value, bool):
        target.bool_value = value
    elif isinstance(value, int):
        target.int_value = value
    elif isinstance(value, float):
        target.double_value = value
    elif isinstance(value, (list, tuple)):
        for element in value:
            _any_value(target.array_value.values.add(), element)
    else:
        target.string_value = str(value)


# -- HTTP -------------------------------------------------------------------------------------------


class BackendError(Exception):
    """A problem a user must fix (wrong server, deleted experiment, a 4xx): one line, naming the fix."""


class NotYet(Exception):
    """The server does not have the trace yet (or cannot be reached now): try again later."""


@dataclass(frozen=True)
class Response:
    status: int
    body: Any


def _request(
    method: str,
    url: str,
    body: Any = None,
    *,
    headers: Mapping[str, str] | None = None,
    raw: bytes | None = None,
) -> Response:
    """One HTTP request; a status code and the JSON body (None when not JSON). Network errors raise
    ``NotYet``: the server may come up or come back."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(url, data=data, method=method)
    if raw is None and body is not None:
        request.add_header("Content-Type", "application/json")
    for key, value in (headers or {}).items():
        request.add_header(key, value)
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT) as response:
            status, payload = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, payload = exc.code, exc.read()
    except (OSError, ValueError) as exc:
        raise NotYet(f"{method} {url}: {getattr(exc, 'reason', exc)}") from exc
    try:
        parsed = json.loads(payload) if payload else None
    except ValueError:
        parsed = None
    return Response(status, parsed)


def _detail(response: Response) -> str:
    body = response.body
    if isinstance(body, dict):
        message = body.get("message") or body.get("detail") or body.get("error_code")
        if message:
            return f"{response.status}: {str(message)[:200]}"
    return str(response.status)


class Client:
    """What gymtrace asks of a backend: find the experiment, take spans, keep scores and tags."""

    backend: str

    def __init__(self, url: str | None, experiment: str) -> None:
        self.base = (url or DEFAULT_URLS[self.backend]).rstrip("/")
        if self.base.endswith(TRACES_PATH):
            self.base = self.base[: -len(TRACES_PATH)]
        self.experiment = experiment
        self.title = TITLES[self.backend]

    def where(self) -> str:
        return f"{self.title} at {self.base}"

    def prepare(self) -> None:
        """Check the server is this backend and find (or create) the experiment; raises
        ``BackendError`` or ``NotYet``."""
        raise NotImplementedError

    def send(self, spans: Sequence[SpanData]) -> None:
        raise NotImplementedError

    def score(self, outcome: RolloutOutcome, attempt: int) -> None:
        """Create or update the rollout's ``reward`` score; ``NotYet`` while its trace is missing."""
        raise NotImplementedError

    def tag_outcome(self, outcome: RolloutOutcome) -> None:
        """Make the trace's outcome tag say what the rule decided (MLflow only)."""

    def run_ended(self, run_id: str, outcomes: Sequence[RolloutOutcome]) -> None:
        """Record a gym run's counts and mean reward (MLflow only)."""

    def _post_spans(self, spans: Sequence[SpanData], headers: Mapping[str, str]) -> None:
        payload = encode_request(self.backend, self.experiment, spans)
        response = _request(
            "POST",
            self.base + TRACES_PATH,
            raw=payload,
            headers={"Content-Type": "application/x-protobuf", **headers},
        )
        if response.status == 404:
            raise BackendError(
                f"{self.where()} has no OTLP endpoint at {TRACES_PATH} (404): is it {self.title} and the base"
                " URL, with no path?"
            )
        if response.status >= 500 or response.status == 429:
            raise NotYet(f"{self.where()} answered {_detail(response)} to {len(spans)} spans")
        if response.status >= 400:
            raise BackendError(f"{self.where()} refused {len(spans)} spans: {_detail(response)}")


class MlflowClient(Client):
    backend = _settings.BACKEND_MLFLOW

    def __init__(self, url: str | None, experiment: str) -> None:
        super().__init__(url, experiment)
        self.experiment_id: str | None = None
        self._runs: dict[str, str] = {}
        # Held across the search and the create: two threads must not create two runs for one.
        self._lock = threading.Lock()

    def _api(self, method: str, path: str, body: Any = None) -> Response:
        return _request(method, self.base + path, body)

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
                raise NotYet(f"{self.where()}: creating experiment {self.experiment!r}: {_detail(created)}")
            raise BackendError(
                f"{self.where()} could not create the experiment {self.experiment!r}: {_detail(created)};"
                " pick another name (GYMTRACE_EXPERIMENT, --experiment)"
            )
        if found.status >= 500:
            raise NotYet(f"{self.where()}: {_detail(found)}")
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
        if search.status >= 400:
            raise (NotYet if search.status >= 500 else BackendError)(
                f"{self.where()}: searching runs: {_detail(search)}"
            )
        if runs:
            mlflow_run = min((int(r["info"].get("start_time", 0)), str(r["info"]["run_id"])) for r in runs)[1]
        else:
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
                    f"{self.where()}: creating the run of {run_id!r}: {_detail(created)}"
                )
            mlflow_run = str(created.body["run"]["info"]["run_id"])
            # Another process of the same gym run (a worker, a scorer) may have searched and created
            # at the same moment: every process keeps the oldest run, and deletes its own if not it.
            oldest = self._oldest_run(run_id)
            if oldest is not None and oldest != mlflow_run:
                self._api("POST", "/api/2.0/mlflow/runs/delete", {"run_id": mlflow_run})
                mlflow_run = oldest
        return mlflow_run

    def _oldest_run(self, run_id: str) -> str | None:
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
        return min(keys)[1] if keys else None

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

    def _trace_info(self, trace_id: str) -> dict[str, Any]:
        found = self._api("GET", f"/api/3.0/mlflow/traces/tr-{trace_id}")
        if found.status == 404:
            raise NotYet(f"{self.where()} has no trace tr-{trace_id} yet")
        if found.status != 200 or not isinstance(found.body, dict):
            raise (NotYet if found.status >= 500 else BackendError)(
                f"{self.where()}: reading trace tr-{trace_id}: {_detail(found)}"
            )
        return found.body.get("trace", {}).get("trace_info", {})  # type: ignore[no-any-return]

    def _scores(self, outcome: RolloutOutcome) -> list[dict[str, Any]]:
        """gymtrace's ``reward`` assessments of this rollout on its trace."""
        info = self._trace_info(outcome.trace_id)
        return [
            a
            for a in info.get("assessments", [])
            if a.get("assessment_name") == c.SCORE_REWARD
            and a.get("source", {}).get("source_id") == c.SCORE_SOURCE
            and (a.get("metadata") or {}).get(c.ROLLOUT_ID) == outcome.rollout_id
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
        span_id = _scored_span(outcome)
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
                f"{self.where()} refused the reward of rollout {outcome.rollout_id}: {_detail(response)}"
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
                    f"{self.where()}: tagging trace tr-{outcome.trace_id}: {_detail(response)}"
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
                    f"{self.where()}: logging the counts of run {run_id!r}: {_detail(response)}"
                )


class PhoenixClient(Client):
    backend = _settings.BACKEND_PHOENIX

    def __init__(self, url: str | None, experiment: str) -> None:
        super().__init__(url, experiment)
        self._checked = False

    def prepare(self) -> None:
        if self._checked:
            return
        # Phoenix creates a project when its first span arrives; asking for the project list tells
        # a Phoenix server from anything else listening there.
        found = _request("GET", self.base + "/v1/projects?limit=1")
        if found.status >= 500:
            raise NotYet(f"{self.where()}: {_detail(found)}")
        if found.status != 200 or not isinstance(found.body, dict) or "data" not in found.body:
            raise BackendError(
                f"{self.base} is not an Arize Phoenix server (GET /v1/projects answered {found.status}):"
                " point the endpoint at Phoenix's base URL, or set the backend that runs there"
                " (GYMTRACE_BACKEND, --backend)"
            )
        self._checked = True

    def send(self, spans: Sequence[SpanData]) -> None:
        self.prepare()
        self._post_spans(spans, {})

    def score(self, outcome: RolloutOutcome, attempt: int) -> None:
        assert outcome.reward is not None
        span_id = _scored_span(outcome)
        if span_id is None:
            return
        annotation = {
            "span_id": span_id,
            "name": c.SCORE_REWARD,
            "annotator_kind": "CODE",
            # Same name, span and identifier: an update, never a second annotation.
            "identifier": c.SCORE_SOURCE,
            "result": {"score": outcome.reward, "label": outcome.outcome},
            "metadata": {c.ROLLOUT_ID: outcome.rollout_id, c.SCORE_ATTEMPT: attempt},
        }
        response = _request("POST", self.base + "/v1/span_annotations?sync=true", {"data": [annotation]})
        if response.status == 404:
            raise NotYet(f"{self.where()} has no span {span_id} yet")
        if response.status >= 400:
            raise (NotYet if response.status >= 500 else BackendError)(
                f"{self.where()} refused the reward of rollout {outcome.rollout_id}: {_detail(response)}"
            )


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


def _scored_span(outcome: RolloutOutcome) -> str | None:
    """The span the score belongs to: the rollout's root, else the record that decided."""
    span = outcome.root or outcome.decided_by
    return span.span_id if span is not None else None


def client(backend: str, url: str | None, experiment: str) -> Client:
    if backend == _settings.BACKEND_MLFLOW:
        return MlflowClient(url, experiment)
    if backend == _settings.BACKEND_PHOENIX:
        return PhoenixClient(url, experiment)
    raise ValueError(f"backend must be one of {_settings.BACKENDS[1:]}, got {backend!r}")


# -- outcomes ---------------------------------------------------------------------------------------


def _outcome_inputs(span: SpanData) -> bool:
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


# -- live: the exporter the export queue drives -----------------------------------------------------


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
            while self._jobs or self._busy:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._lock.wait(min(remaining, 0.05))
        return True

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
                if not _outcome_inputs(span):
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


# -- gymtrace push ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PushResult:
    spans: int
    rollouts: int
    scored: int
    runs: tuple[str, ...]


def push(
    client: Client,
    spans: Sequence[SpanData],
    *,
    wait: float = 60.0,
) -> PushResult:
    """Send ``spans`` (read from trace files) and their rollouts' scores; raises ``BackendError``
    with the fix, or ``NotYet`` when the server cannot be reached. Idempotent: spans are stored by
    their IDs, scores and tags updated in place, runs found by their ``gym.run.id`` tag."""
    data = [s for s in spans if s.attributes.get(c.KIND) != c.KIND_LIVE]
    client.prepare()
    for start in range(0, len(data), PUSH_CHUNK):
        client.send(data[start : start + PUSH_CHUNK])
    outcomes = decided(data)
    deadline = time.monotonic() + wait
    jobs: list[tuple[str, Callable[[], None]]] = []
    for outcome, attempt in outcomes:
        jobs.append(
            (f"the outcome tag of rollout {outcome.rollout_id!r}", partial(client.tag_outcome, outcome))
        )
        if outcome.outcome == c.OUTCOME_SCORED and outcome.reward is not None:
            jobs.append(
                (
                    f"the reward of rollout {outcome.rollout_id!r}",
                    partial(client.score, outcome, attempt),
                )
            )
    by_run: dict[str, list[RolloutOutcome]] = collections.defaultdict(list)
    for outcome, _ in outcomes:
        if outcome.run_id is not None:
            by_run[outcome.run_id].append(outcome)
    for run_id, run_outcomes in by_run.items():
        jobs.append((f"the counts of run {run_id!r}", partial(client.run_ended, run_id, run_outcomes)))
    pause = 0.2
    for describe, call in jobs:
        while True:
            try:
                call()
                break
            except NotYet as exc:
                if time.monotonic() >= deadline:
                    raise NotYet(f"{describe}: {exc}") from exc
                time.sleep(pause)
                pause = min(SCORE_BACKOFF_MAX, pause * 2)
    scored = sum(1 for o, _ in outcomes if o.outcome == c.OUTCOME_SCORED)
    return PushResult(len(data), len(outcomes), scored, tuple(sorted(by_run)))
