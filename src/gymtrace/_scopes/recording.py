"""What user code records on an open scope: reward, failure, usage, content, attributes, carriers.

Methods of :class:`~gymtrace._scopes.frame.ActiveScope` (bound in its class body, so a call costs
what a method defined there costs), apart from the activation because this is the public recording
surface with its validation and its rules of where a record lands: a reward
goes to the nearest episode or rollout (after the rollout's final episode ended, to that episode),
a failure to the episode, usage to the model call, content to the nearest level that takes it, and
anything recorded once the span ended, or on a scope of another process, becomes an outcome record
(``_scopes/outcome_spans.py``). Every method here never raises into user code, except in strict
mode for misuse.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gymtrace import _constants as c
from gymtrace import _content
from gymtrace._model.errors import GymTraceError, InvalidArgumentError, contract_problem, data_lost, guard
from gymtrace._model.failures import qualified_name, retryable_by_default
from gymtrace._model.ids import ROLLOUT_IDENTITY, check_index, check_reward
from gymtrace._scopes.outcome_spans import emit_outcome
from gymtrace._scopes.scope_carrier import CARRIER_FORMAT, span_ref

if TYPE_CHECKING:
    from gymtrace._scopes.activation import Activation

# The kind of the stand-in frame a `with` block gets while tracing is off.
DISABLED_KIND = "disabled"


def set_reward(self: Activation, number: float) -> bool:
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
    self: Activation,
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


def fail_unless_classified(self: Activation, kind: str, retryable: bool) -> None:
    """An exception escaped the episode: it failed, unless record_failure() already said how."""
    if self.failure is None:
        self.failure = (kind, retryable, None)


# -- the public methods (never raise, except in strict mode for misuse) --------------------


def set_attribute(self: Activation, key: str, value: Any) -> None:
    """Set an attribute on this scope's span (never raises)."""
    with guard("Activation.set_attribute"):
        self.span.set_attribute(key, value)


def record_reward(self: Activation, value: float) -> None:
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
    self: Activation,
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
    self: Activation,
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


def record_content(self: Activation, input: object = None, output: object = None) -> None:
    """Record prompts/messages or tool arguments/results on this scope; off by default
    (see :func:`gymtrace.record_content`)."""
    if self.kind == DISABLED_KIND or not _content.capturing() or (input is None and output is None):
        return
    with guard("record_content"):
        target: Activation | None = self
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


def carrier(self: Activation) -> dict[str, Any]:
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


def hand_off(self: Activation) -> None:
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


def find_target(self: Activation, kinds: tuple[str, ...], caller: str) -> Activation | None:
    target = self.nearest(*kinds)
    if target is None:
        data_lost(GymTraceError(outside(caller, kinds, self)))
    return target


def outside(caller: str, kinds: tuple[str, ...], frame: Activation | None) -> str:
    """The message for a record_*() call that nothing can be attributed to: the reason and the fix."""
    where = f"inside {frame.kind}" if frame is not None else "outside every gym scope"
    # Said conditionally: this process cannot know how a sender injected, and a carrier with no
    # identity is also what a caller outside the gym sends (issue 43).
    fix = (
        "open the scope around the call, or pass scope= (an Activation, also after its span ended)."
        " If it was meant for a gym scope in another process, continue that scope here with"
        " gymtrace.propagation.attach(carrier), and the sender must inject the carrier with"
        " gymtrace.propagation.inject(carrier, continuation=True) or"
        " gymtrace.propagation.inject(carrier, destination=URL): a carrier injected with neither"
        " carries no gym identity"
    )
    return (
        f"gymtrace.{caller}() was called {where}, not in any {' or '.join(kinds)} scope; dropped. Fix: {fix}"
    )


def _count_dropped_tokens(call: Activation, tokens_in: int | None, tokens_out: int | None) -> None:
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
