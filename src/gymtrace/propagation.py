"""Carry a trace and its gym identity across process boundaries.

The W3C ``traceparent``/``tracestate`` headers carry the trace; W3C ``baggage`` carries the gym
identity keys (``gym.rollout.id``, ``gym.episode.attempt``, ...) and nothing else, because baggage
travels on every outgoing request, model providers included. Both go through
``opentelemetry.propagate``, so ``OTEL_PROPAGATORS`` is honoured (leave ``baggage`` in it, or the
identity stays behind).

Example::

    # client side
    headers = gymtrace.propagation.inject({})
    requests.post(url, json=task, headers=headers)

    # server side (or use gymtrace.integrations.asgi.GymTraceMiddleware)
    with gymtrace.propagation.attach(request.headers):
        handle(task)                      # spans here join the client's trace and rollout

    # child process or sandbox
    subprocess.run(cmd, env={**os.environ, **gymtrace.propagation.env_carrier()})
    # ...and in the child:  with gymtrace.propagation.attach(os.environ): ...

    # thread and process pools (implemented in gymtrace.integrations.concurrent)
    future = gymtrace.propagation.submit(pool, score, answer)

Nothing here raises into the caller: a broken carrier gives a context without a remote parent,
and identity values that are not short printable text (or small non-negative integers) are dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from opentelemetry import baggage, propagate
from opentelemetry import context as otel_context
from opentelemetry.propagators.textmap import Getter

from gymtrace import _constants as c
from gymtrace._errors import internal_error
from gymtrace._scope import FRAME_KEY, MAX_ID_LENGTH, ActiveScope

__all__ = [
    "ContextCarrier",
    "attach",
    "carry",
    "env_carrier",
    "extract",
    "identity_from_context",
    "inject",
    "map",
    "submit",
    "with_identity",
]

if TYPE_CHECKING:
    from gymtrace.integrations.concurrent import ContextCarrier, carry, map, submit

_POOL_HELPERS = frozenset({"ContextCarrier", "carry", "map", "submit"})


def __getattr__(name: str) -> Any:
    # The pool helpers live in gymtrace.integrations.concurrent, which builds on this module;
    # loading them on first use keeps the import graph pointing one way.
    if name in _POOL_HELPERS:
        from gymtrace.integrations import concurrent

        return getattr(concurrent, name)
    raise AttributeError(f"module 'gymtrace.propagation' has no attribute {name!r}")


# Identity values arriving from outside are bounded: an ID is short printable text.
_MAX_INT = 1_000_000_000
_REMOTE_KIND = "remote"


# -- identity <-> baggage ---------------------------------------------------------------------------


def _clean(key: str, raw: object) -> str | int | None:
    if isinstance(raw, int) and not isinstance(raw, bool):
        raw = str(raw)
    # str.isprintable() also refuses format characters (U+202E right-to-left override, zero-width
    # spaces) and line separators, which percent-decoding can smuggle into an ID.
    if not isinstance(raw, str) or not raw or len(raw) > MAX_ID_LENGTH or not raw.isprintable():
        return None
    if key in c.INT_IDENTITY_KEYS:
        if not raw.isascii() or not raw.isdigit() or len(raw) > 10:
            return None
        number = int(raw)
        return number if number <= _MAX_INT else None
    return raw


def _clean_identity(entries: Mapping[str, object]) -> dict[str, str | int]:
    """Keep the gym identity keys whose values are short printable text (or small ints)."""
    identity: dict[str, str | int] = {}
    for key in c.IDENTITY_KEYS:
        if key in entries:
            value = _clean(key, entries[key])
            if value is not None:
                identity[key] = value
    return identity


def identity_from_context(ctx: otel_context.Context | None = None) -> dict[str, str | int]:
    """The gym identity carried in a context's baggage, validated (bad values are dropped)."""
    entries = baggage.get_all(ctx)
    return _clean_identity(entries) if entries else {}


def _identity_of(ctx: otel_context.Context) -> dict[str, str | int]:
    frame = ctx.get(FRAME_KEY)
    if isinstance(frame, ActiveScope) and frame.kind != "disabled":
        return frame.identity
    return identity_from_context(ctx)


def with_identity(context: otel_context.Context | None = None) -> otel_context.Context:
    """``context`` (default: the current one) with its baggage replaced by the gym identity.

    Every propagator then sends the identity and nothing else as ``baggage``: attach this context
    around a call that another instrumentation injects headers for.
    """
    ctx = context if context is not None else otel_context.get_current()
    identity = _identity_of(ctx)
    ctx = baggage.clear(ctx)
    for key, value in identity.items():
        ctx = baggage.set_baggage(key, str(value), ctx)
    return ctx


# -- carriers ---------------------------------------------------------------------------------------


def _folded(name: str) -> str:
    # One spelling for header and environment names: TRACEPARENT, traceparent, X_B3_TRACEID and
    # x-b3-traceid are the same key (specification context/env-carriers.md).
    return name.lower().replace("_", "-")


def _text(value: Any) -> str | None:
    if isinstance(value, str):
        # os.environ turns every byte that is not UTF-8 into a lone surrogate, which the SDK's
        # propagators cannot encode: such a value is garbage, so it is ignored, not raised.
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return None
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("latin-1")
    return None


def _items(carrier: Any) -> Iterable[tuple[Any, Any]]:
    if isinstance(carrier, Mapping):
        multi = getattr(carrier, "multi_items", None)  # starlette Headers keep repeated headers
        if callable(multi):
            return multi()  # type: ignore[no-any-return]
        return carrier.items()
    pairs: Iterable[tuple[Any, Any]] = carrier  # a list of (name, value) pairs (ASGI headers)
    return pairs


def _index(carrier: Any) -> dict[str, str]:
    """Case- and separator-insensitive view of a carrier; repeated headers are joined with ``,``
    as HTTP allows for ``tracestate`` and ``baggage``."""
    index: dict[str, str] = {}
    for key, raw in _items(carrier):
        name = _text(key)
        if name is None:
            continue
        values = raw if isinstance(raw, (list, tuple)) else (raw,)
        for item in values:
            value = _text(item)
            if value is None:
                continue
            folded = _folded(name)
            index[folded] = f"{index[folded]},{value}" if folded in index else value
    return index


class _IndexGetter(Getter[Mapping[str, str]]):
    def get(self, carrier: Mapping[str, str], key: str) -> list[str] | None:
        value = carrier.get(_folded(key))
        return [value] if value is not None else None

    def keys(self, carrier: Mapping[str, str]) -> list[str]:
        return list(carrier)


_GETTER = _IndexGetter()


def inject(
    carrier: MutableMapping[str, str] | None = None, context: otel_context.Context | None = None
) -> MutableMapping[str, str]:
    """Write ``traceparent``, ``tracestate`` and the gym identity (``baggage``) into ``carrier``.

    Returns the carrier (a new dict when none is given). The ``baggage`` written holds the gym
    identity only, never other baggage entries of the context.
    """
    if carrier is None:
        carrier = {}
    try:
        propagate.inject(carrier, context=with_identity(context))
    except Exception as exc:  # noqa: BLE001 - telemetry must not break the caller
        internal_error("gymtrace.propagation.inject", exc)
    return carrier


def extract(carrier: Any, context: otel_context.Context | None = None) -> otel_context.Context:
    """A context that continues the trace and gym identity described by ``carrier``.

    ``carrier`` is a mapping of HTTP headers or environment variables (any case), or a list of
    ``(name, value)`` pairs such as ASGI headers. The context's baggage is the validated gym
    identity only; scopes and other libraries' spans started under it inherit that identity.
    """
    base = context if context is not None else otel_context.Context()
    try:
        ctx = propagate.extract(_index(carrier), context=base, getter=_GETTER)
        return _with_remote_frame(ctx, identity_from_context(ctx))
    except Exception as exc:  # noqa: BLE001 - telemetry must not break the caller
        internal_error("gymtrace.propagation.extract", exc)
        return base


def _with_remote_frame(ctx: otel_context.Context, identity: dict[str, str | int]) -> otel_context.Context:
    ctx = baggage.clear(ctx)
    if not identity:
        return ctx
    for key, value in identity.items():
        ctx = baggage.set_baggage(key, str(value), ctx)
    frame = ActiveScope(_REMOTE_KIND, None)
    frame.identity = identity
    return otel_context.set_value(FRAME_KEY, frame, ctx)


@contextmanager
def attach(carrier: Any) -> Iterator[otel_context.Context]:
    """Continue the remote trace and gym identity in ``carrier`` for the duration of the block.

    ``attach(os.environ)`` continues the trace a parent process passed with :func:`env_carrier`.
    """
    ctx = extract(carrier)
    token = otel_context.attach(ctx)
    try:
        yield ctx
    finally:
        otel_context.detach(token)


def env_carrier(context: otel_context.Context | None = None) -> dict[str, str]:
    """``TRACEPARENT``/``TRACESTATE``/``BAGGAGE`` for a child process's environment.

    Follows the OpenTelemetry environment-variable carrier specification (names upper-cased,
    ``-`` becomes ``_``); the child continues with ``gymtrace.propagation.attach(os.environ)``.
    """
    headers = inject({}, context)
    return {key.upper().replace("-", "_"): value for key, value in headers.items()}
