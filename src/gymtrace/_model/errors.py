"""gymtrace's exceptions and its policy for its own failures.

Telemetry must never break the code it observes: an error inside gymtrace is logged once through
``logging.getLogger("gymtrace")`` and swallowed. Contract problems in user code (inverted
nesting, invalid identity arguments) are warnings by default. Strict mode raises both instead, so a
bug in gymtrace (or in how a test uses it) is loud where someone is watching. Strict mode comes
only from ``GYMTRACE_STRICT=true``, ``configure(strict=True)`` or :mod:`gymtrace.testing`
(``strict()``, ``capture_spans()``): never from the test runner's environment, so a user's test
suite and its subprocesses run the code production runs (issue 31).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

from gymtrace._model import settings as _settings

# Defined below the settings object, which raises InvalidArgumentError; re-exported from here.
from gymtrace._model.exceptions import GymTraceError as GymTraceError
from gymtrace._model.exceptions import HierarchyViolationError as HierarchyViolationError
from gymtrace._model.exceptions import InvalidArgumentError as InvalidArgumentError

logger = logging.getLogger("gymtrace")

F = TypeVar("F", bound=Callable[..., Any])


_seen: set[object] = set()
_seen_lock = threading.Lock()


def set_strict(value: bool | None) -> None:
    """Force strict mode on or off; ``None`` goes back to ``GYMTRACE_STRICT``."""
    _settings.override(strict=value)


def strict_override() -> bool | None:
    value = _settings.current_overrides().get("strict")
    return None if value is None else bool(value)


def is_strict() -> bool:
    return _settings.active.strict


def first_time(key: object) -> bool:
    """True the first time ``key`` is seen in this process; used to log each problem once."""
    with _seen_lock:
        if key in _seen:
            return False
        _seen.add(key)
        return True


def reset_seen() -> None:
    with _seen_lock:
        _seen.clear()


def internal_error(where: str, exc: BaseException, *, may_raise: bool = True) -> None:
    """Handle a failure of gymtrace's own code.

    ``may_raise=False`` is for paths where a user exception is already propagating: replacing it
    with ours would change what the user's code raises.
    """
    if may_raise and is_strict():
        raise exc
    if first_time((where, type(exc))):
        logger.warning("gymtrace: internal error in %s; tracing continues", where, exc_info=exc)


def data_lost(error: GymTraceError) -> None:
    """Something user code recorded cannot be attributed and is dropped: raise in strict mode, else
    a WARNING every time (each loss is a different datum; logging it once would hide the rest)."""
    if is_strict():
        raise error
    logger.warning("gymtrace: %s", error)


def contract_problem(key: object, error: GymTraceError) -> None:
    """Report a problem in how user code uses gymtrace: raise in strict mode, else warn once per key."""
    if is_strict():
        raise error
    if first_time(key):
        logger.warning("gymtrace: %s", error)


def contain(where: str, exc: Exception, *, may_raise: bool = True) -> None:
    """What :class:`guard` does with an exception raised inside it, for code that catches the
    exception itself: the start and end of every span, where a ``with guard`` costs two Python
    calls. A :class:`GymTraceError` is raised again; any other goes to :func:`internal_error`."""
    if isinstance(exc, GymTraceError):
        raise exc
    internal_error(where, exc, may_raise=may_raise)


class guard:
    """Contain gymtrace's own failures: a context manager and a decorator.

    An ``Exception`` raised inside is handed to :func:`internal_error` (logged once, swallowed;
    raised in strict mode); a decorated function then returns ``None``.
    :class:`GymTraceError` passes through: it is a contract problem that strict mode raised on
    purpose. ``BaseException`` (``KeyboardInterrupt``, cancellation) always passes through.
    ``may_raise=False`` is for code that runs while a user exception propagates.
    """

    __slots__ = ("may_raise", "where")

    def __init__(self, where: str, *, may_raise: bool = True) -> None:
        self.where = where
        self.may_raise = may_raise

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        if exc is None or not isinstance(exc, Exception) or isinstance(exc, GymTraceError):
            return False
        internal_error(self.where, exc, may_raise=self.may_raise)
        return True

    def __call__(self, func: F) -> F:
        @functools.wraps(func)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            with self:
                return func(*args, **kwargs)
            return None

        return guarded  # type: ignore[return-value]  # same signature; None only after a contained error
