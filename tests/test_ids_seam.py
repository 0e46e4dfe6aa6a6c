"""The ID helpers on the seam (``gymtrace.instrumentation``) derive exactly the IDs gymtrace has
always written: a run traced live and the same run imported later, or traced by an older gymtrace,
must land in the same traces. The values below were computed by the code each helper replaced."""

from __future__ import annotations

import pytest

from gymtrace import instrumentation
from gymtrace._import.build import run_trace_id
from gymtrace.integrations import nemo_gym


def test_nemo_gym_trace_and_span_ids_keep_their_known_values() -> None:
    assert nemo_gym.trace_id_for("run-a", "0-0") == 0xC1BC685AC6676D50E6DFB4988724B11A
    assert nemo_gym.span_id_for("run-a", "0-0", "rollout") == 0xD2947D1539D968E8
    # Non-ASCII parts are hashed as UTF-8, the separator is NUL.
    assert nemo_gym.span_id_for("run-a", "t/é-1", "episode-1/pass-2") == 0xF4A617355094E02B


def test_imported_run_and_span_ids_keep_their_known_values() -> None:
    assert run_trace_id("run-a") == 0x3BF3ED89558757A764B46FFB0359718F
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
