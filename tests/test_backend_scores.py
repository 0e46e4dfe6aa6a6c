"""The backends' score sender (``_sdk.backends``, private: no public handle), without a server.

The sender and the mapping of GYMTRACE_BACKEND=mlflow|phoenix, driven directly.

The servers themselves are in tests/e2e/test_backends.py; here, what decides what is sent: each
score retried until it lands, a newer outcome replacing a waiting one (never two scores), every
loss counted and warned about once, and the attributes each backend reads.
"""

from __future__ import annotations

import json
import logging
import threading

import pytest

from gymtrace import attributes as c
from gymtrace._model.spandata import SpanData
from gymtrace._sdk.backends import BackendError, NotYet, ScoreSender, decided, mapped_attributes


def _span(name: str, kind: str, parent: str | None = None, **attributes: object) -> SpanData:
    return SpanData(
        trace_id="a" * 32,
        span_id=f"{abs(hash((name, kind, parent))) % 16**16:016x}",
        parent_id=parent,
        name=name,
        start_ns=1,
        end_ns=2,
        attributes={c.KIND: kind, **attributes},
        events=(),
        links=(),
        status="UNSET",
        status_message="",
        service="svc",
        span_kind="INTERNAL",
        service_instance="",
    )


def test_a_score_is_retried_while_the_trace_is_not_there_and_counted_once_sent() -> None:
    sender = ScoreSender("MLflow", retry_seconds=60)
    calls = []

    def send() -> None:
        calls.append(1)
        if len(calls) < 3:
            raise NotYet("404: no trace yet")

    sender.submit(("score", "t", "r"), "the reward of r", send)
    assert sender.flush(30)
    stats = sender.stats()
    assert len(calls) == 3
    assert (stats.finished, stats.exported, stats.dropped_export_failed, stats.retries) == (1, 1, 0, 2)
    sender.shutdown(1)


def test_a_newer_outcome_replaces_the_waiting_score_so_only_the_latest_is_sent() -> None:
    sender = ScoreSender("Phoenix", retry_seconds=60)
    gate = threading.Event()
    sent: list[str] = []
    sender.submit(("block",), "a slow job", lambda: gate.wait(10) and None)
    # Both wait behind the slow job; the second replaces the first.
    sender.submit(("score", "t", "r"), "reward 0", lambda: sent.append("0"))
    sender.submit(("score", "t", "r"), "reward 1", lambda: sent.append("1"))
    gate.set()
    assert sender.flush(30)
    assert sent == ["1"]
    assert sender.stats().finished == sender.stats().exported == 2
    sender.shutdown(1)


def test_every_score_that_cannot_be_sent_is_counted_and_warned_about_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sender = ScoreSender("MLflow", retry_seconds=0.3)

    def refused() -> None:
        raise BackendError("400: bad experiment")

    def never_there() -> None:
        raise NotYet("404: no trace yet")

    with caplog.at_level(logging.WARNING, logger="gymtrace"):
        sender.submit(("score", "t", "1"), "the reward of 1", refused)
        sender.submit(("score", "t", "2"), "the reward of 2", never_there)
        sender.submit(("score", "t", "3"), "the reward of 3", lambda: 1 / 0 and None)
        sender.flush(30)
        sender.shutdown(1)
        sender.submit(("score", "t", "4"), "the reward of 4", lambda: None)  # after shutdown
    stats = sender.stats()
    assert (stats.finished, stats.exported, stats.dropped_export_failed, stats.queued) == (4, 0, 4, 0)
    warnings = [r for r in caplog.records if "could not send" in r.getMessage()]
    assert len(warnings) == 1 and "export_stats" in warnings[0].getMessage()


def test_each_backend_reads_its_own_names_on_every_span_and_the_rollout_root() -> None:
    attributes = {c.RUN_ID: "R", c.TASK_ID: "T", c.ROLLOUT_ID: "R/T/0", c.ROLLOUT_REPEAT: 0}
    root = _span(c.SPAN_ROLLOUT, c.KIND_ROLLOUT, **attributes, **{c.ROLLOUT_OUTCOME: "scored"})
    verify = _span(c.SPAN_VERIFY, c.KIND_VERIFY, parent=root.span_id, **attributes)
    mlflow = mapped_attributes("mlflow", root)
    assert mlflow[c.MLFLOW_SPAN_TYPE] == "WORKFLOW"
    assert (
        mlflow["mlflow.traceTag.gym.run.id"] == "R"
        and mlflow["mlflow.traceTag.gym.rollout.outcome"] == "scored"
    )
    assert mlflow["mlflow.traceTag.mlflow.traceName"] == "T #0" and mlflow[c.SESSION_ID] == "R/T"
    assert mapped_attributes("mlflow", verify) == {c.MLFLOW_SPAN_TYPE: "EVALUATOR"}
    phoenix = mapped_attributes("phoenix", root)
    assert phoenix[c.OPENINFERENCE_SPAN_KIND] == "CHAIN" and phoenix[c.SESSION_ID] == "R/T"
    assert json.loads(phoenix[c.OPENINFERENCE_METADATA])[c.ROLLOUT_ID] == "R/T/0"
    assert mapped_attributes("phoenix", verify) == {c.OPENINFERENCE_SPAN_KIND: "EVALUATOR"}
    # A pending root leaves the outcome tag to whoever decides it (another process's record).
    pending = _span(c.SPAN_ROLLOUT, c.KIND_ROLLOUT, **attributes, **{c.ROLLOUT_OUTCOME: "pending"})
    assert "mlflow.traceTag.gym.rollout.outcome" not in mapped_attributes("mlflow", pending)


def test_the_score_follows_the_readers_rule_a_record_outranking_a_pending_root() -> None:
    attributes = {c.RUN_ID: "R", c.TASK_ID: "T", c.ROLLOUT_ID: "R/T/0"}
    root = _span(
        c.SPAN_ROLLOUT, c.KIND_ROLLOUT, **attributes, **{c.ROLLOUT_OUTCOME: "pending", c.ROLLOUT_ATTEMPTS: 1}
    )
    [(outcome, _)] = decided([root])
    assert outcome.outcome == c.OUTCOME_PENDING and outcome.reward is None
    record = _span(
        c.SPAN_OUTCOME,
        c.KIND_OUTCOME,
        parent=root.span_id,
        **attributes,
        **{c.ROLLOUT_OUTCOME: "scored", c.REWARD: 0.5, c.EPISODE_ATTEMPT: 0, c.OUTCOME_SOURCE: "late"},
    )
    [(outcome, attempt)] = decided([root, record])
    assert (outcome.outcome, outcome.reward, attempt) == (c.OUTCOME_SCORED, 0.5, 0)


def test_a_trace_pushed_under_new_ids_keeps_its_tree_and_links_and_carries_its_original_id() -> None:
    from gymtrace._model.spandata import LinkData
    from gymtrace._sdk.backends.push import move, moved_trace_id

    run = _span("gym.run", c.KIND_RUN, run_id="R")
    run = SpanData(**{**vars(run), "trace_id": "b" * 32})
    rollout = _span("gym.rollout", c.KIND_ROLLOUT, None, **{c.ROLLOUT_ID: "r-1", c.RUN_ID: "R"})
    rollout = SpanData(**{**vars(rollout), "links": (LinkData(run.trace_id, run.span_id),)})
    episode = _span("gym.episode", c.KIND_EPISODE, rollout.span_id)
    spans = [run, rollout, episode]
    # The rollout's trace moves; the run's does not (another experiment holds only the rollout's).
    out = move(spans, {rollout.trace_id}, "B")
    assert out[0] == run
    new_rollout, new_episode = out[1], out[2]
    assert new_rollout.trace_id == new_episode.trace_id == moved_trace_id(rollout.trace_id, "B")
    assert new_episode.parent_id == new_rollout.span_id != rollout.span_id
    assert new_rollout.links == rollout.links  # the run's trace kept its IDs: the link still reaches it
    assert {s.attributes[c.PUSH_ORIGINAL_TRACE_ID] for s in out[1:]} == {rollout.trace_id}
    assert c.PUSH_ORIGINAL_TRACE_ID not in out[0].attributes
    # Both moved: the link follows the run span to its new IDs.
    both = move(spans, {run.trace_id, rollout.trace_id}, "B")
    assert both[1].links[0].trace_id == both[0].trace_id and both[1].links[0].span_id == both[0].span_id
    # Derived from (original, experiment) alone: the same again for B, other IDs for C.
    assert move(spans, {rollout.trace_id}, "B") == out
    assert move(spans, {rollout.trace_id}, "C")[1].trace_id != new_rollout.trace_id
    # The rollout still reads as one scored-or-not rollout of the same identity.
    assert [o.rollout_id for o, _ in decided(out)] == [o.rollout_id for o, _ in decided(spans)]
