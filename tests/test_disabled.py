"""With no SDK configured (or OTEL_SDK_DISABLED=true) decorated calls behave exactly as undecorated."""

from __future__ import annotations

import pytest

from child_process import run_python

CODE = """
import asyncio, os, gymtrace
if os.environ.get("WITH_SDK"):
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    trace.set_tracer_provider(TracerProvider())

class Oops(Exception): pass

@gymtrace.step
def f(x): return [x]
@gymtrace.model_call(model="m")
async def g(x): return {"x": x}
@gymtrace.tool_call
def gen(n):
    got = yield 0
    yield got
@gymtrace.episode
async def agen(n):
    for i in range(n): yield i
@gymtrace.rollout(rollout_id=lambda: "never-called")
def boom(): raise Oops("x")

with gymtrace.episode():
    assert gymtrace.current_scope() is None  # tracing is off: gymtrace opens no scope
value = [1]
assert f(value) == [[1]] and f(value)[0] is value
assert asyncio.run(g(2)) == {"x": 2}
it = gen(1); assert next(it) == 0; assert it.send("s") == "s"
async def collect(): return [i async for i in agen(3)]
assert asyncio.run(collect()) == [0, 1, 2]
try:
    boom()
except Oops as e:
    assert str(e) == "x"
with gymtrace.episode() as scope:
    gymtrace.record_reward(1.0)
    scope.record_usage(input_tokens=1)
    assert gymtrace.current().rollout_id is None
print("ok")
"""


@pytest.mark.parametrize(
    "env", [{}, {"WITH_SDK": "1", "OTEL_SDK_DISABLED": "true"}], ids=["no-sdk-configured", "sdk-disabled"]
)
def test_disabled_tracing_returns_and_raises_exactly_like_the_function(env: dict[str, str]) -> None:

    out = run_python(code=CODE, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
