"""The readers' decoder (``_model.spandata``, private) and main(argv) in process, for hundreds of cases;
the native reader against the Python reader (``_read.source``, private) on the same cases.

The readers against malformed trace files: a clear one-line error and exit code 2, never a
traceback (issue 31: a ``spanId`` that was a number made tree, check, rollouts, stats and live exit
with an ``AttributeError``).

Hypothesis starts from a trace gymtrace could have written (a run, a rollout, an episode, a
verify, an outcome record, a live marker) and breaks it: a field of another JSON type, a field
taken away, an odd value (huge numbers, IDs of the wrong length, lone surrogates, enum names).
Every command reads the file through ``main(argv)``; each must return an exit code it documents
(docs/cli.md): 0, 1 ("no"), or 2 (bad input, one line on standard error naming the file and line).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gymtrace
from gymtrace._cli import main
from gymtrace._model.spandata import encode_otlp_json
from gymtrace.testing import capture_spans

TRACE = "0af7651916cd43dd8448eb211c80319c"


def _attributes(**values: Any) -> list[dict[str, Any]]:
    def any_value(v: Any) -> dict[str, Any]:
        if isinstance(v, bool):
            return {"boolValue": v}
        if isinstance(v, int):
            return {"intValue": str(v)}
        if isinstance(v, float):
            return {"doubleValue": v}
        return {"stringValue": v}

    return [{"key": k.replace("__", "."), "value": any_value(v)} for k, v in values.items()]


def _span(span_id: str, parent: str, name: str, **attributes: Any) -> dict[str, Any]:
    return {
        "traceId": TRACE,
        "spanId": span_id,
        "parentSpanId": parent,
        "name": name,
        "kind": 1,
        "startTimeUnixNano": "1700000000000000000",
        "endTimeUnixNano": "1700000001000000000",
        "attributes": _attributes(**attributes),
        "events": [
            {"timeUnixNano": "1700000000500000000", "name": "gen_ai.evaluation.result", "attributes": []}
        ],
        "links": [],
        "status": {"code": 0},
    }


@functools.cache
def _written() -> dict[str, Any]:
    """What gymtrace writes for a run with a retried, scored rollout, as one OTLP/JSON request."""
    with capture_spans() as captured, gymtrace.run(run_id="run-1"):
        with gymtrace.rollout(rollout_id="r-1", task_id="t-1", repeat=0):
            for attempt in gymtrace.attempts(2):
                with attempt:
                    with gymtrace.agent_invocation(agent_name="a"), gymtrace.step():
                        pass
                    if attempt.index == 0:
                        attempt.fail("infrastructure")
                    else:
                        with gymtrace.verify():
                            gymtrace.record_reward(1.0)
    request: dict[str, Any] = encode_otlp_json(captured.spans)
    return request


def _request() -> dict[str, Any]:
    """A trace gymtrace wrote, plus a live marker (gymtrace live reads those)."""
    request = copy.deepcopy(_written())
    marker = _span(
        "00000000000000f1",
        "",
        "gym.live",
        **{"gym.run.id": "run-1", "gym.task.id": "t-1", "gym.rollout.id": "r-2"},
        **{"gym.kind": "live", "gym.live.event": "beat", "gym.live.started_ns": 1700000000000000000},
        **{"gym.live.interval_s": 1.0, "gym.live.step": 3, "gym.episode.attempt": 0},
    )
    request["resourceSpans"][0]["scopeSpans"][0]["spans"].append(marker)
    return request


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=40)
    | st.sampled_from(
        ["", "0", "-1", "NaN", "Infinity", "SPAN_KIND_SERVER", "STATUS_CODE_ERROR", "\ud800", "zz" * 8]
    ),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=6,
)


def _paths(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in the request a value sits (dictionary keys and list positions)."""
    found = [path] if path else []
    if isinstance(node, dict):
        for key, value in node.items():
            found += _paths(value, (*path, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += _paths(value, (*path, index))
    return found


@st.composite
def broken_requests(draw: st.DrawFn) -> dict[str, Any]:
    request = _request()
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        paths = _paths(request)
        if not paths:  # everything deleted already
            break
        path = draw(st.sampled_from(paths))
        parent: Any = request
        for step in path[:-1]:
            parent = parent[step]
        how = draw(st.sampled_from(["replace", "delete", "retype"]))
        if how == "delete" and isinstance(parent, dict):
            del parent[path[-1]]
        elif how == "retype":
            # The same value as another JSON type: a number as a string, a string as a number.
            value = parent[path[-1]]
            parent[path[-1]] = (
                int(value)
                if isinstance(value, str) and value.isdigit()
                else str(value)
                if value is not None
                else 0
            )
        else:
            parent[path[-1]] = draw(json_values)
    return request


COMMANDS = (["tree"], ["check"], ["rollouts", "--json"], ["stats", "--json"], ["stats"], ["live", "--json"])


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def _assert_readers_answer(path: Path) -> None:
    for command in COMMANDS:
        code, _, err = _run([*command, str(path)])
        assert code in (0, 1, 2), (command, code, err)
        if code == 2:
            (line,) = err.strip().splitlines()  # one line, no traceback
            assert f"{path}:" in line, line
    code, _, err = _run(["compare", str(path), str(path), "--json"])
    assert code in (0, 1, 2), ("compare", code, err)
    if code == 2:
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def test_the_unbroken_trace_reads_everywhere(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text(json.dumps(_request()) + "\n")
    for command in COMMANDS:
        code, out, err = _run([*command, str(path)])
        assert code == 0, (command, out, err)


@pytest.mark.parametrize("command", [c[0] for c in COMMANDS])
@pytest.mark.parametrize(
    ("field", "value"),
    [("spanId", 123), ("traceId", None), ("parentSpanId", 7), ("attributes", {"a": 1}), ("name", ["x"])],
)
def test_a_field_of_the_wrong_type_is_one_line_naming_file_and_line(
    tmp_path: Path, command: str, field: str, value: Any
) -> None:
    request = _request()
    request["resourceSpans"][0]["scopeSpans"][0]["spans"][2][field] = value
    path = tmp_path / "trace.jsonl"
    path.write_text(json.dumps(_request()) + "\n" + json.dumps(request) + "\n")
    code, _, err = _run([command, str(path)])
    assert code == 2
    (line,) = err.strip().splitlines()
    assert f"{path}:2:" in line and field in line, line


@settings(
    max_examples=100,
    deadline=None,
    derandomize=True,  # the same examples every run: a CI failure reproduces
    suppress_health_check=[HealthCheck.too_slow],
)
@given(request=broken_requests())
def test_no_malformed_trace_makes_a_reader_raise(request: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "trace.jsonl"
        path.write_text(json.dumps(copy.deepcopy(request)) + "\n", encoding="utf-8", errors="surrogatepass")
        _assert_readers_answer(path)


@pytest.mark.parametrize("command", [c[0] for c in COMMANDS])
@pytest.mark.parametrize(
    "content",
    [b"\xff\xfe{}\n", b"[1, 2]\n", b"[" * 100_000 + b"\n", b'{"resourceSpans": 5}\n'],
    ids=["not UTF-8", "an array", "nested too deep", "resourceSpans a number"],
)
def test_a_line_that_is_not_an_otlp_request_is_one_line_naming_it(
    tmp_path: Path, command: str, content: bytes
) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_bytes(json.dumps(_request()).encode() + b"\n" + content)
    code, _, err = _run([command, str(path)])
    assert code == 2
    (line,) = err.strip().splitlines()
    assert f"{path}:2:" in line, line


def _decoded(decode: Any, span: Any) -> Any:
    """What a decoder makes of a raw span: the span, or the message of the error it names."""
    from gymtrace._model.spandata import BadTraceData

    try:
        return decode(span, "service", "instance")
    except BadTraceData as exc:
        return str(exc)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(request=broken_requests())
def test_the_fast_decoder_reads_every_span_as_the_checked_decoder_reads_it(request: dict[str, Any]) -> None:
    # The readers decode most spans on a fast path without the per-field checks (issue 45); it
    # gives up on anything it does not read exactly as the checked path does.
    from gymtrace._model import spandata
    from gymtrace._read.check.stream import CHECK_KEYS

    def each(node: Any, key: str) -> list[dict[str, Any]]:
        found = node.get(key) if isinstance(node, dict) else None
        return [item for item in found if isinstance(item, dict)] if isinstance(found, list) else []

    spans = [
        span
        for resource in each(request, "resourceSpans")
        for scope in each(resource, "scopeSpans")
        for span in each(scope, "spans")
    ]
    assert spans or request != _request()
    for span in spans:
        assert _decoded(spandata.decode_span, span) == _decoded(spandata._checked_span, span)
        held = functools.partial(spandata._checked_span, read_events=False)
        assert _decoded(spandata.decode_held, span) == _decoded(held, span)
        lean = functools.partial(spandata._checked_span, keys=CHECK_KEYS)
        assert _decoded(functools.partial(spandata.decode_lean, keys=CHECK_KEYS), span) == _decoded(
            lean, span
        )


def _edited(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    span: dict[str, Any] = copy.deepcopy(_written()["resourceSpans"][0]["scopeSpans"][0]["spans"][-1])
    node = span
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    return span


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("attributes", 0, "value"), {"intValue": "5"}),  # gym.run.id must be text
        (("attributes", 0, "value"), {"stringValue": "5", "intValue": "5"}),
        (("attributes", 0, "key"), "gym.episode.attempt"),  # a key twice, the first of a wrong type
        (("attributes", 0, "key"), "gym.rollout.attempts"),
        (("attributes", 0, "value"), {"stringValue": "caf\u00e9"}),
        (("startTimeUnixNano",), "18446744073709551616"),  # 2^64
        (("startTimeUnixNano",), "99999999999999999999"),
        (("endTimeUnixNano",), "+5"),
        (("endTimeUnixNano",), 5),
        (("traceId",), "0AF7651916CD43DD8448EB211C80319C"),
        (("spanId",), "0x12345678901234"),
        (("kind",), True),
        (("kind",), 2.0),
        (("kind",), "SPAN_KIND_SERVER"),
        (("status",), {"code": True}),
        (("status",), {"code": 2, "message": "caf\u00e9"}),
        (("name",), "caf\u00e9"),
    ],
)
def test_the_fast_decoder_gives_way_to_the_checked_one_on_what_it_does_not_read_exactly(
    path: tuple[Any, ...], value: Any
) -> None:
    from gymtrace._model import spandata
    from gymtrace._read.check.stream import CHECK_KEYS

    span = _edited(path, value)
    assert _decoded(spandata.decode_span, span) == _decoded(spandata._checked_span, span)
    lean = functools.partial(spandata._checked_span, keys=CHECK_KEYS)
    assert _decoded(functools.partial(spandata.decode_lean, keys=CHECK_KEYS), span) == _decoded(lean, span)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(request=broken_requests())
def test_the_native_reader_reads_each_broken_request_as_the_python_reader_reads_it(
    request: dict[str, Any],
) -> None:
    # What it does not read exactly as gymtrace writes it, it leaves to the Python filter, or gives
    # the line back as it came for the Python reader to name.
    from native_reader import check_read, native_or_skip, read_parts

    native_or_skip()
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as monkeypatch:
        path = Path(tmp) / "broken.jsonl"
        path.write_text(json.dumps(_request()) + "\n" + json.dumps(request) + "\n")
        native = read_parts([path], monkeypatch, native=True)
        assert native == read_parts([path], monkeypatch, native=False)
        assert check_read([path], monkeypatch, native=True) == check_read([path], monkeypatch, native=False)
