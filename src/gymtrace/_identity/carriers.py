"""Carriers at a process boundary: headers and environments in, a continued gym context out (and a
context written into one).

What ``gymtrace.propagation`` and the instrumentations share to continue a caller's trace and gym
scope: a case- and separator-insensitive view of any carrier (HTTP headers, ASGI header pairs,
``os.environ``), the W3C Baggage header split the W3C way (limits, grammar, percent-decoding), the
gym identity in it that this process believes (``_identity/trust.py``), and the frame that stands
for the caller's episode or rollout in this process. Apart from the public module because it is
the parsing and the trust decisions, which the public functions and their docstrings only call.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any, NamedTuple
from urllib.parse import quote, unquote

from opentelemetry import baggage, propagate, trace
from opentelemetry import context as otel_context
from opentelemetry.propagators.textmap import (
    CarrierT,
    Getter,
    Setter,
    TextMapPropagator,
    default_getter,
    default_setter,
)

from gymtrace import _constants as c
from gymtrace._identity import trust as _trust
from gymtrace._model.errors import internal_error, logger
from gymtrace._model.ids import clean_identity, clean_step_number, episode_id
from gymtrace._scopes.active_scope import CALLER_KEY, DISABLED_KIND, REMOTE_KIND, SCOPE_KEY, ActiveScope
from gymtrace._scopes.scope_carrier import read_carrier


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


def carrier_index(carrier: Any) -> dict[str, list[str]]:
    """Case- and separator-insensitive view of a carrier. Repeated headers keep every value, in
    order, so each propagator takes them as it takes them from the official instrumentations'
    getters: the first ``traceparent``, the first ``baggage``, all ``tracestate``."""
    index: dict[str, list[str]] = {}
    for key, raw in _items(carrier):
        name = _text(key)
        if name is None:
            continue
        values = raw if isinstance(raw, (list, tuple)) else (raw,)
        for item in values:
            value = _text(item)
            if value is not None:
                index.setdefault(_folded(name), []).append(value)
    return index


class _IndexGetter(Getter[Mapping[str, list[str]]]):
    def get(self, carrier: Mapping[str, list[str]], key: str) -> list[str] | None:
        return carrier.get(_folded(key))

    def keys(self, carrier: Mapping[str, list[str]]) -> list[str]:
        return list(carrier)


GETTER = _IndexGetter()

# W3C Baggage limits, as OpenTelemetry's propagator applies them: a longer header is dropped whole.
_MAX_BAGGAGE_BYTES = 8192
_MAX_BAGGAGE_ENTRIES = 180
_MAX_ENTRY_BYTES = 4096
# W3C Baggage grammar: key is an RFC 7230 token; value is baggage-octets, percent-encoded.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_VALUE = re.compile(r"[\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]*")


class Baggage(NamedTuple):
    """One ``baggage`` header split the W3C way: the ``gym.*`` entries (values decoded, properties
    stripped, ``+`` kept), the other well-formed entries re-joined, and how many were malformed."""

    gym: dict[str, str]
    other: str
    dropped: int


# baggage-octet minus "%" (the escape itself): these stay as they are, everything else is encoded.
_SAFE = "!#$&'()*+-./:<=>?@[]^_`{|}~"
# Text that quote() returns unchanged (its always-safe characters and _SAFE): nearly every identity
# value, which is then written without quote()'s encoding round trip.
_PLAIN = re.compile(r"[A-Za-z0-9_.\-~!#$&'()*+/:<=>?@\[\]^`{|}]*")


def _encoded(value: object) -> str:
    text = str(value)
    return text if _PLAIN.fullmatch(text) else quote(text, safe=_SAFE)


# The last header written and its entries, all text: the requests of one step send the same identity.
_last_header: tuple[tuple[tuple[str, object], ...], str] = ((), "")


def format_baggage(entries: Mapping[str, object]) -> str:
    global _last_header
    pairs = tuple(entries.items())
    last_pairs, last_header = _last_header
    try:
        if pairs and pairs == last_pairs:
            return last_header
    except Exception:  # noqa: BLE001 - an application value whose == does not answer a bool
        pass
    header = ",".join(f"{_encoded(k)}={_encoded(v)}" for k, v in pairs)
    if all(type(k) is str and type(v) is str for k, v in pairs):
        _last_header = (pairs, header)
    return header


def write_carrier(carrier: MutableMapping[str, str], ctx: otel_context.Context) -> None:
    """Write ``ctx`` (a context ``propagation.with_identity`` made: its baggage is what may go)
    into ``carrier`` with the global propagators, the ``baggage`` header percent-encoded.

    OpenTelemetry Python writes a space as "+", which W3C Baggage gives no meaning (and which
    receivers must keep as "+"), so gymtrace writes the entries itself, where the propagators
    write baggage at all; they are handed the context without it, rather than encoding it to be
    overwritten (half of a request's cost in the aiohttp and httpx hooks).
    """
    entries = baggage.get_all(ctx)
    ours = bool(entries) and "baggage" in propagate.get_global_textmap().fields
    propagate.inject(carrier, context=baggage.clear(ctx) if ours else ctx)
    if ours or "baggage" in carrier:
        carrier["baggage"] = format_baggage(entries)


def _split_baggage(header: str | None) -> Baggage:
    if not header:
        return Baggage({}, "", 0)
    if len(header.encode("utf-8", "surrogatepass")) > _MAX_BAGGAGE_BYTES:
        return Baggage({}, "", 1)
    gym: dict[str, str] = {}
    other: list[str] = []
    dropped = 0
    for number, member in enumerate(header.split(",")):
        member = member.strip(" \t")
        if not member:
            continue
        if number >= _MAX_BAGGAGE_ENTRIES or len(member) > _MAX_ENTRY_BYTES:
            dropped += 1
            continue
        pair, _, _properties = member.partition(";")
        key, eq, value = pair.partition("=")
        key, value = key.strip(" \t"), value.strip(" \t")
        if not eq or not _TOKEN.fullmatch(key) or not _VALUE.fullmatch(value):
            dropped += 1
            continue
        if key.startswith("gym."):
            # W3C Baggage percent-decodes values and gives "+" no meaning (unquote_plus would
            # turn an ID's "+" into a space). The first entry of a key wins, like the header.
            try:
                decoded = unquote(value, errors="strict") if "%" in value else value
            except UnicodeDecodeError:
                dropped += 1
                continue
            gym.setdefault(key, decoded)
        else:
            # Properties (";ttl=30") are metadata about an entry, not part of its value.
            other.append(f"{key}={value}")
    return Baggage(gym, ",".join(other), dropped)


def _report_dropped(dropped: int) -> None:
    # At most one line per process per minute, whatever a caller sends.
    global _last_report
    now = time.monotonic()
    if dropped and now - _last_report > 60.0:
        _last_report = now
        logger.warning("gymtrace: ignored %d malformed or oversized incoming baggage entries", dropped)


_last_report = -1e9


class Incoming(NamedTuple):
    """What the global propagator read of one request's ``baggage`` header (see
    :class:`IdentityPropagator`): the header, the identity this process believed, the split."""

    header: str
    identity: dict[str, str | int]
    parsed: Baggage


# The context entry where IdentityPropagator leaves what it read, for the readers below.
INCOMING_KEY = otel_context.create_key("gymtrace.incoming-baggage")


def incoming_identity(
    header: str | None, *, trusted: bool | None = None, context: otel_context.Context | None = None
) -> tuple[dict[str, str | int], Baggage]:
    """The identity in a raw ``baggage`` header that this process believes, and the split header.

    ``context``: one the global propagator extracted from the same request (an HTTP server span's);
    the identity it read from this very header is taken rather than read again."""
    if context is not None and trusted is None and header:
        known = context.get(INCOMING_KEY)
        if isinstance(known, Incoming) and known.header == header:
            return known.identity, known.parsed
    parsed = _split_baggage(header)
    _report_dropped(parsed.dropped)
    identity = _trust.accept(
        clean_identity(parsed.gym), parsed.gym.get(_trust.SIGNATURE_KEY), trusted=trusted
    )
    return identity, parsed


def remote_context(
    ctx: otel_context.Context, identity: dict[str, str | int], step_base: object = None
) -> otel_context.Context:
    """``ctx`` without ``gym.*`` baggage and, when ``identity`` (already believed) names one, the
    caller's gym scope continued here: a frame that stands for the caller's episode (or rollout) so
    that verify(), record_reward(), record_failure(), step() and turn() work as in the caller's
    process. It has no span here; outcomes recorded on it become outcome records.

    The identity lives only in that frame, never in OpenTelemetry baggage: another
    instrumentation's ``propagate.inject()`` sends the context's baggage to any host, so the
    ``gym.*`` entries an extraction put there (the official ASGI middleware's, a user's) are
    removed (issue 31). Application baggage stays."""
    if step_base is None:
        known = ctx.get(INCOMING_KEY)
        step_base = (
            known.parsed.gym.get(c.STEP_BASE)
            if isinstance(known, Incoming)
            else baggage.get_baggage(c.STEP_BASE, ctx)
        )
    base_number = clean_step_number(step_base)
    entries = baggage.get_all(ctx)
    if any(key.startswith("gym.") for key in entries):
        ctx = baggage.clear(ctx)
        for key, value in entries.items():
            if not key.startswith("gym."):
                ctx = baggage.set_baggage(key, value, ctx)
    if not identity:
        return ctx
    if c.EPISODE_ATTEMPT in identity:
        kind = c.KIND_EPISODE
    elif c.ROLLOUT_ID in identity:
        kind = c.KIND_ROLLOUT
    else:
        kind = REMOTE_KIND
    frame = ActiveScope(kind, None)
    frame.remote = True
    frame.identity = identity
    frame.span = trace.NonRecordingSpan(trace.get_current_span(ctx).get_span_context())
    attempt = identity.get(c.EPISODE_ATTEMPT)
    if isinstance(attempt, int):
        frame.attempt = attempt
    if isinstance(base_number, int) and base_number > 0:
        frame.continue_steps_from(base_number)
    return otel_context.set_value(SCOPE_KEY, frame, ctx)


def caller_context(ctx: otel_context.Context, carrier: Any) -> otel_context.Context:
    """``ctx`` noting the span ``carrier``'s trace context names (``traceparent``, or whatever
    ``OTEL_PROPAGATORS`` reads) as a caller outside the gym; ``ctx`` itself when it names none.

    For a request that came without a gym identity this process believes: a rollout or train step
    opened for it is the root of its own trace with a ``caller`` link to that span, even where a
    local span (the request's HTTP server span, a child of the caller's) is current when it opens."""
    index = carrier_index(carrier)
    index.pop("baggage", None)  # only the trace context is wanted here
    caller = trace.get_current_span(propagate.extract(index, getter=GETTER)).get_span_context()
    return otel_context.set_value(CALLER_KEY, caller, ctx) if caller.is_valid else ctx


def from_scope_carrier(carrier: Mapping[str, Any], base: otel_context.Context) -> otel_context.Context:
    """A context from :meth:`gymtrace.ActiveScope.carrier`: a later phase scoring the attempt the
    carrier was taken in (or, taken outside an episode, the rollout)."""
    identity, _, rollout_span, episode_span = read_carrier(carrier)
    attempt = carrier.get("attempt")
    if isinstance(attempt, int) and not isinstance(attempt, bool) and attempt >= 0:
        identity[c.EPISODE_ATTEMPT] = attempt
        rollout_id = identity.get(c.ROLLOUT_ID)
        if isinstance(rollout_id, str):
            identity[c.EPISODE_ID] = episode_id(rollout_id, attempt)
    parent = rollout_span if rollout_span is not None else episode_span
    ctx = trace.set_span_in_context(trace.NonRecordingSpan(parent), base) if parent is not None else base
    return remote_context(ctx, identity)


# A context whose baggage came from some other extraction (the official ASGI middleware's, a user's
# propagate.extract()) holds whatever the caller sent: what of it is believed is decided once per
# baggage mapping. Spans started under one request context share that mapping, so the last answer
# is kept (with a reference to the mapping, so its id cannot be reused).
_last_foreign: tuple[object, dict[str, str | int]] = (None, {})


def identity_from_context(ctx: otel_context.Context | None = None) -> dict[str, str | int]:
    """The gym identity this context carries and this process believes.

    Inside gym scopes and contexts made by :func:`extract` (or continued by the middlewares) that
    is their (already trusted) identity, kept in gymtrace's own context entry; in a context the
    global propagator extracted under :class:`IdentityPropagator`, the identity it believed then.
    Otherwise, in a context another extraction made (the official ASGI middleware's server span, a user's
    ``propagate.extract()``), the ``gym.*`` entries of its baggage, validated and subject to
    ``GYMTRACE_TRUST_IDENTITY`` (``none``: nothing; ``signed``: only with a valid ``gym.sig``).
    """
    if ctx is None:
        ctx = otel_context.get_current()
    frame = ctx.get(SCOPE_KEY)
    if isinstance(frame, ActiveScope):
        return frame.identity if frame.kind != DISABLED_KIND else {}
    known = ctx.get(INCOMING_KEY)
    if isinstance(known, Incoming):
        return known.identity
    entries = baggage.get_all(ctx)
    if not entries:
        return {}
    global _last_foreign
    seen, identity = _last_foreign
    if seen is entries:
        return identity
    # OpenTelemetry's baggage propagator keeps a property in the value (``r-1;ttl=30``).
    identity = clean_identity(
        {k: v.split(";", 1)[0].strip() if isinstance(v, str) else v for k, v in entries.items()}
    )
    identity = _trust.accept(identity, entries.get(_trust.SIGNATURE_KEY))
    _last_foreign = (entries, identity)
    return identity


class _OtherBaggage(Getter[Any]):
    """``getter`` with the ``baggage`` header replaced by its entries that are not gym identity."""

    __slots__ = ("getter", "other")

    def __init__(self, getter: Getter[Any], other: str) -> None:
        self.getter = getter
        self.other = other

    def get(self, carrier: Any, key: str) -> list[str] | None:
        if key == "baggage":
            return [self.other] if self.other else None
        return self.getter.get(carrier, key)

    def keys(self, carrier: Any) -> list[str]:
        return self.getter.keys(carrier)


class IdentityPropagator(TextMapPropagator):
    """The global propagator, with the gym identity of an incoming ``baggage`` header read once,
    by gymtrace, wherever a context is extracted (FastAPI's own telemetry, the official ASGI
    middleware, a user's ``propagate.extract``).

    The ``gym.*`` entries are split off the header and believed as ``GYMTRACE_TRUST_IDENTITY``
    says; ``inner`` extracts the rest (the trace context, the application's baggage), so
    OpenTelemetry's baggage propagator never parses the identity, which it would percent-decode
    into baggage entry by entry only for gymtrace to read and remove them again. What was read
    goes into the context (:data:`INCOMING_KEY`), where the identity processor, the middlewares
    and :func:`remote_context` take it. Injecting is ``inner``'s. With ``baggage`` not among
    ``inner``'s fields (``OTEL_PROPAGATORS`` without it) it changes nothing."""

    def __init__(self, inner: TextMapPropagator) -> None:
        self.inner = inner

    def extract(
        self,
        carrier: CarrierT,
        context: otel_context.Context | None = None,
        getter: Getter[CarrierT] = default_getter,
    ) -> otel_context.Context:
        inner = self.inner
        try:
            values = getter.get(carrier, "baggage")
            header = values[0] if values else None
            if not header or "gym." not in header or "baggage" not in inner.fields:
                return inner.extract(carrier, context, getter)
            identity, parsed = incoming_identity(header)
            ctx = inner.extract(carrier, context, _OtherBaggage(getter, parsed.other))
            return otel_context.set_value(INCOMING_KEY, Incoming(header, identity, parsed), ctx)
        except Exception as exc:  # noqa: BLE001 - telemetry must not break the caller
            internal_error("gymtrace identity propagator", exc)
        return inner.extract(carrier, context, getter)

    def inject(
        self,
        carrier: CarrierT,
        context: otel_context.Context | None = None,
        setter: Setter[CarrierT] = default_setter,
    ) -> None:
        self.inner.inject(carrier, context, setter)

    @property
    def fields(self) -> set[str]:
        return self.inner.fields


def install_propagator() -> None:
    """Wrap the global propagator in :class:`IdentityPropagator` (once; a propagator set later by
    the application replaces it, and identity is then read from the baggage as before)."""
    current = propagate.get_global_textmap()
    if not isinstance(current, IdentityPropagator):
        propagate.set_global_textmap(IdentityPropagator(current))


def uninstall_propagator() -> None:
    """The global propagator :func:`install_propagator` wrapped, set back (``gymtrace.testing.reset``)."""
    current = propagate.get_global_textmap()
    if isinstance(current, IdentityPropagator):
        propagate.set_global_textmap(current.inner)
