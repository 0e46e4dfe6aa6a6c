"""Live rollouts: markers and heartbeats while a rollout is open, and the sync episode watchdog.

While a rollout is open, one daemon thread per process writes ``gym.live`` marker spans into its
trace (``gym.kind=live``): a marker for a rollout (and each later episode) still open at the next
mark, a heartbeat every ``GYMTRACE_HEARTBEAT`` seconds without other activity (never two skipped in
a row: behind a tail sampler the other spans arrive late), and an ``end`` marker when a rollout
with markers ends, so markers alone tell an ended rollout from a lost one. Each carries the
identity, the attempt, the last step started, the interval, the start and the process.

The same thread settles the episodes' metrics each second (``_scopes.metrics``) and watches sync
episodes opened with ``timeout=``: past the deadline they get ``gym.episode.overdue`` (threads are
never killed); async episodes are cancelled (:class:`deadline`). ``GYMTRACE_HEARTBEAT=0`` turns
markers off. See docs/live-and-metrics.md.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace

from gymtrace import _constants as c
from gymtrace._model import forks as _forks
from gymtrace._model import settings as _settings
from gymtrace._model.errors import guard
from gymtrace._model.ids import ROLLOUT_IDENTITY
from gymtrace._scopes import metrics as _metrics
from gymtrace._scopes.active_scope import ActiveScope
from gymtrace._scopes.tracing import active_tracer

# Start markers are written at most this long after a rollout or episode starts (or the interval,
# if shorter): "searchable within seconds" without a span for every short rollout.
MARK_EVERY = 1.0

# The engine's open activations (``_scopes.open_scopes.OPEN``), handed down by the engine at import: a span of
# a rollout that ended since the last beat is one that left this table.
open_scopes: Mapping[int, ActiveScope] = {}


def open_rollouts() -> int:
    """The rollout spans started in this process and not ended: ``gym.rollout.active``, read at each
    collection from the open activations rather than counted per rollout."""
    return sum(1 for frame in list(open_scopes.values()) if frame.kind == c.KIND_ROLLOUT)


_metrics.open_rollouts = open_rollouts


def rollout_open(trace_id: int, rollout_id: object) -> bool:
    """Whether a rollout span of this trace and rollout ID started in this process and has not ended:
    this process then counts that rollout, and a record written meanwhile waits for its end."""
    for frame in list(open_scopes.values()):
        if (
            frame.kind == c.KIND_ROLLOUT
            and frame.identity.get(c.ROLLOUT_ID) == rollout_id
            and frame.span.get_span_context().trace_id == trace_id
        ):
            return True
    return False


_metrics.rollout_open = rollout_open


class _Watched:
    """One open rollout of this process, as the heartbeat thread last saw it."""

    __slots__ = ("episode", "frame", "marked", "open", "skipped", "started_ns", "step")

    def __init__(self, frame: ActiveScope, started_ns: int) -> None:
        self.frame = frame
        self.started_ns = started_ns
        self.marked = False
        self.episode: ActiveScope | None = None  # the last episode a marker was written for
        self.open: frozenset[int] = frozenset()  # span IDs of its activations open at the last mark
        self.step = 0  # the number of the last step started, at the last mark
        self.skipped = False


class _Deadline:
    __slots__ = ("at", "frame", "overdue", "timeout")

    def __init__(self, frame: ActiveScope, timeout: float) -> None:
        self.frame = frame
        self.timeout = timeout
        self.at = time.monotonic() + timeout
        self.overdue = False


class _State:
    """This process's watched rollouts, deadlines and thread; replaced whole in a forked child."""

    def __init__(self) -> None:
        self.watched: dict[int, _Watched] = {}
        self.deadlines: dict[int, _Deadline] = {}
        self.wake = threading.Condition(threading.Lock())
        self.thread: threading.Thread | None = None
        self.next_mark = 0.0
        self.last_beat = 0.0
        self.instance: str | None = None
        self.emitted = False  # a marker was written since the exporters were last told


# Set by the setup code (``_sdk.flush.send_soon``): tells the export queues to send what they hold
# now rather than at their next scheduled batch. Called at most once per mark (a second) and only
# when a marker was written: a marker exists to outlive its process, and a process killed outright
# (SIGKILL, every process of a NeMo Gym run at once) within a batch delay of its markers would
# leave none, so its rollouts would read neither live nor lost (issue 43).
send_markers: Callable[[], None] | None = None


_state = _State()


def _after_fork_in_child() -> None:
    # The parent's rollouts are the parent's: it marks them, and its thread did not survive the fork.
    global _state
    _state = _State()


_forks.in_child(_after_fork_in_child)


# -- what the levels call (cheap: a dictionary entry, no span) -------------------------------------------


def watch(rollout: ActiveScope) -> None:
    """A rollout started: mark it and beat for it while it is open (unless heartbeats are off; the
    thread starts all the same, it also hands the metrics over, ``_scopes.metrics.settle``)."""
    state = _state
    if _settings.active.heartbeat > 0:
        state.watched[id(rollout)] = _Watched(rollout, time.time_ns())
    if state.thread is None:
        _start(state)


def unwatch(rollout: ActiveScope) -> None:
    """The rollout ends. One that was marked gets an ``end`` marker: a tail sampler may drop its
    spans, and markers alone must still say it ended (a rollout too short for a mark has none)."""
    watched = _state.watched.pop(id(rollout), None)
    if watched is not None and watched.marked:
        tracer = active_tracer()
        if tracer is not None:
            step = (rollout.last_episode or rollout).steps_started
            _emit(tracer, _state, watched, c.LIVE_EVENT_END, rollout.span, step, _settings.active.heartbeat)


def watch_deadline(episode: ActiveScope, timeout: float) -> None:
    """A sync or async episode with ``timeout=``: overdue (an event, ``stalled``) if still open then."""
    state = _state
    state.deadlines[id(episode)] = _Deadline(episode, timeout)
    if state.thread is None:
        _start(state)
    else:
        with state.wake:
            state.wake.notify()


def unwatch_deadline(episode: ActiveScope) -> None:
    if _state.deadlines:
        _state.deadlines.pop(id(episode), None)


def _start(state: _State) -> None:
    global _exit_hook
    with state.wake:
        if state.thread is not None:
            return
        # The instruments exist from the first rollout: a collection from then on counts what ended.
        with guard("the gym.* instruments", may_raise=False):
            _metrics.instruments()
        thread = threading.Thread(target=_run, args=(state,), name="gymtrace-heartbeat", daemon=True)
        state.thread = thread
        if not _exit_hook:
            # Registered at the first rollout, after the application's MeterProvider (exit hooks
            # run last-registered first): the last counts reach it before it shuts down.
            _exit_hook = True
            atexit.register(_flush_metrics_at_exit)
    thread.start()


_exit_hook = False


def _flush_metrics_at_exit() -> None:
    with guard("the metrics' counts at exit", may_raise=False):
        flush_metrics()


# -- the thread --------------------------------------------------------------------------------------


def _run(state: _State) -> None:
    while state is _state:  # a forked child's copy of this thread does not run; a new one starts
        now = time.monotonic()
        interval = _settings.active.heartbeat
        if state.deadlines:
            # A gymtrace failure must not stop the thread: the next wake tries again.
            with guard("the episode watchdog", may_raise=False):
                _check_deadlines(state, now)
        if interval > 0 and now >= state.next_mark:
            # Due by the interval in force now: a shorter one set meanwhile applies at once.
            beat = now >= state.last_beat + interval
            with guard("live markers", may_raise=False):
                _mark(state, beat, interval)
                send = send_markers
                if state.emitted and send is not None:
                    state.emitted = False
                    send()
            if beat:
                state.last_beat = now
            state.next_mark = now + min(interval, MARK_EVERY)
        with guard("the metrics' counts", may_raise=False):
            _metrics.settle()
        # At most a mark apart: GYMTRACE_HEARTBEAT may be switched on (or shortened) meanwhile.
        waits = [MARK_EVERY, *(d.at - now for d in list(state.deadlines.values()) if not d.overdue)]
        if interval > 0 and state.watched:
            waits.append(state.next_mark - now)
        with state.wake:
            state.wake.wait(max(0.01, min(waits)))


def flush_metrics() -> None:
    """Hand everything the metrics gathered to the instruments now (``force_flush``, exit)."""
    _metrics.flush()


def _check_deadlines(state: _State, now: float) -> None:
    for key, deadline in list(state.deadlines.items()):
        frame = deadline.frame
        if frame.ended:
            state.deadlines.pop(key, None)
        elif not deadline.overdue and now >= deadline.at:
            deadline.overdue = True
            frame.span.add_event(c.EVENT_EPISODE_OVERDUE, {c.EPISODE_TIMEOUT: deadline.timeout})
            rollout = frame.parent.nearest(c.KIND_ROLLOUT) if frame.parent is not None else None
            watched = state.watched.get(id(rollout)) if rollout is not None else None
            if watched is not None and _settings.active.heartbeat > 0:
                # Said now, not at the next beat: this is the news `gymtrace live` is for.
                _beat(state, watched, _step_of(watched.frame, _activity()), overdue=True)


def _overdue(state: _State, episode: ActiveScope | None) -> bool:
    deadline = state.deadlines.get(id(episode)) if episode is not None else None
    return deadline is not None and deadline.overdue and deadline.frame is episode


def _mark(state: _State, beat: bool, interval: float) -> None:
    tracer = active_tracer()
    if tracer is None or not state.watched:
        return
    if state.instance is None:
        state.instance = _instance_of(tracer)
    activity = _activity()
    for key, watched in list(state.watched.items()):
        frame = watched.frame
        if frame.ended:
            state.watched.pop(key, None)
            continue
        if not frame.span.get_span_context().is_valid:
            continue  # its span is not started yet (or tracing failed to start it)
        now_open = activity.get(id(frame), (frozenset(), 0))[0]
        step = _step_of(frame, activity)
        episode = frame.last_episode
        if not watched.marked:
            watched.marked = True
            _emit(tracer, state, watched, c.LIVE_EVENT_ROLLOUT, frame.span, step, interval)
        elif episode is not None and episode is not watched.episode and not episode.ended:
            _emit(tracer, state, watched, c.LIVE_EVENT_EPISODE, episode.span, step, interval)
        elif beat:
            # A span open at the last mark and closed now; or a step started and ended in between,
            # which no open set shows (the rollout was between steps at the mark, in a step now).
            ended_since = bool(watched.open - now_open) or step > watched.step + 1
            if ended_since and not watched.skipped:
                watched.skipped = True  # the span that ended said it; every other beat all the same
            else:
                _beat(state, watched, step, overdue=_overdue(state, episode), tracer=tracer)
        if episode is not None:
            watched.episode = episode
        watched.open = now_open
        watched.step = step


def _beat(
    state: _State, watched: _Watched, step: int, *, overdue: bool, tracer: trace.Tracer | None = None
) -> None:
    tracer = tracer or active_tracer()
    if tracer is not None:
        watched.skipped = False
        _emit(
            tracer,
            state,
            watched,
            c.LIVE_EVENT_HEARTBEAT,
            watched.frame.span,
            step,
            _settings.active.heartbeat,
            overdue,
        )


def _emit(
    tracer: trace.Tracer,
    state: _State,
    watched: _Watched,
    event: str,
    parent: trace.Span,
    step: int,
    interval: float,
    overdue: bool = False,
) -> None:
    rollout = watched.frame
    episode = rollout.last_episode
    source = episode if episode is not None else rollout
    # The episode's identity (with its attempt), else the rollout's.
    attributes: dict[str, Any] = dict(source.identity)
    if episode is None:
        attributes = {k: v for k, v in attributes.items() if k in ROLLOUT_IDENTITY}
    attributes[c.KIND] = c.KIND_LIVE
    attributes[c.LIVE_EVENT] = event
    attributes[c.LIVE_STARTED] = watched.started_ns
    attributes[c.LIVE_INTERVAL] = float(interval)
    attributes[c.LIVE_STEP] = step
    if overdue:
        attributes[c.LIVE_OVERDUE] = True
    if state.instance:
        attributes[c.SERVICE_INSTANCE_ID] = state.instance
    context = trace.set_span_in_context(
        trace.NonRecordingSpan(parent.get_span_context()), otel_context.Context()
    )
    tracer.start_span(c.SPAN_LIVE, context=context, attributes=attributes).end()
    state.emitted = True


def _activity() -> dict[int, tuple[frozenset[int], int]]:
    """For each open rollout (by frame id), in one pass over the open activations: the span IDs of
    its activations open now (not the frames' ids, which Python reuses as soon as a frame is freed:
    a step would hide the next), and the number of the last step started in its innermost open
    step owner (an agent invocation, else the episode)."""
    spans: dict[int, set[int]] = {}
    steps: dict[int, tuple[int, int]] = {}  # rollout -> (depth of the owner, its last step)
    for frame in list(open_scopes.values()):
        depth = 0
        rollout = frame.parent
        while rollout is not None and rollout.kind != c.KIND_ROLLOUT:
            depth += 1
            rollout = rollout.parent
        if rollout is None:
            continue
        key = id(rollout)
        spans.setdefault(key, set()).add(frame.span.get_span_context().span_id)
        if frame.kind in (c.KIND_AGENT_INVOCATION, c.KIND_EPISODE):
            best = steps.get(key)
            number = frame.steps_started
            if best is None or (depth, number) > best:
                steps[key] = (depth, number)
    return {key: (frozenset(ids), steps.get(key, (0, 0))[1]) for key, ids in spans.items()}


def _step_of(rollout: ActiveScope, activity: dict[int, tuple[frozenset[int], int]]) -> int:
    """The last step started in the rollout (0: none yet); its episode's when nothing below is open."""
    found = activity.get(id(rollout))
    if found is not None and found[1]:
        return found[1]
    return (rollout.last_episode or rollout).steps_started


def _instance_of(tracer: trace.Tracer) -> str:
    resource = getattr(tracer, "resource", None)
    value = getattr(resource, "attributes", {}).get(c.SERVICE_INSTANCE_ID) if resource is not None else None
    return str(value) if value else f"{socket.gethostname()}-{os.getpid()}"


# -- async timeouts ------------------------------------------------------------------------------------


class deadline:
    """``async with deadline(seconds):``: cancel the body after ``seconds`` and raise
    ``TimeoutError`` (``asyncio.timeout`` where it exists, 3.11+; the same by hand on 3.10)."""

    __slots__ = ("_fired", "_handle", "_seconds", "_task", "_timeout")

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds
        self._timeout: Any = None
        self._handle: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[Any] | None = None
        self._fired = False

    async def __aenter__(self) -> deadline:
        timeout: Callable[[float], Any] | None = getattr(asyncio, "timeout", None)
        if timeout is not None:
            self._timeout = timeout(self._seconds)
            await self._timeout.__aenter__()
        else:  # Python 3.10
            self._task = asyncio.current_task()
            self._handle = asyncio.get_running_loop().call_later(self._seconds, self._fire)
        return self

    def _fire(self) -> None:
        self._fired = True
        if self._task is not None:
            self._task.cancel()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._timeout is not None:
            await self._timeout.__aexit__(exc_type, exc, tb)
            return
        if self._handle is not None:
            self._handle.cancel()
        if self._fired and isinstance(exc, asyncio.CancelledError):
            raise TimeoutError(f"timed out after {self._seconds:g} s") from exc
