"""Content capture; private where no span shows it: the capture mode, the export budgets (``_content``).

Off by default, the capture modes, budgets that keep every OTLP export request under gRPC's 4 MiB
limit, redaction, and values that never hurt the caller."""

from __future__ import annotations

import copy
import json
import logging
import math
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import pytest

import gymtrace
from child_process import clean_env
from gymtrace import _content
from gymtrace import attributes as c
from gymtrace._model import settings as _settings
from gymtrace.testing import CapturedSpans, capture_spans

VAR = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
INPUT, OUTPUT = c.GEN_AI_INPUT_MESSAGES, c.GEN_AI_OUTPUT_MESSAGES
ARGUMENTS, RESULT = c.GEN_AI_TOOL_CALL_ARGUMENTS, c.GEN_AI_TOOL_CALL_RESULT
MESSAGES = [{"role": "user", "parts": [{"type": "text", "content": "Weather in Paris?"}]}]
REPLY = [{"role": "assistant", "parts": [{"type": "text", "content": "Rainy."}], "finish_reason": "stop"}]


@pytest.fixture(autouse=True)
def _clean_policy(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in (VAR, "GYMTRACE_CONTENT_MAX_VALUE_BYTES", "GYMTRACE_CONTENT_MAX_SPAN_BYTES"):
        monkeypatch.delenv(name, raising=False)
    gymtrace.testing.reset()
    yield
    gymtrace.testing.reset()


def setenv(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    """Set a variable and read the environment again, as configure() or testing.reset() would:
    gymtrace resolves its settings once, not on every call."""
    monkeypatch.setenv(name, value)
    _settings.reload()


def content_bytes(span: Any) -> int:
    """Bytes of captured content on a finished span: its content attributes and events."""
    keys = (INPUT, OUTPUT, ARGUMENTS, RESULT)
    total = sum(len(str(v).encode()) for k, v in (span.attributes or {}).items() if k in keys)
    for event in span.events:
        total += sum(len(str(v).encode()) for k, v in (event.attributes or {}).items() if k in keys)
    return total


def model_call_with(captured: CapturedSpans, input: Any = None, output: Any = None) -> Any:
    with gymtrace.model_call(model="m"):
        gymtrace.record_content(input=input, output=output)
    return captured.one(c.KIND_MODEL_CALL)


# -- off by default -------------------------------------------------------------------------------


def test_nothing_is_recorded_by_default(captured: CapturedSpans) -> None:
    with gymtrace.agent_invocation(agent_name="a") as agent:
        agent.record_content(input=MESSAGES)
        with gymtrace.model_call(model="m"):
            gymtrace.record_content(input=MESSAGES, output=REPLY)
        with gymtrace.tool_call(tool_name="t"):
            gymtrace.record_content(input={"q": 1}, output="r")
    for span in captured.spans:
        assert not {INPUT, OUTPUT, ARGUMENTS, RESULT} & set(span.attributes or {}), span.name
        assert span.events == () or not list(span.events), span.name


def test_off_is_silent_even_outside_any_scope_in_strict_mode(captured: CapturedSpans) -> None:
    gymtrace.record_content(input="x")  # capture off: no work, no complaint


def test_off_never_touches_the_value(captured: CapturedSpans) -> None:
    with gymtrace.model_call(model="m"):
        gymtrace.record_content(input=Hostile(), output=HostileDict(a=1))


# -- modes -------------------------------------------------------------------------------------------


def test_span_only_records_json_attributes_and_no_event(
    captured: CapturedSpans, monkeypatch: pytest.MonkeyPatch
) -> None:
    setenv(monkeypatch, VAR, "SPAN_ONLY")
    span = model_call_with(captured, MESSAGES, REPLY)
    assert json.loads(span.attributes[INPUT]) == MESSAGES
    assert json.loads(span.attributes[OUTPUT]) == REPLY
    assert not span.events


def test_event_only_records_one_inference_details_event_and_no_attribute(
    captured: CapturedSpans, monkeypatch: pytest.MonkeyPatch
) -> None:
    setenv(monkeypatch, VAR, "event_only")
    span = model_call_with(captured, MESSAGES, REPLY)
    assert INPUT not in span.attributes and OUTPUT not in span.attributes
    (event,) = span.events
    assert event.name == "gen_ai.client.inference.operation.details"
    assert json.loads(event.attributes[INPUT]) == MESSAGES
    assert json.loads(event.attributes[OUTPUT]) == REPLY


def test_span_and_event_records_both(captured: CapturedSpans, monkeypatch: pytest.MonkeyPatch) -> None:
    setenv(monkeypatch, VAR, "SPAN_AND_EVENT")
    span = model_call_with(captured, MESSAGES, REPLY)
    assert json.loads(span.attributes[INPUT]) == MESSAGES
    assert json.loads(span.events[0].attributes[OUTPUT]) == REPLY


def test_tool_call_content_uses_the_tool_call_attributes(
    captured: CapturedSpans, monkeypatch: pytest.MonkeyPatch
) -> None:
    setenv(monkeypatch, VAR, "SPAN_AND_EVENT")
    with gymtrace.tool_call(tool_name="weather") as tool:
        tool.record_content(input={"city": "Paris"}, output="rainy, 57°F")
    span = captured.one(c.KIND_TOOL_CALL)
    assert json.loads(span.attributes[ARGUMENTS]) == {"city": "Paris"}
    assert span.attributes[RESULT] == "rainy, 57°F"  # a string result stays text
    assert span.events[0].name == "gym.content"
    assert INPUT not in span.attributes


def test_content_goes_to_the_innermost_model_tool_or_agent_span(
    captured: CapturedSpans, monkeypatch: pytest.MonkeyPatch
) -> None:
    setenv(monkeypatch, VAR, "SPAN_ONLY")
    with gymtrace.agent_invocation(agent_name="a"):
        with gymtrace.step():
            gymtrace.record_content(input="the task")  # no model call open: the agent's
            with gymtrace.model_call(model="m"):
                gymtrace.record_content(output=REPLY)
    assert captured.one(c.KIND_AGENT_INVOCATION).attributes[INPUT] == "the task"
    assert OUTPUT in captured.one(c.KIND_MODEL_CALL).attributes
    assert INPUT not in captured.one(c.KIND_STEP).attributes


@pytest.mark.parametrize(
    ("raw", "mode"),
    [
        ("NO_CONTENT", _content.NO_CONTENT),
        ("span_only", _content.SPAN_ONLY),
        (" Event_Only ", _content.EVENT_ONLY),
        ("SPAN_AND_EVENT", _content.SPAN_AND_EVENT),
        ("true", _content.SPAN_ONLY),
        ("TRUE", _content.SPAN_ONLY),
        ("1", _content.SPAN_ONLY),
        ("false", _content.NO_CONTENT),
        ("", _content.NO_CONTENT),
    ],
)
def test_environment_values_are_read_leniently(monkeypatch: pytest.MonkeyPatch, raw: str, mode: str) -> None:
    setenv(monkeypatch, VAR, raw)
    assert _content.capture_mode() == mode


def test_an_unknown_environment_value_keeps_capture_off_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="gymtrace"):
        setenv(monkeypatch, VAR, "everything please")
        assert _content.capture_mode() == _content.NO_CONTENT
    assert VAR in caplog.text


def test_configure_argument_beats_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    setenv(monkeypatch, VAR, "SPAN_ONLY")
    gymtrace.configure_content(capture=False)
    assert _content.capture_mode() == _content.NO_CONTENT
    gymtrace.configure_content(capture="event_only")
    assert _content.capture_mode() == _content.EVENT_ONLY
    gymtrace.configure_content(capture=None)  # back to the environment
    assert _content.capture_mode() == _content.SPAN_ONLY


def test_bad_configure_arguments_are_clear_errors() -> None:
    with pytest.raises(gymtrace.InvalidArgumentError, match="capture_content"):
        gymtrace.configure_content(capture="sometimes")
    with pytest.raises(gymtrace.InvalidArgumentError, match="redact"):
        gymtrace.configure_content(redact="not callable")  # type: ignore[arg-type]
    with pytest.raises(gymtrace.InvalidArgumentError, match="max_value_bytes"):
        gymtrace.configure_content(max_value_bytes=0)


def test_capture_on_outside_any_scope_is_a_contract_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    setenv(monkeypatch, VAR, "SPAN_ONLY")
    with capture_spans(), pytest.raises(gymtrace.GymTraceError, match="record_content"):
        gymtrace.record_content(input="x")


# -- budgets ----------------------------------------------------------------------------------------


def test_a_long_value_is_cut_to_its_budget_visibly(
    captured: CapturedSpans, monkeypatch: pytest.MonkeyPatch
) -> None:
    setenv(monkeypatch, VAR, "SPAN_ONLY")
    setenv(monkeypatch, "GYMTRACE_CONTENT_MAX_VALUE_BYTES", "1000")
    span = model_call_with(captured, "é" * 100_000)  # two bytes a character
    text = span.attributes[INPUT]
    assert len(text.encode()) <= 1000
    assert "…[truncated " in text


def test_a_long_structure_stays_valid_json_with_a_marker(
    captured: CapturedSpans, monkeypatch: pytest.MonkeyPatch
) -> None:
    setenv(monkeypatch, VAR, "SPAN_ONLY")
    gymtrace.configure_content(max_value_bytes=2000)
    messages = [{"role": "user", "content": f"message {i} " + "x" * 50} for i in range(1000)]
    span = model_call_with(captured, messages)
    text = span.attributes[INPUT]
    assert len(text.encode()) <= 2000
    decoded = json.loads(text)
    assert decoded[0] == messages[0]
    assert decoded[-1].startswith("…[truncated ") and decoded[-1].endswith(" items]")


def test_the_span_budget_caps_all_content_on_a_span(
    captured: CapturedSpans, monkeypatch: pytest.MonkeyPatch
) -> None:
    setenv(monkeypatch, VAR, "SPAN_AND_EVENT")
    gymtrace.configure_content(max_value_bytes=3000, max_span_bytes=8000)
    with gymtrace.model_call(model="m"):
        for _ in range(10):
            gymtrace.record_content(input="a" * 5000, output="b" * 5000)
    span = captured.one(c.KIND_MODEL_CALL)
    assert content_bytes(span) <= 8000
    assert "…[truncated " in span.attributes[INPUT]
    assert span.attributes[c.CONTENT_OMITTED] >= 1  # what did not fit at all is counted


def test_recording_an_attribute_again_replaces_its_budget(
    captured: CapturedSpans, monkeypatch: pytest.MonkeyPatch
) -> None:
    setenv(monkeypatch, VAR, "SPAN_ONLY")
    gymtrace.configure_content(max_value_bytes=3000, max_span_bytes=4000)
    with gymtrace.model_call(model="m"):
        for i in range(20):
            gymtrace.record_content(input=f"{i}" + "a" * 1000)
    span = captured.one(c.KIND_MODEL_CALL)
    assert span.attributes[INPUT].startswith("19a")  # the last one, whole
    assert c.CONTENT_OMITTED not in span.attributes


def test_the_export_batch_arithmetic_fits_4_mib() -> None:
    limit = 4 * 1024 * 1024
    assert _content.export_batch_limit(_content.DEFAULT_MAX_SPAN_BYTES) == 100
    for span_bytes in (64, 1024, 32 * 1024, 100_000, 1024 * 1024, _content.MAX_SPAN_BYTES):
        n = _content.export_batch_limit(span_bytes)
        assert n >= 1
        assert n * (span_bytes + _content.SPAN_OVERHEAD) + _content.REQUEST_OVERHEAD <= limit


def test_otlp_batches_shrink_only_while_capture_is_on(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _content.otlp_batch_size(512) == 512
    setenv(monkeypatch, VAR, "SPAN_ONLY")
    assert _content.otlp_batch_size(512) == 100
    assert _content.otlp_batch_size(50) == 50  # a smaller batch the user chose stays
    setenv(monkeypatch, "GYMTRACE_CONTENT_MAX_SPAN_BYTES", str(1024 * 1024))
    assert _content.otlp_batch_size(512) == 3


# -- redaction ---------------------------------------------------------------------------------------


def test_secret_looking_keys_are_redacted_at_any_depth(
    captured: CapturedSpans, monkeypatch: pytest.MonkeyPatch
) -> None:
    setenv(monkeypatch, VAR, "SPAN_ONLY")
    arguments = {
        "query": "weather",
        "api_key": "sk-1",
        "config": {"OpenAI-API-Key": "sk-2", "headers": [{"Authorization": "Bearer x", "Cookie": "c=1"}]},
        "accessToken": "t1",
        "refresh_token": "t2",
        "PASSWORD": "p",
        "client_secret": "s",
        "max_tokens": 100,
        "input_tokens": 7,
    }
    with gymtrace.tool_call(tool_name="t"):
        gymtrace.record_content(input=arguments)
    recorded = json.loads(captured.one(c.KIND_TOOL_CALL).attributes[ARGUMENTS])
    assert recorded == {
        "query": "weather",
        "api_key": "[REDACTED]",
        "config": {
            "OpenAI-API-Key": "[REDACTED]",
            "headers": [{"Authorization": "[REDACTED]", "Cookie": "[REDACTED]"}],
        },
        "accessToken": "[REDACTED]",
        "refresh_token": "[REDACTED]",
        "PASSWORD": "[REDACTED]",
        "client_secret": "[REDACTED]",
        "max_tokens": 100,  # token counts are not secrets
        "input_tokens": 7,
    }
    assert arguments["api_key"] == "sk-1"  # the caller's dict is untouched


def test_secrets_inside_json_text_are_redacted(
    captured: CapturedSpans, monkeypatch: pytest.MonkeyPatch
) -> None:
    setenv(monkeypatch, VAR, "SPAN_ONLY")
    with gymtrace.model_call(model="m"):
        gymtrace.record_content(
            # tool-call arguments as a model writes them: JSON text inside a message
            output=[
                {"role": "assistant", "tool_calls": [{"arguments": '{"token": "abc", "city": "Paris"}'}]}
            ],
            input='{"password": "hunter2", "broken json": ',  # does not parse: redacted as text
        )
    span = captured.one(c.KIND_MODEL_CALL)
    assert "abc" not in span.attributes[OUTPUT] and "Paris" in span.attributes[OUTPUT]
    assert "hunter2" not in span.attributes[INPUT] and "[REDACTED]" in span.attributes[INPUT]
    with gymtrace.tool_call(tool_name="t"):
        gymtrace.record_content(input='{"api_key": "sk-3", "n": 1}')  # parsed, then redacted
    assert json.loads(captured.one(c.KIND_TOOL_CALL).attributes[ARGUMENTS]) == {
        "api_key": "[REDACTED]",
        "n": 1,
    }


def test_the_redaction_hook_sees_a_copy_and_its_result_is_recorded(
    captured: CapturedSpans, monkeypatch: pytest.MonkeyPatch
) -> None:
    setenv(monkeypatch, VAR, "SPAN_ONLY")
    seen: list[tuple[str, Any]] = []

    def hook(name: str, value: Any) -> Any:
        seen.append((name, value))
        value[0]["content"] = value[0]["content"].replace("alice@example.com", "<email>")
        return value

    gymtrace.configure_content(redact=hook)
    messages = [{"role": "user", "content": "mail alice@example.com", "api_key": "sk"}]
    original = copy.deepcopy(messages)
    span = model_call_with(captured, messages)
    assert json.loads(span.attributes[INPUT]) == [
        {"role": "user", "content": "mail <email>", "api_key": "[REDACTED]"}
    ]
    assert seen[0][0] == INPUT
    assert seen[0][1][0]["api_key"] == "[REDACTED]"  # default redaction runs first
    assert messages == original  # the hook changed its copy, not the caller's data


def test_configure_sets_the_redaction_hook_too(monkeypatch: pytest.MonkeyPatch) -> None:
    setenv(monkeypatch, "OTEL_SDK_DISABLED", "true")  # configure() sets the policy, then stops
    gymtrace.configure(capture_content="SPAN_ONLY", redact_content=lambda name, value: "hidden")
    assert _content.capture_mode() == _content.SPAN_ONLY
    assert _content.current_policy().redact is not None
    assert _content.current_policy().redact("k", 1) == "hidden"


def test_a_failing_hook_fails_closed(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    setenv(monkeypatch, VAR, "SPAN_ONLY")

    def hook(name: str, value: Any) -> Any:
        raise ValueError("bug in the hook")

    gymtrace.configure_content(redact=hook)
    with capture_spans(strict=False) as captured, caplog.at_level(logging.WARNING, logger="gymtrace"):
        span = model_call_with(captured, "secret prompt")
    assert span.attributes[INPUT] == "[REDACTED: the redaction hook failed]"
    assert "redaction hook raised ValueError" in caplog.text
    with capture_spans(strict=True), pytest.raises(gymtrace.GymTraceError, match="redaction hook"):
        with gymtrace.model_call(model="m"):
            gymtrace.record_content(input="secret prompt")


# -- the caller's objects: never called, never mutated -------------------------------------------------


class Boom(Exception):
    pass


def _boom(*args: Any, **kwargs: Any) -> Any:
    raise Boom("gymtrace called a user method")


class Hostile:
    """Every method a serialiser might call raises."""

    __repr__ = __str__ = __iter__ = __len__ = __getitem__ = __eq__ = __hash__ = __bool__ = _boom
    __format__ = __reduce__ = __reduce_ex__ = __getstate__ = __dir__ = _boom

    @property
    def value(self) -> Any:
        raise Boom("property read")

    def __getattr__(self, name: str) -> Any:
        raise Boom(f"getattr {name}")


class HostileKey(Hostile):
    """Hashable (a dict key must be), every other method raises."""

    __hash__ = object.__hash__
    __eq__ = object.__eq__


class HostileDict(dict):  # type: ignore[type-arg]
    items = keys = values = __iter__ = __len__ = __getitem__ = get = __repr__ = __str__ = _boom


class HostileList(list):  # type: ignore[type-arg]
    __iter__ = __len__ = __getitem__ = __repr__ = __str__ = _boom


class HostileStr(str):
    __str__ = __repr__ = __len__ = __getitem__ = __iter__ = encode = _boom


class HostileInt(int):
    __int__ = __index__ = __repr__ = __str__ = __format__ = _boom


class HostileFloat(float):
    __float__ = __repr__ = __str__ = __format__ = _boom


def test_user_methods_are_never_called(captured: CapturedSpans, monkeypatch: pytest.MonkeyPatch) -> None:
    setenv(monkeypatch, VAR, "SPAN_AND_EVENT")
    value = {
        "obj": Hostile(),
        "dict": HostileDict(a=1, api_key="sk"),
        "list": HostileList([1, 2]),
        "str": HostileStr("text"),
        "int": HostileInt(3),
        "float": HostileFloat(1.5),
        HostileKey(): "hostile key",
    }
    with gymtrace.model_call(model="m"):
        gymtrace.record_content(input=value, output=HostileStr('{"a": 1}'))
    recorded = json.loads(captured.one(c.KIND_MODEL_CALL).attributes[INPUT])
    assert recorded == {
        "obj": "<Hostile>",
        "dict": {"a": 1, "api_key": "[REDACTED]"},
        "list": [1, 2],
        "str": "text",
        "int": 3,
        "float": 1.5,
        "<HostileKey>": "hostile key",
    }


def test_user_data_is_not_mutated(captured: CapturedSpans, monkeypatch: pytest.MonkeyPatch) -> None:
    setenv(monkeypatch, VAR, "SPAN_ONLY")
    gymtrace.configure_content(max_value_bytes=500)
    shared = {"token": "t", "nested": [1, 2, {"password": "p"}]}
    value = {"a": shared, "b": shared, "long": ["x" * 1000] * 10, "t": (1, [2])}
    before = copy.deepcopy(value)
    ids = (id(value["a"]), id(value["long"]), id(shared["nested"]))
    model_call_with(captured, value, value)
    assert value == before
    assert (id(value["a"]), id(value["long"]), id(shared["nested"])) == ids


def test_iterators_and_generators_are_not_consumed(
    captured: CapturedSpans, monkeypatch: pytest.MonkeyPatch
) -> None:
    setenv(monkeypatch, VAR, "SPAN_ONLY")
    generator = (i for i in range(3))
    iterator = iter([1, 2, 3])
    span = model_call_with(captured, {"g": generator, "i": iterator, "s": {1, 2}})
    assert json.loads(span.attributes[INPUT]) == {"g": "<generator>", "i": "<list_iterator>", "s": "<set>"}
    assert list(generator) == [0, 1, 2] and list(iterator) == [1, 2, 3]


# -- hostile values never raise into the caller --------------------------------------------------------


def _deep(levels: int, make: Any) -> Any:
    value: Any = "bottom"
    for _ in range(levels):
        value = make(value)
    return value


def test_hostile_values_never_raise_and_stay_in_budget(
    captured: CapturedSpans, monkeypatch: pytest.MonkeyPatch
) -> None:
    setenv(monkeypatch, VAR, "SPAN_AND_EVENT")
    cyclic_list: list[Any] = [1]
    cyclic_list.append(cyclic_list)
    cyclic_dict: dict[str, Any] = {"a": 1}
    cyclic_dict["self"] = cyclic_dict
    values: list[Any] = [
        cyclic_list,
        cyclic_dict,
        _deep(10_000, lambda v: [v]),
        _deep(10_000, lambda v: {"k": v}),
        "x" * 20_000_000,
        b"\x00\xff" * 1000,
        bytearray(b"abc"),
        memoryview(b"abc"),
        [math.nan, math.inf, -math.inf],
        10**5000,
        "lone surrogate \ud800 here",
        {"\udfff": 1, None: 2, 1.5: 3, True: 4, (1, 2): 5},
        [{"k": "v" * 100} for _ in range(200_000)],
        "[" * 100_000 + "]" * 100_000,  # JSON text too deep for json.loads
        object(),
        Hostile,
        lambda: None,
    ]
    budget = _content.max_value_bytes()
    for value in values:
        with gymtrace.model_call(model="m"):
            gymtrace.record_content(input=value, output=value)
        span = captured.spans[-1]
        text = span.attributes[INPUT]
        assert len(text.encode("utf-8")) <= budget  # valid UTF-8, within budget
        assert content_bytes(span) <= _content.max_span_bytes()
    texts = [s.attributes[INPUT] for s in captured.spans]
    assert texts[0] == '[1,"<cycle>"]'
    assert json.loads(texts[1]) == {"a": 1, "self": "<cycle>"}
    assert "<max depth>" in texts[2] and "<max depth>" in texts[3]
    assert texts[5] == "<bytes: 2000 bytes>"
    assert json.loads(texts[8]) == ["NaN", "Infinity", "-Infinity"]
    assert texts[10] == "lone surrogate ? here"


def test_concurrent_recording_on_one_span_stays_in_budget(
    captured: CapturedSpans, monkeypatch: pytest.MonkeyPatch
) -> None:
    setenv(monkeypatch, VAR, "EVENT_ONLY")
    gymtrace.configure_content(max_value_bytes=1000, max_span_bytes=20_000)
    with gymtrace.model_call(model="m") as call:

        def work() -> None:
            for _ in range(50):
                call.record_content(input="z" * 2000)

        threads = [threading.Thread(target=work) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    span = captured.one(c.KIND_MODEL_CALL)
    assert content_bytes(span) <= 20_000
    assert span.attributes[c.CONTENT_OMITTED] > 0


# -- a real OTLP/gRPC export stays under 4 MiB per request ----------------------------------------------

EXPORT_SCRIPT = """
import gymtrace
gymtrace.configure(endpoint="http://127.0.0.1:{port}", protocol="grpc", file=False)
big = "é€🙂x" * 200_000  # multi-byte text, far over every budget
with gymtrace.run(run_id="run-1"), gymtrace.rollout(rollout_id="r-1"), gymtrace.episode():
    for i in range({spans}):
        with gymtrace.model_call(model="m"):
            gymtrace.record_content(input=[{{"role": "user", "content": big}}], output=big)
        with gymtrace.tool_call(tool_name="t"):
            gymtrace.record_content(input={{"q": big}}, output=big)
assert gymtrace.force_flush(60_000)
gymtrace.shutdown()
print("done")
"""


def test_a_real_otlp_grpc_export_of_full_content_stays_under_4_mib_per_request(tmp_path: Path) -> None:
    grpc = pytest.importorskip("grpc")
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    sizes: list[int] = []
    received: list[int] = []
    lock = threading.Lock()

    class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request: Any, context: Any) -> Any:
            spans = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
            with lock:
                sizes.append(request.ByteSize())
                received.append(spans)
            return trace_service_pb2.ExportTraceServiceResponse()

    # The receiver accepts up to 64 MiB, so an oversized request would arrive and be measured
    # instead of being rejected (and retried) unseen.
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=4),
        options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)],
    )
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Receiver(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        pairs = 400  # 800 content spans + run, rollout, episode
        environ = clean_env()
        environ[VAR] = "SPAN_AND_EVENT"
        out = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(EXPORT_SCRIPT.format(port=port, spans=pairs))],
            cwd=tmp_path,
            env=environ,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert out.returncode == 0 and "done" in out.stdout, out.stderr
    finally:
        server.stop(grace=None)

    limit = 4 * 1024 * 1024
    assert sum(received) == 2 * pairs + 3  # every span arrived
    assert max(sizes) < limit, f"largest request {max(sizes)} bytes"
    # The load was real: without the smaller batches one 512-span request would be ~16 MiB.
    assert sum(sizes) > 4 * limit
    assert max(sizes) > limit // 2
    print(f"\n{len(sizes)} requests, largest {max(sizes)} bytes, total {sum(sizes)} bytes")


def test_secret_keys_can_be_replaced_or_turned_off(
    captured: CapturedSpans, monkeypatch: pytest.MonkeyPatch
) -> None:
    setenv(monkeypatch, VAR, "SPAN_ONLY")
    logprobs = {"content": [{"token": "Hi", "logprob": -0.1}], "key": "Enter", "pass": True, "api_key": "sk"}
    span = model_call_with(captured, None, logprobs)
    recorded = json.loads(span.attributes[OUTPUT])
    assert recorded["content"][0]["token"] == "[REDACTED]"  # the default list errs on the safe side
    assert recorded["key"] == "Enter" and recorded["pass"] is True  # "key"/"pass" alone are not secrets
    captured.clear()
    gymtrace.configure_content(secret_keys=["api_key", "password"])
    recorded = json.loads(model_call_with(captured, None, logprobs).attributes[OUTPUT])
    assert recorded["content"][0]["token"] == "Hi" and recorded["api_key"] == "[REDACTED]"
    captured.clear()
    gymtrace.configure_content(secret_keys=())
    assert json.loads(model_call_with(captured, None, logprobs).attributes[OUTPUT])["api_key"] == "sk"
    gymtrace.configure_content(secret_keys=None)
    assert _content.is_secret_key("X-Auth-Token")
    with pytest.raises(gymtrace.InvalidArgumentError, match="secret_keys"):
        gymtrace.configure_content(secret_keys="api_key")
