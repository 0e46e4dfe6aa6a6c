"""The contract checker (moved here; split by concern in the next step)."""

from gymtrace._read.check.spans import (
    EXAMPLES,
    awaiting_outcomes,
    check_spans,
    lost_notes,
    missing_service_notes,
    rerun_notes,
)

__all__ = [
    "EXAMPLES",
    "awaiting_outcomes",
    "check_spans",
    "lost_notes",
    "missing_service_notes",
    "rerun_notes",
]
