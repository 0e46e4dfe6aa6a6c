"""The ``gymtrace`` command (moved here; split by subcommand in the next step)."""

from gymtrace._cli.parser import main

__all__ = ["main"]
