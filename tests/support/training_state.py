"""The training state a process keeps between rollouts (its policy version, the consumed records
waiting for their writer), cleared around each test of a module that imports the fixture::

    from training_state import no_policy_version  # noqa: F401 - an autouse fixture
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gymtrace._scopes import consumed as _consumed
from gymtrace._scopes import training as _training


@pytest.fixture(autouse=True)
def no_policy_version() -> Iterator[None]:
    _training.set_policy_version(None)
    _consumed.forget()
    yield
    _training.set_policy_version(None)
    _consumed.forget()
