"""Smoke test of the trace pipeline itself: OpenTelemetry SDK -> OTLP (gRPC and HTTP) -> the
gymtrace Collector (collector/otelcol.yaml, tail sampling) -> Jaeger (collector/jaeger.yaml),
checked through Jaeger's query API.

It does not use the gymtrace package: it writes spans with the plain SDK in the shape gymtrace
produces (gym.kind, gym.* identity and outcome attributes), so a failure here is a pipeline or
config problem, not an instrumentation one. The session pipeline runs with sample percent 0, so
only the policy-driven keeps (failed / retried episode, unscored rollout) reach Jaeger.
"""

from __future__ import annotations

import time
import uuid
from typing import Iterable

import pytest
from opentelemetry import trace as trace_api
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from pipeline import (
    Pipeline,
    only,
    same_trace_id,
    span_links,
    span_parent_id,
    span_service,
    span_tags,
    spans_by_name,
)

# A kept trace appears after decision_wait (2s) + one tail-sampling tick (1s) + the Collector's
# and Jaeger's batch timeouts; 30s leaves room for a loaded CI machine.
WAIT = 30.0


def _exporter(pipeline: Pipeline, protocol: str):
    if protocol == "grpc":
        return GrpcExporter(endpoint=pipeline.otlp_grpc_endpoint, insecure=True, timeout=10)
    return HttpExporter(endpoint=pipeline.otlp_http_traces_url, timeout=10)


def _export_rollout(
    pipeline: Pipeline,
    protocol: str,
    service: str,
    rollout_id: str,
    *,
    outcome: str,
    episodes: Iterable[tuple[int, str]],
) -> str:
    """Export one rollout trace (rollout -> episode per attempt -> seed_session, step) in its own
    TracerProvider (never the global one); return the trace ID as 32 hex digits."""
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(_exporter(pipeline, protocol)))
    tracer = provider.get_tracer("gymtrace.e2e")
    identity = {"gym.run.id": "run-e2e", "gym.task.id": "task-7", "gym.rollout.id": rollout_id}
    try:
        with tracer.start_as_current_span(
            "gym.rollout",
            attributes={"gym.kind": "rollout", "gym.rollout.repeat": 0, **identity},
        ) as rollout:
            previous: trace_api.SpanContext | None = None
            attempts = 0
            for attempt, ep_outcome in episodes:
                attempts += 1
                ep_identity = {
                    **identity,
                    "gym.episode.attempt": attempt,
                    "gym.episode.id": rollout_id if attempt == 0 else f"{rollout_id}-a{attempt}",
                }
                links = [trace_api.Link(previous)] if previous else []
                with tracer.start_as_current_span(
                    "gym.episode", attributes={"gym.kind": "episode", **ep_identity}, links=links
                ) as episode:
                    with tracer.start_as_current_span(
                        "gym.seed_session", attributes={"gym.kind": "seed_session", **ep_identity}
                    ):
                        pass
                    with tracer.start_as_current_span(
                        "gym.step",
                        attributes={"gym.kind": "step", "gym.step.number": 1, **ep_identity},
                    ):
                        pass
                    episode.set_attribute("gym.episode.outcome", ep_outcome)
                    previous = episode.get_span_context()
            # Like gymtrace, the outcome is known only when the rollout ends (its span ends last).
            rollout.set_attribute("gym.rollout.attempts", attempts)
            rollout.set_attribute("gym.rollout.outcome", outcome)
            if outcome == "scored":
                rollout.set_attribute("gym.reward", 1.0)
        trace_id = format(rollout.get_span_context().trace_id, "032x")
        assert provider.force_flush(15_000), "SDK could not flush spans to the Collector"
    finally:
        provider.shutdown()
    return trace_id


def _new_ids(tag: str) -> tuple[str, str]:
    u = uuid.uuid4().hex[:10]
    return f"e2e-{tag}-{u}", f"r-{tag}-{u}"


def _check_shape(trace: dict, service: str, rollout_id: str, n_episodes: int) -> dict[str, list]:
    """Parentage, service name and identity tags of one stored rollout trace."""
    by_name = spans_by_name(trace)
    assert sorted(by_name) == ["gym.episode", "gym.rollout", "gym.seed_session", "gym.step"]
    assert len(trace["spans"]) == 1 + 3 * n_episodes
    rollout = only(by_name["gym.rollout"])
    assert span_parent_id(rollout) is None
    ids = {s["spanID"] for s in by_name["gym.episode"]}
    assert {span_parent_id(e) for e in by_name["gym.episode"]} == {rollout["spanID"]}
    for child in by_name["gym.seed_session"] + by_name["gym.step"]:
        assert span_parent_id(child) in ids
    for span in trace["spans"]:
        assert span_service(trace, span) == service
        tags = span_tags(span)
        assert tags["gym.rollout.id"] == rollout_id
        assert tags["gym.kind"] == span["operationName"].removeprefix("gym.")
    return by_name


def test_unscored_rollout_over_grpc_is_kept_with_parentage(pipeline: Pipeline) -> None:
    service, rid = _new_ids("grpc")
    # A cancelled (not failed, attempt 0) episode: only the unscored-rollout policy can keep it.
    trace_id = _export_rollout(pipeline, "grpc", service, rid, outcome="unscored",
                               episodes=[(0, "cancelled")])
    found = only(pipeline.wait_for_traces(service, {"gym.rollout.id": rid, "gym.kind": "rollout"},
                                          min_spans=4, timeout=WAIT))
    assert same_trace_id(found["traceID"], trace_id)
    trace = pipeline.get_trace(trace_id)
    assert trace is not None
    by_name = _check_shape(trace, service, rid, n_episodes=1)
    rollout_tags = span_tags(only(by_name["gym.rollout"]))
    assert rollout_tags["gym.rollout.outcome"] == "unscored"
    assert rollout_tags["gym.rollout.attempts"] == 1
    assert "gym.reward" not in rollout_tags  # never an invented 0
    episode_tags = span_tags(only(by_name["gym.episode"]))
    assert episode_tags["gym.episode.attempt"] == 0 and episode_tags["gym.episode.id"] == rid
    assert service in pipeline.services()


def test_retried_episode_over_http_is_kept(pipeline: Pipeline) -> None:
    service, rid = _new_ids("http")
    # Only attempt 1, completed, scored: nothing but the retried-episode policy (attempt >= 1).
    trace_id = _export_rollout(pipeline, "http", service, rid, outcome="scored",
                               episodes=[(1, "completed")])
    pipeline.wait_for_traces(service, {"gym.rollout.id": rid}, min_spans=4, timeout=WAIT)
    trace = pipeline.get_trace(trace_id)
    by_name = _check_shape(trace, service, rid, n_episodes=1)
    episode_tags = span_tags(only(by_name["gym.episode"]))
    assert episode_tags["gym.episode.attempt"] == 1
    assert episode_tags["gym.episode.id"] == f"{rid}-a1"
    assert span_tags(only(by_name["gym.rollout"]))["gym.reward"] == 1.0
    # Every span of the retried episode carries the attempt, so a tag search finds all three.
    hits = pipeline.find_traces(service, {"gym.episode.attempt": 1, "gym.kind": "step"})
    assert [t["traceID"] for t in hits] == [trace["traceID"]]


def test_failed_then_retried_rollout_keeps_both_episodes_and_link(pipeline: Pipeline) -> None:
    service, rid = _new_ids("retry")
    trace_id = _export_rollout(pipeline, "grpc", service, rid, outcome="scored",
                               episodes=[(0, "failed"), (1, "completed")])
    pipeline.wait_for_traces(service, {"gym.rollout.id": rid}, min_spans=7, timeout=WAIT)
    trace = pipeline.get_trace(trace_id)
    by_name = _check_shape(trace, service, rid, n_episodes=2)
    episodes = {span_tags(e)["gym.episode.attempt"]: e for e in by_name["gym.episode"]}
    assert span_tags(episodes[0])["gym.episode.outcome"] == "failed"
    assert span_links(episodes[1]) == [episodes[0]["spanID"]]  # retry links to its predecessor


def test_clean_scored_rollout_is_dropped_at_sample_percent_0(pipeline: Pipeline) -> None:
    service, rid = _new_ids("drop")
    dropped_id = _export_rollout(pipeline, "grpc", service, rid, outcome="scored",
                                 episodes=[(0, "completed")])
    # A kept marker sent afterwards is decided no earlier than the dropped trace, so once it is
    # in Jaeger the dropped trace's decision has been made (plus a tick of grace).
    _, marker = _new_ids("marker")
    _export_rollout(pipeline, "grpc", service, marker, outcome="unscored",
                    episodes=[(0, "failed")])
    pipeline.wait_for_traces(service, {"gym.rollout.id": marker}, min_spans=4, timeout=WAIT)
    time.sleep(1.5)
    assert pipeline.find_traces(service, {"gym.rollout.id": rid}) == []
    assert pipeline.get_trace(dropped_id) is None


def test_sample_percent_100_keeps_clean_rollout(pipeline: Pipeline, tmp_path) -> None:
    # Its own pipeline (the session one samples 0 %): the probabilistic share of the rest.
    with Pipeline(decision_wait="1s", sample_percent=100, workdir=tmp_path) as p100:
        service, rid = _new_ids("keep")
        trace_id = _export_rollout(p100, "http", service, rid, outcome="scored",
                                   episodes=[(0, "completed")])
        p100.wait_for_traces(service, {"gym.rollout.id": rid}, min_spans=4, timeout=WAIT)
        assert p100.get_trace(trace_id) is not None


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_endpoints_are_loopback(pipeline: Pipeline, protocol: str) -> None:
    url = pipeline.otlp_grpc_endpoint if protocol == "grpc" else pipeline.otlp_http_endpoint
    assert url.startswith("http://127.0.0.1:")
    assert pipeline.query_url.startswith("http://127.0.0.1:")
