"""Recording content on a span: what ``gymtrace.record_content`` does once it found its target."""

from __future__ import annotations

from typing import Any

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
from gymtrace._model.settings import EVENT_ONLY, NO_CONTENT, SPAN_AND_EVENT, SPAN_ONLY

__all__ = ["capturing", "record_on"]


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
