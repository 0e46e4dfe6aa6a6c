"""Where imported spans go: a file of OTLP/JSON lines, as the file exporter writes it, or an
OTLP/HTTP endpoint (a Collector or Jaeger), which takes the same JSON."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gymtrace._model.environment import COMPRESS_NONE
from gymtrace._model.spandata import SpanData, encode_spandata_json
from gymtrace._model.tracefiles import compression_of, compressor

# Spans per OTLP request: a few hundred keep each request well under a Collector's 4 MiB limit.
_BATCH = 512
_TIMEOUT_S = 30.0


def _batches(spans: list[SpanData]) -> list[list[SpanData]]:
    """One batch per trace where it fits (a reader of one line sees a whole rollout), larger
    traces split, in the order the spans came."""
    by_trace: dict[str, list[SpanData]] = {}
    for span in spans:
        by_trace.setdefault(span.trace_id, []).append(span)
    batches: list[list[SpanData]] = []
    for trace in by_trace.values():
        batches.extend(trace[i : i + _BATCH] for i in range(0, len(trace), _BATCH))
    return batches


def write_file(spans: list[SpanData], path: str | Path, resource: Mapping[str, Any]) -> None:
    """Append the spans to ``path`` (created with its directories), one OTLP/JSON request a line;
    compressed as its name says (``.jsonl.gz``, ``.jsonl.zst``: one more gzip member or zstd
    frame, as the file exporter appends)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps(encode_spandata_json(batch, resource), separators=(",", ":")) for batch in _batches(spans)
    ]
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    pack = compressor(compression_of(target) or COMPRESS_NONE)
    with open(target, "ab") as f:
        f.write(data if pack is None else pack(data))


def traces_url(endpoint: str) -> str:
    """An OTLP/HTTP endpoint (``http://host:4318``) as its traces URL."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith("/v1/traces") else f"{endpoint}/v1/traces"


class SendError(OSError):
    """The endpoint refused or could not be reached; the message names it."""


def send(spans: list[SpanData], endpoint: str, resource: Mapping[str, Any]) -> None:
    """POST the spans to an OTLP/HTTP endpoint as OTLP/JSON, one request per batch."""
    url = traces_url(endpoint)
    for batch in _batches(spans):
        body = json.dumps(encode_spandata_json(batch, resource)).encode("utf-8")
        request = urllib.request.Request(
            url, data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as response:
                response.read()
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            raise SendError(f"OTLP/HTTP export to {url} failed: {exc}") from exc
