"""What ``configure()`` set up, shared by the modules that build, flush and stop it.

:class:`Configuration` is what ``configure()`` returns; ``_state`` is this process's one record of
the provider gymtrace created, its export stage and the MeterProvider it set, guarded by one lock.
It sits below the setup, the provider, the processors and the flush so that each reads the same
record without importing the others.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from gymtrace._sdk.stage import ExportStage


@dataclass(frozen=True)
class Configuration:
    """What ``configure()`` set up; returned so callers and tests can see the resolved settings."""

    service_name: str | None = None
    exporters: tuple[str, ...] = ()
    endpoint: str | None = None
    protocol: str | None = None
    file: str | None = None
    owns_provider: bool = False
    disabled: bool = False
    headers: Mapping[str, str] = field(default_factory=dict)


class _State:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.configuration: Configuration | None = None
        self.provider: TracerProvider | None = None  # the provider gymtrace created, if any
        self.stage: ExportStage | None = None
        self.key: tuple[Any, ...] | None = None  # what the current configuration was built from
        # The MeterProvider gymtrace set (OTLP to the spans' endpoint) when the application had none.
        self.meter_provider: Any = None
        # Configured from GYMTRACE_PARENT (a worker of a configured process), not by its own code.
        self.inherited = False


_state = _State()
