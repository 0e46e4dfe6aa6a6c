"""Per-span content budgets: what content one span already carries."""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Any

__all__ = ["Ledger", "ledger_of", "ledgers_lock"]


class Ledger:
    """Content bytes already on one span: its content attributes (overwritten when recorded again)
    and its content events (added up)."""

    __slots__ = ("attributes", "events", "omitted")

    def __init__(self) -> None:
        self.attributes: dict[str, int] = {}
        self.events = 0
        self.omitted = 0

    def available(self, limit: int, key: str, on_span: bool) -> int:
        spent = sum(self.attributes.values()) + self.events
        if on_span:
            spent -= self.attributes.get(key, 0)  # recording it again replaces it
        return limit - spent

    def copy(self) -> Ledger:
        other = Ledger()
        other.attributes = dict(self.attributes)
        other.events = self.events
        return other


# Weak keys: an entry goes away with its span.
_ledgers: weakref.WeakKeyDictionary[Any, Ledger] = weakref.WeakKeyDictionary()
ledgers_lock = threading.Lock()


def ledger_of(span: Any) -> Ledger:
    found = _ledgers.get(span)
    if found is None:
        found = Ledger()
        # A span type without weak references gets a budget per call only.
        with contextlib.suppress(TypeError):
            _ledgers[span] = found
    return found
