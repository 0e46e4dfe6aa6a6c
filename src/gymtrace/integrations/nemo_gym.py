"""NeMo Gym's wire identity: headers, body fields and path prefix for the current gym scope.

NeMo Gym servers identify one execution by two headers sent together (a server answers 409
``execution_identity_mismatch`` when only one is present)::

    x-nemo-gym-rollout-id: <rollout ID>        x-nemo-gym-attempt-index: <attempt, 0-based>

by body fields ``_ng_rollout_id``, ``_ng_task_index``, ``_ng_rollout_index``,
``_ng_attempt_index``, and by a path prefix ``/ng-rollout/<key>/...`` where ``<key>`` is the
rollout ID at attempt 0 and ``{id}-a{n}`` after that (gymtrace's ``gym.episode.id``).

Example::

    import gymtrace.integrations.nemo_gym as nemo_gym

    nemo_gym.instrument()                      # httpx and aiohttp requests in gym scopes carry them
    with gymtrace.rollout(rollout_id="t-7-r0", task_id="t-7", repeat=0), gymtrace.episode():
        httpx.post(f"{env_url}/step", json=action)         # + the two headers
        nemo_gym.headers()                                  # or add them yourself

``instrument(body=True, path=True)`` also adds the body fields to JSON bodies and the path prefix;
``instrument(aliases=True)`` records NeMo Gym's own attribute names beside gymtrace's
(``nemo.gym.rollout.id`` = the attempt-qualified key, ``nemo.gym.run.id``, ``nemo.gym.task.id``)
so one Jaeger search finds both. In a server, the ASGI middleware
(:class:`gymtrace.integrations.asgi.GymTraceMiddleware`) then reads the two headers when a request carries
no believed gym baggage, so a NeMo Gym client's request runs in its rollout and attempt. NeMo Gym
headers carry no signature: they are believed only under ``GYMTRACE_TRUST_IDENTITY=all``.

**IDs.** NeMo Gym IDs must match ``^[A-Za-z0-9][A-Za-z0-9._-]*$``. A gymtrace rollout ID that
matches and contains no ``__`` is sent as it is; any other becomes ``x__`` followed by its UTF-8
bytes, with every byte outside ``A-Za-z0-9.-`` written as ``_`` and two upper-case hex digits
(``"t-1/r0"`` → ``"x__t-1_2Fr0"``). :func:`from_nemo_id` reverses it; the mapping is one-to-one
because a passed-through ID never contains ``__`` and an encoded one always starts with ``x__``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import wrapt
from opentelemetry import context as otel_context

from gymtrace import _constants as c
from gymtrace import _trust
from gymtrace._errors import internal_error
from gymtrace._frame import FRAME_KEY, ActiveScope

__all__ = [
    "NEMO_ID",
    "RolloutIdentity",
    "rollout_identity",
    "run_id_for_output",
    "trace_id_for",
    "alias_attributes",
    "body_fields",
    "from_nemo_id",
    "headers",
    "identity_from_headers",
    "instrument",
    "path_prefix",
    "to_nemo_id",
    "uninstrument",
]

NEMO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_PLAIN = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.-")
_ENCODED_PREFIX = "x__"
_ESCAPE = re.compile(r"_([0-9A-F]{2})")
_MAX_ATTEMPT = 1_000_000_000


def to_nemo_id(rollout_id: str) -> str:
    """``rollout_id`` as a NeMo Gym ID (unchanged when it already is one; see the module docs)."""
    if NEMO_ID.fullmatch(rollout_id) and "__" not in rollout_id:
        return rollout_id
    body = "".join(chr(b) if b in _PLAIN else f"_{b:02X}" for b in rollout_id.encode("utf-8"))
    return _ENCODED_PREFIX + body


def from_nemo_id(nemo_id: str) -> str:
    """The gymtrace rollout ID a NeMo Gym ID stands for (the inverse of :func:`to_nemo_id`)."""
    if not nemo_id.startswith(_ENCODED_PREFIX):
        return nemo_id
    body = nemo_id[len(_ENCODED_PREFIX) :]
    raw = bytearray()
    position = 0
    for match in _ESCAPE.finditer(body):
        raw += body[position : match.start()].encode("ascii")
        raw.append(int(match.group(1), 16))
        position = match.end()
    raw += body[position:].encode("ascii")
    return raw.decode("utf-8")


# -- NeMo Gym's own identity, read from what it sends or stores ------------------------------------
#
# One mapping for the live integration and for `gymtrace import nemo-gym`: a run traced live and the
# same run imported afterwards must land in the same traces, so both derive their IDs here.


class RolloutIdentity(NamedTuple):
    """A NeMo Gym rollout as gymtrace names it (DESIGN.md section 8)."""

    rollout_id: str
    """``gym.rollout.id``: ``_ng_rollout_id`` when set, else ``"{task}-{rollout}"`` (never the
    attempt-qualified capture key that the ``/ng-rollout/`` prefix carries)."""
    task_id: str
    """``gym.task.id``: ``_ng_task_index`` as text."""
    repeat: int | None
    """``gym.rollout.repeat``: ``_ng_rollout_index``."""
    attempt: int
    """``gym.episode.attempt``: ``_ng_attempt_index``, 0 when absent."""


def _index(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 <= value <= _MAX_ATTEMPT else None
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 10:
        number = int(value)
        return number if number <= _MAX_ATTEMPT else None
    return None


def rollout_identity(fields: Mapping[str, Any]) -> RolloutIdentity | None:
    """The rollout a NeMo Gym body (a ``/run`` request, a ``rollouts.jsonl`` row) belongs to, from
    its ``_ng_*`` fields; ``None`` when it carries no task index (not a NeMo Gym rollout)."""
    task = _index(fields.get(c.NEMO_GYM_BODY_TASK_INDEX))
    if task is None:
        return None
    repeat = _index(fields.get(c.NEMO_GYM_BODY_ROLLOUT_INDEX))
    attempt = _index(fields.get(c.NEMO_GYM_BODY_ATTEMPT_INDEX))
    given = fields.get(c.NEMO_GYM_BODY_ROLLOUT_ID)
    if isinstance(given, str) and given and len(given) <= 256 and given.isprintable():
        rollout_id = given
    else:
        rollout_id = f"{task}-{repeat if repeat is not None else 0}"
    return RolloutIdentity(rollout_id, str(task), repeat, attempt if attempt is not None else 0)


def run_id_for_output(path: str | os.PathLike[str]) -> str:
    """The run ID of a ``gym eval run`` that writes ``path``: the same for every pass over that
    output (a ``+resume_from_cache=true`` rerun continues the run) and for a later import of it.

    NeMo Gym stores nothing between passes, so the ID is derived from the output file's absolute
    path: its stem, for people, and a digest of the path, so two outputs never share a run.
    """
    resolved = Path(path).expanduser().resolve()
    digest = hashlib.sha256(str(resolved).encode("utf-8")).hexdigest()[:12]
    return f"{resolved.stem}-{digest}"


def trace_id_for(run_id: str, rollout_id: str) -> int:
    """The trace of one rollout of one run, the same in every pass and every import: 128 bits of
    SHA-256 over both IDs (never 0, which OpenTelemetry reads as invalid)."""
    material = f"gymtrace/trace\x00{run_id}\x00{rollout_id}".encode()
    return int.from_bytes(hashlib.sha256(material).digest()[:16], "big") or 1


def _identity() -> dict[str, str | int]:
    frame = otel_context.get_current().get(FRAME_KEY)
    if isinstance(frame, ActiveScope) and frame.kind != "disabled":
        return frame.identity
    return {}


def _execution(identity: Mapping[str, str | int]) -> tuple[str, int] | None:
    rollout_id = identity.get(c.ROLLOUT_ID)
    if not isinstance(rollout_id, str):
        return None
    attempt = identity.get(c.EPISODE_ATTEMPT)
    # Outside an episode the rollout's first execution is meant: NeMo Gym's attempt 0.
    return to_nemo_id(rollout_id), attempt if isinstance(attempt, int) else 0


def headers() -> dict[str, str]:
    """``x-nemo-gym-rollout-id`` and ``x-nemo-gym-attempt-index`` for the current gym scope, always
    both; empty outside a rollout."""
    execution = _execution(_identity())
    if execution is None:
        return {}
    frame = otel_context.get_current().get(FRAME_KEY)
    if isinstance(frame, ActiveScope):
        # NeMo Gym runs and verifies the rollout on its side: a rollout that ends without an
        # outcome of its own here is pending, its outcome expected from there (issue 25).
        frame.hand_off()
    return {c.NEMO_GYM_ROLLOUT_HEADER: execution[0], c.NEMO_GYM_ATTEMPT_HEADER: str(execution[1])}


def body_fields(*, task_index: int | None = None) -> dict[str, str | int]:
    """``_ng_rollout_id``, ``_ng_attempt_index``, ``_ng_rollout_index`` (the rollout's repeat) and,
    when given or when the task ID is a number, ``_ng_task_index``; empty outside a rollout."""
    identity = _identity()
    execution = _execution(identity)
    if execution is None:
        return {}
    fields: dict[str, str | int] = {
        c.NEMO_GYM_BODY_ROLLOUT_ID: execution[0],
        c.NEMO_GYM_BODY_ATTEMPT_INDEX: execution[1],
    }
    repeat = identity.get(c.ROLLOUT_REPEAT)
    if isinstance(repeat, int):
        fields[c.NEMO_GYM_BODY_ROLLOUT_INDEX] = repeat
    task = identity.get(c.TASK_ID)
    if task_index is not None:
        fields[c.NEMO_GYM_BODY_TASK_INDEX] = task_index
    elif isinstance(task, str) and task.isascii() and task.isdigit():
        fields[c.NEMO_GYM_BODY_TASK_INDEX] = int(task)
    return fields


def _key(execution: tuple[str, int]) -> str:
    nemo_id, attempt = execution
    return nemo_id if attempt == 0 else f"{nemo_id}-a{attempt}"


def path_prefix() -> str:
    """``/ng-rollout/<key>`` for the current gym scope (``<key>`` = ID, or ``{id}-a{n}`` after
    attempt 0); empty outside a rollout."""
    execution = _execution(_identity())
    return f"{c.NEMO_GYM_PATH_PREFIX}{_key(execution)}" if execution is not None else ""


def identity_from_headers(carrier: Any) -> dict[str, str | int]:
    """The rollout and attempt in NeMo Gym headers (ASGI byte pairs or a mapping), if both are
    present and valid and ``GYMTRACE_TRUST_IDENTITY`` believes unsigned identity (``all``)."""
    pairs = carrier.items() if isinstance(carrier, Mapping) else carrier
    found: dict[str, str] = {}
    for name, value in pairs:
        key = (bytes(name).decode("latin-1") if isinstance(name, (bytes, bytearray)) else str(name)).lower()
        if key in (c.NEMO_GYM_ROLLOUT_HEADER, c.NEMO_GYM_ATTEMPT_HEADER) and key not in found:
            found[key] = (
                bytes(value).decode("latin-1") if isinstance(value, (bytes, bytearray)) else str(value)
            )
    nemo_id = found.get(c.NEMO_GYM_ROLLOUT_HEADER)
    attempt_text = found.get(c.NEMO_GYM_ATTEMPT_HEADER)
    if nemo_id is None or attempt_text is None:
        return {}  # a lone header is NeMo Gym's 409, never half an identity
    if len(nemo_id) > 256 or not NEMO_ID.fullmatch(nemo_id):
        return {}
    if not (attempt_text.isascii() and attempt_text.isdigit() and len(attempt_text) <= 10):
        return {}
    attempt = int(attempt_text)
    if attempt > _MAX_ATTEMPT:
        return {}
    try:
        rollout_id = from_nemo_id(nemo_id)
    except (UnicodeDecodeError, ValueError):
        return {}
    if not rollout_id.isprintable():
        return {}
    identity: dict[str, str | int] = {
        c.ROLLOUT_ID: rollout_id,
        c.EPISODE_ATTEMPT: attempt,
        c.EPISODE_ID: rollout_id if attempt == 0 else f"{rollout_id}-a{attempt}",
    }
    return _trust.accept(identity, None)


def alias_attributes(identity: Mapping[str, Any]) -> dict[str, str]:
    """NeMo Gym's attribute names for ``identity``."""
    out: dict[str, str] = {}
    execution = _execution(identity)
    if execution is not None:
        out[c.NEMO_GYM_ROLLOUT_ID] = _key(execution)
    for source, alias in ((c.RUN_ID, c.NEMO_GYM_RUN_ID), (c.TASK_ID, c.NEMO_GYM_TASK_ID)):
        value = identity.get(source)
        if isinstance(value, str):
            out[alias] = value
    return out


# -- outgoing requests -----------------------------------------------------------------------------


class _Options:
    body = False
    path = False


_options = _Options()
_lock = threading.Lock()
_patched: list[tuple[type, str]] = []


def _has_identity_header(existing: Any) -> bool:
    return any(str(k).lower() in (c.NEMO_GYM_ROLLOUT_HEADER, c.NEMO_GYM_ATTEMPT_HEADER) for k in existing)


def _prefixed(path: str, prefix: str) -> str:
    return path if path.startswith(c.NEMO_GYM_PATH_PREFIX) else prefix + path


def _httpx_request(request: Any) -> Any:
    """``request`` with the identity added (a new request when the body or path changes)."""
    import httpx

    wire = headers()
    if not wire or _has_identity_header(request.headers.keys()):
        return request  # the caller chose the identity (or sent one header on purpose)
    request.headers.update(wire)
    url, content = request.url, None
    if _options.path:
        url = request.url.copy_with(path=_prefixed(request.url.path, path_prefix()))
    if _options.body and request.headers.get("content-type", "").startswith("application/json"):
        body = json.loads(request.read() or b"null")
        if isinstance(body, dict):
            content = json.dumps({**body_fields(), **body}).encode()
    if url is request.url and content is None:
        return request
    fresh_headers = httpx.Headers(request.headers)
    if content is not None:
        fresh_headers["content-length"] = str(len(content))
    return httpx.Request(
        request.method,
        url,
        headers=fresh_headers,
        content=content if content is not None else request.read(),
        extensions=request.extensions,
    )


def _send_arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """``Client.send``'s and ``AsyncClient.send``'s arguments with the identity on the request
    (``kwargs`` is updated in place when the request is passed by name)."""
    try:
        if args:
            return (_httpx_request(args[0]), *args[1:])
        kwargs["request"] = _httpx_request(kwargs["request"])
    except Exception as exc:  # noqa: BLE001 - telemetry must not break the request
        internal_error("gymtrace.integrations.nemo_gym httpx", exc)
    return args


def _send(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    args = _send_arguments(args, kwargs)
    return wrapped(*args, **kwargs)


async def _asend(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    args = _send_arguments(args, kwargs)
    return await wrapped(*args, **kwargs)


async def _aiohttp_request(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    try:
        wire = headers()
        given = kwargs.get("headers") or {}
        if wire and not _has_identity_header(
            given.keys() if hasattr(given, "keys") else (k for k, _ in given)
        ):
            from multidict import CIMultiDict

            merged: CIMultiDict[str] = CIMultiDict(given)
            merged.update(wire)
            kwargs["headers"] = merged
            if _options.body and isinstance(kwargs.get("json"), dict):
                kwargs["json"] = {**body_fields(), **kwargs["json"]}
            if _options.path and len(args) >= 2:
                import yarl

                url = yarl.URL(str(args[1]))
                args = (args[0], url.with_path(_prefixed(url.path, path_prefix())), *args[2:])
    except Exception as exc:  # noqa: BLE001 - telemetry must not break the request
        internal_error("gymtrace.integrations.nemo_gym aiohttp", exc)
    return await wrapped(*args, **kwargs)


def instrument(*, body: bool = False, path: bool = False, aliases: bool = False) -> None:
    """Add the NeMo Gym headers to every httpx and aiohttp request made inside a gym scope (unless
    the caller set one), and read them on incoming requests in :class:`~gymtrace.integrations.asgi.GymTraceMiddleware`.

    ``body``: also add the ``_ng_*`` fields to JSON object bodies (fields the caller set win);
    ``path``: also put ``/ng-rollout/<key>`` in front of the path; ``aliases``: stamp
    ``nemo.gym.rollout.id``, ``nemo.gym.run.id``, ``nemo.gym.task.id`` beside ``gym.*``.
    Calling it again changes the options.
    """
    for name, value in (("body", body), ("path", path), ("aliases", aliases)):
        if not isinstance(value, bool):
            from gymtrace._errors import InvalidArgumentError

            raise InvalidArgumentError(f"nemo_gym.instrument(): {name} must be a bool, got {value!r}")
    from gymtrace import _processor
    from gymtrace.integrations import asgi as _asgi

    with _lock:
        _options.body, _options.path = body, path
        _processor.set_aliases(alias_attributes if aliases else None)
        _asgi._set_fallback_identity(identity_from_headers)
        if _patched:
            return
        try:
            import httpx

            wrapt.wrap_function_wrapper(httpx.Client, "send", _send)
            wrapt.wrap_function_wrapper(httpx.AsyncClient, "send", _asend)
            _patched.extend([(httpx.Client, "send"), (httpx.AsyncClient, "send")])
        except ImportError:
            pass
        try:
            import aiohttp

            wrapt.wrap_function_wrapper(aiohttp.ClientSession, "_request", _aiohttp_request)
            _patched.append((aiohttp.ClientSession, "_request"))
        except ImportError:
            pass


def uninstrument() -> None:
    from gymtrace import _processor
    from gymtrace.integrations import asgi as _asgi

    with _lock:
        _processor.set_aliases(None)
        _asgi._set_fallback_identity(None)
        _options.body = _options.path = False
        for owner, name in reversed(_patched):
            wrapper = owner.__dict__[name]
            if getattr(wrapper, "_self_wrapper", None) in (_send, _asend, _aiohttp_request):
                setattr(owner, name, wrapper.__wrapped__)
        _patched.clear()
