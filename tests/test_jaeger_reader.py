"""The Jaeger reader (``_read.jaeger``, private) against Jaeger's two JSON shapes, with no Jaeger running.

Reading Jaeger's JSON into span records: link relations from v3 (OTLP JSON) where Jaeger keeps
them, inferred from the linking span where it cannot (the v1 API drops link attributes).

The round trip through a real Jaeger is in tests/e2e (test_keep_rules_and_delay.py,
test_demo_in_jaeger.py); these pin the two JSON shapes themselves."""

from __future__ import annotations

import copy
import http.server
import json
import threading
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import gymtrace
from gymtrace import attributes as c
from gymtrace._cli import main
from gymtrace._model.spandata import SpanData, encode_spandata_json, normalize
from gymtrace._read import jaeger as jaeger_module
from gymtrace._read.jaeger import (
    JaegerClient,
    JaegerError,
    link_relations_from_otlp,
    spans_from_jaeger,
    with_relations,
)
from gymtrace.testing import capture_spans

TRACE = "0af7651916cd43dd8448eb211c80319c"
RUN_TRACE = "00000000000000001111111111111111"


def _v1_span(span_id: str, kind: str, links: list[tuple[str, str]], **tags: Any) -> dict[str, Any]:
    tag_list = [{"key": c.KIND, "type": "string", "value": kind}]
    tag_list += [{"key": k.replace("_", "."), "type": "bool", "value": v} for k, v in tags.items()]
    return {
        "traceID": TRACE,
        "spanID": span_id,
        "operationName": f"gym.{kind}",
        "references": [{"refType": "FOLLOWS_FROM", "traceID": t, "spanID": s} for t, s in links],
        "startTime": 1,
        "duration": 1,
        "tags": tag_list,
        "logs": [],
        "processID": "p1",
    }


V1 = {
    "traceID": TRACE,
    "processes": {"p1": {"serviceName": "svc", "tags": []}},
    "spans": [
        _v1_span("00000000000000a1", "rollout", [(RUN_TRACE[16:], "00000000000000f1")]),
        _v1_span("00000000000000b2", "episode", [(TRACE, "00000000000000b1")]),
        _v1_span("00000000000000b3", "episode", [(TRACE, "00000000000000b2")], gym_episode_restored=True),
        _v1_span("00000000000000c1", "outcome", [(TRACE, "00000000000000b3")]),
        # A rollout a trainer asked for under a run: its run first, then the trainer's batch span.
        _v1_span(
            "00000000000000d1", "rollout", [(RUN_TRACE[16:], "00000000000000f1"), (TRACE, "00000000000000e1")]
        ),
    ],
}


def _relations(spans: Any) -> dict[str, list[str]]:
    return {s.span_id: [link.attributes[c.LINK_RELATION] for link in s.links] for s in spans}


def test_without_v3_each_links_relation_is_inferred_from_the_span_it_starts_at() -> None:
    spans = spans_from_jaeger(V1)
    assert _relations(spans) == {
        "00000000000000a1": [c.RELATION_RUN],
        "00000000000000b2": [c.RELATION_RETRY],
        "00000000000000b3": [c.RELATION_RESTORE],
        "00000000000000c1": [c.RELATION_OUTCOME],
        "00000000000000d1": [c.RELATION_RUN, c.RELATION_CALLER],
    }
    # Jaeger prints a trace ID with zero high bits as 16 digits; records always carry 32.
    (rollout_link,) = spans[0].links
    assert rollout_link.trace_id == RUN_TRACE


def test_relations_reported_by_v3_replace_the_inferred_ones() -> None:
    def link(trace_id: str, span_id: str, relation: str) -> dict[str, Any]:
        attributes = [{"key": c.LINK_RELATION, "value": {"stringValue": relation}}]
        return {"traceId": trace_id, "spanId": span_id, "attributes": attributes}

    v3 = {
        "result": {
            "resourceSpans": [
                {
                    "scopeSpans": [
                        {
                            "spans": [
                                {
                                    "spanId": "00000000000000b2",
                                    "links": [link(TRACE, "00000000000000b1", "handoff")],
                                },
                                {
                                    "spanId": "00000000000000a1",
                                    "links": [link(RUN_TRACE, "00000000000000f1", "run")],
                                },
                            ]
                        }
                    ]
                }
            ]
        }
    }
    relations = link_relations_from_otlp(v3)
    assert relations == {
        ("00000000000000b2", TRACE, "00000000000000b1"): "handoff",
        ("00000000000000a1", RUN_TRACE, "00000000000000f1"): "run",
    }
    spans = with_relations(spans_from_jaeger(V1), relations)
    assert _relations(spans)["00000000000000b2"] == ["handoff"]  # v3 wins over the "retry" guess
    assert _relations(spans)["00000000000000b3"] == [c.RELATION_RESTORE]  # v3 said nothing: kept


class _FakeJaeger:
    """Jaeger's v1 search as its memory store answers it: the traces with a span of the service, its
    tags and a start in [start, end] (microseconds), the newest ``limit`` of them; no v3."""

    def __init__(self, traces: list[dict[str, Any]]) -> None:
        self.traces = traces
        self.answered: list[int] = []

    def get(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        if path == "/api/services":
            return {"data": sorted({p["serviceName"] for t in self.traces for p in t["processes"].values()})}
        if not path == "/api/traces":
            raise JaegerError(f"no {path}")
        assert params is not None
        start, end, limit = int(params["start"]), int(params["end"]), int(params["limit"])
        tags = json.loads(params.get("tags", "{}"))

        def matches(span: dict[str, Any]) -> bool:
            values = {t["key"]: str(t["value"]) for t in span["tags"]}
            return start <= span["startTime"] <= end and all(values.get(k) == v for k, v in tags.items())

        found = [t for t in self.traces if any(matches(s) for s in t["spans"])]
        found = sorted(found, key=lambda t: t["spans"][0]["startTime"])[-limit:]
        self.answered.append(len(found))
        return {"data": copy.deepcopy(found)}


def _v1_trace(spans: list[SpanData]) -> dict[str, Any]:
    """Spans of one trace as Jaeger's v1 API writes them (microseconds; links as references)."""

    def tag(key: str, value: Any) -> dict[str, Any]:
        kind = "bool" if isinstance(value, bool) else "int64" if isinstance(value, int) else "string"
        kind = "float64" if isinstance(value, float) else kind
        return {"key": key, "type": kind, "value": value if kind != "string" else str(value)}

    return {
        "traceID": spans[0].trace_id,
        "processes": {
            "p1": {
                "serviceName": spans[0].service,
                "tags": [tag(c.SERVICE_INSTANCE_ID, spans[0].service_instance)]
                if spans[0].service_instance
                else [],
            }
        },
        "spans": [
            {
                "traceID": s.trace_id,
                "spanID": s.span_id,
                "operationName": s.name,
                "references": (
                    [{"refType": "CHILD_OF", "traceID": s.trace_id, "spanID": s.parent_id}]
                    if s.parent_id
                    else []
                )
                + [
                    {"refType": "FOLLOWS_FROM", "traceID": link.trace_id, "spanID": link.span_id}
                    for link in s.links
                ],
                "startTime": s.start_ns // 1000,
                "duration": (s.end_ns - s.start_ns) // 1000,
                "tags": [tag(k, v) for k, v in s.attributes.items() if not isinstance(v, tuple)],
                "logs": [],
                "processID": "p1",
            }
            for s in spans
        ],
    }


def _served_run(
    monkeypatch: pytest.MonkeyPatch, run_id: str, rollouts: int, tmp_path: Path
) -> tuple[_FakeJaeger, dict[str, list[SpanData]], Path]:
    """A run of ``rollouts`` recorded, served by the stand-in Jaeger and written to a file, both at
    Jaeger's resolution (microseconds: the time split and the durations are read from the times,
    so the readers can read the two alike): the Jaeger, its traces by ID and the file."""
    with capture_spans() as captured, gymtrace.run(run_id=run_id):
        for i in range(rollouts):
            with gymtrace.rollout(rollout_id=f"r-{i}", task_id=f"t-{i % 4}"):
                with gymtrace.episode(), gymtrace.step(), gymtrace.tool_call(tool_name="env.step"):
                    pass
                if i % 3:
                    with gymtrace.verify():
                        gymtrace.record_reward(float(i % 2))
    spans = [
        replace(
            s,
            start_ns=s.start_ns // 1000 * 1000,
            end_ns=(s.start_ns // 1000 + (s.end_ns - s.start_ns) // 1000) * 1000,
        )
        for s in normalize(captured.spans)
    ]
    by_trace: dict[str, list[SpanData]] = {}
    for span in spans:
        by_trace.setdefault(span.trace_id, []).append(span)
    jaeger = _FakeJaeger([_v1_trace(trace) for trace in by_trace.values()])
    monkeypatch.setattr(JaegerClient, "_get", lambda _, path, params=None: jaeger.get(path, params))
    path = tmp_path / "run.jsonl"
    path.write_text(json.dumps(encode_spandata_json(spans)) + "\n")
    return jaeger, by_trace, path


def test_a_search_pages_through_every_trace_holding_one_page_at_a_time(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    jaeger, by_trace, path = _served_run(monkeypatch, "paged", 40, tmp_path)
    monkeypatch.setattr(jaeger_module, "PAGE_TRACES", 6)
    traces = list(JaegerClient("http://jaeger").traces(None, {c.RUN_ID: "paged"}))
    assert sorted(t[0].trace_id for t in traces) == sorted(by_trace) and len(traces) == 41
    assert max(jaeger.answered) <= 6 and len(jaeger.answered) > 41 / 6
    # The readers read Jaeger's run as they read the file the run wrote.
    for argv in (["rollouts", "--json"], ["stats", "--json"]):
        assert main([*argv, str(path)]) == 0
        from_file = capsys.readouterr().out
        assert main([*argv, "--jaeger", "http://jaeger", "--run", "paged"]) == 0
        assert capsys.readouterr().out == from_file and from_file, argv


def test_a_jaeger_search_that_finds_nothing_names_the_services_it_asked_and_the_service_option(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Issue 47: on OpenSearch a service is listed a refresh after its spans are searchable, so a
    # search right after a run asked every listed service but the run's and read "no rollouts".
    with capture_spans() as captured, gymtrace.run(run_id="elsewhere"):
        with gymtrace.rollout(rollout_id="r"), gymtrace.episode():
            gymtrace.record_reward(1.0)
    jaeger = _FakeJaeger([_v1_trace(normalize(captured.spans))])
    monkeypatch.setattr(JaegerClient, "_get", lambda _, path, params=None: jaeger.get(path, params))
    assert main(["rollouts", "--jaeger", "http://jaeger", "--run", "new-run"]) == 1
    service = normalize(captured.spans)[0].service
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == "no rollouts found"
    assert err[0] == (
        f"gymtrace: warning: no trace of run 'new-run' in the 1 services Jaeger lists ({service});"
        " a service is listed seconds after its first spans are stored: name it with --service"
    )
    # Named, the service is asked whatever the list says, and an empty answer is just that.
    assert main(["rollouts", "--jaeger", "http://jaeger", "--run", "new-run", "--service", "other"]) == 1
    assert capsys.readouterr().err.splitlines() == ["no rollouts found"]
    assert main(["rollouts", "--jaeger", "http://jaeger", "--run", "elsewhere", "--json"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_an_error_answer_from_jaeger_names_the_stores_reason() -> None:
    # Issue 47: a store refusing an oversized search answers 500 with its reason in the body;
    # `gymtrace rollouts --jaeger` shows that reason, not only "Internal Server Error".
    reason = "search services failed: elastic: Error 503 (Service Unavailable)"

    class Refusing(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"data": None, "errors": [{"code": 500, "msg": reason}]}).encode()
            self.send_response(500)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            return None

    server = http.server.HTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(JaegerError, match=r"Error 503.*search\.max_buckets"):
            JaegerClient(f"http://127.0.0.1:{server.server_port}").search("svc", {c.RUN_ID: "r"})
    finally:
        server.shutdown()
        server.server_close()


def test_timeline_and_report_draw_a_run_from_jaeger_as_from_the_file_it_wrote(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, _, path = _served_run(monkeypatch, "drawn", 12, tmp_path)
    monkeypatch.setattr(jaeger_module, "PAGE_TRACES", 5)
    from_file, from_jaeger = tmp_path / "file.json", tmp_path / "jaeger.json"
    assert main(["timeline", str(path), "--format", "chrome", "-o", str(from_file)]) == 0
    assert (
        main(
            [
                "timeline",
                "--jaeger",
                "http://jaeger",
                "--run",
                "drawn",
                "--format",
                "chrome",
                "-o",
                str(from_jaeger),
            ]
        )
        == 0
    )
    said = capsys.readouterr().out.splitlines()
    assert (
        said[0].split(" -> ")[0]
        == said[1].split(" -> ")[0]
        == "run drawn: 12 rollouts, 12 bars in 1 lanes, 0 train steps"
    )
    assert json.loads(from_jaeger.read_text()) == json.loads(from_file.read_text())
    report = tmp_path / "report.html"
    assert main(["report", "--jaeger", "http://jaeger", "--run", "drawn", "-o", str(report)]) == 0
    page = report.read_text()
    assert "data-figure=\"rollouts\" data-value='12'" in page and "Jaeger at http://jaeger" in page
    # A run Jaeger does not hold: the one-line error every picture gives, and where it looked.
    capsys.readouterr()
    assert (
        main(["timeline", "--jaeger", "http://jaeger", "--run", "missing", "-o", str(tmp_path / "x.html")])
        == 2
    )
    err = capsys.readouterr().err
    assert "no trace of run 'missing'" in err and "gymtrace timeline: no run 'missing'" in err
