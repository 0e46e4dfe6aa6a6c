"""The import paths the integrations had before they moved to gymtrace.integrations keep working for
one release, with a DeprecationWarning that names the new path, and give the very same objects."""

from __future__ import annotations

import importlib
import sys

import pytest

from child_process import run_python
from gymtrace.integrations import aiohttp, asgi, httpx


def _fresh_import(name: str):
    sys.modules.pop(name, None)  # the warning is raised when the module is imported
    return importlib.import_module(name)


def test_gymtrace_asgi_warns_and_is_the_moved_middleware():
    with pytest.warns(DeprecationWarning, match="gymtrace.integrations.asgi"):
        old = _fresh_import("gymtrace.asgi")
    assert old.GymTraceMiddleware is asgi.GymTraceMiddleware


def test_gymtrace_http_warns_and_gives_the_moved_helpers():
    with pytest.warns(DeprecationWarning, match="gymtrace.integrations.httpx"):
        old = _fresh_import("gymtrace.http")
    assert old.HttpxTransport is httpx.HttpxTransport
    assert old.AsyncHttpxTransport is httpx.AsyncHttpxTransport
    assert old.aiohttp_trace_config is aiohttp.aiohttp_trace_config
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        _ = old.nothing


def test_importing_the_integrations_package_imports_no_integration():
    code = "import sys, gymtrace.integrations; print(sorted(m for m in sys.modules if m.startswith('gymtrace.integrations.')))"
    out = run_python(code=code, check=True)
    assert out.stdout.strip() == "[]"
