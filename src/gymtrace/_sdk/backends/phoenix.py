"""Arize Phoenix as a backend: the project, and the ``reward`` as a span annotation, over its REST API.

The project is ``GYMTRACE_EXPERIMENT`` (the resource attribute ``openinference.project.name`` the
mapping sets; Phoenix creates it when its first span arrives). The reward is an annotation on the
rollout's root whose name and identifier make a second one an update, never a second annotation.
"""

from __future__ import annotations

from collections.abc import Sequence

from gymtrace import _constants as c
from gymtrace._model import settings as _settings
from gymtrace._model.spandata import SpanData
from gymtrace._read.outcomes import RolloutOutcome
from gymtrace._sdk.backends.client import BackendError, Client, NotYet, detail, http_request, scored_span


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
