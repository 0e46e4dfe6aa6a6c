"""The two-tier Collector, run for real: a load-balancing front routing by trace ID to three
tail-sampling Collectors, 500 rollouts from four processes, and one sampler killed mid-run.

Checked in Jaeger, per trace: every kept trace is whole (as many spans as the worker sent, including
outcome records that arrive after the decision), every retried and unscored rollout and every run
is kept, clean ones are dropped (sample share 0), and
the only traces lost or cut are ones the killed sampler held when it died. The numbers are printed.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from child_process import clean_env
from gymtrace import _constants as c
from gymtrace._model.spandata import read_otlp_json_lines
from gymtrace._read.check import check_spans
from pipeline import JAEGER_BIN, OTELCOL_BIN, Pipeline

WORKERS = 4
ROLLOUTS_PER_WORKER = 125
SAMPLERS = 3
KILLED = 1
# A "long" rollout's second attempt outlives the wait after its root several times over.
LONG_SECONDS = 4.0
WORKER = Path(__file__).resolve().parent.parent / "support" / "scale_worker.py"

# Test-only overlay for the sampler that gets killed: a second pipeline on the same receiver logs
# the trace ID of every span it accepts, so the test knows which traces it held when it died.
SEEN_OVERLAY = """
exporters:
  debug/seen:
    verbosity: detailed
    sampling_initial: 1000000000
service:
  telemetry:
    logs:
      sampling:
        enabled: false
  pipelines:
    traces/seen:
      receivers: [otlp]
      exporters: [debug/seen]
"""
TRACE_ID_LINE = re.compile(r"Trace ID\s*:\s*([0-9a-f]{32})")

pytestmark = pytest.mark.e2e


def _held(log: Path) -> set[str]:
    return set(TRACE_ID_LINE.findall(log.read_text(errors="replace")))


def test_scale_out_keeps_traces_whole_and_a_killed_sampler_loses_only_what_it_held(tmp_path: Path) -> None:
    for binary in (JAEGER_BIN, OTELCOL_BIN):
        if not binary.is_file():
            pytest.fail(f"{binary} is missing: run `collector/build --otelcol`", pytrace=False)
    overlay = tmp_path / "seen.yaml"
    overlay.write_text(SEEN_OVERLAY)
    t0 = time.monotonic()
    with Pipeline(
        decision_wait="60s",
        decision_wait_after_root="1s",
        sample_percent=0,
        samplers=SAMPLERS,
        workdir=tmp_path / "pipeline",
        sampler_extra_configs={KILLED: [str(overlay)]},
    ) as p:
        run_base = f"scale-{uuid.uuid4().hex[:6]}"
        files = [tmp_path / f"worker-{i}.jsonl" for i in range(WORKERS)]
        argv = [sys.executable, str(WORKER), p.otlp_grpc_endpoint]
        workers = [
            subprocess.Popen(
                [*argv, f"{run_base}-w{i}", str(ROLLOUTS_PER_WORKER), str(files[i]), str(LONG_SECONDS)],
                env=clean_env(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for i in range(WORKERS)
        ]
        # Mid-run: the killed sampler has taken part of the load.
        killed_log = p.samplers[KILLED].log
        deadline = time.monotonic() + 60
        while len(_held(killed_log)) < 25 and time.monotonic() < deadline:
            time.sleep(0.1)
        p.kill_sampler(KILLED)
        held = _held(killed_log)
        # A StatefulSet restarts the pod on the same address; meanwhile the front retries.
        p.start_sampler(KILLED)
        for w in workers:
            _, err = w.communicate(timeout=120)
            assert w.returncode == 0, err[-3000:]
        sent_done = time.monotonic()

        sent = [s for f in files for s in read_otlp_json_lines(f)]
        assert check_spans(sent) == []
        spans_sent = Counter(s.trace_id for s in sent)
        roots = {s.trace_id: s for s in sent if s.parent_id is None}
        must_keep = {
            t for t, s in roots.items() if s.attributes[c.KIND] == c.KIND_RUN
            or s.attributes.get(c.ROLLOUT_OUTCOME) in (c.OUTCOME_UNSCORED, c.OUTCOME_PENDING)
            or int(s.attributes.get(c.ROLLOUT_ATTEMPTS, 1)) > 1
        }  # fmt: skip
        clean = set(roots) - must_keep
        assert sum(1 for s in roots.values() if s.attributes[c.KIND] == c.KIND_ROLLOUT) == 500

        # Every decision is due 1 s after the root; give the tiers a few seconds more.
        deadline = time.monotonic() + 30
        stored: dict[str, int] = {}
        while True:
            for trace_id in must_keep - {t for t, n in stored.items() if n == spans_sent[t]}:
                trace = p.get_trace(trace_id)
                stored[trace_id] = len(trace["spans"]) if trace else 0
            whole = {t for t in must_keep if stored.get(t) == spans_sent[t]}
            if whole == must_keep or time.monotonic() > deadline:
                break
            time.sleep(1)
        time.sleep(2)  # past every drop decision too
        clean_stored = {t for t in clean if p.get_trace(t)}

    lost = must_keep - whole
    cut = {t for t in lost if stored.get(t)}
    report = (
        f"\nscale-out: {len(roots) - WORKERS} rollouts + {WORKERS} runs sent by {WORKERS} processes "
        f"({len(sent)} spans) through 1 front + {SAMPLERS} samplers in {sent_done - t0:.1f}s; "
        f"must keep {len(must_keep)}, kept whole {len(whole)}; sampler {KILLED} killed holding "
        f"{len(held)} traces ({len(held & must_keep)} to keep): lost {len(lost) - len(cut)}, cut "
        f"{len(cut)}; clean rollouts stored {len(clean_stored)} of {len(clean)}; "
        f"total {time.monotonic() - t0:.1f}s"
    )
    print(report)
    assert lost <= held, f"lost traces the killed sampler never held: {sorted(lost - held)[:5]}{report}"
    assert not clean_stored, report  # sample share 0: whole-trace decisions, no stray fragments
    shapes = Counter(roots[t].attributes.get(c.ROLLOUT_ID, "run").split("/")[-1].split("-")[0] for t in whole)
    assert all(shapes[shape] > 0 for shape in ("long", "retried", "unscored", "late")), shapes
    # A late outcome record joined its already-kept trace (the decision cache), not a fragment.
    late_records = [s for s in sent if s.attributes[c.KIND] == c.KIND_OUTCOME and s.trace_id in whole]
    assert late_records, "no late outcome record reached a whole trace"
