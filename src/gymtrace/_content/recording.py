"""``record_content``: content on the current model call, tool call or agent invocation."""

from __future__ import annotations

from typing import Any, Final

from gymtrace import _constants as c
from gymtrace._content.ledger import ledger_of, ledgers_lock
from gymtrace._content.policy import (
    MIN_PIECE,
    capture_mode,
    current_policy,
    max_span_bytes,
    max_value_bytes,
)
from gymtrace._content.serialising import fit, serialise, utf8
from gymtrace._errors import GymTraceError, internal_error
from gymtrace._scope import ActiveScope
from gymtrace._settings import EVENT_ONLY, NO_CONTENT, SPAN_AND_EVENT, SPAN_ONLY

__all__ = ["capturing", "record_content", "record_on"]

_TARGET_KINDS: Final = (c.KIND_MODEL_CALL, c.KIND_TOOL_CALL, c.KIND_AGENT_INVOCATION)
# Per level: (input attribute, output attribute, the event that carries both when events are on).
_KEYS: Final = {
    c.KIND_MODEL_CALL: (
        c.GEN_AI_INPUT_MESSAGES,
        c.GEN_AI_OUTPUT_MESSAGES,
        c.GEN_AI_CLIENT_INFERENCE_OPERATION_DETAILS,
    ),
    c.KIND_AGENT_INVOCATION: (c.GEN_AI_INPUT_MESSAGES, c.GEN_AI_OUTPUT_MESSAGES, c.CONTENT_EVENT),
    c.KIND_TOOL_CALL: (c.GEN_AI_TOOL_CALL_ARGUMENTS, c.GEN_AI_TOOL_CALL_RESULT, c.CONTENT_EVENT),
}


def capturing() -> bool:
    """Whether content capture is on at all (the cheap check before finding a target)."""
    return capture_mode() != NO_CONTENT


def record_on(span: Any, keys: tuple[str, str, str], input: object, output: object) -> None:
    """Record ``input``/``output`` on ``span`` under the capture mode, budgets and redaction in force.

    ``keys``: the input and output attribute and the event that carries both when events are on.
    """
    mode = capture_mode()
    if mode == NO_CONTENT or (input is None and output is None):
        return
    if not span.is_recording():
        return  # sampled out: skip the work
    _record(keys, span, mode, input, output)


def record_content(input: object = None, output: object = None, *, scope: ActiveScope | None = None) -> None:
    """Record content on the current model call, tool call or agent invocation. Off by default.

    On a model call or agent invocation ``input``/``output`` become ``gen_ai.input.messages`` /
    ``gen_ai.output.messages``; on a tool call, ``gen_ai.tool.call.arguments`` /
    ``gen_ai.tool.call.result``. ``None`` means "not given". Pass plain data (dicts, lists,
    strings, numbers): other objects are recorded as ``"<ClassName>"``, never by calling their
    methods. Recorded only when ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` (or
    ``configure(capture_content=...)``) turns capture on; then as span attributes (``SPAN_ONLY``),
    one span event (``EVENT_ONLY``: ``gen_ai.client.inference.operation.details`` on model calls,
    ``gym.content`` otherwise) or both. Values are redacted and cut to their budgets; nothing of
    the caller's is mutated. Never raises (except in strict mode, for misuse).
    """
    if not capturing() or (input is None and output is None):
        return
    try:
        from gymtrace._record import _target

        _, target = _target(scope, _TARGET_KINDS, "record_content")
        if target is None:
            return
        record_on(target.span, _KEYS[target.kind], input, output)
    except GymTraceError:
        raise
    except Exception as exc:  # noqa: BLE001 - telemetry must not break the caller
        internal_error("record_content", exc)


def _record(keys: tuple[str, str, str], span: Any, mode: str, input: object, output: object) -> None:
    policy = current_policy()
    on_span = mode in (SPAN_ONLY, SPAN_AND_EVENT)
    on_event = mode in (EVENT_ONLY, SPAN_AND_EVENT)
    copies = 2 if on_span and on_event else 1  # SPAN_AND_EVENT stores each value twice
    value_limit = max_value_bytes()
    span_limit = max_span_bytes()
    input_key, output_key, event_name = keys

    # Serialise outside the lock, against a snapshot of the span's budget ...
    with ledgers_lock:
        planned = ledger_of(span).copy()
    texts: list[tuple[str, str]] = []
    for key, value in ((input_key, input), (output_key, output)):
        if value is None:
            continue
        limit = min(value_limit, planned.available(span_limit, key, on_span) // copies)
        text = serialise(key, value, limit, policy.redact) if limit >= MIN_PIECE else ""
        if on_span:
            planned.attributes[key] = len(utf8(text))
        if on_event:
            planned.events += len(utf8(text))
        texts.append((key, text))

    # ... then commit, cutting again if another thread recorded on this span meanwhile.
    final: dict[str, str] = {}
    with ledgers_lock:
        ledger = ledger_of(span)
        omitted_before = ledger.omitted
        for key, text in texts:
            per_copy = ledger.available(span_limit, key, on_span) // copies
            if not text or per_copy < MIN_PIECE:
                ledger.omitted += 1
                continue
            text = fit(text, per_copy)
            size = len(utf8(text))
            if on_span:
                ledger.attributes[key] = size
            if on_event:
                ledger.events += size
            final[key] = text
        omitted = ledger.omitted if ledger.omitted != omitted_before else 0
    if on_span:
        for key, text in final.items():
            span.set_attribute(key, text)
    if on_event and final:
        span.add_event(event_name, final)
    if omitted:
        span.set_attribute(c.CONTENT_OMITTED, omitted)
