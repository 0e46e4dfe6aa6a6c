"""Training runs; private where signing, a provider of its own, the stats and consumed keys are reached.

The policy version and group every rollout span carries, train steps, consume()."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from opentelemetry import trace

import gymtrace
from gymtrace import _constants as c
from gymtrace import propagation
from gymtrace._identity import trust as _trust
from gymtrace._scopes.tracing import pop_provider, push_provider
from gymtrace.testing import CapturedSpans, capture_spans, check_trace
from training_state import no_policy_version  # noqa: F401 - an autouse fixture
from tree_asserts import assert_child, by_name, span_id


class _Scalar:
    """An integer-like that is not an int (as a numpy or torch scalar is)."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


def _hex_span(span: Any) -> str:
    return trace.format_span_id(span.context.span_id)


def _hex_trace(span: Any) -> str:
    return trace.format_trace_id(span.context.trace_id)


# -- the producer side ------------------------------------------------------------------------------


def test_every_span_below_a_rollout_carries_its_group_and_policy_version(captured: CapturedSpans) -> None:
    gymtrace.set_policy_version(3)
    with gymtrace.run(run_id="run"):
        with gymtrace.rollout(rollout_id="r", group_id="prompt-7", group_size=4, train_step=2):
            with gymtrace.episode(), gymtrace.step():
                with gymtrace.model_call(model="m"):
                    pass
                with gymtrace.tool_call(tool_name="env"):
                    pass
    rollout = captured.one("rollout")
    assert rollout.attributes[c.GROUP_ID] == "prompt-7"
    assert rollout.attributes[c.GROUP_SIZE] == 4
    assert rollout.attributes[c.TRAIN_STEP] == 2
    assert rollout.attributes[c.POLICY_VERSION] == 3
    assert c.POLICY_VERSION_END not in rollout.attributes
    below = [s for s in captured.spans if s.attributes[c.KIND] not in (c.KIND_RUN, c.KIND_ROLLOUT)]
    assert {s.attributes[c.KIND] for s in below} == {"episode", "step", "model_call", "tool_call"}
    for span in below:
        assert span.attributes[c.GROUP_ID] == "prompt-7", span.name
        assert span.attributes[c.POLICY_VERSION] == 3, span.name
        # Size and step are the rollout's facts, not identity.
        assert c.GROUP_SIZE not in span.attributes and c.TRAIN_STEP not in span.attributes
    assert check_trace(captured.spans) == []


def test_a_span_started_after_a_weight_update_records_the_new_version_and_the_rollout_its_end(
    captured: CapturedSpans,
) -> None:
    gymtrace.set_policy_version(1)
    with gymtrace.rollout(rollout_id="r", group_id="g"), gymtrace.episode():
        with gymtrace.model_call(model="m"):
            pass
        gymtrace.set_policy_version(2)  # a weight sync mid-rollout (async RL)
        with gymtrace.model_call(model="m"):
            pass
    first, second = captured.by_kind("model_call")
    assert first.attributes[c.POLICY_VERSION] == 1
    assert second.attributes[c.POLICY_VERSION] == 2
    rollout = captured.one("rollout")
    assert rollout.attributes[c.POLICY_VERSION] == 1  # its start version
    assert rollout.attributes[c.POLICY_VERSION_END] == 2
    # The episode started before the update.
    assert captured.one("episode").attributes[c.POLICY_VERSION] == 1


def test_other_libraries_spans_below_a_rollout_carry_the_version_of_their_start(
    captured: CapturedSpans,
) -> None:
    tracer = captured.tracer_provider.get_tracer("an-http-client")
    gymtrace.set_policy_version("ckpt-a")
    with gymtrace.rollout(rollout_id="r", group_id="g"), gymtrace.episode():
        gymtrace.set_policy_version("ckpt-b")
        with tracer.start_as_current_span("POST /v1/chat"):
            pass
    http = by_name(captured.spans, "POST /v1/chat")
    assert http.attributes[c.POLICY_VERSION] == "ckpt-b"
    assert http.attributes[c.GROUP_ID] == "g"


def test_a_rollouts_own_policy_version_overrides_the_process_version_for_the_rollout(
    captured: CapturedSpans,
) -> None:
    with gymtrace.rollout(rollout_id="r", policy_version=9), gymtrace.episode():
        pass
    assert captured.one("rollout").attributes[c.POLICY_VERSION] == 9
    # This process sets no version of its own: the spans below take the rollout's.
    assert captured.one("episode").attributes[c.POLICY_VERSION] == 9
    assert c.POLICY_VERSION_END not in captured.one("rollout").attributes


def test_a_rollout_outside_a_training_run_carries_no_training_attributes(captured: CapturedSpans) -> None:
    with gymtrace.rollout(rollout_id="r"), gymtrace.episode():
        pass
    for span in captured.spans:
        assert not {c.GROUP_ID, c.POLICY_VERSION, c.POLICY_VERSION_END, c.TRAIN_STEP} & set(span.attributes)


def test_training_arguments_may_be_callables_of_the_decorated_functions_arguments(
    captured: CapturedSpans,
) -> None:
    @gymtrace.rollout(
        rollout_id=lambda prompt, sample: f"{prompt}-{sample}",
        group_id=lambda prompt, sample: prompt,
        group_size=lambda prompt, sample: 2,
        train_step=lambda prompt, sample: 5,
        policy_version=lambda prompt, sample: "v5",
    )
    def generate(prompt: str, sample: int) -> None:
        with gymtrace.episode():
            pass

    generate("p1", 0)
    generate("p1", 1)
    rollouts = captured.by_kind("rollout")
    assert [r.attributes[c.ROLLOUT_ID] for r in rollouts] == ["p1-0", "p1-1"]
    for r in rollouts:
        assert r.attributes[c.GROUP_ID] == "p1"
        assert r.attributes[c.GROUP_SIZE] == 2
        assert r.attributes[c.TRAIN_STEP] == 5
        assert r.attributes[c.POLICY_VERSION] == "v5"


def test_integer_likes_are_taken_as_int_versions_and_steps(captured: CapturedSpans) -> None:
    gymtrace.set_policy_version(_Scalar(4))  # type: ignore[arg-type]
    with gymtrace.rollout(rollout_id="r", train_step=_Scalar(6), group_id=12):  # type: ignore[arg-type]
        pass
    with gymtrace.train_step(step=_Scalar(7)):  # type: ignore[arg-type]
        pass
    rollout = captured.one("rollout")
    assert rollout.attributes[c.POLICY_VERSION] == 4 and type(rollout.attributes[c.POLICY_VERSION]) is int
    assert rollout.attributes[c.TRAIN_STEP] == 6
    assert rollout.attributes[c.GROUP_ID] == "12"  # a prompt index, as the group's ID text
    assert captured.one("train_step").attributes[c.TRAIN_STEP] == 7


def test_a_rollout_generated_inside_a_train_step_is_generated_for_it(captured: CapturedSpans) -> None:
    with gymtrace.run(run_id="run"), gymtrace.train_step(step=3):
        with gymtrace.rollout(rollout_id="r"):
            pass
    assert captured.one("rollout").attributes[c.TRAIN_STEP] == 3
    assert check_trace(captured.spans) == []


# -- across processes -----------------------------------------------------------------------------------


def test_group_and_version_travel_to_the_gyms_other_processes_and_never_upstream(
    captured: CapturedSpans,
) -> None:
    gymtrace.set_policy_version(2)
    with gymtrace.rollout(rollout_id="r", group_id="g"), gymtrace.episode():
        gymtrace.set_policy_version(3)
        inside = propagation.inject({}, destination="http://127.0.0.1:8000/run")
        upstream = propagation.inject({}, destination="https://api.openai.com/v1/chat")
    assert "gym.group.id=g" in inside["baggage"] and "gym.policy.version=3" in inside["baggage"]
    assert "gym" not in upstream.get("baggage", "")
    # The other process (no version of its own): its spans carry what came with the request.
    gymtrace.set_policy_version(None)
    with propagation.attach(inside), gymtrace.tool_call(tool_name="env_step"):
        pass
    tool = captured.one("tool_call")
    assert tool.attributes[c.GROUP_ID] == "g"
    assert tool.attributes[c.POLICY_VERSION] == 3
    assert tool.attributes[c.ROLLOUT_ID] == "r"


def test_an_outcome_recorded_in_another_process_carries_the_rollouts_group(captured: CapturedSpans) -> None:
    # The verify server's record is a span below the rollout like any other (the NeMo Gym stack's
    # resources server records each rollout's reward so).
    with gymtrace.rollout(rollout_id="r", group_id="g"), gymtrace.episode():
        inside = propagation.inject({}, destination="http://127.0.0.1:8000/verify", continuation=True)
    with propagation.attach(inside), gymtrace.verify():
        gymtrace.record_reward(1.0)
    (record,) = captured.by_kind(c.KIND_OUTCOME)
    assert (record.attributes[c.GROUP_ID], record.attributes[c.ROLLOUT_ID]) == ("g", "r")


def test_a_scope_carrier_carries_the_group_and_the_rollouts_version(captured: CapturedSpans) -> None:
    gymtrace.set_policy_version(5)
    with gymtrace.rollout(rollout_id="r", group_id="g"), gymtrace.episode() as first:
        carrier = first.carrier()
    gymtrace.set_policy_version(None)
    with gymtrace.episode(continue_from=carrier):
        pass
    second = [e for e in captured.by_kind("episode") if e.attributes[c.EPISODE_ATTEMPT] == 1]
    assert second[0].attributes[c.GROUP_ID] == "g"
    assert second[0].attributes[c.POLICY_VERSION] == 5


def test_signed_identity_with_training_keys_is_signed_v2_and_verified(captured: CapturedSpans) -> None:
    _trust.configure_trust(mode="signed", secret="s3cret")
    with gymtrace.rollout(rollout_id="r", group_id="g", policy_version=4), gymtrace.episode():
        headers = propagation.inject({}, destination="http://127.0.0.1:1/")
    assert "gym.sig=v2." in headers["baggage"]
    with propagation.attach(headers):
        assert gymtrace.current().group_id == "g"
        assert gymtrace.current().policy_version == 4
    # Changing the version breaks the signature: nothing is believed.
    forged = {
        **headers,
        "baggage": headers["baggage"].replace("gym.policy.version=4", "gym.policy.version=9"),
    }
    with propagation.attach(forged):
        assert gymtrace.current().rollout_id is None


def test_a_v1_signature_still_verifies_and_believes_only_the_keys_it_covers(captured: CapturedSpans) -> None:
    _trust.configure_trust(mode="signed", secret="s3cret")
    identity: dict[str, str | int] = {c.RUN_ID: "run", c.ROLLOUT_ID: "r", c.EPISODE_ATTEMPT: 0}
    v1 = _trust.signature(identity)  # no training keys: signed v1, byte for byte as before
    assert v1 is not None and v1.startswith("v1.")
    baggage = "gym.run.id=run,gym.rollout.id=r,gym.episode.attempt=0,gym.group.id=added,gym.sig=" + v1
    with propagation.attach({"baggage": baggage}):
        current = gymtrace.current()
        assert current.rollout_id == "r" and current.attempt == 0
        assert current.group_id is None  # beside a v1 signature, not covered by it


# -- the consumer side ----------------------------------------------------------------------------------


def test_a_train_step_is_the_root_of_its_own_trace_linked_to_the_run(captured: CapturedSpans) -> None:
    gymtrace.set_policy_version(8)
    with gymtrace.run(run_id="run"):
        with gymtrace.train_step(step=1):
            pass
        with gymtrace.train_step(step=2, policy_version=9):
            pass
    run = captured.one("run")
    first, second = captured.by_kind("train_step")
    for step in (first, second):
        assert step.name == "gym.train_step"
        assert step.parent is None and step.context.trace_id != run.context.trace_id
        [link] = step.links
        assert link.context.span_id == span_id(run) and link.attributes[c.LINK_RELATION] == c.RELATION_RUN
        assert step.attributes[c.RUN_ID] == "run"
    assert first.context.trace_id != second.context.trace_id
    assert (first.attributes[c.TRAIN_STEP], first.attributes[c.POLICY_VERSION]) == (1, 8)
    assert (second.attributes[c.TRAIN_STEP], second.attributes[c.POLICY_VERSION]) == (2, 9)
    assert check_trace(captured.spans) == []


def test_a_train_step_decorates_sync_and_async_functions_with_a_step_of_their_arguments(
    captured: CapturedSpans,
) -> None:
    @gymtrace.train_step(step=lambda batch, number: number)
    def train(batch: list[Any], number: int) -> int:
        return len(batch)

    @gymtrace.train_step(step=lambda number: number)
    async def train_async(number: int) -> int:
        return number

    async def block() -> None:
        async with gymtrace.train_step(step=100):
            pass

    assert train([1, 2], 4) == 2
    assert asyncio.run(train_async(5)) == 5
    asyncio.run(block())
    steps = sorted(s.attributes[c.TRAIN_STEP] for s in captured.by_kind("train_step"))
    assert steps == [4, 5, 100]


def test_consume_by_join_keys_links_the_step_to_the_rollout_with_its_outcome_and_staleness(
    captured: CapturedSpans,
) -> None:
    gymtrace.set_policy_version(1)
    with gymtrace.run(run_id="run"):
        with gymtrace.rollout(rollout_id="r", group_id="g"), gymtrace.episode():
            keys = gymtrace.current().join_keys()
        gymtrace.set_policy_version(3)
        with gymtrace.train_step(step=1):
            gymtrace.consume(keys, outcome="stale", reason="past_off_policy_limit")
    rollout, step, record = captured.one("rollout"), captured.one("train_step"), captured.one("consumed")
    assert keys["rollout_span_id"] == _hex_span(rollout)
    assert_child(record, step)
    assert record.name == "gym.consumed"
    [link] = record.links
    assert link.context.span_id == span_id(rollout) and link.context.trace_id == rollout.context.trace_id
    attributes = record.attributes
    assert attributes[c.TRAIN_STEP] == 1 and attributes[c.POLICY_VERSION] == 3
    assert list(attributes[c.CONSUMED_ROLLOUT_IDS]) == ["r"]
    assert list(attributes[c.CONSUMED_SPANS]) == [f"{_hex_trace(rollout)}-{_hex_span(rollout)}"]
    assert list(attributes[c.CONSUMED_OUTCOMES]) == ["stale"]
    assert list(attributes[c.CONSUMED_REASONS]) == ["past_off_policy_limit"]
    assert list(attributes[c.CONSUMED_VERSIONS]) == ["1"]
    assert step.attributes[c.CONSUMED_COUNT] == 1
    assert check_trace(captured.spans) == []


def test_a_step_consuming_8192_rollouts_records_every_one_within_the_sdks_span_limits(
    captured: CapturedSpans,
) -> None:
    span_ids = [format(n + 1, "016x") for n in range(8192)]
    with gymtrace.run(run_id="run"), gymtrace.train_step(step=1, policy_version=2):
        for n, sid in enumerate(span_ids):
            gymtrace.consume(
                {
                    c.RUN_ID: "run",
                    c.ROLLOUT_ID: f"{n // 16}-{n % 16}",
                    "trace_id": format(n + 1, "032x"),
                    "rollout_span_id": sid,
                    c.POLICY_VERSION: 1,
                },
                outcome="trained" if n % 3 else "filtered",
            )
    records = captured.by_kind("consumed")
    assert len(records) == 64
    step = captured.one("train_step")
    assert step.attributes[c.CONSUMED_COUNT] == 8192
    seen_ids: list[str] = []
    linked: set[int] = set()
    for record in records:
        assert_child(record, step)
        assert len(record.links) <= 128 and record.dropped_links == 0
        assert len(record.attributes) <= 128 and record.dropped_attributes == 0
        seen_ids.extend(ref.partition("-")[2] for ref in record.attributes[c.CONSUMED_SPANS])
        linked.update(link.context.span_id for link in record.links)
    assert sorted(seen_ids) == span_ids
    assert linked == {int(s, 16) for s in span_ids}


def test_a_bare_rollout_id_resolves_to_the_most_recent_unconsumed_rollout_with_a_warning_if_several(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with capture_spans(strict=False) as captured, caplog.at_level(logging.WARNING, "gymtrace"):
        gymtrace.set_policy_version(0)
        with gymtrace.run(run_id="run"):
            for _ in range(2):  # NeMo Gym's IDs restart with every collection
                with gymtrace.rollout(rollout_id="0-0", group_id="0"):
                    pass
            with gymtrace.train_step(step=1):
                gymtrace.consume("0-0")
                gymtrace.consume("0-0", outcome="filtered")
    first, second = captured.by_kind("rollout")
    [record] = captured.by_kind("consumed")
    refs = [f"{_hex_trace(s)}-{_hex_span(s)}" for s in (second, first)]
    assert list(record.attributes[c.CONSUMED_SPANS]) == refs
    assert list(record.attributes[c.CONSUMED_OUTCOMES]) == ["trained", "filtered"]
    ambiguous = [r for r in caplog.records if "not yet consumed" in r.getMessage()]
    assert len(ambiguous) == 1  # the second call had one candidate left


def test_a_bare_id_this_process_did_not_run_is_recorded_for_the_readers_to_resolve(
    captured: CapturedSpans,
) -> None:
    with gymtrace.run(run_id="run"), gymtrace.train_step(step=1):
        gymtrace.consume("elsewhere-3")
    record = captured.one("consumed")
    assert list(record.attributes[c.CONSUMED_ROLLOUT_IDS]) == ["elsewhere-3"]
    assert list(record.attributes[c.CONSUMED_BY_ID]) == ["1"]
    assert record.links == ()


# -- bad input ------------------------------------------------------------------------------------------

BAD_STRICT = [
    (lambda: gymtrace.rollout(rollout_id="r", train_step=1.5), "rollout", "train_step"),  # type: ignore[arg-type]
    (lambda: gymtrace.rollout(rollout_id="r", policy_version=1.0), "rollout", "policy_version"),  # type: ignore[arg-type]
    (lambda: gymtrace.rollout(rollout_id="r", group_size=0), "rollout", "group_size"),
    (lambda: gymtrace.train_step(step="one"), "train_step", "step"),  # type: ignore[arg-type]
    (lambda: gymtrace.train_step(step=-1), "train_step", "step"),
    (lambda: gymtrace.set_policy_version(2.5), "set_policy_version", "version"),  # type: ignore[arg-type]
    (lambda: gymtrace.set_policy_version(True), "set_policy_version", "version"),
]


@pytest.mark.parametrize(("make", "where", "argument"), BAD_STRICT)
def test_a_bad_training_argument_is_an_error_naming_it_in_strict_mode(
    make: Any, where: str, argument: str
) -> None:
    with capture_spans(strict=True), pytest.raises(gymtrace.InvalidArgumentError) as info:
        make()
    assert f"gymtrace.{where}(): argument {argument!r}" in str(info.value)


def test_a_bad_value_is_warned_once_and_left_out_otherwise(caplog: pytest.LogCaptureFixture) -> None:
    with capture_spans(strict=False) as captured, caplog.at_level(logging.WARNING, "gymtrace"):
        gymtrace.set_policy_version(2)
        gymtrace.set_policy_version(2.5)  # type: ignore[arg-type]
        with gymtrace.rollout(rollout_id="r", train_step=1.5, group_id="g"):  # type: ignore[arg-type]
            pass
    rollout = captured.one("rollout")
    assert c.TRAIN_STEP not in rollout.attributes
    assert rollout.attributes[c.GROUP_ID] == "g"
    assert rollout.attributes[c.POLICY_VERSION] == 2  # the bad version left the good one in place
    messages = [r.getMessage() for r in caplog.records]
    assert sum("'train_step'" in m for m in messages) == 1
    assert sum("set_policy_version" in m for m in messages) == 1


def test_consume_outside_a_train_step_is_an_error_in_strict_mode(captured: CapturedSpans) -> None:
    with (
        gymtrace.rollout(rollout_id="r"),
        pytest.raises(gymtrace.GymTraceError, match="outside a train step"),
    ):
        gymtrace.consume("r")


def test_consume_outside_a_train_step_or_of_an_unknown_outcome_records_nothing_and_warns_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with capture_spans(strict=False) as captured, caplog.at_level(logging.WARNING, "gymtrace"):
        gymtrace.consume("r")
        gymtrace.consume("r")
        with gymtrace.train_step(step=1):
            gymtrace.consume("r", outcome="used")
            gymtrace.consume("r", outcome="used")
            gymtrace.consume("r", reason=42)  # type: ignore[arg-type]
    [record] = captured.by_kind("consumed")
    assert list(record.attributes[c.CONSUMED_OUTCOMES]) == ["trained"]
    assert c.CONSUMED_REASONS not in record.attributes  # no entry has a reason
    messages = [r.getMessage() for r in caplog.records]
    assert sum("outside a train step" in m for m in messages) == 1
    assert sum("'outcome'" in m for m in messages) == 1
    assert sum("'reason'" in m for m in messages) == 1


def test_consume_of_an_unknown_outcome_is_an_error_naming_it_in_strict_mode(captured: CapturedSpans) -> None:
    with gymtrace.train_step(step=1), pytest.raises(gymtrace.InvalidArgumentError, match="'outcome'"):
        gymtrace.consume("r", outcome="used")


def test_tracing_off_makes_every_training_call_a_no_op() -> None:
    # Off whatever global provider an earlier test set: a no-op provider for this block.
    provider = trace.NoOpTracerProvider()
    push_provider(provider)
    try:
        gymtrace.set_policy_version(1)
        with gymtrace.train_step(step=1):
            gymtrace.consume("r")  # strict mode is on: any complaint would raise
        with gymtrace.rollout(rollout_id="r", group_id="g"):
            assert gymtrace.current().group_id is None
    finally:
        pop_provider(provider)


def test_a_rollout_opened_under_a_runs_carried_context_is_its_own_trace_linked_to_that_run(
    captured: CapturedSpans,
) -> None:
    with gymtrace.run(run_id="run"):
        carrier = propagation.inject({}, destination=propagation.GYM_INTERNAL)
    # A rollout worker (another process): the trainer's run context, carried.
    with propagation.attach(carrier), gymtrace.rollout(rollout_id="r", group_id="g"):
        pass
    run, rollout = captured.one("run"), captured.one("rollout")
    assert rollout.parent is None and rollout.context.trace_id != run.context.trace_id
    [link] = rollout.links
    assert link.context.span_id == span_id(run) and link.attributes[c.LINK_RELATION] == c.RELATION_RUN
    assert rollout.attributes[c.RUN_ID] == "run"


def test_a_run_continued_by_id_alone_links_the_rollouts_to_no_run_span(captured: CapturedSpans) -> None:
    # NeMo Gym's resume pass continues its run by ID, with no span of the run to continue: its
    # rollouts and train steps link to nothing (a link to the invalid span would read as a run of
    # its own, beside the fresh pass's, and `gymtrace stats --run` would print two lines).
    from opentelemetry import context as otel_context

    from gymtrace import instrumentation
    from gymtrace._read.stats import summarise

    with gymtrace.run(run_id="run"), gymtrace.rollout(rollout_id="0-0", task_id="0", repeat=0):
        gymtrace.record_reward(1.0)
    token = otel_context.attach(instrumentation.continue_scope(otel_context.Context(), {c.RUN_ID: "run"}))
    try:
        with gymtrace.rollout(rollout_id="1-0", task_id="1", repeat=0):
            gymtrace.record_reward(0.0)
        with gymtrace.train_step(step=0):
            pass
    finally:
        otel_context.detach(token)
    resumed = [s for s in captured.by_kind("rollout") if s.attributes[c.ROLLOUT_ID] == "1-0"]
    assert [list(s.links) for s in resumed] == [[]]
    assert list(captured.one("train_step").links) == []
    (stats,) = summarise(captured.data)
    assert (stats.run_id, stats.scored, stats.mean_reward, stats.runs_sharing_id) == ("run", 2, 0.5, 1)


def test_a_run_continued_under_a_span_of_this_process_keeps_its_rollouts_below_that_span(
    captured: CapturedSpans,
) -> None:
    # A NeMo Gym environment server opens the rollouts of an untraced driver under its own HTTP
    # server span, in a run of its own named by ID: each rollout stays a child of its request, as
    # before issue 44. Linking each to its request's span as "the run" made every rollout a run of
    # its own in `gymtrace stats` (4 lines of 1 rollout for a pass of 4).
    from opentelemetry import context as otel_context

    from gymtrace import instrumentation
    from gymtrace._read.stats import summarise

    tracer = captured.tracer_provider.get_tracer("an-http-server")
    requests = []
    for n in range(4):
        with tracer.start_as_current_span("POST /run") as request:
            requests.append(request)
            ctx = instrumentation.continue_scope(otel_context.get_current(), {c.RUN_ID: "servers-only"})
            token = otel_context.attach(ctx)
            try:
                with gymtrace.rollout(rollout_id=f"{n // 2}-{n % 2}", task_id=str(n // 2), repeat=n % 2):
                    gymtrace.record_reward(1.0)
            finally:
                otel_context.detach(token)
    rollouts = captured.by_kind("rollout")
    assert len(rollouts) == 4
    for rollout, request in zip(rollouts, requests, strict=True):
        assert list(rollout.links) == []
        assert rollout.parent is not None and rollout.parent.span_id == span_id(request)
    (stats,) = summarise(captured.data)
    assert (stats.run_id, stats.scored, stats.mean_reward) == ("servers-only", 4, 1.0)
