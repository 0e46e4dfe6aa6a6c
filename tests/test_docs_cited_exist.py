"""Every Markdown document the source names exists in the repository (issue 33).

Docstrings and comments send a contributor to a document ("see docs/outcomes.md"); one who clones
the repository must be able to open it. Design documents kept outside the repository were cited
this way for a long time: what the code relies on from them is now under ``docs/contract/``.
A name resolves against the repository root and against ``docs/`` ("CONTRIBUTING.md",
"docs/outcomes.md" and "outcomes.md" all work).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"

CITED = re.compile(r"\b[\w/.-]+\.md\b")

# Documents of other repositories, named as their authors name them (not ours to hold).
EXTERNAL = {
    # The OpenTelemetry specification's environment-variable carriers (propagation.py).
    "context/env-carriers.md": "open-telemetry/opentelemetry-specification",
}


def _exists(name: str) -> bool:
    name = name.lstrip("./")
    return (ROOT / name).is_file() or (ROOT / "docs" / name).is_file()


def _citations() -> dict[str, set[str]]:
    """Every ``*.md`` name each source file mentions, by path relative to the repository."""
    found: dict[str, set[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        names = set(CITED.findall(path.read_text(encoding="utf-8")))
        if names:
            found[path.relative_to(ROOT).as_posix()] = names
    return found


def test_every_document_the_source_names_is_in_the_repository() -> None:
    missing = [
        f"{path}: {name}"
        for path, names in _citations().items()
        for name in sorted(names)
        if name not in EXTERNAL and not _exists(name)
    ]
    assert missing == [], (
        "source files name documents that are not in the repository (write the fact in the"
        " docstring, or cite the docs/ page that holds it, e.g. docs/contract/fixed-names.md):\n"
        + "\n".join(missing)
    )


def test_the_contract_pages_exist() -> None:
    # What the source cites in place of the design documents.
    for page in ("spans", "outcome-rule", "wire-format", "fixed-names"):
        assert (ROOT / "docs" / "contract" / f"{page}.md").is_file(), page
