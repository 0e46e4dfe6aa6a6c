"""The module-level recording functions and reading the current identity.

``gymtrace.record_reward(0.8)`` acts on the innermost gym scope of the current context; each
function here finds that scope and hands the work to its :class:`~gymtrace._scopes.active_scope.ActiveScope`,
which owns the rules (a rollout gets at most one reward, from its final episode; a failed episode is
never scored; an unscored rollout has no reward at all, never an invented 0).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace

from gymtrace import _constants as c
from gymtrace import _content
from gymtrace._model.errors import guard
from gymtrace._model.ids import check_reward
from gymtrace._model.numbers import read_int
from gymtrace._scopes import training as _training
from gymtrace._scopes.active_scope import DISABLED_KIND, ActiveScope, active_scope_for, current_active_scope
from gymtrace._scopes.consumed import consume as _consume
from gymtrace._scopes.levels import LEVELS

_REWARD_TARGETS = (c.KIND_EPISODE, c.KIND_ROLLOUT)
_CONTENT_TARGETS = tuple(kind for kind, level in LEVELS.items() if level.content is not None)


@guard("record_reward")
def record_reward(value: float, *, scope: ActiveScope | None = None) -> None:
    """Record the reward of the current episode (or of the current rollout if it has no episodes).

    It becomes ``gym.reward`` on the enclosing ``verify`` span and, when the episode completes, on
    the episode span with a ``gen_ai.evaluation.result`` event; the rollout takes its final
    episode's reward. A failed episode keeps no reward: failed episodes are never scored.
    """
    if check_reward("value", value) is None:
        return
    frame = active_scope_for(scope, "record_reward", _REWARD_TARGETS)
    if frame is not None:
        frame.record_reward(value)


@guard("record_failure")
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
    ``exception`` is recorded on the episode span, with ``error.type`` its fully qualified name.
    """
    frame = active_scope_for(scope, "record_failure", (c.KIND_EPISODE,))
    if frame is not None:
        frame.record_failure(kind, retryable=retryable, exception=exception, message=message)


@guard("record_usage")
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
    frame = active_scope_for(scope, "record_usage", (c.KIND_MODEL_CALL,))
    if frame is not None:
        frame.record_usage(
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            response_model=response_model,
            cached_input_tokens=cached_input_tokens,
            response_id=response_id,
            finish_reasons=finish_reasons,
            time_to_first_token=time_to_first_token,
        )


def record_content(input: object = None, output: object = None, *, scope: ActiveScope | None = None) -> None:
    """Record content on the current model call, tool call or agent invocation. Off by default.

    On a model call or agent invocation ``input``/``output`` become ``gen_ai.input.messages`` /
    ``gen_ai.output.messages``; on a tool call, ``gen_ai.tool.call.arguments`` /
    ``gen_ai.tool.call.result``. ``None`` means "not given". Pass plain data (dicts, lists,
    strings, numbers): other objects are recorded as ``"<ClassName>"``, never by calling their
    methods. Recorded only when ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` (or
    ``configure(capture_content=...)``) turns capture on; then as span attributes (``SPAN_ONLY``),
    one span event (``EVENT_ONLY``: ``gen_ai.client.inference.operation.details`` on model calls,
    ``gym.content`` otherwise) or both. Values are redacted and cut to their budgets; nothing of
    the caller's is mutated. Never raises (except in strict mode, for misuse).
    """
    if not _content.capturing() or (input is None and output is None):
        return  # capture off: no work, no complaint
    with guard("record_content"):
        frame = active_scope_for(scope, "record_content", _CONTENT_TARGETS)
        if frame is not None:
            frame.record_content(input, output)


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
    # In a training run: the rollout's group and policy version (its start version), and the
    # rollout span's ID (what a train step's link to it needs: gymtrace.consume()).
    group_id: str | None = None
    policy_version: int | str | None = None
    rollout_span_id: str | None = None

    def join_keys(self) -> dict[str, str | int]:
        """The non-empty identity as ``{attribute name: value}``, plus ``trace_id`` and, inside a
        rollout of this process, ``rollout_span_id``: what :func:`gymtrace.consume` needs to name
        this rollout unambiguously and link a train step to it."""
        keys: dict[str, str | int] = {}
        for name, value in (
            (c.RUN_ID, self.run_id),
            (c.TASK_ID, self.task_id),
            (c.ROLLOUT_ID, self.rollout_id),
            (c.ROLLOUT_REPEAT, self.repeat),
            (c.EPISODE_ATTEMPT, self.attempt),
            (c.EPISODE_ID, self.episode_id),
            (c.GROUP_ID, self.group_id),
            (c.POLICY_VERSION, self.policy_version),
            ("trace_id", self.trace_id),
            ("rollout_span_id", self.rollout_span_id),
        ):
            if value is not None:
                keys[name] = value
        return keys


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def identity_of(frame: ActiveScope | None) -> Current:
    if frame is not None and frame.kind == DISABLED_KIND:
        frame = None
    ids: Mapping[str, object] = frame.identity if frame is not None else {}
    span_context = frame.span.get_span_context() if frame is not None else None
    valid = span_context is not None and span_context.is_valid
    rollout = frame.nearest(c.KIND_ROLLOUT) if frame is not None else None
    rollout_span = rollout.span.get_span_context() if rollout is not None and not rollout.remote else None
    version = ids.get(c.POLICY_VERSION)
    return Current(
        kind=frame.kind if frame is not None else None,
        run_id=_str(ids.get(c.RUN_ID)),
        task_id=_str(ids.get(c.TASK_ID)),
        rollout_id=_str(ids.get(c.ROLLOUT_ID)),
        repeat=read_int(ids.get(c.ROLLOUT_REPEAT)),
        attempt=read_int(ids.get(c.EPISODE_ATTEMPT)),
        episode_id=_str(ids.get(c.EPISODE_ID)),
        trace_id=trace.format_trace_id(span_context.trace_id) if valid and span_context else None,
        span_id=trace.format_span_id(span_context.span_id) if valid and span_context else None,
        group_id=_str(ids.get(c.GROUP_ID)),
        policy_version=version if isinstance(version, (int, str)) and not isinstance(version, bool) else None,
        rollout_span_id=trace.format_span_id(rollout_span.span_id)
        if rollout_span is not None and rollout_span.is_valid
        else None,
    )


def current() -> Current:
    """Identity and trace/span IDs of the innermost gym scope (all ``None`` outside one)."""
    return identity_of(current_active_scope())


def set_policy_version(version: int | str | None) -> None:
    """The weights this process generates with from now on: an ``int`` (integer-likes such as numpy
    and torch scalars are taken through ``operator.index``) or a ``str``; ``None`` forgets it.

    Every span that starts below a rollout from now on records it as ``gym.policy.version``; a
    rollout records the version it started with, and ``gym.policy.version.end`` when it ends under
    another one; a train step starts from it unless told otherwise. Call it where the weights
    change (after a weight sync), in every process that generates.
    """
    with guard("set_policy_version"):
        _training.set_policy_version(version)


def consume(rollout: str | Mapping[str, Any], outcome: str = c.TRAINED, reason: str | None = None) -> None:
    """Inside a train step: it consumed ``rollout``, with ``outcome`` (``gym.rollout.training_outcome``).

    ``rollout``: the rollout's join keys (``gymtrace.current().join_keys()``, taken inside the
    rollout and carried with its data to the trainer), or its bare rollout ID, which resolves to the
    most recent rollout of that ID in the run not yet consumed (a warning when several match).
    ``outcome``: ``trained``, ``filtered`` (e.g. a zero-variance group under dynamic sampling),
    ``stale`` (past the off-policy limit), ``aborted`` (cut at a weight update) or ``failed``.
    ``reason``: free text (``gym.train.reason``), e.g. ``zero_variance_group``.

    Cheap (a few microseconds on the caller's thread): consumed rollouts are written in batches, as
    ``gym.consumed`` children of the step that link to the rollouts, so a step can consume tens of
    thousands of rollouts with none lost to the SDK's per-span limits.
    """
    _consume(rollout, outcome, reason)


def current_scope() -> ActiveScope | None:
    """The innermost active gym scope, or ``None``: a decorated function's handle on its own span."""
    return current_active_scope()
