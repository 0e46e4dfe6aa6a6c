"""Content capture: prompts, messages, tool arguments and tool results, off by default.

``gymtrace.record_content`` records nothing unless capture is on (docs/content-capture.md); a value then is:

1. copied into plain JSON data through the built-in methods of ``dict``, ``list``, ``tuple``,
   ``str``, ``int``, ``float``, ``bool`` and ``None`` only (never the user's ``__repr__`` or
   ``__iter__``), stopping once the byte budget is spent (``copying``);
2. redacted: secret-looking keys, then the user's hook, which sees only the copy (``redaction``);
3. serialised and cut, visibly, to the per-value and per-span budgets (``serialising``, ``ledger``),
   which keep an OTLP request under gRPC's 4 MiB (``batching``).

Modules in import order: ``policy`` (modes, budgets, the hook), ``redaction``, ``copying``,
``serialising``, ``ledger``, ``batching``, ``recording`` (:func:`record_on`).
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
