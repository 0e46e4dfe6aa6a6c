"""timeline and report; private: main(argv) in process, runs built at chosen times, the marks' names.

``gymtrace timeline`` and ``gymtrace report`` on runs built at chosen times: what the pages carry
(bars, lanes, marks, figures), the Chrome trace-event JSON, and bad input. What the browser draws
from them is tests/e2e/test_pictures_in_browser.py."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from built_runs import BuiltRun
from gymtrace import _constants as c
from gymtrace._cli import main
from gymtrace._read.pictures.timeline import FAILED, LOST, NOSPLIT, RETRY, SLOW

US = 1_000


def _page_data(page: str) -> dict[str, Any]:
    found = re.search(r'<script type="application/json" id="timeline-data">(.*?)</script>', page, re.S)
    assert found, "the page carries no timeline data"
    data: dict[str, Any] = json.loads(found.group(1))
    return data


def _timeline(tmp_path: Path, capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    out = tmp_path / "run.html"
    assert main(["timeline", *argv, "-o", str(out)]) == 0
    capsys.readouterr()
    return _page_data(out.read_text())


def _per_rollout(data: dict[str, Any], column: str) -> dict[str, list[Any]]:
    """A column of the bars, per rollout ID, in bar order."""
    found: dict[str, list[Any]] = {}
    for r, value in zip(data["bars"]["rollout"], data["bars"][column], strict=True):
        found.setdefault(data["rollouts"]["id"][r], []).append(value)
    return found


def _run_of_two_workers(tmp_path: Path) -> Path:
    """Worker w1 runs three episodes, two of them at once; w2 one, retried after a failure."""
    run = BuiltRun("two")
    for n, (start, end) in enumerate(((0, 3_000), (1_000, 2_000), (3_500, 5_000))):
        rollout = run.rollout(f"w1-{n}", repeat=n)
        episode = rollout.episode(start, end, reward=1.0)
        episode.child(c.KIND_MODEL_CALL, start, start + 500)
        # The environment answers from another process: its span is the episode's, drawn in w1's lane.
        episode.child(c.KIND_TOOL_CALL, start + 500, start + 700, service="env-server")
        rollout.end(reward=1.0)
    retried = run.rollout("w2-0", service="worker", instance="w2")
    retried.episode(0, 1_000, outcome=c.OUTCOME_FAILED, failure=c.FAILURE_INFRASTRUCTURE)
    retried.episode(1_500, 4_000, reward=0.0).child(c.KIND_VERIFY, 3_000, 4_000)
    retried.end(reward=0.0)
    return run.write(tmp_path / "two.jsonl")


def test_a_workers_episodes_pack_into_the_fewest_lanes_that_keep_them_apart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _timeline(tmp_path, capsys, str(_run_of_two_workers(tmp_path)))
    assert data["lanes"] == ["worker w1 #1", "worker w1 #2", "worker w2"]
    by_rollout = _per_rollout(data, "lane")
    # w1-1 overlaps w1-0 (a second lane); w1-2 starts after both ended: in the lane that freed first.
    assert by_rollout == {"w1-0": [0], "w1-1": [1], "w1-2": [1], "w2-0": [2, 2]}
    assert len(data["bars"]["lane"]) == 5  # every episode a bar; env-server opened none, so it has no lane


def test_bars_carry_times_splits_and_marks_of_their_episodes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _timeline(tmp_path, capsys, str(_run_of_two_workers(tmp_path)))
    bars, rollouts = data["bars"], data["rollouts"]
    first = {}
    for i, r in enumerate(bars["rollout"]):
        first.setdefault((rollouts["id"][r], bars["attempt"][i]), i)
    failed, retry = first[("w2-0", 0)], first[("w2-0", 1)]
    assert bars["flags"][failed] & FAILED and not bars["flags"][failed] & RETRY
    assert bars["flags"][retry] & RETRY and not bars["flags"][retry] & FAILED
    assert (bars["start"][retry], bars["dur"][retry]) == (1_500, 2_500)  # µs from the run's first start
    assert bars["split"][4 * retry : 4 * retry + 4] == [0, 0, 0, 1_000]  # model, tool, env, verify (µs)
    w1 = first[("w1-0", 0)]
    assert bars["split"][4 * w1 : 4 * w1 + 4] == [500, 200, 0, 0]
    assert rollouts["trace"][bars["rollout"][w1]] == rollouts["trace"][0]
    assert rollouts["reward"][bars["rollout"][retry]] == 0.0


def test_the_slowest_one_percent_of_rollouts_is_marked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = BuiltRun("many")
    for n in range(250):  # rollout n takes 100 + n µs: the three slowest are 247, 248, 249
        rollout = run.rollout(f"r{n}", repeat=n)
        rollout.episode(n * 1_000, n * 1_000 + 100 + n, reward=1.0)
        rollout.end(reward=1.0)
    data = _timeline(tmp_path, capsys, str(run.write(tmp_path / "many.jsonl")))
    slow = {rollout for rollout, flags in _per_rollout(data, "flags").items() if flags[0] & SLOW}
    assert slow == {"r247", "r248", "r249"}  # ceil(1 % of 250) = 3


def test_lanes_per_rollout_hold_each_rollouts_attempts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _timeline(tmp_path, capsys, str(_run_of_two_workers(tmp_path)), "--lanes", "rollout")
    assert data["lanes"] == ["w1-0", "w2-0", "w1-1", "w1-2"]  # in start order
    assert _per_rollout(data, "lane") == {"w1-0": [0], "w2-0": [1, 1], "w1-1": [2], "w1-2": [3]}


def test_sampled_out_and_lost_rollouts_are_plain_bars(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = BuiltRun("sparse")
    kept = run.rollout("kept")
    kept.episode(0, 1_000, reward=1.0).child(c.KIND_MODEL_CALL, 0, 500)
    kept.end(reward=1.0)
    run.rollout("out", repeat=1).end(reward=1.0, detail=False, end_us=3_000)
    run.lost("gone", 500, 2_500)
    data = _timeline(tmp_path, capsys, str(run.write(tmp_path / "sparse.jsonl")))
    flags = {rollout: found[0] for rollout, found in _per_rollout(data, "flags").items()}
    assert not flags["kept"] & NOSPLIT
    assert flags["out"] & NOSPLIT and not flags["out"] & LOST
    assert flags["gone"] & NOSPLIT and flags["gone"] & LOST
    lost = data["rollouts"]["id"].index("gone")
    bar = data["bars"]["rollout"].index(lost)
    assert (data["bars"]["start"][bar], data["bars"]["dur"][bar]) == (500, 2_000)


def test_train_steps_are_bands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = BuiltRun("train")
    rollout = run.rollout("a")
    rollout.episode(0, 1_000, reward=1.0)
    rollout.end(reward=1.0)
    run.train_step(0, 1_200, 1_500)
    run.train_step(1, 2_000, 2_600)
    data = _timeline(tmp_path, capsys, str(run.write(tmp_path / "train.jsonl")))
    assert data["bands"] == [[1_200, 1_500, "step 0"], [2_000, 2_600, "step 1"]]


def test_the_timeline_page_loads_nothing_from_anywhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run.html"
    assert main(["timeline", str(_run_of_two_workers(tmp_path)), "-o", str(out)]) == 0
    page = out.read_text()
    assert not re.search(r"<(link|img|iframe)\b|\bsrc=|https?://|@import|url\(", page), "the page reaches out"
    assert "timeline-data" in page and "gymtraceTimelines" in page


def test_chrome_format_is_trace_events_perfetto_opens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run.json"
    path = _run_of_two_workers(tmp_path)
    assert main(["timeline", str(path), "--format", "chrome", "-o", str(out)]) == 0
    trace = json.loads(out.read_text())
    events = trace["traceEvents"]
    assert trace["displayTimeUnit"] == "ms"
    names = {(e["pid"], e["args"]["name"]) for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert {name for _, name in names} == {"worker w1", "worker w2"}
    episodes = [e for e in events if e["ph"] == "X" and e["cat"] == "episode"]
    assert len(episodes) == 5
    retry = next(e for e in episodes if e["name"] == "w2-0 a1")
    assert retry["ts"] == 1_500 and retry["dur"] == 2_500
    assert retry["args"]["trace_id"] and retry["args"]["reward"] == 0.0 and retry["args"]["attempt"] == 1
    # Inside each episode, where each part had its time, on the episode's own lane.
    verify = [
        e for e in events if e.get("cat") == "verify" and (e["pid"], e["tid"]) == (retry["pid"], retry["tid"])
    ]
    assert [(e["ts"], e["dur"]) for e in verify] == [(3_000, 1_000)]
    for part in (e for e in events if e.get("cat") in c.SPLIT_PARTS):
        owner = next(
            e
            for e in episodes
            if (e["pid"], e["tid"]) == (part["pid"], part["tid"])
            and e["ts"] <= part["ts"]
            and part["ts"] + part["dur"] <= e["ts"] + e["dur"]
        )
        assert owner


def test_an_unknown_run_is_one_line_naming_the_runs_present(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _run_of_two_workers(tmp_path)
    BuiltRun("other").write(path, mode="a")
    for command in ("timeline", "report"):
        assert main([command, str(path), "--run", "nope", "-o", str(tmp_path / "x")]) == 2
        err = capsys.readouterr().err
        assert err == f"gymtrace {command}: no run 'nope' in the input; runs present: other, two\n"
        assert main([command, str(path), "-o", str(tmp_path / "x")]) == 2
        assert "the input holds 2 runs, name one with --run: other, two" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_an_empty_run_gets_a_report_that_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = BuiltRun("empty").write(tmp_path / "empty.jsonl")
    out = tmp_path / "report.html"
    assert main(["report", str(path), "--run", "empty", "-o", str(out)]) == 0
    page = out.read_text()
    assert 'data-figure="empty"' in page and "Run empty holds no rollouts" in page
    assert main(["timeline", str(path), "-o", str(tmp_path / "t.html")]) == 0
    assert _page_data((tmp_path / "t.html").read_text())["bars"]["lane"] == []


def _figures(page: str) -> dict[str, Any]:
    return {
        name: json.loads(value.replace("&quot;", '"'))
        for name, value in re.findall(r"data-figure=\"([^\"]+)\" data-value='([^']*)'", page)
    }


def test_the_reports_figures_are_what_stats_and_compare_print(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, new = BuiltRun("base"), BuiltRun("new")
    for task in range(8):  # the new run gains on every task: rewards 0.5 -> 1.0
        for repeat in range(2):
            for run, reward in ((base, 0.5), (new, 1.0)):
                rollout = run.rollout(f"{run.run_id}-{task}-{repeat}", task=f"t{task}", repeat=repeat)
                episode = rollout.episode(task * 100, task * 100 + 90, reward=reward)
                episode.child(c.KIND_MODEL_CALL, task * 100, task * 100 + 40 + repeat)
                rollout.end(reward=reward)
    a, b = base.write(tmp_path / "a.jsonl"), new.write(tmp_path / "b.jsonl")
    out = tmp_path / "report.html"
    assert main(["report", str(b), "--baseline", str(a), "-o", str(out)]) == 0
    figures = _figures(out.read_text())
    capsys.readouterr()
    assert main(["stats", str(b), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    for key in (
        "scored",
        "unscored",
        "pending",
        "mean_reward",
        "inputs",
        "rollout_seconds_p50",
        "rollout_seconds_p99",
    ):
        assert figures[key] == stats[key], key
    for part in c.SPLIT_PARTS:
        assert figures[f"time_split.{part}"] == stats["time_split"][part]
    for task, body in stats["pass_at_k"].items():
        assert figures[f"pass_at_k.{task}"] == body["value"]
    assert main(["compare", str(a), str(b), "--json"]) == 0
    compared = json.loads(capsys.readouterr().out)
    assert figures["compare.verdict"] == compared["verdict"] == "b_better"
    assert figures["compare.delta"] == compared["delta"]


def test_a_file_that_cannot_be_read_is_one_line_naming_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _run_of_two_workers(tmp_path)
    with open(path, "a") as f:
        f.write("not json\n")
    lines = len(path.read_text().splitlines())
    assert main(["timeline", str(path), "-o", str(tmp_path / "t.html")]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith(f"gymtrace timeline: {path}:{lines}: not an OTLP/JSON trace request")
        and err.count("\n") == 1
    )


def test_a_last_line_cut_short_by_a_killed_writer_is_one_warning_and_the_lines_before_it_are_drawn(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _run_of_two_workers(tmp_path)
    whole = _timeline(tmp_path, capsys, str(path))
    with open(path, "a") as f:
        f.write('{"resourceSpans": [{"scopeSpans"')  # no newline: its writer stopped mid-line
    out = tmp_path / "cut.html"
    assert main(["timeline", str(path), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{path}: its last line" in err and "cut short" in err
    assert _page_data(out.read_text()) == whole


def test_the_pictures_reader_splits_as_the_readers_do_nemo_gyms_own_ids_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = BuiltRun("nemo")
    rollout = run.rollout("ng-1")
    rollout.episode(0, 1_000, outcome=c.OUTCOME_FAILED, failure=c.FAILURE_INFRASTRUCTURE)
    second = rollout.episode(2_000, 4_000, reward=1.0)
    # NeMo Gym's model server names the rollout its own way: its capture key, "-a1" for attempt 1.
    served = second.child(None, 2_500, 3_500, operation=c.OPERATION_CHAT, service="model-server")
    attributes = {k: v for k, v in served.attributes.items() if k not in c.IDENTITY_KEYS}
    attributes[c.NEMO_GYM_ROLLOUT_ID] = "ng-1-a1"
    run.spans[run.spans.index(served)] = replace(served, attributes=attributes)
    rollout.end(reward=1.0)
    path = run.write(tmp_path / "nemo.jsonl")
    assert main(["rollouts", str(path), "--json"]) == 0
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert row["time_split"]["model"] == 0.001
    data = _timeline(tmp_path, capsys, str(path))
    retry = data["bars"]["attempt"].index(1)
    assert data["bars"]["split"][4 * retry] == 1_000  # µs of model, as the readers say
