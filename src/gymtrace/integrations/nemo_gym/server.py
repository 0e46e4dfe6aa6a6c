"""The server side: the ASGI middleware every NeMo Gym server gets (its requests in the caller's
gym identity, the phases it serves as spans), verify and handler errors on the failing span with
the traceback NeMo Gym's ``format_exc`` formatted, and the hook that adds the middleware.
"""

from __future__ import annotations

import contextvars
import json
import os
import re
from collections.abc import Mapping
from typing import Any, NamedTuple

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from gymtrace import attributes as c
from gymtrace import instrumentation
from gymtrace.integrations.nemo_gym.agent import (
    _AGENT_PATHS,
    _Conversation,
    _conversation,
    _Invocation,
    _invocations,
)
from gymtrace.integrations.nemo_gym.client import identity_from_headers
from gymtrace.integrations.nemo_gym.identity import (
    _SERVER_NAME_ENV,
    RolloutIdentity,
    _attributes,
    group_id_for,
    identity_from_key,
    rollout_identity,
)
from gymtrace.integrations.nemo_gym.options import _options, _own_telemetry
from gymtrace.integrations.nemo_gym.passes import _servers_only_runs
from gymtrace.integrations.nemo_gym.wire import (
    _BODY_LIMIT,
    _MODEL_PATHS,
    _PREFIX_PATH,
    _RUN,
    _SEED,
    _VERIFY,
    _reward_of,
    _usage_attributes,
)


async def _buffered(receive: Any) -> tuple[bytes, Any]:
    """The request body, and a ``receive`` that hands the application the same messages again."""
    messages: list[Any] = []
    body = b""
    while True:
        message = await receive()
        messages.append(message)
        if message.get("type") != "http.request":
            break
        body += message.get("body", b"")
        if not message.get("more_body") or len(body) > _BODY_LIMIT:
            break
    replay = iter(messages)

    async def again() -> Any:
        for message in replay:
            return message
        return await receive()

    return body, again


class _Answer:
    """The ASGI ``send`` of a request whose answer is read: its status and, where it is kept (a
    reward, a model's usage) or an error, its body up to the limit."""

    __slots__ = ("body", "keep", "send", "status")

    def __init__(self, send: Any) -> None:
        self.send = send
        self.status: int | None = None
        self.body = b""
        self.keep = False  # the response body is read: a reward, a model's usage

    async def __call__(self, message: Any) -> None:
        kind = message.get("type")
        if kind == "http.response.start":
            self.status = message.get("status")
        elif (
            kind == "http.response.body"
            and (self.keep or (self.status or 0) >= 500)
            and len(self.body) < _BODY_LIMIT
        ):
            self.body += message.get("body", b"")
        await self.send(message)


def _enter(manager: Any) -> Any:
    manager.__enter__()
    return manager


def _leave(entered: list[Any], exc: BaseException | None) -> None:
    """Exit ``entered`` in reverse order, each told what the block raised (as ``with`` would); an
    exit that raises does not keep the others from running, and the first such error is raised."""
    error: BaseException | None = None
    for manager in reversed(entered):
        try:
            manager.__exit__(
                type(exc) if exc is not None else None, exc, exc.__traceback__ if exc is not None else None
            )
        except BaseException as failure:  # noqa: BLE001 - raised after every exit ran
            error = error or failure
    entered.clear()
    if error is not None:
        raise error


class _Phase(NamedTuple):
    # "root", "seed", "verify", "model", "tool", or "" (identity only). No agent invocation for an
    # agent's /run: it spans the seed_session and verify calls, which rank above it.
    kind: str
    argument: str | None = None
    call_id: str | None = None  # a tool's, sent by a traced agent


class NeMoGymServerMiddleware:
    """ASGI middleware for one NeMo Gym server: its requests run in the caller's gym identity, and
    the phases it serves are spans (``gymtrace.integrations.nemo_gym.instrument_stack`` adds it to
    every server NeMo Gym starts)."""

    def __init__(
        self, app: Any, *, server_type: str | None, server_name: str | None, model: str | None = None
    ) -> None:
        self.app = app
        self.server_type = server_type
        self.server_name = server_name
        self.model = model

    def _phase(self, method: str, path: str, rooted: bool, call_id: str | None = None) -> _Phase:
        kind = self.server_type
        if path == _RUN and not rooted:
            return _Phase("root")
        if kind == "resources_servers" and method == "POST":
            if path == _SEED:
                return _Phase("seed")
            if path == _VERIFY:
                return _Phase("verify")
            name = path.strip("/")
            if name and "/" not in name and name not in ("aggregate_metrics", "close_session", "run"):
                return _Phase("tool", name, call_id)
        if kind == "responses_api_models" and path in _MODEL_PATHS:
            return _Phase("model", self.model)
        return _Phase("")

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        try:
            ctx, phase, root, receive = await self._prepare(scope, receive)
        except Exception as exc:  # noqa: BLE001 - telemetry must not break the request
            instrumentation.report_error("gymtrace.integrations.nemo_gym middleware", exc)
            await self.app(scope, receive, send)
            return
        token = otel_context.attach(ctx)
        try:
            await self._serve(scope, receive, send, phase, root)
        finally:
            otel_context.detach(token)

    async def _prepare(
        self, scope: Any, receive: Any
    ) -> tuple[otel_context.Context, _Phase, RolloutIdentity | None, Any]:
        from opentelemetry import propagate

        headers: dict[str, str] = {}
        for name, value in scope.get("headers") or ():
            headers.setdefault(bytes(name).decode("latin-1").lower(), bytes(value).decode("latin-1"))
        current = otel_context.get_current()
        if trace.get_current_span(current).get_span_context().is_valid:
            # An HTTP server span outside this middleware (FastAPI's own telemetry, the contrib
            # instrumentation) already continued the caller: the server's spans go under it, so
            # the nesting follows the calls.
            ctx = current
        else:
            ctx = propagate.extract(headers)
        # The identity the extraction (FastAPI's, or the one above) read from this header, or read here.
        identity = instrumentation.incoming_identity(headers.get("baggage"), ctx)
        identity = identity or identity_from_headers(headers)
        path = scope.get("path", "")
        key = None
        prefixed = _PREFIX_PATH.match(path)
        if prefixed:
            key, path = prefixed.group(1), prefixed.group(2)
        found: RolloutIdentity | None = None
        if not identity and scope.get("method") == "POST" and path in (_RUN, _SEED, _VERIFY):
            body, receive = await _buffered(receive)
            try:
                fields = json.loads(body) if body else None
            except ValueError:
                fields = None
            found = rollout_identity(fields) if isinstance(fields, Mapping) else None
        if found is None and key is not None and not identity:
            found = identity_from_key(key)
        if found is not None:
            identity = instrumentation.accept_identity(_attributes(found))
            if not identity:
                found = None
        rooted = bool(identity) and found is None  # continued from a gym caller (baggage, headers)
        call_id = headers.get(c.NEMO_GYM_TOOL_CALL_HEADER)
        phase = self._phase(scope.get("method", ""), path, rooted or found is None, call_id)
        if (
            phase.kind == ""
            and self.server_type == "responses_api_agents"
            and identity
            and scope.get("method") == "POST"
            and path in _AGENT_PATHS
        ):
            phase = _Phase("agent", self.server_name)
        if phase.kind == "root" and found is not None:
            # No scope continued: the rollout opens here. continue_scope with no identity still
            # takes the gym.* entries the extraction put into the baggage (issue 31). The rollout
            # gets a run of this server's own, so repeated servers-only runs do not pool.
            run = {c.RUN_ID: _servers_only_runs.run_for(found, self.server_name)}
            # A caller's trace context came without gym identity (a trainer that drives NeMo Gym
            # with telemetry of its own): the rollout links to its span, never joins its trace.
            ctx = instrumentation.note_caller(ctx, headers)
            return instrumentation.continue_scope(ctx, run), phase, found, receive
        return instrumentation.continue_scope(ctx, identity), phase, None, receive

    async def _serve(
        self, scope: Any, receive: Any, send: Any, phase: _Phase, root: RolloutIdentity | None
    ) -> None:
        import gymtrace

        # What a request keeps alive while the application serves it is what a busy server's
        # garbage collector promotes: one watcher and one list here, not a closure with its cells
        # and an ExitStack with its callbacks.
        answer = _Answer(send)
        entered: list[Any] = []  # the context managers entered, left in reverse order
        scored = False
        opened = False  # a span of this request's own: its status follows the response's
        conversation: _Conversation | None = None
        try:
            if _options.provider is not None:  # the global one otherwise: nothing to enter
                entered.append(_enter(instrumentation.use_tracer_provider(_options.provider)))
            if root is not None and not _own_telemetry("rollout"):
                # Nobody upstream traced this row (the driver runs without gymtrace): it starts here,
                # in its task's group of this run. The group's size is not on the wire: the driver
                # alone knows num_repeats.
                run_id = instrumentation.current_identity().get(c.RUN_ID)
                group = (
                    group_id_for(run_id, root.task_id) if root.task_id and isinstance(run_id, str) else None
                )
                entered.append(
                    _enter(
                        gymtrace.rollout(
                            rollout_id=root.rollout_id,
                            task_id=root.task_id or None,
                            repeat=root.repeat,
                            group_id=group,
                        )
                    )
                )
                entered.append(_enter(gymtrace.episode(attempt=root.attempt)))
                scored = opened = answer.keep = True
                if self.server_type == "responses_api_agents":
                    conversation = self._conversation(scope, own=True)
            elif phase.kind == "agent":
                conversation = self._conversation(scope, own=scope.get("path", "").endswith(_RUN))
            else:
                own: Any = None
                if phase.kind == "seed":
                    own = gymtrace.seed_session()
                elif phase.kind == "verify" and not _own_telemetry("verify"):
                    own, scored, answer.keep = gymtrace.verify(), True, True
                elif phase.kind == "model":
                    own, answer.keep = gymtrace.model_call(model=phase.argument), True
                elif phase.kind == "tool":
                    own = gymtrace.tool_call(tool_name=phase.argument, call_id=phase.call_id)
                if own is not None:
                    entered.append(_enter(own))
                    opened = True
        except Exception as exc:  # noqa: BLE001 - telemetry must not break the request
            _leave(entered, None)
            instrumentation.report_error("gymtrace.integrations.nemo_gym middleware", exc)
            await self.app(scope, receive, send)
            return
        raised: BaseException | None = None
        try:
            token = _conversation.set(conversation) if conversation is not None else None
            tracebacks: list[str] = []
            traceback_token = _tracebacks.set(tracebacks) if opened else None
            try:
                await self.app(scope, receive, answer if opened or conversation else send)
            finally:
                if traceback_token is not None:
                    _tracebacks.reset(traceback_token)
                if token is not None:
                    _conversation.reset(token)
                    status = answer.status or 500
                    with instrumentation.guard("gymtrace.integrations.nemo_gym agent response"):
                        # Its own invocation ends here; one it continued, only its turn and step.
                        failed = status if status >= 500 else None
                        if conversation is not None and conversation.own:
                            conversation.invocation.close(failed)
                        elif conversation is not None:
                            conversation.invocation.end_step(failed)
            if not opened:
                return
            with instrumentation.guard("gymtrace.integrations.nemo_gym response"):
                status = answer.status or 500
                body = answer.body
                if status >= 500 and root is not None and scored:
                    gymtrace.record_failure(message=f"/run answered HTTP {status}")
                elif status >= 500:
                    # The handler's exception became a 500 inside the app: the phase still failed.
                    frame = instrumentation.innermost_scope()
                    if frame is not None:
                        _record_server_error(frame.span, status, body, tracebacks[-1] if tracebacks else None)
                elif phase.kind == "model" and status < 400 and body:
                    frame = instrumentation.innermost_scope()
                    if frame is not None and frame.span is not None:
                        frame.span.set_attributes(_usage_attributes(json.loads(body)))
                elif scored and status < 400:
                    reward = _reward_of(json.loads(body)) if body else None
                    if reward is not None:
                        gymtrace.record_reward(reward)
        except BaseException as exc:
            raised = exc
            raise
        finally:
            _leave(entered, raised)

    def _conversation(self, scope: Any, *, own: bool) -> _Conversation:
        """The conversation an agent's ``/run`` or ``/v1/responses`` request is: a ``/v1/responses``
        posted by this agent's own ``/run`` continues that invocation (found by its trace)."""
        invocation = None
        if not own:
            trace_id = trace.get_current_span().get_span_context().trace_id
            invocation = _invocations.get(trace_id)
            if invocation is not None:
                return _Conversation(invocation, False, self.server_name)
        invocation = _Invocation(self.server_name, instrumentation.get_tracer(_options.provider))
        return _Conversation(invocation, True, self.server_name)


_EXCEPTION_REPR = re.compile(r"([A-Za-z_][A-Za-z0-9_.]*)\((.*)\)", re.DOTALL)
_STACKTRACE_LIMIT = 16384

# The traceback NeMo Gym formats for the exception its exception middleware caught in this request
# (it prints it and answers only repr(e)): a list per request the phase's span was opened for.
_tracebacks: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar(
    "gymtrace_nemo_gym_tracebacks", default=None
)


def _format_exc(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``nemo_gym.server_utils.format_exc``: called once, in the ``except`` of the middleware that
    turns a handler's exception into HTTP 500; its text is kept for the failing span's event."""
    text = wrapped(*args, **kwargs)
    kept = _tracebacks.get()
    if kept is not None and isinstance(text, str):
        kept.append(text)
    return text


def _record_server_error(span: Any, status: int, body: bytes, stacktrace: str | None = None) -> None:
    """A phase answered HTTP 5xx: its span failed, with the exception NeMo Gym caught when its
    answer says which (its servers answer ``repr(exception)`` as a JSON string), and the traceback
    NeMo Gym formatted for it (``stacktrace``) when the server did."""
    if span is None:
        return
    text: Any = None
    try:
        text = json.loads(body) if body else None
    except ValueError:
        text = None
    match = _EXCEPTION_REPR.fullmatch(text.strip()) if isinstance(text, str) else None
    if match is None:
        span.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))
        return
    error_type, message = match.group(1), match.group(2)
    if len(message) >= 2 and message[0] == message[-1] and message[0] in "'\"":
        message = message[1:-1]  # a one-argument exception's repr quotes its message
    span.set_status(Status(StatusCode.ERROR, f"{error_type}: {message}"[:1024]))
    span.set_attribute(c.ERROR_TYPE, error_type)
    event = {c.EXCEPTION_TYPE: error_type, c.EXCEPTION_MESSAGE: message[:4096]}
    if stacktrace:
        event[c.EXCEPTION_STACKTRACE] = stacktrace[-_STACKTRACE_LIMIT:]  # the innermost frames last
    span.add_event(c.EXCEPTION_EVENT, event)


def _without_operation_spans(app: Any) -> None:
    """FastAPI's own telemetry (0.165 on) makes, inside every request's server span, three spans of
    its internals: ``fastapi.dependencies``, ``fastapi.endpoint``, ``fastapi.serialization``. Over
    a NeMo Gym rollout that is ~35 of ~80 spans, each recorded by the SDK and written by the
    exporter, for nothing a reader of a rollout uses (docs/performance.md). FastAPI reads its
    ``operation_spans`` setting from the app's telemetry settings on every request; NeMo Gym builds
    its apps with the defaults, so turning it off here overrides no choice of the app's. An app
    without that setting (an older FastAPI) is left as it is."""
    settings = getattr(app, "_telemetry", None)
    if isinstance(settings, dict) and settings.get("operation_spans") is True:
        settings["operation_spans"] = False


def _add_middleware(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``SimpleServer.instrument_app_for_telemetry(app)``: every NeMo Gym server calls it once its
    FastAPI app is built and before uvicorn starts it; the middleware is added there."""
    result = wrapped(*args, **kwargs)
    with instrumentation.guard("gymtrace.integrations.nemo_gym server"):
        from nemo_gym.server_utils import (  # type: ignore[import-not-found,unused-ignore]
            _telemetry_server_type,
        )

        app = args[0] if args else kwargs["app"]
        if not _options.operation_spans:
            _without_operation_spans(app)
        config = getattr(instance, "config", None)
        model = getattr(config, "openai_model", None) or getattr(config, "model", None)
        app.add_middleware(
            NeMoGymServerMiddleware,
            server_type=_telemetry_server_type(type(instance)),
            server_name=getattr(config, "name", None) or os.environ.get(_SERVER_NAME_ENV),
            model=model if isinstance(model, str) else None,
        )
    return result
