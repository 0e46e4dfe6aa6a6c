"""A griffe extension: gymtrace's reStructuredText docstrings, read as the Markdown the site renders.

gymtrace's docstrings are written for ``help()`` and Sphinx habits (``:func:`name```, ``Example::``
before an indented block). mkdocstrings renders docstrings as Markdown, where a role would show as
literal ``:func:`` text and ``::`` as two colons; this rewrites the two forms the source uses, and
nothing else, when the site is built (mkdocs.yml loads it; the source is not changed).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

# :func:`name`, :meth:`~gymtrace.Scope.carrier`, :class:`text <target>` -> `name`, `carrier`, `text`
_ROLE = re.compile(r":(?:py:)?[a-z]+:`(?:~[\w.]*?\.)?([^`<]+?)(?:\s*<[^>]+>)?`")
# A paragraph ending in "::" introduces a literal block (the indented lines after a blank line,
# which Markdown already reads as code): keep one colon.
_LITERAL = re.compile(r"(\S)::$", re.MULTILINE)


def rest_to_markdown(text: str) -> str:
    return _LITERAL.sub(r"\1:", _ROLE.sub(r"`\1`", text))


class RestDocstrings(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rest_to_markdown(obj.docstring.value)
