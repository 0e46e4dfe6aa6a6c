"""Where gymtrace uses OpenTelemetry's private parts, and whether each use is active here.

Each use of a private OpenTelemetry name is worth something measured (CONTRIBUTING.md lists the
gains) and lives in this package, the fence (``tests/test_otel_fence.py`` fails on any private
OpenTelemetry name, private SDK field or ``__class__`` swap anywhere else in gymtrace), one module
per concern: ``provider`` (the API's global provider), ``spanfields`` (reading an ended span's
fields: the encoders and the identity processor), ``leanspan``/``leanspan_span``/``sdkdigest``
(building gymtrace's own spans), ``records`` (spans to encoder-process records and back),
``otlp_seams`` (the probes of the SDK exporters' transport seams, which the exporters of
``gymtrace._sdk.otlp`` set on themselves as the SDK's subclasses). Each checks by capability, once, whether the names it needs are there (never by version),
binds the public path when they are not, and registers the outcome here.
``tests/test_fast_paths.py`` fails naming what disappeared when a release removes one, so a new
OpenTelemetry release makes gymtrace slower loudly, not silently; ``benchmarks/perf.py`` prints the
table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class FastPath:
    """One use of private OpenTelemetry names: what it is, what it needs, whether it is active."""

    name: str
    module: str
    uses: tuple[str, ...]  # the private names (or layouts) it relies on
    fallback: str  # what runs when they are missing
    missing: tuple[str, ...]  # of ``uses``, what this installation lacks; empty when active

    @property
    def active(self) -> bool:
        return not self.missing


# name -> (module, uses, fallback, probe returning what is missing). Probes run once, on first read.
_REGISTERED: dict[str, tuple[str, tuple[str, ...], str, Callable[[], list[str]]]] = {}
_RESULTS: dict[str, FastPath] = {}


def register(
    name: str, module: str, uses: tuple[str, ...], fallback: str, probe: Callable[[], list[str]]
) -> None:
    """Declare a fast path; ``probe()`` lists what of ``uses`` is missing (it must not raise)."""
    _REGISTERED[name] = (module, uses, fallback, probe)
    _RESULTS.pop(name, None)


def status(name: str) -> FastPath:
    result = _RESULTS.get(name)
    if result is None:
        module, uses, fallback, probe = _REGISTERED[name]
        try:
            missing = tuple(probe())
        except Exception as exc:  # noqa: BLE001 - a probe that breaks means the path is off
            missing = (f"probe failed: {type(exc).__name__}: {exc}",)
        result = _RESULTS[name] = FastPath(name, module, uses, fallback, missing)
    return result


def all_paths() -> list[FastPath]:
    """Every fast path registered by the modules imported so far (see ``_sdk.setup.fast_paths``)."""
    return [status(name) for name in sorted(_REGISTERED)]
