"""Content capture: prompts, messages, tool arguments and tool results, off by default.

Example::

    import gymtrace

    with gymtrace.model_call(model="qwen-7b"):
        reply = client.chat(messages)
        gymtrace.record_content(input=messages, output=[reply])   # nothing unless capture is on

    with gymtrace.tool_call(tool_name="search"):
        result = search(**arguments)
        gymtrace.record_content(input=arguments, output=result)

The trace is not the trajectory record (README, "The vocabulary"): by default nothing is recorded.
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` (or ``configure(capture_content=...)``) turns
it on. Then every value is

1. copied into plain JSON data by walking only ``dict``, ``list``, ``tuple``, ``str``, ``int``,
   ``float``, ``bool`` and ``None`` through their built-in methods (never the user's ``__repr__``,
   ``__iter__``, properties, ...); anything else becomes ``"<ClassName>"``; cycles, deep nesting,
   bytes and non-finite floats become short markers; the walk stops once the byte budget is spent,
   so a huge value costs no more than a small one;
2. redacted: values under keys that look like secrets become ``"[REDACTED]"``, then the user's
   redaction hook (if any) sees the copy, never the original;
3. serialised to JSON text and cut to the per-value and per-span byte budgets, visibly
   (``…[truncated N bytes]``).

The budgets are what keeps an OTLP export request under gRPC's 4 MiB limit; see
:func:`export_batch_limit` for the arithmetic.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import re
import threading
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any, Final

from gymtrace import _constants as c
from gymtrace import _environment as env
from gymtrace._errors import (
    GymTraceError,
    InvalidArgumentError,
    contract_problem,
    first_time,
)

logger = logging.getLogger("gymtrace")

# -- modes ----------------------------------------------------------------------------------------

NO_CONTENT: Final = "NO_CONTENT"
SPAN_ONLY: Final = "SPAN_ONLY"
EVENT_ONLY: Final = "EVENT_ONLY"
SPAN_AND_EVENT: Final = "SPAN_AND_EVENT"
MODES: Final = (NO_CONTENT, SPAN_ONLY, EVENT_ONLY, SPAN_AND_EVENT)
# The variable was a boolean before the GenAI conventions made it an enum. gymtrace writes traces
# only, so "true" means the span attributes, where the conventions put content on spans.
_LENIENT: Final = {
    "true": SPAN_ONLY,
    "1": SPAN_ONLY,
    "yes": SPAN_ONLY,
    "on": SPAN_ONLY,
    "false": NO_CONTENT,
    "0": NO_CONTENT,
    "no": NO_CONTENT,
    "off": NO_CONTENT,
    "": NO_CONTENT,
}

# -- budgets and the 4 MiB arithmetic -----------------------------------------------------------------

DEFAULT_MAX_VALUE_BYTES: Final = 16 * 1024
DEFAULT_MAX_SPAN_BYTES: Final = 32 * 1024
MIN_VALUE_BYTES: Final = 256  # room for a marker and some text
# gRPC's default maximum message size, which the Collector's OTLP receiver keeps
# (max_recv_msg_size_mib: 4): a larger export request is rejected whole.
GRPC_MESSAGE_LIMIT: Final = 4 * 1024 * 1024
# Per request: resource and scope (service name, SDK attributes) plus protobuf and gRPC framing.
REQUEST_OVERHEAD: Final = 64 * 1024
# Per span, everything that is not captured content: name, IDs, times, status, gym identity and
# GenAI attributes, links, an exception event with its stack trace. An assumption, documented:
# spans that carry more non-content data than this (huge user attributes) are outside the guarantee.
SPAN_OVERHEAD: Final = 8 * 1024
MAX_SPAN_BYTES: Final = GRPC_MESSAGE_LIMIT - REQUEST_OVERHEAD - SPAN_OVERHEAD  # one span per request
MAX_DEPTH: Final = 32
# UTF-8 bytes of "…[truncated N chars]" with N up to 10**16.
_STRING_MARKER: Final = 34
# A span with less budget left than this gets no more values (counted in gym.content.omitted).
_MIN_PIECE: Final = 64
# json.loads() of a string that looks like JSON (tool arguments from a model) only below this size,
# so its keys can be redacted; longer strings are cut as text.
_MAX_PARSE_CHARS: Final = 1024 * 1024

REDACTED: Final = "[REDACTED]"
_HOOK_FAILED: Final = "[REDACTED: the redaction hook failed]"


def export_batch_limit(max_span_bytes: int) -> int:
    """The most spans one OTLP export request may carry so that it stays under 4 MiB.

    ``(4 MiB - 64 KiB request overhead) // (span budget + 8 KiB per-span overhead)``. With the
    default 32 KiB budget: ``4_128_768 // 40_960 = 100`` spans, and a full request is at most
    ``100 * 40_960 + 65_536 = 4_161_536`` bytes, under ``4_194_304``.
    """
    return max(1, (GRPC_MESSAGE_LIMIT - REQUEST_OVERHEAD) // (max_span_bytes + SPAN_OVERHEAD))


# -- redaction: the default secret keys ---------------------------------------------------------------

# Normalised keys (lower case, only letters and digits) ending in one of these are secrets. Suffixes
# so that "openai_api_key", "X-Api-Key", "accessToken" and "client_secret" match; "token" but not
# "tokens", so token counts ("max_tokens", "input_tokens") stay visible. Not "key" or "pass" alone:
# a keyboard tool's {"key": "Enter"} and an eval's {"pass": true} are not secrets. "token" does
# match the token strings of logprobs ({"token": "Hi", "logprob": -0.1}); configure_content(
# secret_keys=...) replaces the list.
DEFAULT_SECRET_KEYS: Final = (
    "apikey",
    "token",
    "password",
    "passwd",
    "pwd",
    "passphrase",
    "secret",
    "secretkey",
    "accesskey",
    "privatekey",
    "authorization",
    "auth",
    "bearer",
    "jwt",
    "cookie",
    "credential",
    "credentials",
    "signature",
    "sessionid",
)
_NOT_ALNUM: Final = re.compile(r"[^a-z0-9]")


def _normalise_key(key: str) -> str:
    return _NOT_ALNUM.sub("", key.lower())


# -- the policy -------------------------------------------------------------------------------------


class _Unchanged:
    def __repr__(self) -> str:
        return "<unchanged>"


UNCHANGED: Final = _Unchanged()

Redactor = Callable[[str, Any], Any]


@dataclass(frozen=True)
class _Policy:
    capture: str | None = None  # None: read the environment variable
    redact: Redactor | None = None
    max_value_bytes: int | None = None
    max_span_bytes: int | None = None
    secret_keys: tuple[str, ...] = DEFAULT_SECRET_KEYS


# Replaced as a whole, so readers on other threads never see half an update.
_policy = _Policy()


def configure_content(
    *,
    capture: str | bool | _Unchanged | None = UNCHANGED,
    redact: Redactor | _Unchanged | None = UNCHANGED,
    max_value_bytes: int | _Unchanged | None = UNCHANGED,
    max_span_bytes: int | _Unchanged | None = UNCHANGED,
    secret_keys: Iterable[str] | _Unchanged | None = UNCHANGED,
) -> None:
    """Set the content policy in code; each argument left out keeps its setting, ``None`` resets it.

    ``capture``: a mode (``"NO_CONTENT"``, ``"SPAN_ONLY"``, ``"EVENT_ONLY"``, ``"SPAN_AND_EVENT"``)
    or a bool (``True`` is ``SPAN_ONLY``); beats ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``.
    ``redact``: ``hook(attribute_name, value) -> value``, called with a plain copy of each captured
    value after the default redaction of secret-looking keys; what it returns is recorded. If it
    raises, the value is replaced by a marker (never recorded unredacted).
    ``max_value_bytes``/``max_span_bytes``: budgets; beat ``GYMTRACE_CONTENT_MAX_*_BYTES``.
    ``secret_keys``: replaces the key names redacted by default (matched as suffixes, ignoring case
    and separators: ``"api_key"`` matches ``"X-Api-Key"``); ``None`` restores the default list,
    ``()`` turns default redaction off.

    Works under any TracerProvider. Call it before ``configure()`` (or use ``configure()``'s
    ``capture_content=``) so the OTLP export batches are sized for content.
    """
    global _policy
    changes: dict[str, Any] = {}
    if not isinstance(capture, _Unchanged):
        changes["capture"] = None if capture is None else _parse_argument(capture)
    if not isinstance(redact, _Unchanged):
        if redact is not None and not callable(redact):
            raise InvalidArgumentError(
                f"gymtrace.configure_content(): argument 'redact' must be callable, got {redact!r:.80}"
            )
        changes["redact"] = redact
    for name, value in (("max_value_bytes", max_value_bytes), ("max_span_bytes", max_span_bytes)):
        if isinstance(value, _Unchanged):
            continue
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise InvalidArgumentError(
                f"gymtrace.configure_content(): argument {name!r} must be a positive int, got {value!r:.80}"
            )
        changes[name] = value
    if not isinstance(secret_keys, _Unchanged):
        if secret_keys is None:
            changes["secret_keys"] = DEFAULT_SECRET_KEYS
        elif isinstance(secret_keys, str) or not all(isinstance(k, str) for k in secret_keys):
            raise InvalidArgumentError(
                "gymtrace.configure_content(): argument 'secret_keys' must be an iterable of strings,"
                f" got {secret_keys!r:.80}"
            )
        else:
            changes["secret_keys"] = tuple(n for n in (_normalise_key(k) for k in secret_keys) if n)
    _policy = replace(_policy, **changes)


def reset_content_policy() -> None:
    """Back to the environment and the defaults (for tests)."""
    global _policy
    _policy = _Policy()


def _parse_argument(value: str | bool) -> str:
    if isinstance(value, bool):
        return SPAN_ONLY if value else NO_CONTENT
    if isinstance(value, str):
        mode = _lenient(value)
        if mode is not None:
            return mode
    raise InvalidArgumentError(
        f"gymtrace: argument 'capture_content' must be one of {MODES} or a bool, got {value!r:.80}"
    )


def _lenient(raw: str) -> str | None:
    text = raw.strip()
    if text.upper() in MODES:
        return text.upper()
    return _LENIENT.get(text.lower())


@functools.lru_cache(maxsize=16)
def _mode_from_environment(raw: str) -> str:
    mode = _lenient(raw)
    if mode is None:
        logger.warning(
            "gymtrace: %s=%r is not one of %s (or true/false); content capture stays off",
            env.OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT,
            raw[:80],
            MODES,
        )
        return NO_CONTENT
    return mode


def capture_mode() -> str:
    """The mode in force: the ``configure`` argument, else the environment variable, else off."""
    override = _policy.capture
    if override is not None:
        return override
    raw = os.environ.get(env.OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT)
    return NO_CONTENT if raw is None else _mode_from_environment(raw)


@functools.lru_cache(maxsize=16)
def _bytes_from_environment(name: str, raw: str, default: int) -> int:
    try:
        value = int(raw.strip())
    except ValueError:
        value = 0
    if value < 1:
        logger.warning("gymtrace: %s=%r is not a positive integer; using %d", name, raw[:80], default)
        return default
    return value


def _budget(name: str, override: int | None, default: int) -> int:
    if override is not None:
        return override
    raw = os.environ.get(name)
    return default if raw is None else _bytes_from_environment(name, raw, default)


def max_value_bytes() -> int:
    value = _budget(env.GYMTRACE_CONTENT_MAX_VALUE_BYTES, _policy.max_value_bytes, DEFAULT_MAX_VALUE_BYTES)
    return max(MIN_VALUE_BYTES, value)


def max_span_bytes() -> int:
    value = _budget(env.GYMTRACE_CONTENT_MAX_SPAN_BYTES, _policy.max_span_bytes, DEFAULT_MAX_SPAN_BYTES)
    if value > MAX_SPAN_BYTES and first_time(("content span budget", value)):
        logger.warning(
            "gymtrace: a content budget of %d bytes per span cannot fit a 4 MiB export request; using %d",
            value,
            MAX_SPAN_BYTES,
        )
    return min(max(_MIN_PIECE, value), MAX_SPAN_BYTES)


def otlp_batch_size(configured: int) -> int:
    """The OTLP export batch size ``configure()`` uses: ``configured``, lowered while capture is on
    so a batch of spans with full content budgets stays under gRPC's 4 MiB message limit."""
    if capture_mode() == NO_CONTENT:
        return configured
    limit = export_batch_limit(max_span_bytes())
    if configured > limit and first_time(("content batch size", configured, limit)):
        logger.info(
            "gymtrace: content capture is on; OTLP export batches are limited to %d spans (from %d)"
            " so each request stays under 4 MiB",
            limit,
            configured,
        )
    return min(configured, limit)


def export_settings() -> tuple[bool, int]:
    """What of the content policy shapes the export pipeline (part of configure()'s settings)."""
    return capture_mode() != NO_CONTENT, max_span_bytes()


# -- redaction: matching keys ------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)  # the same few keys ("role", "content") come back all the time
def _is_secret(key: str, suffixes: tuple[str, ...]) -> bool:
    return bool(suffixes) and _normalise_key(key[-64:]).endswith(suffixes)


def is_secret_key(key: str) -> bool:
    """True for keys that look like they hold credentials (case and separators ignored)."""
    return _is_secret(key, _policy.secret_keys)


# -- the walk: a plain, bounded copy of the user's value ------------------------------------------


def _type_name(t: type) -> str:
    name = type.__dict__["__qualname__"].__get__(t)  # type's own getter: a metaclass cannot intercept
    return name if isinstance(name, str) else "object"


class _Walk:
    """Copies a value into plain JSON data, spending at most about ``budget`` characters.

    Only built-in methods are called (``dict.items(d)``, ``list.__iter__(l)``, ``str.__len__(s)``),
    so subclasses that override them, and objects whose every method raises, are safe.
    """

    __slots__ = ("left", "path", "truncated")

    def __init__(self, budget: int) -> None:
        self.left = budget
        self.path: set[int] = set()  # ids of the containers being walked: a repeat is a cycle
        self.truncated = False

    def value(self, v: object, depth: int) -> object:
        t = type(v)
        if t is str:  # the common cases first
            return self.string(v)  # type: ignore[arg-type]
        if t is dict:
            return self.mapping(v, depth)  # type: ignore[arg-type]
        if v is None or t is bool:
            self.left -= 5
            return v
        if issubclass(t, str):
            return self.string(v)  # type: ignore[arg-type]
        if issubclass(t, int):
            n = int.__index__(v)  # type: ignore[arg-type]
            if n.bit_length() > 256:  # int -> str of huge ints is slow and limited (sys.int_info)
                self.left -= 24
                return f"<int of {n.bit_length()} bits>"
            self.left -= 8
            return n
        if issubclass(t, float):
            f = float.__float__(v)  # type: ignore[arg-type]
            self.left -= 12
            if math.isfinite(f):
                return f
            return "NaN" if math.isnan(f) else ("Infinity" if f > 0 else "-Infinity")
        if issubclass(t, dict):
            return self.mapping(v, depth)  # type: ignore[arg-type]
        if issubclass(t, (list, tuple)):
            return self.sequence(v, t, depth)  # type: ignore[arg-type]
        if issubclass(t, (bytes, bytearray)):
            self.left -= 24
            size = bytes.__len__(v) if issubclass(t, bytes) else bytearray.__len__(v)  # type: ignore[arg-type]
            return f"<{_type_name(t)}: {size} bytes>"
        self.left -= 16
        return f"<{_type_name(t)}>"

    def string(self, s: str) -> str:
        n = str.__len__(s)
        room = max(self.left - 2, 0)  # the quotes
        if str.isascii(s):
            size = n
        else:  # UTF-8 size of at most room + 1 characters: bounded work whatever the length
            size = len(str.__getitem__(s, slice(0, room + 1)).encode("utf-8", "surrogatepass"))
        if size <= room:
            self.left -= size + 2
            text = s if type(s) is str else str.__str__(s)
        else:
            keep = max(room - _STRING_MARKER, 0)
            head = str.__getitem__(s, slice(0, keep))
            if not str.isascii(head):  # cut at a byte count, never inside a character
                head = head.encode("utf-8", "surrogatepass")[:keep].decode("utf-8", "ignore")
            self.left -= keep + 2 + _STRING_MARKER
            self.truncated = True
            text = f"{head}…[truncated {n - str.__len__(head)} chars]"
        # JSON inside a string (tool-call arguments in a message): redact its secret-looking pairs.
        return _redact_json_text(text) if '"' in text else text

    def _enter(self, v: object, depth: int) -> str | None:
        if depth >= MAX_DEPTH:
            self.truncated = True
            self.left -= 12
            return "<max depth>"
        if id(v) in self.path:
            self.left -= 8
            return "<cycle>"
        return None

    def sequence(self, v: list[Any] | tuple[Any, ...], t: type, depth: int) -> object:
        stop = self._enter(v, depth)
        if stop is not None:
            return stop
        base: Any = list if issubclass(t, list) else tuple
        size = base.__len__(v)
        out: list[object] = []
        self.left -= 2
        self.path.add(id(v))
        try:
            for index, item in enumerate(base.__iter__(v)):
                if self.left <= 0:
                    self.truncated = True
                    out.append(f"…[truncated {size - index} items]")
                    break
                out.append(self.value(item, depth + 1))
                self.left -= 1
        except RuntimeError:  # changed by another thread while we walked it
            out.append("<changed during capture>")
        finally:
            self.path.discard(id(v))
        return out

    def mapping(self, v: dict[Any, Any], depth: int) -> object:
        stop = self._enter(v, depth)
        if stop is not None:
            return stop
        size = dict.__len__(v)
        out: dict[str, object] = {}
        self.left -= 2
        self.path.add(id(v))
        try:
            for index, (raw_key, item) in enumerate(dict.items(v)):
                if self.left <= 0:
                    self.truncated = True
                    out["…"] = f"[truncated {size - index} keys]"
                    break
                key = self.key(raw_key)
                if key in out:
                    key = f"{key}#{index}"
                if is_secret_key(key):
                    out[key] = REDACTED
                    self.left -= len(key) + 16
                else:
                    out[key] = self.value(item, depth + 1)
                    self.left -= 2
        except RuntimeError:  # changed by another thread while we walked it
            out["…"] = "<changed during capture>"
        finally:
            self.path.discard(id(v))
        return out

    def key(self, k: object) -> str:
        t = type(k)
        if issubclass(t, str):
            return self.string(k)  # type: ignore[arg-type]
        if k is None or t is bool or issubclass(t, (int, float)):
            value = self.value(k, MAX_DEPTH)
            return json.dumps(value) if not isinstance(value, str) else value
        self.left -= 16
        return f"<{_type_name(t)}>"


# -- serialising within budgets ---------------------------------------------------------------------


def _utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: OTLP strings must be valid UTF-8
        return text.encode("utf-8", "replace")


def fit(text: str, limit: int) -> str:
    """``text`` if its UTF-8 form fits ``limit`` bytes, else a prefix ending in
    ``…[truncated N bytes]``, the whole at most ``limit`` bytes long. Lone surrogates become ``?``
    (OTLP strings must be valid UTF-8, or the whole export request fails)."""
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:
        data = text.encode("utf-8", "replace")
        text = data.decode("utf-8")
    if len(data) <= limit:
        return text
    reserve = len(f"…[truncated {len(data)} bytes]".encode())
    kept = data[: max(limit - reserve, 0)].decode("utf-8", "ignore")  # no half characters
    cut = len(data) - len(kept.encode("utf-8"))
    return f"{kept}…[truncated {cut} bytes]"


def _looks_like_json(s: str) -> bool:
    return s[:1] in ("{", "[") and s.rstrip()[-1:] in ("}", "]")


# A "key": "value" pair in JSON text, for text too long (or too broken) to parse.
_JSON_PAIR: Final = re.compile(r'"((?:[^"\\]|\\.){1,200})"(\s*:\s*)"(?:[^"\\]|\\.)*"')


def _redact_json_text(text: str) -> str:
    def replace_secret(match: re.Match[str]) -> str:
        if is_secret_key(match.group(1)):
            return f'"{match.group(1)}"{match.group(2)}"{REDACTED}"'
        return match.group(0)

    return _JSON_PAIR.sub(replace_secret, text)


def serialise(name: str, value: object, limit: int, redact: Redactor | None) -> str:
    """The text recorded for ``value`` under attribute ``name``: redacted, at most ``limit`` bytes.

    Structured values become compact JSON. A top-level string stays text (a prompt), unless it is
    a JSON object or array (tool arguments as the model wrote them): that is parsed, so its
    secret-looking keys are redacted like a dict's. In any other string (above 1 MiB, not valid
    JSON, or JSON nested in a message) the secret-looking ``"key": "value"`` pairs are redacted.
    """
    if issubclass(type(value), str) and str.__len__(value) <= _MAX_PARSE_CHARS:  # type: ignore[arg-type]
        text = str.__str__(value)
        if _looks_like_json(text):
            with contextlib.suppress(ValueError, RecursionError):
                value = json.loads(text)
    # The walk's estimate leaves out JSON escapes ("\n" is two bytes): keep a margin so the text
    # rarely needs the final cut, which would end it mid-JSON.
    walk_limit = limit - min(256, limit // 8)
    try:
        copy = _Walk(walk_limit).value(value, 0)
    except RecursionError:  # called near the interpreter's recursion limit
        copy = "<too deep to capture here>"
    if redact is not None:
        try:
            copy = redact(name, copy)
        except Exception as exc:  # noqa: BLE001 - fail closed: never record unredacted content
            contract_problem(
                ("redaction hook", type(exc)),
                GymTraceError(f"the content redaction hook raised {type(exc).__name__}: {exc!s:.200}"),
            )
            return _HOOK_FAILED
        copy = _Walk(walk_limit).value(copy, 0)  # the hook's result is walked like user data
    if isinstance(copy, str):
        return fit(copy, limit)  # a top-level string stays text
    return fit(json.dumps(copy, ensure_ascii=False, separators=(",", ":"), allow_nan=False), limit)


# -- per-span budget ---------------------------------------------------------------------------------


class _Ledger:
    """Content bytes already on one span: its content attributes (overwritten when recorded again)
    and its content events (added up)."""

    __slots__ = ("attributes", "events", "omitted")

    def __init__(self) -> None:
        self.attributes: dict[str, int] = {}
        self.events = 0
        self.omitted = 0

    def available(self, limit: int, key: str, on_span: bool) -> int:
        spent = sum(self.attributes.values()) + self.events
        if on_span:
            spent -= self.attributes.get(key, 0)  # recording it again replaces it
        return limit - spent

    def copy(self) -> _Ledger:
        other = _Ledger()
        other.attributes = dict(self.attributes)
        other.events = self.events
        return other


# Weak keys: an entry goes away with its span.
_ledgers: weakref.WeakKeyDictionary[Any, _Ledger] = weakref.WeakKeyDictionary()
_ledgers_lock = threading.Lock()


def _ledger(span: Any) -> _Ledger:
    ledger = _ledgers.get(span)
    if ledger is None:
        ledger = _Ledger()
        # A span type without weak references gets a budget per call only.
        with contextlib.suppress(TypeError):
            _ledgers[span] = ledger
    return ledger


# -- recording ----------------------------------------------------------------------------------------


def capturing() -> bool:
    """Whether content capture is on at all (the cheap check before finding a target)."""
    return capture_mode() != NO_CONTENT


def record_on(span: Any, keys: tuple[str, str, str], input: object, output: object) -> None:
    """Record ``input``/``output`` on ``span`` under the capture mode, budgets and redaction in force.

    ``keys`` are the level's content names (its ``Level.content``): the input and output attribute
    and the event that carries both when events are on.
    """
    mode = capture_mode()
    if mode == NO_CONTENT or (input is None and output is None):
        return
    if not span.is_recording():
        return  # sampled out: skip the work
    _record(keys, span, mode, input, output)


def _record(keys: tuple[str, str, str], span: Any, mode: str, input: object, output: object) -> None:
    policy = _policy
    on_span = mode in (SPAN_ONLY, SPAN_AND_EVENT)
    on_event = mode in (EVENT_ONLY, SPAN_AND_EVENT)
    copies = 2 if on_span and on_event else 1  # SPAN_AND_EVENT stores each value twice
    value_limit = max_value_bytes()
    span_limit = max_span_bytes()
    input_key, output_key, event_name = keys

    # Serialise outside the lock, against a snapshot of the span's budget ...
    with _ledgers_lock:
        planned = _ledger(span).copy()
    texts: list[tuple[str, str]] = []
    for key, value in ((input_key, input), (output_key, output)):
        if value is None:
            continue
        limit = min(value_limit, planned.available(span_limit, key, on_span) // copies)
        text = serialise(key, value, limit, policy.redact) if limit >= _MIN_PIECE else ""
        if on_span:
            planned.attributes[key] = len(_utf8(text))
        if on_event:
            planned.events += len(_utf8(text))
        texts.append((key, text))

    # ... then commit, cutting again if another thread recorded on this span meanwhile.
    final: dict[str, str] = {}
    with _ledgers_lock:
        ledger = _ledger(span)
        omitted_before = ledger.omitted
        for key, text in texts:
            per_copy = ledger.available(span_limit, key, on_span) // copies
            if not text or per_copy < _MIN_PIECE:
                ledger.omitted += 1
                continue
            text = fit(text, per_copy)
            size = len(_utf8(text))
            if on_span:
                ledger.attributes[key] = size
            if on_event:
                ledger.events += size
            final[key] = text
        omitted = ledger.omitted if ledger.omitted != omitted_before else 0
    if on_span:
        for key, text in final.items():
            span.set_attribute(key, text)
    if on_event and final:
        span.add_event(event_name, final)
    if omitted:
        span.set_attribute(c.CONTENT_OMITTED, omitted)
