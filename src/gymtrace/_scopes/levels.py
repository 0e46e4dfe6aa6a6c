"""The gym levels, each described once: the table the engine, the checker and the renderer read.

A :class:`Level` says everything that differs between ``run``, ``rollout``, ..., ``tool_call``: its
rank in the nesting order, its default span kind, which arguments it takes and how each is
validated, how its span is prepared at start (name, attributes, links, parent context) and what
happens when it finishes, where content goes on it, and which of its attributes ``gymtrace tree``
shows. The rules of rollouts and episodes (0-based attempts, retry and restore links, carriers,
the final episode's reward) live here with their levels.

Adding a level: a constant for its kind and span name in ``_constants.py``, one :class:`Level` entry in
:data:`LEVELS`, and one public function in ``_api.py`` (see CONTRIBUTING.md).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from time import time_ns
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode

from gymtrace import _constants as c
from gymtrace._live import markers as _live
from gymtrace._live import metrics as _metrics
from gymtrace._model import settings as _settings
from gymtrace._model.errors import GymTraceError, InvalidArgumentError, contract_problem, data_lost
from gymtrace._model.failures import classify
from gymtrace._model.ids import check_id, check_index, episode_id, report
from gymtrace._model.outcome_rule import warning_text
from gymtrace._scopes import steps as _steps
from gymtrace._scopes.frame import ActiveScope, emit_lost_attempt, emit_outcome, read_carrier

# What a level's prepare() returns: span name, start attributes, links, the context to start it in.
Prepared = tuple[str, dict[str, Any], "list[Link] | None", otel_context.Context]
# prepare(frame, validated argument values, parent context, the scope's source) -> Prepared
Prepare = Callable[[ActiveScope, dict[str, Any], otel_context.Context, Any], Prepared]
# A validator takes (level kind, argument name, value) and returns the value or None (reported).
Validator = Callable[[str, str, Any], Any]


def _an_id(kind: str, name: str, value: Any) -> str | None:
    return check_id(kind, name, value)


def _an_index(kind: str, name: str, value: Any) -> int | None:
    return check_index(kind, name, value, 0)


def _a_number(kind: str, name: str, value: Any) -> int | None:
    return check_index(kind, name, value, 1)


def _a_duration(kind: str, name: str, value: Any) -> float | None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        report(kind, name, f"must be a number of seconds > 0, got {value!r:.40}")
        return None
    return float(value)


def _a_mapping(kind: str, name: str, value: Any) -> dict[str, Any] | None:
    if not isinstance(value, Mapping):
        report(kind, name, f"must be a mapping, got {type(value).__name__}")
        return None
    return dict(value)


@dataclass(frozen=True, slots=True)
class Level:
    """One gym level. See the module docstring."""

    kind: str
    # Outermost first: a level may open only below a level of lower rank (levels may be skipped).
    rank: int
    prepare: Prepare
    # Its arguments and their validators; each may also be given as a callable applied to the
    # decorated function's arguments.
    arguments: Mapping[str, Validator]
    finish: Callable[[ActiveScope], None] | None = None
    # An Exception escaped the level's body: what that means for its outcome.
    failed: Callable[[ActiveScope, Exception], None] | None = None
    span_kind: SpanKind = SpanKind.INTERNAL
    # Levels that may open inside this one despite their rank.
    may_contain: frozenset[str] = frozenset()
    # (input attribute, output attribute, event name) where record_content() puts content.
    content: tuple[str, str, str] | None = None
    # Attributes ``gymtrace tree`` shows on its line, with their short labels.
    shown: tuple[tuple[str, str], ...] = field(default=())

    def validate(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The valid ones of ``values`` (invalid ones are reported and left out)."""
        out: dict[str, Any] = {}
        for name, value in values.items():
            validator = self.arguments.get(name)
            checked = validator(self.kind, name, value) if validator is not None else value
            if checked is not None:
                out[name] = checked
        return out


# -- trace topology -----------------------------------------------------------------------------------


def set_trace_per(value: str) -> None:
    """``"rollout"`` (default): each rollout is its own trace. ``"run"``: one trace per run."""
    if value not in ("rollout", "run"):
        raise InvalidArgumentError(f"trace_per must be 'rollout' or 'run', got {value!r}")
    _settings.override(trace_per_run=value == "run")


# -- preparing spans ------------------------------------------------------------------------------------


def _base(frame: ActiveScope, values: dict[str, Any]) -> dict[str, Any]:
    attributes = {**frame.identity, c.KIND: frame.kind}
    extra = values.get("attributes")
    if extra:
        for key, value in extra.items():
            attributes.setdefault(key, value)
    return attributes


def _prepare_run(
    frame: ActiveScope, values: dict[str, Any], ctx: otel_context.Context, source: Any
) -> Prepared:
    run_id = values.get("run_id") or f"run-{uuid.uuid4().hex[:12]}"
    frame.identity = {c.RUN_ID: run_id}
    return c.SPAN_RUN, _base(frame, values), None, ctx


def _prepare_rollout(
    frame: ActiveScope, values: dict[str, Any], ctx: otel_context.Context, source: Any
) -> Prepared:
    identity = {k: v for k, v in frame.identity.items() if k == c.RUN_ID}
    identity[c.ROLLOUT_ID] = values.get("rollout_id") or uuid.uuid4().hex
    if "task_id" in values:
        identity[c.TASK_ID] = values["task_id"]
    if "repeat" in values:
        identity[c.ROLLOUT_REPEAT] = values["repeat"]
    frame.identity = identity
    frame.started_ns = time_ns()
    _live.watch(frame)
    links = None
    start_context = ctx
    run = frame.parent.nearest(c.KIND_RUN) if frame.parent is not None else None
    if run is not None and not _settings.active.trace_per_run:
        # One trace per rollout: the rollout is a trace root that links to its run. A root span in
        # the run's trace would be invisible until the run ends (hours) and lost on a crash.
        links = [Link(run.span.get_span_context(), {c.LINK_RELATION: c.RELATION_RUN})]
        start_context = trace.set_span_in_context(trace.INVALID_SPAN, ctx)
    return c.SPAN_ROLLOUT, _base(frame, values), links, start_context


def _prepare_episode(
    frame: ActiveScope, values: dict[str, Any], ctx: otel_context.Context, source: Any
) -> Prepared:
    """``source``: (relation, previous episode or its carrier), relation ``retry`` or ``restore``."""
    parent = frame.parent
    rollout = parent.nearest(c.KIND_ROLLOUT) if parent is not None else None
    identity = {k: v for k, v in frame.identity.items() if k not in (c.EPISODE_ATTEMPT, c.EPISODE_ID)}
    attempt = values.get("attempt")
    start_context = ctx
    relation, previous = source if source is not None else (c.RELATION_RETRY, None)
    if previous is True or previous is None:
        previous = rollout.last_episode if rollout is not None else None
    previous_span: SpanContext | None = None
    if isinstance(previous, ActiveScope):
        if previous.span is not trace.INVALID_SPAN:
            previous_span = previous.span.get_span_context()
    elif previous is not None:
        try:
            carried, next_attempt, rollout_span, previous_span = read_carrier(previous)
        except GymTraceError as error:
            contract_problem(("carrier", relation), GymTraceError(f"gymtrace.episode(): {error}"))
        else:
            if attempt is None:
                attempt = next_attempt
            if rollout is None:
                # Another process: the episode joins the rollout's trace, under its rollout span.
                identity = {**identity, **carried}
                if rollout_span is not None:
                    start_context = trace.set_span_in_context(trace.NonRecordingSpan(rollout_span), ctx)
                frame.parent_span_context = rollout_span
    if attempt is None:
        attempt = rollout.next_attempt() if rollout is not None else 0
    if rollout is not None:
        lost = rollout.take_lost_attempt() if rollout.remote else None
        if lost is not None and lost[0] < attempt:
            # A re-run after a run that left nothing (Ray's max_retries after a worker died): that
            # attempt failed, and this one is its retry.
            lost_span = emit_lost_attempt(rollout, *lost)
            if previous_span is None and relation == c.RELATION_RETRY:
                previous_span = lost_span
        reused = rollout.attempt_recorded(attempt)
        if reused:
            # Said when it happens (strict mode: raised, and the episode is not opened); the rule
            # then takes the last recorded episode of the attempt, as every reader and check do.
            data_lost(
                GymTraceError(
                    f"rollout {rollout.identity.get(c.ROLLOUT_ID)!r}: episode attempt {attempt} was opened"
                    " again; attempt numbers are never reused, so this episode replaces the earlier one"
                    " (the last recorded counts). Fix: let gymtrace number the attempts (omit attempt=,"
                    " or use gymtrace.attempts()), or give each retry the next number"
                )
            )
        rollout.add_episode(frame, attempt, reused)
    restored = relation == c.RELATION_RESTORE
    if restored and previous_span is None:
        contract_problem(
            ("restored_from", type(previous)),
            GymTraceError(
                "gymtrace.episode(restored_from=...) needs the episode it continues (an ActiveScope,"
                f" its carrier, or True for the previous one in this rollout), got {previous!r:.80}"
            ),
        )
    links = [Link(previous_span, {c.LINK_RELATION: relation})] if previous_span is not None else None
    identity[c.EPISODE_ATTEMPT] = attempt
    rollout_id = identity.get(c.ROLLOUT_ID)
    if isinstance(rollout_id, str):
        identity[c.EPISODE_ID] = episode_id(rollout_id, attempt)
    frame.identity = identity
    frame.attempt = attempt
    frame.started_ns = time_ns()
    attributes = _base(frame, values)
    timeout = values.get("timeout")
    if timeout is not None:
        attributes[c.EPISODE_TIMEOUT] = timeout
        _live.watch_deadline(frame, timeout)
    if restored:
        frame.restored = True
        attributes[c.EPISODE_RESTORED] = True
    return c.SPAN_EPISODE, attributes, links, start_context


def _prepare_phase(name: str) -> Prepare:
    def prepare(
        frame: ActiveScope, values: dict[str, Any], ctx: otel_context.Context, source: Any
    ) -> Prepared:
        return name, _base(frame, values), None, ctx

    return prepare


def genai_span_name(operation: str, subject: object) -> str:
    """GenAI spans are named "{operation} {subject}" (the agent, model or tool name, low-cardinality);
    without a subject the name is the bare operation. The importers name theirs by it too."""
    return f"{operation} {subject}" if subject else operation


def _prepare_genai(operation: str, subject: tuple[str, str], detail: tuple[str, str]) -> Prepare:
    """A GenAI level's spans, named by :func:`genai_span_name`. ``subject`` and ``detail`` are
    (argument, attribute) pairs."""
    subject_argument, subject_attribute = subject
    detail_argument, detail_attribute = detail

    def prepare(
        frame: ActiveScope, values: dict[str, Any], ctx: otel_context.Context, source: Any
    ) -> Prepared:
        attributes = _base(frame, values)
        attributes[c.GEN_AI_OPERATION_NAME] = operation
        name = values.get(subject_argument)
        if name is not None:
            attributes[subject_attribute] = name
        if detail_argument in values:
            attributes[detail_attribute] = values[detail_argument]
        return genai_span_name(operation, name), attributes, None, ctx

    return prepare


# Who numbers turns and steps: the nearest of these (1, 2, 3... per agent invocation).
NUMBERING_OWNERS = (c.KIND_AGENT_INVOCATION, c.KIND_EPISODE, c.KIND_ROLLOUT, c.KIND_RUN)


def _prepare_numbered(kind: str, span_name: str, attribute: str) -> Prepare:
    def prepare(
        frame: ActiveScope, values: dict[str, Any], ctx: otel_context.Context, source: Any
    ) -> Prepared:
        attributes = _base(frame, values)
        owner = frame.parent.nearest(*NUMBERING_OWNERS) if frame.parent else None
        explicit = values.get("number")
        attributes[attribute] = owner.take_number(kind, explicit) if owner is not None else (explicit or 1)
        return span_name, attributes, None, ctx

    return prepare


# -- finishing ------------------------------------------------------------------------------------------


def _finish_episode(frame: ActiveScope) -> None:
    span = frame.span
    if frame.cancelled:
        outcome = c.OUTCOME_CANCELLED
    elif frame.failure is not None:
        outcome = c.OUTCOME_FAILED
    else:
        outcome = c.OUTCOME_COMPLETED
    span.set_attribute(c.EPISODE_OUTCOME, outcome)
    _live.unwatch_deadline(frame)
    seconds = (time_ns() - getattr(frame, "started_ns", time_ns())) / 1e9
    failure = frame.failure[0] if outcome == c.OUTCOME_FAILED and frame.failure is not None else None
    _metrics.episode_ended(outcome, failure, seconds, span)
    if outcome == c.OUTCOME_FAILED and frame.failure is not None:
        kind, retryable, message = frame.failure
        span.set_attribute(c.FAILURE_KIND, kind)
        span.set_attribute(c.FAILURE_RETRYABLE, retryable)
        span.set_status(Status(StatusCode.ERROR, message or f"episode failed: {kind}"))
    elif outcome == c.OUTCOME_COMPLETED and frame.reward is not None:
        span.set_attribute(c.REWARD, frame.reward)
        span.add_event(
            c.GEN_AI_EVALUATION_RESULT,
            {
                c.GEN_AI_EVALUATION_NAME: c.EVALUATION_NAME_REWARD,
                c.GEN_AI_EVALUATION_SCORE_VALUE: frame.reward,
            },
        )

    rollout = frame.parent.nearest(c.KIND_ROLLOUT) if frame.parent is not None else None
    if rollout is None and frame.parent_span_context is not None:
        # Continued from a carrier in another process: the rollout span ended elsewhere and cannot
        # learn this attempt's outcome; a record in the rollout's trace carries it.
        emit_outcome(frame, c.SOURCE_CONTINUED)
    elif rollout is not None and rollout.remote:
        emit_outcome(frame, c.SOURCE_REMOTE)


def _episode_failed(frame: ActiveScope, exc: Exception) -> None:
    frame.fail_unless_classified(*classify(exc))


def _rollout_failed(frame: ActiveScope, exc: Exception) -> None:
    # An exception escaping a rollout that opened no episode fails its implicit attempt 0, whatever
    # was recorded before it (with episodes the rule leaves it to them).
    frame.fail_unless_classified(*classify(exc))


def _finish_rollout(frame: ActiveScope) -> None:
    span = frame.span
    _live.unwatch(frame)
    decision = frame.decision()
    span.set_attribute(c.ROLLOUT_ATTEMPTS, decision.attempts)
    span.set_attribute(c.ROLLOUT_OUTCOME, decision.outcome)
    if decision.reward is not None:
        span.set_attribute(c.REWARD, decision.reward)
    if not getattr(frame, "counted", False):
        # Counted by this process (the rollout's owner) at the next collection, with the outcome
        # records written here meanwhile, as the readers decide (see _metrics).
        frame.counted = True
        _metrics.rollout_ended(
            span.get_span_context().trace_id,
            frame.identity.get(c.ROLLOUT_ID),
            decision,
            frame.outcome_facts().attempts,
            span,
        )
    if decision.discarded:
        # Last: in strict mode this raises, and the span above is complete by then.
        data_lost(GymTraceError(warning_text(frame.identity.get(c.ROLLOUT_ID), decision)))


def _finish_verify(frame: ActiveScope) -> None:
    if frame.reward is not None:
        frame.span.set_attribute(c.REWARD, frame.reward)


# -- the table ------------------------------------------------------------------------------------------

_ATTRIBUTES: Mapping[str, Validator] = {"attributes": _a_mapping}
_TOKENS = ((c.GEN_AI_USAGE_INPUT_TOKENS, "in_tokens"), (c.GEN_AI_USAGE_OUTPUT_TOKENS, "out_tokens"))
_MESSAGES = (c.GEN_AI_INPUT_MESSAGES, c.GEN_AI_OUTPUT_MESSAGES)


# On a step owner under a step policy that counts (the aggregate policy, the Gymnasium integration):
# how many steps ran and how many of them are spans, so a tree with three step lines under a
# 500-step episode says so.
_STEP_COUNTS = ((c.STEPS_COUNT, "steps"), (c.STEPS_SAMPLED, "spans"))


def _numbered(
    kind: str, rank: int, span_name: str, attribute: str, shown: tuple[tuple[str, str], ...] = ()
) -> Level:
    """A level numbered 1, 2, 3... per agent invocation (turns and steps)."""
    return Level(
        kind,
        rank=rank,
        prepare=_prepare_numbered(kind, span_name, attribute),
        arguments={"number": _a_number, **_ATTRIBUTES},
        shown=((attribute, "#"), *shown),
    )


LEVELS: Mapping[str, Level] = {
    level.kind: level
    for level in (
        Level(
            c.KIND_RUN,
            rank=0,
            prepare=_prepare_run,
            arguments={"run_id": _an_id, **_ATTRIBUTES},
        ),
        Level(
            c.KIND_ROLLOUT,
            rank=1,
            prepare=_prepare_rollout,
            arguments={"rollout_id": _an_id, "task_id": _an_id, "repeat": _an_index, **_ATTRIBUTES},
            finish=_finish_rollout,
            failed=_rollout_failed,
            shown=((c.ROLLOUT_OUTCOME, "outcome"), (c.ROLLOUT_ATTEMPTS, "attempts"), (c.REWARD, "reward")),
        ),
        Level(
            c.KIND_EPISODE,
            rank=2,
            prepare=_prepare_episode,
            arguments={"attempt": _an_index, "timeout": _a_duration, **_ATTRIBUTES},
            finish=_finish_episode,
            failed=_episode_failed,
            shown=(
                (c.EPISODE_OUTCOME, "outcome"),
                (c.EPISODE_RESTORED, "restored"),
                (c.FAILURE_KIND, "failure"),
                (c.FAILURE_RETRYABLE, "retryable"),
                (c.REWARD, "reward"),
                *_STEP_COUNTS,
            ),
        ),
        # seed_session and verify are phases of an episode and share a rank.
        Level(
            c.KIND_SEED_SESSION, rank=3, prepare=_prepare_phase(c.SPAN_SEED_SESSION), arguments=_ATTRIBUTES
        ),
        Level(
            c.KIND_VERIFY,
            rank=3,
            prepare=_prepare_phase(c.SPAN_VERIFY),
            arguments=_ATTRIBUTES,
            finish=_finish_verify,
            shown=((c.REWARD, "reward"),),
        ),
        Level(
            c.KIND_AGENT_INVOCATION,
            rank=4,
            prepare=_prepare_genai(
                c.OPERATION_INVOKE_AGENT,
                ("agent_name", c.GEN_AI_AGENT_NAME),
                ("invocation_id", c.GEN_AI_AGENT_ID),
            ),
            arguments={"agent_name": _an_id, "invocation_id": _an_id, **_ATTRIBUTES},
            content=(*_MESSAGES, c.CONTENT_EVENT),
            shown=_STEP_COUNTS,
        ),
        _numbered(c.KIND_TURN, 5, c.SPAN_TURN, c.TURN_NUMBER),
        # A step kept as a sample says why (first, slowest, raised).
        _numbered(c.KIND_STEP, 6, c.SPAN_STEP, c.STEP_NUMBER, ((c.STEP_KEPT, "kept"),)),
        Level(
            c.KIND_MODEL_CALL,
            rank=7,
            # The second pair is the provider, not an ID; same shape all the same.
            prepare=_prepare_genai(
                c.OPERATION_CHAT, ("model", c.GEN_AI_REQUEST_MODEL), ("provider", c.GEN_AI_PROVIDER_NAME)
            ),
            arguments={"model": _an_id, "provider": _an_id, **_ATTRIBUTES},
            span_kind=SpanKind.CLIENT,
            content=(*_MESSAGES, c.GEN_AI_CLIENT_INFERENCE_OPERATION_DETAILS),
            shown=_TOKENS,
        ),
        Level(
            c.KIND_TOOL_CALL,
            rank=7,
            prepare=_prepare_genai(
                c.OPERATION_EXECUTE_TOOL,
                ("tool_name", c.GEN_AI_TOOL_NAME),
                ("call_id", c.GEN_AI_TOOL_CALL_ID),
            ),
            arguments={"tool_name": _an_id, "call_id": _an_id, **_ATTRIBUTES},
            # A tool call can spawn a subagent, call a model (an LLM tool) or another tool.
            may_contain=frozenset({c.KIND_AGENT_INVOCATION, c.KIND_MODEL_CALL, c.KIND_TOOL_CALL}),
            content=(c.GEN_AI_TOOL_CALL_ARGUMENTS, c.GEN_AI_TOOL_CALL_RESULT, c.CONTENT_EVENT),
        ),
    )
}


def _finish_step(frame: ActiveScope) -> None:
    started = getattr(frame.span, "start_time", None)  # an SDK span's; an API-only span has none
    if isinstance(started, int):
        _metrics.step_ended((time_ns() - started) / 1e9)


def measure_steps(on: bool) -> None:
    """``gym.step.duration`` on or off (GYMTRACE_STEP_METRICS). Off, a step level has no finish at
    all, so a step costs exactly what it did before metrics existed."""
    # Level is frozen for everyone else; this one field is the switch, read by every Scope of steps.
    object.__setattr__(LEVELS[c.KIND_STEP], "finish", _finish_step if on else None)
    _steps.measure = _metrics.step_ended if on else None


def allowed(parent_kind: str, kind: str) -> bool:
    """Whether a ``kind`` span may open below a ``parent_kind`` span."""
    parent = LEVELS.get(parent_kind)
    if parent is None:  # a level in another process: its kind did not travel
        return True
    if LEVELS[kind].rank > parent.rank:
        return True
    return kind in parent.may_contain


# GYMTRACE_STEP_METRICS set in the environment applies without configure().
measure_steps(_settings.active.step_metrics)
