"""Every span name, attribute name and value gymtrace emits, in one place.

The ``gym.*`` names are gymtrace's public contract (the README's vocabulary section): users search Jaeger by
them and checks depend on them, so they change only with a major version. The ``gen_ai.*`` names
follow the OpenTelemetry GenAI semantic conventions, which are still experimental; when they move,
this module is the only place to edit.
"""

from __future__ import annotations

from typing import Final

# -- span kinds (the value of ``gym.kind``) and the span names that go with them --------------------

KIND_RUN: Final = "run"
KIND_ROLLOUT: Final = "rollout"
KIND_EPISODE: Final = "episode"
KIND_SEED_SESSION: Final = "seed_session"
KIND_AGENT_INVOCATION: Final = "agent_invocation"
KIND_TURN: Final = "turn"
KIND_STEP: Final = "step"
KIND_MODEL_CALL: Final = "model_call"
KIND_TOOL_CALL: Final = "tool_call"
KIND_VERIFY: Final = "verify"
# A rollout's outcome decided outside its span (another process, a later phase, an attempt continued
# elsewhere): spans are immutable once ended, so the outcome travels in a record of its own.
KIND_OUTCOME: Final = "outcome"
SPAN_OUTCOME: Final = "gym.outcome"
# A live marker (_scopes/live.py): a zero-length span a rollout's process writes while the rollout is open,
# when it and each episode start and as a heartbeat, so a rollout that never ends is visible.
# Readers of finished traces fold markers away; `gymtrace live` reads nothing else.
KIND_LIVE: Final = "live"
SPAN_LIVE: Final = "gym.live"
# A trainer step (gymtrace.train_step): the root of its own trace, linked to its run, like a rollout.
KIND_TRAIN_STEP: Final = "train_step"
SPAN_TRAIN_STEP: Final = "gym.train_step"
# A batch of the rollouts a train step consumed (gymtrace.consume): a child of the step, one per up to
# CONSUMED_BATCH rollouts, with a link to each rollout and the per-rollout facts in parallel arrays,
# so 8,192 consumed rollouts are all recorded under the SDK's default 128 links per span.
KIND_CONSUMED: Final = "consumed"
SPAN_CONSUMED: Final = "gym.consumed"

ALL_KINDS: Final = (
    KIND_RUN,
    KIND_ROLLOUT,
    KIND_EPISODE,
    KIND_SEED_SESSION,
    KIND_AGENT_INVOCATION,
    KIND_TURN,
    KIND_STEP,
    KIND_MODEL_CALL,
    KIND_TOOL_CALL,
    KIND_VERIFY,
    KIND_OUTCOME,
    KIND_LIVE,
    KIND_TRAIN_STEP,
    KIND_CONSUMED,
)

SPAN_RUN: Final = "gym.run"
SPAN_ROLLOUT: Final = "gym.rollout"
SPAN_EPISODE: Final = "gym.episode"
SPAN_SEED_SESSION: Final = "gym.seed_session"
SPAN_TURN: Final = "gym.turn"
SPAN_STEP: Final = "gym.step"
SPAN_VERIFY: Final = "gym.verify"
# GenAI spans are named "{gen_ai.operation.name} {subject}" (OPERATION_* below); the subject is
# low-cardinality (an agent, model or tool name, never an ID). Without a subject the name is the
# bare operation.

# -- gym identity: on the span of its own level and on every span below it -------------------------

RUN_ID: Final = "gym.run.id"
TASK_ID: Final = "gym.task.id"
ROLLOUT_ID: Final = "gym.rollout.id"
ROLLOUT_REPEAT: Final = "gym.rollout.repeat"
EPISODE_ATTEMPT: Final = "gym.episode.attempt"
EPISODE_ID: Final = "gym.episode.id"

IDENTITY_KEYS: Final = (RUN_ID, TASK_ID, ROLLOUT_ID, ROLLOUT_REPEAT, EPISODE_ATTEMPT, EPISODE_ID)
INT_IDENTITY_KEYS: Final = frozenset({ROLLOUT_REPEAT, EPISODE_ATTEMPT})
# Baggage entry beside the identity entries: their HMAC, when GYMTRACE_IDENTITY_SECRET is set
# (gymtrace/_identity/trust.py). Never stamped on spans.
IDENTITY_SIGNATURE: Final = "gym.sig"

# -- training runs (docs/training.md) ---------------------------------------------------------------

# The weights a span was generated under: on a rollout its start version (or its own
# policy_version=), on every span below it the process's version when that span started
# (gymtrace.set_policy_version), else the rollout's; on a train step the weights it starts from.
# int or str.
POLICY_VERSION: Final = "gym.policy.version"
# On a rollout that ended under another version than it started with.
POLICY_VERSION_END: Final = "gym.policy.version.end"
GROUP_ID: Final = "gym.group.id"
GROUP_SIZE: Final = "gym.group.size"
# On a rollout: the train step it was generated for; on a train step (and its records): its number.
TRAIN_STEP: Final = "gym.train.step"
TRAINING_OUTCOME: Final = "gym.rollout.training_outcome"
TRAINED: Final = "trained"
FILTERED: Final = "filtered"
STALE: Final = "stale"
ABORTED: Final = "aborted"
# (The fifth, "failed", is OUTCOME_FAILED below.)
TRAINING_OUTCOMES: Final = (TRAINED, FILTERED, STALE, ABORTED, "failed")
# A rollout no train step consumed, in a run that has train steps (readers only; never written).
UNCONSUMED: Final = "unconsumed"
STALENESS: Final = "gym.rollout.staleness"
TRAIN_REASON: Final = "gym.train.reason"
# What travels with the identity to the gym's other processes (and is stamped on every span below
# a rollout) beside IDENTITY_KEYS: signed with them under gym.sig v2 (_identity/trust.py).
TRAINING_KEYS: Final = (GROUP_ID, POLICY_VERSION)
CARRIED_KEYS: Final = (*IDENTITY_KEYS, *TRAINING_KEYS)
# On a consumed record (SPAN_CONSUMED): how many rollouts it holds, and per rollout, in one order,
# its ID, its rollout span as "{trace_id}-{span_id}" ("" when the trainer did not know it), its
# training outcome, its start policy version as text ("" unknown) and, when any entry has one, the
# reason given ("" for none). Few arrays on purpose: the SDK checks every element of every array
# attribute, a cost per consumed rollout.
CONSUMED_COUNT: Final = "gym.consumed.count"
CONSUMED_ROLLOUT_IDS: Final = "gym.consumed.rollout_ids"
CONSUMED_SPANS: Final = "gym.consumed.rollout_spans"
CONSUMED_OUTCOMES: Final = "gym.consumed.outcomes"
CONSUMED_REASONS: Final = "gym.consumed.reasons"
CONSUMED_VERSIONS: Final = "gym.consumed.policy_versions"
# A bare rollout ID consume() could not resolve in this process (the reader resolves it: the most
# recent rollout of that ID in the run not yet consumed): "1" per such entry, else "".
CONSUMED_BY_ID: Final = "gym.consumed.by_id"
# Rollouts per consumed record: the SDK's default link limit per span.
CONSUMED_BATCH: Final = 128

# -- outcome and structure ---------------------------------------------------------------------------

KIND: Final = "gym.kind"
REWARD: Final = "gym.reward"
ROLLOUT_OUTCOME: Final = "gym.rollout.outcome"
ROLLOUT_ATTEMPTS: Final = "gym.rollout.attempts"
# False on the one span a rollout that head sampling dropped still leaves (its summary: outcome,
# reward, attempts, duration, token totals, the training keys), whose episodes and steps are not
# recorded; absent on a rollout recorded whole. The readers count it as the rollout it stands for,
# and draw it as a plain bar, without a time split (no episode below it was kept).
ROLLOUT_DETAIL: Final = "gym.rollout.detail"
EPISODE_OUTCOME: Final = "gym.episode.outcome"
EPISODE_RESTORED: Final = "gym.episode.restored"
FAILURE_KIND: Final = "gym.failure.kind"
FAILURE_RETRYABLE: Final = "gym.failure.retryable"
TURN_NUMBER: Final = "gym.turn.number"
STEP_NUMBER: Final = "gym.step.number"
HIERARCHY_VIOLATION: Final = "gym.hierarchy.violation"
# Not in the fixed table: set on spans that were still open when the process was stopped.
INTERRUPTED: Final = "gym.interrupted"
# On a span link: why two episodes are linked (``retry`` or ``restore``), ``run`` on the link
# from a rollout root to its run, ``caller`` on the link from a rollout root to the span of a
# caller outside the gym (a trainer) whose context reached it.
LINK_RELATION: Final = "gym.link.relation"

OUTCOME_SCORED: Final = "scored"
OUTCOME_UNSCORED: Final = "unscored"
# The rollout's episode was handed to another process (a carrier or headers taken) and it ended with
# no outcome of its own: the outcome is expected from there, in an outcome record
# (docs/contract/outcome-rule.md).
OUTCOME_PENDING: Final = "pending"
ROLLOUT_OUTCOMES: Final = (OUTCOME_SCORED, OUTCOME_UNSCORED, OUTCOME_PENDING)
# A rollout the readers know only from its live markers, whose process stopped beating (killed): it
# never ended, so no outcome was recorded; shown by rollouts, stats and check, never in a mean.
OUTCOME_LOST: Final = "lost"
OUTCOME_COMPLETED: Final = "completed"
OUTCOME_FAILED: Final = "failed"
OUTCOME_CANCELLED: Final = "cancelled"

FAILURE_INFRASTRUCTURE: Final = "infrastructure"
FAILURE_TIMEOUT: Final = "timeout"
FAILURE_TERMINAL: Final = "terminal"
# An exception escaped the episode and nobody called record_failure() to classify it.
FAILURE_ERROR: Final = "error"

RELATION_RETRY: Final = "retry"
RELATION_RESTORE: Final = "restore"
RELATION_RUN: Final = "run"
# On a rollout's (or train step's) link to a span of another telemetry (a trainer's rollout-batch
# span) that was current when it opened: it stays the root of its own trace (issue 44).
RELATION_CALLER: Final = "caller"
# On an outcome record's link to the episode it concludes.
RELATION_OUTCOME: Final = "outcome"

# On an outcome record: where the outcome was decided. ``remote``: in another process that continued
# the rollout's context; ``late``: after the rollout span ended; ``continued``: in an attempt opened
# elsewhere from a carrier.
OUTCOME_SOURCE: Final = "gym.outcome.source"
SOURCE_REMOTE: Final = "remote"
SOURCE_LATE: Final = "late"
SOURCE_CONTINUED: Final = "continued"
OUTCOME_SOURCES: Final = (SOURCE_REMOTE, SOURCE_LATE, SOURCE_CONTINUED)

# -- live markers and the watchdog (_scopes/live.py, `gymtrace live`) --------------------------------

# On a marker: what it marks (``rollout`` or ``episode`` start, ``heartbeat``, or ``end``).
LIVE_EVENT: Final = "gym.live.event"
LIVE_EVENT_ROLLOUT: Final = "rollout"
LIVE_EVENT_EPISODE: Final = "episode"
LIVE_EVENT_HEARTBEAT: Final = "heartbeat"
# Written when a rollout that has markers ends: behind a tail sampler that drops the rollout's own
# spans, it is what tells `gymtrace live --jaeger` the rollout ended rather than was lost.
LIVE_EVENT_END: Final = "end"
# Written by a NeMo Gym agent server for a request of a step (a model call, a tool call) still
# unanswered a second after it went out: the step a rollout is in, and the server it waits on
# (``gym.live.server``), for `gymtrace live`.
LIVE_EVENT_STEP: Final = "step"
LIVE_SERVER: Final = "gym.live.server"
# On a step: the servers (their service names) its requests went to, in the order first sent, where
# an integration knows them (NeMo Gym's agent). `gymtrace check` notes a server named here that has
# no span in the trace (a process that wrote its trace elsewhere).
STEP_SERVERS: Final = "gym.step.servers"
# When the rollout started (Unix ns), the heartbeat interval its process uses (s), the number of the
# last step started in it (0: none yet), and whether its episode ran past its timeout.
LIVE_STARTED: Final = "gym.live.started_ns"
LIVE_INTERVAL: Final = "gym.live.interval_s"
LIVE_STEP: Final = "gym.live.step"
LIVE_OVERDUE: Final = "gym.live.overdue"
# States `gymtrace live` reads (fixed: docs/contract/fixed-names.md).
LIVE_RUNNING: Final = "running"
LIVE_STALLED: Final = "stalled"
LIVE_LOST: Final = "lost"
# Event on a sync episode still running past its timeout (it cannot be interrupted safely).
EVENT_EPISODE_OVERDUE: Final = "gym.episode.overdue"
EPISODE_TIMEOUT: Final = "gym.episode.timeout_s"

# -- metrics (_scopes/metrics.py; fixed: docs/contract/fixed-names.md) ------------------------------------

METER_NAME: Final = "gymtrace"
METRIC_ROLLOUT_ACTIVE: Final = "gym.rollout.active"
METRIC_ROLLOUT_COMPLETED: Final = "gym.rollout.completed"
METRIC_ROLLOUT_REWARD: Final = "gym.rollout.reward"
METRIC_EPISODE_COMPLETED: Final = "gym.episode.completed"
METRIC_EPISODE_DURATION: Final = "gym.episode.duration"
METRIC_STEP_DURATION: Final = "gym.step.duration"
METRIC_ROLLOUT_STALENESS: Final = "gym.rollout.staleness"
METRIC_ROLLOUT_CONSUMED: Final = "gym.rollout.consumed"
UNIT_VERSION: Final = "{version}"
UNIT_ROLLOUT: Final = "{rollout}"
UNIT_EPISODE: Final = "{episode}"
UNIT_SECONDS: Final = "s"
UNIT_REWARD: Final = "1"

# Baggage entry (not identity): the step number a continuation in another process starts at, reserved
# from the caller's numbering when it injected its context outside any step.
STEP_BASE: Final = "gym.step.base"

# -- OpenTelemetry GenAI semantic conventions (experimental) ------------------------------------------

GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
GEN_AI_AGENT_NAME: Final = "gen_ai.agent.name"
GEN_AI_AGENT_ID: Final = "gen_ai.agent.id"
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL: Final = "gen_ai.response.model"
GEN_AI_PROVIDER_NAME: Final = "gen_ai.provider.name"
GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
GEN_AI_TOOL_NAME: Final = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
GEN_AI_EVALUATION_RESULT: Final = "gen_ai.evaluation.result"
GEN_AI_EVALUATION_NAME: Final = "gen_ai.evaluation.name"
GEN_AI_EVALUATION_SCORE_VALUE: Final = "gen_ai.evaluation.score.value"
GEN_AI_EVALUATION_SCORE_LABEL: Final = "gen_ai.evaluation.score.label"

# Content, opt-in (see _content/). Checked against open-telemetry/semantic-conventions-genai
# model/gen-ai/registry.yaml: gen_ai.input.messages, gen_ai.output.messages (opt_in on inference and
# invoke_agent spans, spans.yaml "attributes.gen_ai.content"), gen_ai.tool.call.arguments and
# gen_ai.tool.call.result (type any; "MAY be recorded as a JSON string" on spans); and
# model/gen-ai/events.yaml: event gen_ai.client.inference.operation.details (opt-in, the inference
# span's attributes).
GEN_AI_INPUT_MESSAGES: Final = "gen_ai.input.messages"
GEN_AI_OUTPUT_MESSAGES: Final = "gen_ai.output.messages"
GEN_AI_TOOL_CALL_ARGUMENTS: Final = "gen_ai.tool.call.arguments"
GEN_AI_TOOL_CALL_RESULT: Final = "gen_ai.tool.call.result"
GEN_AI_CLIENT_INFERENCE_OPERATION_DETAILS: Final = "gen_ai.client.inference.operation.details"
# The conventions define no content event for agent invocations or tool calls; gymtrace's own name.
CONTENT_EVENT: Final = "gym.content"
# Number of captured values left out because the span's content budget was spent.
CONTENT_OMITTED: Final = "gym.content.omitted"

OPERATION_INVOKE_AGENT: Final = "invoke_agent"
OPERATION_CHAT: Final = "chat"
OPERATION_EXECUTE_TOOL: Final = "execute_tool"
# The conventions' other inference operations: like chat, a model call (the time split's model part).
OPERATION_TEXT_COMPLETION: Final = "text_completion"
OPERATION_GENERATE_CONTENT: Final = "generate_content"
EVALUATION_NAME_REWARD: Final = "reward"

# Response details (GenAI conventions): what tells server queueing from prefix-cache misses from the
# agent itself. gen_ai.usage.cache_read.input_tokens is the conventions' name for input tokens served
# from the provider's prompt/prefix cache. The conventions measure time to first token only as a
# metric (gen_ai.server.time_to_first_token); gymtrace records the client-side time from request to
# first streamed chunk on the span, in seconds, as gen_ai.response.time_to_first_chunk.
GEN_AI_RESPONSE_ID: Final = "gen_ai.response.id"
GEN_AI_RESPONSE_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: Final = "gen_ai.usage.cache_read.input_tokens"
GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK: Final = "gen_ai.response.time_to_first_chunk"
GEN_AI_REQUEST_STREAM: Final = "gen_ai.request.stream"
# Output tokens the model spent reasoning (part of output_tokens), where the response says
# (Responses API output_tokens_details.reasoning_tokens, chat completions'
# completion_tokens_details.reasoning_tokens); named like cache_read.input_tokens.
GEN_AI_USAGE_REASONING_OUTPUT_TOKENS: Final = "gen_ai.usage.reasoning.output_tokens"
# The tool call IDs a model response asked for, in its order (on the chat span): what joins a step's
# model call to its execute_tool spans (each carries its gen_ai.tool.call.id).
GEN_AI_RESPONSE_TOOL_CALL_IDS: Final = "gen_ai.response.tool_call_ids"

# -- NeMo Gym's wire identity (gymtrace.integrations.nemo_gym) -----------------------------------------

NEMO_GYM_ROLLOUT_HEADER: Final = "x-nemo-gym-rollout-id"
NEMO_GYM_ATTEMPT_HEADER: Final = "x-nemo-gym-attempt-index"
NEMO_GYM_BODY_ROLLOUT_ID: Final = "_ng_rollout_id"
NEMO_GYM_BODY_TASK_INDEX: Final = "_ng_task_index"
NEMO_GYM_BODY_ROLLOUT_INDEX: Final = "_ng_rollout_index"
NEMO_GYM_BODY_ATTEMPT_INDEX: Final = "_ng_attempt_index"
NEMO_GYM_PATH_PREFIX: Final = "/ng-rollout/"
# NeMo Gym's own span attributes, recorded as aliases on request so one Jaeger search finds both.
NEMO_GYM_ROLLOUT_ID: Final = "nemo.gym.rollout.id"  # the attempt-qualified key ({id}-a{n} after 0)
NEMO_GYM_RUN_ID: Final = "nemo.gym.run.id"
NEMO_GYM_TASK_ID: Final = "nemo.gym.task.id"
# The tool call ID a traced NeMo Gym agent sends with a tool request to a gym server (only inside
# the gym, like the identity): the resources server's execute_tool span carries it.
NEMO_GYM_TOOL_CALL_HEADER: Final = "x-gymtrace-tool-call-id"
# On an episode imported from a NeMo Gym failures sidecar row: its ``_ng_failure_class``.
NEMO_GYM_FAILURE_CLASS: Final = "nemo.gym.failure.class"

# -- records imported as traces (gymtrace import) -------------------------------------------------

# On every imported span whose start or end the record did not hold: the time is synthesised (laid
# out in record order, or spanning the recorded times of the spans below it), never measured.
TIMING: Final = "gym.timing"
TIMING_SYNTHETIC: Final = "synthetic"
# A message of the record that is no step of the glossary (an ATIF user or system step): an event
# on the agent invocation, with the record's role and its step number there.
EVENT_RECORD_MESSAGE: Final = "gym.record.message"
RECORD_SOURCE: Final = "gym.record.source"
RECORD_STEP_ID: Final = "gym.record.step_id"
# Which importer wrote a span (``nemo-gym``, ``atif``, ``inspect``): a resource attribute.
RECORD_FORMAT: Final = "gym.record.format"

# Stable OpenTelemetry conventions.
ERROR_TYPE: Final = "error.type"
# The exception event (OpenTelemetry's exception conventions), for an exception known only from what
# a server answered (NeMo Gym returns repr(exception) with its HTTP 500).
EXCEPTION_EVENT: Final = "exception"
EXCEPTION_TYPE: Final = "exception.type"
EXCEPTION_MESSAGE: Final = "exception.message"
EXCEPTION_STACKTRACE: Final = "exception.stacktrace"
SERVICE_NAME: Final = "service.name"
SERVICE_INSTANCE_ID: Final = "service.instance.id"

# -- instrumentation scope ----------------------------------------------------------------------------

INSTRUMENTATION_NAME: Final = "gymtrace"

# -- what the readers make of a run (gymtrace rollouts --json, stats, timeline, report) ---------------

# The time split's parts (fixed: the keys of ``time_split``), in precedence order: where two overlap,
# the first takes the time; ``other`` is what none covers (the harness, queueing).
SPLIT_MODEL: Final = "model"
SPLIT_TOOL: Final = "tool"
SPLIT_ENV: Final = "env"
SPLIT_VERIFY: Final = "verify"
SPLIT_OTHER: Final = "other"
SPLIT_PARTS: Final = (SPLIT_MODEL, SPLIT_TOOL, SPLIT_ENV, SPLIT_VERIFY, SPLIT_OTHER)

# -- integrations ---------------------------------------------------------------------------

# Gymnasium (gymtrace.integrations.gymnasium): which environment an episode ran in, and, for a vector
# environment, which sub-environment. ``gym.env.seed`` is on the seed_session span when a seed was given.
ENV_ID: Final = "gym.env.id"
ENV_INDEX: Final = "gym.env.index"
ENV_SEED: Final = "gym.env.seed"
# The step policy on the episode span, so a reader knows whether every step is a span:
# ``all`` (every step a span) or ``aggregate`` (the first N steps and every step that raised are
# spans; the others are only counted in the statistics below).
STEPS_POLICY: Final = "gym.steps.policy"
STEPS_POLICY_ALL: Final = "all"
STEPS_POLICY_AGGREGATE: Final = "aggregate"
STEPS_COUNT: Final = "gym.steps.count"
STEPS_SAMPLED: Final = "gym.steps.sampled"
STEPS_DURATION_TOTAL_MS: Final = "gym.steps.duration.total_ms"
STEPS_DURATION_MEAN_MS: Final = "gym.steps.duration.mean_ms"
STEPS_DURATION_MIN_MS: Final = "gym.steps.duration.min_ms"
STEPS_DURATION_MAX_MS: Final = "gym.steps.duration.max_ms"
STEPS_SLOWEST_NUMBER: Final = "gym.steps.slowest.number"

# Ray (gymtrace.integrations.ray): one span per task or actor-method execution in a worker, in the
# caller's trace. ``ray.task.attempt`` is Ray's attempt number (0 first; >0 when Ray re-ran the task
# after a worker died or, with retry_exceptions, after it raised); a re-run carries a
# ``ray.task.retry`` event, so an attempt whose worker died without a trace is never hidden.
SPAN_RAY_TASK: Final = "ray.task"
RAY_TASK_NAME: Final = "ray.task.name"
RAY_TASK_ID: Final = "ray.task.id"
RAY_TASK_ATTEMPT: Final = "ray.task.attempt"
RAY_WORKER_PID: Final = "ray.worker.pid"
EVENT_RAY_TASK_RETRY: Final = "ray.task.retry"
# -- the engine's step policy (_scopes/steps.py) ----------------------------------------------------

# Beside the gym.steps.* statistics above, on the span that owns the steps (agent invocation, else
# episode) under the aggregate policy: its sampling parameters, and how many steps raised.
STEPS_FIRST: Final = "gym.steps.policy.first"
STEPS_SLOWEST: Final = "gym.steps.policy.slowest"
STEPS_EPISODE_SHARE: Final = "gym.steps.policy.episode_share"
STEPS_ERRORS: Final = "gym.steps.errors"
# On a step span kept under the aggregate policy: why (first, slowest, raised).
STEP_KEPT: Final = "gym.step.kept"
STEP_KEPT_FIRST: Final = "first"
STEP_KEPT_SLOWEST: Final = "slowest"
STEP_KEPT_RAISED: Final = "raised"

# -- backends (GYMTRACE_BACKEND=mlflow|phoenix, gymtrace push; _sdk/backends.py) --------------------
# The names MLflow 3 and Arize Phoenix read from OTLP spans, and the score gymtrace gives them.
SCORE_REWARD: Final = "reward"  # the MLflow assessment / Phoenix span annotation of a rollout's reward
SCORE_SOURCE: Final = "gymtrace"  # its MLflow source_id and Phoenix identifier: one score per rollout
SCORE_ATTEMPT: Final = "gym.rollout.attempt"  # score metadata: the attempt the reward is from
# `gymtrace push` into an experiment/project other than the one already holding a trace: the trace
# goes under an ID derived from (original ID, experiment), and each of its spans carries the original
# (the ID the files and `join_keys()` hold); MLflow shows it as a trace tag, Phoenix in the metadata.
PUSH_ORIGINAL_TRACE_ID: Final = "gym.push.original_trace_id"
# MLflow: span type, trace tags (a root span's "mlflow.traceTag.<key>" attributes), trace name,
# session (any span's session.id becomes the trace's mlflow.trace.session metadata).
MLFLOW_SPAN_TYPE: Final = "mlflow.spanType"
MLFLOW_TRACE_TAG_PREFIX: Final = "mlflow.traceTag."
MLFLOW_TRACE_NAME: Final = "mlflow.traceName"
MLFLOW_EXPERIMENT_HEADER: Final = "x-mlflow-experiment-id"
MLFLOW_RUN_HEADER: Final = "x-mlflow-run-id"
# The MLflow run of a gym run: its tag, and the metrics logged when the gym run ends.
MLFLOW_RUN_METRIC_SCORED: Final = "gym.rollouts.scored"
MLFLOW_RUN_METRIC_UNSCORED: Final = "gym.rollouts.unscored"
MLFLOW_RUN_METRIC_PENDING: Final = "gym.rollouts.pending"
MLFLOW_RUN_METRIC_MEAN_REWARD: Final = "gym.reward.mean"
# OpenInference (Phoenix): span kind, session, metadata (a JSON object), project (a resource attribute).
OPENINFERENCE_SPAN_KIND: Final = "openinference.span.kind"
OPENINFERENCE_PROJECT: Final = "openinference.project.name"
SESSION_ID: Final = "session.id"
OPENINFERENCE_METADATA: Final = "metadata"
