"""The checker's one-pass look at a trace (``plainly_clean``): it may clear a trace only where the
tree rules find nothing in it, so ``gymtrace check`` says the same with it as without it.

A real trace (written through the scopes: a retried rollout, turns, steps, calls, a reward) is
broken one field at a time, every way a rule judges, and the look is asked of each broken copy."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import gymtrace
from gymtrace import attributes as c
from gymtrace._model.spandata import SpanData
from gymtrace._read.check.spans import SpanIndex, plainly_clean
from gymtrace._read.check.stream import _TREE_RULES
from gymtrace._scopes.active_scope import STEP_RANGE
from gymtrace.testing import CapturedSpans

Mutation = Callable[[list[SpanData], int], list[SpanData]]


def _traces(captured: CapturedSpans) -> list[list[SpanData]]:
    with gymtrace.run(run_id="run"):
        for rollout in ("r-1", "r-2"):
            with gymtrace.rollout(rollout_id=rollout, task_id="t", group_id="g"):
                for attempt in gymtrace.attempts(2):
                    with attempt:
                        with gymtrace.seed_session():
                            pass
                        with gymtrace.agent_invocation(agent_name="a"):
                            for _ in range(2):
                                with gymtrace.turn(), gymtrace.step():
                                    with gymtrace.model_call(model="m"):
                                        pass
                                    with gymtrace.tool_call(tool_name="t"):
                                        pass
                        if attempt.index == 0:
                            attempt.fail()
                        else:
                            with gymtrace.verify():
                                gymtrace.record_reward(1.0)
    by_trace: dict[str, list[SpanData]] = defaultdict(list)
    for span in captured.data:
        by_trace[span.trace_id].append(span)
    return list(by_trace.values())


def _rules_find(spans: list[SpanData]) -> bool | str:
    """Whether the tree rules find anything (``"raised"`` when one of them raises)."""
    try:
        index = SpanIndex(spans)
        return any(rule(index) for rule in _TREE_RULES)
    except Exception:  # noqa: BLE001 (a broken value some rule does not expect)
        return "raised"


def _with(spans: list[SpanData], n: int, **changes: Any) -> list[SpanData]:
    return [*spans[:n], dataclasses.replace(spans[n], **changes), *spans[n + 1 :]]


def _set(key: str, value: Any) -> Mutation:
    def mutate(spans: list[SpanData], n: int) -> list[SpanData]:
        return _with(spans, n, attributes={**spans[n].attributes, key: value})

    return mutate


def _drop(key: str) -> Mutation:
    def mutate(spans: list[SpanData], n: int) -> list[SpanData]:
        return _with(spans, n, attributes={k: v for k, v in spans[n].attributes.items() if k != key})

    return mutate


def _field(**changes: Any) -> Mutation:
    return lambda spans, n: _with(spans, n, **changes)


def _reparent(spans: list[SpanData], n: int) -> Iterator[list[SpanData]]:
    for other in spans:
        yield _with(spans, n, parent_id=other.span_id)  # its own ID too: a cycle
    yield _with(spans, n, parent_id="feedfacefeedface")  # a parent that never arrived
    yield _with(spans, n, parent_id=None)


def _swap_start(spans: list[SpanData], n: int) -> Iterator[list[SpanData]]:
    for m, other in enumerate(spans):
        if m != n:
            swapped = _with(spans, n, start_ns=other.start_ns)
            yield _with(swapped, m, start_ns=spans[n].start_ns)


_VALUES = (None, 0, 1, 2, 5, STEP_RANGE + 1, "1", "r-1", "other", True, 1.0, float("nan"), ("r-1",))
_MUTATIONS: list[Mutation] = [
    *(_set(c.KIND, kind) for kind in (*c.ALL_KINDS, "nonsense", 5)),
    *(
        _set(key, value)
        for key in (c.ROLLOUT_ID, c.EPISODE_ATTEMPT, c.TURN_NUMBER, c.STEP_NUMBER)
        for value in _VALUES
    ),
    *(_drop(key) for key in (c.KIND, c.ROLLOUT_ID, c.EPISODE_ATTEMPT, c.TURN_NUMBER, c.STEP_NUMBER)),
    _set(c.HIERARCHY_VIOLATION, "step outside any invocation"),
    _set(c.REWARD, 1.0),
    _set(c.EPISODE_RESTORED, True),
    _field(links=()),
    _field(service_instance="another process"),
]


def _continued(trace: list[SpanData]) -> list[SpanData]:
    """``trace`` with its steps recorded by another process than their owners' (continuations)."""
    return [
        dataclasses.replace(s, service_instance="worker") if s.attributes.get(c.KIND) == c.KIND_STEP else s
        for s in trace
    ]


def _broken(trace: list[SpanData]) -> Iterator[list[SpanData]]:
    for whole in (trace, _continued(trace)):
        for n in range(len(whole)):
            for mutate in _MUTATIONS:
                yield mutate(whole, n)
            yield from _reparent(whole, n)
            yield from _swap_start(whole, n)


def test_a_real_trace_is_plainly_clean(captured: CapturedSpans) -> None:
    traces = _traces(captured)
    rollouts = [t for t in traces if any(s.attributes.get(c.KIND) == c.KIND_ROLLOUT for s in t)]
    assert len(rollouts) == 2
    for trace in traces:
        assert _rules_find(trace) is False
        assert plainly_clean(trace)


def test_a_trace_broken_any_way_a_rule_judges_is_never_cleared_at_a_glance(captured: CapturedSpans) -> None:
    cleared = found = 0
    for trace in _traces(captured):
        for broken in _broken(trace):
            rules = _rules_find(broken)
            clean = plainly_clean(broken)
            assert not (clean and rules), (rules, [(s.name, s.parent_id, dict(s.attributes)) for s in broken])
            cleared += clean
            found += bool(rules)
    # The corpus bites both ways: most breaks are found by the rules, and the look still clears
    # the harmless ones (a changed field no rule reads here).
    assert found > 1000
    assert cleared > 100


@pytest.mark.parametrize("kind", [c.KIND_TURN, c.KIND_STEP])
def test_numbers_out_of_order_in_start_order_are_left_to_the_rules(
    captured: CapturedSpans, kind: str
) -> None:
    trace = next(t for t in _traces(captured) if any(s.attributes.get(c.KIND) == kind for s in t))
    first, second = [n for n, s in enumerate(trace) if s.attributes.get(c.KIND) == kind][:2]
    swapped = _swap_start(trace, first)
    broken = next(b for b in swapped if b[second].start_ns == trace[first].start_ns)
    assert _rules_find(broken) is True
    assert not plainly_clean(broken)
