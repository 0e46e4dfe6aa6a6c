"""Content capture: prompts, messages, tool arguments and tool results, off by default.

Example::

    import gymtrace

    with gymtrace.model_call(model="qwen-7b"):
        reply = client.chat(messages)
        gymtrace.record_content(input=messages, output=[reply])   # nothing unless capture is on

    with gymtrace.tool_call(tool_name="search"):
        result = search(**arguments)
        gymtrace.record_content(input=arguments, output=result)

The trace is not the trajectory record: by default nothing is recorded
(docs/content-capture.md). ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` (or
``configure(capture_content=...)``) turns it on. Then every value is

1. copied into plain JSON data by walking only ``dict``, ``list``, ``tuple``, ``str``, ``int``,
   ``float``, ``bool`` and ``None`` through their built-in methods (never the user's ``__repr__``,
   ``__iter__``, properties, ...); anything else becomes ``"<ClassName>"``; cycles, deep nesting,
   bytes and non-finite floats become short markers; the walk stops once the byte budget is spent,
   so a huge value costs no more than a small one (``copying``);
2. redacted: values under keys that look like secrets become ``"[REDACTED]"``, then the user's
   redaction hook (if any) sees the copy, never the original (``redaction``, ``policy``);
3. serialised to JSON text and cut to the per-value and per-span byte budgets, visibly
   (``…[truncated N bytes]``; ``serialising``, ``ledger``).

The budgets are what keeps an OTLP export request under gRPC's 4 MiB limit; see
:func:`~gymtrace._content.batching.export_batch_limit` for the arithmetic.

The modules, in import order: ``policy`` (modes, budgets, the redaction hook and keys),
``redaction``, ``copying``, ``serialising``, ``ledger`` (per-span budgets), ``batching`` (OTLP
batch sizing) and ``recording`` (:func:`record_on`, what ``gymtrace.record_content`` calls).
"""

from gymtrace._content.batching import export_batch_limit, export_settings, otlp_batch_size
from gymtrace._content.policy import (
    DEFAULT_MAX_SPAN_BYTES,
    DEFAULT_MAX_VALUE_BYTES,
    DEFAULT_SECRET_KEYS,
    GRPC_MESSAGE_LIMIT,
    MAX_SPAN_BYTES,
    MIN_VALUE_BYTES,
    REQUEST_OVERHEAD,
    SPAN_OVERHEAD,
    UNCHANGED,
    apply_content_changes,
    capture_mode,
    configure_content,
    content_changes,
    current_policy,
    is_secret_key,
    max_span_bytes,
    max_value_bytes,
    reset_content_policy,
)
from gymtrace._content.recording import capturing, record_on
from gymtrace._content.redaction import REDACTED
from gymtrace._content.serialising import fit, serialise
from gymtrace._model.settings import CAPTURE_MODES as MODES
from gymtrace._model.settings import EVENT_ONLY, NO_CONTENT, SPAN_AND_EVENT, SPAN_ONLY

__all__ = [
    "DEFAULT_MAX_SPAN_BYTES",
    "DEFAULT_MAX_VALUE_BYTES",
    "DEFAULT_SECRET_KEYS",
    "EVENT_ONLY",
    "GRPC_MESSAGE_LIMIT",
    "MAX_SPAN_BYTES",
    "MIN_VALUE_BYTES",
    "MODES",
    "NO_CONTENT",
    "REDACTED",
    "REQUEST_OVERHEAD",
    "SPAN_AND_EVENT",
    "SPAN_ONLY",
    "SPAN_OVERHEAD",
    "UNCHANGED",
    "apply_content_changes",
    "capture_mode",
    "capturing",
    "configure_content",
    "content_changes",
    "current_policy",
    "export_batch_limit",
    "export_settings",
    "fit",
    "is_secret_key",
    "max_span_bytes",
    "max_value_bytes",
    "otlp_batch_size",
    "record_on",
    "reset_content_policy",
    "serialise",
]
