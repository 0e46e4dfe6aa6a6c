"""The content policy: whether content is captured, the byte budgets, the redaction hook and keys.

The capture mode and budgets are settings (argument > environment > default, see ``_model.settings``);
the redaction hook and the secret keys exist only in code, so they live here.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from gymtrace._model import settings as _settings
from gymtrace._model.errors import InvalidArgumentError, first_time
from gymtrace._model.settings import CAPTURE_MODES as MODES
from gymtrace._model.settings import NO_CONTENT, SPAN_ONLY, parse_capture

logger = logging.getLogger("gymtrace")


# -- budgets ------------------------------------------------------------------------------------------

DEFAULT_MAX_VALUE_BYTES: Final = _settings.DEFAULT_CONTENT_MAX_VALUE_BYTES
DEFAULT_MAX_SPAN_BYTES: Final = _settings.DEFAULT_CONTENT_MAX_SPAN_BYTES
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
# A span with less budget left than this gets no more values (counted in gym.content.omitted).
MIN_PIECE: Final = 64

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
    redact: Redactor | None = None
    secret_keys: tuple[str, ...] = DEFAULT_SECRET_KEYS


# Replaced as a whole, so readers on other threads never see half an update.
_policy = _Policy()


def current_policy() -> _Policy:
    return _policy


def content_changes(**arguments: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Validate :func:`configure_content`'s arguments without applying them: (settings overrides,
    policy changes). An argument left out (or ``UNCHANGED``) changes nothing.

    Raises :class:`~gymtrace.InvalidArgumentError` naming the first bad argument.
    """
    capture = arguments.get("capture", UNCHANGED)
    redact = arguments.get("redact", UNCHANGED)
    max_value_bytes = arguments.get("max_value_bytes", UNCHANGED)
    max_span_bytes = arguments.get("max_span_bytes", UNCHANGED)
    secret_keys = arguments.get("secret_keys", UNCHANGED)
    overrides: dict[str, Any] = {}
    changes: dict[str, Any] = {}
    if not isinstance(capture, _Unchanged):
        overrides["capture_content"] = None if capture is None else _parse_argument(capture)
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
        overrides[f"content_{name}"] = value
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
    return overrides, changes


def apply_content_changes(changes: dict[str, Any]) -> None:
    """Apply policy changes :func:`content_changes` validated."""
    global _policy
    if changes:
        _policy = _Policy(**{**_policy.__dict__, **changes})


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
    overrides, changes = content_changes(
        capture=capture,
        redact=redact,
        max_value_bytes=max_value_bytes,
        max_span_bytes=max_span_bytes,
        secret_keys=secret_keys,
    )
    if overrides:
        _settings.override(**overrides)
    apply_content_changes(changes)


def reset_content_policy() -> None:
    """Back to the environment and the defaults (for tests)."""
    global _policy
    _policy = _Policy()
    _settings.override(capture_content=None, content_max_value_bytes=None, content_max_span_bytes=None)


def _parse_argument(value: str | bool) -> str:
    if isinstance(value, bool):
        return SPAN_ONLY if value else NO_CONTENT
    if isinstance(value, str):
        mode = parse_capture(value)
        if mode is not None:
            return mode
    raise InvalidArgumentError(
        f"gymtrace: argument 'capture_content' must be one of {MODES} or a bool, got {value!r:.80}"
    )


def capture_mode(settings: _settings.Settings | None = None) -> str:
    """The mode in force: the ``configure`` argument, else the environment variable, else off."""
    return (settings or _settings.active).capture_content


def max_value_bytes(settings: _settings.Settings | None = None) -> int:
    return max(MIN_VALUE_BYTES, (settings or _settings.active).content_max_value_bytes)


def max_span_bytes(settings: _settings.Settings | None = None) -> int:
    value = (settings or _settings.active).content_max_span_bytes
    if value > MAX_SPAN_BYTES and first_time(("content span budget", value)):
        logger.warning(
            "gymtrace: a content budget of %d bytes per span cannot fit a 4 MiB export request; using %d",
            value,
            MAX_SPAN_BYTES,
        )
    return min(max(MIN_PIECE, value), MAX_SPAN_BYTES)


# -- redaction: matching keys ------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)  # the same few keys ("role", "content") come back all the time
def _is_secret(key: str, suffixes: tuple[str, ...]) -> bool:
    return bool(suffixes) and _normalise_key(key[-64:]).endswith(suffixes)


def is_secret_key(key: str) -> bool:
    """True for keys that look like they hold credentials (case and separators ignored)."""
    return _is_secret(key, _policy.secret_keys)
