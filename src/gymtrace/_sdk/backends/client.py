"""What gymtrace asks of a backend (:class:`Client`), over HTTP with the standard library only.

The two ways a request goes wrong are told apart here, once for both servers: :class:`BackendError`
is a problem a user must fix (one line naming the fix), :class:`NotYet` one that time may fix (the
server is down, or does not have the trace yet), which the callers retry. Neither server's client
package is needed.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gymtrace._model import settings as _settings
from gymtrace._model.spandata import SpanData
from gymtrace._read.outcomes import RolloutOutcome
from gymtrace._sdk.backends.mapping import encode_request

DEFAULT_URLS = {
    _settings.BACKEND_MLFLOW: "http://localhost:5000",
    _settings.BACKEND_PHOENIX: "http://localhost:6006",
}
TITLES = {_settings.BACKEND_MLFLOW: "MLflow", _settings.BACKEND_PHOENIX: "Phoenix"}
TRACES_PATH = "/v1/traces"
# Generous: a server on SQLite holds a request while it stores a large batch (and this runs off
# the application's threads).
HTTP_TIMEOUT = 30.0


class BackendError(Exception):
    """A problem a user must fix (wrong server, deleted experiment, a 4xx): one line, naming the fix."""


class NotYet(Exception):
    """The server does not have the trace yet (or cannot be reached now): try again later."""


@dataclass(frozen=True)
class Accepted:
    """What a server holds of the spans gymtrace sent, read back through its API."""

    spans: int  # of the span IDs asked about
    traces: frozenset[str]  # the trace IDs it holds any of them in
    scores: int  # gymtrace's ``reward`` scores on those traces


@dataclass(frozen=True)
class Response:
    status: int
    body: Any


def http_request(
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


def detail(response: Response) -> str:
    body = response.body
    if isinstance(body, dict):
        message = body.get("message") or body.get("detail") or body.get("error_code")
        if message:
            return f"{response.status}: {str(message)[:200]}"
    return str(response.status)


class Client:
    """What gymtrace asks of a backend: find the experiment, take spans, keep scores and tags."""

    backend: str
    kind = "experiment"  # what the server calls the place traces go (Phoenix: "project")

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

    def holders(self, trace_ids: Sequence[str]) -> dict[str, str]:
        """The experiment (project) holding each of ``trace_ids`` that the server holds anywhere."""
        raise NotImplementedError

    def accepted(self, spans: Mapping[str, Collection[str]]) -> Accepted:
        """What this experiment holds of ``spans`` (trace ID -> its span IDs), read back."""
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
        response = http_request(
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
            raise NotYet(f"{self.where()} answered {detail(response)} to {len(spans)} spans")
        if response.status >= 400:
            raise BackendError(f"{self.where()} refused {len(spans)} spans: {detail(response)}")


def scored_span(outcome: RolloutOutcome) -> str | None:
    """The span the score belongs to: the rollout's root, else the record that decided."""
    span = outcome.root or outcome.decided_by
    return span.span_id if span is not None else None
