"""Every span name, attribute name and value gymtrace writes, for code that reads or writes them.

Example::

    from gymtrace import attributes

    span.set_attribute(attributes.ROLLOUT_ID, "r-1")          # "gym.rollout.id"
    if span.attributes.get(attributes.KIND) == attributes.KIND_EPISODE:
        ...

The ``gym.*`` names are gymtrace's public contract and change only with a major version; the
``gen_ai.*`` names follow the OpenTelemetry GenAI semantic conventions, which are experimental and
move with them. This module re-exports them from the one module that spells them, so an
integration (gymtrace's own or yours) never spells a name itself.
"""

from __future__ import annotations

from gymtrace import _constants
from gymtrace._constants import *  # noqa: F403 - the whole table of names is the surface

__all__ = sorted(name for name in vars(_constants) if name.isupper())
