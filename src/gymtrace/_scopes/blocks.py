"""A Scope as a ``with`` and ``async with`` block: enter, exit, and the cases where they do not pair.

Methods of :class:`~gymtrace._scopes.scope.Scope` (bound in its class body: ``with`` finds them on
the class as before, at no extra call), apart from its activation code (start and finish) because
this is the machinery of blocks: finding the block's own activation at exit (the current
frame, in the usual nested case, in one lookup), blocks entered while nothing records that must not
end an outer block of the same shared scope, exits in another context than the entering one
(ExitStacks handed across tasks or threads), and the awaitables of ``async with`` (finished futures
while nothing records, an episode's timeout). The decorator forms are in ``_scopes/decorate.py``.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable
from threading import get_ident
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from gymtrace._model.errors import GymTraceError, contract_problem
from gymtrace._scopes import live as _live
from gymtrace._scopes import steps as _steps
from gymtrace._scopes.active_scope import DISABLED_SCOPE, SCOPE_KEY, ActiveScope
from gymtrace._scopes.open_scopes import OPEN
from gymtrace._scopes.tracing import active_tracer, attach, current_context, detach, reset

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer


class ScopeLike(Protocol):
    """What the block machinery here and the decorator wrappers (``_scopes/decorate.py``) use of a
    :class:`~gymtrace._scopes.scope.Scope`: typed by this, they sit below it in the import graph."""

    kind: str
    _deadline: float | None
    _timers: dict[object, list[_live.deadline]] | None

    def start(
        self,
        tracer: Tracer,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        site: object = None,
    ) -> ActiveScope | None: ...

    def finish(self, frame: ActiveScope, exc: BaseException | None, result: Any = None) -> None: ...

    def with_default(self, name: str, value: Any) -> ScopeLike: ...


# A `with` block finds its own activation at exit in the OpenTelemetry context it attached: the
# current frame (SCOPE_KEY) is its own in the normal, nested case, which costs one lookup instead of
# a with-stack kept beside the context (a context variable set per block made `with` ~10 % dearer
# than the decorator). One case needs more: a block entered while nothing records, nested in a
# recording block of the same shared Scope (`with step():` inside `with step():`, tracing switched
# off in between), attaches nothing, so the frame current at its exit is the outer block's. Such a
# block is pushed here, (scope, the frame it shadows, the entries below), so that its exit cannot
# end that frame. Empty (None) in every context unless tracing changes while blocks are open.
_SHADOWS: contextvars.ContextVar[tuple[Any, ActiveScope, Any] | None] = contextvars.ContextVar(
    "gymtrace.shadowed_with_blocks", default=None
)
# Set the first time any context shadows a frame; until then an exit need not read _SHADOWS.
_shadowed = False


def _finished(value: Any) -> asyncio.Future[Any]:
    """A future that already holds ``value``: awaiting it returns the value without suspending, in
    any event loop (or none), which is all the disabled ``async with`` needs. Its loop is closed at
    once: a finished future never schedules anything on it."""
    loop = asyncio.new_event_loop()
    try:
        future: asyncio.Future[Any] = loop.create_future()
        future.set_result(value)
        return future
    finally:
        loop.close()


_ENTERED_DISABLED: asyncio.Future[ActiveScope] = _finished(DISABLED_SCOPE)
_EXITED: asyncio.Future[None] = _finished(None)


def enter(self: ScopeLike) -> ActiveScope:
    tracer = active_tracer()
    if tracer is None:
        if OPEN:  # something records somewhere: this block may need to shadow it
            shadow(self)
        return DISABLED_SCOPE
    frame = self.start(tracer)
    if frame is None:  # gymtrace itself failed; the block runs untraced
        shadow(self)
        return DISABLED_SCOPE
    if frame.level is None:
        # A step the aggregate policy does not sample runs in its parent's context: no attach.
        parent = frame.parent
        assert parent is not None
        parent.unsampled = (frame, parent.unsampled)
    else:
        frame.token = attach(frame.context)  # type: ignore[arg-type]
        frame.thread = get_ident()
    return frame


def shadow(self: ScopeLike) -> None:
    """Entered without recording: shadow the current frame if it is this Scope's own."""
    frame = current_context().get(SCOPE_KEY)
    if isinstance(frame, ActiveScope) and frame.owner is self and frame.token is not None:
        global _shadowed
        _shadowed = True
        _SHADOWS.set((self, frame, _SHADOWS.get()))


def exit_block(
    self: ScopeLike,
    exc_type: type[BaseException] | None,
    exc: BaseException | None,
    tb: TracebackType | None,
) -> None:
    if not OPEN and not _steps.aggregating:
        return  # nothing records anywhere (no span, no unsampled step): this block entered nothing
    # An ActiveScope or None, as in start().
    frame: ActiveScope | None = current_context().get(SCOPE_KEY)  # type: ignore[assignment]
    if frame is not None:
        token = frame.token
        if frame.owner is self and token is not None and frame.unsampled is None and not _shadowed:
            # Blocks exited in order, in the context they entered: the current frame is this
            # block's own (the general search below answers the same, a few lookups later).
            frame.token = None
            try:
                reset(token)  # detach() without its frame: this runs on every `with` exit
            except Exception:  # noqa: BLE001 - a token detach() must report (it logs, never raises)
                detach(token)
            self.finish(frame, exc)
            return
        pending = frame.unsampled
        if pending is not None and pending[0].owner is self:
            frame.unsampled = pending[1]
            self.finish(pending[0], exc)
            return
        # Normally the current frame itself. If not, a block exited before one it encloses: its
        # context is reset to the one it entered from (the enclosed blocks, exited later, end
        # without detaching).
        candidate: ActiveScope | None = frame
        while candidate is not None:
            token = candidate.token
            if candidate.owner is self and token is not None:
                shadows = _SHADOWS.get()
                if shadows is not None and shadows[1] is candidate:
                    # This block entered nothing; the frame is an outer block's.
                    _SHADOWS.set(shadows[2])
                    return
                candidate.token = None
                detach(token)
                self.finish(candidate, exc)
                return
            candidate = candidate.parent
    exit_elsewhere(self, exc)


def exit_elsewhere(self: ScopeLike, exc: BaseException | None) -> None:
    """``__exit__`` in another context than ``__enter__`` (an ``ExitStack`` handed across asyncio
    tasks or threads): the entering context's token cannot be detached here, but the span is
    still ended, and nothing is raised into user code."""
    mine = [f for f in reversed(list(OPEN.values())) if f.owner is self and f.token is not None]
    # One object entered by several threads (a shared bare `gymtrace.episode()`): this thread's
    # own activation, or the only one; never guess among other threads' (issue 25).
    here = [f for f in mine if f.thread == get_ident()]
    frame = here[0] if here else mine[0] if len(mine) == 1 else None
    if frame is None:
        if mine:
            contract_problem(
                ("exit elsewhere, ambiguous", self.kind),
                GymTraceError(
                    f"gymtrace.{self.kind}() was exited in a thread that did not enter it while"
                    f" {len(mine)} threads have it open (one scope object shared by several"
                    " threads); no span was ended here: each ends when its own thread exits it,"
                    " else as interrupted at exit. Fix: create the scope inside each thread"
                ),
            )
        return  # tracing was off when it was entered, or the span already ended
    contract_problem(
        ("exit elsewhere", self.kind),
        GymTraceError(
            f"gymtrace.{self.kind}() was exited in another context than the one it was entered in"
            " (an ExitStack or a context manager handed to another task or thread), or after a"
            " block that encloses it; its span is ended, but the context it entered may keep it"
            " as current"
        ),
    )
    frame.token = None
    self.finish(frame, exc)


# Plain methods returning awaitables, not coroutines: with nothing recording, a coroutine pair
# alone costs what the whole disabled `async with` may (benchmarks/perf.py, forms), so the
# disabled path hands back futures that finished at import, which `await` reads at once.
def aenter(self: ScopeLike) -> Awaitable[ActiveScope]:
    if self._deadline is not None:
        return timed_aenter(self, self._deadline)
    if active_tracer() is None and not OPEN:
        return _ENTERED_DISABLED
    return aenter_recording(self)


def aexit(
    self: ScopeLike,
    exc_type: type[BaseException] | None,
    exc: BaseException | None,
    tb: TracebackType | None,
) -> Awaitable[None]:
    if self._deadline is not None:
        return timed_aexit(self, exc_type, exc, tb)
    if not OPEN and not _steps.aggregating:
        return _EXITED
    return aexit_recording(self, exc_type, exc, tb)


async def timed_aenter(self: ScopeLike, seconds: float) -> ActiveScope:
    """``async with gymtrace.episode(timeout=S)``: the body is cancelled after S seconds."""
    timer = _live.deadline(seconds)
    await timer.__aenter__()
    try:
        entered = enter(self)
    except BaseException as refused:
        # A refused enter (strict mode: a hierarchy violation) has no body and no __aexit__ to
        # disarm the timer: left armed, it would cancel whatever this task awaits next (issue 31).
        await timer.__aexit__(type(refused), refused, refused.__traceback__)
        raise
    assert self._timers is not None  # made with the timeout
    self._timers.setdefault(asyncio.current_task(), []).append(timer)
    return entered


async def timed_aexit(
    self: ScopeLike,
    exc_type: type[BaseException] | None,
    exc: BaseException | None,
    tb: TracebackType | None,
) -> None:
    task = asyncio.current_task()
    assert self._timers is not None  # made with the timeout
    timers = self._timers.get(task)
    timer = timers.pop() if timers else None
    if not timers:
        self._timers.pop(task, None)
    if timer is not None:
        try:
            await timer.__aexit__(exc_type, exc, tb)
        except TimeoutError as timed_out:
            # The cancellation was the timeout's: the episode failed with kind `timeout`.
            exit_block(self, TimeoutError, timed_out, timed_out.__traceback__)
            raise
    exit_block(self, exc_type, exc, tb)


async def aenter_recording(self: ScopeLike) -> ActiveScope:
    return enter(self)


async def aexit_recording(
    self: ScopeLike,
    exc_type: type[BaseException] | None,
    exc: BaseException | None,
    tb: TracebackType | None,
) -> None:
    exit_block(self, exc_type, exc, tb)
