"""Outcomes: attempts, rewards, failures, token usage, and reading the current identity.

The rules come from the vocabulary (``shared/DESIGN.md`` §1): attempts are 0-based retry numbers of
a rollout's episodes; only the final episode's result becomes the rollout's reward; a failed
episode is never scored; a rollout whose final episode failed is *unscored* and has no reward at
all (never an invented 0).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, SpanContext, Status, StatusCode, TraceFlags

from gymtrace import _constants as c
from gymtrace._errors import GymTraceError, InvalidArgumentError, contract_problem, internal_error
from gymtrace._scope import (
    ActiveScope,
    check_index,
    check_reward,
    current_frame,
    episode_id,
)
from gymtrace._tracing import active_tracer

# Retryable unless said otherwise: an infrastructure failure or a timeout is what retries are for.
_RETRYABLE_BY_DEFAULT = frozenset({c.FAILURE_INFRASTRUCTURE, c.FAILURE_TIMEOUT})


CARRIER_FORMAT = "gymtrace.carrier/1"


def make_carrier(frame: ActiveScope) -> dict[str, Any]:
    """See :meth:`ActiveScope.carrier`. Only identity and span IDs: safe to store and log."""
    rollout = frame.nearest(c.KIND_ROLLOUT)
    episode = frame.nearest(c.KIND_EPISODE)
    owner = rollout or episode or frame
    identity = {k: v for k, v in owner.identity.items() if k in _ROLLOUT_IDENTITY}
    if rollout is not None:
        next_attempt = rollout._next_attempt
    elif episode is not None and episode.attempt is not None:
        next_attempt = episode.attempt + 1
    else:
        next_attempt = 0
    carrier: dict[str, Any] = {"format": CARRIER_FORMAT, "identity": identity, "next_attempt": next_attempt}
    parent = (
        rollout if rollout is not None else (episode.parent_span_context if episode is not None else None)
    )
    if isinstance(parent, ActiveScope):
        carrier["rollout_span"] = _span_ref(parent.span.get_span_context())
    elif parent is not None:
        carrier["rollout_span"] = _span_ref(parent)
    if episode is not None:
        carrier["episode_span"] = _span_ref(episode.span.get_span_context())
    return carrier


_ROLLOUT_IDENTITY = (c.RUN_ID, c.TASK_ID, c.ROLLOUT_ID, c.ROLLOUT_REPEAT)


def _span_ref(ctx: SpanContext) -> dict[str, Any]:
    return {
        "trace_id": trace.format_trace_id(ctx.trace_id),
        "span_id": trace.format_span_id(ctx.span_id),
        "sampled": bool(ctx.trace_flags.sampled),
    }


def _span_context(ref: Any) -> SpanContext | None:
    try:
        ctx = SpanContext(
            trace_id=int(ref["trace_id"], 16),
            span_id=int(ref["span_id"], 16),
            is_remote=True,
            trace_flags=TraceFlags(TraceFlags.SAMPLED if ref.get("sampled", True) else TraceFlags.DEFAULT),
        )
    except (KeyError, TypeError, ValueError):
        return None
    return ctx if ctx.is_valid else None


def _read_carrier(carrier: Any) -> tuple[dict[str, str | int], int, SpanContext | None, SpanContext | None]:
    """Validate a carrier (it may have travelled through files and queues for hours)."""
    from gymtrace.propagation import clean_identity

    if not isinstance(carrier, Mapping) or carrier.get("format") != CARRIER_FORMAT:
        raise GymTraceError(f"not a gymtrace carrier (expected format {CARRIER_FORMAT!r}): {carrier!r:.120}")
    identity = clean_identity(carrier.get("identity") or {})
    next_attempt = carrier.get("next_attempt", 0)
    if isinstance(next_attempt, bool) or not isinstance(next_attempt, int) or next_attempt < 0:
        raise GymTraceError(f"carrier 'next_attempt' must be an int >= 0, got {next_attempt!r:.40}")
    rollout_span = _span_context(carrier.get("rollout_span") or {})
    episode_span = _span_context(carrier.get("episode_span") or {})
    return identity, next_attempt, rollout_span, episode_span


def prepare_episode(
    source: tuple[str, Any] | None, frame: ActiveScope, values: dict[str, Any], ctx: otel_context.Context
) -> tuple[str, dict[str, Any], list[Link] | None, otel_context.Context]:
    parent = frame.parent
    rollout = parent.nearest(c.KIND_ROLLOUT) if parent is not None else None
    identity = {k: v for k, v in frame.identity.items() if k not in (c.EPISODE_ATTEMPT, c.EPISODE_ID)}
    attempt = values.get("attempt")
    start_context = ctx
    relation, previous = source if source is not None else (c.RELATION_RETRY, None)
    if previous is True or previous is None:
        previous = rollout._last_episode if rollout is not None else None
    previous_span: SpanContext | None = None
    if isinstance(previous, ActiveScope):
        if previous.span is not trace.INVALID_SPAN:
            previous_span = previous.span.get_span_context()
    elif previous is not None:
        try:
            carried, next_attempt, rollout_span, previous_span = _read_carrier(previous)
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
        attempt = rollout._next_attempt if rollout is not None else 0
    if rollout is not None:
        rollout._next_attempt = max(rollout._next_attempt, attempt + 1)
        rollout._episodes += 1
        rollout._last_episode = frame
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
    attributes = dict(identity)
    attributes[c.KIND] = c.KIND_EPISODE
    if restored:
        frame.restored = True
        attributes[c.EPISODE_RESTORED] = True
    extra = values.get("attributes")
    if extra:
        for key, value in extra.items():
            attributes.setdefault(key, value)
    return c.SPAN_EPISODE, attributes, links, start_context


def finish_episode(frame: ActiveScope) -> None:
    span = frame.span
    if frame.cancelled:
        outcome = c.OUTCOME_CANCELLED
    elif frame.failure is not None:
        outcome = c.OUTCOME_FAILED
    else:
        outcome = c.OUTCOME_COMPLETED
    span.set_attribute(c.EPISODE_OUTCOME, outcome)
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


def finish_rollout(frame: ActiveScope) -> None:
    span = frame.span
    final = frame._last_episode
    if final is not None:
        reward = final.reward if final.failure is None and not final.cancelled else None
    else:
        # No episode scopes: the rollout itself was scored directly.
        reward = frame.reward
    span.set_attribute(c.ROLLOUT_ATTEMPTS, frame._episodes)
    if reward is None:
        span.set_attribute(c.ROLLOUT_OUTCOME, c.OUTCOME_UNSCORED)
    else:
        span.set_attribute(c.ROLLOUT_OUTCOME, c.OUTCOME_SCORED)
        span.set_attribute(c.REWARD, reward)


def _target(
    scope: ActiveScope | None, kinds: tuple[str, ...], caller: str
) -> tuple[ActiveScope | None, ActiveScope | None]:
    """(the frame to record from, its nearest frame of ``kinds``); both None when there is nothing
    to record: tracing is off, or the frame is the stand-in a ``with`` block gets while it is off."""
    if scope is None and active_tracer() is None:
        return None, None
    frame = scope if scope is not None else current_frame()
    if frame is not None and frame.kind == "disabled":
        return None, None
    target = frame.nearest(*kinds) if frame is not None else None
    if target is None:
        contract_problem(
            (caller, "no target"),
            GymTraceError(f"gymtrace.{caller}() was called outside any {' or '.join(kinds)} scope; ignored"),
        )
    return frame, target


def record_reward(value: float, *, scope: ActiveScope | None = None) -> None:
    """Record the reward of the current episode (or of the current rollout if it has no episodes).

    It becomes ``gym.reward`` on the enclosing ``verify`` span and, when the episode completes, on
    the episode span with a ``gen_ai.evaluation.result`` event; the rollout takes its final
    episode's reward. A failed episode keeps no reward: failed episodes are never scored.
    """
    try:
        number = check_reward("value", value)
        if number is None:
            return
        frame, target = _target(scope, (c.KIND_EPISODE, c.KIND_ROLLOUT), "record_reward")
        if frame is None or target is None:
            return
        verify = frame.nearest(c.KIND_VERIFY)
        if target.reward is not None:
            contract_problem(
                ("second reward", target.kind),
                GymTraceError(
                    f"a second reward was recorded for one {target.kind} ({target.reward} then {number});"
                    " the last one counts"
                ),
            )
        target.reward = number
        if verify is not None:
            verify.reward = number
    except GymTraceError:
        raise
    except Exception as exc:  # noqa: BLE001 - telemetry must not break the caller
        internal_error("record_reward", exc)


def record_failure(
    kind: str = c.FAILURE_INFRASTRUCTURE,
    *,
    retryable: bool | None = None,
    exception: BaseException | None = None,
    message: str | None = None,
    scope: ActiveScope | None = None,
) -> None:
    """Mark the current episode failed: ``gym.episode.outcome=failed`` with a failure kind.

    ``kind`` is free text; the conventional values are ``infrastructure``, ``timeout`` and
    ``terminal``. ``retryable`` defaults to true for infrastructure failures and timeouts.
    """
    try:
        if not isinstance(kind, str) or not kind:
            contract_problem(
                ("record_failure", "kind"),
                GymTraceError(
                    f"gymtrace.record_failure(): argument 'kind' must be a non-empty string, got {kind!r:.80}"
                ),
            )
            kind = c.FAILURE_ERROR
        _, target = _target(scope, (c.KIND_EPISODE,), "record_failure")
        if target is None:
            return
        if retryable is None:
            retryable = kind in _RETRYABLE_BY_DEFAULT
        target.failure = (kind, bool(retryable), message)
        if exception is not None and target.span.is_recording():
            target.span.record_exception(exception)
            target.span.set_attribute(c.ERROR_TYPE, type(exception).__qualname__)
    except GymTraceError:
        raise
    except Exception as exc:  # noqa: BLE001
        internal_error("record_failure", exc)


def record_usage(
    *,
    input_tokens: int | None = None,
    output_tokens: int | None = None,
    response_model: str | None = None,
    cached_input_tokens: int | None = None,
    response_id: str | None = None,
    finish_reasons: Sequence[str] | None = None,
    time_to_first_token: float | None = None,
    scope: ActiveScope | None = None,
) -> None:
    """Record token usage and response details on the current model call.

    ``cached_input_tokens`` (served from the provider's prefix cache, part of ``input_tokens``),
    ``response_id``, ``finish_reasons`` (one per choice) and ``time_to_first_token`` (seconds from
    request to first streamed chunk) are what tell server queueing from prefix-cache misses from the
    agent itself.
    """
    try:
        _, target = _target(scope, (c.KIND_MODEL_CALL,), "record_usage")
        if target is None:
            return
        span = target.span
        tokens_in = check_index("record_usage", "input_tokens", input_tokens, 0)
        tokens_out = check_index("record_usage", "output_tokens", output_tokens, 0)
        tokens_cached = check_index("record_usage", "cached_input_tokens", cached_input_tokens, 0)
        if tokens_in is not None:
            span.set_attribute(c.GEN_AI_USAGE_INPUT_TOKENS, tokens_in)
        if tokens_out is not None:
            span.set_attribute(c.GEN_AI_USAGE_OUTPUT_TOKENS, tokens_out)
        if tokens_cached is not None:
            span.set_attribute(c.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, tokens_cached)
        if response_model is not None:
            span.set_attribute(c.GEN_AI_RESPONSE_MODEL, str(response_model))
        if response_id is not None:
            span.set_attribute(c.GEN_AI_RESPONSE_ID, str(response_id))
        if finish_reasons is not None:
            if isinstance(finish_reasons, str) or not all(isinstance(r, str) for r in finish_reasons):
                contract_problem(
                    ("record_usage", "finish_reasons"),
                    InvalidArgumentError(
                        f"record_usage(): finish_reasons must be a list of strings, got {finish_reasons!r}"
                    ),
                )
            else:
                span.set_attribute(c.GEN_AI_RESPONSE_FINISH_REASONS, list(finish_reasons))
        if time_to_first_token is not None:
            if (
                isinstance(time_to_first_token, bool)
                or not isinstance(time_to_first_token, (int, float))
                or not math.isfinite(time_to_first_token)
                or time_to_first_token < 0
            ):
                contract_problem(
                    ("record_usage", "time_to_first_token"),
                    InvalidArgumentError(
                        "record_usage(): time_to_first_token must be a finite number of seconds >= 0, "
                        f"got {time_to_first_token!r}"
                    ),
                )
            else:
                span.set_attribute(c.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK, float(time_to_first_token))
    except GymTraceError:
        raise
    except Exception as exc:  # noqa: BLE001
        internal_error("record_usage", exc)


@dataclass(frozen=True, slots=True)
class Current:
    """The identity of the innermost gym scope, and its trace and span IDs.

    These are the join keys between the trace and the trajectory record: store
    :meth:`join_keys` next to the record of an episode to find its trace, and search Jaeger by
    ``gym.rollout.id`` to find the record's spans. Every field is ``None`` outside gym scopes.
    """

    kind: str | None = None
    run_id: str | None = None
    task_id: str | None = None
    rollout_id: str | None = None
    repeat: int | None = None
    attempt: int | None = None
    episode_id: str | None = None
    trace_id: str | None = None
    span_id: str | None = None

    def join_keys(self) -> dict[str, str | int]:
        """The non-empty identity as ``{attribute name: value}``, plus ``trace_id``."""
        keys: dict[str, str | int] = {}
        for name, value in (
            (c.RUN_ID, self.run_id),
            (c.TASK_ID, self.task_id),
            (c.ROLLOUT_ID, self.rollout_id),
            (c.ROLLOUT_REPEAT, self.repeat),
            (c.EPISODE_ATTEMPT, self.attempt),
            (c.EPISODE_ID, self.episode_id),
            ("trace_id", self.trace_id),
        ):
            if value is not None:
                keys[name] = value
        return keys


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def identity_of(frame: ActiveScope | None) -> Current:
    ids: Mapping[str, object] = frame.identity if frame is not None else {}
    span_context = frame.span.get_span_context() if frame is not None else None
    valid = span_context is not None and span_context.is_valid
    return Current(
        kind=frame.kind if frame is not None else None,
        run_id=_str(ids.get(c.RUN_ID)),
        task_id=_str(ids.get(c.TASK_ID)),
        rollout_id=_str(ids.get(c.ROLLOUT_ID)),
        repeat=_int(ids.get(c.ROLLOUT_REPEAT)),
        attempt=_int(ids.get(c.EPISODE_ATTEMPT)),
        episode_id=_str(ids.get(c.EPISODE_ID)),
        trace_id=trace.format_trace_id(span_context.trace_id) if valid and span_context else None,
        span_id=trace.format_span_id(span_context.span_id) if valid and span_context else None,
    )


def current() -> Current:
    """Identity and trace/span IDs of the innermost gym scope (all ``None`` outside one)."""
    return identity_of(current_frame())


def current_scope() -> ActiveScope | None:
    """The innermost active gym scope, or ``None``: a decorated function's handle on its own span."""
    return current_frame()
