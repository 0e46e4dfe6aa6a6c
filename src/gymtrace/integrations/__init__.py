"""Integrations with other libraries, each an optional extra: ``gymtrace.integrations.<library>``."""
