"""The wire identity for code you own: NeMo Gym's headers, body fields and path prefix for the
current gym scope, read back from an incoming request, and :func:`instrument`, which adds them to
every httpx and aiohttp request made inside a gym scope.

The client side of the package: it needs neither NeMo Gym nor its servers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gymtrace import attributes as c
from gymtrace import instrumentation
from gymtrace.integrations.nemo_gym.identity import _MAX_ATTEMPT, NEMO_ID, from_nemo_id, to_nemo_id
from gymtrace.integrations.nemo_gym.options import _lock, _options


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
    return instrumentation.episode_id(nemo_id, attempt)  # NeMo Gym's capture key: the episode-ID rule


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
        c.EPISODE_ID: instrumentation.episode_id(rollout_id, attempt),
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
