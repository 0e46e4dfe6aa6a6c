"""Gym identity values: the one validator for IDs and indices, wherever they come from.

An identity value reaches gymtrace as a scope argument (``gymtrace.rollout(rollout_id=...)``), from a
carrier or baggage of another process, or from a decorated function's arguments through a callable.
All of them pass :func:`id_problem`/:func:`index_problem`: IDs travel in baggage on every request and
are searched in Jaeger, so they are short, printable, one-line text. Arguments that fail are reported
(:func:`check_id`: a warning, or :class:`~gymtrace.InvalidArgumentError` in strict mode); values
arriving from outside are dropped silently (:func:`clean_identity`), because a remote peer's garbage
is not the local caller's mistake.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping

from gymtrace import _constants as c
from gymtrace._model.errors import InvalidArgumentError, contract_problem

MAX_ID_LENGTH = 256
# Attempts and repeats arriving from outside are small non-negative integers.
MAX_INDEX = 1_000_000_000
# The identity a rollout passes to every episode of it, wherever that episode runs.
ROLLOUT_IDENTITY = (c.RUN_ID, c.TASK_ID, c.ROLLOUT_ID, c.ROLLOUT_REPEAT)


def id_problem(value: object) -> str | None:
    """Why ``value`` is not a valid identifier, or ``None`` when it is one."""
    if not isinstance(value, str):
        return f"must be a string, got {type(value).__name__} {value!r:.80}"
    if not value:
        return "must not be empty"
    if len(value) > MAX_ID_LENGTH:
        return f"must be at most {MAX_ID_LENGTH} characters, got {len(value)}"
    # str.isprintable() also refuses format characters (U+202E right-to-left override, zero-width
    # spaces) and line separators, which percent-decoding can smuggle into an ID.
    if not value.isprintable():
        return f"must be printable text without control characters, got {value[:40]!r}"
    return None


def index_problem(value: object, minimum: int) -> str | None:
    """Why ``value`` is not an int >= ``minimum``, or ``None`` when it is one."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"must be an int >= {minimum}, got {type(value).__name__} {value!r:.80}"
    if value < minimum:
        return f"must be >= {minimum}, got {value}"
    return None


def report(where: str, argument: str, problem: str) -> None:
    """A bad argument of user code: a warning once per problem, an exception in strict mode."""
    contract_problem(
        ("argument", where, argument, problem),
        InvalidArgumentError(f"gymtrace.{where}(): argument {argument!r} {problem}"),
    )


def check_id(where: str, argument: str, value: object) -> str | None:
    """``value`` if it is a valid identifier (``None`` passes through); else reported, ``None``."""
    if value is None:
        return None
    problem = id_problem(value)
    if problem is not None:
        report(where, argument, problem)
        return None
    return value  # type: ignore[return-value]  # id_problem() proved it is a str


def check_index(where: str, argument: str, value: object, minimum: int) -> int | None:
    if value is None:
        return None
    problem = index_problem(value, minimum)
    if problem is not None:
        report(where, argument, problem)
        return None
    return value  # type: ignore[return-value]  # index_problem() proved it is an int


def check_reward(argument: str, value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        report("record_reward", argument, f"must be a real number, got {type(value).__name__} {value!r:.80}")
        return None
    number = float(value)
    if not math.isfinite(number):
        report("record_reward", argument, f"must be finite, got {number}")
        return None
    return number


def clean_step_number(raw: object) -> int | None:
    """A step number from another process (a continuation's reserved first step: up to int64, see
    ``_scopes.active_scope.STEP_RANGE``), or ``None`` if it is not one (never reported)."""
    text = str(raw) if isinstance(raw, int) and not isinstance(raw, bool) else raw
    if not isinstance(text, str) or not text.isascii() or not text.isdigit() or len(text) > 19:
        return None
    number = int(text)
    return number if 0 < number < 1 << 63 else None


def clean_value(key: str, raw: object) -> str | int | None:
    """An identity value from another process, or ``None`` if it is not valid (never reported)."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        raw = str(raw)
    if id_problem(raw) is not None:
        return None
    text: str = raw  # type: ignore[assignment]  # id_problem() proved it is a str
    if key in c.INT_IDENTITY_KEYS:
        if not text.isascii() or not text.isdigit() or len(text) > 10:
            return None
        number = int(text)
        return number if number <= MAX_INDEX else None
    return text


def clean_identity(entries: Mapping[str, object]) -> dict[str, str | int]:
    """Keep the gym identity keys whose values are valid (see :func:`clean_value`), and the
    training keys that travel with them (a group ID, a policy version: :func:`read_version`)."""
    identity: dict[str, str | int] = {}
    for key in c.CARRIED_KEYS:
        if key in entries:
            raw = entries[key]
            value = read_version(raw) if key == c.POLICY_VERSION else clean_value(key, raw)
            if value is not None:
                identity[key] = value
    return identity


def read_version(text: object) -> int | str | None:
    """A version from text (baggage, a consumed record, a join key): canonical decimal integers
    (``7``, ``-2``; not ``07``) are ints, other valid text stays text, anything else is None."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    if not isinstance(text, str) or id_problem(text) is not None:
        return None
    body = text[1:] if text.startswith("-") else text
    if body.isascii() and body.isdigit() and len(body) <= 18 and str(int(text)) == text:
        return int(text)
    return text


def episode_id(rollout_id: str, attempt: int) -> str:
    """``gym.episode.id``: the rollout ID for attempt 0, ``{rollout_id}-a{attempt}`` after it."""
    return rollout_id if attempt == 0 else f"{rollout_id}-a{attempt}"


def deterministic_id(*parts: str, size: int) -> int:
    """An ID derived from ``parts`` alone, the same in every process, pass and import: the SHA-256
    of the parts (UTF-8) joined by NUL, its first ``size`` bytes as a big-endian integer, never 0
    (which OpenTelemetry reads as invalid; 1 instead). ``size=16`` for a trace ID, ``8`` for a span
    ID. Put a fixed namespace first (``"gymtrace/trace"``) so two kinds of ID never collide."""
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= 32:
        raise InvalidArgumentError(f"deterministic_id(): size must be 1 to 32 bytes, got {size!r:.40}")
    material = "\x00".join(parts).encode("utf-8")
    return int.from_bytes(hashlib.sha256(material).digest()[:size], "big") or 1


def check_timeout(caller: str, value: object) -> None:
    """A ``timeout=`` argument: None, or a finite number of seconds > 0 (else InvalidArgumentError)."""
    if value is None:
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise InvalidArgumentError(
            f"gymtrace.{caller}(): argument 'timeout' must be a number of seconds > 0, got {value!r:.40}"
        )


_SCALE = float(2**64)


def keep_rollout(key: str, ratio: float) -> bool:
    """The sampling decision for a rollout or task ID: stable across processes and languages
    (the first 64 bits of its SHA-256 against ``ratio``). Public as ``gymtrace.sampling.keep_rollout``."""
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / _SCALE < ratio
