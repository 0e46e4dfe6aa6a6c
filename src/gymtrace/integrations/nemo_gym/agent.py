"""Below the episode: an agent server's invocation, its turns and steps, read from the requests
the agent sends through NeMo Gym's ``ServerClient`` and its one HTTP function (which also routes the
driver's ``/run`` POSTs to :mod:`.passes`).

Separate from the server middleware because it follows the agent's outgoing requests, not the
requests a server receives.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
import weakref
from collections.abc import Mapping
from typing import Any, NamedTuple

from opentelemetry import context as otel_context
from opentelemetry.trace import Status, StatusCode

from gymtrace import attributes as c
from gymtrace import instrumentation
from gymtrace.integrations.nemo_gym.identity import rollout_identity
from gymtrace.integrations.nemo_gym.options import _own_telemetry
from gymtrace.integrations.nemo_gym.passes import _dispatch_run, _driver_run
from gymtrace.integrations.nemo_gym.wire import (
    _MODEL_PATHS,
    _PREFIX_PATH,
    _RUN,
    _SEED,
    _VERIFY,
    _function_calls,
    _read_response,
)

# -- below the episode: the agent's invocation, its turns and steps --------------------------------------
#
# NeMo Gym's own boundary (simple_agent's TrajectoryTurn): one turn per model response. An agent
# server's `/run` (and a `/v1/responses` conversation nobody opened an invocation for) is an
# agent invocation; each model request it sends opens the next turn and its step, and the tool
# requests that follow run in that step until the next model request, its `/verify`, or its end.
# Everything is read from the requests the agent sends through NeMo Gym's one HTTP function, so any
# agent that talks to NeMo Gym's model servers that way is covered, whatever its loop.


class _Invocation:
    """One agent invocation in an agent server: its span, and its turn and step in progress."""

    __slots__ = ("agent", "calls", "frame", "scope", "servers", "step", "trace_id", "tracer", "turn", "turns")

    def __init__(self, agent: str | None, tracer: Any) -> None:
        self.agent = agent
        self.tracer = tracer
        self.scope: Any = None
        self.frame: Any = None
        self.trace_id = 0
        self.turns = 0
        self.servers: tuple[str, ...] = ()  # where the step in progress sent its requests
        self.turn: tuple[Any, Any] | None = None
        self.step: tuple[Any, Any] | None = None
        # The function calls the last model response asked for, (name, call ID), not yet sent.
        self.calls: list[tuple[str, str]] = []

    def open(self) -> otel_context.Context | None:
        """The invocation's context, its span started in the current context the first time."""
        import gymtrace

        if self.frame is None:
            self.scope = (
                gymtrace.agent_invocation(agent_name=self.agent)
                if self.agent
                else gymtrace.agent_invocation()
            )
            self.frame = instrumentation.start_scope(self.scope, self.tracer)
            if self.frame is None:
                return None
            span = self.frame.span
            if span is not None:
                self.trace_id = span.get_span_context().trace_id
                _invocations[self.trace_id] = self
        context: otel_context.Context | None = self.frame.context
        return context

    def next_step(self, parent: otel_context.Context | None) -> otel_context.Context | None:
        """A model request is about to go: end the step in progress, start the next turn and step
        (in ``parent``, default the current context); the step's context."""
        import gymtrace

        self.end_step()
        self.turns += 1
        number = self.turns
        token = otel_context.attach(parent) if parent is not None else None
        try:
            turn_scope = gymtrace.turn(number=number)
            turn = instrumentation.start_scope(turn_scope, self.tracer)
            if turn is None:
                return None
            self.turn = (turn_scope, turn)
            if turn.context is None:
                return None
        finally:
            if token is not None:
                otel_context.detach(token)
        token = otel_context.attach(turn.context)
        try:
            step_scope = gymtrace.step(number=number)
            step = instrumentation.start_scope(step_scope, self.tracer)
        finally:
            otel_context.detach(token)
        if step is None:
            return turn.context
        self.step = (step_scope, step)
        return step.context

    def step_context(self) -> otel_context.Context | None:
        return self.step[1].context if self.step is not None else None

    def sent_to(self, server: str) -> None:
        """A request of the step in progress goes to ``server``: named on the step
        (``gym.step.servers``), so a trace that lacks that server's spans reads as missing it
        even where no request waited long enough for a live marker."""
        span = self.step[1].span if self.step is not None else None
        if span is not None and server and server not in self.servers:
            self.servers = (*self.servers, server)
            span.set_attribute(c.STEP_SERVERS, self.servers)

    def take_call(self, tool: str) -> str | None:
        """The call ID of the first pending function call named ``tool`` (removed)."""
        for index, (name, call_id) in enumerate(self.calls):
            if name == tool:
                del self.calls[index]
                return call_id
        return None

    def end_step(self, failed: int | None = None) -> None:
        for pair in (self.step, self.turn):
            if pair is not None:
                if failed is not None and pair[1].span is not None:
                    pair[1].span.set_status(Status(StatusCode.ERROR, f"HTTP {failed}"))
                instrumentation.end_scope(pair[0], pair[1])
        self.step = self.turn = None
        self.calls = []
        self.servers = ()

    def close(self, failed: int | None = None) -> None:
        self.end_step(failed)
        if self.frame is not None:
            _invocations.pop(self.trace_id, None)
            if failed is not None and self.frame.span is not None:
                self.frame.span.set_status(Status(StatusCode.ERROR, f"HTTP {failed}"))
            instrumentation.end_scope(self.scope, self.frame)
            self.frame = None


class _Conversation(NamedTuple):
    """An agent server's request in progress that talks to models: ``/run`` (``own``: its
    invocation opens at its first model or tool request and ends at its ``/verify``) or
    ``/v1/responses`` (turns open in its own context, under the invocation that called it)."""

    invocation: _Invocation
    own: bool
    agent: str | None


_conversation: contextvars.ContextVar[_Conversation | None] = contextvars.ContextVar(
    "gymtrace_nemo_gym_conversation", default=None
)
# In the context of a request ServerClient sends that the conversation already placed (NeMo Gym's
# HTTP function then places nothing again): a key of the one context attached for the request, not
# a context variable of its own (one token fewer alive while the request is in flight).
_ROUTED_KEY = otel_context.create_key("gymtrace.nemo_gym.routed")
# The open invocations of this process by trace: an agent's `/run` that posts to its own
# `/v1/responses` (simple_agent) continues its invocation there, one per rollout trace.
_invocations: dict[int, _Invocation] = {}
_AGENT_PATHS = (_RUN, "/v1/responses")


# The kind of each server by (configuration, name): the configuration is an OmegaConf DictConfig,
# whose lookups cost more than the rest of a request's bookkeeping here; it is loaded once per
# process and not changed, so a kind found once is kept (with the configuration, so its id is not
# reused). Bounded: a process that made configurations without end would only lose the cache.
_kinds: dict[tuple[int, Any], tuple[Any, str]] = {}
_KINDS_KEPT = 256


def _target_kind(client: Any, server_name: Any) -> str:
    """``responses_api_models``, ``resources_servers``, ... for a server ``ServerClient`` knows."""
    try:
        config = client.global_config_dict
        key = (id(config), server_name)
        known = _kinds.get(key)
        if known is not None and known[0] is config:
            return known[1]
        entry = config.get(server_name)
        for kind in (
            "responses_api_models",
            "resources_servers",
            "responses_api_agents",
            "environment_servers",
        ):
            if kind in entry:
                if len(_kinds) >= _KINDS_KEPT:
                    _kinds.clear()
                _kinds[key] = (config, kind)
                return kind
    except Exception:  # noqa: BLE001 - an unknown server: no kind
        pass
    return ""


# A request's live marker is written once the request has waited this long (the live thread's
# rollout start markers wait as long): a request answered sooner leaves nothing for `gymtrace live`
# to name, since its own spans end, and nearly every request is, so a marker per request was most
# of an agent's spans (8 of the 19 of a rollout of NeMo Gym's example_multi_step).
MARK_AFTER = 1.0


class _Waiting:
    """The requests of one event loop's conversations not answered yet, each marked live once it has
    waited :data:`MARK_AFTER` (dated when it went out), by one timer for all of them.

    A timer per request (``call_later``, cancelled when the answer came) kept each request's
    context, and a copy of its context variables, alive in the loop's heap for a second after the
    answer, where the garbage collector promoted them: an answered request is dropped here at once.
    """

    __slots__ = ("__weakref__", "count", "requests", "scheduled")

    def __init__(self) -> None:
        self.count = 0
        # key -> (due on the loop's clock, tracer, context, step, server, when it went out)
        self.requests: dict[int, tuple[float, Any, otel_context.Context, int, str, int]] = {}
        self.scheduled = False

    def add(self, invocation: _Invocation, context: otel_context.Context, server: str) -> int:
        loop = asyncio.get_running_loop()
        self.count += 1
        self.requests[self.count] = (
            loop.time() + MARK_AFTER,
            invocation.tracer,
            context,
            invocation.turns,
            server,
            time.time_ns(),
        )
        if not self.scheduled:
            self._schedule(loop, MARK_AFTER)
        return self.count

    def answered(self, key: int) -> None:
        self.requests.pop(key, None)

    def _schedule(self, loop: asyncio.AbstractEventLoop, delay: float) -> None:
        # In context variables of its own: the timer keeps no request's context alive.
        loop.call_later(delay, self._sweep, context=contextvars.Context())
        self.scheduled = True

    def _sweep(self) -> None:
        self.scheduled = False
        loop = asyncio.get_running_loop()
        # asyncio runs a timer up to its clock's resolution early.
        now = loop.time() + _EARLY
        due = [key for key, request in self.requests.items() if request[0] <= now]
        for key in due:
            _, tracer, context, step, server, sent_ns = self.requests.pop(key)
            _write_marker(tracer, context, step, server, sent_ns)
        if self.requests:
            self._schedule(loop, max(min(request[0] for request in self.requests.values()) - now, 0.0))


_EARLY = 0.005
# One registry per event loop (an agent server has one; a test's asyncio.run() makes more).
_waiting: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Waiting] = weakref.WeakKeyDictionary()


def _waiting_here() -> _Waiting:
    loop = asyncio.get_running_loop()
    waiting = _waiting.get(loop)
    if waiting is None:
        waiting = _waiting[loop] = _Waiting()
    return waiting


def _write_marker(tracer: Any, context: otel_context.Context, step: int, server: str, sent_ns: int) -> None:
    with instrumentation.guard("gymtrace.integrations.nemo_gym live marker"):
        identity = instrumentation.current_identity(context)
        if tracer is None or c.ROLLOUT_ID not in identity:
            return
        attributes: dict[str, Any] = {
            **identity,
            c.KIND: c.KIND_LIVE,
            c.LIVE_EVENT: c.LIVE_EVENT_STEP,
            c.LIVE_STEP: step,
            c.LIVE_SERVER: server,
        }
        marker = tracer.start_span(c.SPAN_LIVE, context=context, attributes=attributes, start_time=sent_ns)
        marker.end(end_time=sent_ns)


async def _agent_request(
    wrapped: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    conversation: _Conversation,
    target: str,
    own: bool,
    path: str,
    server: str = "",
) -> Any:
    """One request an agent sends inside a conversation, in the turn, step or phase it belongs to."""
    invocation = conversation.invocation
    context: otel_context.Context | None = None
    marker: int | None = None
    waiting: _Waiting | None = None
    model = False
    try:
        if path in (_SEED, _VERIFY, "/aggregate_metrics"):
            # The episode's phases, beside the invocation: it ends where verification starts.
            if path == _VERIFY and conversation.own:
                invocation.close()
        elif own:
            context = invocation.open()  # simple_agent's /run posting to its own /v1/responses
        elif target == "responses_api_models" and path in _MODEL_PATHS:
            parent = invocation.open() if conversation.own else None
            context = invocation.next_step(parent)
            model = True
        else:  # a tool, in the step of the model response that asked for it
            if conversation.own:
                invocation.open()
            context = invocation.step_context() or (invocation.open() if conversation.own else None)
            call_id = invocation.take_call(path.rsplit("/", 1)[-1])
            if call_id is not None:
                given = kwargs.get("headers")
                kwargs["headers"] = {**(dict(given) if given else {}), c.NEMO_GYM_TOOL_CALL_HEADER: call_id}
        if context is not None and (model or invocation.step is not None):
            invocation.sent_to(server)
            waiting = _waiting_here()
            marker = waiting.add(invocation, context, server)
    except Exception as exc:  # noqa: BLE001 - telemetry must not break the request
        instrumentation.report_error("gymtrace.integrations.nemo_gym agent request", exc)
        context = None
    token = otel_context.attach(otel_context.set_value(_ROUTED_KEY, True, context))
    try:
        response = await wrapped(*args, **kwargs)
    finally:
        if waiting is not None and marker is not None:
            waiting.answered(marker)  # answered (or failed): nothing to name
        otel_context.detach(token)
    if model:
        with instrumentation.guard("gymtrace.integrations.nemo_gym model response"):
            if response.status < 400:
                invocation.calls = _function_calls(await _read_response(response))
    return response


def _server_client_request(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``ServerClient.request``: the awaitable that sends it (not a coroutine of its own, which
    would stay alive beside the request's for as long as it is in flight)."""
    conversation = _conversation.get()
    if conversation is not None:
        try:
            server_name = kwargs.get("server_name", args[0] if args else None)
            url_path = kwargs.get("url_path", args[1] if len(args) > 1 else "")
            path = str(url_path).split("?", 1)[0]
            prefixed = _PREFIX_PATH.match(path)
            path = prefixed.group(2) if prefixed else path
            target = _target_kind(instance, server_name)
            own = server_name is not None and server_name == conversation.agent
        except Exception as exc:  # noqa: BLE001 - telemetry must not break the request
            instrumentation.report_error("gymtrace.integrations.nemo_gym ServerClient.request", exc)
            return wrapped(*args, **kwargs)
        return _agent_request(wrapped, args, kwargs, conversation, target, own, path, str(server_name))
    this_pass = _driver_run.get()
    if this_pass is None:
        return wrapped(*args, **kwargs)
    row = None
    try:
        url_path = kwargs.get("url_path", args[1] if len(args) > 1 else "")
        body: Any = kwargs.get("json")
        if isinstance(url_path, str) and url_path.split("?", 1)[0].endswith(_RUN):
            fields = body.model_dump() if hasattr(body, "model_dump") else body
            row = rollout_identity(fields) if isinstance(fields, Mapping) else None
    except Exception as exc:  # noqa: BLE001 - telemetry must not break the request
        instrumentation.report_error("gymtrace.integrations.nemo_gym ServerClient.request", exc)
    if row is None or _own_telemetry("rollout"):
        # NeMo Gym's own rollout span (nemo.gym.rollout.id, read as the rollout ID) is the one.
        return wrapped(*args, **kwargs)
    return _dispatch_run(wrapped, args, kwargs, this_pass, row)


async def _request_with_retries(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """NeMo Gym's one HTTP function says whether a request goes to one of its servers; an agent's
    tool request that bypasses ``ServerClient`` (a session's direct tool access) joins its step."""
    conversation = _conversation.get()
    token = None
    with instrumentation.gym_destination(bool(kwargs.get("_internal", False))):
        if conversation is not None and not otel_context.get_value(_ROUTED_KEY):
            with instrumentation.guard("gymtrace.integrations.nemo_gym tool request"):
                url = str(kwargs.get("url", args[1] if len(args) > 1 else ""))
                name = url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
                call_id = conversation.invocation.take_call(name)
                context = conversation.invocation.step_context()
                if call_id is not None and context is not None:
                    given = kwargs.get("headers")
                    kwargs["headers"] = {
                        **(dict(given) if given else {}),
                        c.NEMO_GYM_TOOL_CALL_HEADER: call_id,
                    }
                    token = otel_context.attach(context)
        try:
            return await wrapped(*args, **kwargs)
        finally:
            if token is not None:
                otel_context.detach(token)
