"""MLflow 3 and Arize Phoenix as trace backends: ``GYMTRACE_BACKEND=mlflow|phoenix`` and ``gymtrace push``.

Both take OTLP/HTTP protobuf at ``/v1/traces``; gymtrace adds the names their UIs read to each span
on its way out and turns each scored rollout's reward into the server's score named ``reward``:

- :mod:`.mapping`: those names and the OTLP request, pure functions of the spans;
- :mod:`.client`: requests over ``urllib`` (no server client package), failing as ``BackendError``
  (a fix for the user) or ``NotYet`` (retried);
- :mod:`.mlflow`, :mod:`.phoenix`: each server's REST API;
- :mod:`.scores`: each rollout's outcome, and the daemon thread that sends scores until they land;
- :mod:`.exporter`: what the export queue drives; :mod:`.push`: ``gymtrace push`` over files.

Nothing here raises into the application: what could not be sent is counted and warned about once.
"""

from __future__ import annotations

from gymtrace._sdk.backends.client import BackendError, Client, NotYet
from gymtrace._sdk.backends.exporter import BackendExporter, client, flush_scores, score_stats
from gymtrace._sdk.backends.mapping import encode_request, mapped_attributes
from gymtrace._sdk.backends.mlflow import MlflowClient
from gymtrace._sdk.backends.phoenix import PhoenixClient
from gymtrace._sdk.backends.push import PushResult, push
from gymtrace._sdk.backends.scores import ScoreSender, decided

__all__ = [
    "BackendError",
    "BackendExporter",
    "Client",
    "MlflowClient",
    "NotYet",
    "PhoenixClient",
    "PushResult",
    "ScoreSender",
    "client",
    "decided",
    "encode_request",
    "flush_scores",
    "mapped_attributes",
    "push",
    "score_stats",
]
