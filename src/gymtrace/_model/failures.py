"""What failed, and whether trying again can help: the one retry classification.

Used for an exception escaping an episode, :func:`gymtrace.record_failure` without ``retryable=``
and the default of :func:`gymtrace.attempts` (``retry_on=None``). Retries are for infrastructure; a
bug in harness code (``KeyError``, ``TypeError``, ...) fails the same way every time, so it ends the
rollout at once, unscored, kind ``error``, ``gym.failure.retryable=false``. Infrastructure:

- ``TimeoutError`` → kind ``timeout``; any other ``OSError`` → ``infrastructure``;
- httpx's ``TransportError`` (its ``TimeoutException`` → ``timeout``) and ``HTTPStatusError`` for a
  5xx or 429; aiohttp's ``ClientConnectionError``, and ``ClientResponseError`` for a 5xx or 429.

httpx and aiohttp are looked up in ``sys.modules``, never imported: an exception of a library that
was never imported cannot have been raised.
"""

from __future__ import annotations

import sys
from typing import Any

from opentelemetry.trace import Status, StatusCode

from gymtrace import _constants as c

# Kinds retried unless the caller says otherwise.
_RETRYABLE_KINDS = frozenset({c.FAILURE_INFRASTRUCTURE, c.FAILURE_TIMEOUT})


def retryable_by_default(kind: str) -> bool:
    """Whether a failure of ``kind`` is retried when nobody said (``infrastructure``, ``timeout``)."""
    return kind in _RETRYABLE_KINDS


def _overloaded(status: object) -> bool:
    return isinstance(status, int) and (status >= 500 or status == 429)


def _http_library_kind(exc: BaseException) -> str | None:
    httpx = sys.modules.get("httpx")
    if httpx is not None:
        if isinstance(exc, getattr(httpx, "TimeoutException", ())):
            return c.FAILURE_TIMEOUT
        if isinstance(exc, getattr(httpx, "TransportError", ())):
            return c.FAILURE_INFRASTRUCTURE
        if isinstance(exc, getattr(httpx, "HTTPStatusError", ())):
            response = getattr(exc, "response", None)
            if _overloaded(getattr(response, "status_code", None)):
                return c.FAILURE_INFRASTRUCTURE
    aiohttp = sys.modules.get("aiohttp")
    if aiohttp is not None:
        if isinstance(exc, getattr(aiohttp, "ClientConnectionError", ())):
            return c.FAILURE_INFRASTRUCTURE
        if isinstance(exc, getattr(aiohttp, "ClientResponseError", ())) and _overloaded(
            getattr(exc, "status", None)
        ):
            return c.FAILURE_INFRASTRUCTURE
    return None


def classify(exc: BaseException) -> tuple[str, bool]:
    """``(failure kind, retryable)`` of an exception, by the rules in this module's docstring."""
    if isinstance(exc, TimeoutError):
        return c.FAILURE_TIMEOUT, True
    kind = _http_library_kind(exc)
    if kind is not None:
        return kind, True
    if isinstance(exc, OSError):
        return c.FAILURE_INFRASTRUCTURE, True
    return c.FAILURE_ERROR, False


def classify_as_told(
    exc: BaseException, retry_on: type[BaseException] | tuple[type[BaseException], ...]
) -> tuple[str, bool]:
    """``(kind, retryable)`` when the caller named what to retry: what matches ``retry_on`` is, by the
    vocabulary, an infrastructure failure (a timeout for ``TimeoutError``); the rest an ``error``."""
    if isinstance(exc, retry_on):
        return (c.FAILURE_TIMEOUT if isinstance(exc, TimeoutError) else c.FAILURE_INFRASTRUCTURE), True
    return c.FAILURE_ERROR, False


def qualified_name(cls: type) -> str:
    """``error.type`` of an exception class: fully qualified, as the semantic conventions recommend
    (``builtins`` and ``__main__`` classes by their bare name)."""
    module = cls.__module__
    return cls.__qualname__ if module in ("builtins", "__main__") else f"{module}.{cls.__qualname__}"


def record_error(span: Any, exc: BaseException, timestamp: int | None = None) -> None:
    """Record ``exc`` on ``span`` as gymtrace records an exception that escaped a scope, like
    ``use_span``: an exception event (at ``timestamp``, default now), an ERROR status with the
    exception's description, and ``error.type``."""
    span.record_exception(exc, timestamp=timestamp)
    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
    span.set_attribute(c.ERROR_TYPE, qualified_name(type(exc)))
