"""Every gym level, used every way: with, async with, bare and called decorator, on every callable kind."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry.trace import SpanKind

import gymtrace
from gymtrace import attributes as c
from gymtrace.testing import CapturedSpans
from tree_asserts import assert_child, by_name

# (factory, expected span name, expected gym.kind, called-decorator kwargs)
LEVELS: list[tuple[Callable[..., Any], str, str, dict[str, Any]]] = [
    (gymtrace.run, "gym.run", c.KIND_RUN, {"run_id": "run-1"}),
    (gymtrace.rollout, "gym.rollout", c.KIND_ROLLOUT, {"rollout_id": "r-1", "task_id": "t-1", "repeat": 0}),
    (gymtrace.episode, "gym.episode", c.KIND_EPISODE, {"attempt": 0}),
    (gymtrace.seed_session, "gym.seed_session", c.KIND_SEED_SESSION, {}),
    (gymtrace.verify, "gym.verify", c.KIND_VERIFY, {}),
    (gymtrace.agent_invocation, "invoke_agent solver", c.KIND_AGENT_INVOCATION, {"agent_name": "solver"}),
    (gymtrace.turn, "gym.turn", c.KIND_TURN, {"number": 1}),
    (gymtrace.step, "gym.step", c.KIND_STEP, {"number": 1}),
    (gymtrace.model_call, "chat m-1", c.KIND_MODEL_CALL, {"model": "m-1", "provider": "openai"}),
    (
        gymtrace.tool_call,
        "execute_tool search",
        c.KIND_TOOL_CALL,
        {"tool_name": "search", "call_id": "call-1"},
    ),
]
LEVEL_IDS = [kind for _, _, kind, _ in LEVELS]

# The bare decorator derives no names from arguments; only tool_call names itself after the function.
BARE_NAMES = {
    c.KIND_AGENT_INVOCATION: "invoke_agent",
    c.KIND_MODEL_CALL: "chat",
}


def _make_targets(decorator: Callable[[Any], Any]) -> dict[str, Callable[[], Any]]:
    """One decorated callable per callable kind; each returns a thunk whose result is comparable."""

    @decorator
    def target(x: int) -> int:
        return x + 1

    @decorator
    async def target_async(x: int) -> int:
        return x + 1

    @decorator
    def target_gen(x: int) -> Any:
        yield x
        yield x + 1
        return "done"

    @decorator
    async def target_agen(x: int) -> Any:
        yield x
        await asyncio.sleep(0)
        yield x + 1

    class Agent:
        factor = 10

        @decorator
        def method(self, x: int) -> int:
            return x * self.factor

        @decorator
        @classmethod
        def klass(cls, x: int) -> int:
            return x * cls.factor

        @classmethod
        @decorator
        def klass_inner(cls, x: int) -> int:
            return x * cls.factor

        @decorator
        @staticmethod
        def static(x: int) -> int:
            return x * 100

    async def collect(agen: Any) -> list[Any]:
        return [item async for item in agen]

    def run_gen() -> Any:
        gen = target_gen(1)
        items = list(gen)
        return items

    return {
        "function": lambda: target(1),
        "coroutine": lambda: asyncio.run(target_async(1)),
        "generator": run_gen,
        "async_generator": lambda: asyncio.run(collect(target_agen(1))),
        "method": lambda: Agent().method(2),
        "classmethod": lambda: Agent.klass(2),
        "classmethod_inner": lambda: Agent.klass_inner(2),
        "staticmethod": lambda: Agent.static(2),
    }


EXPECTED = {
    "function": 2,
    "coroutine": 2,
    "generator": [1, 2],
    "async_generator": [1, 2],
    "method": 20,
    "classmethod": 20,
    "classmethod_inner": 20,
    "staticmethod": 200,
}


@pytest.mark.parametrize("callable_kind", list(EXPECTED))
@pytest.mark.parametrize("form", ["bare", "called"])
@pytest.mark.parametrize(("factory", "name", "kind", "kwargs"), LEVELS, ids=LEVEL_IDS)
def test_decorated_callable_returns_unchanged_and_records_one_child_span(
    captured: CapturedSpans,
    factory: Callable[..., Any],
    name: str,
    kind: str,
    kwargs: dict[str, Any],
    form: str,
    callable_kind: str,
) -> None:
    decorator = factory if form == "bare" else factory(**kwargs)
    thunk = _make_targets(decorator)[callable_kind]
    outer_tracer = captured.tracer_provider.get_tracer("test")
    with outer_tracer.start_as_current_span("outer"):
        result = thunk()
    assert result == EXPECTED[callable_kind]
    spans = captured.spans
    ours = [s for s in spans if s.name != "outer"]
    assert len(ours) == 1, [s.name for s in spans]
    span = ours[0]
    if form == "called":
        assert span.name == name
    elif kind == c.KIND_TOOL_CALL:
        assert span.name.startswith("execute_tool ") and len(span.name) > len(
            "execute_tool "
        )  # the function name
    else:
        assert span.name == BARE_NAMES.get(kind, name)
    assert span.attributes[c.KIND] == kind
    outer = by_name(spans, "outer")
    if kind in (c.KIND_ROLLOUT, c.KIND_TRAIN_STEP):
        # A span of another telemetry is no gym scope: a rollout (or train step) stays the root of
        # its own trace and links to it (issue 44).
        assert span.parent is None
        assert [(link.context.span_id, link.attributes[c.LINK_RELATION]) for link in span.links] == [
            (outer.context.span_id, c.RELATION_CALLER)
        ]
    else:
        assert_child(span, outer)


@pytest.mark.parametrize(("factory", "name", "kind", "kwargs"), LEVELS, ids=LEVEL_IDS)
def test_with_block_opens_span_and_makes_it_current(
    captured: CapturedSpans, factory: Callable[..., Any], name: str, kind: str, kwargs: dict[str, Any]
) -> None:
    with factory(**kwargs) as scope:
        assert gymtrace.current().kind == kind
        assert gymtrace.current_scope() is scope
        assert scope.kind == kind
    assert gymtrace.current().kind is None
    span = captured.one(kind)
    assert span.name == name
    assert span.end_time is not None


@pytest.mark.parametrize(("factory", "name", "kind", "kwargs"), LEVELS, ids=LEVEL_IDS)
def test_async_with_block_opens_span(
    captured: CapturedSpans, factory: Callable[..., Any], name: str, kind: str, kwargs: dict[str, Any]
) -> None:
    async def main() -> str | None:
        async with factory(**kwargs):
            await asyncio.sleep(0)
            return gymtrace.current().kind

    assert asyncio.run(main()) == kind
    assert captured.one(kind).name == name


def test_span_kinds_follow_genai_conventions(captured: CapturedSpans) -> None:
    with gymtrace.agent_invocation(agent_name="a"), gymtrace.step():
        with gymtrace.model_call(model="m"):
            pass
        with gymtrace.model_call(model="local", in_process=True):
            pass
        with gymtrace.tool_call(tool_name="t"):
            pass
    kinds = {s.name: s.kind for s in captured.spans}
    assert kinds["invoke_agent a"] == SpanKind.INTERNAL
    assert kinds["chat m"] == SpanKind.CLIENT
    assert kinds["chat local"] == SpanKind.INTERNAL
    assert kinds["execute_tool t"] == SpanKind.INTERNAL
    assert kinds["gym.step"] == SpanKind.INTERNAL


def test_genai_attributes_on_agent_model_and_tool_spans(captured: CapturedSpans) -> None:
    with gymtrace.agent_invocation(agent_name="solver", invocation_id="inv-7"):
        with gymtrace.model_call(model="gpt-x", provider="openai") as call:
            call.record_usage(input_tokens=120, output_tokens=30, response_model="gpt-x-2026")
        with gymtrace.tool_call(tool_name="search", call_id="call-9"):
            pass
    agent = captured.one(c.KIND_AGENT_INVOCATION)
    assert agent.attributes[c.GEN_AI_OPERATION_NAME] == "invoke_agent"
    assert agent.attributes[c.GEN_AI_AGENT_NAME] == "solver"
    assert agent.attributes[c.GEN_AI_AGENT_ID] == "inv-7"
    model = captured.one(c.KIND_MODEL_CALL)
    assert model.attributes[c.GEN_AI_OPERATION_NAME] == "chat"
    assert model.attributes[c.GEN_AI_REQUEST_MODEL] == "gpt-x"
    assert model.attributes[c.GEN_AI_PROVIDER_NAME] == "openai"
    assert model.attributes[c.GEN_AI_USAGE_INPUT_TOKENS] == 120
    assert model.attributes[c.GEN_AI_USAGE_OUTPUT_TOKENS] == 30
    assert model.attributes[c.GEN_AI_RESPONSE_MODEL] == "gpt-x-2026"
    tool = captured.one(c.KIND_TOOL_CALL)
    assert tool.attributes[c.GEN_AI_OPERATION_NAME] == "execute_tool"
    assert tool.attributes[c.GEN_AI_TOOL_NAME] == "search"
    assert tool.attributes[c.GEN_AI_TOOL_CALL_ID] == "call-9"


def test_record_usage_reaches_model_call_from_decorated_function(captured: CapturedSpans) -> None:
    @gymtrace.model_call(model="m")
    def call_model() -> str:
        gymtrace.record_usage(input_tokens=5, output_tokens=7)
        return "ok"

    assert call_model() == "ok"
    span = captured.one(c.KIND_MODEL_CALL)
    assert (span.attributes[c.GEN_AI_USAGE_INPUT_TOKENS], span.attributes[c.GEN_AI_USAGE_OUTPUT_TOKENS]) == (
        5,
        7,
    )


def test_full_hierarchy_forms_one_tree_per_rollout(captured: CapturedSpans) -> None:
    with gymtrace.run(run_id="run-1"), gymtrace.rollout(rollout_id="r-1", task_id="t-1", repeat=0):
        with gymtrace.episode():
            with gymtrace.seed_session():
                pass
            with gymtrace.agent_invocation(agent_name="a"), gymtrace.turn(), gymtrace.step():
                with gymtrace.model_call(model="m"):
                    pass
                with gymtrace.tool_call(tool_name="t"):
                    pass
            with gymtrace.verify():
                gymtrace.record_reward(1.0)
    spans = captured.spans
    run, rollout = captured.one("run"), captured.one("rollout")
    episode, agent = captured.one("episode"), captured.one("agent_invocation")
    turn, step = captured.one("turn"), captured.one("step")
    # One trace per rollout: the rollout is a root that links to its run.
    assert rollout.parent is None
    assert rollout.get_span_context().trace_id != run.get_span_context().trace_id
    assert [link.context.span_id for link in rollout.links] == [run.get_span_context().span_id]
    assert rollout.links[0].attributes[c.LINK_RELATION] == "run"
    assert_child(episode, rollout)
    assert_child(captured.one("seed_session"), episode)
    assert_child(agent, episode)
    assert_child(turn, agent)
    assert_child(step, turn)
    assert_child(captured.one("model_call"), step)
    assert_child(captured.one("tool_call"), step)
    assert_child(captured.one("verify"), episode)
    assert len(spans) == 10


def test_trace_per_run_nests_rollouts_under_the_run(captured: CapturedSpans) -> None:
    from gymtrace._scopes.levels import set_trace_per

    set_trace_per("run")
    try:
        with gymtrace.run(run_id="run-1"), gymtrace.rollout(rollout_id="r-1"):
            pass
    finally:
        set_trace_per("rollout")
    assert_child(captured.one("rollout"), captured.one("run"))
    assert captured.one("rollout").links == ()


def test_turn_and_step_numbers_count_per_invocation(captured: CapturedSpans) -> None:
    with gymtrace.agent_invocation(agent_name="a"):
        for _ in range(2):
            with gymtrace.turn():
                with gymtrace.step():
                    pass
                with gymtrace.step():
                    pass
    with gymtrace.agent_invocation(agent_name="b"), gymtrace.step():
        pass
    turns = sorted(s.attributes[c.TURN_NUMBER] for s in captured.by_kind("turn"))
    steps = [
        s.attributes[c.STEP_NUMBER] for s in sorted(captured.by_kind("step"), key=lambda s: s.start_time)
    ]
    assert turns == [1, 2]
    assert steps == [1, 2, 3, 4, 1]


def test_explicit_numbers_are_kept_and_defaults_continue_after_them(captured: CapturedSpans) -> None:
    with gymtrace.agent_invocation(agent_name="a"):
        with gymtrace.step(number=5):
            pass
        with gymtrace.step():
            pass
    steps = [
        s.attributes[c.STEP_NUMBER] for s in sorted(captured.by_kind("step"), key=lambda s: s.start_time)
    ]
    assert steps == [5, 6]


def test_decorated_tool_is_named_after_its_function(captured: CapturedSpans) -> None:
    @gymtrace.tool_call(call_id="c-1")
    def lookup_weather(city: str) -> str:
        return city

    lookup_weather("Oslo")
    assert captured.one("tool_call").name == "execute_tool lookup_weather"


def test_callable_arguments_are_applied_to_the_decorated_functions_arguments(captured: CapturedSpans) -> None:
    @gymtrace.rollout(
        rollout_id=lambda row, repeat: f"{row['id']}-r{repeat}",
        task_id=lambda row, repeat: row["id"],
        repeat=lambda row, repeat: repeat,
    )
    def rollout(row: dict[str, str], repeat: int) -> str:
        return gymtrace.current().rollout_id or ""

    assert rollout({"id": "task-3"}, 2) == "task-3-r2"
    span = captured.one("rollout")
    assert span.attributes[c.ROLLOUT_ID] == "task-3-r2"
    assert span.attributes[c.TASK_ID] == "task-3"
    assert span.attributes[c.ROLLOUT_REPEAT] == 2


def test_positional_identity_argument_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match=r"gymtrace\.run\(\) takes its arguments by keyword.*run_id="):
        gymtrace.run("run-1")  # type: ignore[call-overload]


def test_extra_attributes_are_added_without_overriding_gym_names(captured: CapturedSpans) -> None:
    with gymtrace.step(attributes={"harness.phase": "explore", c.KIND: "not-a-kind"}):
        pass
    span = captured.one("step")
    assert span.attributes["harness.phase"] == "explore"
    assert span.attributes[c.KIND] == "step"


def test_scope_object_can_be_reentered(captured: CapturedSpans) -> None:
    scope = gymtrace.tool_call(tool_name="composite")  # a tool may call a tool
    with scope, scope:
        pass
    steps = captured.by_kind("tool_call")
    assert len(steps) == 2
    inner, outer = steps  # the inner ends first
    assert_child(inner, outer)


def test_generator_wrapper_is_still_a_generator_function() -> None:
    @gymtrace.step
    def gen() -> Any:
        yield 1

    @gymtrace.step
    async def agen() -> Any:
        yield 1

    @gymtrace.step
    async def coro() -> None:
        return None

    assert inspect.isgeneratorfunction(gen)
    assert inspect.isasyncgenfunction(agen)
    assert inspect.iscoroutinefunction(coro)


def test_record_usage_records_cache_hits_response_id_finish_reasons_and_time_to_first_token(
    captured: CapturedSpans,
) -> None:
    with gymtrace.step(), gymtrace.model_call(model="m") as call:
        call.record_usage(
            input_tokens=900,
            output_tokens=12,
            cached_input_tokens=768,
            response_id="chatcmpl-1",
            finish_reasons=["tool_calls"],
            time_to_first_token=0.25,
        )
    span = captured.one(c.KIND_MODEL_CALL)
    assert span.attributes[c.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 768
    assert span.attributes[c.GEN_AI_RESPONSE_ID] == "chatcmpl-1"
    assert tuple(span.attributes[c.GEN_AI_RESPONSE_FINISH_REASONS]) == ("tool_calls",)
    assert span.attributes[c.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] == 0.25


@pytest.mark.parametrize(
    ("argument", "value"),
    [("finish_reasons", "stop"), ("time_to_first_token", -1.0), ("cached_input_tokens", -3)],
)
def test_record_usage_names_the_bad_argument_in_strict_mode(
    captured: CapturedSpans, argument: str, value: object
) -> None:
    from gymtrace._model.errors import set_strict

    set_strict(True)
    try:
        with (
            gymtrace.model_call(model="m") as call,
            pytest.raises(gymtrace.InvalidArgumentError, match=argument),
        ):
            call.record_usage(**{argument: value})  # type: ignore[arg-type]
    finally:
        set_strict(None)


def test_with_blocks_given_the_same_plain_values_record_each_block(captured: CapturedSpans) -> None:
    # Scopes given equal plain values are shared: each block must still be its own span.
    for number in (1, 1):
        with gymtrace.agent_invocation(agent_name="solver"), gymtrace.step(number=number):
            with gymtrace.tool_call(tool_name="search"), gymtrace.tool_call(tool_name="search"):
                pass
    assert len(captured.by_kind("agent_invocation")) == 2
    assert [s.attributes[c.STEP_NUMBER] for s in captured.by_kind("step")] == [1, 1]
    tools = captured.by_kind("tool_call")
    assert len(tools) == 4
    assert_child(tools[0], tools[1])
    assert all(t.attributes[c.GEN_AI_TOOL_NAME] == "search" for t in tools)


def test_a_bool_or_float_never_takes_the_scope_of_an_equal_int() -> None:
    with gymtrace.testing.capture_spans(strict=True):
        with gymtrace.step(number=1):
            pass
        for value in (True, 1.0):
            with pytest.raises(gymtrace.InvalidArgumentError, match="number"):
                gymtrace.step(number=value)  # type: ignore[arg-type]


def test_a_scope_built_while_off_records_its_arguments_once_tracing_is_on() -> None:
    off = gymtrace.tool_call(tool_name="late")
    with off:
        pass  # nothing records
    with gymtrace.testing.capture_spans() as captured:
        with gymtrace.step():
            with off:
                pass

        @off
        def search() -> int:
            return 1

        with gymtrace.step():
            assert search() == 1
    tools = captured.by_kind("tool_call")
    assert [t.attributes[c.GEN_AI_TOOL_NAME] for t in tools] == ["late", "late"]


# -- how a `with` block finds its own activation at exit ------------------------------------------


def test_a_block_entered_while_off_inside_its_own_scope_leaves_the_outer_block_open() -> None:
    from opentelemetry.trace import NoOpTracerProvider

    from gymtrace._scopes.tracing import pop_provider, push_provider

    scope = gymtrace.tool_call(tool_name="composite")  # one shared Scope, nested in itself
    off = NoOpTracerProvider()
    with gymtrace.testing.capture_spans(strict=False) as captured:
        with scope as outer:
            push_provider(off)  # tracing switches off inside the outer block
            try:
                with scope as inner:
                    assert inner is not outer  # the stand-in, which records nothing
            finally:
                pop_provider(off)
            assert captured.by_kind(c.KIND_TOOL_CALL) == []  # the outer block is still open
            with scope:  # and a recording block of the same Scope still nests under it
                pass
        tools = captured.by_kind(c.KIND_TOOL_CALL)
    assert len(tools) == 2
    assert_child(tools[0], tools[1])


def test_blocks_exited_out_of_order_end_both_spans_and_restore_the_context() -> None:
    from opentelemetry import trace

    with gymtrace.testing.capture_spans(strict=False) as captured:
        with gymtrace.rollout(rollout_id="r-ooo", task_id="t", repeat=0):
            rollout_span = trace.get_current_span()
            outer = gymtrace.episode()
            inner = gymtrace.agent_invocation(agent_name="a")
            outer.__enter__()
            inner.__enter__()
            outer.__exit__(None, None, None)  # before the block it encloses
            inner.__exit__(None, None, None)
            assert trace.get_current_span() is rollout_span
        kinds = sorted(s.attributes[c.KIND] for s in captured.spans)
    assert kinds == [c.KIND_AGENT_INVOCATION, c.KIND_EPISODE, c.KIND_ROLLOUT]


def test_a_disabled_async_with_never_suspends_and_needs_no_event_loop() -> None:
    async def body() -> str:
        async with gymtrace.step() as step:
            step.record_reward(1.0)  # the stand-in accepts what a recording scope accepts
            return "done"

    coroutine = body()
    # Production policy (not strict): a global provider an earlier test set makes the reward on a
    # step a logged data loss, which is not what this test is about.
    with gymtrace.testing.strict(False), pytest.raises(StopIteration) as finished:
        coroutine.send(None)  # driven by hand: no loop, and it completes at the first send
    assert finished.value.value == "done"


def test_an_unsampled_step_inside_a_sampled_one_leaves_it_open() -> None:
    from gymtrace._scopes import steps as _steps

    saved = _steps.current_policy()
    _steps.set_policy(gymtrace.StepPolicy("aggregate", first=1, slowest=0))
    try:
        with gymtrace.testing.capture_spans(strict=False) as captured:
            with gymtrace.rollout(rollout_id="r-agg", task_id="t", repeat=0), gymtrace.episode():
                with gymtrace.step():  # step 1: sampled, a span
                    with gymtrace.step():  # step 2: not sampled, no span
                        pass
                    assert captured.by_kind(c.KIND_STEP) == []  # step 1 is still open
            (step,) = captured.by_kind(c.KIND_STEP)
            episode = captured.one(c.KIND_EPISODE)
    finally:
        _steps.set_policy(saved)
    assert step.attributes[c.STEP_NUMBER] == 1
    assert episode.attributes[c.STEPS_COUNT] == 2


def test_a_block_exited_in_a_child_task_ends_its_span_and_logs_like_opentelemetry(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import contextlib

    async def main() -> None:
        stack = contextlib.ExitStack()
        stack.enter_context(gymtrace.step())  # entered here

        async def close() -> None:
            stack.close()  # exited in a task, whose context is a copy: the token cannot be reset

        await asyncio.create_task(close())

    with gymtrace.testing.capture_spans(strict=False) as captured:
        asyncio.run(main())
    assert len(captured.by_kind(c.KIND_STEP)) == 1
    assert "Failed to detach context" in caplog.text  # OpenTelemetry's own report, as use_span gives


# -- pickling (issue 31: a lock error and no hint) ------------------------------------------------


def test_pickling_an_open_scope_says_to_pass_its_carrier(captured: CapturedSpans) -> None:
    import pickle

    with gymtrace.rollout(rollout_id="r-pickle") as rollout, gymtrace.episode() as episode:
        for scope in (rollout, episode):
            with pytest.raises(TypeError, match=r"cannot pickle an ActiveScope.*scope\.carrier\(\)"):
                pickle.dumps(scope)
        # A scope description holding an open activation (the attempt it continues) says the same.
        with pytest.raises(TypeError, match=r"scope\.carrier\(\)"):
            pickle.dumps(gymtrace.episode(continue_from=episode))
        # What it names instead crosses a pickle, and continues the episode on the other side.
        carrier = pickle.loads(pickle.dumps(episode.carrier()))
    with gymtrace.propagation.attach(carrier), gymtrace.verify():
        gymtrace.record_reward(1.0)
    (record,) = captured.by_kind("outcome")
    assert (record.attributes or {})[c.REWARD] == 1.0


def test_a_pickled_scope_description_opens_its_own_activation(captured: CapturedSpans) -> None:
    import pickle

    scope = pickle.loads(pickle.dumps(gymtrace.rollout(rollout_id="r-described", task_id="t")))
    with scope:
        gymtrace.record_reward(0.5)
    root = captured.one("rollout")
    assert (root.attributes or {})[c.ROLLOUT_ID] == "r-described"
    assert (root.attributes or {})[c.REWARD] == 0.5


# -- a level is its declaration: the engine names none ----------------------------------------------


def test_a_level_added_by_its_declaration_alone_nests_times_out_and_passes_check(
    captured: CapturedSpans, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gymtrace._scopes.level_spans import prepare_phase
    from gymtrace._scopes.levels import LEVELS, Level, _a_duration
    from gymtrace._scopes.scope import Scope

    # A phase of an episode, with its own deadline argument: nothing else is told about it.
    toy = Level(
        "toy", rank=3, prepare=prepare_phase("gym.toy"), arguments={"limit": _a_duration}, deadline="limit"
    )
    monkeypatch.setitem(LEVELS, "toy", toy)

    async def body() -> None:
        with gymtrace.rollout(rollout_id="r-0", task_id="t"), gymtrace.episode():
            async with Scope("toy", {}):
                with gymtrace.step():
                    pass
            with pytest.raises(TimeoutError):
                async with Scope("toy", {"limit": 0.01}):
                    await asyncio.sleep(5)
            gymtrace.record_reward(1.0)

    asyncio.run(body())
    toys = [s for s in captured.spans if s.name == "gym.toy"]
    episode, step = by_name(captured.spans, c.SPAN_EPISODE), by_name(captured.spans, c.SPAN_STEP)
    assert len(toys) == 2
    for span in toys:
        assert_child(span, episode)
        assert span.attributes[c.KIND] == "toy" and span.attributes[c.ROLLOUT_ID] == "r-0"
    assert_child(step, toys[0])
    # The deadline the declaration named: the body cancelled, the span failed as a timeout.
    assert toys[1].status.status_code.name == "ERROR"
    assert gymtrace.testing.check_trace(captured) == []
