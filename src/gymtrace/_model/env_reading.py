"""Reading gymtrace's environment variables: the reader with its failure policy, and the parsers.

``_model/settings.py`` holds the Settings object and resolves it; this module holds how one variable
is read: the failure policy for a bad value (a WARNING naming the variable and the value, said once,
and the default; in strict mode an error), numbers with bounds, choices, comma-separated lists, the
content-capture modes with their older boolean spelling, and the identity-trust settings, whose
default depends on whether a secret is set. Apart from the Settings object so that each variable's
parsing can be read (and tested) without the 40 fields around it.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from collections.abc import Mapping
from typing import Any, Final

from gymtrace._model import environment as env
from gymtrace._model.exceptions import InvalidArgumentError

logger = logging.getLogger("gymtrace")

# Content capture modes (the GenAI conventions' OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT).
NO_CONTENT: Final = "NO_CONTENT"
SPAN_ONLY: Final = "SPAN_ONLY"
EVENT_ONLY: Final = "EVENT_ONLY"
SPAN_AND_EVENT: Final = "SPAN_AND_EVENT"
CAPTURE_MODES: Final = (NO_CONTENT, SPAN_ONLY, EVENT_ONLY, SPAN_AND_EVENT)
# The variable was a boolean before the GenAI conventions made it an enum. gymtrace writes traces
# only, so "true" means the span attributes, where the conventions put content on spans.
_LENIENT_CAPTURE: Final = {
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

# Which incoming gym identity a process believes (GYMTRACE_TRUST_IDENTITY; see _trust.py).
TRUST_ALL: Final = "all"
TRUST_NONE: Final = "none"
TRUST_SIGNED: Final = "signed"
TRUST_MODES: Final = (TRUST_ALL, TRUST_NONE, TRUST_SIGNED)


class Reader:
    """Reads variables from one environment snapshot, applying the failure policy."""

    def __init__(
        self,
        environ: Mapping[str, str],
        strict: bool,
        lenient: bool,
        lock: threading.RLock,
        warned: set[tuple[str, str]],
    ) -> None:
        self.environ = environ
        # The settings module's lock (replaced in a forked child) and its warnings said once.
        self.lock = lock
        self.warned = warned
        self.strict = strict
        self.lenient = lenient  # at import: never raise
        self.rejected: set[str] = set()  # variables set to a bad value (their default was used)

    def given(self, name: str) -> bool:
        """Whether variable ``name`` was set to a value read as it is (not replaced by a default)."""
        return self.raw(name) is not None and name not in self.rejected

    def raw(self, name: str) -> str | None:
        value = self.environ.get(name)
        return value if value is not None and value.strip() else None

    def bad(self, name: str, raw: str, expected: str, default: object) -> None:
        self.rejected.add(name)
        if self.strict and not self.lenient:
            raise InvalidArgumentError(f"{name} must be {expected}, got {raw[:80]!r}")
        with self.lock:
            first = (name, raw) not in self.warned
            self.warned.add((name, raw))
        if first:
            logger.warning("gymtrace: %s=%r is not %s; using %r", name, raw[:80], expected, default)

    def number(
        self,
        name: str,
        default: float,
        *,
        minimum: float,
        maximum: float | None = None,
        integer: bool = False,
    ) -> float:
        raw = self.raw(name)
        if raw is None:
            return default
        try:
            value = int(raw.strip()) if integer else float(raw)
        except ValueError:
            value = None
        # value != value: NaN
        if value is None or value != value or value < minimum or (maximum is not None and value > maximum):
            kind = "an integer" if integer else "a number"
            bounds = f">= {minimum:g}" if maximum is None else f"in [{minimum:g}, {maximum:g}]"
            self.bad(name, raw, f"{kind} {bounds}", default)
            return default
        return value

    def choice(self, name: str, choices: tuple[str, ...], default: str) -> str:
        raw = self.raw(name)
        if raw is None:
            return default
        value = raw.strip().lower()
        if value not in choices:
            self.bad(name, raw, f"one of {choices}", default)
            return default
        return value


def parse_capture(raw: str) -> str | None:
    """A capture mode from its text: a mode (any case) or the older boolean form; None if neither."""
    text = raw.strip()
    if text.upper() in CAPTURE_MODES:
        return text.upper()
    return _LENIENT_CAPTURE.get(text.lower())


def process_file_name() -> str:
    """This process's file in a ``GYMTRACE_FILE`` directory: its program and PID, so processes
    that share the directory never share a file."""
    program = re.sub(
        r"[^A-Za-z0-9._-]+", "_", os.path.basename(sys.argv[0] if sys.argv and sys.argv[0] else "python")
    )
    return f"{program or 'python'}-{os.getpid()}.jsonl"


def split_list(raw: str | None) -> tuple[str, ...]:
    """A comma-separated variable as its non-empty, stripped items."""
    return tuple(part.strip() for part in (raw or "").split(",") if part.strip())


def trust(read: Reader, given: Mapping[str, Any]) -> tuple[str, tuple[str, ...], frozenset[str]]:
    secrets = (
        tuple(given["identity_secrets"])
        if given.get("identity_secrets") is not None
        else split_list(read.environ.get(env.GYMTRACE_IDENTITY_SECRET))
    )
    if given.get("trust_identity") is not None:
        mode = str(given["trust_identity"])
    else:
        raw = read.raw(env.GYMTRACE_TRUST_IDENTITY)
        # Without a setting: a single-tenant cluster works out of the box, and setting a secret
        # is all it takes to require signatures.
        mode = raw.strip().lower() if raw is not None else (TRUST_SIGNED if secrets else TRUST_ALL)
        if mode not in TRUST_MODES:
            # A typo must not open the door: an unknown setting trusts nobody.
            read.bad(env.GYMTRACE_TRUST_IDENTITY, raw or "", f"one of {TRUST_MODES}", TRUST_NONE)
            mode = TRUST_NONE
    if mode == TRUST_SIGNED and not secrets:
        with read.lock:
            first = ("signed without secret", "") not in read.warned
            read.warned.add(("signed without secret", ""))
        if first:
            logger.warning(
                "gymtrace: %s=signed without %s; no incoming identity can be verified",
                env.GYMTRACE_TRUST_IDENTITY,
                env.GYMTRACE_IDENTITY_SECRET,
            )
    allow = (
        frozenset(given["baggage_allow"])
        if given.get("baggage_allow") is not None
        else frozenset(split_list(read.environ.get(env.GYMTRACE_BAGGAGE_ALLOW)))
    )
    # gym.* keys are identity: never forwarded as application baggage, whatever the list says.
    return mode, secrets, frozenset(k for k in allow if not k.startswith("gym."))


def _http_traces_url(base: str) -> str:
    # OTEL_EXPORTER_OTLP_ENDPOINT is a base URL; the HTTP exporter posts to {base}/v1/traces.
    return base.rstrip("/") + "/v1/traces"


def http_traces_url(base: str) -> str:
    # OTEL_EXPORTER_OTLP_ENDPOINT is a base URL; the HTTP exporter posts to {base}/v1/traces.
    return base.rstrip("/") + "/v1/traces"
