"""Serve any ASGI app in its own process for the tests and benchmarks, the way the demo serves its
services: ``python serve_app.py --app module:factory [--service NAME] [--official] [--no-gymtrace]``.

Prints ``GYMTRACE-PORT <port>`` once it listens (what ``ServiceProcess`` waits for). ``module`` is
imported from ``PYTHONPATH`` (tests/support for ``_relay_app``); ``--no-gymtrace`` leaves gymtrace's
middleware out, so a benchmark can measure its share of a request.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from gymtrace.demo.services import READY_PREFIX, serve

PATH = str(Path(__file__).resolve())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="serve_app.py")
    parser.add_argument("--app", required=True, help="module:factory of the ASGI app")
    parser.add_argument("--service", default=None, help="service.name; configure() is skipped when absent")
    parser.add_argument("--official", action="store_true", help="add the official OpenTelemetry middleware")
    parser.add_argument("--no-gymtrace", action="store_true", help="serve without gymtrace's middleware")
    args = parser.parse_args(argv)
    module, _, factory = str(args.app).partition(":")
    app = getattr(importlib.import_module(module), factory)()
    return serve(
        app,
        service_name=args.service,
        on_ready=lambda port: print(f"{READY_PREFIX}{port}", flush=True),
        official=args.official,
        middleware=not args.no_gymtrace,
        instrument=args.official,
    )


if __name__ == "__main__":
    sys.exit(main())
