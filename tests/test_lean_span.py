"""The lean span (``_otel_private.leanspan``, a private part with no public surface), against the SDK's.

It is the recording path under the provider ``configure()`` creates.

Each test runs a child process (the global provider can be set once per process): the same scenario
under gymtrace's own provider (lean path) and under ``capture_spans()`` (the stock SDK path) must
give the same span tree, and a span processor the application adds to gymtrace's provider must see
every span, foreign ones nested where they ran.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from child_process import run_python

SCENARIO = """
import json
import gymtrace
from opentelemetry import trace
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from gymtrace._scopes.tracing import current_provider
from gymtrace.testing import capture_spans, check_trace

gymtrace.configure(service_name="lean", file=False)
mem = InMemorySpanExporter()
trace.get_tracer_provider().add_span_processor(SimpleSpanProcessor(mem))

def scenario():
    library = current_provider().get_tracer("some.library")
    with gymtrace.run(run_id="run-1"):
        with gymtrace.rollout(rollout_id="r-1", task_id="t", repeat=0):
            with gymtrace.episode():
                with gymtrace.agent_invocation(agent_name="a"):
                    with gymtrace.step() as first:
                        with library.start_as_current_span("GET /env", attributes={"http.status": 200}):
                            pass
                        # An event and a link after the start (the lean span makes their lists then).
                        first.span.add_event("tick", {"n": 1})
                        first.span.add_link(first.span.get_span_context(), {"why": "self"})
                    try:
                        with gymtrace.step():
                            raise ValueError("boom")
                    except ValueError:
                        pass
                    # A list value is not a plain scalar: this span takes the SDK's own path.
                    with gymtrace.step(attributes={"custom.list": [1, 2, 3]}) as s:
                        s.set_attribute("late", "yes")
                        gymtrace.record_reward(1.0)

def shape(spans):
    by_id = {s.context.span_id: s for s in spans}
    out = []
    for s in spans:
        parent = by_id.get(s.parent.span_id) if s.parent else None
        attributes = {k: (list(v) if isinstance(v, tuple) else v) for k, v in s.attributes.items()
                      if not k.endswith(".id") or k.startswith("gym.")}
        out.append([s.name, s.kind.name, parent.name if parent else None, attributes,
                    s.status.status_code.name, [e.name for e in s.events], len(s.links),
                    s.dropped_events, s.dropped_links])
    return sorted(out, key=repr)

scenario()
lean = list(mem.get_finished_spans())
lean_types = sorted({type(s).__name__ for s in lean if s.instrumentation_scope.name == "gymtrace"})
problems = check_trace(lean)
with capture_spans() as captured:
    scenario()
print(json.dumps({"lean": shape(lean), "stock": shape(captured.spans), "types": lean_types,
                  "problems": [str(p) for p in problems], "count": len(lean)}))
"""


def run(code: str, tmp_path: Path, **env: str) -> dict[str, Any]:
    out = run_python(code=code, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def test_the_lean_path_gives_the_stock_span_tree_to_every_processor(tmp_path: Path) -> None:
    result = run(SCENARIO, tmp_path)
    # The application's own processor on gymtrace's provider saw every span, the foreign one too.
    assert result["count"] == 8
    assert result["lean"] == result["stock"]
    assert result["problems"] == []
    # Both paths ran: plain attributes on the lean one, the list-valued step on the SDK's.
    assert result["types"] == ["ReadableSpan", "_LeanSpan"]  # the SDK hands on_end a copy
    names = {(name, parent) for name, _, parent, *_ in result["lean"]}
    assert ("GET /env", "gym.step") in names


def test_the_sampler_still_decides_on_the_lean_path(tmp_path: Path) -> None:
    result = run(SCENARIO, tmp_path, GYMTRACE_SAMPLE_RATIO="0")
    # The rollout is sampled out, so none of its spans is recorded but its summary (the run span is
    # kept by design). (capture_spans() samples everything: no stock run to compare with here.)
    assert [s[0] for s in result["lean"]] == ["gym.rollout", "gym.run"]
    assert result["lean"][0][3]["gym.rollout.detail"] is False


def test_an_applications_own_provider_is_left_as_it_is(tmp_path: Path) -> None:
    code = """
    import json, gymtrace
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    trace.set_tracer_provider(TracerProvider())
    gymtrace.configure()
    from gymtrace._scopes.tracing import active_tracer
    print(json.dumps({"provider": type(trace.get_tracer_provider()).__name__,
                      "tracer": type(active_tracer()).__name__}))
    """
    assert run(code, tmp_path) == {"provider": "TracerProvider", "tracer": "Tracer"}


# Both tracers of one configured process, and a remote parent with the given W3C flags (None: no
# parent) and a trace state, for the tests comparing the lean path's decisions with the SDK's.
LEAN_AND_STOCK = """
import json, gymtrace
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from gymtrace._scopes.tracing import active_tracer
gymtrace.configure(service_name="lean", file=False)
lean = active_tracer()
stock = trace.get_tracer_provider().get_tracer("some.library")
def remote(flags):
    if flags is None:
        return None
    return TraceContextTextMapPropagator().extract({
        "traceparent": f"00-{'ab' * 16}-{'cd' * 8}-{flags}", "tracestate": "vendor=kept"})
"""


def test_the_default_sampler_decides_on_the_lean_path_as_the_sdk_does(tmp_path: Path) -> None:
    # The lean path answers the SDK's default sampler, ParentBased(ALWAYS_ON), itself: it must
    # give the SDK's answer for a root, and for a remote parent sampled or not, trace state kept.
    code = LEAN_AND_STOCK + textwrap.dedent("""
    assert type(lean).__name__ == "LeanTracer" and type(stock).__name__ == "Tracer"
    def answer(tracer, flags):
        span = tracer.start_span("gym.step", context=remote(flags), attributes={"gym.kind": "step"})
        ctx = span.get_span_context()
        span.end()
        return [span.is_recording() or ctx.trace_flags.sampled, ctx.trace_flags.sampled,
                ctx.trace_state.to_header(), flags is None or ctx.trace_id == int("ab" * 16, 16)]
    print(json.dumps({f: [answer(lean, f), answer(stock, f)] for f in (None, "00", "01")}, default=str))
    """)
    result = run(code, tmp_path)
    for flags, (lean, stock) in result.items():
        assert lean == stock, flags
    assert result["00"][0][1] is False  # a parent that was not sampled: not sampled here either
    assert result["01"][0][1:3] == [True, "vendor=kept"]
    assert result["null"][0][1] is True


PARENTS = """
import json, gymtrace
from opentelemetry import context, trace
from opentelemetry.propagate import extract
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

gymtrace.configure(service_name="lean", file=False)
mem = InMemorySpanExporter()
trace.get_tracer_provider().add_span_processor(SimpleSpanProcessor(mem))
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
out = {}
for flag in ("01", "00"):
    token = context.attach(extract({"traceparent": f"00-{TRACE}-00f067aa0ba902b7-{flag}", "tracestate": "vendor=abc"}))
    try:
        with gymtrace.run(run_id=f"run-{flag}"):
            with gymtrace.rollout(rollout_id=f"r-{flag}", task_id="t", repeat=0):
                pass
    finally:
        context.detach(token)
with gymtrace.run(run_id="root"):
    pass
for s in mem.get_finished_spans():
    ctx = s.get_span_context()
    out[s.name + ":" + s.attributes.get("gym.run.id", "")] = {
        "trace": f"{ctx.trace_id:032x}", "sampled": ctx.trace_flags.sampled,
        "state": dict(ctx.trace_state), "parent": f"{s.parent.span_id:016x}" if s.parent else None}
print(json.dumps(out))
"""


def test_the_default_samplers_decision_is_kept_for_every_kind_of_parent(tmp_path: Path) -> None:
    spans = run(PARENTS, tmp_path)
    # A sampled remote parent: both spans recorded in its trace, with its trace state.
    assert spans["gym.run:run-01"] == {
        "trace": "4bf92f3577b34da6a3ce929d0e0e4736",
        "sampled": True,
        "state": {"vendor": "abc"},
        "parent": "00f067aa0ba902b7",
    }
    # An unsampled remote parent: the run span below it is not recorded.
    assert "gym.run:run-00" not in spans
    # No parent (a rollout is the root of its own trace, and a run without a remote parent): a new
    # sampled trace with an empty trace state.
    for name in ("gym.run:root", "gym.rollout:run-01", "gym.rollout:run-00"):
        root = spans[name]
        assert root["sampled"] and root["state"] == {} and root["parent"] is None
        assert root["trace"] != "4bf92f3577b34da6a3ce929d0e0e4736"
    # Another sampler from the environment is still asked.
    assert run(PARENTS, tmp_path, OTEL_TRACES_SAMPLER="always_off") == {}


def test_a_child_of_a_lean_span_gets_the_trace_flags_and_state_the_sdk_gives(tmp_path: Path) -> None:
    # A lean parent's context is read as the tuple it is: its child must still get the SDK's
    # trace ID, parent, flags (sampled and random-trace-ID bits) and trace state.
    code = LEAN_AND_STOCK + textwrap.dedent("""
    def chain(tracer, flags):
        parent = tracer.start_span("gym.episode", context=remote(flags), attributes={"gym.kind": "episode"})
        child = tracer.start_span("gym.step", context=trace.set_span_in_context(parent),
                                  attributes={"gym.kind": "step"})
        child.end(); parent.end()
        ctx, pctx = child.get_span_context(), parent.get_span_context()
        return {"lean": type(parent).__name__ == "_LeanSpan", "same_trace": ctx.trace_id == pctx.trace_id,
                "parent": child.parent.span_id == pctx.span_id, "flags": int(ctx.trace_flags),
                "state": ctx.trace_state.to_header(), "valid": ctx.is_valid, "remote": ctx.is_remote}
    print(json.dumps({str(f): [chain(lean, f), chain(stock, f)] for f in (None, "01", "03")}))
    """)
    result = run(code, tmp_path)
    for flags, (lean, stock) in result.items():
        assert lean.pop("lean") and not stock.pop("lean"), flags
        assert lean == stock, flags
        assert lean["same_trace"] and lean["parent"] and lean["valid"] and not lean["remote"]
    assert result["01"][0]["state"] == "vendor=kept" and result["01"][0]["flags"] & 1
    assert result["03"][0]["flags"] == 3


def _spans_set_both_ways(limits: Any) -> tuple[Any, Any]:
    # The same calls on a lean span and on the SDK's own span, under the same limits.
    from opentelemetry.sdk.trace import TracerProvider

    from gymtrace._constants import INSTRUMENTATION_NAME
    from gymtrace._otel_private.leanspan import GymTracerProvider

    made = []
    for provider in (GymTracerProvider(span_limits=limits), TracerProvider(span_limits=limits)):
        span = provider.get_tracer(INSTRUMENTATION_NAME).start_span(
            "gym.episode", attributes={"gym.kind": "episode"}
        )
        span.set_attribute("gym.reward", 1.5)
        span.set_attribute("gym.kind", "episode")  # replaced, not duplicated
        span.set_attributes({"a": 1, "b": True, "c": "text", "d": 0.25})
        span.set_attribute("list", [1, 2])  # not plain: the SDK's path (made a tuple)
        span.set_attributes({"e": 2, "f": (3, 4)})
        span.add_event("gen_ai.evaluation.result", {"gen_ai.evaluation.score.value": 1.5, "name": "reward"})
        span.add_event("bare", timestamp=123)
        span.add_event("listed", {"values": [1.0, 2.0]})
        span.end()
        span.set_attribute("late", 1)  # ended: the SDK's warning, nothing set
        span.set_attributes({"late": 2})
        made.append(span)
    return made[0], made[1]


def _shape(span: Any) -> Any:
    return (
        list(span.attributes.items()),
        span.dropped_attributes,
        [(e.name, dict(e.attributes), e.attributes.dropped) for e in span.events],
        span.events[1].timestamp,
        span.dropped_events,
    )


@pytest.mark.parametrize(
    "limits",
    [{}, {"max_span_attributes": 5, "max_event_attributes": 1}, {"max_attribute_length": 3}],
    ids=["default limits", "count limits", "length limit"],
)
def test_attributes_and_events_set_after_start_match_the_sdk_span(
    limits: dict[str, int], caplog: Any
) -> None:
    from opentelemetry.sdk.trace import SpanLimits

    lean, stock = _spans_set_both_ways(SpanLimits(**limits))
    # A length limit is the SDK's to enforce: the lean tracer leaves that span to the SDK.
    assert type(lean).__name__ == ("_Span" if "max_attribute_length" in limits else "_LeanSpan")
    assert _shape(lean) == _shape(stock)
    assert "late" not in lean.attributes
    assert sum("ended span" in r.getMessage() for r in caplog.records) == 4  # two per span
    with pytest.raises(TypeError):
        lean.events[0].attributes["x"] = 1  # event attributes are immutable, as the SDK makes them


@pytest.mark.parametrize("max_events", [0, 1, 2, None])
@pytest.mark.parametrize("count", [1, 2, 3])
def test_events_match_the_sdk_span_under_every_event_limit(
    max_events: int | None, count: int, caplog: Any
) -> None:
    # A lean span keeps its first event without a bounded list (an episode's reward is its only
    # one); a second event, a limit of 0 or an ended span must still come out as the SDK's.
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider

    from gymtrace._constants import INSTRUMENTATION_NAME
    from gymtrace._otel_private.leanspan import GymTracerProvider

    limits = SpanLimits(max_events=max_events) if max_events is not None else SpanLimits()
    shapes = []
    for provider in (GymTracerProvider(span_limits=limits), TracerProvider(span_limits=limits)):
        span = provider.get_tracer(INSTRUMENTATION_NAME).start_span(
            "gym.episode", attributes={"gym.kind": "e"}
        )
        for n in range(count):
            span.add_event(f"e{n}", {"n": n}, timestamp=100 + n)
        span.end()
        span.add_event("late")  # ended: the SDK's warning, nothing added
        shapes.append(([(e.name, dict(e.attributes), e.timestamp) for e in span.events], span.dropped_events))
    assert shapes[0] == shapes[1]
    assert sum("ended span" in r.getMessage() for r in caplog.records) == 2


# -- an SDK the lean path was not built for (issue 31) -----------------------------------------------

NEW_SDK = """
import json, logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s %(levelname)s %(message)s")
from opentelemetry.sdk import trace as sdk_trace

# A release whose span has one more field, which its end() reads: a lean span, built field by
# field, would not have it.
init, end = sdk_trace.Span.__init__, sdk_trace.Span.end
def __init__(self, *args, **kwargs):
    init(self, *args, **kwargs)
    self._end_hooks = ()
def end_with_hooks(self, end_time=None):
    for hook in self._end_hooks:
        hook()
    end(self, end_time)
if "{change}" in ("field", "both"):
    sdk_trace.Span.__init__ = __init__
if "{change}" in ("end", "both"):
    sdk_trace.Span.end = end_with_hooks
    sdk_trace.Span._end_hooks = ()  # the SDK's own spans read the class default

import gymtrace
from gymtrace._otel_private import fastpaths as _fastpaths
from gymtrace._model.spandata import read_otlp_json_lines

gymtrace.configure(service_name="new-sdk", file="spans.jsonl")
with gymtrace.run(run_id="run-1"), gymtrace.rollout(rollout_id="r-1", task_id="t"):
    with gymtrace.episode():
        gymtrace.record_reward(1.0)
    body = "ran"
gymtrace.shutdown()
spans = read_otlp_json_lines("spans.jsonl")
print(json.dumps({{"body": body, "names": sorted(s.name for s in spans),
                  "missing": list(_fastpaths.status("lean spans").missing)}}))
"""


@pytest.mark.parametrize("change", ["field", "end", "both"])
def test_an_sdk_span_unlike_the_one_built_for_gets_the_sdks_own_spans(tmp_path: Path, change: str) -> None:
    out = run_python(code=NEW_SDK.format(change=change), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["body"] == "ran"
    # Every span exported, through the SDK's own spans.
    assert result["names"] == ["gym.episode", "gym.rollout", "gym.run"]
    assert "internal error" not in out.stderr and "Traceback" not in out.stderr
    # The probe names what differs: the extra field, or the code of Span's methods.
    if change in ("field", "both"):
        assert "sdk Span field not built for: _end_hooks" in result["missing"]
    assert any(m.startswith("sdk Span's code") for m in result["missing"])
    # One line says so, once.
    assert out.stderr.count("the SDK's own spans are used") == 1, out.stderr


def test_a_lean_span_whose_end_fails_is_reported_once_never_raised(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # What a new SDK release could do that the probe missed: its end() reads what only the spans
    # it builds itself have. The user's blocks run on, in strict mode too (this suite is strict);
    # one WARNING, and the next spans are the SDK's own.
    import logging

    from opentelemetry.sdk import trace as sdk_trace
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import gymtrace
    from gymtrace._otel_private import leanspan as _leanspan
    from gymtrace._scopes.tracing import pop_provider, push_provider

    sdk_end = sdk_trace.Span.end

    def end(self: Any, end_time: int | None = None) -> None:
        if type(self) is _leanspan._LeanSpan:
            raise AttributeError("'_LeanSpan' object has no attribute '_end_hooks'")
        sdk_end(self, end_time)

    monkeypatch.setattr(sdk_trace.Span, "end", end)
    monkeypatch.setattr(_leanspan._Lean, "on", True)
    exporter = InMemorySpanExporter()
    provider = _leanspan.GymTracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    push_provider(provider)
    try:
        with caplog.at_level(logging.WARNING, "gymtrace"):
            ran = []
            for rollout in ("r-lean", "r-sdk"):
                with gymtrace.rollout(rollout_id=rollout), gymtrace.episode():
                    gymtrace.record_reward(1.0)
                    ran.append(rollout)
    finally:
        pop_provider(provider)
        provider.shutdown()
    assert ran == ["r-lean", "r-sdk"]
    reports = [r for r in caplog.records if "lean span path" in r.getMessage()]
    assert len(reports) == 1 and "(end)" in reports[0].getMessage()
    assert _leanspan._Lean.on is False
    # The rollout after the failure went through the SDK's spans, whole.
    exported = {(s.name, s.attributes.get("gym.rollout.id")) for s in exporter.get_finished_spans()}
    assert {("gym.rollout", "r-sdk"), ("gym.episode", "r-sdk")} <= exported
