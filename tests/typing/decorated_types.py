"""Checked by mypy in tests/test_signatures.py: decorated callables keep their exact types."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator

# typing.assert_type is new in Python 3.11; the version matrix runs this check on 3.10 too.
if sys.version_info >= (3, 11):
    from typing import assert_type
else:
    from typing_extensions import assert_type

import gymtrace


@gymtrace.step
def plain(x: int, *, label: str = "a") -> list[str]:
    return [label] * x


@gymtrace.rollout(rollout_id=lambda row: row["id"])
async def rollout(row: dict[str, str]) -> float:
    return 1.0


@gymtrace.tool_call
def numbers(n: int) -> Iterator[int]:
    yield from range(n)


@gymtrace.turn(number=1)
async def stream(n: int) -> AsyncIterator[str]:
    for i in range(n):
        yield str(i)


class Agent:
    @gymtrace.agent_invocation(agent_name="a")
    def act(self, obs: str) -> str:
        return obs


assert_type(plain(2, label="b"), list[str])
assert_type(numbers(3), Iterator[int])
assert_type(stream(2), AsyncIterator[str])
assert_type(Agent().act("o"), str)


async def use() -> None:
    assert_type(await rollout({"id": "r"}), float)


with gymtrace.episode() as scope:
    assert_type(scope, gymtrace.ActiveScope)
