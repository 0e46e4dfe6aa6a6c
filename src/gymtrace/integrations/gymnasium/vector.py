"""``TraceEnv`` of a vector environment: one rollout per sub-environment episode, each in its own
context, through every autoreset mode, and ``step_async``/``step_wait`` as one step.

Separate from the single-environment wrapper it extends: the batch bookkeeping is its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import gymtrace
from gymtrace import attributes as c
from gymtrace.instrumentation import (
    report_error,
    warn_once,
)
from gymtrace.integrations.gymnasium.env import _VECTOR_WRAPPER, TraceEnv
from gymtrace.integrations.gymnasium.episodes import (
    _exit,
    _Open,
    _perf_counter_ns,
    _step_scope,
)


class _Batch:
    """One vector step in flight: what ``step`` (or ``step_async``) opened before the call."""

    __slots__ = ("resetting", "sessions", "spans", "start", "stepped")

    def __init__(
        self,
        resetting: list[int],
        sessions: list[tuple[_Open, gymtrace.Scope]],
        stepped: list[int],
        spans: list[tuple[_Open, gymtrace.Scope]],
        start: int,
    ) -> None:
        self.resetting = resetting
        self.sessions = sessions
        self.stepped = stepped
        self.spans = spans
        self.start = start


class _TraceVectorEnv(TraceEnv):
    """``TraceEnv`` of a vector environment: one rollout per sub-environment episode."""

    def __init__(self, env: Any, **kwargs: Any) -> None:
        super().__init__(env, **kwargs)
        from gymnasium.vector import AutoresetMode

        mode = getattr(env, "autoreset_mode", None) or env.metadata.get("autoreset_mode")
        try:
            mode = AutoresetMode(mode) if mode is not None else AutoresetMode.NEXT_STEP
        except ValueError:
            mode = AutoresetMode.NEXT_STEP
        self._self_mode = mode.value
        self._self_num = int(env.num_envs)
        self._self_eps: list[_Open | None] = [None] * self._self_num
        # NextStep autoreset: sub-environments whose episode ended in the previous step, and which
        # the next step() therefore resets instead of stepping.
        self._self_pending: list[bool] = [False] * self._self_num
        self._self_traced = True
        self._self_batch: _Batch | None = None

    def _self_open_sub(self, index: int) -> _Open | None:
        try:
            return self._self_open_episode(index, own_rollout=True)
        except (TypeError, ValueError):
            raise  # the user's rollout_id callable
        except Exception as error:  # noqa: BLE001 - telemetry must not break the environment
            report_error("gymtrace.integrations.gymnasium opening an episode", error)
            return None

    def _self_sessions(self, indices: Sequence[int], seed: Any) -> list[tuple[_Open, gymtrace.Scope]]:
        sessions = []
        for index in indices:
            ep = self._self_eps[index]
            if ep is None or ep.summary:  # sampled out: nothing below its rollout is recorded
                continue
            sub_seed = None
            if isinstance(seed, int):
                sub_seed = seed + index  # what the vector envs give each sub-environment
            elif isinstance(seed, (list, tuple)) and isinstance(seed[index], int):
                sub_seed = seed[index]
            session = gymtrace.seed_session(
                attributes={c.ENV_SEED: sub_seed} if sub_seed is not None else None
            )
            ep.context.run(session.__enter__)
            sessions.append((ep, session))
        return sessions

    def _self_fail_all(self, exc: BaseException, indices: Sequence[int]) -> None:
        for index in indices:
            ep, self._self_eps[index] = self._self_eps[index], None
            if ep is not None:
                self._self_end(ep, exc)

    def reset(self, *, seed: Any = None, options: Any = None) -> Any:
        env = self.__wrapped__
        mask = options.get("reset_mask") if isinstance(options, dict) else None
        indices = [i for i in range(self._self_num) if mask is None or bool(mask[i])]
        current = gymtrace.current_scope()
        if current is not None and current.nearest(c.KIND_ROLLOUT) is not None:
            if self._self_traced:
                warn_once(
                    ("gymtrace.integrations.gymnasium", "vector rollout", id(self)),
                    "TraceEnv of a vector environment opens one rollout per sub-environment"
                    " episode; inside gymtrace.rollout() it would nest rollouts, so it is not traced."
                    " Use it inside gymtrace.run() or no scope.",
                )
            self._self_traced = False
            self._self_cancel_all("environment reset inside a rollout")
            return env.reset(seed=seed, options=options)
        self._self_traced = True
        for index in indices:
            self._self_pending[index] = False
            ep, self._self_eps[index] = self._self_eps[index], None
            if ep is not None:
                self._self_end(ep, asyncio.CancelledError("reset before the episode ended"))
        for index in indices:
            self._self_eps[index] = self._self_open_sub(index)
        sessions = self._self_sessions(indices, seed)
        try:
            result = env.reset(seed=seed, options=options)
        except BaseException as exc:
            for ep, session in sessions:
                ep.context.run(_exit, session, exc)
            self._self_fail_all(exc, indices)
            raise
        for ep, session in sessions:
            ep.context.run(_exit, session, None)
        return result

    def step(self, actions: Any) -> Any:
        env = self.__wrapped__
        if not self._self_traced:
            return env.step(actions)
        batch = self._self_before_step()
        try:
            result = env.step(actions)
        except BaseException as exc:
            self._self_step_failed(batch, exc)
            raise
        self._self_after_step(batch, result)
        return result

    # AsyncVectorEnv's two halves of step(), for code that overlaps them with its own work.

    def step_async(self, actions: Any) -> None:
        env = self.__wrapped__
        if not self._self_traced:
            return env.step_async(actions)  # type: ignore[no-any-return]
        batch = self._self_before_step()
        try:
            env.step_async(actions)
        except BaseException as exc:
            self._self_step_failed(batch, exc)
            raise
        self._self_batch = batch
        return None

    def step_wait(self, *args: Any, **kwargs: Any) -> Any:
        env = self.__wrapped__
        batch, self._self_batch = getattr(self, "_self_batch", None), None
        if batch is None:
            return env.step_wait(*args, **kwargs)
        try:
            result = env.step_wait(*args, **kwargs)
        except BaseException as exc:
            self._self_step_failed(batch, exc)
            raise
        self._self_after_step(batch, result)
        return result

    def _self_before_step(self) -> _Batch:
        num = self._self_num
        eps = self._self_eps
        pending = self._self_pending
        # NextStep: the sub-environments that ended last step are reset by this call; their next
        # episode starts here with the reset as its seed_session.
        resetting = [i for i in range(num) if pending[i]]
        for index in resetting:
            pending[index] = False
            eps[index] = self._self_open_sub(index)
        sessions = self._self_sessions(resetting, None) if resetting else []
        stepped = [i for i in range(num) if eps[i] is not None and not (resetting and i in resetting)]
        spans: list[tuple[_Open, gymtrace.Scope]] = []
        for index in stepped:
            ep = eps[index]
            assert ep is not None
            number = ep.count + 1
            if number <= ep.limit:
                scope = _step_scope(ep, number)
                ep.context.run(scope.__enter__)
                spans.append((ep, scope))
        return _Batch(resetting, sessions, stepped, spans, _perf_counter_ns())

    def _self_step_failed(self, batch: _Batch, exc: BaseException) -> None:
        end = _perf_counter_ns()
        eps = self._self_eps
        for ep, scope in batch.sessions:
            ep.context.run(_exit, scope, exc)
        spanned = {id(ep) for ep, _ in batch.spans}
        for ep, scope in batch.spans:
            ep.add_span(ep.count + 1, end - batch.start, exc)
            ep.context.run(_exit, scope, exc)
        for index in batch.stepped:
            sub = eps[index]
            if sub is not None and id(sub) not in spanned:
                self._self_failed_step(sub, sub.count + 1, batch.start, end, exc)
        self._self_fail_all(exc, range(self._self_num))

    def _self_after_step(self, batch: _Batch, result: Any) -> None:
        ns = _perf_counter_ns() - batch.start
        eps = self._self_eps
        resetting = batch.resetting
        for ep, scope in batch.sessions:
            ep.context.run(_exit, scope, None)
        for ep, scope in batch.spans:
            ep.sampled += 1
            ep.context.run(_exit, scope, None)
        rewards = result[1].tolist()
        ended = (result[2] | result[3]).tolist()
        spanned = {id(ep) for ep, _ in batch.spans} if batch.spans else ()
        for index in batch.stepped:
            sub = eps[index]
            assert sub is not None
            number = sub.count + 1
            sub.add(number, ns)
            if ns > sub.floor and id(sub) not in spanned:
                sub.slower(number, batch.start, ns)
            sub.reward += rewards[index]
        mode = self._self_mode
        for index in range(self._self_num):
            if not ended[index] or (resetting and index in resetting):
                continue
            ended_ep, eps[index] = eps[index], None
            if ended_ep is not None:
                self._self_end(ended_ep, None)
            if mode == "NextStep":
                self._self_pending[index] = True
            elif mode == "SameStep":
                # The sub-environment was reset inside this very step: its next episode starts now.
                eps[index] = self._self_open_sub(index)
                for new, session in self._self_sessions([index], None):
                    new.context.run(_exit, session, None)

    def _self_cancel_all(self, why: str) -> None:
        for index in range(self._self_num):
            self._self_pending[index] = False
            ep, self._self_eps[index] = self._self_eps[index], None
            if ep is not None:
                self._self_end(ep, asyncio.CancelledError(why))

    def __repr__(self) -> str:
        return f"<TraceEnv {self.__wrapped__!r}>"


_VECTOR_WRAPPER.append(_TraceVectorEnv)
