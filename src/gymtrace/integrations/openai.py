"""Each OpenAI chat completion as a ``chat {model}`` span with usage, response ID and timing.

Example::

    import gymtrace, openai
    import gymtrace.integrations.openai

    gymtrace.configure(service_name="agent")
    gymtrace.integrations.openai.instrument()          # once, before clients are used

    client = openai.OpenAI(base_url="http://vllm:8000/v1", api_key="...")
    with gymtrace.rollout(rollout_id="r-1"), gymtrace.episode(), gymtrace.step():
        client.chat.completions.create(model="qwen", messages=[...], tools=[...])

Every ``chat.completions.create`` (sync and async, streaming or not) becomes one CLIENT span
``chat {model}`` (``gym.kind`` = ``model_call``) with ``gen_ai.request.model``,
``gen_ai.provider.name`` = ``openai``, ``gen_ai.response.model``, ``gen_ai.response.id``,
``gen_ai.response.finish_reasons``, ``gen_ai.usage.input_tokens`` / ``output_tokens`` /
``cache_read.input_tokens`` and, for streams, ``gen_ai.response.time_to_first_chunk``. The request
carries ``traceparent``, so a traced model server (vLLM with OpenTelemetry) joins the trace, and
the gym identity only when the client's ``base_url`` is a gym destination (loopback, a host of
``GYMTRACE_PROPAGATE_TO``): never to a model provider such as ``api.openai.com``. No message
content is recorded. A stream's span ends when the stream is
exhausted or closed.

**Exactly one chat span per request**. gymtrace *defers and enriches*; it never
suppresses another instrumentation:

- inside a ``gymtrace.model_call(...)`` scope the call records onto that scope's span (no second
  span);
- when another GenAI instrumentation's chat span is current when the call reaches gymtrace
  (``opentelemetry-instrumentation-openai-v2`` instrumented *after* this ``instrument()``, which
  puts its wrapper outside), that span is the one: gymtrace adds what it lacks (cached input tokens,
  time to first chunk) and makes none of its own. Its tokens are the only ones;
- when such an instrumentation wraps *inside* gymtrace (it was instrumented first), gymtrace makes
  no span either and its span stays as it made it: call this ``instrument()`` first to get the
  enrichment.

``gym.*`` identity reaches the other instrumentation's span through
:class:`gymtrace.IdentitySpanProcessor` in every case.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

try:
    import openai.resources.chat.completions as _completions
    import wrapt
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("gymtrace.integrations.openai needs openai: pip install 'gymtrace[openai]'") from exc

from opentelemetry import context as otel_context
from opentelemetry import trace

from gymtrace import ActiveScope, Scope, model_call
from gymtrace import attributes as c
from gymtrace.instrumentation import (
    check_tracer_provider,
    end_scope,
    get_tracer,
    innermost_scope,
    may_carry_identity,
    read_int,
    report_error,
    start_scope,
    warn_once,
)
from gymtrace.propagation import inject, with_identity

__all__ = ["instrument", "uninstrument"]

_PROVIDER = "openai"
_lock = threading.Lock()
_instrumented = False
# The provider instrument() was handed (None: the one gymtrace scopes use, normally the global one).
_tracer_provider: trace.TracerProvider | None = None


# -- what a response says ------------------------------------------------------------------------------


class _Usage:
    """Response details gathered from one response or from the chunks of a stream."""

    __slots__ = ("cached", "finish", "first_chunk", "input", "model", "output", "response_id", "started")

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.first_chunk: float | None = None
        self.response_id: str | None = None
        self.model: str | None = None
        self.finish: dict[int, str] = {}
        self.input: int | None = None
        self.output: int | None = None
        self.cached: int | None = None

    def take_usage(self, usage: Any) -> None:
        if usage is None:
            return
        self.input = read_int(getattr(usage, "prompt_tokens", None), minimum=0)
        self.output = read_int(getattr(usage, "completion_tokens", None), minimum=0)
        details = getattr(usage, "prompt_tokens_details", None)
        self.cached = (
            read_int(getattr(details, "cached_tokens", None), minimum=0) if details is not None else None
        )

    def take_response(self, response: Any) -> None:
        self.response_id = _str(getattr(response, "id", None))
        self.model = _str(getattr(response, "model", None))
        for number, choice in enumerate(getattr(response, "choices", None) or ()):
            reason = getattr(choice, "finish_reason", None)
            self.finish[read_int(getattr(choice, "index", None), minimum=0) or number] = reason or "error"
        self.take_usage(getattr(response, "usage", None))

    def take_chunk(self, chunk: Any) -> None:
        if self.first_chunk is None:
            self.first_chunk = time.perf_counter() - self.started
        self.response_id = self.response_id or _str(getattr(chunk, "id", None))
        self.model = self.model or _str(getattr(chunk, "model", None))
        for choice in getattr(chunk, "choices", None) or ():
            reason = getattr(choice, "finish_reason", None)
            if reason:
                self.finish[read_int(getattr(choice, "index", None), minimum=0) or 0] = reason
        if getattr(chunk, "usage", None) is not None:
            self.take_usage(chunk.usage)

    def attributes(self, *, enrich_only: bool) -> dict[str, Any]:
        """Span attributes; ``enrich_only`` keeps what another instrumentation does not record."""
        out: dict[str, Any] = {}
        if self.cached is not None:
            out[c.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] = self.cached
        if self.first_chunk is not None:
            out[c.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] = self.first_chunk
        if enrich_only:
            return out
        if self.input is not None:
            out[c.GEN_AI_USAGE_INPUT_TOKENS] = self.input
        if self.output is not None:
            out[c.GEN_AI_USAGE_OUTPUT_TOKENS] = self.output
        if self.response_id is not None:
            out[c.GEN_AI_RESPONSE_ID] = self.response_id
        if self.model is not None:
            out[c.GEN_AI_RESPONSE_MODEL] = self.model
        if self.finish:
            out[c.GEN_AI_RESPONSE_FINISH_REASONS] = [self.finish[k] for k in sorted(self.finish)]
        return out


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


# -- where the call is recorded --------------------------------------------------------------------------


class _Call:
    """One request: the span it is recorded on and whether gymtrace owns (and ends) that span."""

    __slots__ = ("enrich_only", "frame", "scope", "span", "usage")

    def __init__(
        self, span: Any, *, frame: ActiveScope | None, scope: Scope | None, enrich_only: bool
    ) -> None:
        self.span = span
        self.frame = frame  # set when gymtrace started the span (and must end it)
        self.scope = scope
        self.enrich_only = enrich_only
        self.usage = _Usage()

    def record(self) -> None:
        if self.span.is_recording():
            self.span.set_attributes(self.usage.attributes(enrich_only=self.enrich_only))
        elif self.frame is not None and (self.usage.input is not None or self.usage.output is not None):
            # Its rollout was dropped by head sampling: the tokens go to the rollout's summary.
            self.frame.record_usage(input_tokens=self.usage.input, output_tokens=self.usage.output)

    def finish(self, exc: BaseException | None) -> None:
        try:
            self.record()
        except Exception as internal:  # noqa: BLE001 - telemetry must not break the caller
            report_error("gymtrace.integrations.openai", internal, may_raise=exc is None)
        if self.frame is not None and self.scope is not None:
            frame, self.frame = self.frame, None
            end_scope(self.scope, frame, exc)

    def abandon(self) -> None:
        """The stream was dropped before its end (collected, or the process exits): end the span,
        cancelled and marked interrupted, instead of leaving it open forever (issue 25)."""
        if self.frame is not None:
            try:
                self.frame.span.set_attribute(c.INTERRUPTED, True)
            except Exception as internal:  # noqa: BLE001 - a finalizer must not raise
                report_error("gymtrace.integrations.openai", internal, may_raise=False)
            self.finish(asyncio.CancelledError("stream abandoned before its end"))


def _foreign_chat_span(span: Any) -> bool:
    attributes = getattr(span, "attributes", None)
    return (
        attributes is not None
        and attributes.get(c.GEN_AI_OPERATION_NAME) == c.OPERATION_CHAT
        and c.KIND not in attributes
    )


def _wrapped_by_other_instrumentation(wrapped: Any) -> bool:
    # A wrapt wrapper from another OpenTelemetry instrumentation sits between gymtrace and openai.
    wrapper = getattr(wrapped, "_self_wrapper", None)
    return wrapper is not None and str(getattr(wrapper, "__module__", "")).startswith("opentelemetry.")


def _begin(wrapped: Any, kwargs: dict[str, Any]) -> tuple[_Call | None, Any]:
    """Decide where this request is recorded; the call and the context to run it in."""
    ctx = otel_context.get_current()
    frame = innermost_scope(ctx)
    if frame is not None and frame.kind == c.KIND_MODEL_CALL:
        return _Call(frame.span, frame=None, scope=None, enrich_only=False), None
    current = trace.get_current_span(ctx)
    if _foreign_chat_span(current):
        return _Call(current, frame=None, scope=None, enrich_only=True), None
    if _wrapped_by_other_instrumentation(wrapped):
        return None, None
    tracer = get_tracer(_tracer_provider)
    if tracer is None:
        return None, None
    model = kwargs.get("model")
    scope = model_call(model=model if isinstance(model, str) and model else None, provider=_PROVIDER)
    started = start_scope(scope, tracer)
    if started is None:
        return None, None
    if started.span.is_recording():
        started.span.set_attribute(c.GEN_AI_REQUEST_STREAM, bool(kwargs.get("stream")))
    return _Call(started.span, frame=started, scope=scope, enrich_only=False), started.context


def _destination(instance: Any) -> Any:
    """Where the client sends its requests (``base_url``); None, which gets no identity, if unknown."""
    client = getattr(instance, "_client", None)
    return getattr(client, "base_url", None)


def _headers(kwargs: dict[str, Any], context: Any, destination: Any) -> Any:
    """Put the trace (and, for a gym destination, the identity) into the request's headers; the
    context to run the request in, or None to keep ``context``."""
    # extra_headers is openai's own per-request option: the request carries the trace and identity
    # whatever HTTP client the OpenAI client was built with.
    headers = dict(kwargs.get("extra_headers") or {})
    inject(headers, context, destination=destination)
    kwargs["extra_headers"] = headers
    if may_carry_identity(destination):
        # The official httpx instrumentation, when it wraps the client's transport, injects the
        # current context's baggage over this header: for this one request to a gym destination
        # that context holds what was written here, as gymtrace's httpx transport does.
        return with_identity(context, destination=destination)
    return None


# -- streams ---------------------------------------------------------------------------------------------


class _StreamProxy(wrapt.ObjectProxy[Any]):
    """The caller's ``Stream`` or ``AsyncStream``: every chunk is seen on its way; the span ends
    with the stream. The subclasses differ only in calling the stream plainly or awaiting it."""

    def __init__(self, stream: Any, call: _Call) -> None:
        super().__init__(stream)
        self._self_call = call
        # Ends the span if the caller drops the stream after a few chunks; no-op once it finished.
        weakref.finalize(self, call.abandon)

    def _stopped(self, exc: BaseException, end: type[BaseException]) -> None:
        # Running out of chunks (``end``) is how a stream finishes, not an error on the span.
        self._self_call.finish(None if isinstance(exc, end) else exc)


class _Stream(_StreamProxy):
    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        try:
            chunk = self.__wrapped__.__next__()
        except BaseException as exc:
            self._stopped(exc, StopIteration)
            raise
        self._self_call.usage.take_chunk(chunk)
        return chunk

    def __enter__(self) -> Any:
        self.__wrapped__.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> Any:
        try:
            return self.__wrapped__.__exit__(*exc_info)
        finally:
            self._self_call.finish(exc_info[1])

    def close(self) -> None:
        try:
            self.__wrapped__.close()
        finally:
            self._self_call.finish(None)


class _AsyncStream(_StreamProxy):
    def __aiter__(self) -> AsyncIterator[Any]:
        return self

    async def __anext__(self) -> Any:
        try:
            chunk = await self.__wrapped__.__anext__()
        except BaseException as exc:
            self._stopped(exc, StopAsyncIteration)
            raise
        self._self_call.usage.take_chunk(chunk)
        return chunk

    async def __aenter__(self) -> Any:
        await self.__wrapped__.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> Any:
        try:
            return await self.__wrapped__.__aexit__(*exc_info)
        finally:
            self._self_call.finish(exc_info[1])

    async def close(self) -> None:
        try:
            await self.__wrapped__.close()
        finally:
            self._self_call.finish(None)


# -- the wrappers ----------------------------------------------------------------------------------------


def _prepare(wrapped: Any, instance: Any, kwargs: dict[str, Any]) -> tuple[_Call | None, object]:
    try:
        call, context = _begin(wrapped, kwargs)
        context = _headers(kwargs, context, _destination(instance)) or context
        token = otel_context.attach(context) if context is not None else None
        return call, token
    except Exception as exc:  # noqa: BLE001 - telemetry must not break the caller
        report_error("gymtrace.integrations.openai", exc)
        return None, None


def _after(call: _Call | None, result: Any, stream: bool, asynchronous: bool) -> Any:
    if call is None:
        return result
    try:
        if stream and not hasattr(result, "parse"):
            return (_AsyncStream if asynchronous else _Stream)(result, call)
        # with_raw_response returns a LegacyAPIResponse: its parsed body is what counts.
        call.usage.take_response(result.parse() if hasattr(result, "parse") else result)
        call.finish(None)
    except Exception as exc:  # noqa: BLE001 - telemetry must not break the caller
        report_error("gymtrace.integrations.openai", exc)
    return result


@contextmanager
def _request(wrapped: Any, instance: Any, kwargs: dict[str, Any]) -> Iterator[_Call | None]:
    """Around one ``create`` (sync or async): the request runs in the call's context and a request
    that raises ends the call's span with its exception."""
    call, token = _prepare(wrapped, instance, kwargs)
    try:
        yield call
    except BaseException as exc:
        if call is not None:
            call.finish(exc)
        raise
    finally:
        if token is not None:
            otel_context.detach(token)  # type: ignore[arg-type]


def _create(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    with _request(wrapped, instance, kwargs) as call:
        result = wrapped(*args, **kwargs)
    return _after(call, result, bool(kwargs.get("stream")), asynchronous=False)


async def _acreate(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    with _request(wrapped, instance, kwargs) as call:
        result = await wrapped(*args, **kwargs)
    return _after(call, result, bool(kwargs.get("stream")), asynchronous=True)


def instrument(*, tracer_provider: trace.TracerProvider | None = None) -> None:
    """Trace every ``chat.completions.create`` of the ``openai`` package. Idempotent; a second call
    changes only the provider.

    ``tracer_provider``: where the ``chat`` spans go (default: the global provider).
    Call it before ``OpenAIInstrumentor().instrument()`` if you use both (see the module docs).
    """
    global _instrumented, _tracer_provider
    check_tracer_provider(tracer_provider, "openai.instrument()")
    with _lock:
        _tracer_provider = tracer_provider
        if _instrumented:
            return
        wrapt.wrap_function_wrapper(_completions, "Completions.create", _create)
        wrapt.wrap_function_wrapper(_completions, "AsyncCompletions.create", _acreate)
        _instrumented = True


def uninstrument() -> None:
    """Undo :func:`instrument`. Undo instrumentations in reverse order: OpenTelemetry's
    ``uninstrument()`` removes whichever wrapper is outermost."""
    global _instrumented, _tracer_provider
    with _lock:
        _tracer_provider = None
        if not _instrumented:
            return
        removed = [_unwrap(cls) for cls in (_completions.Completions, _completions.AsyncCompletions)]
        _instrumented = not all(removed)


def _unwrap(cls: type) -> bool:
    outer: Any = cls.__dict__["create"]
    if getattr(outer, "_self_wrapper", None) in (_create, _acreate):
        setattr(cls, "create", outer.__wrapped__)  # noqa: B010
        return True
    # Another instrumentation wrapped after gymtrace; removing gymtrace's wrapper from under it
    # would mean rebuilding its wrapper. Undo in reverse order instead.
    warn_once(
        ("openai uninstrument", cls),
        f"{cls.__name__}.create is wrapped by another instrumentation; uninstrument that first",
    )
    return False
