"""``gymtrace.attempts()``: the retry loop of a rollout, one episode per attempt.

Example::

    with gymtrace.rollout(rollout_id=row_id):
        for attempt in gymtrace.attempts(max_attempts=3):
            with attempt:
                reward = run_episode(row)     # an exception here fails this attempt

Each attempt is an episode with the next attempt number, linked to the previous one. Only
infrastructure is retried (``TimeoutError``, other ``OSError``, httpx/aiohttp transport errors and
5xx/429, or what ``retry_on=`` matches); anything else fails the attempt with kind ``error`` and
ends the loop, the rollout unscored. The loop's decisions never depend on whether tracing is on.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import TracebackType
from typing import Any

from gymtrace import _constants as c
from gymtrace._model.errors import InvalidArgumentError
from gymtrace._model.failures import classify, classify_as_told, retryable_by_default
from gymtrace._model.ids import check_timeout
from gymtrace._scopes.active_scope import ActiveScope
from gymtrace._scopes.live import deadline
from gymtrace._scopes.scope import CANCELLATION, Scope


class Attempt:
    """One attempt: a context manager (sync or async) around one episode."""

    def __init__(self, loop: Attempts, index: int, previous: ActiveScope | None) -> None:
        self._loop = loop
        self.index = index
        self._previous = previous
        self._scope: Scope | None = None
        self.scope: ActiveScope | None = None
        self._failure: tuple[str, bool, str | None] | None = None
        self._timer: deadline | None = None

    @property
    def number(self) -> int:
        """The attempt number (``gym.episode.attempt`` when traced, else the loop index)."""
        if self.scope is not None and self.scope.attempt is not None:
            return self.scope.attempt
        return self.index

    @property
    def is_last(self) -> bool:
        return self.index + 1 >= self._loop.max_attempts

    def fail(
        self,
        kind: str = c.FAILURE_INFRASTRUCTURE,
        *,
        retryable: bool | None = None,
        message: str | None = None,
    ) -> None:
        """Fail this attempt without raising; the loop retries if ``retryable`` (default: by kind)."""
        if retryable is None:
            retryable = retryable_by_default(kind)
        self._failure = (kind, retryable, message)
        if self.scope is not None:
            self.scope.record_failure(kind, retryable=retryable, message=message)

    def __enter__(self) -> Attempt:
        loop = self._loop
        source = None
        if self._previous is not None and self._previous.kind == c.KIND_EPISODE:
            source = (c.RELATION_RESTORE if loop.restore else c.RELATION_RETRY, self._previous)
        self._scope = Scope(
            c.KIND_EPISODE, {"attributes": loop.attributes, "timeout": loop.timeout}, source=source
        )
        self.scope = self._scope.__enter__()
        loop._entered = True
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        loop = self._loop
        retry = False
        if isinstance(exc, Exception):
            kind, retryable = classify(exc) if loop.retry_on is None else classify_as_told(exc, loop.retry_on)
            if self._failure is None:
                self._failure = (kind, retryable, None)
                if self.scope is not None and self.scope.kind == c.KIND_EPISODE:
                    self.scope.fail_unless_classified(kind, retryable)
            retry = self._failure[1]
        elif exc is None and self._failure is not None:
            retry = self._failure[1]
        if self._scope is not None:
            self._scope.__exit__(exc_type, exc, tb)
        if self.scope is not None and self.scope.kind == c.KIND_EPISODE:
            loop._previous = self.scope
        loop.attempts_made += 1
        if exc is None and self._failure is None:
            loop.succeeded = True
            loop._done = True
            return False
        if isinstance(exc, CANCELLATION) or not retry or self.is_last:
            loop._done = True
            loop.last_error = exc if isinstance(exc, Exception) else loop.last_error
            return exc is not None and isinstance(exc, Exception) and not loop.reraise
        loop.last_error = exc if isinstance(exc, Exception) else None
        return exc is not None  # retrying: the exception was recorded on the failed episode

    async def __aenter__(self) -> Attempt:
        timeout = self._loop.timeout
        if timeout is not None:
            # Entered before the episode, left after it: a body past the timeout is cancelled and
            # the attempt fails with a TimeoutError (kind `timeout`, retryable), whether traced or not.
            self._timer = deadline(timeout)
            await self._timer.__aenter__()
        return self.__enter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        timer, self._timer = self._timer, None
        if timer is not None:
            try:
                await timer.__aexit__(exc_type, exc, tb)
            except TimeoutError as timed_out:
                if not self.__exit__(TimeoutError, timed_out, timed_out.__traceback__):
                    raise
                return True  # retried: the next attempt runs
        return self.__exit__(exc_type, exc, tb)


class Attempts:
    """Iterator of :class:`Attempt` objects; see :func:`gymtrace.attempts`."""

    def __init__(
        self,
        max_attempts: int,
        *,
        retry_on: type[BaseException] | tuple[type[BaseException], ...] | None = None,
        restore: bool = False,
        reraise: bool = True,
        attributes: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> None:
        check_timeout("attempts", timeout)
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise InvalidArgumentError(
                f"gymtrace.attempts(): argument 'max_attempts' must be an int >= 1, got {max_attempts!r}"
            )
        self.max_attempts = max_attempts
        self.retry_on = retry_on
        self.restore = restore
        self.reraise = reraise
        self.attributes = attributes
        self.timeout = timeout
        self.succeeded = False
        self.attempts_made = 0
        self.last_error: BaseException | None = None
        self._done = False
        self._entered = False
        self._previous: ActiveScope | None = None

    def __iter__(self) -> Iterator[Attempt]:
        for index in range(self.max_attempts):
            if self._done:
                return
            self._entered = False
            yield Attempt(self, index, self._previous)
            if not self._entered:
                return  # the loop body did not use `with attempt:`; nothing to retry


def attempts(
    max_attempts: int,
    *,
    retry_on: type[BaseException] | tuple[type[BaseException], ...] | None = None,
    restore: bool = False,
    reraise: bool = True,
    attributes: dict[str, Any] | None = None,
    timeout: float | None = None,
) -> Attempts:
    """Up to ``max_attempts`` episodes of the enclosing rollout, stopping at the first success.

    ``retry_on`` (default ``None``: connection errors, timeouts and other ``OSError``, and httpx /
    aiohttp transport errors and 5xx/429 responses when those libraries are in use) says which
    exceptions are infrastructure failures worth another attempt; any other exception ends the
    rollout at once, unscored, with failure kind ``error``.

    ``restore=True`` opens every attempt after the first as a checkpoint restore of the previous one
    (``gym.episode.restored``), instead of a clean retry. ``attempts.succeeded`` tells, after the
    loop, whether an attempt completed; a rollout whose attempts all failed is unscored.

    ``timeout`` (seconds) bounds each attempt: used as ``async with attempt:``, an attempt still
    running after it is cancelled and fails with kind ``timeout`` (retryable: the loop starts the
    next attempt); used as ``with attempt:`` (sync code cannot be interrupted safely, threads are
    never killed) it gets a ``gym.episode.overdue`` event and ``gymtrace live`` reads it ``stalled``.
    """
    return Attempts(
        max_attempts,
        retry_on=retry_on,
        restore=restore,
        reraise=reraise,
        attributes=attributes,
        timeout=timeout,
    )
