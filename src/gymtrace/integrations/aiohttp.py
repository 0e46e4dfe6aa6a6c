"""aiohttp: send the trace and the gym identity with every request.

Example::

    import aiohttp
    from gymtrace.integrations.aiohttp import aiohttp_trace_config, instrument

    session = aiohttp.ClientSession(trace_configs=[aiohttp_trace_config()])
    instrument()      # instead, or as well, beside opentelemetry-instrumentation-aiohttp-client

Each request gets ``traceparent``/``tracestate`` and, when it goes to a gym destination (loopback,
``GYMTRACE_PROPAGATE_TO``, a server the framework calls its own), a ``baggage`` header with the gym
identity; elsewhere (a model provider, any unknown host) only the keys of
``GYMTRACE_BAGGAGE_ALLOW`` go, never the identity. The official
``opentelemetry-instrumentation-aiohttp-client`` makes the CLIENT spans beside it. Needs
``gymtrace[aiohttp]``. Two ways, for two set-ups:

- ``aiohttp_trace_config()`` for ``ClientSession(trace_configs=[...])``, enough on its own;
- ``instrument()``, which runs every ``ClientSession`` request inside the context whose baggage is
  what may leave the process (gym identity, signed when a secret is set, plus
  ``GYMTRACE_BAGGAGE_ALLOW``). Needed beside ``opentelemetry-instrumentation-aiohttp-client``:
  that instrumentor's trace config always runs after the caller's ones and injects the *current*
  context's baggage, which overwrote the trace config's header with the application's own baggage
  (a user's e-mail address out, gym identity dropped). A trace config cannot fix it:
  aiohttp gives it no way to wrap the request, and attaching a context in one callback and
  detaching it in another would unwind out of order with the instrumentor's own attach.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

try:
    import aiohttp
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("gymtrace.integrations.aiohttp needs aiohttp: pip install 'gymtrace[aiohttp]'") from exc

import wrapt
from multidict import CIMultiDict
from opentelemetry import context as otel_context

from gymtrace.instrumentation import inject_context, report_error
from gymtrace.propagation import inject, with_identity

__all__ = ["aiohttp_trace_config", "instrument", "uninstrument"]

_OUTGOING_KEY = otel_context.create_key("gymtrace.aiohttp.outgoing")


async def _on_request_start(
    session: aiohttp.ClientSession, context: SimpleNamespace, params: aiohttp.TraceRequestStartParams
) -> None:
    # The current context is the caller's, or the official instrumentation's CLIENT span when its
    # trace config ran first: either way the right parent.
    try:
        if otel_context.get_value(_OUTGOING_KEY) is None:  # instrument() already injected
            inject(params.headers, continuation=False, destination=params.url)
    except Exception as exc:  # noqa: BLE001 - telemetry must not break the request
        report_error("gymtrace.http aiohttp trace config", exc)


def aiohttp_trace_config() -> aiohttp.TraceConfig:
    """A ``TraceConfig`` for ``aiohttp.ClientSession(trace_configs=[...])``.

    With ``opentelemetry-instrumentation-aiohttp-client`` installed, call :func:`instrument`
    instead (or as well).
    """
    config = aiohttp.TraceConfig()
    config.on_request_start.append(_on_request_start)
    return config


_lock = threading.Lock()
_instrumented = False


def _destination(session: Any, str_or_url: Any) -> Any:
    """The URL a ``_request(method, str_or_url)`` goes to: joined with the session's ``base_url``
    when it has one, so a relative path is judged by its real host."""
    build = getattr(session, "_build_url", None)
    if str_or_url is not None and callable(build) and getattr(session, "_base_url", None) is not None:
        return build(str_or_url)
    return str_or_url


async def _request_with_identity(
    wrapped: Callable[..., Awaitable[Any]], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    token = None
    try:
        # _request(method, url, ...): identity goes only to gym destinations.
        destination = _destination(instance, args[1] if len(args) > 1 else kwargs.get("str_or_url"))
        ctx = otel_context.set_value(_OUTGOING_KEY, True, with_identity(destination=destination))
        headers: CIMultiDict[str] = CIMultiDict(kwargs.get("headers") or {})
        inject_context(headers, ctx)
        kwargs["headers"] = headers
        # Attached for the whole request, so the official instrumentor's attach nests inside.
        token = otel_context.attach(ctx)
    except Exception as exc:  # noqa: BLE001 - telemetry must not break the request
        report_error("gymtrace aiohttp instrument", exc)
    try:
        return await wrapped(*args, **kwargs)
    finally:
        if token is not None:
            otel_context.detach(token)


def instrument() -> None:
    """Send the trace and the gym identity with every ``aiohttp.ClientSession`` request. Idempotent."""
    global _instrumented
    with _lock:
        if not _instrumented:
            wrapt.wrap_function_wrapper(aiohttp.ClientSession, "_request", _request_with_identity)
            _instrumented = True


def uninstrument() -> None:
    global _instrumented
    with _lock:
        if _instrumented:
            wrapper = aiohttp.ClientSession.__dict__["_request"]
            aiohttp.ClientSession._request = wrapper.__wrapped__  # type: ignore[method-assign]
            _instrumented = False
