"""The mapping: the names MLflow and Phoenix read, added to each span, and the OTLP request.

Both servers take OTLP/HTTP protobuf at ``/v1/traces`` and keep every ``gym.*`` attribute, but their
UIs and searches read names of their own. These are pure functions of a span (no HTTP, no state):
the live exporter and ``gymtrace push`` encode the same request from the same spans.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Mapping, Sequence
from typing import Any

from gymtrace import _constants as c
from gymtrace._model import settings as _settings
from gymtrace._model.spandata import SpanData

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
# OpenInference has no chat kind of its own: a chat is an LLM span there.
_OPENINFERENCE_OPERATIONS = {**_MLFLOW_OPERATIONS, c.OPERATION_CHAT: "LLM"}
_TAGGED = (c.RUN_ID, c.TASK_ID, c.ROLLOUT_ID, c.ROLLOUT_OUTCOME, c.ROLLOUT_ATTEMPTS, c.PUSH_ORIGINAL_TRACE_ID)


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
