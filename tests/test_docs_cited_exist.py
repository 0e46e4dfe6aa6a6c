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


# -- the modules CONTRIBUTING.md sends a contributor to -------------------------------------------

CONTRIBUTING = ROOT / "CONTRIBUTING.md"
# A path ending in .py inside a code span: `_read/check/spans.py`, `tests/test_check.py`,
# `python benchmarks/perf.py`, `_sdk/export*.py` (a glob: at least one file).
MODULE_PATH = re.compile(r"[\w/.*<>-]+\.py\b")
# A dotted module of the package: `gymtrace._model`, `from gymtrace._otel_private.sdkdigest import`.
DOTTED = re.compile(r"\bgymtrace(?:\.\w+)+")
# Where a bare file name (`httpx.py`, `perf.py`) or a relative one (`_scopes/levels.py`) is looked for.
PLACES = (ROOT, ROOT / "src", ROOT / "src" / "gymtrace", ROOT / "tests", ROOT / "tests" / "support")
TREES = ("src", "tests", "benchmarks", "scripts")


def _code_spans(text: str) -> list[str]:
    """The code blocks, then the inline code spans of the text around them (a span may wrap)."""
    blocks = re.findall(r"^```.*?^```", text, re.M | re.S)
    inline = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    # A span opens with a run of backticks and closes at the next run of as many (CommonMark).
    return blocks + [m.group(2) for m in re.finditer(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", inline, re.S)]


def _path_exists(name: str) -> bool:
    if "<" in name or "NAME" in name:
        return True  # a template: `tests/test_integrations_<library>.py`
    if any(next(place.glob(name), None) is not None for place in PLACES):
        return True
    return "/" not in name and any(next((ROOT / tree).rglob(name), None) is not None for tree in TREES)


def _module_exists(dotted: str) -> bool:
    """``gymtrace.a.b``: a module or package of the source tree, or a name its longest module
    prefix defines or imports (read from the file, not imported: `gymtrace.testing.reset`)."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        base = ROOT / "src" / Path(*parts[:n])
        module = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if module.is_file():
            rest = parts[n:]
            return not rest or re.search(rf"\b{rest[0]}\b", module.read_text(encoding="utf-8")) is not None
    return False


def _named_in_contributing() -> tuple[set[str], set[str]]:
    paths: set[str] = set()
    modules: set[str] = set()
    for span in _code_spans(CONTRIBUTING.read_text(encoding="utf-8")):
        paths.update(MODULE_PATH.findall(span))
        modules.update(DOTTED.findall(span))
    return paths, modules


def test_every_module_contributing_names_exists() -> None:
    paths, modules = _named_in_contributing()
    assert paths and modules  # the patterns still find what the guide names
    missing = sorted(p for p in paths if not _path_exists(p)) + sorted(
        m for m in modules if not _module_exists(m)
    )
    assert missing == [], f"CONTRIBUTING.md names modules that do not exist (moved?): {missing}"
