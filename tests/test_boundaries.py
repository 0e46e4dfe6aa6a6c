"""Instrumentation depends on the OpenTelemetry API only; only setup code imports the SDK.

Checked in a fresh interpreter, because this test process has long since imported the SDK.
"""

from __future__ import annotations

import subprocess
import sys


def _modules_after(statement: str) -> list[str]:
    code = (
        f"{statement}\n"
        "import sys\n"
        "print('\\n'.join(sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return out.stdout.split()


def test_import_gymtrace_does_not_import_the_sdk() -> None:
    assert _modules_after("import gymtrace") == []


def test_public_submodules_do_not_import_the_sdk() -> None:
    assert _modules_after("import gymtrace.testing, gymtrace.propagation") == []


def test_decorated_calls_without_a_provider_do_not_import_the_sdk() -> None:
    statement = (
        "import asyncio, gymtrace\n"
        "@gymtrace.step\n"
        "def f(x): return x\n"
        "@gymtrace.step\n"
        "async def g(x): return x\n"
        "with gymtrace.rollout(rollout_id='r'), gymtrace.episode():\n"
        "    assert f(1) == 1 and asyncio.run(g(2)) == 2\n"
    )
    assert _modules_after(statement) == []
