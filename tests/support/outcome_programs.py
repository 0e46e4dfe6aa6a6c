"""Harness programs for the model-based outcome test (tests/test_outcome_model.py): what a program
is, how one runs (the way people write a harness: a rollout, its episodes, a scorer), and a child
process's entry point that runs a list of them under ``gymtrace.configure()``.

Run as ``python -m outcome_programs PROGRAMS.json TRACE.jsonl`` (with this directory on the path):
configures gymtrace with a file exporter (the lean span path ``configure()`` sets up), runs each
program as rollout ``r-model-<index>`` and prints, as one JSON line, the WARNING messages each
program caused on the ``gymtrace`` logger.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymtrace
from gymtrace import propagation

ENDINGS = ("completed", "record_failure", "raise", "cancel")


@dataclass(frozen=True)
class EpisodeSpec:
    rewards: tuple[float, ...]
    ending: str
    # Headers injected for a continuation inside the episode: it is handed to another process.
    handoff: bool
    restored: bool
    # gymtrace.episode(attempt=...) as given; None lets gymtrace number it.
    attempt: int | None = None


@dataclass(frozen=True)
class Program:
    episodes: tuple[EpisodeSpec, ...]
    # Without episodes: rewards recorded on the rollout itself, and whether an exception escapes it.
    rollout_rewards: tuple[float, ...] = ()
    rollout_raises: bool = False
    # Headers injected on the rollout outside every episode (after the episodes, or in a rollout
    # without any): a hand-off of the rollout's final attempt.
    rollout_handoff: bool = False
    # Rewards recorded in a verify() between the last episode and the rollout's end.
    after: tuple[float, ...] = ()
    # A reward recorded after the rollout ended, on the rollout object (source late).
    late: float | None = None
    # A scorer process continuing headers taken in episode ``index`` (-1: on the rollout) records
    # ``reward`` after the rollout ended (source remote).
    remote: tuple[int, float] | None = None

    def as_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def from_json(body: dict[str, Any]) -> Program:
        episodes = tuple(EpisodeSpec(**{**e, "rewards": tuple(e["rewards"])}) for e in body.pop("episodes"))
        remote = body.pop("remote")
        return Program(
            episodes,
            rollout_rewards=tuple(body.pop("rollout_rewards")),
            after=tuple(body.pop("after")),
            remote=tuple(remote) if remote is not None else None,  # type: ignore[arg-type]
            **body,
        )


def run(program: Program, rollout_id: str = "r-model") -> None:
    """The harness, written the way people write one: a rollout, its episodes, a scorer."""
    headers: dict[int, dict[str, str]] = {}
    with (
        contextlib.suppress(ConnectionError),
        gymtrace.rollout(rollout_id=rollout_id, task_id="t") as rollout,
    ):
        if not program.episodes:
            for value in program.rollout_rewards:
                gymtrace.record_reward(value)
            if program.rollout_handoff:
                headers[-1] = dict(
                    propagation.inject({}, destination=propagation.GYM_INTERNAL, continuation=True)
                )
            if program.rollout_raises:
                raise ConnectionError("environment lost")
        for index, spec in enumerate(program.episodes):
            try:
                with gymtrace.episode(restored_from=True if spec.restored else None, attempt=spec.attempt):
                    if spec.handoff:
                        headers[index] = dict(
                            propagation.inject({}, destination=propagation.GYM_INTERNAL, continuation=True)
                        )
                    for value in spec.rewards:
                        gymtrace.record_reward(value)
                    if spec.ending == "record_failure":
                        gymtrace.record_failure("infrastructure", message="sandbox lost")
                    elif spec.ending == "raise":
                        raise ConnectionError("sandbox lost")
                    elif spec.ending == "cancel":
                        raise KeyboardInterrupt
            except (ConnectionError, KeyboardInterrupt):
                pass  # the harness moves on to its next attempt
        if program.episodes and program.rollout_handoff:
            headers[-1] = dict(
                propagation.inject({}, destination=propagation.GYM_INTERNAL, continuation=True)
            )
        for value in program.after:
            with gymtrace.verify():
                gymtrace.record_reward(value)
    if program.late is not None:
        gymtrace.record_reward(program.late, scope=rollout)
    if program.remote is not None:
        source, reward = program.remote
        with propagation.attach(headers[source]), gymtrace.verify():
            gymtrace.record_reward(reward)


class Warnings(logging.Handler):
    """The WARNING messages on the ``gymtrace`` logger while it is attached."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def main(programs_path: str, trace_path: str) -> None:
    programs = [Program.from_json(body) for body in json.loads(Path(programs_path).read_text())]
    gymtrace.configure(service_name="model", file=trace_path, encoder="thread")
    logger = logging.getLogger("gymtrace")
    said: list[list[str]] = []
    for index, program in enumerate(programs):
        warnings = Warnings()
        logger.addHandler(warnings)
        try:
            run(program, f"r-model-{index}")
        finally:
            logger.removeHandler(warnings)
        said.append(warnings.messages)
    gymtrace.shutdown()
    print(json.dumps(said))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
