"""Which incoming gym identity a process believes, and the signature that proves it (issue 12).

Anyone who can reach a server can send ``baggage: gym.rollout.id=...``. The identity decides which
searches a span turns up in, what ``gymtrace.current()`` returns to handler code that stores join
keys, and (through ``gym.episode.attempt``) which traces the Collector keeps. So incoming identity
is believed only as the operator says (``GYMTRACE_TRUST_IDENTITY``):

- ``all``: every peer is trusted (a single-tenant cluster; the default without a secret);
- ``none``: the trace context is continued, the identity is not;
- ``signed``: the identity is believed when it comes with ``gym.sig``, an HMAC-SHA256 over the
  identity entries keyed with ``GYMTRACE_IDENTITY_SECRET`` (the default when a secret is set).

The signature (``v1.`` + 22 base64url characters, 128 bits of HMAC-SHA256) covers the identity
entries that travel beside it, in the fixed order of ``IDENTITY_KEYS``, as ``key=value`` lines: a
peer can neither change, add nor drop an entry without the secret. It does not cover the trace
context: a caller that captured a signed header can replay that same identity (see the README).
Senders sign whenever they have a secret, whatever they trust themselves. Several secrets,
comma-separated, verify; the first signs (key rotation).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from gymtrace import _constants as c
from gymtrace import _environment as env
from gymtrace._errors import InvalidArgumentError, logger

TRUST_ALL = "all"
TRUST_NONE = "none"
TRUST_SIGNED = "signed"
TRUST_MODES = (TRUST_ALL, TRUST_NONE, TRUST_SIGNED)

_SIGNATURE_VERSION = "v1."
_SIGNATURE_CHARS = 22  # 128 bits of the HMAC: forging stays out of reach, the header stays short


@dataclass(frozen=True)
class TrustSettings:
    mode: str
    secrets: tuple[bytes, ...]
    allow: frozenset[str]


_lock = threading.Lock()
_settings: TrustSettings | None = None
_overrides: dict[str, object] = {}
_signatures: dict[tuple[tuple[str, str | int], ...], str] = {}


def _split(value: str | None) -> list[str]:
    return [part.strip() for part in (value or "").split(",") if part.strip()]


def _resolve() -> TrustSettings:
    raw_secret = _overrides.get("secret", os.environ.get(env.GYMTRACE_IDENTITY_SECRET))
    secrets = tuple(s.encode() for s in _split(raw_secret if isinstance(raw_secret, str) else None))
    raw_mode = _overrides.get("mode", os.environ.get(env.GYMTRACE_TRUST_IDENTITY))
    mode = str(raw_mode).strip().lower() if raw_mode else (TRUST_SIGNED if secrets else TRUST_ALL)
    if mode not in TRUST_MODES:
        # A typo must not silently open the door: an unknown setting trusts nobody.
        logger.warning(
            "gymtrace: %s=%r is not one of all, none, signed; trusting no incoming identity",
            env.GYMTRACE_TRUST_IDENTITY,
            raw_mode,
        )
        mode = TRUST_NONE
    if mode == TRUST_SIGNED and not secrets:
        logger.warning(
            "gymtrace: %s=signed without %s; no incoming identity can be verified",
            env.GYMTRACE_TRUST_IDENTITY,
            env.GYMTRACE_IDENTITY_SECRET,
        )
    raw_allow = _overrides.get("allow", os.environ.get(env.GYMTRACE_BAGGAGE_ALLOW))
    if isinstance(raw_allow, str) or raw_allow is None:
        allow = frozenset(_split(raw_allow))
    else:
        allow = frozenset(str(k) for k in raw_allow)  # type: ignore[attr-defined]
    # gym.* keys are identity: never forwarded as application baggage, whatever the list says.
    allow = frozenset(k for k in allow if not k.startswith("gym."))
    return TrustSettings(mode, secrets, allow)


def settings() -> TrustSettings:
    """The settings in force (read from the environment on first use, then cached)."""
    global _settings
    current = _settings
    if current is None:
        with _lock:
            current = _settings = _settings or _resolve()
    return current


def configure_trust(
    *,
    mode: str | None = None,
    secret: str | None = None,
    allow: str | list[str] | tuple[str, ...] | frozenset[str] | None = None,
) -> TrustSettings:
    """Override the environment (``configure(trust_identity=..., identity_secret=..., baggage_allow=...)``)."""
    global _settings
    if mode is not None and (not isinstance(mode, str) or mode.strip().lower() not in TRUST_MODES):
        raise InvalidArgumentError(
            f"configure(): trust_identity must be one of all, none, signed; got {mode!r}"
        )
    if secret is not None and (not isinstance(secret, str) or not secret.strip()):
        raise InvalidArgumentError("configure(): identity_secret must be a non-empty string")
    if allow is not None and not isinstance(allow, (str, list, tuple, frozenset)):
        raise InvalidArgumentError(
            f"configure(): baggage_allow must be a comma-separated string or a list of keys; got {allow!r}"
        )
    with _lock:
        if mode is not None:
            _overrides["mode"] = mode.strip().lower()
        if secret is not None:
            _overrides["secret"] = secret
        if allow is not None:
            _overrides["allow"] = allow
        _settings = _resolve()
        _signatures.clear()
        return _settings


def reset_trust() -> None:
    """Forget overrides and cached settings (tests; the environment is read again on next use)."""
    global _settings
    with _lock:
        _overrides.clear()
        _settings = None
        _signatures.clear()


def _message(identity: Mapping[str, object]) -> bytes:
    return "\n".join(f"{k}={identity[k]}" for k in c.IDENTITY_KEYS if k in identity).encode()


def _mac(secret: bytes, identity: Mapping[str, object]) -> str:
    digest = hmac.new(secret, _message(identity), hashlib.sha256).digest()
    return _SIGNATURE_VERSION + base64.urlsafe_b64encode(digest).decode()[:_SIGNATURE_CHARS]


def signature(identity: Mapping[str, str | int]) -> str | None:
    """``gym.sig`` for ``identity`` with the first secret, or None without a secret. Cached per
    identity: a process sends the same few identities many times."""
    secrets = settings().secrets
    if not secrets or not identity:
        return None
    key = tuple(identity.items())
    sig = _signatures.get(key)
    if sig is None:
        sig = _mac(secrets[0], identity)
        if len(_signatures) > 4096:
            _signatures.clear()
        _signatures[key] = sig
    return sig


def verified(identity: Mapping[str, str | int], sig: object) -> bool:
    if not isinstance(sig, str) or not sig.startswith(_SIGNATURE_VERSION):
        return False
    return any(hmac.compare_digest(_mac(secret, identity), sig) for secret in settings().secrets)


def accept(
    identity: dict[str, str | int], sig: object, *, trusted: bool | None = None
) -> dict[str, str | int]:
    """The part of an incoming (already validated) identity this process believes.

    ``trusted=True`` is for carriers this process's own code made (a pool task, a child's
    environment): they cross no trust boundary.
    """
    if not identity or trusted:
        return identity
    mode = settings().mode
    if mode == TRUST_ALL:
        return identity
    if mode == TRUST_SIGNED and verified(identity, sig):
        return identity
    return {}


SIGNATURE_KEY = c.IDENTITY_SIGNATURE
