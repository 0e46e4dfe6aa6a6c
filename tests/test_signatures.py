"""Types and signatures survive decoration, for inspect and for type checkers."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import gymtrace


def test_inspect_signature_is_the_decorated_functions() -> None:
    def original(row: dict[str, str], repeat: int = 0, *, strict: bool = False) -> float:
        """Docs."""
        return 0.0

    decorated = gymtrace.rollout(rollout_id=lambda row, repeat=0, strict=False: row["id"])(original)
    assert inspect.signature(decorated) == inspect.signature(original)
    assert decorated.__name__ == "original"
    assert decorated.__doc__ == "Docs."
    assert decorated.__wrapped__ is original  # type: ignore[attr-defined]


def test_methods_keep_their_binding() -> None:
    class Env:
        @gymtrace.tool_call
        def tool(self, x: int) -> int:
            return x

        @gymtrace.verify
        @classmethod
        def score(cls) -> str:
            return cls.__name__

        @gymtrace.seed_session
        @staticmethod
        def seed(x: int) -> int:
            return x

    assert str(inspect.signature(Env().tool)) == "(x: 'int') -> 'int'"
    assert isinstance(Env.__dict__["score"], classmethod)
    assert isinstance(Env.__dict__["seed"], staticmethod)
    assert Env.score() == "Env"
    assert Env.seed(3) == 3


def test_type_checker_sees_the_original_types() -> None:
    target = Path(__file__).parent / "typing" / "decorated_types.py"
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(target)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
