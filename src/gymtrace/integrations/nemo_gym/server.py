"""NeMo Gym: its stack traced with no code, and its wire identity for code you own.

**The stack as it is** (nemo-gym 0.7.0): ``opentelemetry-instrument gym env start ...`` and
``opentelemetry-instrument gym eval run ...`` run :func:`instrument_stack` in every NeMo Gym process
(through :mod:`gymtrace.integrations.autoinstrument`): each ``/run`` row is a rollout named by NeMo
Gym's key, a resume pass the next attempt of it, identity kept inside the gym
(docs/integrations/nemo-gym.md). :func:`rollout_identity`, :func:`run_id_for_output`,
:func:`trace_id_for` and :func:`span_id_for` are the one mapping from what NeMo Gym sends or stores
to gymtrace's IDs, shared with ``gymtrace import nemo-gym``.

**Headers, body fields and path prefix** for the current gym scope, for code you own:

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

import contextvars
import hashlib
import json
import os
import re
import secrets
import sys
import threading
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from time import time_ns
from typing import Any, NamedTuple

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from gymtrace import attributes as c
from gymtrace import instrumentation

__all__ = [
    "NEMO_ID",
    "NeMoGymServerMiddleware",
    "OutputPasses",
    "output_passes",
    "pass_log_path",
    "identity_from_key",
    "instrument_stack",
    "process_service_name",
    "span_id_for",
    "uninstrument_stack",
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
    """A NeMo Gym rollout as gymtrace names it (docs/contract/fixed-names.md, "NeMo Gym identity")."""

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


class OutputPasses(NamedTuple):
    """The traced passes of ``gym eval run`` over one output, read from its pass log."""

    run_id: str
    """The run the last fresh pass opened (resume passes continue it)."""
    passes: int
    """How many passes that run has had (fresh pass included)."""
    failed_in: Mapping[tuple[str, int], int]
    """``(rollout ID, attempt)`` -> the pass (0-based) in which that attempt failed."""


def pass_log_path(output: str | os.PathLike[str]) -> Path:
    """Where the traced passes of ``gym eval run --output OUTPUT`` are logged: a hidden file beside
    it (NeMo Gym stores nothing between passes; gymtrace keeps what a resume pass needs)."""
    resolved = Path(output).expanduser().resolve()
    return resolved.with_name(f".{resolved.name}{_PASS_LOG_SUFFIX}")


def output_passes(output: str | os.PathLike[str]) -> OutputPasses | None:
    """The traced run of ``output`` (its last fresh pass and the resume passes after it), or
    ``None`` when no traced pass wrote it."""
    try:
        lines = pass_log_path(output).read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    run_id: str | None = None
    passes = 0
    failed: dict[tuple[str, int], int] = {}
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a line a killed pass left half-written
        if not isinstance(entry, dict):
            continue
        if entry.get("pass") == "fresh" and isinstance(entry.get("run_id"), str):
            run_id, passes, failed = entry["run_id"], 1, {}
        elif entry.get("pass") == "resume" and run_id is not None:
            passes += 1
        elif isinstance(entry.get("failed"), str) and isinstance(entry.get("attempt"), int) and passes:
            failed[(entry["failed"], entry["attempt"])] = passes - 1
    return OutputPasses(run_id, passes, failed) if run_id is not None else None


def _log_pass(output: Path, entry: Mapping[str, Any]) -> None:
    with open(pass_log_path(output), "a", encoding="utf-8") as log:
        log.write(json.dumps(entry) + "\n")


def trace_id_for(run_id: str, rollout_id: str) -> int:
    """The trace of one rollout of one run, the same in every pass and every import: 128 bits of
    SHA-256 over both IDs (never 0, which OpenTelemetry reads as invalid)."""
    material = f"gymtrace/trace\x00{run_id}\x00{rollout_id}".encode()
    return int.from_bytes(hashlib.sha256(material).digest()[:16], "big") or 1


def _identity() -> dict[str, str | int]:
    return instrumentation.current_identity()


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
    # NeMo Gym runs and verifies the rollout on its side: a rollout that ends without an outcome of
    # its own here is pending, its outcome expected from there (issue 25).
    instrumentation.hand_off()
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
    return instrumentation.accept_identity(identity)


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

    wire = headers() if instrumentation.may_carry_identity(request.url) else {}
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
        instrumentation.report_error("gymtrace.integrations.nemo_gym httpx", exc)
    return args


def _send(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    args = _send_arguments(args, kwargs)
    return wrapped(*args, **kwargs)


async def _asend(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    args = _send_arguments(args, kwargs)
    return await wrapped(*args, **kwargs)


async def _aiohttp_request(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    try:
        destination = args[1] if len(args) > 1 else kwargs.get("str_or_url")
        wire = headers() if instrumentation.may_carry_identity(destination) else {}
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
        instrumentation.report_error("gymtrace.integrations.nemo_gym aiohttp", exc)
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
            raise instrumentation.InvalidArgumentError(
                f"nemo_gym.instrument(): {name} must be a bool, got {value!r}"
            )
    with _lock:
        _options.body, _options.path = body, path
        instrumentation.set_identity_aliases(alias_attributes if aliases else None)
        # GymTraceMiddleware reads NeMo Gym's headers where a request carries no gym baggage.
        instrumentation.set_identity_fallback(identity_from_headers)
        if _patched:
            return
        import wrapt  # here, not at the top: `gymtrace import nemo-gym` uses this module's IDs alone

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
    with _lock:
        instrumentation.set_identity_aliases(None)
        instrumentation.set_identity_fallback(None)
        _options.body = _options.path = False
        for owner, name in reversed(_patched):
            wrapper = owner.__dict__[name]
            if getattr(wrapper, "_self_wrapper", None) in (_send, _asend, _aiohttp_request):
                setattr(owner, name, wrapper.__wrapped__)
        _patched.clear()


# -- the NeMo Gym stack as it is (0.7.0), traced with no code -----------------------------------------
#
# `opentelemetry-instrument gym env start ...` / `... gym eval run ...` load this through the
# `gymtrace` configurator and the `gymtrace_nemo_gym` instrumentor (gymtrace.integrations.autoinstrument).
# NeMo Gym 0.7.0 names a rollout by the `_ng_*` fields of the row it POSTs to `/run` (and, with its
# observability on, by the `/ng-rollout/<key>/` path prefix); the patches below read exactly that:
#
# - driver (`gym eval run`): RolloutCollectionHelper.run_from_config is the run, each ServerClient
#   POST to `/run` one rollout (first pass) or the next attempt of one (a resume pass), its reward
#   the `/run` response's;
# - every server: an ASGI middleware continues the caller's identity (gym baggage, else the `_ng_*`
#   body fields, the path prefix, the development branch's `x-nemo-gym-*` headers) and spans the
#   phases it recognises (`/seed_session`, `/verify` with the reward, model calls, tools); the first
#   server that receives a row without identity opens the rollout itself;
# - outgoing: NeMo Gym's one HTTP function says which requests go to its own servers (`_internal`):
#   gym identity goes with those, never to the upstream model endpoint.

_PASS_LOG_SUFFIX = ".gymtrace-passes.jsonl"
_SERVER_NAME_ENV = "NEMO_GYM_CONFIG_PATH"  # set by `gym env start` for each server it launches
_PREFIX_PATH = re.compile(r"^/ng-rollout/([A-Za-z0-9][A-Za-z0-9._-]*)(/.*)$")
_KEY = re.compile(r"^(\d+)-(\d+)(?:-a(\d+))?$")
_RUN, _SEED, _VERIFY = "/run", "/seed_session", "/verify"
_MODEL_PATHS = ("/v1/responses", "/v1/chat/completions", "/v1/messages")
_BODY_LIMIT = 4 << 20  # request and response bodies read for identity and reward: NeMo Gym's are small
_CLI_PREFIXES = ("ng_", "nemo_gym_")  # NeMo Gym's other console scripts (ng_collect_rollouts, ...)


def span_id_for(run_id: str, rollout_id: str, part: str) -> int:
    """A span ID of one rollout of one run (``part``: ``"rollout"``, ``"episode-0"``, ...), the same
    in every pass: what a resume pass links its next attempt to."""
    material = f"gymtrace/span\x00{run_id}\x00{rollout_id}\x00{part}".encode()
    return int.from_bytes(hashlib.sha256(material).digest()[:8], "big") or 1


def process_service_name(
    argv: list[str] | None = None, environ: Mapping[str, str] | None = None
) -> str | None:
    """The service name of a NeMo Gym process: its server's name for a server ``gym env start``
    launched, ``gym-eval-run`` (the command, joined) for the CLI; ``None`` for any other process."""
    environ = os.environ if environ is None else environ
    argv = sys.argv if argv is None else argv
    server = environ.get(_SERVER_NAME_ENV)
    if server:
        return server
    program = Path(argv[0]).name if argv and argv[0] else ""
    if program == "gym":
        words = [w for w in argv[1:3] if re.fullmatch(r"[a-z][a-z0-9_-]*", w)]
        return "-".join(["gym", *words])
    if program.startswith(_CLI_PREFIXES):
        return program
    return None


def _attributes(identity: RolloutIdentity) -> dict[str, str | int]:
    values: dict[str, str | int] = {c.ROLLOUT_ID: identity.rollout_id}
    if identity.task_id:
        values[c.TASK_ID] = identity.task_id
    if identity.repeat is not None:
        values[c.ROLLOUT_REPEAT] = identity.repeat
    values[c.EPISODE_ATTEMPT] = identity.attempt
    values[c.EPISODE_ID] = (
        identity.rollout_id if identity.attempt == 0 else f"{identity.rollout_id}-a{identity.attempt}"
    )
    return values


def identity_from_key(key: str) -> RolloutIdentity | None:
    """The rollout a ``/ng-rollout/<key>/`` capture key names: ``"{task}-{rollout}"`` with
    ``-a{n}`` after attempt 0, or an explicit ``_ng_rollout_id`` (whose task is not in the key)."""
    match = _KEY.fullmatch(key)
    if match:
        task, repeat, attempt = match.groups()
        return RolloutIdentity(f"{task}-{repeat}", task, int(repeat), int(attempt or 0))
    if not NEMO_ID.fullmatch(key) or len(key) > 256:
        return None
    explicit = re.fullmatch(r"(.+)-a(\d{1,9})", key)
    if explicit:
        return RolloutIdentity(explicit.group(1), "", None, int(explicit.group(2)))
    return RolloutIdentity(key, "", None, 0)


# The driver's run: set by run_from_config for the tasks it starts, read by the /run dispatches (the
# environment server also POSTs to /run, to the agent, and opens no rollout for it).
class _Pass(NamedTuple):
    run_id: str
    number: int  # 0 for the fresh pass, then 1, 2... for each resume pass of its run
    failed_in: dict[tuple[str, int], int]  # (rollout ID, attempt) -> the pass it failed in
    output: Path


_driver_run: contextvars.ContextVar[_Pass | None] = contextvars.ContextVar(
    "gymtrace_nemo_gym_run", default=None
)


def _episode_part(attempt: int, number: int) -> str:
    """The span ID part of an attempt in a pass: each pass its own, so a pass that re-runs what a
    killed pass left (NeMo Gym re-dispatches it at the same attempt) never lands in its spans."""
    return f"episode-{attempt}" if number == 0 else f"episode-{attempt}/pass-{number}"


async def _read_response(response: Any) -> Any:
    """The JSON of an aiohttp response, read once (aiohttp keeps the bytes for NeMo Gym's own read)."""
    body = await response.read()
    return json.loads(body) if body and len(body) <= _BODY_LIMIT else None


def _reward_of(result: Any) -> float | None:
    reward = result.get("reward") if isinstance(result, Mapping) else None
    if isinstance(reward, bool) or not isinstance(reward, (int, float)):
        return None
    return float(reward)


async def _dispatch_run(
    wrapped: Any, args: tuple[Any, ...], kwargs: dict[str, Any], this_pass: _Pass, row: RolloutIdentity
) -> Any:
    """One `/run` POST of the driver as a rollout (attempt 0) or the next attempt of one."""
    from contextlib import ExitStack

    import gymtrace

    run_id = this_pass.run_id
    trace_id = trace_id_for(run_id, row.rollout_id)
    rollout_span = span_id_for(run_id, row.rollout_id, "rollout")
    stack = ExitStack()
    try:
        stack.enter_context(instrumentation.use_tracer_provider(_provider))
        if row.attempt == 0:
            with instrumentation.pinned_ids(trace_id, rollout_span):
                stack.enter_context(
                    gymtrace.rollout(rollout_id=row.rollout_id, task_id=row.task_id, repeat=row.repeat)
                )
            episode = gymtrace.episode(attempt=0)
        else:
            # A resume pass: NeMo Gym stored nothing, the IDs of the rollout and of the attempt that
            # failed are derived again; the attempt joins that trace, linked to it (relation retry).
            identity: dict[str, str | int] = {
                c.RUN_ID: run_id,
                c.ROLLOUT_ID: row.rollout_id,
                c.TASK_ID: row.task_id,
            }
            if row.repeat is not None:
                identity[c.ROLLOUT_REPEAT] = row.repeat
            carrier = instrumentation.episode_carrier(
                identity,
                next_attempt=row.attempt,
                trace_id=trace_id,
                rollout_span_id=rollout_span,
                episode_span_id=span_id_for(
                    run_id,
                    row.rollout_id,
                    _episode_part(
                        row.attempt - 1,
                        this_pass.failed_in.get(
                            (row.rollout_id, row.attempt - 1), max(0, this_pass.number - 1)
                        ),
                    ),
                ),
            )
            episode = gymtrace.episode(continue_from=carrier)
        part = _episode_part(row.attempt, this_pass.number)
        with instrumentation.pinned_ids(None, span_id_for(run_id, row.rollout_id, part)):
            stack.enter_context(episode)
    except Exception as exc:  # noqa: BLE001 - telemetry must not break the dispatch
        stack.close()
        instrumentation.report_error("gymtrace.integrations.nemo_gym /run", exc)
        return await wrapped(*args, **kwargs)
    with stack:
        try:
            response = await wrapped(*args, **kwargs)
        except Exception:
            _log_failure(this_pass, row)
            raise
        with instrumentation.guard("gymtrace.integrations.nemo_gym /run response"):
            if response.status >= 400:
                _log_failure(this_pass, row)
                gymtrace.record_failure(message=f"/run answered HTTP {response.status}")
            else:
                reward = _reward_of(await _read_response(response))
                if reward is not None:
                    gymtrace.record_reward(reward)
        return response


def _log_failure(this_pass: _Pass, row: RolloutIdentity) -> None:
    """Which pass an attempt failed in, for the resume pass that links its next attempt to it."""
    with instrumentation.guard("gymtrace.integrations.nemo_gym pass log"):
        _log_pass(this_pass.output, {"failed": row.rollout_id, "attempt": row.attempt})


async def _server_client_request(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    conversation = _conversation.get()
    if conversation is not None:
        try:
            server_name = kwargs.get("server_name", args[0] if args else None)
            url_path = kwargs.get("url_path", args[1] if len(args) > 1 else "")
            path = str(url_path).split("?", 1)[0]
            prefixed = _PREFIX_PATH.match(path)
            path = prefixed.group(2) if prefixed else path
            target = _target_kind(instance, server_name)
            own = server_name is not None and server_name == conversation.agent
        except Exception as exc:  # noqa: BLE001 - telemetry must not break the request
            instrumentation.report_error("gymtrace.integrations.nemo_gym ServerClient.request", exc)
            return await wrapped(*args, **kwargs)
        return await _agent_request(wrapped, args, kwargs, conversation, target, own, path, str(server_name))
    this_pass = _driver_run.get()
    if this_pass is None:
        return await wrapped(*args, **kwargs)
    row = None
    try:
        url_path = kwargs.get("url_path", args[1] if len(args) > 1 else "")
        body: Any = kwargs.get("json")
        if isinstance(url_path, str) and url_path.split("?", 1)[0].endswith(_RUN):
            fields = body.model_dump() if hasattr(body, "model_dump") else body
            row = rollout_identity(fields) if isinstance(fields, Mapping) else None
    except Exception as exc:  # noqa: BLE001 - telemetry must not break the request
        instrumentation.report_error("gymtrace.integrations.nemo_gym ServerClient.request", exc)
    if row is None or _own_telemetry("rollout"):
        # NeMo Gym's own rollout span (nemo.gym.rollout.id, read as the rollout ID) is the one.
        return await wrapped(*args, **kwargs)
    return await _dispatch_run(wrapped, args, kwargs, this_pass, row)


async def _run_from_config(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """`gym eval run`: a fresh pass is a new gym run; a resume pass continues the run of the last
    fresh pass over the same output (no second run span), as its next pass."""
    import gymtrace

    config: Any = args[0] if args else kwargs.get("config")
    try:
        output = Path(config.output_jsonl_fpath).expanduser().resolve()
        earlier = output_passes(output)
        resume = bool(getattr(config, "resume_from_cache", False)) and output.exists()
        if resume and earlier is not None:
            run_id, number = earlier.run_id, earlier.passes
            failed_in = dict(earlier.failed_in)
        elif resume:
            # An output written before passes were logged: its run is the one derived from its path.
            run_id, number, failed_in = run_id_for_output(output), 1, {}
        else:
            # Its own run, even over an output an earlier pass wrote: never that pass's IDs.
            run_id, number, failed_in = f"{run_id_for_output(output)}-{secrets.token_hex(3)}", 0, {}
        output.parent.mkdir(parents=True, exist_ok=True)
        _log_pass(
            output, {"pass": "resume" if resume else "fresh", "run_id": run_id, "started_ns": time_ns()}
        )
    except Exception as exc:  # noqa: BLE001 - telemetry must not break the run
        instrumentation.report_error("gymtrace.integrations.nemo_gym run_from_config", exc)
        return await wrapped(*args, **kwargs)
    token = _driver_run.set(_Pass(run_id, number, failed_in, output))
    try:
        if resume:
            ctx = instrumentation.continue_scope(otel_context.Context(), {c.RUN_ID: run_id})
            attached = otel_context.attach(ctx)
            try:
                return await wrapped(*args, **kwargs)
            finally:
                otel_context.detach(attached)
        with instrumentation.use_tracer_provider(_provider), gymtrace.run(run_id=run_id):
            return await wrapped(*args, **kwargs)
    finally:
        _driver_run.reset(token)


async def _request_with_retries(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """NeMo Gym's one HTTP function says whether a request goes to one of its servers; an agent's
    tool request that bypasses ``ServerClient`` (a session's direct tool access) joins its step."""
    conversation = _conversation.get()
    token = None
    with instrumentation.gym_destination(bool(kwargs.get("_internal", False))):
        if conversation is not None and not _routed.get():
            with instrumentation.guard("gymtrace.integrations.nemo_gym tool request"):
                url = str(kwargs.get("url", args[1] if len(args) > 1 else ""))
                name = url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
                call_id = conversation.invocation.take_call(name)
                context = conversation.invocation.step_context()
                if call_id is not None and context is not None:
                    given = kwargs.get("headers")
                    kwargs["headers"] = {
                        **(dict(given) if given else {}),
                        c.NEMO_GYM_TOOL_CALL_HEADER: call_id,
                    }
                    token = otel_context.attach(context)
        try:
            return await wrapped(*args, **kwargs)
        finally:
            if token is not None:
                otel_context.detach(token)


# -- servers ---------------------------------------------------------------------------------------------


def _own_telemetry(group: str) -> bool:
    """Whether NeMo Gym's own telemetry (nemo-lens) spans ``group``: then gymtrace opens no second
    span for that work (its spans are named gym.rollout / gym.verify too)."""
    try:
        from nemo_gym.telemetry._fallbacks import (  # type: ignore[import-not-found,unused-ignore]
            is_span_group_enabled,
        )

        return bool(is_span_group_enabled(group))
    except Exception:  # noqa: BLE001 - an older or newer NeMo Gym without it: ours are the only spans
        return False


async def _buffered(receive: Any) -> tuple[bytes, Any]:
    """The request body, and a ``receive`` that hands the application the same messages again."""
    messages: list[Any] = []
    body = b""
    while True:
        message = await receive()
        messages.append(message)
        if message.get("type") != "http.request":
            break
        body += message.get("body", b"")
        if not message.get("more_body") or len(body) > _BODY_LIMIT:
            break
    replay = iter(messages)

    async def again() -> Any:
        for message in replay:
            return message
        return await receive()

    return body, again


class _ServersOnlyRuns:
    """The runs of the rollouts a server opens itself (the driver runs untraced): the driver's pass
    is not on the wire, so a pass is told by its rollouts. A rollout attempt this server already
    opened in the current run starts the next run (a second `gym eval run` sends task 0's rollout 0
    again); a next attempt of a rollout (a resume pass) stays in its run. Each run is named by the
    server and the UTC second its first rollout arrived, with a random suffix."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._run_id: str | None = None
        self._seen: set[tuple[str, int]] = set()

    def run_for(self, identity: RolloutIdentity, server: str | None) -> str:
        key = (identity.rollout_id, identity.attempt)
        with self._lock:
            if self._run_id is None or key in self._seen:
                started = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
                self._run_id = f"{server or 'nemo-gym'}-{started}-{secrets.token_hex(2)}"
                self._seen = set()
            self._seen.add(key)
            return self._run_id


_servers_only_runs = _ServersOnlyRuns()


class _Phase(NamedTuple):
    # "root", "seed", "verify", "model", "tool", or "" (identity only). No agent invocation for an
    # agent's /run: it spans the seed_session and verify calls, which rank above it.
    kind: str
    argument: str | None = None
    call_id: str | None = None  # a tool's, sent by a traced agent


class NeMoGymServerMiddleware:
    """ASGI middleware for one NeMo Gym server: its requests run in the caller's gym identity, and
    the phases it serves are spans (``gymtrace.integrations.nemo_gym.instrument_stack`` adds it to
    every server NeMo Gym starts)."""

    def __init__(
        self, app: Any, *, server_type: str | None, server_name: str | None, model: str | None = None
    ) -> None:
        self.app = app
        self.server_type = server_type
        self.server_name = server_name
        self.model = model

    def _phase(self, method: str, path: str, rooted: bool, call_id: str | None = None) -> _Phase:
        kind = self.server_type
        if path == _RUN and not rooted:
            return _Phase("root")
        if kind == "resources_servers" and method == "POST":
            if path == _SEED:
                return _Phase("seed")
            if path == _VERIFY:
                return _Phase("verify")
            name = path.strip("/")
            if name and "/" not in name and name not in ("aggregate_metrics", "close_session", "run"):
                return _Phase("tool", name, call_id)
        if kind == "responses_api_models" and path in _MODEL_PATHS:
            return _Phase("model", self.model)
        return _Phase("")

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        try:
            ctx, phase, root, receive = await self._prepare(scope, receive)
        except Exception as exc:  # noqa: BLE001 - telemetry must not break the request
            instrumentation.report_error("gymtrace.integrations.nemo_gym middleware", exc)
            await self.app(scope, receive, send)
            return
        token = otel_context.attach(ctx)
        try:
            await self._serve(scope, receive, send, phase, root)
        finally:
            otel_context.detach(token)

    async def _prepare(
        self, scope: Any, receive: Any
    ) -> tuple[otel_context.Context, _Phase, RolloutIdentity | None, Any]:
        from opentelemetry import propagate

        headers: dict[str, str] = {}
        for name, value in scope.get("headers") or ():
            headers.setdefault(bytes(name).decode("latin-1").lower(), bytes(value).decode("latin-1"))
        current = otel_context.get_current()
        if trace.get_current_span(current).get_span_context().is_valid:
            # An HTTP server span outside this middleware (FastAPI's own telemetry, the contrib
            # instrumentation) already continued the caller: the server's spans go under it, so
            # the nesting follows the calls.
            ctx = current
        else:
            ctx = propagate.extract(headers)
        identity = instrumentation.incoming_identity(headers.get("baggage")) or identity_from_headers(headers)
        path = scope.get("path", "")
        key = None
        prefixed = _PREFIX_PATH.match(path)
        if prefixed:
            key, path = prefixed.group(1), prefixed.group(2)
        found: RolloutIdentity | None = None
        if not identity and scope.get("method") == "POST" and path in (_RUN, _SEED, _VERIFY):
            body, receive = await _buffered(receive)
            try:
                fields = json.loads(body) if body else None
            except ValueError:
                fields = None
            found = rollout_identity(fields) if isinstance(fields, Mapping) else None
        if found is None and key is not None and not identity:
            found = identity_from_key(key)
        if found is not None:
            identity = instrumentation.accept_identity(_attributes(found))
            if not identity:
                found = None
        rooted = bool(identity) and found is None  # continued from a gym caller (baggage, headers)
        call_id = headers.get(c.NEMO_GYM_TOOL_CALL_HEADER)
        phase = self._phase(scope.get("method", ""), path, rooted or found is None, call_id)
        if (
            phase.kind == ""
            and self.server_type == "responses_api_agents"
            and identity
            and scope.get("method") == "POST"
            and path in _AGENT_PATHS
        ):
            phase = _Phase("agent", self.server_name)
        if phase.kind == "root" and found is not None:
            # No scope continued: the rollout opens here. continue_scope with no identity still
            # takes the gym.* entries the extraction put into the baggage (issue 31). The rollout
            # gets a run of this server's own, so repeated servers-only runs do not pool.
            run = {c.RUN_ID: _servers_only_runs.run_for(found, self.server_name)}
            return instrumentation.continue_scope(ctx, run), phase, found, receive
        return instrumentation.continue_scope(ctx, identity), phase, None, receive

    async def _serve(
        self, scope: Any, receive: Any, send: Any, phase: _Phase, root: RolloutIdentity | None
    ) -> None:
        from contextlib import ExitStack

        import gymtrace

        captured: dict[str, Any] = {"status": None, "body": b""}

        stack = ExitStack()
        scored = False
        keep_body = False  # the response body is read: a reward, a model's usage

        async def capture(message: Any) -> None:
            kind = message.get("type")
            if kind == "http.response.start":
                captured["status"] = message.get("status")
            elif (
                kind == "http.response.body"
                and (keep_body or (captured["status"] or 0) >= 500)
                and len(captured["body"]) < _BODY_LIMIT
            ):
                captured["body"] += message.get("body", b"")
            await send(message)

        opened = False  # a span of this request's own: its status follows the response's
        conversation: _Conversation | None = None
        try:
            stack.enter_context(instrumentation.use_tracer_provider(_provider))
            if root is not None and not _own_telemetry("rollout"):
                # Nobody upstream traced this row (the driver runs without gymtrace): it starts here.
                stack.enter_context(
                    gymtrace.rollout(
                        rollout_id=root.rollout_id, task_id=root.task_id or None, repeat=root.repeat
                    )
                )
                stack.enter_context(gymtrace.episode(attempt=root.attempt))
                scored = opened = keep_body = True
                if self.server_type == "responses_api_agents":
                    conversation = self._conversation(scope, own=True)
            elif phase.kind == "agent":
                conversation = self._conversation(scope, own=scope.get("path", "").endswith(_RUN))
            else:
                own: Any = None
                if phase.kind == "seed":
                    own = gymtrace.seed_session()
                elif phase.kind == "verify" and not _own_telemetry("verify"):
                    own, scored, keep_body = gymtrace.verify(), True, True
                elif phase.kind == "model":
                    own, keep_body = gymtrace.model_call(model=phase.argument), True
                elif phase.kind == "tool":
                    own = gymtrace.tool_call(tool_name=phase.argument, call_id=phase.call_id)
                if own is not None:
                    stack.enter_context(own)
                    opened = True
        except Exception as exc:  # noqa: BLE001 - telemetry must not break the request
            stack.close()
            instrumentation.report_error("gymtrace.integrations.nemo_gym middleware", exc)
            await self.app(scope, receive, send)
            return
        with stack:
            token = _conversation.set(conversation) if conversation is not None else None
            tracebacks: list[str] = []
            traceback_token = _tracebacks.set(tracebacks) if opened else None
            try:
                await self.app(scope, receive, capture if opened or conversation else send)
            finally:
                if traceback_token is not None:
                    _tracebacks.reset(traceback_token)
                if token is not None:
                    _conversation.reset(token)
                    status = captured["status"] or 500
                    with instrumentation.guard("gymtrace.integrations.nemo_gym agent response"):
                        # Its own invocation ends here; one it continued, only its turn and step.
                        failed = status if status >= 500 else None
                        if conversation is not None and conversation.own:
                            conversation.invocation.close(failed)
                        elif conversation is not None:
                            conversation.invocation.end_step(failed)
            if not opened:
                return
            with instrumentation.guard("gymtrace.integrations.nemo_gym response"):
                status = captured["status"] or 500
                body = captured["body"]
                if status >= 500 and root is not None and scored:
                    gymtrace.record_failure(message=f"/run answered HTTP {status}")
                elif status >= 500:
                    # The handler's exception became a 500 inside the app: the phase still failed.
                    frame = instrumentation.innermost_scope()
                    if frame is not None:
                        _record_server_error(frame.span, status, body, tracebacks[-1] if tracebacks else None)
                elif phase.kind == "model" and status < 400 and body:
                    frame = instrumentation.innermost_scope()
                    if frame is not None and frame.span is not None:
                        frame.span.set_attributes(_usage_attributes(json.loads(body)))
                elif scored and status < 400:
                    reward = _reward_of(json.loads(body)) if body else None
                    if reward is not None:
                        gymtrace.record_reward(reward)

    def _conversation(self, scope: Any, *, own: bool) -> _Conversation:
        """The conversation an agent's ``/run`` or ``/v1/responses`` request is: a ``/v1/responses``
        posted by this agent's own ``/run`` continues that invocation (found by its trace)."""
        invocation = None
        if not own:
            trace_id = trace.get_current_span().get_span_context().trace_id
            invocation = _invocations.get(trace_id)
            if invocation is not None:
                return _Conversation(invocation, False, self.server_name)
        invocation = _Invocation(self.server_name, instrumentation.get_tracer(_provider))
        return _Conversation(invocation, True, self.server_name)


_EXCEPTION_REPR = re.compile(r"([A-Za-z_][A-Za-z0-9_.]*)\((.*)\)", re.DOTALL)
_STACKTRACE_LIMIT = 16384

# The traceback NeMo Gym formats for the exception its exception middleware caught in this request
# (it prints it and answers only repr(e)): a list per request the phase's span was opened for.
_tracebacks: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar(
    "gymtrace_nemo_gym_tracebacks", default=None
)


def _format_exc(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``nemo_gym.server_utils.format_exc``: called once, in the ``except`` of the middleware that
    turns a handler's exception into HTTP 500; its text is kept for the failing span's event."""
    text = wrapped(*args, **kwargs)
    kept = _tracebacks.get()
    if kept is not None and isinstance(text, str):
        kept.append(text)
    return text


def _record_server_error(span: Any, status: int, body: bytes, stacktrace: str | None = None) -> None:
    """A phase answered HTTP 5xx: its span failed, with the exception NeMo Gym caught when its
    answer says which (its servers answer ``repr(exception)`` as a JSON string), and the traceback
    NeMo Gym formatted for it (``stacktrace``) when the server did."""
    if span is None:
        return
    text: Any = None
    try:
        text = json.loads(body) if body else None
    except ValueError:
        text = None
    match = _EXCEPTION_REPR.fullmatch(text.strip()) if isinstance(text, str) else None
    if match is None:
        span.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))
        return
    error_type, message = match.group(1), match.group(2)
    if len(message) >= 2 and message[0] == message[-1] and message[0] in "'\"":
        message = message[1:-1]  # a one-argument exception's repr quotes its message
    span.set_status(Status(StatusCode.ERROR, f"{error_type}: {message}"[:1024]))
    span.set_attribute(c.ERROR_TYPE, error_type)
    event = {c.EXCEPTION_TYPE: error_type, c.EXCEPTION_MESSAGE: message[:4096]}
    if stacktrace:
        event[c.EXCEPTION_STACKTRACE] = stacktrace[-_STACKTRACE_LIMIT:]  # the innermost frames last
    span.add_event(c.EXCEPTION_EVENT, event)


def _add_middleware(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``SimpleServer.instrument_app_for_telemetry(app)``: every NeMo Gym server calls it once its
    FastAPI app is built and before uvicorn starts it; the middleware is added there."""
    result = wrapped(*args, **kwargs)
    with instrumentation.guard("gymtrace.integrations.nemo_gym server"):
        from nemo_gym.server_utils import (  # type: ignore[import-not-found,unused-ignore]
            _telemetry_server_type,
        )

        app = args[0] if args else kwargs["app"]
        config = getattr(instance, "config", None)
        model = getattr(config, "openai_model", None) or getattr(config, "model", None)
        app.add_middleware(
            NeMoGymServerMiddleware,
            server_type=_telemetry_server_type(type(instance)),
            server_name=getattr(config, "name", None) or os.environ.get(_SERVER_NAME_ENV),
            model=model if isinstance(model, str) else None,
        )
    return result


# -- below the episode: the agent's invocation, its turns and steps --------------------------------------
#
# NeMo Gym's own boundary (simple_agent's TrajectoryTurn): one turn per model response. An agent
# server's `/run` (and a `/v1/responses` conversation nobody opened an invocation for) is an
# agent invocation; each model request it sends opens the next turn and its step, and the tool
# requests that follow run in that step until the next model request, its `/verify`, or its end.
# Everything is read from the requests the agent sends through NeMo Gym's one HTTP function, so any
# agent that talks to NeMo Gym's model servers that way is covered, whatever its loop.


class _Invocation:
    """One agent invocation in an agent server: its span, and its turn and step in progress."""

    __slots__ = ("agent", "calls", "frame", "scope", "step", "trace_id", "tracer", "turn", "turns")

    def __init__(self, agent: str | None, tracer: Any) -> None:
        self.agent = agent
        self.tracer = tracer
        self.scope: Any = None
        self.frame: Any = None
        self.trace_id = 0
        self.turns = 0
        self.turn: tuple[Any, Any] | None = None
        self.step: tuple[Any, Any] | None = None
        # The function calls the last model response asked for, (name, call ID), not yet sent.
        self.calls: list[tuple[str, str]] = []

    def open(self) -> otel_context.Context | None:
        """The invocation's context, its span started in the current context the first time."""
        import gymtrace

        if self.frame is None:
            self.scope = (
                gymtrace.agent_invocation(agent_name=self.agent)
                if self.agent
                else gymtrace.agent_invocation()
            )
            self.frame = instrumentation.start_scope(self.scope, self.tracer)
            if self.frame is None:
                return None
            span = self.frame.span
            if span is not None:
                self.trace_id = span.get_span_context().trace_id
                _invocations[self.trace_id] = self
        context: otel_context.Context | None = self.frame.context
        return context

    def next_step(self, parent: otel_context.Context | None) -> otel_context.Context | None:
        """A model request is about to go: end the step in progress, start the next turn and step
        (in ``parent``, default the current context); the step's context."""
        import gymtrace

        self.end_step()
        self.turns += 1
        number = self.turns
        token = otel_context.attach(parent) if parent is not None else None
        try:
            turn_scope = gymtrace.turn(number=number)
            turn = instrumentation.start_scope(turn_scope, self.tracer)
            if turn is None:
                return None
            self.turn = (turn_scope, turn)
            if turn.context is None:
                return None
        finally:
            if token is not None:
                otel_context.detach(token)
        token = otel_context.attach(turn.context)
        try:
            step_scope = gymtrace.step(number=number)
            step = instrumentation.start_scope(step_scope, self.tracer)
        finally:
            otel_context.detach(token)
        if step is None:
            return turn.context
        self.step = (step_scope, step)
        return step.context

    def step_context(self) -> otel_context.Context | None:
        return self.step[1].context if self.step is not None else None

    def take_call(self, tool: str) -> str | None:
        """The call ID of the first pending function call named ``tool`` (removed)."""
        for index, (name, call_id) in enumerate(self.calls):
            if name == tool:
                del self.calls[index]
                return call_id
        return None

    def end_step(self, failed: int | None = None) -> None:
        for pair in (self.step, self.turn):
            if pair is not None:
                if failed is not None and pair[1].span is not None:
                    pair[1].span.set_status(Status(StatusCode.ERROR, f"HTTP {failed}"))
                instrumentation.end_scope(pair[0], pair[1])
        self.step = self.turn = None
        self.calls = []

    def close(self, failed: int | None = None) -> None:
        self.end_step(failed)
        if self.frame is not None:
            _invocations.pop(self.trace_id, None)
            if failed is not None and self.frame.span is not None:
                self.frame.span.set_status(Status(StatusCode.ERROR, f"HTTP {failed}"))
            instrumentation.end_scope(self.scope, self.frame)
            self.frame = None


class _Conversation(NamedTuple):
    """An agent server's request in progress that talks to models: ``/run`` (``own``: its
    invocation opens at its first model or tool request and ends at its ``/verify``) or
    ``/v1/responses`` (turns open in its own context, under the invocation that called it)."""

    invocation: _Invocation
    own: bool
    agent: str | None


_conversation: contextvars.ContextVar[_Conversation | None] = contextvars.ContextVar(
    "gymtrace_nemo_gym_conversation", default=None
)
# Set while ServerClient sends a request the conversation already placed (NeMo Gym's HTTP function
# then places nothing again).
_routed: contextvars.ContextVar[bool] = contextvars.ContextVar("gymtrace_nemo_gym_routed", default=False)
# The open invocations of this process by trace: an agent's `/run` that posts to its own
# `/v1/responses` (simple_agent) continues its invocation there, one per rollout trace.
_invocations: dict[int, _Invocation] = {}
_AGENT_PATHS = (_RUN, "/v1/responses")


def _target_kind(client: Any, server_name: Any) -> str:
    """``responses_api_models``, ``resources_servers``, ... for a server ``ServerClient`` knows."""
    try:
        entry = client.global_config_dict.get(server_name)
        for kind in (
            "responses_api_models",
            "resources_servers",
            "responses_api_agents",
            "environment_servers",
        ):
            if kind in entry:
                return kind
    except Exception:  # noqa: BLE001 - an unknown server: no kind
        pass
    return ""


def _function_calls(body: Any) -> list[tuple[str, str]]:
    """The (name, call ID) of each function call a Responses API or chat completions body asks for."""
    calls: list[tuple[str, str]] = []
    if not isinstance(body, Mapping):
        return calls
    for item in body.get("output") or ():
        if isinstance(item, Mapping) and item.get("type") == "function_call":
            name, call_id = item.get("name"), item.get("call_id")
            if isinstance(name, str) and isinstance(call_id, str):
                calls.append((name, call_id))
    for choice in body.get("choices") or ():
        message = choice.get("message") if isinstance(choice, Mapping) else None
        for call in (message.get("tool_calls") or ()) if isinstance(message, Mapping) else ():
            function = call.get("function") if isinstance(call, Mapping) else None
            name = function.get("name") if isinstance(function, Mapping) else None
            call_id = call.get("id") if isinstance(call, Mapping) else None
            if isinstance(name, str) and isinstance(call_id, str):
                calls.append((name, call_id))
    return calls


def _usage_attributes(body: Any) -> dict[str, Any]:
    """GenAI attributes of a Responses API or chat completions response body: tokens (input,
    output, cached, reasoning), response ID, finish reasons, the tool call IDs it asks for."""
    out: dict[str, Any] = {}
    if not isinstance(body, Mapping):
        return out
    response_id, model = body.get("id"), body.get("model")
    if isinstance(response_id, str):
        out[c.GEN_AI_RESPONSE_ID] = response_id
    if isinstance(model, str):
        out[c.GEN_AI_RESPONSE_MODEL] = model
    usage = body.get("usage")
    if isinstance(usage, Mapping):
        responses_api = "input_tokens" in usage
        pairs = (
            (c.GEN_AI_USAGE_INPUT_TOKENS, "input_tokens" if responses_api else "prompt_tokens", None),
            (c.GEN_AI_USAGE_OUTPUT_TOKENS, "output_tokens" if responses_api else "completion_tokens", None),
            (
                c.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,
                "input_tokens_details" if responses_api else "prompt_tokens_details",
                "cached_tokens",
            ),
            (
                c.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS,
                "output_tokens_details" if responses_api else "completion_tokens_details",
                "reasoning_tokens",
            ),
        )
        for attribute, key, inner in pairs:
            value = usage.get(key)
            if inner is not None:
                value = value.get(inner) if isinstance(value, Mapping) else None
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                out[attribute] = value
    reasons: list[str] = []
    if isinstance(body.get("output"), list):  # Responses API: a status, and why it is incomplete
        details = body.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, Mapping) else None
        if isinstance(reason, str):
            reasons.append(reason)
        elif any(isinstance(i, Mapping) and i.get("type") == "function_call" for i in body["output"]):
            reasons.append("tool_calls")
        elif body.get("status") == "completed":
            reasons.append("stop")
    for choice in body.get("choices") or ():
        reason = choice.get("finish_reason") if isinstance(choice, Mapping) else None
        if isinstance(reason, str):
            reasons.append(reason)
    if reasons:
        out[c.GEN_AI_RESPONSE_FINISH_REASONS] = reasons
    call_ids = [call_id for _, call_id in _function_calls(body)]
    if call_ids:
        out[c.GEN_AI_RESPONSE_TOOL_CALL_IDS] = call_ids
    return out


def _mark_request(invocation: _Invocation, context: otel_context.Context, server: str) -> None:
    """A live marker for the request about to go out: the rollout's step, and the server it now
    waits on (what ``gymtrace live`` names when the rollout hangs there)."""
    tracer = invocation.tracer
    identity = instrumentation.current_identity(context)
    if tracer is None or c.ROLLOUT_ID not in identity:
        return
    attributes: dict[str, Any] = {
        **identity,
        c.KIND: c.KIND_LIVE,
        c.LIVE_EVENT: c.LIVE_EVENT_STEP,
        c.LIVE_STEP: invocation.turns,
        c.LIVE_SERVER: server,
    }
    tracer.start_span(c.SPAN_LIVE, context=context, attributes=attributes).end()


async def _agent_request(
    wrapped: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    conversation: _Conversation,
    target: str,
    own: bool,
    path: str,
    server: str = "",
) -> Any:
    """One request an agent sends inside a conversation, in the turn, step or phase it belongs to."""
    invocation = conversation.invocation
    context: otel_context.Context | None = None
    model = False
    try:
        if path in (_SEED, _VERIFY, "/aggregate_metrics"):
            # The episode's phases, beside the invocation: it ends where verification starts.
            if path == _VERIFY and conversation.own:
                invocation.close()
        elif own:
            context = invocation.open()  # simple_agent's /run posting to its own /v1/responses
        elif target == "responses_api_models" and path in _MODEL_PATHS:
            parent = invocation.open() if conversation.own else None
            context = invocation.next_step(parent)
            model = True
        else:  # a tool, in the step of the model response that asked for it
            if conversation.own:
                invocation.open()
            context = invocation.step_context() or (invocation.open() if conversation.own else None)
            call_id = invocation.take_call(path.rsplit("/", 1)[-1])
            if call_id is not None:
                given = kwargs.get("headers")
                kwargs["headers"] = {**(dict(given) if given else {}), c.NEMO_GYM_TOOL_CALL_HEADER: call_id}
        if context is not None and (model or invocation.step is not None):
            _mark_request(invocation, context, server)
    except Exception as exc:  # noqa: BLE001 - telemetry must not break the request
        instrumentation.report_error("gymtrace.integrations.nemo_gym agent request", exc)
        context = None
    token = otel_context.attach(context) if context is not None else None
    routed = _routed.set(True)
    try:
        response = await wrapped(*args, **kwargs)
    finally:
        _routed.reset(routed)
        if token is not None:
            otel_context.detach(token)
    if model:
        with instrumentation.guard("gymtrace.integrations.nemo_gym model response"):
            if response.status < 400:
                invocation.calls = _function_calls(await _read_response(response))
    return response


# -- switching it on -------------------------------------------------------------------------------------

_stack_hooks: list[tuple[str, str, str, Any]] = [
    ("nemo_gym.server_utils", "SimpleServer", "instrument_app_for_telemetry", _add_middleware),
    ("nemo_gym.server_utils", "ServerClient", "request", _server_client_request),
    ("nemo_gym.server_utils", "", "_request_with_retries", _request_with_retries),
    ("nemo_gym.server_utils", "", "format_exc", _format_exc),
    ("nemo_gym.rollout_collection", "RolloutCollectionHelper", "run_from_config", _run_from_config),
]
_stack_patched: list[tuple[Any, str, Any]] = []
_stack_registered = False
_stack_on = False


def _patch_module(module: Any) -> None:
    import wrapt

    with instrumentation.guard("gymtrace.integrations.nemo_gym instrument_stack"), _lock:
        if not _stack_on:
            return
        for module_name, owner_name, attribute, wrapper in _stack_hooks:
            if module.__name__ != module_name:
                continue
            owner = getattr(module, owner_name) if owner_name else module
            current = owner.__dict__.get(attribute) if isinstance(owner, type) else getattr(owner, attribute)
            if getattr(current, "_self_wrapper", None) is wrapper:
                continue
            wrapt.wrap_function_wrapper(owner, attribute, wrapper)
            _stack_patched.append((owner, attribute, wrapper))


_provider: Any = None  # the tracer_provider instrument_stack() was given, None: the global one


def instrument_stack(*, tracer_provider: Any = None) -> None:
    """Trace the NeMo Gym 0.7.0 stack as it is: the driver's run and its `/run` rollouts, every
    server's phases in the rollout's identity, identity kept inside the gym (see the module section
    above and docs/integrations/nemo-gym.md). Patches NeMo Gym when its modules are imported (so a
    process that never imports them pays nothing); idempotent. What
    ``opentelemetry-instrument`` runs through :class:`gymtrace.integrations.autoinstrument.NeMoGymInstrumentor`."""
    global _stack_registered, _stack_on, _provider
    import wrapt

    from gymtrace.integrations import aiohttp as gym_aiohttp

    with _lock:
        register = not _stack_registered
        _stack_registered = _stack_on = True
        _provider = tracer_provider
    gym_aiohttp.instrument()  # trace context and (gym destinations only) identity on every request
    module_names = sorted({hook[0] for hook in _stack_hooks})
    if register:
        for module_name in module_names:
            wrapt.register_post_import_hook(_patch_module, module_name)
    else:
        for module_name in module_names:
            if module_name in sys.modules:
                _patch_module(sys.modules[module_name])


def uninstrument_stack() -> None:
    """Undo :func:`instrument_stack`'s patches (the import hooks stay, and patch nothing again)."""
    global _stack_on
    from gymtrace.integrations import aiohttp as gym_aiohttp

    with _lock:
        for owner, attribute, wrapper in reversed(_stack_patched):
            current: Any = (
                owner.__dict__.get(attribute) if isinstance(owner, type) else getattr(owner, attribute)
            )
            if getattr(current, "_self_wrapper", None) is wrapper:
                setattr(owner, attribute, current.__wrapped__)
        _stack_patched.clear()
        _stack_on = False
    gym_aiohttp.uninstrument()
