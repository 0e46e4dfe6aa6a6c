"""Trace Inspect AI evaluations: ``gymtrace.integrations.inspect_ai.instrument()``.

Example::

    import gymtrace
    import gymtrace.integrations.inspect_ai

    gymtrace.configure(service_name="my-eval")
    gymtrace.integrations.inspect_ai.instrument()   # registers gymtrace through Inspect's hooks
    inspect_ai.eval(my_task(), model="openai/gpt-4o", epochs=2, retry_on_error=1)

How an evaluation maps onto the gym vocabulary (docs/contract/spans.md):

- An Inspect run (one ``eval()`` call) is a ``gym.run``; ``gym.run.id`` is Inspect's run ID. Inside
  the caller's own ``gymtrace.run()`` the samples are that run's rollouts instead.
- Each sample x epoch is a rollout. ``gym.task.id`` is ``{task name}.{sample id}`` and
  ``gym.rollout.id`` is ``{task name}.{sample id}.r{repeat}``, where ``repeat`` = epoch - 1
  (Inspect's epochs are 1-based, repeats 0-based). Characters other than ``A-Z a-z 0-9 . _ -``
  in a task name or sample ID become ``_``, so IDs match ``^[A-Za-z0-9][A-Za-z0-9._-]*$`` (prefixed
  with ``s`` when they would start otherwise).
- Each attempt of a sample is an episode: ``gym.episode.attempt`` = Inspect's attempt - 1. A sample
  that errors and is re-run by ``retry_on_error`` is the next attempt of the same rollout, linked
  to the failed one (``gym.failure.kind=error``, ``gym.failure.retryable=true`` when Inspect retried
  it). A sample that ends in error is unscored.
- The solver runs inside the episode; every model ``generate()`` is a ``chat {model}`` span with
  ``gen_ai.usage.input_tokens``/``output_tokens`` from the model's reported usage.
- Scoring is the episode's ``gym.verify`` span. The rollout and episode spans stay open until the
  score is known (Inspect's ``on_sample_end``), so the reward is recorded in the rollout's own
  trace, not as a late outcome.
- The reward is the first scorer's value (or the scorer named by ``instrument(scorer=...)``),
  mapped to a number by Inspect's own ``value_to_float()``: numbers as they are, ``True``/``False``
  as 1/0, ``"C"``/``"I"`` (correct/incorrect) as 1/0, ``"P"`` (partial) as 0.5, ``"N"`` (no
  answer) as 0, ``"yes"``/``"no"``/``"true"``/``"false"`` as 1/0, numeric strings as their number.
  A list or dict value has no single reward: the rollout stays unscored (logged).

Spans are held per sample in contexts of their own: Inspect runs samples concurrently, and its
hooks for one sample can interleave with another's.
"""

from __future__ import annotations

import contextvars
import re
from collections import deque
from typing import Any

from opentelemetry import trace

import gymtrace
from gymtrace import attributes as c
from gymtrace.instrumentation import (
    check_tracer_provider,
    report_error,
    use_tracer_provider,
    warn,
)

__all__ = ["SampleError", "instrument", "reward_of"]

_HOOK_NAME = "gymtrace"
_installed: dict[str, Any] = {}
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def _safe(text: object) -> str:
    value = _UNSAFE.sub("_", str(text))
    return value if value[:1].isalnum() else f"s{value}"


def reward_of(value: Any) -> float | None:
    """The reward of an Inspect score value, or ``None`` when it has none (see the module doc)."""
    from inspect_ai.scorer import value_to_float

    if isinstance(value, (list, dict)) or value is None:
        return None
    return float(value_to_float()(value))


def _exit(scope: gymtrace.Scope, exc: BaseException | None = None) -> None:
    if exc is None:
        scope.__exit__(None, None, None)
    else:
        scope.__exit__(type(exc), exc, exc.__traceback__)


class _Sample:
    """The open spans of one sample x epoch (a rollout): held between hook calls."""

    __slots__ = (
        "attached",
        "context",
        "episode",
        "frame",
        "model_calls",
        "rollout",
        "run_id",
        "uuid",
        "verify",
    )

    def __init__(self, uuid: str, run_id: str, context: contextvars.Context, rollout: gymtrace.Scope) -> None:
        self.uuid = uuid
        self.run_id = run_id
        self.context = context
        self.rollout = rollout
        self.episode: gymtrace.Scope | None = None
        self.frame: gymtrace.ActiveScope | None = None
        self.verify: gymtrace.Scope | None = None
        self.model_calls: deque[tuple[contextvars.Context, gymtrace.Scope, gymtrace.ActiveScope]] = deque()
        # Tokens of what attempt_start attached in the sample's own context (see _attach).
        self.attached: list[tuple[Any, Any]] = []


class SampleError(Exception):
    """An Inspect sample's error (Inspect keeps its message, not the exception), recorded on the
    failed episode: ``error.type`` is ``gymtrace.integrations.inspect_ai.SampleError``."""


class _Tracer:
    """What the hooks do, kept out of the Hooks subclass so it needs no Inspect import to read."""

    def __init__(self, scorer: str | None) -> None:
        self.scorer = scorer
        self.tasks: dict[str, str] = {}  # eval_id -> task name
        self.runs: dict[str, tuple[contextvars.Context, gymtrace.Scope | None]] = {}
        self.samples: dict[str, _Sample] = {}

    # -- run and task ------------------------------------------------------------------------------

    def run_start(self, run_id: str) -> None:
        context = contextvars.copy_context()
        current = gymtrace.current_scope()
        if current is not None and current.nearest(c.KIND_RUN) is not None:
            # eval() called inside the caller's own gymtrace.run(): the samples are its rollouts.
            self.runs[run_id] = (context, None)
            return
        scope = gymtrace.run(run_id=run_id)
        context.run(scope.__enter__)
        self.runs[run_id] = (context, scope)

    def run_end(self, run_id: str, exception: BaseException | None) -> None:
        # Samples Inspect never ended (the eval was cancelled or crashed): end them cancelled, so
        # their spans are exported and nothing accumulates across runs.
        for uuid, sample in list(self.samples.items()):
            if sample.run_id == run_id:
                del self.samples[uuid]
                sample.context.run(_cancel, sample)
        context, scope = self.runs.pop(run_id, (None, None))
        if context is not None and scope is not None:
            context.run(_exit, scope, exception)

    def task_start(self, eval_id: str, task_name: str) -> None:
        self.tasks[eval_id] = task_name

    def task_end(self, eval_id: str) -> None:
        self.tasks.pop(eval_id, None)

    # -- samples -------------------------------------------------------------------------------------

    def attempt_start(self, run_id: str, eval_id: str, uuid: str, summary: Any, attempt: int) -> None:
        sample = self.samples.get(uuid)
        if sample is None:
            run = self.runs.get(run_id)
            # Each rollout's context descends from the run's, so it links to the run.
            context = run[0].run(contextvars.copy_context) if run else contextvars.copy_context()
            task = _safe(self.tasks.get(eval_id, "task"))
            repeat = max(int(summary.epoch) - 1, 0)
            task_id = f"{task}.{_safe(summary.id)}"
            rollout = gymtrace.rollout(rollout_id=f"{task_id}.r{repeat}", task_id=task_id, repeat=repeat)
            context.run(rollout.__enter__)
            sample = self.samples[uuid] = _Sample(uuid, run_id, context, rollout)
        episode = gymtrace.episode(attempt=max(attempt - 1, 0))
        sample.frame = sample.context.run(episode.__enter__)
        sample.episode = episode
        _attach(sample)

    def attempt_end(self, uuid: str, error: Any, will_retry: bool) -> None:
        sample = self.samples.get(uuid)
        if sample is None or sample.episode is None or error is None:
            return  # a successful attempt ends with the sample, once its score is known
        message = str(getattr(error, "message", error))
        sample.context.run(self._fail, sample, message, will_retry)

    @staticmethod
    def _fail(sample: _Sample, message: str, retryable: bool) -> None:
        _close_model_calls(sample)
        if sample.verify is not None:
            _exit(sample.verify)
            sample.verify = None
        assert sample.episode is not None and sample.frame is not None
        error = SampleError(message)
        sample.frame.record_failure(c.FAILURE_ERROR, retryable=retryable, exception=error, message=message)
        _exit(sample.episode, error)
        sample.episode = sample.frame = None

    def scoring(self, uuid: str) -> None:
        sample = self.samples.get(uuid)
        if sample is None or sample.episode is None:
            return

        def open_verify() -> None:
            _close_model_calls(sample)
            verify = gymtrace.verify()
            verify.__enter__()
            sample.verify = verify

        sample.context.run(open_verify)

    def sample_end(self, uuid: str, eval_sample: Any) -> None:
        sample = self.samples.pop(uuid, None)
        if sample is None:
            return
        sample.context.run(self._end, sample, eval_sample)

    def _end(self, sample: _Sample, eval_sample: Any) -> None:
        _detach(sample)
        _close_model_calls(sample)
        error = getattr(eval_sample, "error", None)
        if sample.episode is not None:
            if error is not None:
                self._fail(sample, str(getattr(error, "message", error)), False)
            else:
                reward = self._reward(eval_sample)
                if sample.verify is None and reward is not None:
                    sample.verify = gymtrace.verify()
                    sample.verify.__enter__()
                if reward is not None:
                    gymtrace.record_reward(reward)
                if sample.verify is not None:
                    _exit(sample.verify)
                _exit(sample.episode)
        _exit(sample.rollout)

    def _reward(self, eval_sample: Any) -> float | None:
        scores = getattr(eval_sample, "scores", None) or {}
        if not scores:
            return None
        name = self.scorer if self.scorer is not None else next(iter(scores))
        score = scores.get(name)
        if score is None:
            warn(f"Inspect sample has no score {name!r} (scores: {list(scores)}); unscored")
            return None
        reward = reward_of(score.value)
        if reward is None:
            warn(
                f"Inspect score {name!r} has value {score.value!r:.80}, which is no single reward; the"
                " rollout stays unscored (pick a scorer with instrument(scorer=...))"
            )
        return reward

    # -- model calls -----------------------------------------------------------------------------------

    def before_generate(self, model_name: str) -> None:
        # BeforeModelGenerate.sample_id is the attempt's ActiveSample ID, not the sample UUID every
        # other hook gives, so the sample is found through the context attempt_start set.
        sample = _current_sample.get()
        if sample is None or sample.episode is None or self.samples.get(sample.uuid) is not sample:
            return
        provider, _, model = model_name.partition("/")
        scope = gymtrace.model_call(model=model or provider, provider=provider if model else None)
        # Opened in a copy of the solver's context, so it nests under the user's own step or turn.
        context = contextvars.copy_context()
        frame = context.run(scope.__enter__)
        entry = (context, scope, frame)
        sample.model_calls.append(entry)
        # Inspect's usage hook names no sample or call; it runs in this same context afterwards.
        _current_call.set(entry)

    def model_done(self, usage: Any) -> None:
        # Emitted inline by generate() right after the call, in the context before_generate saw.
        entry = _current_call.get()
        sample = _current_sample.get()
        if entry is None or sample is None or entry not in sample.model_calls:
            return
        sample.model_calls.remove(entry)
        context, scope, frame = entry
        if usage is not None:
            frame.record_usage(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens)
        context.run(_exit, scope, None)


def _cancel(sample: _Sample) -> None:
    import asyncio

    _close_model_calls(sample)
    for scope in (sample.verify, sample.episode):
        if scope is not None:
            _exit(scope, asyncio.CancelledError("the Inspect run ended before the sample"))
    _exit(sample.rollout)


def _close_model_calls(sample: _Sample) -> None:
    # A generate() whose event never arrived (cancelled, or the sample errored meanwhile).
    while sample.model_calls:
        context, scope, _ = sample.model_calls.pop()
        context.run(_exit, scope, None)


_current_sample: contextvars.ContextVar[_Sample | None] = contextvars.ContextVar(
    "gymtrace.inspect_ai.sample", default=None
)
_current_call: contextvars.ContextVar[tuple[Any, ...] | None] = contextvars.ContextVar(
    "gymtrace.inspect_ai.model_call", default=None
)


def _attach(sample: _Sample) -> None:
    """Make the episode current in the sample's own context.

    Inspect awaits its sample hooks inline in the sample's coroutine and starts the solver as a
    child task after ``on_sample_attempt_start``, so what is attached here is what the solver (and
    every span it or a model SDK's instrumentation opens) runs in. Detached at the sample's end,
    which Inspect emits from the same coroutine.
    """
    from opentelemetry import context as otel_context

    _detach(sample)  # the previous attempt's, when Inspect retries the sample
    assert sample.frame is not None
    ctx = sample.frame.context
    if ctx is not None:
        sample.attached.append((otel_context, otel_context.attach(ctx)))
    sample.attached.append((_current_sample, _current_sample.set(sample)))


def _detach(sample: _Sample) -> None:
    """Undo _attach when called in the same context (Inspect emits a retry's next attempt and the
    sample's end from the sample's coroutine, but not always in the very context it attached in).
    Elsewhere nothing is undone: the attached context ends with the sample's task."""
    attached, sample.attached = sample.attached, []
    if not attached:
        return
    try:
        # The marker was set last: resetting it first proves this is the context attached in,
        # before OpenTelemetry's detach would log an error for a foreign token.
        _current_sample.reset(attached[-1][1])
    except ValueError:
        return
    for owner, token in attached[:-1]:
        owner.detach(token)


def _call(method: Any, *args: Any) -> None:
    # Inspect would log a hook's exception as a warning of its own; gymtrace reports its own, named.
    # The contexts the hooks copy (a run's, a sample's) keep the provider instrument() was handed.
    try:
        with use_tracer_provider(_installed.get("tracer_provider")):
            method(*args)
    except Exception as exc:  # noqa: BLE001 - telemetry must not break the evaluation
        report_error(f"gymtrace.integrations.inspect_ai hook {method.__name__}", exc)


def instrument(*, scorer: str | None = None, tracer_provider: trace.TracerProvider | None = None) -> None:
    """Register gymtrace with Inspect AI's hooks, once per process (later calls change nothing
    but the scorer and the provider).

    ``scorer``: the name of the scorer whose value is the reward (default: the first scorer).
    ``tracer_provider``: where the run, rollout, episode, verify and model-call spans go, and the
    gymtrace scopes a solver opens (default: the global provider).
    """
    if scorer is not None and (not isinstance(scorer, str) or not scorer):
        raise TypeError(f"instrument(): argument 'scorer' must be a scorer name, got {scorer!r:.60}")
    check_tracer_provider(tracer_provider, "inspect_ai.instrument()")
    _installed["tracer_provider"] = tracer_provider
    if "tracer" in _installed:
        _installed["tracer"].scorer = scorer
        return
    from inspect_ai.hooks import Hooks, hooks

    t = _Tracer(scorer)

    class GymTraceHooks(Hooks):
        async def on_run_start(self, data: Any) -> None:
            _call(t.run_start, data.run_id)

        async def on_run_end(self, data: Any) -> None:
            _call(t.run_end, data.run_id, data.exception)

        async def on_task_start(self, data: Any) -> None:
            _call(t.task_start, data.eval_id, data.spec.task)

        async def on_task_end(self, data: Any) -> None:
            _call(t.task_end, data.eval_id)

        async def on_sample_attempt_start(self, data: Any) -> None:
            _call(t.attempt_start, data.run_id, data.eval_id, data.sample_id, data.summary, data.attempt)

        async def on_sample_attempt_end(self, data: Any) -> None:
            _call(t.attempt_end, data.sample_id, data.error, data.will_retry)

        async def on_sample_scoring(self, data: Any) -> None:
            _call(t.scoring, data.sample_id)

        async def on_sample_end(self, data: Any) -> None:
            _call(t.sample_end, data.sample_id, data.sample)

        async def on_before_model_generate(self, data: Any) -> None:
            _call(t.before_generate, data.model_name)

        async def on_model_usage(self, data: Any) -> None:
            _call(t.model_done, data.usage)

        async def on_model_cache_usage(self, data: Any) -> None:
            _call(t.model_done, data.usage)

    hooks(name=_HOOK_NAME, description="gymtrace: OpenTelemetry traces of samples as gym rollouts")(
        GymTraceHooks
    )
    _installed["tracer"] = t
