"""Every setting gymtrace reads from the environment, resolved once into one frozen object.

Inside gymtrace a setting is one attribute read (``_settings.active.trace_per_run``), no parsing.

Precedence for every field: an argument to ``configure()`` (or a code override such as
``configure_content(capture=...)``), then the ``GYMTRACE_*`` variable, then the standard ``OTEL_*``
variable, then the default. The environment is read at import, at each ``configure()`` and at
:func:`reload` (``gymtrace.testing.reset()``), never on a hot path. A bad environment value is a
WARNING naming it, and the default is used (strict mode raises :class:`~gymtrace.InvalidArgumentError`);
a bad argument always raises; resolving at import never raises.

The bottom of the import graph: it imports only the standard library, ``_model.environment``,
``_constants``, ``_model.exceptions`` and ``_model/env_reading.py`` (how one variable is read).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

from gymtrace import _constants as c
from gymtrace._model import environment as env
from gymtrace._model.env_reading import CAPTURE_MODES as CAPTURE_MODES
from gymtrace._model.env_reading import EVENT_ONLY as EVENT_ONLY
from gymtrace._model.env_reading import NO_CONTENT as NO_CONTENT
from gymtrace._model.env_reading import SPAN_AND_EVENT as SPAN_AND_EVENT
from gymtrace._model.env_reading import SPAN_ONLY as SPAN_ONLY
from gymtrace._model.env_reading import TRUST_ALL as TRUST_ALL
from gymtrace._model.env_reading import TRUST_MODES as TRUST_MODES
from gymtrace._model.env_reading import TRUST_NONE as TRUST_NONE
from gymtrace._model.env_reading import TRUST_SIGNED as TRUST_SIGNED
from gymtrace._model.env_reading import Reader, http_traces_url, trust
from gymtrace._model.env_reading import parse_capture as parse_capture
from gymtrace._model.env_reading import process_file_name as process_file_name
from gymtrace._model.env_reading import split_list as split_list
from gymtrace._model.exceptions import InvalidArgumentError

logger = logging.getLogger("gymtrace")

PROTOCOLS: Final = ("grpc", "http/protobuf")
TRACE_PER: Final = ("rollout", "run")
SAMPLE_BY: Final = ("rollout", "task")

# Where the exporters run (GYMTRACE_ENCODER; see _export_process.py and _export_auto.py).
ENCODER_AUTO: Final = "auto"
ENCODER_THREAD: Final = "thread"
ENCODER_PROCESS: Final = "process"
ENCODERS: Final = (ENCODER_AUTO, ENCODER_THREAD, ENCODER_PROCESS)

# What a gymtrace.step records (GYMTRACE_STEP_*; see _steps.py). The aggregate policy keeps the
# first step and the slowest by default: a span costs about five CartPole steps, a random episode
# ~20. (The Gymnasium integration's own default keeps no slowest step: see DEFAULT_SAMPLE_SLOWEST.)
STEP_POLICIES: Final = (c.STEPS_POLICY_ALL, c.STEPS_POLICY_AGGREGATE)
DEFAULT_STEP_FIRST: Final = 1
DEFAULT_STEP_SLOWEST: Final = 1
DEFAULT_STEP_EPISODE_SHARE: Final = 0.0

DEFAULT_MAX_QUEUE_SIZE: Final = 8192
DEFAULT_MAX_EXPORT_BATCH_SIZE: Final = 512
DEFAULT_SCHEDULE_DELAY: Final = 0.5  # seconds (OTEL_BSP_SCHEDULE_DELAY is in milliseconds)
DEFAULT_FLUSH_TIMEOUT: Final = 5.0
# Seconds between heartbeats of an open rollout: a few per minute cost nothing, and `gymtrace live`
# reads a process lost after three missed ones (30 s), well inside a stuck run's hours.
DEFAULT_HEARTBEAT: Final = 10.0
DEFAULT_CONTENT_MAX_VALUE_BYTES: Final = 16 * 1024
DEFAULT_CONTENT_MAX_SPAN_BYTES: Final = 32 * 1024


# GYMTRACE_BACKEND: which server the OTLP exporter talks to (_export_backends.py).
BACKEND_OTLP: Final = "otlp"
BACKEND_MLFLOW: Final = "mlflow"
BACKEND_PHOENIX: Final = "phoenix"
BACKENDS: Final = (BACKEND_OTLP, BACKEND_MLFLOW, BACKEND_PHOENIX)
DEFAULT_EXPERIMENT: Final = "gymtrace"


@dataclass(frozen=True)
class Settings:
    """gymtrace's resolved settings; replaced whole, so a reader never sees half an update."""

    strict: bool = False
    trace_per_run: bool = False
    sdk_disabled: bool = False
    service_name: str | None = None  # None: the SDK's resource (OTEL_RESOURCE_ATTRIBUTES), then "gymtrace"
    exporters: tuple[str, ...] = ("file",)
    endpoint: str | None = None
    protocol: str = "grpc"
    file: str | None = env.DEFAULT_FILE
    file_compress: str = env.DEFAULT_FILE_COMPRESS  # GYMTRACE_FILE_COMPRESS: gzip, zstd or none
    file_rotate_bytes: int = int(env.DEFAULT_FILE_ROTATE_MB * 2**20)  # GYMTRACE_FILE_ROTATE_MB; 0: never
    unknown_exporters: tuple[str, ...] = ()
    sample_ratio: float | None = None  # None: the SDK's OTEL_TRACES_SAMPLER applies
    sample_by: str = "rollout"
    flush_timeout: float = DEFAULT_FLUSH_TIMEOUT
    max_queue_size: int = DEFAULT_MAX_QUEUE_SIZE
    max_export_batch_size: int = DEFAULT_MAX_EXPORT_BATCH_SIZE
    schedule_delay: float = DEFAULT_SCHEDULE_DELAY
    encoder: str = ENCODER_AUTO
    backend: str = BACKEND_OTLP  # GYMTRACE_BACKEND: which server the OTLP exporter talks to
    experiment: str = DEFAULT_EXPERIMENT  # GYMTRACE_EXPERIMENT: MLflow experiment or Phoenix project
    step_policy: str = c.STEPS_POLICY_ALL
    # GYMTRACE_STEP_POLICY holds a valid policy: chosen, so it applies to the integrations too.
    step_policy_chosen: bool = False
    step_first: int = DEFAULT_STEP_FIRST
    step_slowest: int = DEFAULT_STEP_SLOWEST
    step_episode_share: float = DEFAULT_STEP_EPISODE_SHARE
    # Which of the step policy's parameters ("first", "slowest", "episode_share") a variable gave:
    # an integration with a default policy of its own takes those, and its own for the rest.
    step_parameters_given: frozenset[str] = frozenset()
    capture_content: str = NO_CONTENT
    content_max_value_bytes: int = DEFAULT_CONTENT_MAX_VALUE_BYTES
    content_max_span_bytes: int = DEFAULT_CONTENT_MAX_SPAN_BYTES
    trust_identity: str = TRUST_ALL
    # The first signs, all verify. Never in repr(): settings get logged.
    identity_secrets: tuple[str, ...] = field(default=(), repr=False)
    baggage_allow: frozenset[str] = frozenset()
    heartbeat: float = DEFAULT_HEARTBEAT  # 0: no live markers, no heartbeats
    step_metrics: bool = False
    propagate_to: tuple[str, ...] = ()
    # GYMTRACE_PARENT: the settings a parent process's configure() resolved, as (name, value)
    # pairs, for a child that was never configured (see _setup.configure_from_parent).
    parent: tuple[tuple[str, Any], ...] | None = None


# Settings made in code (configure(strict=...), configure_content(capture=...), ...): they outlive
# a later configure() that does not mention them, and beat the environment. Field name -> value.
OVERRIDABLE: Final = frozenset(
    {
        "strict",
        "trace_per_run",
        "capture_content",
        "content_max_value_bytes",
        "content_max_span_bytes",
        "trust_identity",
        "identity_secrets",
        "baggage_allow",
        "heartbeat",
        "step_metrics",
    }
)
_overrides: dict[str, Any] = {}
_lock = threading.RLock()
_warned: set[tuple[str, str]] = set()


def resolve(
    *,
    endpoint: str | None = None,
    protocol: str | None = None,
    file: str | os.PathLike[str] | bool | None = None,
    console: bool | None = None,
    service_name: str | None = None,
    encoder: str | None = None,
    backend: str | None = None,
    experiment: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    lenient: bool = False,
) -> Settings:
    """The settings these arguments and ``overrides`` give over the environment; applies nothing.

    ``overrides`` are code overrides by field name (beating the sticky ones already made). Raises
    :class:`~gymtrace.InvalidArgumentError` for a bad argument, and for a bad environment value
    in strict mode unless ``lenient``.
    """
    environ = os.environ if environ is None else environ
    with _lock:
        given = {**_overrides, **(overrides or {})}
    strict = (
        given["strict"] if given.get("strict") is not None else env.env_flag(environ.get(env.GYMTRACE_STRICT))
    )
    read = Reader(environ, strict, lenient, _lock, _warned)

    if protocol is not None and protocol not in PROTOCOLS:
        raise InvalidArgumentError(
            f"gymtrace.configure(): argument 'protocol' must be one of {PROTOCOLS}, got {protocol!r}"
        )
    if endpoint is not None and (not isinstance(endpoint, str) or not endpoint):
        raise InvalidArgumentError(
            f"gymtrace.configure(): argument 'endpoint' must be a URL string, got {endpoint!r}"
        )
    if encoder is not None and encoder not in ENCODERS:
        raise InvalidArgumentError(
            f"gymtrace.configure(): argument 'encoder' must be one of {ENCODERS}, got {encoder!r:.80}"
        )
    if (file is not None and not isinstance(file, (bool, str, os.PathLike))) or file == "":
        raise InvalidArgumentError(
            "gymtrace.configure(): argument 'file' must be a path, True (the default file) or False"
            f" (no file), got {file!r:.80}"
        )
    if service_name is not None and (not isinstance(service_name, str) or not service_name):
        raise InvalidArgumentError(
            f"gymtrace.configure(): argument 'service_name' must be a non-empty string, got {service_name!r}"
        )

    if backend is not None and backend not in BACKENDS:
        raise InvalidArgumentError(
            f"gymtrace.configure(): argument 'backend' must be one of {BACKENDS}, got {backend!r:.80}"
        )
    if experiment is not None and (not isinstance(experiment, str) or not experiment.strip()):
        raise InvalidArgumentError(
            f"gymtrace.configure(): argument 'experiment' must be a non-empty string, got {experiment!r:.80}"
        )
    backend = backend or read.choice(env.GYMTRACE_BACKEND, BACKENDS, BACKEND_OTLP)
    experiment = experiment or (read.raw(env.GYMTRACE_EXPERIMENT) or "").strip() or DEFAULT_EXPERIMENT
    if backend != BACKEND_OTLP:
        # MLflow takes OTLP over HTTP only, Phoenix's HTTP protobuf only: the backend decides.
        protocol = "http/protobuf"

    wanted = {
        name.strip().lower() for name in environ.get(env.OTEL_TRACES_EXPORTER, "").split(",") if name.strip()
    }
    if protocol is None:
        name = (
            env.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL
            if read.raw(env.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL)
            else env.OTEL_EXPORTER_OTLP_PROTOCOL
        )
        protocol = read.choice(name, PROTOCOLS, "grpc")
    if endpoint is not None:
        resolved_endpoint: str | None = endpoint
        if protocol == "http/protobuf" and not endpoint.rstrip("/").endswith("/v1/traces"):
            resolved_endpoint = http_traces_url(endpoint)
    elif read.raw(env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT):
        resolved_endpoint = environ[env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT]
    elif read.raw(env.OTEL_EXPORTER_OTLP_ENDPOINT):
        base = environ[env.OTEL_EXPORTER_OTLP_ENDPOINT]
        resolved_endpoint = http_traces_url(base) if protocol == "http/protobuf" else base
    else:
        resolved_endpoint = None

    exporters: list[str] = []
    if resolved_endpoint is not None or "otlp" in wanted or backend != BACKEND_OTLP:
        exporters.append("otlp")
    if console if console is not None else "console" in wanted:
        exporters.append("console")
    path: str | None
    if file is False:
        path = None
    elif file is not None and file is not True:
        path = os.fspath(file)
        if path.endswith(("/", os.sep)):  # a directory, as GYMTRACE_FILE=DIR/: one file per process
            path = os.path.join(path, process_file_name())
    elif read.raw(env.GYMTRACE_FILE):
        path = environ[env.GYMTRACE_FILE]
        if path.endswith(("/", os.sep)):
            path = os.path.join(path, process_file_name())
    elif file is True or (not exporters and "none" not in wanted):
        path = env.DEFAULT_FILE  # the embedded default: no server needed
    else:
        path = None
    if path is not None:
        exporters.append("file")

    if given.get("trace_per_run") is not None:
        trace_per_run = bool(given["trace_per_run"])
    else:
        trace_per_run = read.choice(env.GYMTRACE_TRACE_PER, TRACE_PER, "rollout") == "run"

    sample_ratio: float | None = None
    if read.raw(env.GYMTRACE_SAMPLE_RATIO) is not None:
        ratio = read.number(env.GYMTRACE_SAMPLE_RATIO, -1.0, minimum=0)
        if ratio > 1:
            read.bad(
                env.GYMTRACE_SAMPLE_RATIO, environ[env.GYMTRACE_SAMPLE_RATIO], "a number in [0, 1]", None
            )
        elif ratio >= 0:
            sample_ratio = ratio

    if given.get("capture_content") is not None:
        capture = str(given["capture_content"])
    else:
        raw_capture = environ.get(env.OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT)
        capture = NO_CONTENT if raw_capture is None else (parse_capture(raw_capture) or "")
        if not capture:
            capture = NO_CONTENT
            read.bad(
                env.OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT,
                raw_capture or "",
                f"one of {CAPTURE_MODES} (or true/false), so content capture stays off",
                NO_CONTENT,
            )

    trust_identity, identity_secrets, baggage_allow = trust(read, given)

    def budget(field: str, name: str, default: int) -> int:
        if given.get(field) is not None:
            return int(given[field])
        return int(read.number(name, default, minimum=1, integer=True))

    return Settings(
        strict=strict,
        trace_per_run=trace_per_run,
        sdk_disabled=env.env_flag(environ.get(env.OTEL_SDK_DISABLED)),
        service_name=service_name or read.raw(env.OTEL_SERVICE_NAME),
        exporters=tuple(exporters),
        endpoint=resolved_endpoint,
        protocol=protocol,
        file=path,
        file_compress=_file_compress(read),
        file_rotate_bytes=int(
            read.number(env.GYMTRACE_FILE_ROTATE_MB, env.DEFAULT_FILE_ROTATE_MB, minimum=0) * 2**20
        ),
        unknown_exporters=tuple(sorted(wanted - {"otlp", "console", "none"})),
        sample_ratio=sample_ratio,
        sample_by=read.choice(env.GYMTRACE_SAMPLE_BY, SAMPLE_BY, "rollout"),
        flush_timeout=read.number(env.GYMTRACE_FLUSH_TIMEOUT, DEFAULT_FLUSH_TIMEOUT, minimum=0),
        max_queue_size=int(
            read.number(env.OTEL_BSP_MAX_QUEUE_SIZE, DEFAULT_MAX_QUEUE_SIZE, minimum=1, integer=True)
        ),
        max_export_batch_size=int(
            read.number(
                env.OTEL_BSP_MAX_EXPORT_BATCH_SIZE, DEFAULT_MAX_EXPORT_BATCH_SIZE, minimum=1, integer=True
            )
        ),
        schedule_delay=read.number(env.OTEL_BSP_SCHEDULE_DELAY, DEFAULT_SCHEDULE_DELAY * 1000, minimum=0)
        / 1000,
        encoder=encoder or read.choice(env.GYMTRACE_ENCODER, ENCODERS, ENCODER_AUTO),
        backend=backend,
        experiment=experiment,
        step_policy=read.choice(env.GYMTRACE_STEP_POLICY, STEP_POLICIES, c.STEPS_POLICY_ALL),
        step_policy_chosen=read.given(env.GYMTRACE_STEP_POLICY),  # after its read, which rejects a bad value
        step_first=int(read.number(env.GYMTRACE_STEP_FIRST, DEFAULT_STEP_FIRST, minimum=0, integer=True)),
        step_slowest=int(
            read.number(env.GYMTRACE_STEP_SLOWEST, DEFAULT_STEP_SLOWEST, minimum=0, integer=True)
        ),
        step_episode_share=read.number(
            env.GYMTRACE_STEP_EPISODE_SHARE, DEFAULT_STEP_EPISODE_SHARE, minimum=0, maximum=1
        ),
        # After the three reads above, which mark a bad value as not given.
        step_parameters_given=frozenset(
            name
            for name, variable in (
                ("first", env.GYMTRACE_STEP_FIRST),
                ("slowest", env.GYMTRACE_STEP_SLOWEST),
                ("episode_share", env.GYMTRACE_STEP_EPISODE_SHARE),
            )
            if read.given(variable)
        ),
        capture_content=capture,
        content_max_value_bytes=budget(
            "content_max_value_bytes", env.GYMTRACE_CONTENT_MAX_VALUE_BYTES, DEFAULT_CONTENT_MAX_VALUE_BYTES
        ),
        content_max_span_bytes=budget(
            "content_max_span_bytes", env.GYMTRACE_CONTENT_MAX_SPAN_BYTES, DEFAULT_CONTENT_MAX_SPAN_BYTES
        ),
        trust_identity=trust_identity,
        identity_secrets=identity_secrets,
        baggage_allow=baggage_allow,
        heartbeat=float(given["heartbeat"])
        if given.get("heartbeat") is not None
        else read.number(env.GYMTRACE_HEARTBEAT, DEFAULT_HEARTBEAT, minimum=0),
        step_metrics=bool(given["step_metrics"])
        if given.get("step_metrics") is not None
        else env.env_flag(environ.get(env.GYMTRACE_STEP_METRICS)),
        propagate_to=tuple(p.lower() for p in split_list(read.environ.get(env.GYMTRACE_PROPAGATE_TO))),
        parent=_parent(read),
    )


def _file_compress(read: Reader) -> str:
    compress = read.choice(env.GYMTRACE_FILE_COMPRESS, env.FILE_COMPRESSIONS, env.DEFAULT_FILE_COMPRESS)
    if compress == env.COMPRESS_ZSTD and not _zstd_installed():
        read.bad(
            env.GYMTRACE_FILE_COMPRESS,
            compress,
            "available here (zstd needs Python 3.14 or the zstandard package: pip install 'gymtrace[zstd]')",
            env.DEFAULT_FILE_COMPRESS,
        )
        return env.DEFAULT_FILE_COMPRESS
    return compress


def _zstd_installed() -> bool:
    # Looked up, not imported: the settings are read at import and at each configure().
    for name in ("compression.zstd", "zstandard"):
        try:
            if importlib.util.find_spec(name) is not None:
                return True
        except ImportError:  # no package "compression" below Python 3.14
            continue
    return False


# What GYMTRACE_PARENT may hold, and of which type each value must be.
PARENT_FIELDS: Final = {
    "pid": (int,),
    "service_name": (str, type(None)),
    "endpoint": (str, type(None)),
    "protocol": (str, type(None)),
    "file": (str, type(None)),
    "console": (bool,),
    "strict": (bool,),
    "trace_per": (str,),
    "backend": (str,),
    "experiment": (str,),
}


def _parent(read: Reader) -> tuple[tuple[str, Any], ...] | None:
    raw = read.raw(env.GYMTRACE_PARENT)
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if (
        not isinstance(value, dict)
        or not isinstance(value.get("pid"), int)
        or any(k not in PARENT_FIELDS or not isinstance(v, PARENT_FIELDS[k]) for k, v in value.items())
    ):
        read.bad(env.GYMTRACE_PARENT, raw, "the JSON object configure() writes", None)
        return None
    return tuple(sorted(value.items()))


active: Settings = resolve(lenient=True)
"""The settings in force. Read it as ``_settings.active.<field>``: the object is replaced whole,
so never bind it (or a field of it) to a name at import."""


def apply(settings: Settings, overrides: Mapping[str, Any] | None = None) -> None:
    """Make ``settings`` the active ones and record ``overrides`` (None values forget one)."""
    global active
    with _lock:
        for name, value in (overrides or {}).items():
            if name not in OVERRIDABLE:
                raise KeyError(name)
            if value is None:
                _overrides.pop(name, None)
            else:
                _overrides[name] = value
        active = settings


def override(**values: Any) -> None:
    """Set code overrides (``None`` forgets one, so the environment applies again) and re-resolve
    the overridden fields; the other fields keep what the last ``configure()`` resolved."""
    with _lock:
        fresh = resolve(overrides=values, lenient=True)
        changed = {name: getattr(fresh, name) for name in values}
        if "strict" in values:
            changed["strict"] = fresh.strict
        apply(replace(active, **changed), values)


def current_overrides() -> dict[str, Any]:
    with _lock:
        return dict(_overrides)


def reload() -> Settings:
    """Read the environment again (keeping code overrides); for tests that change variables."""
    settings = resolve()
    apply(settings)
    return settings


def reset() -> None:
    """Forget every code override and warning, and read the environment again."""
    with _lock:
        _overrides.clear()
        _warned.clear()
    apply(resolve(lenient=True))
