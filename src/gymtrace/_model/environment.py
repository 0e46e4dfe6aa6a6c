"""Environment variables gymtrace reads, each documented where it is defined.

gymtrace honours the standard ``OTEL_*`` variables through the OpenTelemetry SDK and exporters
(``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_EXPORTER_OTLP_ENDPOINT``,
``OTEL_EXPORTER_OTLP_PROTOCOL``, ``OTEL_EXPORTER_OTLP_HEADERS``, ``OTEL_TRACES_EXPORTER``,
``OTEL_TRACES_SAMPLER``, ``OTEL_SDK_DISABLED``, ...). The ``GYMTRACE_*`` variables below cover only
what those do not. Precedence everywhere: argument to ``configure()``, then ``GYMTRACE_*``, then
``OTEL_*``, then the default.

gymtrace reads these variables in one place, ``_model.settings`` (once at import and again at each
``configure()``), with one policy for a bad value: a warning naming the variable and the value, and
the default; an ``InvalidArgumentError`` in strict mode.
"""

from __future__ import annotations

from typing import Final

GYMTRACE_STRICT: Final = "GYMTRACE_STRICT"
"""``true`` makes contract problems raise instead of log: an inverted nesting of gym levels
(:class:`gymtrace.HierarchyViolationError`) and an invalid identity argument
(:class:`gymtrace.InvalidArgumentError`). Meant for test suites. Default ``false``."""

GYMTRACE_FILE: Final = "GYMTRACE_FILE"
"""Path of a local file that receives every finished span as OTLP/JSON lines (one
``ExportTraceServiceRequest`` per line, the format of the Collector's ``file`` exporter). When no
OTLP endpoint is configured this file is the embedded default, ``./gymtrace-traces.jsonl``. A path
ending in ``/`` is a directory: each process writes its own file there (``{program}-{pid}.jsonl``),
and every reader (``gymtrace tree``, ``check``, ``rollouts``, ``stats``) accepts the directory.
The file is written in segments (``GYMTRACE_FILE_ROTATE_MB``), compressed where
``GYMTRACE_FILE_COMPRESS`` says: ``traces.jsonl``, then ``traces.000001.jsonl``, ... (with gzip
``traces.jsonl.gz``, ``traces.000001.jsonl.gz``, ...); the readers take the name given here and
find them all."""

GYMTRACE_FILE_COMPRESS: Final = "GYMTRACE_FILE_COMPRESS"
"""How the trace file is compressed: ``none`` (default: plain ``.jsonl``, what ``tail -f``, ``jq``
and the Collector's ``otlpjsonfile`` receiver read, as gymtrace always wrote), ``gzip``
(``.jsonl.gz``: ~0.07x the bytes, for a training run) or ``zstd`` (``.jsonl.zst``; Python 3.14's
``compression.zstd``, or the ``zstandard`` package of the ``zstd`` extra below it). Each export is written as one whole gzip member or zstd frame, so a
reader can read the segment being written, and a process killed mid-write loses that write alone.
A path ending in ``.gz`` or ``.zst`` names its compression itself. Compressed on the exporter's
thread or in the encoder process, never on the application's threads."""

GYMTRACE_FILE_ROTATE_MB: Final = "GYMTRACE_FILE_ROTATE_MB"
"""Size in megabytes (2^20 bytes, on disk) at which the trace file moves on to its next segment
(``traces.000001.jsonl.gz``, ...). Default 256; ``0`` never rotates. A fraction is allowed."""

GYMTRACE_TRACE_PER: Final = "GYMTRACE_TRACE_PER"
"""``rollout`` (default): every rollout span is the root of its own trace and links to its run.
``run``: rollouts nest under the run span in one trace, for small runs."""

GYMTRACE_SAMPLE_RATIO: Final = "GYMTRACE_SAMPLE_RATIO"
"""A number in [0, 1]: keep that share of rollouts, whole, with
:class:`gymtrace.sampling.RolloutSampler` (a hash of the rollout or task ID, so every process and
every attempt of a rollout decides alike). Unset: the SDK's ``OTEL_TRACES_SAMPLER`` applies."""

GYMTRACE_SAMPLE_BY: Final = "GYMTRACE_SAMPLE_BY"
"""``rollout`` (default) or ``task``: what the rollout sampler hashes. ``task`` keeps or drops all
repeats of a task together (a GRPO group)."""

GYMTRACE_FLUSH_TIMEOUT: Final = "GYMTRACE_FLUSH_TIMEOUT"
"""Seconds gymtrace waits to export what is queued when the process ends (normal exit,
``sys.exit``, an unhandled exception, SIGTERM, a ``multiprocessing`` child's exit). What is still
queued then is counted as dropped and logged. Default ``5``."""

GYMTRACE_TRUST_IDENTITY: Final = "GYMTRACE_TRUST_IDENTITY"
"""Which incoming gym identity (``gym.*`` baggage, NeMo Gym headers) a process believes: ``all``
(every peer; the default without a secret, so a single-tenant cluster works out of the box),
``none`` (the trace is continued, the identity is not) or ``signed`` (only identity carrying a valid
``gym.sig`` HMAC made with ``GYMTRACE_IDENTITY_SECRET``; the default when a secret is set). An
unknown value is logged and means ``none``. ``configure(trust_identity=...)`` overrides it."""

GYMTRACE_IDENTITY_SECRET: Final = "GYMTRACE_IDENTITY_SECRET"
"""Shared secret that signs outgoing gym identity and verifies incoming identity under ``signed``.
Comma-separated secrets all verify and the first signs, for rotation. Never logged.
``configure(identity_secret=...)`` overrides it."""

GYMTRACE_BAGGAGE_ALLOW: Final = "GYMTRACE_BAGGAGE_ALLOW"
"""Comma-separated application baggage keys forwarded beside the gym identity on outgoing requests
(default empty: only identity leaves the process). Other application baggage stays in the
application's context and is never sent. ``gym.*`` keys cannot be listed.
``configure(baggage_allow=...)`` overrides it."""

GYMTRACE_PROPAGATE_TO: Final = "GYMTRACE_PROPAGATE_TO"
"""Comma-separated host patterns (``fnmatch`` style, ``host`` or ``host:port``: ``*.gym.internal``,
``10.0.0.*``, ``env-server:8000``; a URL without a port is matched at its scheme's default port, so
``env-server:*`` names ``http://env-server/`` too) that outgoing gym identity may go to, beside
loopback and, in a NeMo Gym process, the servers NeMo Gym itself addresses. Gym baggage and
``x-nemo-gym-*`` headers go nowhere else (a model provider is a third party); ``traceparent`` is
sent as usual. Default: empty. ``*`` sends identity everywhere, as before this setting existed."""
GYMTRACE_STEP_POLICY: Final = "GYMTRACE_STEP_POLICY"
"""What a ``gymtrace.step`` records. ``all`` (default): every step is a span, right for an LLM
agent loop whose steps take milliseconds. ``aggregate``: for simulators whose steps take
microseconds; the step owner's span (agent invocation, else episode) carries ``gym.steps.count``
and step-duration statistics, and only a bounded sample of steps become spans (see the
``GYMTRACE_STEP_*`` variables below; any step that raised is always one). Argument:
``configure(step_policy=...)``."""

GYMTRACE_STEP_FIRST: Final = "GYMTRACE_STEP_FIRST"
"""Under the ``aggregate`` step policy: the first N steps of each owner are spans (default 1)."""

GYMTRACE_STEP_SLOWEST: Final = "GYMTRACE_STEP_SLOWEST"
"""Under the ``aggregate`` step policy: the K slowest of the other steps of each owner become spans
when the owner ends, with their true numbers and times (default 1)."""

GYMTRACE_STEP_EPISODE_SHARE: Final = "GYMTRACE_STEP_EPISODE_SHARE"
"""Under the ``aggregate`` step policy: the share of owners (a number in [0, 1], default 0) whose
every step is a span, so some episodes can be read step by step."""

GYMTRACE_HEARTBEAT: Final = "GYMTRACE_HEARTBEAT"
"""Seconds between heartbeats of an open rollout (default 10): while a rollout is open its process
writes a ``gym.live`` marker when the rollout and each episode start and, while the rollout shows
no other activity, a heartbeat every this many seconds, so ``gymtrace live`` can tell a running
rollout from a stalled one and from one whose process is gone. ``0`` turns markers and heartbeats
off. Argument: ``configure(heartbeat=...)``."""

GYMTRACE_STEP_METRICS: Final = "GYMTRACE_STEP_METRICS"
"""``true`` records the ``gym.step.duration`` histogram (one measurement per step, so off by
default; the rollout and episode metrics are always recorded). Argument:
``configure(step_metrics=...)``."""

GYMTRACE_ENCODER: Final = "GYMTRACE_ENCODER"
"""Where gymtrace's OTLP and file exporters encode and send: ``auto`` (default) starts on a thread
of the application's process and moves to an encoder process once spans end faster than ~5,000 a
second (a simulator tracing every step), if the process may use two CPUs or more; ``thread`` stays
on the thread; ``process`` uses a child process from the start, fed with plain records through a
pipe, which takes the export's CPU, and the cost of the export thread itself, off the
application's process (see docs/performance.md). Argument: ``configure(encoder=...)``."""

GYMTRACE_BACKEND: Final = "GYMTRACE_BACKEND"
"""Which server the OTLP exporter talks to: ``otlp`` (default: a Collector or anything that speaks
OTLP), ``mlflow`` (an MLflow 3 tracking server) or ``phoenix`` (Arize Phoenix). ``mlflow`` and
``phoenix`` send OTLP/HTTP protobuf to ``{OTEL_EXPORTER_OTLP_ENDPOINT}/v1/traces`` whatever the
protocol setting, map the spans so the server's own UI and search understand them, and send each
scored rollout's reward as the server's score named ``reward`` (docs/integrations/backends.md).
Argument: ``configure(backend=...)``."""

GYMTRACE_EXPERIMENT: Final = "GYMTRACE_EXPERIMENT"
"""The MLflow experiment (created if missing) or the Phoenix project the traces go to, with
``GYMTRACE_BACKEND`` set to ``mlflow`` or ``phoenix``. Default ``gymtrace``. Argument:
``configure(experiment=...)``."""

GYMTRACE_NATIVE_READER: Final = "GYMTRACE_NATIVE_READER"
"""``off`` reads trace files with Python alone where the native reader (``gymtrace-native``, built
from ``native/`` in gymtrace's repository; docs/cli.md) is installed: the summary readers
(``rollouts``, ``stats``, ``compare``, ``timeline``, ``report``) then give the same answer, slower.
Default ``on``: the native reader is used when it can be imported."""

GYMTRACE_ENCODER_CONFIG: Final = "_GYMTRACE_ENCODER_CONFIG"
"""Not a setting: how gymtrace hands its encoder process the exporter to build (JSON, headers
included). An environment variable and not an argument: a process's arguments are readable by
every user of the machine (``ps``), its environment only by its owner."""

GYMTRACE_PARENT: Final = "GYMTRACE_PARENT"
"""Written by ``configure()`` into its own process's environment, so that every process it starts
inherits it (``multiprocessing`` under any start method, ``subprocess``, a pool worker): the
settings it resolved, as JSON (``pid``, ``service_name``, ``endpoint``, ``protocol``, ``file``,
``console``, ``strict``, ``trace_per``; never headers or secrets). A process that inherited it and
was never configured configures itself from it the first time it continues a gym context
(``gymtrace.propagation.attach``/``extract``), so what a worker records under the parent's carrier
is exported without any code in the worker; a file becomes one file per process beside the
parent's (``{stem}.pid-{pid}{suffix}``; a directory stays the directory). Set it to an empty string
to turn this off in a child."""

OTEL_BSP_MAX_QUEUE_SIZE: Final = "OTEL_BSP_MAX_QUEUE_SIZE"
"""Bound of gymtrace's export queue (default 8192 spans): when full, the oldest span is dropped
and counted."""
OTEL_BSP_MAX_EXPORT_BATCH_SIZE: Final = "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"
OTEL_BSP_SCHEDULE_DELAY: Final = "OTEL_BSP_SCHEDULE_DELAY"

OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT: Final = (
    "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
)
"""Whether :func:`gymtrace.record_content` records anything (the GenAI conventions' variable):
``NO_CONTENT`` (default), ``SPAN_ONLY`` (span attributes), ``EVENT_ONLY`` (a span event),
``SPAN_AND_EVENT``. Case-insensitive. The older boolean form is accepted: ``true``/``1``/``yes``/``on``
mean ``SPAN_ONLY``, ``false``/``0``/``no``/``off`` mean ``NO_CONTENT``; anything else is logged once
and means ``NO_CONTENT``. ``configure(capture_content=...)`` overrides it."""

GYMTRACE_CONTENT_MAX_VALUE_BYTES: Final = "GYMTRACE_CONTENT_MAX_VALUE_BYTES"
"""Largest captured value, in UTF-8 bytes of its JSON text (default 16384, at least 256). Longer
values are cut and end with ``…[truncated N bytes]``."""

GYMTRACE_CONTENT_MAX_SPAN_BYTES: Final = "GYMTRACE_CONTENT_MAX_SPAN_BYTES"
"""Content budget of one span, in bytes, span attributes and events together (default 32768). With
capture on, ``configure()`` sizes OTLP export batches from it so every request stays under gRPC's
4 MiB message limit (see ``docs/content-capture.md``)."""

OTEL_SDK_DISABLED: Final = "OTEL_SDK_DISABLED"
OTEL_SERVICE_NAME: Final = "OTEL_SERVICE_NAME"
OTEL_TRACES_EXPORTER: Final = "OTEL_TRACES_EXPORTER"
OTEL_EXPORTER_OTLP_ENDPOINT: Final = "OTEL_EXPORTER_OTLP_ENDPOINT"
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: Final = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
OTEL_EXPORTER_OTLP_PROTOCOL: Final = "OTEL_EXPORTER_OTLP_PROTOCOL"
OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: Final = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"

DEFAULT_FILE: Final = "gymtrace-traces.jsonl"
# A trace file's name: {stem}[.pid-{pid}...][.{segment, six digits}]{suffix}[.gz|.zst]; one rule for
# the writer and every reader (_model/tracefiles.py).
TRACE_SUFFIX: Final = ".jsonl"
CHILD_TAG: Final = ".pid-"
COMPRESS_GZIP: Final = "gzip"
COMPRESS_ZSTD: Final = "zstd"
COMPRESS_NONE: Final = "none"
FILE_COMPRESSIONS: Final = (COMPRESS_GZIP, COMPRESS_ZSTD, COMPRESS_NONE)
COMPRESSED_SUFFIXES: Final = {COMPRESS_GZIP: ".gz", COMPRESS_ZSTD: ".zst"}
DEFAULT_FILE_COMPRESS: Final = COMPRESS_NONE
DEFAULT_FILE_ROTATE_MB: Final = 256.0
DEFAULT_SERVICE_NAME: Final = "gymtrace"


def env_flag(value: str | None) -> bool:
    """Read a boolean environment variable the way the OpenTelemetry SDK does (``true``, any case)."""
    return value is not None and value.strip().lower() in {"true", "1", "yes", "on"}
