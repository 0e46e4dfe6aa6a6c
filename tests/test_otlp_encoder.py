"""The lean OTLP encoder (``_sdk.otlp``, a private part with no public surface) against the SDK's.

Span for span.

Every test builds real SDK spans, encodes them both ways and decodes the lean bytes with the
official ``opentelemetry-proto`` class: the two ``ExportTraceServiceRequest`` messages must be
equal, so a Collector cannot tell which encoder sent a batch.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from gymtrace._model.spandata import decode_otlp_json, encode_otlp_json
from gymtrace._sdk import otlp as _otlp


class Keep(SpanExporter):
    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS


@pytest.fixture
def provider() -> Iterator[tuple[TracerProvider, Keep]]:
    keep = Keep()
    provider = TracerProvider(
        resource=Resource.create({"service.name": "encoder-test", "deployment.env": "ci", "pid": 42})
    )
    provider.add_span_processor(SimpleSpanProcessor(keep))
    yield provider, keep
    provider.shutdown()


def lean(spans: Sequence[ReadableSpan]) -> ExportTraceServiceRequest:
    return ExportTraceServiceRequest.FromString(_otlp.encode_request(spans))


EVERY_TYPE = {
    "s": "text",
    "s.empty": "",
    "s.unicode": "épisode ✓ 步",
    "b.true": True,
    "b.false": False,
    "i.zero": 0,
    "i.small": 7,
    "i.big": 2**62,
    "i.negative": -3,
    "i.min": -(2**63),
    "f": 0.25,
    "f.negative": -1e300,
    "f.zero": 0.0,
    "a.str": ("a", "b", ""),
    "a.int": (1, -2, 3),
    "a.float": (0.5, 1.5),
    "a.bool": (True, False),
    "a.empty": (),
}


def test_every_attribute_type_event_link_status_and_kind_decodes_like_the_sdk_encoding(provider) -> None:
    tp, keep = provider
    tracer = tp.get_tracer("gymtrace.test", "1.2.3", schema_url="https://opentelemetry.io/schemas/1.21.0")
    remote = SpanContext(
        trace_id=0x0AF7651916CD43DD8448EB211C80319C,
        span_id=0x00F067AA0BA902B7,
        is_remote=True,
        trace_flags=TraceFlags(1),
        trace_state=TraceState([("vendor", "v1"), ("gym", "x")]),
    )
    linked = SpanContext(trace_id=0x1234, span_id=0x5678, is_remote=False)
    with tracer.start_as_current_span(
        "gym.rollout",
        kind=SpanKind.SERVER,
        attributes=EVERY_TYPE,
        links=[Link(linked, {"why": "retry", "n": 2})],
    ) as root:
        root.add_event("gym.reward", {"value": 1.5, "final": True})
        root.add_event("bare")
        for kind in SpanKind:
            with tracer.start_as_current_span(f"child.{kind.name}", kind=kind) as child:
                child.set_status(Status(StatusCode.ERROR, "it broke"))
        with tracer.start_as_current_span("ok") as ok:
            ok.set_status(StatusCode.OK)
    with tracer.start_as_current_span(
        "from.remote", context=trace.set_span_in_context(trace.NonRecordingSpan(remote))
    ):
        pass

    assert len(keep.spans) == 8
    assert lean(keep.spans) == encode_spans(keep.spans)


def test_spans_of_two_resources_and_scopes_are_grouped_like_the_sdk_groups_them(provider) -> None:
    tp, keep = provider
    other_keep = Keep()
    other = TracerProvider(resource=Resource.create({"service.name": "other"}))
    other.add_span_processor(SimpleSpanProcessor(other_keep))
    for i in range(3):
        tp.get_tracer("scope.a").start_span(f"a{i}").end()
        tp.get_tracer("scope.b", "0.1").start_span(f"b{i}").end()
        other.get_tracer("scope.a").start_span(f"o{i}").end()
    spans = keep.spans + other_keep.spans
    request = lean(spans)
    assert request == encode_spans(spans)
    assert [len(rs.scope_spans) for rs in request.resource_spans] == [2, 1]
    # Interleaved, as three tracers' spans end: each encoder groups them all the same.
    interleaved = [
        span
        for trio in zip(keep.spans[::2], keep.spans[1::2], other_keep.spans, strict=True)
        for span in trio
    ]
    assert lean(interleaved) == encode_spans(interleaved)
    assert json.loads(_otlp.encode_json_line(interleaved)) == json.loads(
        json.dumps(encode_otlp_json(interleaved))
    )
    other.shutdown()


def test_spans_sharing_a_name_or_a_status_object_keep_their_own_kind_status_and_size(provider) -> None:
    # The encoders cache a name with its kind, and the last status object: neither may leak into
    # the next span. One span is larger than 16 KiB (a three-byte length).
    tp, keep = provider
    tracer = tp.get_tracer("t")
    shared = Status(StatusCode.ERROR, "shared")
    for kind in (SpanKind.CLIENT, SpanKind.SERVER, SpanKind.CLIENT):
        for status in (shared, None, shared, Status(StatusCode.OK)):
            span = tracer.start_span("same.name", kind=kind)
            if status is not None:
                span.set_status(status)
            span.end()
    tracer.start_span("large", attributes={"gen_ai.prompt": "y" * 20_000}).end()
    assert lean(keep.spans) == encode_spans(keep.spans)
    assert json.loads(_otlp.encode_json_line(keep.spans)) == json.loads(
        json.dumps(encode_otlp_json(keep.spans))
    )


def test_a_batch_over_the_request_bound_is_split_without_losing_or_repeating_a_span(provider) -> None:
    tp, keep = provider
    tracer = tp.get_tracer("big")
    for i in range(40):
        tracer.start_span(f"s{i}", attributes={"gen_ai.prompt": "x" * 3000, "i": i}).end()
    requests = _otlp.encode_requests(keep.spans, max_bytes=20_000)
    assert len(requests) > 1
    names: list[str] = []
    for count, body in requests:
        assert len(body) <= 20_000
        decoded = ExportTraceServiceRequest.FromString(body)
        spans_in = [s.name for rs in decoded.resource_spans for ss in rs.scope_spans for s in ss.spans]
        assert len(spans_in) == count
        names.extend(spans_in)
    assert names == [f"s{i}" for i in range(40)]


def test_an_unencodable_attribute_is_left_out_and_the_rest_of_the_span_kept(provider, caplog) -> None:
    tp, keep = provider
    span = tp.get_tracer("t").start_span("odd", attributes={"fine": 1})
    # Bypass the SDK's attribute validation the way a buggy processor could.
    span._attributes._dict["bad"] = object()  # type: ignore[attr-defined]
    span.end()
    decoded = lean(keep.spans)
    [s] = decoded.resource_spans[0].scope_spans[0].spans
    assert [a.key for a in s.attributes] == ["fine"]
    assert "'bad' could not be encoded" in caplog.text


def test_repeated_identity_attributes_come_from_the_cache_and_still_decode(provider) -> None:
    tp, keep = provider
    tracer = tp.get_tracer("t")
    for step in range(50):
        tracer.start_span("gym.step", attributes={"gym.run.id": "r", "gym.step.number": step % 5}).end()
    assert lean(keep.spans) == encode_spans(keep.spans)
    assert lean(keep.spans) == encode_spans(keep.spans)  # second pass: every attribute cached


def test_an_attribute_on_a_span_and_on_its_event_and_link_is_kept_on_each(provider) -> None:
    # The same key and value is a different protobuf field on a span, an event, a link and the
    # resource: a cached encoding of one must not be reused for another.
    tp, keep = provider
    tracer = tp.get_tracer("t", attributes={"gym.run.id": "r"})
    linked = SpanContext(trace_id=0x1234, span_id=0x5678, is_remote=False)
    for _ in range(2):  # the second span is encoded from the cache
        with tracer.start_as_current_span(
            "gym.step", attributes={"gym.run.id": "r", "pid": 42}, links=[Link(linked, {"gym.run.id": "r"})]
        ) as span:
            span.add_event("gym.reward", {"gym.run.id": "r", "pid": 42})
    request = lean(keep.spans)
    assert request == encode_spans(keep.spans)
    [scope_spans] = request.resource_spans[0].scope_spans
    assert [a.key for a in scope_spans.scope.attributes] == ["gym.run.id"]
    for span in scope_spans.spans:
        assert [a.key for a in span.attributes] == ["gym.run.id", "pid"]
        assert [a.key for a in span.events[0].attributes] == ["gym.run.id", "pid"]
        assert [a.key for a in span.links[0].attributes] == ["gym.run.id"]


def test_the_file_exporters_json_line_is_the_json_of_the_reference_encoding(provider) -> None:
    tp, keep = provider
    tracer = tp.get_tracer("gymtrace.test", "1.2.3")
    linked = SpanContext(trace_id=0x1234, span_id=0x5678, is_remote=False)
    with tracer.start_as_current_span(
        "gym.rollout", kind=SpanKind.CLIENT, attributes=EVERY_TYPE, links=[Link(linked, {"why": "retry"})]
    ) as root:
        root.add_event("gym.reward", {"value": 1.5, "note": 'quote " and \\ and \ud800'})
        root.set_status(Status(StatusCode.ERROR, "broke ✓"))
        with tracer.start_as_current_span("child \n name"):
            pass
    tp.get_tracer("other.scope").start_span("lonely").end()
    line = _otlp.encode_json_line(keep.spans)
    assert "\n" not in line
    assert json.loads(line) == json.loads(json.dumps(encode_otlp_json(keep.spans)))
    assert [s.name for s in decode_otlp_json(json.loads(line))] == ["child \n name", "gym.rollout", "lonely"]


EXPORTING_CHILD = """
import dataclasses, json, os, sys
import gymtrace
from opentelemetry import trace
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from gymtrace._sdk import setup as _setup
from gymtrace._model.spandata import from_readable

if os.environ.get("GYMTRACE_ENCODER") == "auto":
    # What is tested is the move mid-run with nothing lost, not this machine's speed: the in-memory
    # copy below slows every span, and beside other test lanes 512 spans did not always end within
    # 0.4 s. Any 512 spans within ten minutes move it, a few hundred spans into the loop.
    from gymtrace._sdk import export_auto as _export_auto
    _export_auto.UPGRADE_SPANS = 512
    _export_auto.UPGRADE_WINDOW = 600.0

gymtrace.configure(service_name="lean-wire", endpoint=sys.argv[1], protocol=sys.argv[2], file=False)
steps = int(sys.argv[3])
kept = InMemorySpanExporter()
trace.get_tracer_provider().add_span_processor(SimpleSpanProcessor(kept))
with gymtrace.run(run_id="run-w"):
    with gymtrace.rollout(rollout_id="r-w", task_id="t", repeat=0):
        with gymtrace.episode() as episode:
            for _ in range(steps):
                with gymtrace.step(attributes={"custom.list": [1, 2], "custom.f": 0.5}):
                    pass
            try:
                with gymtrace.tool_call(tool_name="boom"):
                    raise ValueError("no")
            except ValueError:
                pass
            episode.record_reward(1.0)
gymtrace.force_flush()
stats = gymtrace.export_stats()[0]
[queue] = _setup._state.stage.processors()
print(json.dumps({"spans": [dataclasses.asdict(from_readable(s)) for s in kept.get_finished_spans()],
                  "exported": stats.exported, "dropped": stats.dropped,
                  "encoder": getattr(queue, "encoder", None)}))
"""


def _comparable(span: dict) -> tuple:
    def plain(value: object) -> object:
        return list(value) if isinstance(value, (tuple, list)) else value

    return (
        span["span_id"],
        span["parent_id"],
        span["name"],
        span["span_kind"],
        span["status"],
        span["status_message"],
        tuple(sorted((k, repr(plain(v))) for k, v in span["attributes"].items())),
        tuple(e["name"] for e in span["events"]),
        tuple(link["span_id"] for link in span["links"]),
    )


# auto: enough steps, fast enough, to move from the thread queue to the encoder process mid-run.
@pytest.mark.parametrize(("encoder", "steps"), [("thread", 3), ("process", 3), ("auto", 6000)])
@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_the_lean_exporters_deliver_what_the_process_recorded(
    protocol: str, encoder: str, steps: int, tmp_path
) -> None:
    import dataclasses

    from child_process import run_python
    from otlp_receiver import grpc_receiver, http_receiver

    receiver_for = {"grpc": grpc_receiver, "http/protobuf": http_receiver}[protocol]
    with receiver_for() as receiver:
        out = run_python(
            receiver.endpoint,
            protocol,
            str(steps),
            code=EXPORTING_CHILD,
            cwd=tmp_path,
            env={"GYMTRACE_ENCODER": encoder},
        )
        assert out.returncode == 0, out.stderr
        result = json.loads(out.stdout.strip().splitlines()[-1])
        received = [dataclasses.asdict(s) for s in receiver.spans]
    assert (result["exported"], result["dropped"]) == (len(result["spans"]), 0)
    assert len(received) == len(result["spans"]) == steps + 4
    if encoder == "auto":
        assert result["encoder"] == "process"
    assert sorted(map(_comparable, received)) == sorted(map(_comparable, result["spans"]))


def test_spans_of_gymtraces_lean_tracer_encode_like_the_sdk_encodes_them() -> None:
    # The encoders read the SDK's span classes (and gymtrace's lean span) from their fields, not
    # their properties: events, links, dropped counts and a status must come out the same.
    from opentelemetry.sdk.trace import SpanLimits

    from gymtrace._constants import INSTRUMENTATION_NAME
    from gymtrace._otel_private.leanspan import GymTracerProvider, _LeanSpan

    keep = Keep()
    tp = GymTracerProvider(
        resource=Resource.create({"service.name": "lean-encoder-test"}),
        span_limits=SpanLimits(max_span_attributes=3, max_events=1, max_links=1),
    )
    tp.add_span_processor(SimpleSpanProcessor(keep))
    tracer = tp.get_tracer(INSTRUMENTATION_NAME, "1.0")
    linked = [Link(SpanContext(trace_id=0x1234, span_id=n, is_remote=True), {"n": n}) for n in (1, 2)]
    with tracer.start_as_current_span("gym.episode", attributes={"gym.kind": "episode", "i": 3}) as episode:
        with tracer.start_as_current_span("gym.step", attributes={"gym.kind": "step", "f": 0.5}) as step:
            step.add_event("first", {"k": "v"})
            step.add_event("second")  # over max_events: dropped and counted
            step.set_attribute("extra.1", True)
            step.set_attribute("extra.2", "x")  # over max_span_attributes: dropped and counted
            step.set_status(Status(StatusCode.ERROR, "no ✓"))
        with tracer.start_as_current_span("gym.step", attributes={"gym.kind": "step"}, links=linked):
            pass
        episode.set_attribute("gym.reward", 1.0)
    tp.shutdown()

    assert type(keep.spans[0]) is _LeanSpan  # the first step took the lean path
    assert keep.spans[0].dropped_attributes == 1 and keep.spans[0].dropped_events == 1
    assert keep.spans[1].dropped_links == 1
    assert lean(keep.spans) == encode_spans(keep.spans)
    line = _otlp.encode_json_line(keep.spans)
    assert json.loads(line) == json.loads(json.dumps(encode_otlp_json(keep.spans)))
