"""The native reader (``gymtrace_native``, Rust, built from native/ by scripts/native) gives every
summary reader and ``check`` the answer the Python reader gives, byte for byte, on what gymtrace
writes and on spans it does not read exactly (which it leaves to the Python filter and decoder); a
line it cannot read is named as the Python reader names it. ``_read.source`` and
``_read.check.stream`` (private) are compared whole per process."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from gymtrace import attributes as c
from gymtrace._cli import main
from gymtrace._model import environment as env
from gymtrace._model.spandata import encode_otlp_json
from gymtrace._read import source
from gymtrace.testing import capture_spans
from native_reader import check_read, native_or_skip, read_parts
from training_run import READERS as JSON_READERS
from training_run import training_run
from training_state import no_policy_version  # noqa: F401 - an autouse fixture

READERS = [*JSON_READERS, ["stats"]]


@pytest.fixture(autouse=True)
def _native() -> None:
    native_or_skip()


def _training_run() -> list[dict[str, Any]]:
    """:func:`training_run`'s spans as the requests gymtrace writes (five spans a line)."""
    with capture_spans() as captured:
        training_run(rollouts=8, run_id="native")
    spans = list(captured.spans)
    return [encode_otlp_json(spans[i : i + 5]) for i in range(0, len(spans), 5)]


def _spans(request: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for r in request["resourceSpans"] for scope in r["scopeSpans"] for s in scope["spans"]]


def _value(span: dict[str, Any], key: str) -> dict[str, Any]:
    return next(item for item in span["attributes"] if item["key"] == key)["value"]


def _set(span: dict[str, Any], key: str, value: dict[str, Any]) -> None:
    next(item for item in span["attributes"] if item["key"] == key)["value"] = value


def _model_call(requests: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A request holding a model call, and that span (of rollout r-0)."""
    for request in requests:
        for span in _spans(request):
            kind = next(
                (i["value"].get("stringValue") for i in span["attributes"] if i["key"] == c.KIND), None
            )
            if kind == "model_call" and _value(span, c.ROLLOUT_ID) == {"stringValue": "r-0"}:
                return request, span
    raise AssertionError("no model call of r-0")


# Each edits one model call of rollout r-0, a copy in a trace of its own: what gymtrace does not
# write, which the native reader must leave to the Python filter (or drop exactly as it does).
EDITS: dict[str, Any] = {
    "tokens as a JSON number": lambda s: _value(s, c.GEN_AI_USAGE_OUTPUT_TOKENS).update(intValue=7),
    "tokens as text": lambda s: s["attributes"].__setitem__(
        -1, {"key": c.GEN_AI_USAGE_OUTPUT_TOKENS, "value": {"stringValue": "7"}}
    ),
    "tokens past 64 bits": lambda s: _value(s, c.GEN_AI_USAGE_OUTPUT_TOKENS).update(intValue=str(2**70)),
    "end as a JSON number": lambda s: s.update(endTimeUnixNano=int(s["endTimeUnixNano"])),
    "start with a sign": lambda s: s.update(startTimeUnixNano="+" + s["startTimeUnixNano"]),
    "a key twice": lambda s: s["attributes"].append({"key": c.ROLLOUT_ID, "value": {"stringValue": "r-x"}}),
    "a rollout ID beyond ASCII": lambda s: _value(s, c.ROLLOUT_ID).update(stringValue="r-caf\u00e9"),
    "a trace ID in capitals": lambda s: s.update(traceId=s["traceId"].upper()),
    "NeMo Gym's rollout ID": lambda s: s["attributes"].__setitem__(
        next(i for i, a in enumerate(s["attributes"]) if a["key"] == c.ROLLOUT_ID),
        {"key": c.NEMO_GYM_ROLLOUT_ID, "value": {"stringValue": "r-0-a1"}},
    ),
    "a Ray re-run": lambda s: s["attributes"].append({"key": "ray.task.attempt", "value": {"intValue": "1"}}),
    "an attempt as text": lambda s: _set(s, c.EPISODE_ATTEMPT, {"stringValue": "0"}),
    "a run ID as a number": lambda s: s["attributes"].__setitem__(
        0, {"key": c.RUN_ID, "value": {"intValue": "5"}}
    ),
    "a policy version as text": lambda s: _set(s, c.POLICY_VERSION, {"stringValue": "v1"}),
    "a policy version as a double": lambda s: _set(s, c.POLICY_VERSION, {"doubleValue": 1.0}),
    "a kind with a second member": lambda s: _value(s, c.KIND).update(intValue="1"),
    "a kind the readers read": lambda s: _value(s, c.KIND).update(stringValue="episode"),
    "no kind, a chat operation": lambda s: s["attributes"].remove(
        next(a for a in s["attributes"] if a["key"] == c.KIND)
    ),
    "an attribute without a value": lambda s: s["attributes"].append({"key": "note"}),
    "attributes null": lambda s: s.update(attributes=None),
}


def _rollout_root(requests: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A request holding a rollout root, and that span (a kind the readers read: the native reader
    makes it itself when it reads it plainly)."""
    for request in requests:
        for span in _spans(request):
            if any(
                i["key"] == c.KIND and i["value"] == {"stringValue": "rollout"} for i in span["attributes"]
            ):
                return request, span
    raise AssertionError("no rollout root")


# Each edits a rollout root (with its link to the run), a copy in a trace of its own: what the
# native reader must make exactly as the Python decoder makes it, or leave to it.
ROOT_EDITS: dict[str, Any] = {
    "as written": lambda s: None,
    "a reward as a double": lambda s: _set(s, c.REWARD, {"doubleValue": 0.1}),
    "a reward as an integer": lambda s: _set(s, c.REWARD, {"intValue": "1"}),
    "an attribute that is an array": lambda s: s["attributes"].append(
        {"key": "note", "value": {"arrayValue": {"values": [{"stringValue": "a"}]}}}
    ),
    "an attribute given twice": lambda s: s["attributes"].append(
        {"key": c.TASK_ID, "value": {"stringValue": "t-9"}}
    ),
    "a value of two members": lambda s: _set(s, c.TASK_ID, {"stringValue": "t", "intValue": "1"}),
    "text beyond ASCII": lambda s: _set(s, c.TASK_ID, {"stringValue": "t-caf\u00e9"}),
    "a span ID in capitals": lambda s: s.update(spanId=s["spanId"].upper()),
    "no parent": lambda s: s.pop("parentSpanId", None),
    "a parent of null": lambda s: s.update(parentSpanId=None),
    "a kind of 2": lambda s: s.update(kind=2),
    "a kind of null": lambda s: s.update(kind=None),
    "no kind": lambda s: s.pop("kind", None),
    "an error status with a message": lambda s: s.update(status={"code": 2, "message": "boom"}),
    "a status message beyond ASCII": lambda s: s.update(status={"code": 2, "message": "caf\u00e9"}),
    "a status of null": lambda s: s.update(status=None),
    "a status code of 7": lambda s: s.update(status={"code": 7}),
    "a link in capitals": lambda s: [link.update(traceId=link["traceId"].upper()) for link in s["links"]],
    "a link attribute as an integer": lambda s: [
        link["attributes"].append({"key": "n", "value": {"intValue": "3"}}) for link in s["links"]
    ],
    "links of null": lambda s: s.update(links=None),
    "a link's attributes of null": lambda s: [link.update(attributes=None) for link in s["links"]],
    "an event": lambda s: s.update(events=[{"timeUnixNano": "1", "name": "e", "attributes": []}]),
    "NeMo Gym's rollout ID": lambda s: s["attributes"].append(
        {"key": c.NEMO_GYM_ROLLOUT_ID, "value": {"stringValue": "r-0-a1"}}
    ),
}
# What the decoder names as an error (exit 2): the native reader leaves it to it.
BAD_ROOT_EDITS: dict[str, Any] = {
    # Values are read as they are walked: one that is not an object is read past whole and left
    # to the decoder, which names it.
    "a value that is an array": lambda s: s["attributes"].append({"key": "note", "value": [1, {"a": [2]}]}),
    "a value that is a number": lambda s: s["attributes"].append({"key": "note", "value": 5}),
    "a reward as text": lambda s: _set(s, c.REWARD, {"stringValue": "1"}),
    "attempts as a boolean": lambda s: _set(s, c.ROLLOUT_ATTEMPTS, {"boolValue": True}),
    "a kind of 2.0": lambda s: s.update(kind=2.0),
    "attributes as an object": lambda s: s.update(
        attributes={"key": c.KIND, "value": {"stringValue": "rollout"}}
    ),
    "a link attribute of the wrong type": lambda s: [
        link["attributes"].append({"key": c.LINK_RELATION, "value": {"intValue": "3"}}) for link in s["links"]
    ],
}


def _alone(request: dict[str, Any], span: dict[str, Any]) -> dict[str, Any]:
    """``request`` (its resource) holding only ``span``."""
    return {**request, "resourceSpans": [{**request["resourceSpans"][0], "scopeSpans": [{"spans": [span]}]}]}


def _edited(request: dict[str, Any], span: dict[str, Any], edits: Any, trace_id: Any) -> list[dict[str, Any]]:
    """A request per edit, each holding a copy of ``span`` so edited, in a trace of its own."""
    made = []
    for n, edit in enumerate(edits):
        copied = copy.deepcopy(span)
        copied["traceId"] = trace_id(n)
        edit(copied)
        made.append(_alone(request, copied))
    return made


@pytest.fixture
def run_file(tmp_path: Path) -> Path:
    requests = _training_run()
    requests += _edited(*_model_call(requests), EDITS.values(), lambda n: f"{n + 1:032x}")
    requests += _edited(*_rollout_root(requests), ROOT_EDITS.values(), lambda n: f"{n + 1:016x}{0:016x}")
    path = tmp_path / "run.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in requests))
    return path


def test_the_native_reader_drops_spans_and_takes_what_the_python_filter_takes(
    run_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reducer = source.summary_reducer()
    lines = run_file.read_bytes().splitlines()
    reduced = [reducer.reduce(line) for line in lines]
    # A line comes back with the spans Python reads, or as those spans made (a list): no tool
    # call or step of the run is among them (the edited copies are all model calls and roots).
    kinds = [span.attributes.get(c.KIND) for line in reduced if isinstance(line, list) for span in line] + [
        next((i["value"].get("stringValue") for i in span["attributes"] or [] if i["key"] == c.KIND), None)
        for line in reduced
        if not isinstance(line, list)
        for span in _spans(json.loads(line))
    ]
    assert "rollout" in kinds and "episode" in kinds
    assert "tool_call" not in kinds and "step" not in kinds
    assert any(isinstance(line, list) for line in reduced)  # made in Rust
    assert reducer.ends() and reducer.tokens() and reducer.times()
    assert read_parts([run_file], monkeypatch, native=True) == read_parts(
        [run_file], monkeypatch, native=False
    )


@pytest.mark.parametrize("argv", READERS, ids=" ".join)
def test_every_summary_reader_answers_byte_for_byte_as_without_the_native_reader(
    run_file: Path, argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    answers = []
    for setting in ("on", "off"):
        monkeypatch.setenv(env.GYMTRACE_NATIVE_READER, setting)
        code = main([*argv, str(run_file)])
        answers.append((code, *capsys.readouterr()))
    assert answers[0][0] == 0 and answers[0][1], answers[0][2]
    assert answers[0] == answers[1]


@pytest.mark.parametrize(
    "edit",
    [("model call", name) for name in EDITS] + [("root", name) for name in {**ROOT_EDITS, **BAD_ROOT_EDITS}],
    ids=" ".join,
)
def test_check_holds_every_span_as_it_holds_it_without_the_native_reader(
    tmp_path: Path, edit: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each edit alone after a training run: check stops at the first line its decoder names.
    requests = _training_run()
    if edit[0] == "model call":
        requests += _edited(*_model_call(requests), [EDITS[edit[1]]], lambda n: f"{n + 1:032x}")
    else:
        edits = {**ROOT_EDITS, **BAD_ROOT_EDITS}
        requests += _edited(*_rollout_root(requests), [edits[edit[1]]], lambda n: f"{n + 1:016x}{0:016x}")
    path = tmp_path / "run.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in requests))
    native = check_read([path], monkeypatch, native=True)
    assert native == check_read([path], monkeypatch, native=False)
    if native["error"] is None:
        assert len(native["spans"]) == sum(len(_spans(r)) for r in requests)


def test_check_answers_byte_for_byte_as_without_the_native_reader(
    run_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    clean = run_file.with_name("clean.jsonl")
    clean.write_text("".join(json.dumps(r) + "\n" for r in _training_run()))
    answers = []
    for path in (run_file, clean):
        for setting in ("on", "off"):
            monkeypatch.setenv(env.GYMTRACE_NATIVE_READER, setting)
            code = main(["check", str(path)])
            answers.append((code, *capsys.readouterr()))
    assert answers[0] == answers[1] and answers[2] == answers[3]
    assert answers[0][0] == 2 and answers[2][0] == 0, answers  # a line it names; a clean run


def test_check_reads_each_line_of_a_training_run_in_rust_consumed_records_too(tmp_path: Path) -> None:
    from gymtrace._read.check.stream import CHECK_KEYS

    requests = _training_run()
    kinds = {next((i["value"]["stringValue"] for i in s["attributes"] if i["key"] == c.KIND), None)
             for r in requests for s in _spans(r)}  # fmt: skip
    assert {c.KIND_CONSUMED, c.KIND_TRAIN_STEP, c.KIND_ROLLOUT, c.KIND_STEP} <= kinds
    reducer = source.summary_reducer(check=CHECK_KEYS)
    made = [reducer.reduce(json.dumps(r).encode()) for r in requests]
    assert all(isinstance(line, list) for line in made)  # no line left for Python to parse
    held = {span.span_id: span for line in made for span in line}
    consumed = next(s for s in held.values() if s.attributes.get(c.KIND) == c.KIND_CONSUMED)
    assert isinstance(consumed.attributes["gym.consumed.rollout_ids"], tuple)  # an array, whole
    step = next(s for s in held.values() if s.attributes.get(c.KIND) == c.KIND_STEP)
    assert set(step.attributes) <= CHECK_KEYS and not step.links  # lean: what a rule reads


def _escaped(line: str) -> str:
    """``line`` with member names, attribute keys and text values written with JSON escapes (as
    another writer may write them): the same JSON."""
    for text in ('"traceId"', '"stringValue"', f'"{c.ROLLOUT_ID}"', f'"{c.KIND}"', '"key"', '"rollout"'):
        line = line.replace(text, f"{text[:2]}\\u{ord(text[2]):04x}{text[3:]}")
    return line


def test_text_written_with_escapes_reads_as_the_same_text_with_the_native_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The native reader borrows text from the line where it holds no escape and makes it where it
    # does: both must read as the Python reader reads them.
    lines = [json.dumps(r) for r in _training_run()]
    escaped = [_escaped(line) for line in lines]
    assert escaped != lines and [json.loads(e) for e in escaped] == [json.loads(line) for line in lines]
    plain, written = tmp_path / "plain.jsonl", tmp_path / "escaped.jsonl"
    plain.write_text("".join(line + "\n" for line in lines))
    written.write_text("".join(line + "\n" for line in escaped))
    from gymtrace._read.check.stream import CHECK_KEYS

    reducer = source.summary_reducer(check=CHECK_KEYS)
    made = [reducer.reduce(line.encode()) for line in escaped]
    assert all(isinstance(spans, list) for spans in made)  # read in Rust, no line left to Python
    assert made == [reducer.reduce(line.encode()) for line in lines]
    native = check_read([written], monkeypatch, native=True)
    assert native["error"] is None and native["spans"]
    assert native == check_read([written], monkeypatch, native=False)
    assert native["spans"] == check_read([plain], monkeypatch, native=True)["spans"]
    answers = []
    for argv in (["check"], ["stats"], ["rollouts", "--json"]):
        for path in (plain, written):
            code = main([*argv, str(path)])
            answers.append((code, *capsys.readouterr()))
    assert answers[0][0] == 0 and all(a == b for a, b in zip(answers[::2], answers[1::2], strict=True))


@pytest.mark.parametrize(
    "tail",
    [
        b'{"resourceSpans": [',  # a last line cut short: one warning
        b"not json\n",  # an error naming the line
        b'{"resourceSpans": [{"scopeSpans": [{"spans": [1]}]}]}\n',  # a span that is no object
        b'{"resourceSpans": [{"resource": {"attributes": 5}, "scopeSpans": []}]}\n',
        b'{"resourceSpans": [], "x": "\xff"}\n',  # not UTF-8
        # A model call that ends past 2^64 ns: named by the decoder (it was an OverflowError).
        b'{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"0af7651916cd43dd8448eb211c80319c",'
        b'"spanId":"00000000000000a1","name":"m","startTimeUnixNano":"1","endTimeUnixNano":'
        b'"99999999999999999999","attributes":[{"key":"gym.rollout.id","value":{"stringValue":"r"}},'
        b'{"key":"gym.kind","value":{"stringValue":"model_call"}}]}]}]}]}\n',
    ],
    ids=[
        "cut short",
        "not JSON",
        "a span of another type",
        "a bad resource",
        "not UTF-8",
        "a time past 2^64",
    ],
)
def test_a_line_the_native_reader_cannot_read_is_named_as_the_python_reader_names_it(
    run_file: Path, tail: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    with run_file.open("ab") as f:
        f.write(tail)
    native = read_parts([run_file], monkeypatch, native=True)
    assert native == read_parts([run_file], monkeypatch, native=False)
    assert native["warnings"] or native["error"]
    checked = check_read([run_file], monkeypatch, native=True)
    assert checked == check_read([run_file], monkeypatch, native=False)
    assert checked["warnings"] or checked["error"]


def test_gymtrace_native_reader_off_reads_with_python_alone_and_a_bad_value_is_named(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(env.GYMTRACE_NATIVE_READER, "off")
    assert source.summary_reducer() is None
    monkeypatch.setenv(env.GYMTRACE_NATIVE_READER, "maybe")
    assert source.summary_reducer() is not None
    assert "GYMTRACE_NATIVE_READER='maybe' is not one of ('on', 'off')" in caplog.text


def test_what_it_took_of_a_last_line_the_reader_skips_is_taken_back(
    run_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A killed writer's last line, whole JSON but without its newline, with a span that is no
    # object before spans the native reader drops: skipped with a warning, none of it counted. (A
    # bad span after them: the Python filter has counted the spans before it, the native reader
    # counts none.)
    lines = run_file.read_text().splitlines()
    request = json.loads(lines[1])
    request["resourceSpans"][0]["scopeSpans"][0]["spans"].insert(0, 1)
    with run_file.open("a") as f:
        f.write(json.dumps(request))
    native = read_parts([run_file], monkeypatch, native=True)
    assert native == read_parts([run_file], monkeypatch, native=False)
    assert len(native["warnings"]) == 1 and native["error"] is None


@pytest.mark.parametrize("edit", BAD_ROOT_EDITS.values(), ids=BAD_ROOT_EDITS.keys())
def test_a_root_the_decoder_names_as_wrong_is_named_with_the_native_reader_too(
    run_file: Path, edit: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    request, root = _rollout_root([json.loads(line) for line in run_file.read_text().splitlines()])
    span = copy.deepcopy(root)
    edit(span)
    with run_file.open("a") as f:
        f.write(json.dumps(_alone(request, span)) + "\n")
    native = read_parts([run_file], monkeypatch, native=True)
    assert native == read_parts([run_file], monkeypatch, native=False)
    assert native["error"] and "must be" in native["error"]
