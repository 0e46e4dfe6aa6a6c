"""The gym levels, each described once: the table the engine, the checker and the renderer read.

A :class:`Level` says everything that differs between ``run``, ``rollout``, ..., ``tool_call``: its
rank in the nesting order, its default span kind, which arguments it takes and how each is
validated, how its span is prepared at start (name, attributes, links, parent context) and what
happens when it finishes, where content goes on it, and which of its attributes ``gymtrace tree``
shows. The table is data; what each level does at its start and end (the rules of rollouts and
episodes: 0-based attempts, retry and restore links, carriers, the final episode's reward) is in
``_scopes/level_spans.py``, which the entries name.

Adding a level: a constant for its kind and span name in ``_constants.py``, one :class:`Level` entry in
:data:`LEVELS` (with its prepare function in ``_scopes/level_spans.py``), and one public function in
``_scopes/api.py`` (see CONTRIBUTING.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from opentelemetry.trace import SpanKind

from gymtrace import _constants as c
from gymtrace._model import settings as _settings
from gymtrace._model.errors import InvalidArgumentError
from gymtrace._model.ids import check_id, check_index, report
from gymtrace._scopes import metrics as _metrics
from gymtrace._scopes import steps as _steps
from gymtrace._scopes import training as _training
from gymtrace._scopes.active_scope import ActiveScope
from gymtrace._scopes.level_spans import NUMBERING_OWNERS as NUMBERING_OWNERS
from gymtrace._scopes.level_spans import (
    Prepare,
    Sample,
    episode_failed,
    finish_episode,
    finish_rollout,
    finish_step,
    finish_train_step,
    finish_verify,
    prepare_episode,
    prepare_genai,
    prepare_numbered,
    prepare_phase,
    prepare_rollout,
    prepare_run,
    prepare_train_step,
    rollout_failed,
    sample_step,
)
from gymtrace._scopes.level_spans import genai_span_name as genai_span_name

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


# Not frozen: every field is fixed at import but the step level's ``finish``, which measure_steps()
# switches (read by every Scope of steps through its Level, so a switch reaches decorated steps
# too). eq=False: a level is its identity.
@dataclass(slots=True, eq=False)
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
    # The argument (seconds) after which an async body is cancelled and fails with TimeoutError.
    deadline: str | None = None
    # While a step policy aggregates: whether an activation gets a span (``Sample``).
    sample: Sample | None = None
    # The argument a decorated function's name gives unless it is given.
    named_after_function: str | None = None

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
        prepare=prepare_numbered(kind, span_name, attribute),
        arguments={"number": _a_number, **_ATTRIBUTES},
        shown=((attribute, "#"), *shown),
    )


LEVELS: Mapping[str, Level] = {
    level.kind: level
    for level in (
        Level(
            c.KIND_RUN,
            rank=0,
            prepare=prepare_run,
            arguments={"run_id": _an_id, **_ATTRIBUTES},
        ),
        Level(
            c.KIND_ROLLOUT,
            rank=1,
            prepare=prepare_rollout,
            arguments={
                "rollout_id": _an_id,
                "task_id": _an_id,
                "repeat": _an_index,
                "group_id": _training.check_group_id,
                "group_size": _a_number,
                "train_step": _training.check_step,
                "policy_version": _training.check_version,
                **_ATTRIBUTES,
            },
            finish=finish_rollout,
            failed=rollout_failed,
            shown=(
                (c.ROLLOUT_OUTCOME, "outcome"),
                (c.ROLLOUT_ATTEMPTS, "attempts"),
                (c.REWARD, "reward"),
                (c.GROUP_ID, "group"),
                (c.POLICY_VERSION, "policy"),
                (c.POLICY_VERSION_END, "policy_end"),
                (c.ROLLOUT_DETAIL, "detail"),  # false: a summary, its detail sampled out
            ),
        ),
        # A trainer step: beside the rollouts (the root of its own trace, linked to the run); in
        # synchronous RL the rollouts it trains on are generated inside it.
        Level(
            c.KIND_TRAIN_STEP,
            rank=1,
            prepare=prepare_train_step,
            arguments={
                "step": _training.check_step,
                "policy_version": _training.check_version,
                **_ATTRIBUTES,
            },
            finish=finish_train_step,
            may_contain=frozenset({c.KIND_ROLLOUT}),
            shown=((c.TRAIN_STEP, "step"), (c.POLICY_VERSION, "policy"), (c.CONSUMED_COUNT, "consumed")),
        ),
        Level(
            c.KIND_EPISODE,
            rank=2,
            prepare=prepare_episode,
            arguments={"attempt": _an_index, "timeout": _a_duration, **_ATTRIBUTES},
            deadline="timeout",
            finish=finish_episode,
            failed=episode_failed,
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
        Level(c.KIND_SEED_SESSION, rank=3, prepare=prepare_phase(c.SPAN_SEED_SESSION), arguments=_ATTRIBUTES),
        Level(
            c.KIND_VERIFY,
            rank=3,
            prepare=prepare_phase(c.SPAN_VERIFY),
            arguments=_ATTRIBUTES,
            finish=finish_verify,
            shown=((c.REWARD, "reward"),),
        ),
        Level(
            c.KIND_AGENT_INVOCATION,
            rank=4,
            prepare=prepare_genai(
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
        replace(
            _numbered(c.KIND_STEP, 6, c.SPAN_STEP, c.STEP_NUMBER, ((c.STEP_KEPT, "kept"),)),
            sample=sample_step,
        ),
        Level(
            c.KIND_MODEL_CALL,
            rank=7,
            # The second pair is the provider, not an ID; same shape all the same.
            prepare=prepare_genai(
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
            prepare=prepare_genai(
                c.OPERATION_EXECUTE_TOOL,
                ("tool_name", c.GEN_AI_TOOL_NAME),
                ("call_id", c.GEN_AI_TOOL_CALL_ID),
            ),
            arguments={"tool_name": _an_id, "call_id": _an_id, **_ATTRIBUTES},
            named_after_function="tool_name",
            # A tool call can spawn a subagent, call a model (an LLM tool) or another tool.
            may_contain=frozenset({c.KIND_AGENT_INVOCATION, c.KIND_MODEL_CALL, c.KIND_TOOL_CALL}),
            content=(c.GEN_AI_TOOL_CALL_ARGUMENTS, c.GEN_AI_TOOL_CALL_RESULT, c.CONTENT_EVENT),
        ),
    )
}


def measure_steps(on: bool) -> None:
    """``gym.step.duration`` on or off (GYMTRACE_STEP_METRICS). Off, a step level has no finish at
    all, so a step costs exactly what it did before metrics existed."""
    # This one field is the switch, read by every Scope of steps through its Level.
    LEVELS[c.KIND_STEP].finish = finish_step if on else None
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
