"""Small real OTLP trace receivers on loopback, in this process: gRPC and HTTP/protobuf.

Each decodes every ``ExportTraceServiceRequest`` with the OTLP protobuf definitions and keeps the
spans as ``SpanData``, so a test can see what a process exported over the wire (no Collector
needed). Use as context managers; ``endpoint`` is what to give an exporter.
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Collection, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from gymtrace._model.spandata import SpanData, decode_otlp_json


def _hex_ids(request: dict[str, Any]) -> dict[str, Any]:
    # Protobuf's JSON mapping writes bytes as base64; OTLP/JSON writes trace and span IDs as hex.
    def hexed(value: str) -> str:
        return base64.b64decode(value).hex()

    for resource_spans in request.get("resourceSpans", ()):
        for scope_spans in resource_spans.get("scopeSpans", ()):
            for span in scope_spans.get("spans", ()):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if span.get(key):
                        span[key] = hexed(span[key])
                for link in span.get("links", ()):
                    link["traceId"], link["spanId"] = hexed(link["traceId"]), hexed(link["spanId"])
    return request


class Received:
    """The spans a receiver got, in arrival order."""

    def __init__(self, reject: Collection[int] = ()) -> None:
        self._lock = threading.Lock()
        self._spans: list[SpanData] = []
        self.endpoint = ""
        self.reject = frozenset(reject)  # requests (numbered from 0 as they arrive) refused for good
        self.requests = 0
        self.headers: list[dict[str, str]] = []  # of each HTTP request, lower-case names

    def admit(self) -> bool:
        """Count a request; False if it is one of those to refuse."""
        with self._lock:
            number = self.requests
            self.requests += 1
        return number not in self.reject

    def add(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        as_json = _hex_ids(MessageToDict(request, use_integers_for_enums=True))
        with self._lock:
            self._spans.extend(decode_otlp_json(as_json))

    @property
    def spans(self) -> list[SpanData]:
        with self._lock:
            return list(self._spans)


@contextmanager
def grpc_receiver(reject: Collection[int] = ()) -> Iterator[Received]:
    """An OTLP/gRPC receiver on a free loopback port; requests numbered in ``reject`` are refused
    with INVALID_ARGUMENT (not retryable), the rest kept."""
    received = Received(reject)

    class Servicer(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request: Any, context: Any) -> Any:
            if not received.admit():
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "refused by the test")
            received.add(request)
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Servicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    received.endpoint = f"http://127.0.0.1:{port}"
    try:
        yield received
    finally:
        server.stop(grace=None)


@contextmanager
def http_receiver(reject: Collection[int] = ()) -> Iterator[Received]:
    """An OTLP/HTTP receiver on a free loopback port; requests numbered in ``reject`` get a 400
    (not retryable), the rest are kept."""
    received = Received(reject)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            received.headers.append({name.lower(): value for name, value in self.headers.items()})
            if self.path != "/v1/traces":
                self.send_error(404)
                return
            if not received.admit():
                self.send_error(400, "refused by the test")
                return
            request = trace_service_pb2.ExportTraceServiceRequest()
            request.ParseFromString(body)
            received.add(request)
            reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    received.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield received
    finally:
        server.shutdown()
        server.server_close()
