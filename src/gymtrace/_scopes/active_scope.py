"""The active scope: :class:`ActiveScope`, one per entry into a gym level (a ``with`` block, one
call of a decorated function), and finding the current one.

An ``ActiveScope`` owns its span, the gym identity every span below it inherits, its outcome state
(reward, failure, cancellation) and, in small holders made where a level needs them
(``_scopes/state.py``), a rollout's attempts, an episode's restore and remote-rollout link, a
numbering owner's counters. Its methods are the rules on that state: numbering (turn and step
numbers, unique across processes by ranges; attempt numbers, 0-based and never reused; all under
one lock) and what user code records on it (a reward goes to the nearest episode or rollout, a
failure to the episode, usage to the model call; anything recorded after the span ended, or on a
scope of another process, becomes an outcome record). The disabled path hands out one shared
instance, :data:`DISABLED_SCOPE`. An ``ActiveScope`` lives in the OpenTelemetry context under
:data:`SCOPE_KEY`, so whatever carries the context (asyncio tasks, ``copy_context()``) carries it.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanContext
from opentelemetry.trace.status import Status, StatusCode

from gymtrace import _constants as c
from gymtrace import _content
from gymtrace._model.errors import GymTraceError, InvalidArgumentError, contract_problem, data_lost, guard
from gymtrace._model.failures import qualified_name, retryable_by_default
from gymtrace._model.ids import ROLLOUT_IDENTITY, check_index, check_reward, episode_id
from gymtrace._model.outcome_rule import CANCELLED, COMPLETED, FAILED, Attempt, Decision, Facts, decide
from gymtrace._scopes import metrics as _metrics
from gymtrace._scopes.outcome_spans import emit_summary as emit_summary
from gymtrace._scopes.outcome_spans import untraced_worker
from gymtrace._scopes.scope_carrier import CARRIER_FORMAT as CARRIER_FORMAT
from gymtrace._scopes.scope_carrier import read_carrier as read_carrier
from gymtrace._scopes.scope_carrier import span_ref as span_ref
from gymtrace._scopes.state import EpisodeState, RolloutState, StepCounter
from gymtrace._scopes.tracing import active_tracer, current_context
from gymtrace._scopes.training import TrainState

SCOPE_KEY = otel_context.create_key("gymtrace.active_scope")
# The span of a caller outside the gym (a trainer) whose request this context serves, when that
# request's trace context came without a gym identity this process believes: a rollout opened for
# it starts a trace of its own and links to that span (issue 44), whatever local span (an HTTP
# server span) or stand-in frame the request got here.
CALLER_KEY = otel_context.create_key("gymtrace.caller")

# The kind of the frame that stands for a gym scope of another process (gymtrace.propagation).
REMOTE_KIND = "remote"

# The steps a continuation in another process numbers after its reserved first one: base * this + k
# (issue 25: 12 Ray tasks of one episode numbered 279 steps with 35 distinct numbers). Readable
# (3000002 is continuation 3's second step); room for 999,999 steps in each part of an episode, and,
# two levels of continuation deep (a task, and a task it calls), still within int64. Past either
# limit the numbers may repeat, and that is reported when it happens.
STEP_RANGE = 1_000_000
MAX_STEP_NUMBER = (1 << 63) - 1  # OTLP's intValue

_counter_lock = threading.Lock()


# (kind, retryable, message)
Failure = tuple[str, bool, "str | None"]

# The kind of the stand-in frame a `with` block gets while tracing is off.
DISABLED_KIND = "disabled"


def set_reward(self: ActiveScope, number: float) -> bool:
    """Record a validated reward on this episode or rollout."""
    # An episode, or a rollout without any (its own implicit attempt), that ended failed.
    attempt = self.kind == c.KIND_EPISODE or (self.kind == c.KIND_ROLLOUT and self.last_episode is None)
    if self.ended and attempt and (self.failure is not None or self.cancelled):
        data_lost(
            GymTraceError(
                f"a reward ({number}) was recorded for {self.kind}"
                f" {self.identity.get(c.EPISODE_ID if self.kind == c.KIND_EPISODE else c.ROLLOUT_ID)!r}"
                " after it ended failed or cancelled; failed episodes are never scored, so it is ignored"
            )
        )
        return False
    if self.reward is not None:
        contract_problem(
            ("second reward", self.kind),
            GymTraceError(
                f"a second reward was recorded for one {self.kind} ({self.reward} then {number});"
                " the last one counts"
            ),
        )
    self.reward = number
    return True


def set_failure(
    self: ActiveScope,
    kind: str,
    retryable: bool | None,
    message: str | None,
    exception: BaseException | None = None,
) -> None:
    """Mark this episode failed; ``retryable`` defaults by kind (see ``_model.failures``)."""
    self.failure = (kind, retryable_by_default(kind) if retryable is None else bool(retryable), message)
    if exception is not None and self.span.is_recording():
        self.span.record_exception(exception)
        self.span.set_attribute(c.ERROR_TYPE, qualified_name(type(exception)))
    if self.ended or self.remote:
        emit_outcome(self, c.SOURCE_LATE if self.ended else c.SOURCE_REMOTE)


def fail_unless_classified(self: ActiveScope, kind: str, retryable: bool) -> None:
    """An exception escaped the episode: it failed, unless record_failure() already said how."""
    if self.failure is None:
        self.failure = (kind, retryable, None)


# -- the public methods (never raise, except in strict mode for misuse) --------------------


def set_attribute(self: ActiveScope, key: str, value: Any) -> None:
    """Set an attribute on this scope's span (never raises)."""
    with guard("ActiveScope.set_attribute"):
        self.span.set_attribute(key, value)


def record_reward(self: ActiveScope, value: float) -> None:
    """See :func:`gymtrace.record_reward`; recorded on this scope's episode or rollout."""
    with guard("record_reward"):
        number = check_reward("value", value)
        if number is None or self.kind == DISABLED_KIND:
            return
        target = find_target(self, (c.KIND_EPISODE, c.KIND_ROLLOUT), "record_reward")
        if target is None:
            return
        final = target.last_episode if target.kind == c.KIND_ROLLOUT else None
        if final is not None and (target.ended or final.ended):
            # A reward after the rollout's final episode ended (a verify() between the last
            # episode and the rollout's end, or later) scores that episode: a record says so.
            target = final
        verify = self.nearest(c.KIND_VERIFY)
        if verify is not None:
            verify.reward = number
        if set_reward(target, number) and (target.ended or target.remote):
            emit_outcome(target, c.SOURCE_LATE if target.ended else c.SOURCE_REMOTE)


def record_failure(
    self: ActiveScope,
    kind: str = c.FAILURE_INFRASTRUCTURE,
    *,
    retryable: bool | None = None,
    exception: BaseException | None = None,
    message: str | None = None,
) -> None:
    """See :func:`gymtrace.record_failure`; recorded on this scope's episode."""
    with guard("record_failure"):
        if not isinstance(kind, str) or not kind:
            contract_problem(
                ("record_failure", "kind"),
                GymTraceError(
                    f"gymtrace.record_failure(): argument 'kind' must be a non-empty string, got {kind!r:.80}"
                ),
            )
            kind = c.FAILURE_ERROR
        if self.kind == DISABLED_KIND:
            return
        target = self.nearest(c.KIND_EPISODE, c.KIND_ROLLOUT)
        if target is not None and target.kind == c.KIND_ROLLOUT and target.last_episode is not None:
            # Its episodes ended: a failure here belongs to none of them.
            data_lost(
                GymTraceError(
                    f"gymtrace.record_failure() was called in rollout {target.identity.get(c.ROLLOUT_ID)!r}"
                    " after its episodes ended; dropped. Fix: record it inside the episode that failed"
                )
            )
            return
        if target is None:
            target = find_target(self, (c.KIND_EPISODE,), "record_failure")
        if target is not None:
            set_failure(target, kind, retryable, message, exception)


def record_usage(
    self: ActiveScope,
    *,
    input_tokens: int | None = None,
    output_tokens: int | None = None,
    response_model: str | None = None,
    cached_input_tokens: int | None = None,
    response_id: str | None = None,
    finish_reasons: Sequence[str] | None = None,
    time_to_first_token: float | None = None,
) -> None:
    """See :func:`gymtrace.record_usage`; recorded on this scope's model call."""
    with guard("record_usage"):
        if self.kind == DISABLED_KIND:
            return
        target = find_target(self, (c.KIND_MODEL_CALL,), "record_usage")
        if target is None:
            return
        span = target.span
        tokens_in = check_index("record_usage", "input_tokens", input_tokens, 0)
        tokens_out = check_index("record_usage", "output_tokens", output_tokens, 0)
        tokens_cached = check_index("record_usage", "cached_input_tokens", cached_input_tokens, 0)
        if not span.is_recording():
            _count_dropped_tokens(target, tokens_in, tokens_out)
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
                        f"record_usage(): finish_reasons must be a list of strings, got {finish_reasons!r:.80}"
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
                        "record_usage(): time_to_first_token must be a finite number of seconds >= 0,"
                        f" got {time_to_first_token!r:.40}"
                    ),
                )
            else:
                span.set_attribute(c.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK, float(time_to_first_token))


def record_content(self: ActiveScope, input: object = None, output: object = None) -> None:
    """Record prompts/messages or tool arguments/results on this scope; off by default
    (see :func:`gymtrace.record_content`)."""
    if self.kind == DISABLED_KIND or not _content.capturing() or (input is None and output is None):
        return
    with guard("record_content"):
        target: ActiveScope | None = self
        while target is not None and getattr(target.level, "content", None) is None:
            target = target.parent
        if target is None:
            contract_problem(
                ("record_content", "no target"),
                GymTraceError(
                    "gymtrace.record_content() was called outside any model_call, tool_call or"
                    " agent_invocation scope; ignored"
                ),
            )
            return
        _content.record_on(target.span, target.level.content, input, output)


def carrier(self: ActiveScope) -> dict[str, Any]:
    """A small JSON-safe dict from which another process, possibly hours later, opens the next
    attempt of this rollout: ``gymtrace.episode(continue_from=carrier)`` (a retry) or
    ``gymtrace.episode(restored_from=carrier)`` (a checkpoint restore). Only identity and span
    IDs: safe to store and log."""
    rollout = self.nearest(c.KIND_ROLLOUT)
    episode = self.nearest(c.KIND_EPISODE)
    owner = rollout or episode or self
    # The rollout's group and policy version travel with it (gym.policy.version: its start version).
    identity = {k: v for k, v in owner.identity.items() if k in ROLLOUT_IDENTITY or k in c.TRAINING_KEYS}
    if rollout is not None:
        state = rollout.rollout_state
        next_attempt = state.next_attempt if state is not None else 0
    elif episode is not None and episode.attempt is not None:
        next_attempt = episode.attempt + 1
    else:
        next_attempt = 0
    carrier: dict[str, Any] = {
        "format": CARRIER_FORMAT,
        "identity": identity,
        "next_attempt": next_attempt,
    }
    if rollout is not None:
        carrier["rollout_span"] = span_ref(rollout.span.get_span_context())
    elif episode is not None and episode.parent_span_context is not None:
        carrier["rollout_span"] = span_ref(episode.parent_span_context)
    if episode is None and rollout is not None and rollout.last_episode is not None:
        # Taken between attempts: the next attempt links to the last one.
        carrier["episode_span"] = span_ref(rollout.last_episode.span.get_span_context())
    if episode is not None:
        carrier["episode_span"] = span_ref(episode.span.get_span_context())
        if episode.attempt is not None:
            carrier["attempt"] = episode.attempt  # the attempt a later phase scores with it
    hand_off(self)  # whoever holds the carrier may record the outcome
    return carrier


def hand_off(self: ActiveScope) -> None:
    """A carrier or continuation headers of this scope were taken: the attempt they were taken
    in (its episode; outside every episode, the rollout's final attempt) may be concluded in
    another process, so that attempt, ending final with no outcome of its own, is ``pending``.
    A hand-off belongs to the episode that made it: a later attempt that completes here is not
    pending because an earlier, failed one had handed off."""
    rollout = self.nearest(c.KIND_ROLLOUT)
    if rollout is None or rollout.remote:
        return
    episode = self.nearest(c.KIND_EPISODE)
    (episode if episode is not None else rollout).handed_off = True


def find_target(self: ActiveScope, kinds: tuple[str, ...], caller: str) -> ActiveScope | None:
    target = self.nearest(*kinds)
    if target is None:
        data_lost(GymTraceError(outside(caller, kinds, self)))
    return target


def outside(caller: str, kinds: tuple[str, ...], frame: ActiveScope | None) -> str:
    """The message for a record_*() call that nothing can be attributed to: the reason and the fix."""
    where = f"inside {frame.kind}" if frame is not None else "outside every gym scope"
    # Said conditionally: this process cannot know how a sender injected, and a carrier with no
    # identity is also what a caller outside the gym sends (issue 43).
    fix = (
        "open the scope around the call, or pass scope= (an ActiveScope, also after its span ended)."
        " If it was meant for a gym scope in another process, continue that scope here with"
        " gymtrace.propagation.attach(carrier), and the sender must inject the carrier with"
        " gymtrace.propagation.inject(carrier, continuation=True) or"
        " gymtrace.propagation.inject(carrier, destination=URL): a carrier injected with neither"
        " carries no gym identity"
    )
    return (
        f"gymtrace.{caller}() was called {where}, not in any {' or '.join(kinds)} scope; dropped. Fix: {fix}"
    )


def _count_dropped_tokens(call: ActiveScope, tokens_in: int | None, tokens_out: int | None) -> None:
    """A model call in a rollout the sampler dropped: its tokens are added to the rollout's totals,
    which its summary span carries (only a dropped rollout counts: a recorded one has the calls)."""
    rollout = call.nearest(c.KIND_ROLLOUT)
    state = rollout.rollout_state if rollout is not None else None
    if state is None:
        return
    totals = state.tokens
    if totals is None:
        totals = state.tokens = [0, 0]
    totals[0] += tokens_in or 0
    totals[1] += tokens_out or 0


# -- outcome records: an outcome decided where the entry's span cannot say it -----------------------


def _record_identity(frame: ActiveScope, attempt: int) -> dict[str, Any]:
    """A ``gym.outcome`` record's identity and kind, for attempt ``attempt`` of ``frame``'s rollout."""
    # The group too: a record is a span below the rollout, and every such span carries it (issue 44);
    # a reader whose input lacks the rollout span (sampled out, lost) still finds the group here.
    attributes: dict[str, Any] = {
        k: v for k, v in frame.identity.items() if k in ROLLOUT_IDENTITY or k == c.GROUP_ID
    }
    rollout_id = attributes.get(c.ROLLOUT_ID)
    attributes[c.EPISODE_ATTEMPT] = attempt
    if isinstance(rollout_id, str):
        attributes[c.EPISODE_ID] = episode_id(rollout_id, attempt)
    attributes[c.KIND] = c.KIND_OUTCOME
    return attributes


def emit_outcome(frame: ActiveScope, source: str) -> None:
    """Record ``frame``'s outcome (an episode's, or a rollout's) as a ``gym.outcome`` span in the
    rollout's trace: the outcome was decided where the rollout span cannot carry it (see docs/results.md,
    "Late and remote outcomes"). Readers take, per rollout, the candidate with the highest
    concluded attempt, a record beating the rollout root on a tie."""
    tracer = active_tracer()
    if tracer is None:
        untraced_worker("an outcome")
        return
    episode = frame if frame.kind == c.KIND_EPISODE else None
    if episode is not None:
        rollout = episode.parent.nearest(c.KIND_ROLLOUT) if episode.parent is not None else None
    else:
        rollout = frame
    decision = frame.decision()
    attempt = decision.attempt
    attributes = _record_identity(frame, attempt)
    # A record concludes what was recorded: it is never pending itself.
    attributes[c.ROLLOUT_OUTCOME] = c.OUTCOME_SCORED if decision.scored else c.OUTCOME_UNSCORED
    if decision.reward is not None:
        attributes[c.REWARD] = decision.reward
    attributes[c.ROLLOUT_ATTEMPTS] = attempt + 1
    attributes[c.OUTCOME_SOURCE] = source
    if episode is not None and episode.failure is not None:
        attributes[c.FAILURE_KIND] = episode.failure[0]
        attributes[c.FAILURE_RETRYABLE] = episode.failure[1]
    # In the rollout's trace: under the rollout span where it is known, else under the span the
    # context was continued from.
    if rollout is not None:
        parent = rollout.span.get_span_context()
    elif episode is not None and episode.parent_span_context is not None:
        parent = episode.parent_span_context
    else:
        parent = frame.span.get_span_context()
    links = None
    if episode is not None and not episode.remote and episode.span.get_span_context().is_valid:
        links = [trace.Link(episode.span.get_span_context(), {c.LINK_RELATION: c.RELATION_OUTCOME})]
    context = trace.set_span_in_context(trace.NonRecordingSpan(parent), otel_context.Context())
    record = tracer.start_span(c.SPAN_OUTCOME, context=context, attributes=attributes, links=links)
    record.end()
    # A fact for the rollout's count in the process that owns it, if that is this one (_metrics);
    # with the episode's own outcome when its span, ending now, says it (the readers read that too).
    ending = episode is not None and not episode.remote and not episode.ended
    fact = episode.attempt_fact() if ending and episode is not None else None
    _metrics.outcome_recorded(
        record.get_span_context().trace_id,
        attributes.get(c.ROLLOUT_ID),
        attributes,
        record,
        (fact.number, fact.state) if fact is not None else None,
    )


def emit_lost_attempt(rollout: ActiveScope, attempt: int, message: str) -> SpanContext | None:
    """Record attempt ``attempt`` of ``rollout`` as failed (``infrastructure``, retryable) with a
    ``gym.outcome`` span: its run ended without a result and without spans (a worker that died), and
    a re-run goes on. Its context, for the next attempt's ``retry`` link; None when nothing exports."""
    tracer = active_tracer()
    if tracer is None:
        untraced_worker("a lost attempt")
        return None
    attributes = _record_identity(rollout, attempt)
    attributes[c.ROLLOUT_OUTCOME] = c.OUTCOME_UNSCORED
    attributes[c.ROLLOUT_ATTEMPTS] = attempt + 1
    attributes[c.OUTCOME_SOURCE] = c.SOURCE_REMOTE
    attributes[c.FAILURE_KIND] = c.FAILURE_INFRASTRUCTURE
    attributes[c.FAILURE_RETRYABLE] = True
    parent = rollout.span.get_span_context()
    context = trace.set_span_in_context(trace.NonRecordingSpan(parent), otel_context.Context())
    record = tracer.start_span(c.SPAN_OUTCOME, context=context, attributes=attributes)
    record.set_status(Status(StatusCode.ERROR, message))
    record.end()
    # A fact, not a count: the rollout's final outcome is still to come (_metrics).
    _metrics.outcome_recorded(
        record.get_span_context().trace_id, attributes.get(c.ROLLOUT_ID), attributes, record
    )
    found = record.get_span_context()
    return found if found.is_valid else None


class ActiveScope:
    """One activation of a gym scope: its span, its identity and its outcome state.

    ``with gymtrace.episode() as ep:`` binds ``ep`` to one; decorated functions reach theirs with
    :func:`gymtrace.current_scope`.
    """

    # The activation's own state (every level has it) and one holder per level-owned concern
    # (_scopes/state.py), None until a level that owns it needs it: a step allocates none.
    __slots__ = (
        "attempt",
        "cancelled",
        "context",
        "counter",
        "ended",
        "episode_state",
        "failure",
        "handed_off",
        "identity",
        "kind",
        "level",
        "owner",
        "parent",
        "remote",
        "reward",
        "rollout_state",
        "span",
        "step_timing",
        "thread",
        "token",
        "train_state",
        "unsampled",
    )

    def __init__(
        self, kind: str, parent: ActiveScope | None, owner: object = None, level: Any = None
    ) -> None:
        self.kind = kind
        # The level's description (a ``_scopes.levels.Level``); None for remote and disabled frames.
        self.level = level
        self.parent = parent
        # The Scope object this is an activation of (None for remote and disabled frames).
        self.owner = owner
        self.span: trace.Span = trace.INVALID_SPAN
        self.identity: dict[str, str | int] = parent.identity if parent is not None else {}
        self.context: otel_context.Context | None = None
        # A rollout's attempts (made by its level, or at a remote rollout's first attempt).
        self.rollout_state: RolloutState[ActiveScope] | None = None
        # An episode's restore flag, remote rollout span and start (made by its level).
        self.episode_state: EpisodeState | None = None
        # A numbering owner's turn and step counters, continuation ranges and step statistics
        # (made at its first turn or step, or when a continuation or policy sets them).
        self.counter: StepCounter | None = None
        # A train step's consumed rollouts not yet written (made by its level).
        self.train_state: TrainState | None = None
        # A carrier or continuation headers were taken in this episode (or on this rollout outside
        # its episodes): the attempt's outcome may come from there (see hand_off()).
        self.handed_off = False
        # The outcome state of whichever level records one (episode, rollout, verify).
        self.attempt: int | None = None
        self.reward: float | None = None
        self.failure: Failure | None = None
        self.cancelled = False
        # Its span has ended: what is recorded now is a late outcome.
        self.ended = False
        # It stands for a scope of another process (gymtrace.propagation): it has no span here.
        self.remote = False
        # A step under the aggregate step policy (_steps.py): (statistics, number, start time in ns,
        # whether it is a span).
        self.step_timing: tuple[Any, int, int, bool] | None = None
        # Entered by a `with` block: the token of the context it attached, which its exit detaches.
        self.token: object = None
        # Entered by a `with` block: the thread that entered it, so that an exit in another context
        # ends this thread's activation of a shared scope object, never another thread's.
        self.thread = 0
        # On a step's parent: the steps the aggregate policy did not sample that are open in a
        # `with` block, innermost first, as (frame, the ones below) or None. They attach nothing,
        # so their exit finds them here, on the frame that is current.
        self.unsampled: tuple[ActiveScope, Any] | None = None

    def _rollout(self) -> RolloutState[ActiveScope]:
        """Its rollout state, made at first use (a frame standing for another process's rollout)."""
        state = self.rollout_state
        if state is None:
            state = self.rollout_state = RolloutState()
        return state

    def _episode(self) -> EpisodeState:
        state = self.episode_state
        if state is None:
            state = self.episode_state = EpisodeState()
        return state

    def _counter(self) -> StepCounter:
        counter = self.counter
        if counter is None:
            counter = self.counter = StepCounter()
        return counter

    # -- the level-owned state under its former names (read rarely: never on a hot path) -------

    @property
    def counted(self) -> bool:
        """For a rollout: counted in ``gym.rollout.completed`` by this process."""
        state = self.rollout_state
        return state is not None and state.counted

    @counted.setter
    def counted(self, value: bool) -> None:
        self._rollout().counted = value

    @property
    def lost_attempt(self) -> tuple[int, str] | None:
        """For a rollout continued in a re-run of a task: (the attempt the lost run was, why), until
        the first episode opened here records it (see :meth:`rerun`)."""
        state = self.rollout_state
        return state.lost_attempt if state is not None else None

    @lost_attempt.setter
    def lost_attempt(self, value: tuple[int, str] | None) -> None:
        self._rollout().lost_attempt = value

    @property
    def started_ns(self) -> int:
        """For a rollout or episode: when it started (ns since the epoch)."""
        state = self.episode_state or self.rollout_state
        if state is None or not state.started_ns:
            raise AttributeError("started_ns: set only on rollouts and episodes")
        return state.started_ns

    @started_ns.setter
    def started_ns(self, value: int) -> None:
        (self._episode() if self.kind == c.KIND_EPISODE else self._rollout()).started_ns = value

    @property
    def restored(self) -> bool:
        """For an episode: opened from a checkpoint (``restored_from=``)."""
        state = self.episode_state
        return state is not None and state.restored

    @restored.setter
    def restored(self, value: bool) -> None:
        self._episode().restored = value

    @property
    def parent_span_context(self) -> SpanContext | None:
        """For an episode continued from a carrier: the rollout span it belongs to (elsewhere)."""
        state = self.episode_state
        return state.parent_span_context if state is not None else None

    @parent_span_context.setter
    def parent_span_context(self, value: SpanContext | None) -> None:
        self._episode().parent_span_context = value

    @property
    def step_stats(self) -> Any:
        """For a step owner: its steps' statistics under a step policy that counts (_steps.py)."""
        counter = self.counter
        return counter.stats if counter is not None else None

    @step_stats.setter
    def step_stats(self, value: Any) -> None:
        self._counter().stats = value

    @property
    def step_jump(self) -> int:
        """A continuation in another process: after its first (reserved) step number, where its next
        steps number from (see :meth:`continue_steps_from`); 0 once used."""
        counter = self.counter
        return counter.jump if counter is not None else 0

    @step_jump.setter
    def step_jump(self, value: int) -> None:
        self._counter().jump = value

    @property
    def step_limit(self) -> int:
        """Once this scope's step numbers share the episode with a continuation's range: the first
        number that would enter another part's range (0: no such limit)."""
        counter = self.counter
        return counter.limit if counter is not None else 0

    @step_limit.setter
    def step_limit(self, value: int) -> None:
        self._counter().limit = value

    # -- reading -------------------------------------------------------------------------------

    @property
    def trace_id(self) -> str:
        return trace.format_trace_id(self.span.get_span_context().trace_id)

    @property
    def span_id(self) -> str:
        return trace.format_span_id(self.span.get_span_context().span_id)

    @property
    def attempts_started(self) -> int:
        """For a rollout: how many episodes it has opened."""
        state = self.rollout_state
        return state.episodes if state is not None else 0

    @property
    def steps_started(self) -> int:
        """For a step owner: the number of the last step started below it (0: none yet)."""
        counter = self.counter
        return counter.next_step - 1 if counter is not None else 0

    @property
    def last_episode(self) -> ActiveScope | None:
        """For a rollout: its most recent episode (the final one once the rollout ends)."""
        state = self.rollout_state
        return state.last_episode if state is not None else None

    def nearest(self, *kinds: str) -> ActiveScope | None:
        frame: ActiveScope | None = self
        while frame is not None:
            if frame.kind in kinds:
                return frame
            frame = frame.parent
        return None

    def attempt_fact(self) -> Attempt:
        """For an episode: how it ended (so far), as the outcome rule reads it."""
        if self.cancelled:
            state = CANCELLED
        elif self.failure is not None:
            state = FAILED
        else:
            state = COMPLETED
        return Attempt(
            self.attempt if self.attempt is not None else 0, state, self.reward, (), False, self.handed_off
        )

    def outcome_facts(self) -> Facts:
        """For a rollout: what was recorded about it that bears on its outcome (``_model.outcome_rule``)."""
        state = self.rollout_state
        if state is not None:
            final = state.last_episode
            attempts = (*state.earlier_attempts, final.attempt_fact()) if final is not None else ()
            episodes = state.episodes
        else:
            attempts, episodes = (), 0
        # Without episodes the rollout is its own attempt: what ended it is that attempt's failure.
        failure = self.failure[0] if self.failure is not None else None
        if failure is None and self.cancelled:
            failure = c.OUTCOME_CANCELLED
        # Positional: keywords cost a named tuple twice the time, at every rollout's end.
        return Facts(attempts, self.reward, failure, self.handed_off, episodes)

    def decision(self) -> Decision:
        """For a rollout: its outcome by the one rule; for an episode, the outcome it concludes."""
        if self.kind == c.KIND_EPISODE:
            return decide(Facts(attempts=(self.attempt_fact(),)))
        return decide(self.outcome_facts())

    # -- what user code records on it, and the rules of where it lands (functions above) --
    set_reward = set_reward
    set_failure = set_failure
    fail_unless_classified = fail_unless_classified
    set_attribute = set_attribute
    record_reward = record_reward
    record_failure = record_failure
    record_usage = record_usage
    record_content = record_content
    carrier = carrier
    hand_off = hand_off

    # -- numbering (turns, steps, attempts) -------------------------------------------------

    def take_number(self, kind: str, explicit: int | None) -> int:
        """The next turn or step number of this owner (1, 2, 3...), or ``explicit``."""
        with _counter_lock:
            counter = self.counter
            if counter is None:
                counter = self.counter = StepCounter()
            if kind == c.KIND_TURN:
                number = counter.next_turn if explicit is None else explicit
                counter.next_turn = max(counter.next_turn, number + 1)
                return number
            number = counter.next_step if explicit is None else explicit
            counter.next_step = max(counter.next_step, number + 1)
            if counter.jump and explicit is None:
                counter.next_step, counter.jump = counter.jump, 0
                return number
            if not (number >= counter.limit > 0 and explicit is None):
                return number
            counter.limit = 0  # said once
        # Past this part's range (reported outside the lock: strict mode raises).
        contract_problem(
            ("step range", id(self)),
            GymTraceError(
                f"{self.kind} {self.identity.get(c.EPISODE_ID) or self.identity.get(c.ROLLOUT_ID)!r} numbered"
                f" step {number}: more than {STEP_RANGE - 1} steps in one process's part of an episode"
                " that was continued elsewhere, so its step numbers may repeat another part's;"
                " split the work into more hand-offs (each part gets its own range)"
            ),
        )
        return number

    def reserve_step(self) -> int:
        """A step number for work continued in another process (``propagation``): its first step.
        From the first hand-off, this scope's own numbers are bounded by the continuations' ranges."""
        number = self.take_number(c.KIND_STEP, None)
        with _counter_lock:
            counter = self._counter()
            if counter.limit == 0 and counter.next_step < STEP_RANGE:
                counter.limit = STEP_RANGE
        return number

    def continue_steps_from(self, base: int) -> None:
        """A continuation of the caller's scope in another process, given the step number ``base``
        the caller reserved for it: its first step is ``base``; any further steps number from
        ``base * STEP_RANGE + 1``, a range no other continuation and (below ``STEP_RANGE`` steps)
        not the caller itself uses, so the numbers of one episode stay unique across processes."""
        ranged = (base + 1) * STEP_RANGE <= MAX_STEP_NUMBER
        if not ranged:
            contract_problem(
                ("step range", "nested"),
                GymTraceError(
                    f"a continuation given step number {base} has no range of step numbers left within"
                    " int64 (continuations nested more than two levels deep in one episode): its steps"
                    " number on from it and may repeat other parts' numbers"
                ),
            )
        with _counter_lock:
            counter = self._counter()
            counter.next_step = base
            if ranged:
                counter.jump = base * STEP_RANGE + 1
                counter.limit = (base + 1) * STEP_RANGE

    def next_attempt(self) -> int:
        """For a rollout: the attempt number its next episode gets."""
        state = self.rollout_state
        return state.next_attempt if state is not None else 0

    def rerun(self, attempt: int, message: str) -> None:
        """For a rollout: the work here is re-run number ``attempt`` of work continued from another
        process whose earlier run ended without a result (a worker that died). Its episodes number
        from ``attempt``, and the first records attempt ``attempt - 1`` as failed and links to it."""
        with _counter_lock:
            state = self._rollout()
            state.next_attempt = max(state.next_attempt, attempt)
            state.lost_attempt = (attempt - 1, message)

    def take_lost_attempt(self) -> tuple[int, str] | None:
        """For a rollout: the lost attempt :meth:`rerun` noted, once."""
        with _counter_lock:
            state = self.rollout_state
            if state is None:
                return None
            lost, state.lost_attempt = state.lost_attempt, None
        return lost

    def attempt_recorded(self, attempt: int) -> bool:
        """For a rollout: whether an episode of it already took attempt number ``attempt``."""
        state = self.rollout_state
        if state is None or state.last_episode is None:
            return False
        return state.last_episode.attempt == attempt or any(
            a.number == attempt for a in state.earlier_attempts
        )

    def add_episode(self, episode: ActiveScope, attempt: int, reused: bool = False) -> None:
        """For a rollout: ``episode`` is its newest attempt. An attempt number given again
        (``reused``, see :meth:`attempt_recorded`; reported by the caller) records that attempt
        again: the last recorded counts, and it is one attempt."""
        with _counter_lock:
            state = self._rollout()
            state.next_attempt = max(state.next_attempt, attempt + 1)
            if not reused:
                state.episodes += 1
            if state.last_episode is not None:
                state.earlier_attempts.append(state.last_episode.attempt_fact())
            state.last_episode = episode

    def __repr__(self) -> str:
        return f"<ActiveScope {self.kind} {self.identity}>"

    def __reduce_ex__(self, protocol: object) -> Any:
        # An activation is this process's: its span, its place in the context, its locks. What
        # another process (or a later phase) needs is its carrier; say so instead of a lock error.
        raise TypeError(
            f"cannot pickle an ActiveScope ({self.kind} {self.identity.get(c.ROLLOUT_ID)!r}): it is an open"
            " scope of this process. Pass its carrier instead: scope.carrier() (a small JSON-safe dict;"
            " continue with gymtrace.propagation.attach(carrier), or open the next attempt with"
            " gymtrace.episode(continue_from=carrier)), or headers from"
            " gymtrace.propagation.inject({}, destination=url, continuation=True)"
        )


# A stand-in handed to `with ... as s` while tracing is off, so user code that calls
# s.record_reward() or reads s.identity keeps working at no cost.
DISABLED_SCOPE = ActiveScope(DISABLED_KIND, None)


def current_active_scope() -> ActiveScope | None:
    value = current_context().get(SCOPE_KEY)
    return value if isinstance(value, ActiveScope) else None


def active_scope_for(scope: ActiveScope | None, caller: str, kinds: tuple[str, ...]) -> ActiveScope | None:
    """The frame a module-level ``record_*(…, scope=None)`` call acts on: ``scope`` or the current
    one; ``None`` when there is nothing to record (tracing off and no scope given). Outside every gym
    scope the problem is reported as the caller's."""
    if scope is not None:
        return scope
    if active_tracer() is None:
        frame = current_active_scope()
        if frame is not None and frame.remote:
            untraced_worker(caller)
        return None
    frame = current_active_scope()
    if frame is None:
        data_lost(GymTraceError(outside(caller, kinds, None)))
    return frame
