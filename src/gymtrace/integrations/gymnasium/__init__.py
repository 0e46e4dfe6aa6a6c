"""Trace Gymnasium environments: ``TraceEnv(env)`` turns episodes into gym rollouts."""

from gymtrace.integrations.gymnasium.env import *  # noqa: F403 - the move-only step
from gymtrace.integrations.gymnasium.env import POLICIES, __all__  # noqa: F401
