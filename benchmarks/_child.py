"""One benchmark child process: ``python -c CODE ARGS`` in a scratch directory, its last line of
output read as JSON. Shared by ``perf.py`` and ``peers.py``."""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any


def run_json(
    python: str, code: str, args: Sequence[str], env: Mapping[str, str], timeout: float = 900
) -> Any:
    with tempfile.TemporaryDirectory() as tmp:  # nothing a child writes lands in the checkout
        out = subprocess.run(
            [python, "-c", code, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=dict(env),
            cwd=tmp,
            check=False,
        )
    if out.returncode != 0:
        raise RuntimeError(f"child failed ({out.returncode}):\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])
