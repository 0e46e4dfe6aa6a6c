"""NeMo Gym: its stack traced with no code, and its wire identity for code you own."""

from gymtrace.integrations.nemo_gym.server import *  # noqa: F403 - the move-only step
from gymtrace.integrations.nemo_gym.server import (  # noqa: F401 - read by the wire tests
    __all__,
    _function_calls,
    _record_server_error,
    _usage_attributes,
)
