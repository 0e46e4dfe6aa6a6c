"""gymtrace's runs in a real MLflow 3.17.2 and a real Arize Phoenix 20.26.1 (docs/integrations/backends.md).

Each server runs from its own virtualenv (``scripts/test`` builds ``.venv-mlflow`` and
``.venv-phoenix``), one per module, on a free loopback port with SQLite. The demo's run is traced
live (``GYMTRACE_BACKEND``) and pushed from files (``gymtrace push``); each is checked through the
server's own API (MLflow's client ``search_traces`` run in the MLflow venv, Phoenix's REST spans and
span annotations) against what ``gymtrace rollouts`` reports for the same spans. A headless Chromium
screenshot of each UI shows a rollout with its reward; ``GYMTRACE_WRITE_README=1`` copies them into
``docs/integrations/img/``.
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from backends import MLFLOW_PYTHON, PHOENIX_PYTHON, MlflowServer, PhoenixServer, missing
from browser import Browser, find_chromium
from child_process import run_gymtrace, run_python
from gymtrace import _constants as c
from gymtrace._model.spandata import read_otlp_json_lines
from gymtrace._read.outcomes import final_outcomes
from gymtrace._sdk.backends.push import moved_trace_id
from pipeline import REPO_ROOT, free_ports

pytestmark = pytest.mark.e2e

ARTIFACTS = REPO_ROOT / "test-artifacts" / "backends"
DOCS_IMAGES = REPO_ROOT / "docs" / "integrations" / "img"


@pytest.fixture(scope="module")
def mlflow_server() -> Iterator[MlflowServer]:
    why = missing(MLFLOW_PYTHON, "pip install mlflow")
    if why:
        pytest.fail(why, pytrace=False)
    with MlflowServer() as server:
        yield server


@pytest.fixture(scope="module")
def phoenix_server() -> Iterator[PhoenixServer]:
    why = missing(PHOENIX_PYTHON, "pip install arize-phoenix")
    if why:
        pytest.fail(why, pytrace=False)
    with PhoenixServer() as server:
        yield server


def _demo(tmp_path: Path, run_id: str, env: dict[str, str], endpoint: str | None = None) -> Path:
    """The demo's run (8 rollouts: retried, unscored, scored by a remote and a late record), traced
    to a file and, with ``endpoint``, to the backend ``env`` names."""
    trace_file = tmp_path / f"{run_id}.jsonl"
    argv = ["demo", "--quiet", "--run-id", run_id, "--file", str(trace_file)]
    # Scores wait at exit until sent, within GYMTRACE_FLUSH_TIMEOUT: a shared CI machine is slow.
    env = {"GYMTRACE_FLUSH_TIMEOUT": "120", **env}
    if endpoint:
        argv += ["--endpoint", endpoint]
    done = run_python("-m", "gymtrace", *argv, env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    # Nothing lost on the way: no span dropped, no score given up on.
    for trouble in ("dropped 1", "dropped 2", "did not take spans", "could not send"):
        assert trouble not in done.stderr, done.stderr
    return trace_file


def _expected(trace_file: Path, run_id: str) -> dict[str, tuple[str, float | None]]:
    """What `gymtrace rollouts` reports: rollout ID -> (outcome, reward)."""
    outcomes = final_outcomes(read_otlp_json_lines(trace_file), run_id=run_id)
    assert {o.outcome for o in outcomes} >= {c.OUTCOME_SCORED, c.OUTCOME_UNSCORED}
    return {o.rollout_id: (o.outcome, o.reward) for o in outcomes}


# -- MLflow -----------------------------------------------------------------------------------------


def _mlflow_rollouts(server: MlflowServer, experiment: str, run_id: str) -> dict[str, dict[str, Any]]:
    """The run's rollout traces, by MLflow's own search on the trace tag; each rollout once."""
    traces = server.traces(experiment, f"tags.`{c.RUN_ID}` = '{run_id}'")
    rollouts = [t for t in traces if c.ROLLOUT_ID in t["tags"]]
    ids = [t["tags"][c.ROLLOUT_ID] for t in rollouts]
    assert len(ids) == len(set(ids)), f"a rollout in two traces: {sorted(ids)}"
    return {t["tags"][c.ROLLOUT_ID]: t for t in rollouts}


def _assert_mlflow_matches(
    server: MlflowServer, experiment: str, run_id: str, expected: dict[str, Any]
) -> None:
    rollouts = _mlflow_rollouts(server, experiment, run_id)
    assert set(rollouts) == set(expected)
    for rollout_id, (outcome, reward) in expected.items():
        trace = rollouts[rollout_id]
        rewards = [a for a in trace["assessments"] if a["name"] == c.SCORE_REWARD]
        if outcome == c.OUTCOME_SCORED:
            assert [a["value"] for a in rewards] == [reward], (rollout_id, rewards)
            assert rewards[0]["metadata"][c.ROLLOUT_ID] == rollout_id
            assert trace["tags"].get(c.ROLLOUT_OUTCOME) == c.OUTCOME_SCORED, (rollout_id, trace["tags"])
        else:
            assert rewards == [], f"{rollout_id} is {outcome} but has a reward score: {rewards}"
        assert trace["tags"][c.TASK_ID] and trace["tags"]["mlflow.traceName"]
        assert trace["metadata"]["mlflow.trace.session"] == f"{run_id}/{trace['tags'][c.TASK_ID]}"
        # Every span has a type MLflow's UI and span.type searches know; gym's levels none UNKNOWN.
        types = {s["name"]: s["type"] for s in trace["spans"]}
        assert types[c.SPAN_ROLLOUT] == "WORKFLOW"
        assert all(t != "UNKNOWN" for n, t in types.items() if n.startswith("gym.")), types
        assert "AGENT" in types.values() and "CHAT_MODEL" in types.values()
    # The search users type for good rollouts finds exactly the scored ones.
    good = server.traces(experiment, f"feedback.`{c.SCORE_REWARD}` > 0.5 AND tags.`{c.RUN_ID}` = '{run_id}'")
    assert {t["tags"][c.ROLLOUT_ID] for t in good} == {
        r for r, (o, value) in expected.items() if o == c.OUTCOME_SCORED and value is not None and value > 0.5
    }
    # The gym run is an MLflow run holding its counts, its rollout traces linked to it.
    runs = [r for r in server.runs(experiment) if r["tags"].get(c.RUN_ID) == run_id]
    assert len(runs) == 1, runs
    scored = [v for o, v in expected.values() if o == c.OUTCOME_SCORED]
    metrics = runs[0]["metrics"]
    assert metrics[c.MLFLOW_RUN_METRIC_SCORED] == len(scored)
    assert metrics[c.MLFLOW_RUN_METRIC_UNSCORED] == sum(o == c.OUTCOME_UNSCORED for o, _ in expected.values())
    assert metrics[c.MLFLOW_RUN_METRIC_MEAN_REWARD] == pytest.approx(sum(scored) / len(scored))
    linked = server.traces(experiment, run_id=runs[0]["run_id"])
    assert {t["tags"].get(c.ROLLOUT_ID) for t in linked} >= set(expected)


def test_a_live_run_lands_in_mlflow_each_rollout_once_with_the_reward_gymtrace_rollouts_reports(
    mlflow_server: MlflowServer, tmp_path: Path
) -> None:
    run_id = f"live-{uuid.uuid4().hex[:6]}"
    # No protocol given: the backend picks OTLP/HTTP protobuf, whatever the demo's default.
    env = {"GYMTRACE_BACKEND": "mlflow", "GYMTRACE_EXPERIMENT": "rl-live"}
    trace_file = _demo(tmp_path, run_id, env, endpoint=mlflow_server.url)
    _assert_mlflow_matches(mlflow_server, "rl-live", run_id, _expected(trace_file, run_id))


def test_gymtrace_push_to_mlflow_twice_stores_every_rollout_and_reward_once(
    mlflow_server: MlflowServer, tmp_path: Path
) -> None:
    run_id = f"push-{uuid.uuid4().hex[:6]}"
    trace_file = _demo(tmp_path, run_id, {})
    argv = ["push", "--backend", "mlflow", "--endpoint", mlflow_server.url, "--experiment", "rl-push"]
    for _ in range(2):
        done = run_gymtrace(*argv, str(trace_file), timeout=300)
        assert done.returncode == 0, done.stderr
        assert _summary(trace_file, run_id, "experiment 'rl-push'") in done.stdout
        assert "new IDs" not in done.stdout  # no other experiment holds them: the files' own IDs
    _assert_mlflow_matches(mlflow_server, "rl-push", run_id, _expected(trace_file, run_id))


def _summary(trace_file: Path, run_id: str, where: str) -> str:
    """The summary `gymtrace push` prints when the server holds every span and reward of the file."""
    spans = [s for s in read_otlp_json_lines(trace_file) if s.attributes.get(c.KIND) != c.KIND_LIVE]
    expected = _expected(trace_file, run_id)
    scored = sum(o == c.OUTCOME_SCORED for o, _ in expected.values())
    return (
        f"{where}, holds {len(spans)} spans in {len({s.trace_id for s in spans})} traces:"
        f" {len(expected)} rollouts ({scored} with a reward) of run(s) {run_id}"
    )


def _original_trace_ids(trace_file: Path) -> set[str]:
    return {s.trace_id for s in read_otlp_json_lines(trace_file) if s.attributes.get(c.KIND) != c.KIND_LIVE}


def test_push_to_a_second_mlflow_experiment_puts_the_run_there_under_ids_derived_from_the_originals(
    mlflow_server: MlflowServer, tmp_path: Path
) -> None:
    # The run traced live into one experiment, then pushed from its files into another (issue 43):
    # MLflow keeps a trace in the experiment it first arrived in, so the same IDs would add nothing.
    run_id = f"second-{uuid.uuid4().hex[:6]}"
    env = {"GYMTRACE_BACKEND": "mlflow", "GYMTRACE_EXPERIMENT": "rl-first"}
    trace_file = _demo(tmp_path, run_id, env, endpoint=mlflow_server.url)
    expected = _expected(trace_file, run_id)
    originals = _original_trace_ids(trace_file)
    argv = ["push", "--backend", "mlflow", "--endpoint", mlflow_server.url, "--experiment", "rl-second"]
    for _ in range(2):  # the second push lands on the same derived IDs: it changes nothing
        done = run_gymtrace(*argv, str(trace_file), timeout=300)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip().splitlines() == [
            _summary(trace_file, run_id, f"MLflow at {mlflow_server.url}, experiment 'rl-second'")
            + f"; {len(originals)} traces under new IDs, as experiment 'rl-first' holds their original IDs"
            f" (each span carries its original as {c.PUSH_ORIGINAL_TRACE_ID})"
        ]
    _assert_mlflow_matches(mlflow_server, "rl-second", run_id, expected)
    # Read through MLflow's own client: each trace under the ID derived from (original, experiment),
    # tagged with the original (the ID the files and join_keys() records hold).
    pushed = mlflow_server.traces("rl-second", f"tags.`{c.RUN_ID}` = '{run_id}'")
    assert {t["tags"][c.PUSH_ORIGINAL_TRACE_ID] for t in pushed} == originals
    assert {t["trace_id"] for t in pushed} == {f"tr-{moved_trace_id(o, 'rl-second')}" for o in originals}
    # The live experiment keeps its traces under their own IDs.
    _assert_mlflow_matches(mlflow_server, "rl-first", run_id, expected)
    live = mlflow_server.traces("rl-first", f"tags.`{c.RUN_ID}` = '{run_id}'")
    assert {t["trace_id"] for t in live} == {f"tr-{o}" for o in originals}
    # Once the originals are gone from the server, a third push still lands on the IDs the earlier
    # ones gave (not a second copy under the originals).
    first = mlflow_server.get("/api/2.0/mlflow/experiments/get-by-name?experiment_name=rl-first")
    mlflow_server.post(
        "/api/2.0/mlflow/traces/delete-traces",
        {"experiment_id": first["experiment"]["experiment_id"], "request_ids": [t["trace_id"] for t in live]},
    )
    done = run_gymtrace(*argv, str(trace_file), timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines() == [
        _summary(trace_file, run_id, f"MLflow at {mlflow_server.url}, experiment 'rl-second'")
        + f"; {len(originals)} traces under the new IDs an earlier push gave them"
    ]
    _assert_mlflow_matches(mlflow_server, "rl-second", run_id, expected)


# -- Phoenix ----------------------------------------------------------------------------------------


def _phoenix_live(server: PhoenixServer, project: str, run_id: str, trace_file: Path) -> list[dict[str, Any]]:
    """The live run's spans in ``project``, once Phoenix holds every span the run wrote to its file
    (the same spans went to both, but for the live markers, which a backend is not sent)."""
    written = [
        s
        for s in read_otlp_json_lines(trace_file)
        if s.attributes.get(c.RUN_ID) == run_id and s.attributes.get(c.KIND) != c.KIND_LIVE
    ]
    spans = server.run_spans(project, run_id, len(written))
    assert len(spans) == len(written), f"Phoenix holds {len(spans)} of the run's {len(written)} spans"
    return spans


def _assert_phoenix_matches(
    server: PhoenixServer, project: str, run_id: str, expected: dict[str, Any]
) -> None:
    spans = [s for s in server.spans(project) if s["attributes"].get(c.RUN_ID) == run_id]
    assert spans, f"no span of run {run_id} in project {project}"
    kinds = {s["name"]: s["span_kind"] for s in spans}
    assert kinds[c.SPAN_VERIFY] == "EVALUATOR" and kinds[c.SPAN_ROLLOUT] == "CHAIN"
    assert all(k != "UNKNOWN" for n, k in kinds.items() if n.startswith("gym.")), kinds
    roots = {s["attributes"][c.ROLLOUT_ID]: s for s in spans if s["name"] == c.SPAN_ROLLOUT}
    assert set(roots) == set(expected)
    for rollout_id, root in roots.items():
        assert root["attributes"]["session.id"] == f"{run_id}/{root['attributes'][c.TASK_ID]}"
        assert root["attributes"][f"metadata.{c.ROLLOUT_ID}"] == rollout_id
    by_span = {s["context"]["span_id"]: s for s in spans}
    annotations = [a for a in server.annotations(project, list(by_span)) if a["name"] == c.SCORE_REWARD]
    scored = {a["metadata"][c.ROLLOUT_ID]: a for a in annotations}
    assert len(scored) == len(annotations), f"a rollout scored twice: {annotations}"
    assert {r: a["result"]["score"] for r, a in scored.items()} == {
        r: reward for r, (o, reward) in expected.items() if o == c.OUTCOME_SCORED
    }
    for rollout_id, annotation in scored.items():
        # On the rollout's root span, or on the outcome record where another process decided it.
        span = by_span[annotation["span_id"]]
        assert span["attributes"][c.ROLLOUT_ID] == rollout_id
        assert span["name"] in (c.SPAN_ROLLOUT, c.SPAN_OUTCOME)


def test_a_live_run_lands_in_phoenix_with_each_reward_as_one_span_annotation(
    phoenix_server: PhoenixServer, tmp_path: Path
) -> None:
    run_id = f"live-{uuid.uuid4().hex[:6]}"
    env = {"GYMTRACE_BACKEND": "phoenix", "GYMTRACE_EXPERIMENT": "rl-live"}
    trace_file = _demo(tmp_path, run_id, env, endpoint=phoenix_server.url)
    _phoenix_live(phoenix_server, "rl-live", run_id, trace_file)
    _assert_phoenix_matches(phoenix_server, "rl-live", run_id, _expected(trace_file, run_id))


def test_gymtrace_push_to_phoenix_twice_stores_every_span_and_reward_once(
    phoenix_server: PhoenixServer, tmp_path: Path
) -> None:
    run_id = f"push-{uuid.uuid4().hex[:6]}"
    trace_file = _demo(tmp_path, run_id, {})
    argv = ["push", "--backend", "phoenix", "--endpoint", phoenix_server.url, "--experiment", "rl-push"]
    for _ in range(2):
        done = run_gymtrace(*argv, str(trace_file), timeout=300)
        assert done.returncode == 0, done.stderr
        assert _summary(trace_file, run_id, "project 'rl-push'") in done.stdout
        assert "new IDs" not in done.stdout
    _assert_phoenix_matches(phoenix_server, "rl-push", run_id, _expected(trace_file, run_id))
    ids = [s["context"]["span_id"] for s in phoenix_server.spans("rl-push")]
    assert len(ids) == len(set(ids)) == len(read_otlp_json_lines(trace_file))


def test_push_to_a_second_phoenix_project_puts_the_run_there_under_ids_derived_from_the_originals(
    phoenix_server: PhoenixServer, tmp_path: Path
) -> None:
    # Phoenix files a span under the project its trace ID is already in (issue 43).
    run_id = f"second-{uuid.uuid4().hex[:6]}"
    env = {"GYMTRACE_BACKEND": "phoenix", "GYMTRACE_EXPERIMENT": "rl-first"}
    trace_file = _demo(tmp_path, run_id, env, endpoint=phoenix_server.url)
    expected = _expected(trace_file, run_id)
    originals = _original_trace_ids(trace_file)
    live = _phoenix_live(phoenix_server, "rl-first", run_id, trace_file)
    argv = ["push", "--backend", "phoenix", "--endpoint", phoenix_server.url, "--experiment", "rl-second"]
    for _ in range(2):
        done = run_gymtrace(*argv, str(trace_file), timeout=300)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip().splitlines() == [
            _summary(trace_file, run_id, f"Phoenix at {phoenix_server.url}, project 'rl-second'")
            + f"; {len(originals)} traces under new IDs, as project 'rl-first' holds their original IDs"
            f" (each span carries its original as {c.PUSH_ORIGINAL_TRACE_ID})"
        ]
    _assert_phoenix_matches(phoenix_server, "rl-second", run_id, expected)
    pushed = [s for s in phoenix_server.spans("rl-second") if s["attributes"].get(c.RUN_ID) == run_id]
    ids = [s["context"]["span_id"] for s in pushed]
    assert len(ids) == len(set(ids)) == len(live)
    assert {s["context"]["trace_id"] for s in pushed} == {moved_trace_id(o, "rl-second") for o in originals}
    assert {s["attributes"][c.PUSH_ORIGINAL_TRACE_ID] for s in pushed} == originals
    # The live project is unchanged.
    assert len(
        [s for s in phoenix_server.spans("rl-first") if s["attributes"].get(c.RUN_ID) == run_id]
    ) == len(live)
    _assert_phoenix_matches(phoenix_server, "rl-first", run_id, expected)


# -- bad input --------------------------------------------------------------------------------------


def test_push_to_a_server_that_is_not_the_named_backend_or_is_down_fails_in_one_line_naming_the_fix(
    mlflow_server: MlflowServer, phoenix_server: PhoenixServer, tmp_path: Path
) -> None:
    trace_file = _demo(tmp_path, f"bad-{uuid.uuid4().hex[:6]}", {})
    down = f"http://127.0.0.1:{free_ports(1)[0]}"
    cases = [
        ("mlflow", phoenix_server.url, "is not an MLflow tracking server"),
        ("phoenix", mlflow_server.url, "is not an Arize Phoenix server"),
        ("mlflow", down, "cannot be reached"),
        ("phoenix", down, "cannot be reached"),
    ]
    for backend, url, says in cases:
        done = run_gymtrace("push", "--backend", backend, "--endpoint", url, str(trace_file), timeout=300)
        assert done.returncode == 2, (backend, url, done.stdout, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and says in lines[0] and lines[0].startswith("gymtrace push: "), done.stderr
    # A deleted MLflow experiment: restore it or pick another name.
    created = mlflow_server.post("/api/2.0/mlflow/experiments/create", {"name": "gone"})
    mlflow_server.post("/api/2.0/mlflow/experiments/delete", {"experiment_id": created["experiment_id"]})
    done = run_gymtrace(
        "push",
        "--backend",
        "mlflow",
        "--endpoint",
        mlflow_server.url,
        "--experiment",
        "gone",
        str(trace_file),
    )
    assert done.returncode == 2 and "is deleted: restore it" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


LIVE_TO_WRONG_SERVER = """
import logging, sys
import gymtrace
logging.basicConfig(level=logging.WARNING, format="%(message)s")
gymtrace.configure(backend=sys.argv[1], endpoint=sys.argv[2], file=False)
with gymtrace.run(run_id="r-lost"):
    for n in range(3):
        with gymtrace.rollout(task_id="t", repeat=n, rollout_id=f"r-{n}"):
            gymtrace.record_reward(1.0)
gymtrace.force_flush()
import json
print(json.dumps([vars(s) for s in gymtrace.export_stats()]))
"""


@pytest.mark.parametrize("backend", ["mlflow", "phoenix"])
def test_a_live_run_to_the_wrong_server_finishes_and_counts_what_was_lost_with_one_warning(
    backend: str, mlflow_server: MlflowServer, phoenix_server: PhoenixServer
) -> None:
    # MLflow's URL for Phoenix and the other way round: a server that is up but not the one named.
    wrong = phoenix_server.url if backend == "mlflow" else mlflow_server.url
    done = run_python(backend, wrong, code=LIVE_TO_WRONG_SERVER, env={"GYMTRACE_FLUSH_TIMEOUT": "2"})
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    warnings = [line for line in done.stderr.splitlines() if "did not take spans" in line]
    assert len(warnings) == 1 and "not an" in warnings[0], done.stderr
    stats = {s["exporter"]: s for s in json.loads(done.stdout.strip().splitlines()[-1])}
    spans = stats["otlp"]
    # Every span is accounted for: none delivered, each dropped or still queued for a retry.
    assert spans["exported"] == 0 and spans["finished"] == spans["dropped_export_failed"] + spans["queued"]


# -- the UIs ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    executable = find_chromium()
    if executable is None:
        pytest.skip("no Chromium on PATH: `apt-get install chromium` (scripts/test does it as root)")
    with Browser(executable, width=1900, height=1000) as b:
        yield b


def _keep(shot: Path, name: str) -> None:
    import os

    if os.environ.get("GYMTRACE_WRITE_README") == "1":
        DOCS_IMAGES.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, DOCS_IMAGES / name)


def test_the_mlflow_ui_shows_a_rollout_trace_with_its_reward(
    mlflow_server: MlflowServer, browser: Browser, tmp_path: Path
) -> None:
    run_id = f"ui-{uuid.uuid4().hex[:6]}"
    env = {"GYMTRACE_BACKEND": "mlflow", "GYMTRACE_EXPERIMENT": "rl-ui"}
    trace_file = _demo(tmp_path, run_id, env, endpoint=mlflow_server.url)
    expected = _expected(trace_file, run_id)
    rollout_id = next(r for r, (o, _) in expected.items() if o == c.OUTCOME_SCORED)
    trace = _mlflow_rollouts(mlflow_server, "rl-ui", run_id)[rollout_id]
    experiment = mlflow_server.get("/api/2.0/mlflow/experiments/get-by-name?experiment_name=rl-ui")
    experiment_id = experiment["experiment"]["experiment_id"]
    browser.open(f"{mlflow_server.url}/#/experiments/{experiment_id}/traces")
    # The experiment's traces table: each rollout by its session (run/task), with the reward column.
    name = trace["metadata"]["mlflow.trace.session"]
    browser.wait_for(
        f"document.body.innerText.includes({json.dumps(name)}) && document.body.innerText.includes('reward')",
        timeout=90,
        what="the MLflow traces table with the reward column",
    )
    # Dismiss the UI's first-visit hint and its assistant panel, which cover the table's right side.
    browser.evaluate(
        "Array.from(document.querySelectorAll('button')).filter(b => b.innerText.trim() === 'Got it')"
        ".forEach(b => b.click())"
    )
    browser.evaluate(
        "Array.from(document.querySelectorAll('button[aria-label]'))"
        ".filter(b => /close/i.test(b.getAttribute('aria-label'))).forEach(b => b.click())"
    )
    time.sleep(2)  # the table's last cells render after its rows
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = browser.screenshot(ARTIFACTS / "mlflow-trace.png")
    assert shot.stat().st_size > 20_000
    _keep(shot, "mlflow-trace.png")


def test_the_phoenix_ui_shows_a_rollout_with_its_reward_annotation(
    phoenix_server: PhoenixServer, browser: Browser, tmp_path: Path
) -> None:
    run_id = f"ui-{uuid.uuid4().hex[:6]}"
    env = {"GYMTRACE_BACKEND": "phoenix", "GYMTRACE_EXPERIMENT": "rl-ui"}
    trace_file = _demo(tmp_path, run_id, env, endpoint=phoenix_server.url)
    expected = _expected(trace_file, run_id)
    spans = _phoenix_live(phoenix_server, "rl-ui", run_id, trace_file)
    annotated = {
        a["span_id"] for a in phoenix_server.annotations("rl-ui", [s["context"]["span_id"] for s in spans])
    }
    assert any(s["name"] == c.SPAN_ROLLOUT and s["context"]["span_id"] in annotated for s in spans), expected
    projects = phoenix_server.get("/v1/projects")["data"]
    project_id = next(p["id"] for p in projects if p["name"] == "rl-ui")
    browser.open(f"{phoenix_server.url}/projects/{project_id}")
    # The project's traces table: each rollout root with its reward annotation.
    browser.wait_for(
        "document.body.innerText.includes('reward') && document.body.innerText.includes('gym.rollout')",
        timeout=90,
        what="the Phoenix traces table with the reward annotation",
    )
    time.sleep(2)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = browser.screenshot(ARTIFACTS / "phoenix-trace.png")
    assert shot.stat().st_size > 20_000
    _keep(shot, "phoenix-trace.png")
