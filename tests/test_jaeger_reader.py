"""Reading Jaeger's JSON into span records: link relations from v3 (OTLP JSON) where Jaeger keeps
them, inferred from the linking span where it cannot (the v1 API drops link attributes).

The round trip through a real Jaeger is in tests/e2e (test_keep_rules_and_delay.py,
test_demo_in_jaeger.py); these pin the two JSON shapes themselves."""

from __future__ import annotations

import http.server
import json
import threading
from typing import Any

import pytest

from gymtrace import _constants as c
from gymtrace._read.jaeger import (
    JaegerClient,
    JaegerError,
    link_relations_from_otlp,
    spans_from_jaeger,
    with_relations,
)

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
