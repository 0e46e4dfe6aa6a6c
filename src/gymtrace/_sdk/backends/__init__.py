"""MLflow 3 and Arize Phoenix as trace backends: ``GYMTRACE_BACKEND=mlflow|phoenix`` and ``gymtrace push``.

Both servers take OTLP/HTTP protobuf at ``/v1/traces`` and keep every ``gym.*`` attribute, but their
UIs and searches read names of their own; gymtrace adds those names to each span on its way out and
turns each scored rollout's reward into the server's own score, named ``reward``. By concern:

- :mod:`.mapping`: the names each server reads (span types and kinds, trace tags, sessions,
  metadata) and the OTLP request, pure functions of the spans;
- :mod:`.client`: what gymtrace asks of a backend, over HTTP (the standard library's ``urllib``:
  neither server's client package is needed), and the two ways a request fails (``BackendError``,
  a fix for the user; ``NotYet``, retried);
- :mod:`.mlflow` and :mod:`.phoenix`: each server's REST API (experiment and runs, assessments and
  tags; project and span annotations);
- :mod:`.scores`: each rollout's outcome by the readers' one rule, and the daemon thread that sends
  scores, tags and run counts until they land;
- :mod:`.exporter`: the exporter gymtrace's export queue drives, on its worker thread;
- :mod:`.push`: ``gymtrace push``, the same mapping and clients, synchronously, over trace files.

Nothing here raises into the application: what could not be sent is counted
(:func:`gymtrace.export_stats`) and warned about once. ``gymtrace push`` reports a problem as one
line naming the fix.
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
