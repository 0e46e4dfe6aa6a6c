"""The NeMo Gym 0.7.0 stack as it is, traced with no code: :func:`instrument_stack` patches NeMo
Gym's modules when they are imported.

``opentelemetry-instrument gym env start ...`` / ``... gym eval run ...`` load this through the
``gymtrace`` configurator and the ``gymtrace_nemo_gym`` instrumentor
(gymtrace.integrations.autoinstrument). NeMo Gym 0.7.0 names a rollout by the ``_ng_*`` fields of
the row it POSTs to ``/run`` (and, with its observability on, by the ``/ng-rollout/<key>/`` path
prefix); the patches read exactly that:

- driver (``gym eval run``): ``RolloutCollectionHelper.run_from_config`` is the run, each
  ``ServerClient`` POST to ``/run`` one rollout (first pass) or the next attempt of one (a resume
  pass), its reward the ``/run`` response's; the repeats of a task are one group, whose size
  ``_preprocess_rows_from_config`` counts (:mod:`.passes`);
- every server: an ASGI middleware continues the caller's identity (gym baggage, else the ``_ng_*``
  body fields, the path prefix, the development branch's ``x-nemo-gym-*`` headers) and spans the
  phases it recognises (``/seed_session``, ``/verify`` with the reward, model calls, tools); the
  first server that receives a row without identity opens the rollout itself (:mod:`.server`);
- outgoing: NeMo Gym's one HTTP function says which requests go to its own servers
  (``_internal``): gym identity goes with those, never to the upstream model endpoint
  (:mod:`.agent`).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from gymtrace import instrumentation
from gymtrace.integrations.nemo_gym.agent import _request_with_retries, _server_client_request
from gymtrace.integrations.nemo_gym.options import OPERATION_SPANS_ENV, _lock, _options
from gymtrace.integrations.nemo_gym.passes import _preprocess_rows, _run_from_config
from gymtrace.integrations.nemo_gym.server import _add_middleware, _format_exc

_stack_hooks: list[tuple[str, str, str, Any]] = [
    ("nemo_gym.server_utils", "SimpleServer", "instrument_app_for_telemetry", _add_middleware),
    ("nemo_gym.server_utils", "ServerClient", "request", _server_client_request),
    ("nemo_gym.server_utils", "", "_request_with_retries", _request_with_retries),
    ("nemo_gym.server_utils", "", "format_exc", _format_exc),
    ("nemo_gym.rollout_collection", "RolloutCollectionHelper", "run_from_config", _run_from_config),
    (
        "nemo_gym.rollout_collection",
        "RolloutCollectionHelper",
        "_preprocess_rows_from_config",
        _preprocess_rows,
    ),
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


def instrument_stack(*, tracer_provider: Any = None, operation_spans: bool | None = None) -> None:
    """Trace the NeMo Gym 0.7.0 stack as it is: the driver's run and its `/run` rollouts, every
    server's phases in the rollout's identity, identity kept inside the gym (see
    :mod:`gymtrace.integrations.nemo_gym.stack` and docs/integrations/nemo-gym.md). Patches NeMo Gym when its modules are imported (so a
    process that never imports them pays nothing); idempotent. What
    ``opentelemetry-instrument`` runs through :class:`gymtrace.integrations.autoinstrument.NeMoGymInstrumentor`.

    ``operation_spans``: keep the three spans FastAPI's own telemetry makes inside every request of
    a server (``fastapi.dependencies``, ``fastapi.endpoint``, ``fastapi.serialization``); None
    reads ``GYMTRACE_NEMO_GYM_OPERATION_SPANS`` (default ``false``: the request's server span
    stays, the three are not made)."""
    global _stack_registered, _stack_on
    import wrapt

    from gymtrace.integrations import aiohttp as gym_aiohttp

    if operation_spans is None:
        operation_spans = _flag(OPERATION_SPANS_ENV)
    with _lock:
        register = not _stack_registered
        _stack_registered = _stack_on = True
        _options.provider = tracer_provider
        _options.operation_spans = operation_spans
    gym_aiohttp.instrument()  # trace context and (gym destinations only) identity on every request
    module_names = sorted({hook[0] for hook in _stack_hooks})
    if register:
        for module_name in module_names:
            wrapt.register_post_import_hook(_patch_module, module_name)
    else:
        for module_name in module_names:
            if module_name in sys.modules:
                _patch_module(sys.modules[module_name])


def _flag(name: str) -> bool:
    """A boolean variable read as the OpenTelemetry SDK reads one; any other value warns and is
    the default, ``false``."""
    value = os.environ.get(name, "").strip().lower()
    if value in ("", "false", "0", "no", "off"):
        return False
    if value in ("true", "1", "yes", "on"):
        return True
    instrumentation.warn(f"{name}={value!r:.40} is not true or false; using false")
    return False


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
