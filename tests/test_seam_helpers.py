"""The helpers on the seam (``gymtrace.instrumentation``) that integrations and importers share.

The ID helpers derive exactly the IDs gymtrace has always written: a run traced live and the same
run imported later, or traced by an older gymtrace, must land in the same traces. The values below
were computed by the code each helper replaced."""

from __future__ import annotations

from pathlib import Path

import pytest

from child_process import run_gymtrace
from gymtrace import instrumentation
from gymtrace.integrations import nemo_gym
from otlp_lines import read_otlp_json_lines

RECORD = Path(__file__).parent / "data" / "records" / "atif" / "openhands-hello-world.trajectory.json"


def test_nemo_gym_trace_and_span_ids_keep_their_known_values() -> None:
    assert nemo_gym.trace_id_for("run-a", "0-0") == 0xC1BC685AC6676D50E6DFB4988724B11A
    assert nemo_gym.span_id_for("run-a", "0-0", "rollout") == 0xD2947D1539D968E8
    # Non-ASCII parts are hashed as UTF-8, the separator is NUL.
    assert nemo_gym.span_id_for("run-a", "t/é-1", "episode-1/pass-2") == 0xF4A617355094E02B


def test_imported_run_and_span_ids_keep_their_known_values(tmp_path: Path) -> None:
    # The trace of an imported run's own span, as `gymtrace import` writes it.
    out = tmp_path / "imported.jsonl"
    run_gymtrace("import", "atif", str(RECORD), "-o", str(out), "--run", "run-a", check=True)
    (run,) = [s for s in read_otlp_json_lines(out) if s.attributes.get("gym.kind") == "run"]
    assert int(run.trace_id, 16) == 0x3BF3ED89558757A764B46FFB0359718F
    assert (
        instrumentation.deterministic_id("gymtrace/span", "0123", "rollout/episode-0", size=8)
        == 0x5887D8358BDC4A1F
    )


def test_a_deterministic_id_is_the_first_bytes_of_the_sha256_of_the_parts_joined_by_nul() -> None:
    import hashlib

    digest = hashlib.sha256(b"a\x00b\x00\xc3\xa9").digest()
    assert instrumentation.deterministic_id("a", "b", "é", size=8) == int.from_bytes(digest[:8], "big")
    assert instrumentation.deterministic_id("a", "b", "é", size=16) == int.from_bytes(digest[:16], "big")


@pytest.mark.parametrize("size", [0, 33, True, 8.0])
def test_a_deterministic_id_of_an_impossible_size_is_refused(size: object) -> None:
    with pytest.raises(instrumentation.InvalidArgumentError, match="size"):
        instrumentation.deterministic_id("a", size=size)  # type: ignore[arg-type]


def test_the_episode_id_is_the_rollout_id_then_attempt_qualified() -> None:
    assert instrumentation.episode_id("t-1/r0", 0) == "t-1/r0"
    assert instrumentation.episode_id("t-1/r0", 2) == "t-1/r0-a2"


def test_reading_an_integer_never_takes_a_bool_and_says_the_rest_at_the_call() -> None:
    read_int = instrumentation.read_int
    assert read_int(3) == 3
    assert read_int(True) is None  # a bool is never a count, an attempt or a step number
    assert read_int(False, 0) == 0
    assert read_int("7") is None  # text is not read unless asked ...
    assert read_int("-7", digits=True) == -7  # ... as OTLP/JSON writes int64
    assert read_int("7.0", digits=True) is None
    assert read_int(-1, minimum=0) is None  # token counts are never negative
    assert read_int(0, minimum=0) == 0
    assert read_int(None, 5) == 5
    assert read_int(2.0, 5) == 5
