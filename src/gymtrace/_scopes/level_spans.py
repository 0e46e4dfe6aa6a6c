"""How each gym level starts and ends its span: the prepare and finish functions the level table names.

``_scopes/levels.py`` says what each level is (rank, arguments, span kind, what ``gymtrace tree``
shows); this module holds what each level does: the span name, start attributes, links and parent
context of a run, a rollout (a trace root linked to its run), an episode (0-based attempts, retry
and restore links, carriers, a re-run after a lost worker), the phases and the GenAI levels, the
turn and step numbering; and at the end, an episode's and a rollout's outcome (by the one rule),
verify's reward, a step's duration. Apart from the table because these are the rules with state
and side effects (metrics, live markers, outcome records), while the table is data.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from time import time_ns
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, SpanContext, Status, StatusCode

from gymtrace import _constants as c
from gymtrace._model import settings as _settings
from gymtrace._model.errors import GymTraceError, contract_problem, data_lost
from gymtrace._model.failures import classify
from gymtrace._model.ids import episode_id
from gymtrace._model.outcome_rule import Decision, warning_text
from gymtrace._scopes import live as _live
from gymtrace._scopes import metrics as _metrics
from gymtrace._scopes import steps as _steps
from gymtrace._scopes import training as _training
from gymtrace._scopes.active_scope import (
    CALLER_KEY,
    REMOTE_KIND,
    ActiveScope,
    emit_lost_attempt,
    emit_outcome,
    emit_summary,
    read_carrier,
)
from gymtrace._scopes.consumed import remember as _consumed_remember
from gymtrace._scopes.consumed import write_consumed
from gymtrace._scopes.state import EpisodeState, RolloutState

# What a level's prepare() returns: span name, start attributes, links, the context to start it in.
Prepared = tuple[str, dict[str, Any], "list[Link] | None", otel_context.Context]
# prepare(frame, validated argument values, parent context, the scope's source) -> Prepared
Prepare = Callable[[ActiveScope, dict[str, Any], otel_context.Context, Any], Prepared]
# What a level's sample() returns: the activation without a span (None: it gets one), the values to
# prepare it with, and what its finish records of the sample (the owner's stats and its number).
Sampled = tuple["ActiveScope | None", dict[str, Any], "tuple[Any, int] | None"]
Sample = Callable[[Any, ActiveScope, dict[str, Any], otel_context.Context], Sampled]


def _base(frame: ActiveScope, values: dict[str, Any]) -> dict[str, Any]:
    attributes = {**frame.identity, c.KIND: frame.kind}
    version = _training.version
    if version is not None and c.ROLLOUT_ID in attributes:
        # Below a rollout: the process's policy version as this span starts (a model call after a
        # mid-rollout weight update shows the new one); without one, the rollout's, in identity.
        attributes[c.POLICY_VERSION] = version
    extra = values.get("attributes")
    if extra:
        for key, value in extra.items():
            attributes.setdefault(key, value)
    return attributes


def prepare_run(
    frame: ActiveScope, values: dict[str, Any], ctx: otel_context.Context, source: Any
) -> Prepared:
    run_id = values.get("run_id") or f"run-{uuid.uuid4().hex[:12]}"
    frame.identity = {c.RUN_ID: run_id}
    return c.SPAN_RUN, _base(frame, values), None, ctx


def _run_of(frame: ActiveScope) -> ActiveScope | None:
    """The run a rollout or train step opens in: the enclosing run scope, or a run of another process
    whose context was carried here (a rollout worker that attached the trainer's run context: the
    frame standing for it is the caller's run, not a rollout or episode).

    A frame that names only a run stands for the caller's run span only when the span it continues
    came from that caller (a remote span context). A run ID continued without one (NeMo Gym's resume
    pass continues its run by ID alone) or under a span of this process (a server's own HTTP span,
    where NeMo Gym's servers open the rollouts of an untraced driver) has no run span to link to:
    a link there would point at nothing, or at a request, and the readers would take each such
    target for a run of its own (``gymtrace stats`` one line per request)."""
    parent = frame.parent
    if parent is None:
        return None
    run = parent.nearest(c.KIND_RUN)
    if run is None and parent.remote and parent.kind == REMOTE_KIND and c.RUN_ID in parent.identity:
        carried = parent.span.get_span_context()
        if carried.is_valid and carried.is_remote:
            return parent
    return run


def prepare_rollout(
    frame: ActiveScope, values: dict[str, Any], ctx: otel_context.Context, source: Any
) -> Prepared:
    identity = {k: v for k, v in frame.identity.items() if k == c.RUN_ID}
    identity[c.ROLLOUT_ID] = values.get("rollout_id") or uuid.uuid4().hex
    if "task_id" in values:
        identity[c.TASK_ID] = values["task_id"]
    if "repeat" in values:
        identity[c.ROLLOUT_REPEAT] = values["repeat"]
    process_version = _training.version
    if "group_id" in values:
        identity[c.GROUP_ID] = values["group_id"]
    # Its own policy_version= overrides the process's, for the rollout (and, in a process that sets
    # none, for the spans below it).
    version = values.get("policy_version", process_version)
    if version is not None:
        identity[c.POLICY_VERSION] = version
    frame.identity = identity
    state = frame.rollout_state = RolloutState(time_ns())
    state.policy_start = process_version
    _live.watch(frame)
    links, start_context = _root_linked_to_run(frame, ctx)
    attributes = _base(frame, values)
    if version is not None:
        attributes[c.POLICY_VERSION] = version  # its own, not the process's (_base)
    if "group_size" in values:
        attributes[c.GROUP_SIZE] = values["group_size"]
    step = values.get("train_step")
    if step is None and frame.parent is not None:
        # Generated inside a train step (synchronous RL): generated for that step.
        trainer = frame.parent.nearest(c.KIND_TRAIN_STEP)
        step = trainer.identity.get(c.TRAIN_STEP) if trainer is not None else None
    if step is not None:
        attributes[c.TRAIN_STEP] = step
    state.opened = (attributes, links, start_context)
    return c.SPAN_ROLLOUT, attributes, links, start_context


def _root_linked_to_run(
    frame: ActiveScope, ctx: otel_context.Context
) -> tuple[list[Link] | None, otel_context.Context]:
    """The links and start context of a rollout or train step: under a run (and one trace per
    rollout), the root of its own trace with a link to the run, since a root span in the run's
    trace would be invisible until the run ends (hours) and lost on a crash; under a caller
    outside the gym (a trainer's span), the root of its own trace with a link to that span; else
    under ``ctx``."""
    caller = _caller_of(frame, ctx)
    run = _run_of(frame)
    if run is not None and caller is not None and run.span.get_span_context().trace_id == caller.trace_id:
        run = None  # a stand-in frame made for the caller's request, not a run of gymtrace's
    caller_link = Link(caller, {c.LINK_RELATION: c.RELATION_CALLER}) if caller is not None else None
    if run is not None and _settings.active.trace_per_run:
        # One trace per run: in the run's, even where a caller's span is current.
        if caller_link is None:
            return None, ctx
        return [caller_link], trace.set_span_in_context(run.span, ctx)
    links = [Link(run.span.get_span_context(), {c.LINK_RELATION: c.RELATION_RUN})] if run is not None else []
    if caller_link is not None:
        # After the run's link: the Jaeger reader, without link attributes (its v1 API), takes the
        # first link of a rollout for its run.
        links.append(caller_link)
    if not links:
        return None, ctx
    return links, trace.set_span_in_context(trace.INVALID_SPAN, ctx)


def _caller_of(frame: ActiveScope, ctx: otel_context.Context) -> SpanContext | None:
    """The span of a caller outside the gym that ``ctx`` runs under, or ``None``.

    A trainer with telemetry of its own (NeMo RL's ``rl.grpo.collect_rollouts``) hands its context
    to the gym: as the ``traceparent`` of a request (noted by the server middleware, which may have
    made the request a span or a stand-in frame of its own since), or as the span current where
    the rollout opens. Its rollouts must not join that trace (a step's trace would hold thousands
    of rollouts), nor lose the way to it. gymtrace's own hand-offs are no caller: the current span
    is then in the trace of the gym frame the context continues (a run or rollout of this or
    another process, whose identity this process believed)."""
    current = trace.get_current_span(ctx).get_span_context()
    if not current.is_valid:
        return None
    noted = ctx.get(CALLER_KEY)
    if isinstance(noted, SpanContext) and noted.trace_id == current.trace_id:
        return noted
    owner = frame.parent
    if owner is not None and owner.span.get_span_context().trace_id == current.trace_id:
        return None
    return current


def prepare_train_step(
    frame: ActiveScope, values: dict[str, Any], ctx: otel_context.Context, source: Any
) -> Prepared:
    """A trainer step: like a rollout, the root of its own trace, linked to its run (a run of 10^4
    steps must not be one trace). Its policy version is the weights it starts from."""
    identity = {k: v for k, v in frame.identity.items() if k == c.RUN_ID}
    if "step" in values:
        identity[c.TRAIN_STEP] = values["step"]
    version = values.get("policy_version", _training.version)
    if version is not None:
        identity[c.POLICY_VERSION] = version  # gymtrace.current().policy_version inside the step
    frame.identity = identity
    frame.train_state = _training.TrainState(version)
    links, start_context = _root_linked_to_run(frame, ctx)
    attributes = _base(frame, values)
    if version is not None:
        attributes[c.POLICY_VERSION] = version
    return c.SPAN_TRAIN_STEP, attributes, links, start_context


def finish_train_step(frame: ActiveScope) -> None:
    """Write the consumed rollouts not yet in a record, and how many it consumed in all."""
    state = frame.train_state
    if state is None:
        return
    write_consumed(frame, final=True)
    frame.span.set_attribute(c.CONSUMED_COUNT, state.consumed)


def prepare_episode(
    frame: ActiveScope, values: dict[str, Any], ctx: otel_context.Context, source: Any
) -> Prepared:
    """``source``: (relation, previous episode or its carrier), relation ``retry`` or ``restore``."""
    parent = frame.parent
    state = frame.episode_state = EpisodeState()
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
                state.parent_span_context = rollout_span
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
    state.started_ns = time_ns()
    attributes = _base(frame, values)
    timeout = values.get("timeout")
    if timeout is not None:
        attributes[c.EPISODE_TIMEOUT] = timeout
        _live.watch_deadline(frame, timeout)
    if restored:
        state.restored = True
        attributes[c.EPISODE_RESTORED] = True
    return c.SPAN_EPISODE, attributes, links, start_context


def prepare_phase(name: str) -> Prepare:
    def prepare(
        frame: ActiveScope, values: dict[str, Any], ctx: otel_context.Context, source: Any
    ) -> Prepared:
        return name, _base(frame, values), None, ctx

    return prepare


def genai_span_name(operation: str, subject: object) -> str:
    """GenAI spans are named "{operation} {subject}" (the agent, model or tool name, low-cardinality);
    without a subject the name is the bare operation. The importers name theirs by it too."""
    return f"{operation} {subject}" if subject else operation


def prepare_genai(operation: str, subject: tuple[str, str], detail: tuple[str, str]) -> Prepare:
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


def prepare_numbered(kind: str, span_name: str, attribute: str) -> Prepare:
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


def finish_episode(frame: ActiveScope) -> None:
    span = frame.span
    if frame.cancelled:
        outcome = c.OUTCOME_CANCELLED
    elif frame.failure is not None:
        outcome = c.OUTCOME_FAILED
    else:
        outcome = c.OUTCOME_COMPLETED
    span.set_attribute(c.EPISODE_OUTCOME, outcome)
    _live.unwatch_deadline(frame)
    state = frame.episode_state
    now = time_ns()
    seconds = (now - (state.started_ns if state is not None else now)) / 1e9
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


def episode_failed(frame: ActiveScope, exc: Exception) -> None:
    frame.fail_unless_classified(*classify(exc))


def rollout_failed(frame: ActiveScope, exc: Exception) -> None:
    # An exception escaping a rollout that opened no episode fails its implicit attempt 0, whatever
    # was recorded before it (with episodes the rule leaves it to them).
    frame.fail_unless_classified(*classify(exc))


def finish_rollout(frame: ActiveScope) -> None:
    span = frame.span
    _live.unwatch(frame)
    state = frame.rollout_state
    now_version = _training.version
    if state is not None and now_version is not None and now_version != state.policy_start:
        # The process's weights changed while it ran: it ended under another version.
        span.set_attribute(c.POLICY_VERSION_END, now_version)
    decision = frame.decision()
    span.set_attribute(c.ROLLOUT_ATTEMPTS, decision.attempts)
    span.set_attribute(c.ROLLOUT_OUTCOME, decision.outcome)
    if decision.reward is not None:
        span.set_attribute(c.REWARD, decision.reward)
    state = frame.rollout_state or frame._rollout()  # made by prepare_rollout
    if not span.is_recording():
        _summarise(frame, state, decision, now_version)
    _training_ended(frame, state)
    if not state.counted:
        # Counted by this process (the rollout's owner) at the next collection, with the outcome
        # records written here meanwhile, as the readers decide (see _metrics).
        state.counted = True
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


def _summarise(
    frame: ActiveScope, state: RolloutState[ActiveScope], decision: Decision, now_version: int | str | None
) -> None:
    """A rollout the sampler dropped (its span records nothing): its summary, one span of its own."""
    dropped = frame.span.get_span_context()
    if not dropped.is_valid or dropped.trace_flags.sampled or state.opened is None:
        return  # no tracer decided this span (an invalid one), or it records elsewhere
    opened, links, parent = state.opened
    attributes = dict(opened)
    if now_version is not None and now_version != state.policy_start:
        attributes[c.POLICY_VERSION_END] = now_version
    attributes[c.ROLLOUT_ATTEMPTS] = decision.attempts
    attributes[c.ROLLOUT_OUTCOME] = decision.outcome
    if decision.reward is not None:
        attributes[c.REWARD] = decision.reward
    if state.tokens is not None:
        attributes[c.GEN_AI_USAGE_INPUT_TOKENS], attributes[c.GEN_AI_USAGE_OUTPUT_TOKENS] = state.tokens
    emit_summary(dropped, attributes, state.started_ns, links, parent)


def _training_ended(frame: ActiveScope, state: RolloutState[ActiveScope]) -> None:
    """Remember a rollout of a training run that ended here, so a train step of this process can
    consume it by its bare ID (``_scopes/consumed.py``)."""
    if c.GROUP_ID in frame.identity or c.POLICY_VERSION in frame.identity or state.policy_start is not None:
        _consumed_remember(frame)


def finish_verify(frame: ActiveScope) -> None:
    if frame.reward is not None:
        frame.span.set_attribute(c.REWARD, frame.reward)


def sample_step(
    scope: Any, parent: ActiveScope, values: dict[str, Any], parent_context: otel_context.Context
) -> Sampled:
    """Under a step policy that aggregates: a step gets its number from its owner, and a span only
    if the owner's sample wants one; one that does not is an activation without a level, in its
    parent's context, timed and counted on the owner."""
    owner = parent.nearest(*NUMBERING_OWNERS)
    if owner is None:
        return None, values, None
    counter = owner.counter
    stats = (counter.stats if counter is not None else None) or _steps.stats_for(owner)
    number = owner.take_number(scope.kind, values.get("number"))
    if not stats.wants_span():
        frame = ActiveScope(scope.kind, parent, scope, None)
        frame.context = parent_context
        frame.step_timing = (stats, number, time_ns(), False)
        return frame, values, None
    values = {**values, "number": number}
    if not stats.everything:
        # Why this step is a span: the first of its owner's sample (the finish may say slowest).
        values["attributes"] = {c.STEP_KEPT: c.STEP_KEPT_FIRST, **(values.get("attributes") or {})}
    return None, values, (stats, number)


def finish_step(frame: ActiveScope) -> None:
    started = getattr(frame.span, "start_time", None)  # an SDK span's; an API-only span has none
    if isinstance(started, int):
        _metrics.step_ended((time_ns() - started) / 1e9)
