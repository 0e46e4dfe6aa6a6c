"""Traces built after the fact from a record: deterministic IDs, laid-out times, the live shape.

An importer describes a record as a tree of :class:`Node` objects (run, rollouts, episodes and
below) with the times it holds; :func:`finish` turns them into
:class:`~gymtrace._model.spandata.SpanData`, the records every reader works on:

- a rollout's trace ID is :func:`gymtrace.integrations.nemo_gym.trace_id_for` of run and rollout
  ID, and a span ID a digest of the trace ID and the span's path of keys (``episode:1/step:3``), so
  a record imported twice, or traced live and imported, lands on the same IDs;
- every span carries the gym identity of the levels above it, as a live span does;
- a span without recorded times gets synthetic ones and says so (``gym.timing=synthetic``): it
  spans the spans below it, else follows its previous sibling, 1 ms long.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gymtrace import _constants as c
from gymtrace._model.ids import deterministic_id, episode_id
from gymtrace._model.spandata import EventData, LinkData, SpanData
from gymtrace._scopes.levels import genai_span_name
from gymtrace.integrations.nemo_gym import trace_id_for

# Where synthesised times start when nothing in the record holds a time and the importer names no
# origin (the record file's modification time, so Jaeger's recent-traces search finds the run):
# 2025-01-01T00:00:00Z.
SYNTHETIC_EPOCH_NS = 1_735_689_600 * 1_000_000_000
# The length of a synthesised span with nothing below it.
SYNTHETIC_SPAN_NS = 1_000_000

_IDENTITY_BELOW = (
    c.RUN_ID,
    c.TASK_ID,
    c.ROLLOUT_ID,
    c.ROLLOUT_REPEAT,
    c.EPISODE_ATTEMPT,
    c.EPISODE_ID,
    c.GROUP_ID,  # a training key that every span below a live rollout carries too
)


def seconds_to_ns(seconds: float | None) -> int | None:
    """A record's Unix time in seconds (a float) as nanoseconds, or None."""
    if seconds is None or isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        return None
    if not 0 < seconds < 1e11:  # not a Unix time in seconds: say nothing rather than something wrong
        return None
    return round(seconds * 1e9)


@dataclass
class Node:
    """One span to be: what the record says about it; IDs and missing times come at :func:`finish`."""

    name: str
    key: str
    attributes: dict[str, Any] = field(default_factory=dict)
    start_ns: int | None = None
    end_ns: int | None = None
    span_kind: str = "INTERNAL"
    status: str = "UNSET"
    status_message: str = ""
    children: list[Node] = field(default_factory=list)
    # (name, time or None for the span's end, attributes)
    events: list[tuple[str, int | None, dict[str, Any]]] = field(default_factory=list)
    # (the node linked to, gym.link.relation)
    links: list[tuple[Node, str]] = field(default_factory=list)
    trace_id: str = ""
    span_id: str = ""
    synthetic: bool = False
    _keys: Counter[str] = field(default_factory=Counter, repr=False)

    def child(
        self,
        name: str,
        key: str,
        attributes: Mapping[str, Any] | None = None,
        *,
        start_ns: int | None = None,
        end_ns: int | None = None,
        span_kind: str = "INTERNAL",
    ) -> Node:
        """A span below this one; ``key`` names it among its siblings (made unique if repeated)."""
        self._keys[key] += 1
        if self._keys[key] > 1:
            key = f"{key}#{self._keys[key]}"
        node = Node(name, f"{self.key}/{key}", dict(attributes or {}), start_ns, end_ns, span_kind=span_kind)
        self.children.append(node)
        return node

    def fail(self, error_type: str | None, message: str = "") -> None:
        self.status, self.status_message = "ERROR", message
        if error_type:
            self.attributes[c.ERROR_TYPE] = error_type

    def walk(self) -> Iterator[Node]:
        yield self
        for child in self.children:
            yield from child.walk()


def run_node(run_id: str, *, start_ns: int | None = None, end_ns: int | None = None) -> Node:
    return Node(c.SPAN_RUN, "run", {c.KIND: c.KIND_RUN, c.RUN_ID: run_id}, start_ns, end_ns)


def rollout_node(run_id: str, rollout_id: str, task_id: str | None, repeat: int | None) -> Node:
    attributes: dict[str, Any] = {c.KIND: c.KIND_ROLLOUT, c.RUN_ID: run_id, c.ROLLOUT_ID: rollout_id}
    if task_id is not None:
        attributes[c.TASK_ID] = task_id
    if repeat is not None:
        attributes[c.ROLLOUT_REPEAT] = repeat
    return Node(c.SPAN_ROLLOUT, "rollout", attributes)


@dataclass
class Attempt:
    """How one episode of a rollout ended, as the record says."""

    attempt: int
    node: Node
    reward: float | None = None  # set only for a completed episode that was scored
    failure_kind: str | None = None  # None: completed
    retryable: bool = False
    error_type: str | None = None
    message: str = ""
    # When the record says when scoring ran (else the verify span's times are synthesised).
    verify_start_ns: int | None = None
    verify_end_ns: int | None = None


def episode(rollout: Node, attempt: int, *, start_ns: int | None = None, end_ns: int | None = None) -> Node:
    rollout_id = str(rollout.attributes[c.ROLLOUT_ID])
    return rollout.child(
        c.SPAN_EPISODE,
        f"episode:{attempt}",
        {
            c.KIND: c.KIND_EPISODE,
            c.EPISODE_ATTEMPT: attempt,
            c.EPISODE_ID: episode_id(rollout_id, attempt),
        },
        start_ns=start_ns,
        end_ns=end_ns,
    )


def invocation(
    parent: Node,
    key: str,
    agent_name: str | None,
    agent_id: str,
    *,
    start_ns: int | None = None,
    end_ns: int | None = None,
) -> Node:
    """An ``invoke_agent {agent}`` span, as ``gymtrace.agent_invocation`` names it."""
    attributes: dict[str, Any] = {
        c.KIND: c.KIND_AGENT_INVOCATION,
        c.GEN_AI_OPERATION_NAME: c.OPERATION_INVOKE_AGENT,
        c.GEN_AI_AGENT_ID: agent_id,
    }
    if agent_name:
        attributes[c.GEN_AI_AGENT_NAME] = agent_name
    name = genai_span_name(c.OPERATION_INVOKE_AGENT, agent_name)
    return parent.child(name, key, attributes, start_ns=start_ns, end_ns=end_ns)


def model_call(
    parent: Node,
    key: str,
    model: str | None,
    *,
    provider: str | None = None,
    input_tokens: int | None = None,
    output_tokens: int | None = None,
    cached_input_tokens: int | None = None,
    start_ns: int | None = None,
    end_ns: int | None = None,
) -> Node:
    """A ``chat {model}`` span with the tokens the record holds, as ``gymtrace.model_call`` names it."""
    attributes: dict[str, Any] = {c.KIND: c.KIND_MODEL_CALL, c.GEN_AI_OPERATION_NAME: c.OPERATION_CHAT}
    for name, value in (
        (c.GEN_AI_REQUEST_MODEL, model),
        (c.GEN_AI_PROVIDER_NAME, provider),
        (c.GEN_AI_USAGE_INPUT_TOKENS, input_tokens),
        (c.GEN_AI_USAGE_OUTPUT_TOKENS, output_tokens),
        (c.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, cached_input_tokens),
    ):
        if value is not None and value != "":
            attributes[name] = value
    name = genai_span_name(c.OPERATION_CHAT, model)
    return parent.child(name, key, attributes, start_ns=start_ns, end_ns=end_ns, span_kind="CLIENT")


def tool_call(
    parent: Node,
    key: str,
    tool_name: str | None,
    call_id: str,
    *,
    start_ns: int | None = None,
    end_ns: int | None = None,
) -> Node:
    """An ``execute_tool {tool}`` span, as ``gymtrace.tool_call`` names it."""
    attributes: dict[str, Any] = {
        c.KIND: c.KIND_TOOL_CALL,
        c.GEN_AI_OPERATION_NAME: c.OPERATION_EXECUTE_TOOL,
        c.GEN_AI_TOOL_CALL_ID: call_id,
    }
    if tool_name:
        attributes[c.GEN_AI_TOOL_NAME] = tool_name
    name = genai_span_name(c.OPERATION_EXECUTE_TOOL, tool_name)
    return parent.child(name, key, attributes, start_ns=start_ns, end_ns=end_ns)


def conclude(rollout: Node, attempts: list[Attempt]) -> None:
    """Write each episode's outcome, the verify span of a scored one, the retry links between
    attempts and the rollout's outcome, exactly as a live rollout writes them."""
    attempts = sorted(attempts, key=lambda a: a.attempt)
    previous: Node | None = None
    for a in attempts:
        attrs = a.node.attributes
        if a.failure_kind is None:
            attrs[c.EPISODE_OUTCOME] = c.OUTCOME_COMPLETED
            if a.reward is not None:
                verify = a.node.child(
                    c.SPAN_VERIFY,
                    "verify",
                    {c.KIND: c.KIND_VERIFY, c.REWARD: a.reward},
                    start_ns=a.verify_start_ns,
                    end_ns=a.verify_end_ns,
                )
                verify.events.append(
                    (
                        c.GEN_AI_EVALUATION_RESULT,
                        None,
                        {
                            c.GEN_AI_EVALUATION_NAME: c.EVALUATION_NAME_REWARD,
                            c.GEN_AI_EVALUATION_SCORE_VALUE: a.reward,
                        },
                    )
                )
                attrs[c.REWARD] = a.reward
        else:
            attrs[c.EPISODE_OUTCOME] = c.OUTCOME_FAILED
            attrs[c.FAILURE_KIND] = a.failure_kind
            attrs[c.FAILURE_RETRYABLE] = a.retryable
            a.node.fail(a.error_type, a.message)
        if previous is not None:
            a.node.links.append((previous, c.RELATION_RETRY))
        previous = a.node
    final = attempts[-1] if attempts else None
    rollout.attributes[c.ROLLOUT_ATTEMPTS] = len(attempts)
    if final is not None and final.failure_kind is None and final.reward is not None:
        rollout.attributes[c.ROLLOUT_OUTCOME] = c.OUTCOME_SCORED
        rollout.attributes[c.REWARD] = final.reward
    else:
        rollout.attributes[c.ROLLOUT_OUTCOME] = c.OUTCOME_UNSCORED


# -- IDs ---------------------------------------------------------------------------------------------


def run_trace_id(run_id: str) -> int:
    """The trace of a run's own span (each rollout is a trace of its own, linked to it)."""
    return deterministic_id("gymtrace/run-trace", run_id, size=16)


def _assign_ids(root: Node, trace_id: int) -> None:
    trace = format(trace_id, "032x")
    for node in root.walk():
        node.trace_id = trace
        node.span_id = format(deterministic_id("gymtrace/span", trace, node.key, size=8), "016x")


# -- times -------------------------------------------------------------------------------------------


def _earliest(node: Node) -> int | None:
    found = [n.start_ns for n in node.walk() if n.start_ns is not None]
    return min(found) if found else None


def _place(node: Node, cursor: int) -> int:
    """Give ``node`` and everything below it times; returns where the next sibling may start."""
    recorded = node.start_ns is not None and node.end_ns is not None
    child_cursor = node.start_ns if node.start_ns is not None else _earliest(node)
    if child_cursor is None:
        child_cursor = cursor
    for child in node.children:
        child_cursor = max(child_cursor, _place(child, child_cursor))
    if not recorded:
        node.synthetic = True
        starts = [ch.start_ns for ch in node.children if ch.start_ns is not None]
        ends = [ch.end_ns for ch in node.children if ch.end_ns is not None]
        if node.start_ns is None:
            node.start_ns = min(starts) if starts else cursor
        if node.end_ns is None:
            node.end_ns = max([*ends, node.start_ns + (0 if ends else SYNTHETIC_SPAN_NS)])
    assert node.start_ns is not None and node.end_ns is not None
    node.end_ns = max(node.end_ns, node.start_ns)
    return max(node.end_ns, cursor)


# -- the result --------------------------------------------------------------------------------------


@dataclass
class Imported:
    """What an import produced: the spans, and what of the record it could not map."""

    spans: list[SpanData] = field(default_factory=list)
    rollouts: int = 0
    unmapped: Counter[str] = field(default_factory=Counter)

    @property
    def synthetic(self) -> int:
        return sum(1 for s in self.spans if s.attributes.get(c.TIMING) == c.TIMING_SYNTHETIC)


def _identity(node: Node, inherited: Mapping[str, Any]) -> dict[str, Any]:
    return {**{k: v for k, v in inherited.items() if k not in node.attributes}, **node.attributes}


def _spans(node: Node, parent: Node | None, inherited: Mapping[str, Any], service: str) -> Iterator[SpanData]:
    attributes = _identity(node, inherited)
    if node.synthetic:
        attributes[c.TIMING] = c.TIMING_SYNTHETIC
    assert node.start_ns is not None and node.end_ns is not None
    yield SpanData(
        trace_id=node.trace_id,
        span_id=node.span_id,
        parent_id=parent.span_id if parent is not None else None,
        name=node.name,
        start_ns=node.start_ns,
        end_ns=node.end_ns,
        attributes=attributes,
        events=tuple(
            EventData(name, time if time is not None else node.end_ns, dict(attrs))
            for name, time, attrs in node.events
        ),
        links=tuple(LinkData(to.trace_id, to.span_id, {c.LINK_RELATION: rel}) for to, rel in node.links),
        status=node.status,
        status_message=node.status_message,
        service=service,
        span_kind=node.span_kind,
        service_instance=service,
    )
    below = {k: v for k, v in attributes.items() if k in _IDENTITY_BELOW}
    for child in node.children:
        yield from _spans(child, node, below, service)


def finish(
    run: Node,
    rollouts: Iterable[Node],
    *,
    service: str,
    result: Imported | None = None,
    origin_ns: int | None = None,
) -> Imported:
    """The spans of ``run`` and its ``rollouts`` (each a trace of its own, linked to the run).

    ``origin_ns``: where synthesised times start when the record holds no time at all.
    """
    result = result if result is not None else Imported()
    run_id = str(run.attributes[c.RUN_ID])
    rollouts = list(rollouts)
    cursor = run.start_ns if run.start_ns is not None else _earliest_of(rollouts, origin_ns)
    for rollout in rollouts:
        _assign_ids(rollout, trace_id_for(run_id, str(rollout.attributes[c.ROLLOUT_ID])))
        cursor = _place(rollout, cursor)
    _assign_ids(run, run_trace_id(run_id))
    if run.start_ns is None or run.end_ns is None:
        run.synthetic = True
        starts = [r.start_ns for r in rollouts if r.start_ns is not None]
        ends = [r.end_ns for r in rollouts if r.end_ns is not None]
        run.start_ns = run.start_ns if run.start_ns is not None else min(starts, default=cursor)
        run.end_ns = (
            run.end_ns if run.end_ns is not None else max(ends, default=run.start_ns + SYNTHETIC_SPAN_NS)
        )
    result.spans.extend(_spans(run, None, {}, service))
    for rollout in rollouts:
        rollout.links.append((run, c.RELATION_RUN))
        result.spans.extend(_spans(rollout, None, {}, service))
    result.rollouts += len(rollouts)
    return result


def _earliest_of(nodes: list[Node], origin_ns: int | None) -> int:
    found = [t for t in (_earliest(n) for n in nodes) if t is not None]
    if found:
        return min(found)
    return origin_ns if origin_ns is not None else SYNTHETIC_EPOCH_NS


def file_time_ns(paths: Iterable[Path]) -> int | None:
    """The earliest modification time of ``paths`` that exist: the origin of a record's
    synthesised times (the same on every import of the unchanged file)."""
    times = [p.stat().st_mtime_ns for p in paths if p.exists()]
    return min(times) if times else None
