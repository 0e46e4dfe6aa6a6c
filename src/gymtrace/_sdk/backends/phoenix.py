"""Arize Phoenix as a backend: the project, and the ``reward`` as a span annotation, over its REST API.

The project is ``GYMTRACE_EXPERIMENT`` (the resource attribute ``openinference.project.name`` the
mapping sets; Phoenix creates it when its first span arrives). The reward is an annotation on the
rollout's root whose name and identifier make a second one an update, never a second annotation.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Collection, Iterator, Mapping, Sequence
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

# Trace or span IDs per lookup request (a GET's URL holds them), and spans per page (Phoenix's most).
_BATCH = 50
_PAGE = 1000


class PhoenixClient(Client):
    backend = _settings.BACKEND_PHOENIX
    kind = "project"

    def __init__(self, url: str | None, experiment: str) -> None:
        super().__init__(url, experiment)
        self._checked = False

    def prepare(self) -> None:
        if self._checked:
            return
        # Phoenix creates a project when its first span arrives; asking for the project list tells
        # a Phoenix server from anything else listening there.
        found = http_request("GET", self.base + "/v1/projects?limit=1")
        if found.status >= 500:
            raise NotYet(f"{self.where()}: {detail(found)}")
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
        span_id = scored_span(outcome)
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
        response = http_request("POST", self.base + "/v1/span_annotations?sync=true", {"data": [annotation]})
        if response.status == 404:
            raise NotYet(f"{self.where()} has no span {span_id} yet")
        if response.status >= 400:
            raise (NotYet if response.status >= 500 else BackendError)(
                f"{self.where()} refused the reward of rollout {outcome.rollout_id}: {detail(response)}"
            )

    def _get(self, path: str, query: Sequence[tuple[str, Any]], doing: str) -> dict[str, Any]:
        found: Response = http_request("GET", f"{self.base}{path}?{urllib.parse.urlencode(query)}")
        if found.status != 200 or not isinstance(found.body, dict):
            raise (NotYet if found.status >= 500 else BackendError)(
                f"{self.where()}: {doing}: {detail(found)}"
            )
        return found.body

    def _pages(self, path: str, query: Sequence[tuple[str, Any]], doing: str) -> Iterator[dict[str, Any]]:
        cursor = None
        while True:
            page = self._get(path, [*query, *([("cursor", cursor)] if cursor else [])], doing)
            yield from page.get("data", [])
            cursor = page.get("next_cursor")
            if not cursor:
                return

    def _projects(self) -> list[dict[str, Any]]:
        query = [("limit", 100), ("include_experiment_projects", "true")]
        return list(self._pages("/v1/projects", query, "listing projects"))

    def _spans(self, project_id: str, trace_ids: Sequence[str]) -> Iterator[dict[str, Any]]:
        for start in range(0, len(trace_ids), _BATCH):
            query = [("limit", _PAGE), *(("trace_id", t) for t in trace_ids[start : start + _BATCH])]
            yield from self._pages(f"/v1/projects/{project_id}/spans", query, "reading spans")

    def holders(self, trace_ids: Sequence[str]) -> dict[str, str]:
        self.prepare()
        out: dict[str, str] = {}
        # A span names no project, so each project is asked for the traces not found yet.
        for project in self._projects():
            left = [t for t in trace_ids if t not in out]
            if not left:
                break
            for span in self._spans(str(project["id"]), left):
                out.setdefault(span["context"]["trace_id"], str(project["name"]))
        return out

    def accepted(self, spans: Mapping[str, Collection[str]]) -> Accepted:
        self.prepare()
        project = next((p for p in self._projects() if p["name"] == self.experiment), None)
        if project is None:
            return Accepted(0, frozenset(), 0)
        held: list[str] = []
        traces = set()
        for span in self._spans(str(project["id"]), sorted(spans)):
            trace_id, span_id = span["context"]["trace_id"], span["context"]["span_id"]
            if span_id in spans.get(trace_id, ()):
                held.append(span_id)
                traces.add(trace_id)
        scores = 0
        for start in range(0, len(held), _BATCH):
            query = [
                ("limit", _PAGE),
                ("identifier", c.SCORE_SOURCE),
                *(("span_ids", s) for s in held[start : start + _BATCH]),
            ]
            path = f"/v1/projects/{project['id']}/span_annotations"
            for annotation in self._pages(path, query, "reading span annotations"):
                scores += annotation.get("name") == c.SCORE_REWARD
        return Accepted(len(held), frozenset(traces), scores)
