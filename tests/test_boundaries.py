"""Instrumentation depends on the OpenTelemetry API only; only setup code imports the SDK.

Checked in a fresh interpreter, because this test process has long since imported the SDK.
"""

from __future__ import annotations

import subprocess
import sys


def _modules_after(statement: str, prefix: str = "opentelemetry.sdk") -> list[str]:
    code = (
        f"{statement}\n"
        "import sys\n"
        f"print('\\n'.join(sorted(m for m in sys.modules if m.startswith({prefix!r}))))\n"
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


# Every traced process imports gymtrace (opentelemetry-instrument's configurator does, in each
# server and worker of a NeMo Gym stack): what only tests and the CLI use is not loaded there.
_TEST_ONLY = ("gymtrace.testing", "gymtrace._read.check", "gymtrace._read.render")


def test_a_traced_process_does_not_load_the_testing_helpers_or_the_checker(tmp_path) -> None:
    statement = (
        "import gymtrace\n"
        f"gymtrace.configure(service_name='t', file={str(tmp_path / 'spans.jsonl')!r})\n"
        "with gymtrace.rollout(rollout_id='r'), gymtrace.episode():\n"
        "    gymtrace.record_reward(1.0)\n"
        "gymtrace.shutdown()\n"
    )
    assert [m for m in _modules_after(statement, "gymtrace") if m.startswith(_TEST_ONLY)] == []


def test_gymtrace_testing_is_an_attribute_of_the_package_on_first_use() -> None:
    statement = "import gymtrace\nassert callable(gymtrace.testing.capture_spans)"
    assert _modules_after(statement, "gymtrace.testing") == ["gymtrace.testing"]
    assert _modules_after("from gymtrace import testing", "gymtrace.testing") == ["gymtrace.testing"]
