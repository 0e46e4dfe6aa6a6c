"""The docs' ``gymtrace tree`` excerpts of the integrations are written by their tests.

Each excerpt sits between ``<!-- tree:NAME -->`` and ``<!-- /tree:NAME -->`` in one page of docs/
(or README.md). A test
renders the trace it just produced, normalised (durations, IDs that change every run), and compares;
``GYMTRACE_WRITE_README=1`` rewrites the block instead, so the excerpt can never go stale.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gymtrace._model.spandata import normalize
from gymtrace._read.render import render_tree

ROOT = Path(__file__).parent.parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_DURATION = re.compile(r" \d+(?:\.\d+)?(?:ms|s)\b")
_HEX = re.compile(r"\b[0-9a-f]{16}(?:[0-9a-f]{16})?\b")


def excerpt(spans: Iterable[Any], replace: Iterable[tuple[str, str]] = ()) -> str:
    text = render_tree(normalize(spans))
    text = _DURATION.sub("", text)
    text = _HEX.sub("…", text)
    for old, new in replace:
        text = text.replace(old, new)
    return text.rstrip("\n") + "\n"


def check_readme_tree(name: str, text: str) -> None:
    start, end = f"<!-- tree:{name} -->\n```\n", f"```\n<!-- /tree:{name} -->"
    page = next((p for p in PAGES if start in p.read_text()), None)
    assert page is not None, f"no page of README.md or docs/ has the block {start.strip()!r}"
    before, rest = page.read_text().split(start, 1)
    current, after = rest.split(end, 1)
    if os.environ.get("GYMTRACE_WRITE_README"):
        page.write_text(before + start + text + end + after)
        return
    assert current == text, (
        f"{page.relative_to(ROOT)}'s {name} tree is stale; regenerate with GYMTRACE_WRITE_README=1 pytest {name}\n"
        f"--- {page.name}\n{current}--- now\n{text}"
    )
