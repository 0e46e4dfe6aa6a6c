"""Trace Ray tasks and actors inside gym scopes: ``gymtrace.integrations.ray.instrument()``.

Example::

    import gymtrace
    import gymtrace.integrations.ray

    config = gymtrace.configure(service_name="collector")
    gymtrace.integrations.ray.instrument(config)     # before the first .remote() of each function

    @ray.remote(max_retries=2)
    def play(seed):
        with gymtrace.step():                        # in the worker: the caller's episode
            ...

    with gymtrace.rollout(rollout_id="r1"), gymtrace.episode():
        ray.get(play.remote(0))

What it does:

- A remote function's first ``.remote()`` after ``instrument()`` (and an actor class's first
  ``.remote()`` creation) prepares it: gymtrace wraps the function (the actor's methods) with a
  keyword-only parameter, ``_gymtrace``, that Ray carries like any argument. A call made inside a
  gym scope passes the caller's trace context and gym identity in it (W3C headers from
  ``gymtrace.propagation.inject``, a continuation of the caller's episode: the task's steps get a
  range of their own and it may record the rollout's outcome); outside a gym scope nothing is
  passed. Functions and actor classes that were already called before ``instrument()`` run
  untraced in the workers (Ray exported them already; logged once each).
- In the worker the call runs under ``gymtrace.propagation.attach``: spans the task opens join the
  caller's trace with its identity. The execution itself is a ``ray.task {name}`` span with
  ``ray.task.attempt`` (Ray's attempt number, 0 first), ``ray.task.id`` and ``ray.worker.pid``; a
  re-run by Ray (``max_retries`` after a worker died, ``retry_exceptions``) carries a
  ``ray.task.retry`` event naming the attempt, so a lost attempt is never one clean attempt 0.
- Each worker configures gymtrace on its first traced call, from the ``Configuration`` given to
  ``instrument()`` (service name, OTLP endpoint and protocol, trace file) or, without one, from the
  environment it inherited. Exporter headers (``OTEL_EXPORTER_OTLP_HEADERS``, often an API key)
  and other credentials never travel in a task's arguments, which Ray stores and may spill to
  disk: a worker reads them from its own environment (docs/integrations/ray.md). A trace file becomes one file per worker process,
  ``{stem}.ray-{pid}{suffix}`` beside the driver's (processes must not interleave lines in one
  file); ``gymtrace tree``/``check`` take them all. Each traced call flushes its spans when it
  returns, because Ray reuses and kills workers without running exit handlers.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import wrapt
from opentelemetry import trace

import gymtrace
from gymtrace import attributes as c
from gymtrace.instrumentation import (
    check_tracer_provider,
    get_tracer,
    report_error,
    rerun,
    warn_once,
)

__all__ = ["instrument", "worker_file"]

PARAMETER = "_gymtrace"
_state: dict[str, Any] = {}
_lock = threading.Lock()


def worker_file(path: str | os.PathLike[str], pid: int | None = None) -> str:
    """The trace file a worker process writes when the driver writes ``path``."""
    p = Path(path)
    return str(p.with_name(f"{p.stem}.ray-{pid if pid is not None else os.getpid()}{p.suffix}"))


# -- the driver side ---------------------------------------------------------------------------------


def _settings(configuration: gymtrace.Configuration | None) -> dict[str, Any]:
    if configuration is None:
        return {}
    settings: dict[str, Any] = {}
    if configuration.service_name:
        settings["service_name"] = configuration.service_name
    if configuration.endpoint:
        settings["endpoint"] = configuration.endpoint
        settings["protocol"] = configuration.protocol
        # No exporter headers (often an API key): Ray stores task arguments and may spill them to
        # disk; a worker reads OTEL_EXPORTER_OTLP_HEADERS from its own environment (issue 31).
        if configuration.headers and not any(os.environ.get(v) for v in _HEADER_VARIABLES):
            _warn_once(
                "exporter headers",
                "the exporter headers given to gymtrace.configure() are not passed to Ray workers"
                " (task arguments are stored by Ray); set OTEL_EXPORTER_OTLP_HEADERS in the workers'"
                " environment",
            )
    if configuration.file:
        settings["file"] = str(Path(configuration.file).resolve())
    elif configuration.endpoint:
        settings["file"] = False
    return settings


_HEADER_VARIABLES = ("OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS")


def _payload() -> dict[str, Any] | None:
    """What a call made here carries to the worker, or None outside a recording gym scope."""
    scope = gymtrace.current_scope()
    # No identity: outside gym scopes, or tracing is off. A task calling another task from a
    # worker has the identity it was carried with, and passes it on.
    if scope is None or not scope.identity:
        return None
    settings = _state.get("settings")  # in a worker: the settings it was configured with
    if settings is None:
        settings = _settings(_state.get("configuration") or gymtrace.get_configuration())
    # The task continues the caller's episode inside the gym: identity, a step range, the hand-off.
    headers = gymtrace.propagation.inject(
        {}, destination=gymtrace.propagation.GYM_INTERNAL, continuation=True
    )
    return {"headers": dict(headers), "settings": settings, "pid": os.getpid()}


def _with_parameter(parameters: list[inspect.Parameter]) -> list[inspect.Parameter]:
    """Ray's signature (a list of parameters) plus ``_gymtrace=None``, keyword-only."""
    extra = inspect.Parameter(PARAMETER, inspect.Parameter.KEYWORD_ONLY, default=None)
    if parameters and parameters[-1].kind is inspect.Parameter.VAR_KEYWORD:
        return [*parameters[:-1], extra, parameters[-1]]
    return [*parameters, extra]


def _signature_with_parameter(function: Callable[..., Any]) -> inspect.Signature:
    signature = inspect.signature(function)
    return signature.replace(parameters=_with_parameter(list(signature.parameters.values())))


def _warn_once(key: str, message: str) -> None:
    warn_once(("gymtrace.integrations.ray", key), message)


def _with_payload(args: Any, kwargs: Any, payload: dict[str, Any]) -> tuple[Any, Any]:
    """The arguments of Ray's ``_remote(args, kwargs, **options)`` (tasks and actor methods alike)
    with ``payload`` added to the call's keyword arguments, given by position or by name; the
    caller's dictionaries are copied, not changed."""
    given = kwargs.get("kwargs") if "kwargs" in kwargs else (args[1] if len(args) > 1 else None)
    call_kwargs = {**(given or {}), PARAMETER: payload}
    if len(args) > 1:
        return (args[0], call_kwargs, *args[2:]), kwargs
    return args, {**kwargs, "kwargs": call_kwargs}


def _remote_function(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    try:
        payload = _prepare_function(instance)
        if payload is not None:
            args, kwargs = _with_payload(args, kwargs, payload)
    except Exception as exc:  # noqa: BLE001 - telemetry must not break the call
        report_error("gymtrace.integrations.ray preparing a task", exc)
    return wrapped(*args, **kwargs)


def _prepare_function(remote: Any) -> dict[str, Any] | None:
    with _lock:
        if not getattr(remote, "_gymtrace_prepared", False):
            if getattr(remote, "_function_signature", None) is not None or getattr(
                remote, "_is_cross_language", False
            ):
                name = getattr(getattr(remote, "_function", None), "__qualname__", repr(remote))
                _warn_once(
                    name,
                    f"Ray function {name} was called before gymtrace.integrations.ray.instrument();"
                    " its tasks run untraced in the workers",
                )
                remote._gymtrace_prepared = "untraced"
            else:
                remote._function = _task_wrapper(remote._function)
                remote._gymtrace_prepared = True
    if remote._gymtrace_prepared is not True:
        return None
    return _payload()


def _task_wrapper(function: Callable[..., Any]) -> Callable[..., Any]:
    return _traced(function, getattr(function, "__qualname__", "task"))


def _traced(function: Callable[..., Any], name: str) -> Callable[..., Any]:
    """``function`` accepting ``_gymtrace=`` and running under it, of the same kind (function,
    coroutine, generator, async generator): Ray decides how to run a task or method (e.g. streaming
    generators) by what kind of function it is. Arguments pass through unchanged, ``self`` too."""
    # A generator's execution runs in a context of its own, entered only while its body runs:
    # between items the consumer (Ray's thread or task) keeps its own context, so a later unrelated
    # rollout there never gets this episode as its parent (issue 25).
    if inspect.isasyncgenfunction(function):

        @functools.wraps(function)
        async def async_generator(*args: Any, _gymtrace: dict[str, Any] | None = None, **kwargs: Any) -> Any:
            if _gymtrace is None:
                async for item in function(*args, **kwargs):
                    yield item
                return
            context, execution = _entered_apart(_gymtrace, name)
            body = function(*args, **kwargs)
            error: BaseException | None = None
            try:
                while True:
                    try:
                        item = await asyncio.create_task(body.__anext__(), context=context)
                    except StopAsyncIteration:
                        return
                    yield item
            except BaseException as exc:
                error = exc
                raise
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.create_task(body.aclose(), context=context)
                execution.exit_in(context, error)

        traced: Callable[..., Any] = async_generator
    elif inspect.isgeneratorfunction(function):

        @functools.wraps(function)
        def generator(*args: Any, _gymtrace: dict[str, Any] | None = None, **kwargs: Any) -> Any:
            if _gymtrace is None:
                return (yield from function(*args, **kwargs))
            context, execution = _entered_apart(_gymtrace, name)
            body = function(*args, **kwargs)
            error: BaseException | None = None
            try:
                step: tuple[Callable[..., Any], Any] = (body.send, None)
                while True:
                    try:
                        item = context.run(step[0], step[1])
                    except StopIteration as stop:
                        return stop.value
                    try:
                        step = (body.send, (yield item))
                    except GeneratorExit:
                        raise
                    except BaseException as thrown:  # noqa: BLE001 - forwarded into the body, like `yield from`
                        step = (body.throw, thrown)
            except BaseException as exc:
                error = exc
                raise
            finally:
                context.run(body.close)
                execution.exit_in(context, error)

        traced = generator
    elif inspect.iscoroutinefunction(function):

        @functools.wraps(function)
        async def coroutine(*args: Any, _gymtrace: dict[str, Any] | None = None, **kwargs: Any) -> Any:
            if _gymtrace is None:
                return await function(*args, **kwargs)
            with _Execution(_gymtrace, name):
                return await function(*args, **kwargs)

        traced = coroutine
    else:

        @functools.wraps(function)
        def plain(*args: Any, _gymtrace: dict[str, Any] | None = None, **kwargs: Any) -> Any:
            if _gymtrace is None:
                return function(*args, **kwargs)
            with _Execution(_gymtrace, name):
                return function(*args, **kwargs)

        traced = plain
    traced.__signature__ = _signature_with_parameter(function)  # type: ignore[attr-defined]
    return traced


def _actor_creation(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    try:
        _prepare_actor_class(instance)
    except Exception as exc:  # noqa: BLE001 - telemetry must not break the call
        report_error("gymtrace.integrations.ray preparing an actor class", exc)
    return wrapped(*args, **kwargs)


def _prepare_actor_class(actor_class: Any) -> None:
    meta = getattr(actor_class, "__ray_metadata__", None)
    if meta is None or getattr(meta, "modified_class", None) is None:
        return
    with _lock:
        if getattr(meta, "_gymtrace_prepared", None) is not None:
            return
        name = meta.modified_class.__name__
        if meta.last_export_cluster_and_job is not None:
            _warn_once(
                name,
                f"Ray actor class {name} was created before gymtrace.integrations.ray.instrument();"
                " its methods run untraced",
            )
            meta._gymtrace_prepared = False
            return
        method_meta = meta.method_meta
        for method_name, method in list(method_meta.methods.items()):
            if method_name.startswith("__") or method_name not in method_meta.signatures:
                continue  # __init__ and Ray's own __ray_*__ methods
            wrapper = _traced(method, f"{name}.{method_name}")
            setattr(meta.modified_class, method_name, wrapper)
            method_meta.methods[method_name] = wrapper
            method_meta.signatures[method_name] = _with_parameter(list(method_meta.signatures[method_name]))
        meta._gymtrace_prepared = True


def _actor_method(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    try:
        parameters = getattr(instance, "_signature", None) or ()
        if any(p.name == PARAMETER for p in parameters):
            payload = _payload()
            if payload is not None:
                args, kwargs = _with_payload(args, kwargs, payload)
    except Exception as exc:  # noqa: BLE001 - telemetry must not break the call
        report_error("gymtrace.integrations.ray preparing an actor call", exc)
    return wrapped(*args, **kwargs)


def instrument(
    configuration: gymtrace.Configuration | None = None,
    *,
    tracer_provider: trace.TracerProvider | None = None,
) -> None:
    """Carry gym scopes into Ray tasks and actor methods (idempotent; ``ray`` may be imported and
    initialised before or after).

    ``configuration``: what ``gymtrace.configure()`` returned in the driver; each worker configures
    gymtrace alike. Without it, the driver's configuration at the time of each call is used
    (:func:`gymtrace.get_configuration`), and workers of an unconfigured driver configure from the
    environment they inherited.

    ``tracer_provider``: where the ``ray.task`` spans of tasks run in this process go (Ray's local
    mode; default: the global provider). A worker process has its own provider, the one it
    configured.
    """
    check_tracer_provider(tracer_provider, "ray.instrument()")
    _state["tracer_provider"] = tracer_provider
    if configuration is not None and not isinstance(configuration, gymtrace.Configuration):
        raise TypeError(
            "instrument(): argument 'configuration' must be what gymtrace.configure() returned,"
            f" got {type(configuration).__name__}"
        )
    _state["configuration"] = configuration
    _patch()


def _patch() -> None:
    if _state.get("patched"):
        return
    _state["patched"] = True

    def patch(module: Any) -> None:
        wrapt.wrap_function_wrapper("ray.remote_function", "RemoteFunction._remote", _remote_function)
        wrapt.wrap_function_wrapper("ray.actor", "ActorClass._remote", _actor_creation)
        wrapt.wrap_function_wrapper("ray.actor", "ActorMethod._remote", _actor_method)

    # Now if ray is imported, else when it is.
    wrapt.register_post_import_hook(patch, "ray")


# -- the worker side ---------------------------------------------------------------------------------


_ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


def _ensure_configured(settings: dict[str, Any], caller_pid: int | None) -> None:
    pid = os.getpid()
    if _state.get("worker_configured") == pid or pid == caller_pid:
        return  # configured already, or running in the calling process itself (no worker)
    with _lock:
        if _state.get("worker_configured") == pid:
            return
        options = dict(settings)
        file = options.get("file")
        if isinstance(file, str):
            options["file"] = worker_file(file)
        elif (
            file is None
            and not options.get("endpoint")
            and not any(os.environ.get(v) for v in _ENDPOINT_VARIABLES)
        ):
            # The embedded default file, as configure() would pick it, but one per worker: processes
            # appending to one file could interleave their lines.
            options["file"] = worker_file(os.environ.get("GYMTRACE_FILE") or "gymtrace-traces.jsonl")
        gymtrace.configure(**options)
        _state["worker_configured"] = pid
        # Tasks this worker calls carry the identity on, with the same settings.
        _state["settings"] = settings
        _patch()


def _attempt_number() -> int | None:
    # Ray keeps the attempt number in its core worker and has no public accessor for it.
    try:
        import ray

        core = getattr(ray._private.worker.global_worker, "core_worker", None)
        return int(core.get_current_task_attempt_number()) if core is not None else None
    except Exception:  # noqa: BLE001 - an older or newer Ray: the attempt is then unknown
        return None


def _task_id() -> str | None:
    try:
        import ray

        return ray.get_runtime_context().get_task_id()
    except Exception:  # noqa: BLE001
        return None


def _entered_apart(payload: dict[str, Any], name: str) -> tuple[contextvars.Context, _Execution]:
    """A generator task's execution, entered in a context of its own that only its body runs in."""
    context = contextvars.copy_context()
    execution = _Execution(payload, name)
    context.run(execution.__enter__)
    return context, execution


class _Execution:
    """One traced execution of a task or actor method in a worker."""

    __slots__ = ("_attach", "_name", "_payload", "_span_cm")

    def __init__(self, payload: dict[str, Any], name: str) -> None:
        self._payload = payload
        self._name = name
        self._attach: Any = None
        self._span_cm: Any = None

    def __enter__(self) -> None:
        try:
            _ensure_configured(self._payload.get("settings") or {}, self._payload.get("pid"))
            self._attach = gymtrace.propagation.attach(self._payload.get("headers") or {})
            self._attach.__enter__()
            attempt = _attempt_number()
            attributes: dict[str, Any] = {c.RAY_TASK_NAME: self._name, c.RAY_WORKER_PID: os.getpid()}
            task_id = _task_id()
            if task_id:
                attributes[c.RAY_TASK_ID] = task_id
            if attempt is not None:
                attributes[c.RAY_TASK_ATTEMPT] = attempt
            tracer = get_tracer(_state.get("tracer_provider"))
            if tracer is None:
                return  # tracing is off here
            self._span_cm = tracer.start_as_current_span(
                f"{c.SPAN_RAY_TASK} {self._name}", kind=trace.SpanKind.CONSUMER, attributes=attributes
            )
            span = self._span_cm.__enter__()
            if attempt:
                # At the episode level too: a rollout's episode run in this task is attempt
                # `attempt`, and the run Ray lost is a failed attempt before it.
                rerun(attempt, f"Ray re-ran task {self._name}: attempt {attempt - 1} ended without a result")
                span.add_event(
                    c.EVENT_RAY_TASK_RETRY,
                    {
                        c.RAY_TASK_ATTEMPT: attempt,
                        "message": f"Ray re-ran this task: attempt {attempt - 1} ended without a result"
                        " (its worker died, or it raised and retry_exceptions is on)",
                    },
                )
        except Exception as exc:  # noqa: BLE001 - telemetry must not break the task
            report_error("gymtrace.integrations.ray entering a task", exc)

    def exit_in(self, context: contextvars.Context, error: BaseException | None) -> None:
        context.run(self.__exit__, type(error) if error else None, error, None)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            if self._span_cm is not None:
                self._span_cm.__exit__(exc_type, exc, tb)
            if self._attach is not None:
                self._attach.__exit__(exc_type, exc, tb)
            # Ray reuses workers and kills idle ones without exit handlers: flush each call.
            gymtrace.force_flush()
        except Exception as error:  # noqa: BLE001 - telemetry must not break the task
            report_error("gymtrace.integrations.ray ending a task", error, may_raise=exc is None)
