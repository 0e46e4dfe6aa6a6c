"""Which incoming gym identity a process believes, and the signature that proves it.

Anyone who can reach a server can send ``baggage: gym.rollout.id=...``, and the identity decides
searches, ``gymtrace.current()`` and which traces the Collector keeps. So it is believed as
``GYMTRACE_TRUST_IDENTITY`` says (resolved in ``_model.settings``): ``all`` (the default without a
secret), ``none`` (the trace context is continued, the identity is not) or ``signed`` (believed
with a valid ``gym.sig``; the default when ``GYMTRACE_IDENTITY_SECRET`` is set).

The signature, an HMAC-SHA256 cut to 128 bits, covers the identity entries as ``key=value`` lines
in a fixed order: ``v1.`` over ``IDENTITY_KEYS``, ``v2.`` over ``CARRIED_KEYS`` when a training key
is present; of a ``v1.`` signature only the keys it covers are believed. It does not cover the
trace context: a captured header can be replayed (docs/distributed.md). Senders sign whenever they
have a secret; of several, comma-separated, all verify and the first signs.
"""

from __future__ import annotations

import base64
import contextvars
import fnmatch
import functools
import hashlib
import hmac
import ipaddress
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit

from gymtrace import _constants as c
from gymtrace._model import settings as _settings
from gymtrace._model.errors import InvalidArgumentError

TRUST_ALL = _settings.TRUST_ALL
TRUST_NONE = _settings.TRUST_NONE
TRUST_SIGNED = _settings.TRUST_SIGNED
SIGNATURE_KEY = c.IDENTITY_SIGNATURE

_SIGNATURE_VERSION = "v1."
_SIGNATURE_V2 = "v2."
_SIGNATURE_CHARS = 22  # 128 bits of the HMAC: forging stays out of reach, the header stays short

# Signatures of the identities this process sends, per secret set (a process sends the same few
# identities many times). Replaced whole when the secrets change.
_signatures: tuple[tuple[str, ...], dict[tuple[tuple[str, str | int], ...], str]] = ((), {})


def allowed_baggage() -> frozenset[str]:
    """Application baggage keys forwarded beside the identity (``GYMTRACE_BAGGAGE_ALLOW``)."""
    return _settings.active.baggage_allow


def configure_trust(
    *,
    mode: str | None = None,
    secret: str | None = None,
    allow: str | Iterable[str] | None = None,
) -> None:
    """Override the environment in code (``configure(trust_identity=..., identity_secret=...,
    baggage_allow=...)`` calls this). Raises :class:`~gymtrace.InvalidArgumentError` naming the
    argument for a bad value."""
    _settings.override(**trust_overrides(mode=mode, secret=secret, allow=allow))


def trust_overrides(
    *,
    mode: object = None,
    secret: object = None,
    allow: object = None,
) -> dict[str, object]:
    """Validated ``_model.settings`` overrides for the trust arguments of ``configure()``."""
    overrides: dict[str, object] = {}
    if mode is not None:
        if not isinstance(mode, str) or mode.strip().lower() not in _settings.TRUST_MODES:
            raise InvalidArgumentError(
                f"gymtrace.configure(): argument 'trust_identity' must be one of {_settings.TRUST_MODES},"
                f" got {mode!r:.80}"
            )
        overrides["trust_identity"] = mode.strip().lower()
    if secret is not None:
        secrets = _settings.split_list(secret) if isinstance(secret, str) else ()
        if not secrets:
            raise InvalidArgumentError(
                "gymtrace.configure(): argument 'identity_secret' must be a non-empty string"
            )
        overrides["identity_secrets"] = secrets
    if allow is not None:
        if isinstance(allow, str):
            keys: tuple[str, ...] = _settings.split_list(allow)
        elif isinstance(allow, (list, tuple, set, frozenset)) and all(isinstance(k, str) for k in allow):
            keys = tuple(k.strip() for k in allow if k.strip())
        else:
            raise InvalidArgumentError(
                "gymtrace.configure(): argument 'baggage_allow' must be a comma-separated string or"
                f" a list of keys, got {allow!r:.80}"
            )
        overrides["baggage_allow"] = frozenset(keys)
    return overrides


def reset_trust() -> None:
    """Forget code overrides of the trust settings and read the environment again (tests)."""
    _settings.override(trust_identity=None, identity_secrets=None, baggage_allow=None)


def _message(identity: Mapping[str, object], keys: tuple[str, ...] = c.IDENTITY_KEYS) -> bytes:
    return "\n".join(f"{k}={identity[k]}" for k in keys if k in identity).encode()


def _mac(secret: str, identity: Mapping[str, object], v2: bool = False) -> str:
    if v2:
        digest = hmac.new(secret.encode(), _message(identity, c.CARRIED_KEYS), hashlib.sha256).digest()
        return _SIGNATURE_V2 + base64.urlsafe_b64encode(digest).decode()[:_SIGNATURE_CHARS]
    digest = hmac.new(secret.encode(), _message(identity), hashlib.sha256).digest()
    return _SIGNATURE_VERSION + base64.urlsafe_b64encode(digest).decode()[:_SIGNATURE_CHARS]


def _has_training(identity: Mapping[str, object]) -> bool:
    return any(k in identity for k in c.TRAINING_KEYS)


def signature(identity: Mapping[str, str | int]) -> str | None:
    """``gym.sig`` for ``identity`` with the first secret, or None without a secret."""
    global _signatures
    secrets = _settings.active.identity_secrets
    if not secrets or not identity:
        return None
    owner, cache = _signatures
    if owner != secrets:
        cache = {}
        _signatures = (secrets, cache)
    key = tuple(identity.items())
    sig = cache.get(key)
    if sig is None:
        sig = _mac(secrets[0], identity, _has_training(identity))
        if len(cache) > 4096:
            cache.clear()
        cache[key] = sig
    return sig


def verified(identity: Mapping[str, str | int], sig: object) -> bool:
    """Whether ``sig`` signs ``identity``: a ``v2.`` signature all of it, a ``v1.`` one the keys
    it covers (:func:`accept` then drops the training keys, which it does not cover)."""
    if not isinstance(sig, str):
        return False
    if sig.startswith(_SIGNATURE_V2):
        v2 = True
    elif sig.startswith(_SIGNATURE_VERSION):
        v2 = False
    else:
        return False
    return any(hmac.compare_digest(_mac(s, identity, v2), sig) for s in _settings.active.identity_secrets)


def accept(
    identity: dict[str, str | int], sig: object, *, trusted: bool | None = None
) -> dict[str, str | int]:
    """The part of an incoming (already validated) identity this process believes.

    ``trusted=True`` is for carriers this process's own code made (a pool task, a child's
    environment): they cross no trust boundary.
    """
    if not identity or trusted:
        return identity
    mode = _settings.active.trust_identity
    if mode == TRUST_ALL:
        return identity
    if mode == TRUST_SIGNED and verified(identity, sig):
        if isinstance(sig, str) and sig.startswith(_SIGNATURE_VERSION) and _has_training(identity):
            # A v1 signature does not cover the training keys: believe only what it signs.
            return {k: v for k, v in identity.items() if k not in c.TRAINING_KEYS}
        return identity
    return {}


# -- where identity may go ----------------------------------------------------------------------------
#
# Baggage travels on every outgoing request, and an upstream model provider is usually a third party:
# gym identity goes to loopback, to the host patterns of GYMTRACE_PROPAGATE_TO, and to the servers a
# framework says are its own (NeMo Gym marks each request it makes as internal or not), never
# elsewhere. traceparent is not gated: it names no rollout and OpenTelemetry sends it everywhere.

# True: the framework making this request says the destination is one of the gym's servers; False:
# it says it is not (an upstream model endpoint, even on loopback); None: it says nothing.
destination_inside: contextvars.ContextVar[bool | None] = contextvars.ContextVar(
    "gymtrace_destination_inside", default=None
)


@functools.lru_cache(maxsize=256)
def _is_loopback(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class _GymInternal:
    """The type of :data:`GYM_INTERNAL` (one instance)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "gymtrace.propagation.GYM_INTERNAL"


# The destination of a carrier that stays inside the gym by construction: a child process's
# environment, a pool worker's task, a Ray task's arguments. An object, not a string, so no URL a
# request is sent to (read from a config file, a response, a redirect) can ever be taken for it.
GYM_INTERNAL: object = _GymInternal()


_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


@functools.lru_cache(maxsize=256)
def _host_and_port(url: str) -> tuple[str, int | None] | None:
    """The host (lower case) and port ``url`` goes to; ``None`` for a URL that does not parse.
    Kept for the few URLs a process sends to (every request of a hook asks)."""
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        # A URL without a port goes to its scheme's: `gym.internal:*` and `gym.internal:80` name
        # `http://gym.internal/` too, and `models.lab:8443` still not `https://models.lab/`.
        port = parts.port if parts.port is not None else _DEFAULT_PORTS.get(parts.scheme.lower())
    except ValueError:
        return None
    return host, port


def may_carry_identity(url: object) -> bool:
    """Whether gym identity may be sent with a request to ``url`` (a URL string or an object whose
    ``str()`` is one). :data:`GYM_INTERNAL`: yes, a carrier that stays inside the gym by
    construction. ``None``: no, the destination is unknown (issue 31: a carrier the caller builds
    without saying where it goes may end up at a model provider)."""
    if url is GYM_INTERNAL:
        return True
    if url is None:
        return False
    destination = _host_and_port(str(url))
    if destination is None:
        return False
    host, port = destination
    patterns = _settings.active.propagate_to
    if patterns:
        address = f"{host}:{port}" if port is not None else host
        if any(fnmatch.fnmatchcase(host, p) or fnmatch.fnmatchcase(address, p) for p in patterns):
            return True
    inside = destination_inside.get()
    if inside is not None:
        return inside
    return _is_loopback(host)
