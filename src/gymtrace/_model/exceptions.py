"""gymtrace's exception classes, at the bottom of the import graph.

They sit apart from the error policy in ``_model.errors`` so that the settings object, which the error
policy reads, can raise :class:`InvalidArgumentError` for a bad environment value in strict mode.
"""

from __future__ import annotations


class GymTraceError(Exception):
    """Base class of the exceptions gymtrace raises (only in strict mode)."""


class HierarchyViolationError(GymTraceError):
    """A gym level was opened inside a level it belongs above (an episode inside a step, ...)."""


class InvalidArgumentError(GymTraceError, ValueError):
    """An identity or outcome argument has the wrong type or value; the message names it."""
