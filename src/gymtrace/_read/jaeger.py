"""A small client for Jaeger's query API, for ``gymtrace tree|rollouts|stats|compare|live --jaeger``.

A search pages through the traces it finds (:meth:`JaegerClient.traces`): the v1 API has no
cursor, so it asks for the traces of a time window, at most :data:`PAGE_TRACES` of them, and splits
a window that holds that many in two until each holds fewer; a reader holds one page of whole
traces at a time and keeps what it needs of each (issue 45).

Spans come from the v1 HTTP JSON API (stable, read-only, searchable by tag). It drops span-link
attributes, so the relation of each link (``retry``, ``restore``, ``run``, ``outcome``) is read from
``/api/v3/traces/{id}`` (OTLP JSON, which keeps them) for the traces that have links, each trace
at most once per client: Jaeger v1.76.0's memory store can mutate a stored trace on repeated v3
reads. Where v3 is unavailable or lacks the attribute, the relation is inferred from the span the
link starts at: a restored episode's link is a restore, another episode's a retry, a rollout's the
link to its run, an outcome record's the episode it concludes.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from time import time_ns
from typing import Any

from gymtrace import _constants as c
from gymtrace._model.spandata import EventData, LinkData, SpanData

# Traces asked for in one request. A window that returns this many may hold more (Jaeger returns
# the newest of them), so it is asked again in halves: a page is never known to be complete, so a
# full one is read again, as two, and ~2x the traces are fetched, one page held at a time.
PAGE_TRACES = 200
# How far back a search looks: Jaeger's own default for its search API (two days).
LOOKBACK_US = 2 * 24 * 3600 * 1_000_000


class JaegerError(OSError):
    """Jaeger could not be reached or answered with an error; the message says which URL."""


def _tag_value(tag: Mapping[str, Any]) -> Any:
    value = tag.get("value")
    kind = tag.get("type")
    if kind == "int64":
        return int(value)  # type: ignore[arg-type]
    if kind == "float64":
        return float(value)  # type: ignore[arg-type]
    if kind == "bool":
        return bool(value) if not isinstance(value, str) else value == "true"
    return value


def _inferred_relation(tags: Mapping[str, Any]) -> str | None:
    """A link's relation guessed from the span it starts at (when v3 cannot say); None: it has none
    (a train step's consumed record links to the rollouts it holds, with no attributes)."""
    kind = tags.get(c.KIND)
    if kind in (c.KIND_ROLLOUT, c.KIND_TRAIN_STEP):
        return c.RELATION_RUN
    if kind == c.KIND_CONSUMED:
        return None
    if kind == c.KIND_OUTCOME:
        return c.RELATION_OUTCOME
    return c.RELATION_RESTORE if tags.get(c.EPISODE_RESTORED) is True else c.RELATION_RETRY


def _nth(relation: str, n: int) -> str:
    """The relation of a span's link number ``n`` (from 0) when all it says is ``relation``: a
    rollout or train step links to its run first, and any link after that to a caller outside the
    gym (a trainer's span). A rollout linked to a caller alone reads as linked to a run here: only
    v3's link attributes tell the two apart."""
    return c.RELATION_CALLER if relation == c.RELATION_RUN and n > 0 else relation


def link_relations_from_otlp(body: Mapping[str, Any]) -> dict[tuple[str, str, str], str]:
    """``(span ID, linked trace ID, linked span ID) -> relation`` from a v3 OTLP JSON trace."""
    relations: dict[tuple[str, str, str], str] = {}
    result = body.get("result") or {}
    for resource_spans in result.get("resourceSpans") or ():
        for scope_spans in resource_spans.get("scopeSpans") or ():
            for span in scope_spans.get("spans") or ():
                for link in span.get("links") or ():
                    for attribute in link.get("attributes") or ():
                        if attribute.get("key") == c.LINK_RELATION:
                            value = (attribute.get("value") or {}).get("stringValue")
                            if isinstance(value, str):
                                key = (
                                    str(span.get("spanId", "")).lower().rjust(16, "0"),
                                    str(link.get("traceId", "")).lower().rjust(32, "0"),
                                    str(link.get("spanId", "")).lower().rjust(16, "0"),
                                )
                                relations[key] = value
    return relations


def with_relations(spans: list[SpanData], relations: Mapping[tuple[str, str, str], str]) -> list[SpanData]:
    """``spans`` with each link's relation replaced by the one v3 reported, where it did."""
    out = []
    for span in spans:
        if span.links and relations:
            links = tuple(
                LinkData(
                    link.trace_id,
                    link.span_id,
                    {
                        **link.attributes,
                        c.LINK_RELATION: relations.get(
                            (span.span_id, link.trace_id, link.span_id),
                            str(link.attributes.get(c.LINK_RELATION, "")),
                        ),
                    },
                )
                for link in span.links
            )
            span = dataclasses.replace(span, links=links)
        out.append(span)
    return out


def spans_from_jaeger(trace: Mapping[str, Any]) -> list[SpanData]:
    """One trace object of the v1 API (an element of ``data``) to SpanData records."""
    processes = trace.get("processes") or {}
    spans: list[SpanData] = []
    for raw in trace.get("spans") or ():
        tags = {t["key"]: _tag_value(t) for t in raw.get("tags") or ()}
        parent = None
        links: list[LinkData] = []
        for ref in raw.get("references") or ():
            if (
                ref.get("refType") == "CHILD_OF"
                and parent is None
                and ref.get("traceID") == raw.get("traceID")
            ):
                parent = ref["spanID"]
            else:
                links.append(LinkData(ref["traceID"].rjust(32, "0"), ref["spanID"], {}))
        relation = _inferred_relation(tags)
        links = [
            LinkData(link.trace_id, link.span_id, {c.LINK_RELATION: _nth(relation, n)} if relation else {})
            for n, link in enumerate(links)
        ]
        events = []
        for log in raw.get("logs") or ():
            fields = {f["key"]: _tag_value(f) for f in log.get("fields") or ()}
            name = str(fields.pop("event", "event"))
            events.append(EventData(name, int(log.get("timestamp", 0)) * 1000, fields))
        status = str(tags.pop("otel.status_code", "UNSET")).upper()
        start_ns = int(raw.get("startTime", 0)) * 1000
        process = processes.get(raw.get("processID"), {})
        process_tags = {t["key"]: _tag_value(t) for t in process.get("tags") or ()}
        spans.append(
            SpanData(
                trace_id=raw["traceID"].rjust(32, "0"),
                span_id=raw["spanID"].rjust(16, "0"),
                parent_id=parent.rjust(16, "0") if parent else None,
                name=raw.get("operationName", ""),
                start_ns=start_ns,
                end_ns=start_ns + int(raw.get("duration", 0)) * 1000,
                # Jaeger's own additions: otel.* status tags, span.kind, and a bare "error" flag
                # on error spans. Anything else starting with "error" (error.type) is the span's.
                attributes={
                    k: v
                    for k, v in tags.items()
                    if not k.startswith("otel.") and k not in ("span.kind", "error")
                },
                events=tuple(events),
                links=tuple(links),
                status=status if status in ("OK", "ERROR") else "UNSET",
                status_message=str(tags.get("otel.status_description", "")),
                service=str(process.get("serviceName", "")),
                service_instance=str(process_tags.get(c.SERVICE_INSTANCE_ID, "")),
                span_kind=str(tags.get("span.kind", "internal")).upper(),
            )
        )
    return spans


def _reason(error: urllib.error.HTTPError) -> str:
    """Jaeger's own error messages from an error answer's body (``{"errors": [{"msg": ...}]}``)."""
    try:
        body = json.loads(error.read(64_000) or b"{}")
        messages = [str(e.get("msg", "")) for e in body.get("errors") or [] if isinstance(e, dict)]
    except (OSError, ValueError, AttributeError):
        return ""
    reason = "".join(f": {m[:500]}" for m in messages if m)
    if "elastic: Error 503" in reason or "elastic: Error 429" in reason:
        # Jaeger passes on only the status of OpenSearch's refusal; say what it usually is.
        reason += (
            " (the OpenSearch store refused the search: more traces than its search.max_buckets"
            " allows, GYMTRACE_OPENSEARCH_MAX_TRACES_PER_SEARCH, or a tripped circuit breaker;"
            " the node's log says which)"
        )
    return reason


class JaegerClient:
    def __init__(self, base_url: str, *, timeout: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        # Link relations per trace ID, read from v3 once (see the module docstring).
        self._relations: dict[str, dict[tuple[str, str, str], str]] = {}
        # The services the last search asked (every one Jaeger listed, when none was named).
        self.searched: list[str] = []

    def _with_relations(self, trace_id: str, spans: list[SpanData]) -> list[SpanData]:
        if not any(span.links for span in spans):
            return spans
        key = trace_id.lower().rjust(32, "0")
        if key not in self._relations:
            try:
                self._relations[key] = link_relations_from_otlp(self._get(f"/api/v3/traces/{key}"))
            except JaegerError as exc:
                # An older Jaeger without /api/v3: the inferred relations stand.
                logging.getLogger("gymtrace").info("no link attributes from Jaeger's v3 API: %s", exc)
                self._relations[key] = {}
        return with_relations(spans, self._relations[key])

    def _get(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        url = f"{self.base_url}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=self.timeout) as response:
                return json.load(response)
        except urllib.error.HTTPError as exc:
            # Jaeger says why in its body (a store that refused an oversized search: issue 47).
            raise JaegerError(f"Jaeger query failed for {url}: {exc}{_reason(exc)}") from exc
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise JaegerError(f"Jaeger query failed for {url}: {exc}") from exc

    def services(self) -> list[str]:
        return [s for s in self._get("/api/services").get("data") or [] if not s.startswith("jaeger")]

    def trace(self, trace_id: str) -> list[SpanData]:
        body = self._get(f"/api/traces/{trace_id.lower()}")
        return [
            span
            for trace in body.get("data") or []
            for span in self._with_relations(trace["traceID"], spans_from_jaeger(trace))
        ]

    def search(self, service: str | None, tags: Mapping[str, Any]) -> list[SpanData]:
        """Every span of every trace with a span matching all ``tags`` (in ``service``, or in any
        service), started in the last two days."""
        return [span for trace in self.traces(service, tags) for span in trace]

    def traces(
        self, service: str | None, tags: Mapping[str, Any], *, page: int | None = None
    ) -> Iterator[list[SpanData]]:
        """The spans of each trace with a span matching all ``tags`` (in ``service``, or in any
        service) that started in the last two days, one trace at a time, each once, read ``page``
        traces a request (default :data:`PAGE_TRACES`; see the module docstring)."""
        page = page or PAGE_TRACES
        high = time_ns() // 1000
        seen: set[str] = set()
        self.searched = [service] if service else self.services()
        for name in self.searched:
            windows = [(high - LOOKBACK_US, high)]  # microseconds, both ends included
            while windows:
                start, end = windows.pop()
                params = {"service": name, "limit": str(page), "start": str(start), "end": str(end)}
                if tags:
                    params["tags"] = json.dumps(dict(tags))
                found = self._get("/api/traces", params).get("data") or []
                if len(found) >= page and end > start:
                    middle = (start + end) // 2
                    windows += [(start, middle), (middle + 1, end)]  # the newer half first
                    continue
                for trace in found:
                    trace_id = str(trace.get("traceID", "")).lower().rjust(32, "0")
                    if trace_id not in seen:
                        seen.add(trace_id)
                        yield self._with_relations(trace["traceID"], spans_from_jaeger(trace))
