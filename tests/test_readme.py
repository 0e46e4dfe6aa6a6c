"""The README's Python examples run as written, and its first commands are the real scripts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from child_process import run_gymtrace, run_python

README = Path(__file__).parent.parent / "README.md"
DOCS = sorted((README.parent / "docs").glob("*.md"))
# ```python blocks are complete programs and are run; ```py blocks are fragments (a server, a
# client) whose gymtrace names are checked by test_every_gymtrace_name_the_readme_mentions_exists.
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
DOC_BLOCKS = [
    (doc.name, block)
    for doc in DOCS
    for block in re.findall(r"```python\n(.*?)```", doc.read_text(), flags=re.DOTALL)
]


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_python_example_runs(tmp_path: Path, code: str) -> None:
    out = run_python(code=code, cwd=tmp_path)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize(
    ("doc", "code"), DOC_BLOCKS, ids=[f"{doc}-{i}" for i, (doc, _) in enumerate(DOC_BLOCKS)]
)
def test_docs_python_example_runs(tmp_path: Path, doc: str, code: str) -> None:
    test_readme_python_example_runs(tmp_path, code)


def test_readme_main_example_traces_what_it_says(tmp_path: Path) -> None:
    run_python(code=BLOCKS[0], cwd=tmp_path, check=True)
    tree = run_gymtrace("tree", "gymtrace-traces.jsonl", "--run", "run-1", cwd=tmp_path, check=True).stdout
    assert tree.count("gym.rollout [rollout]") == 2
    assert "outcome=scored" in tree and "reward=1" in tree


def test_readme_starts_with_the_demo_and_test_commands() -> None:
    first_block = re.search(r"```bash\n(.*?)```", README.read_text(), flags=re.DOTALL)
    assert first_block is not None
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert commands == ["scripts/demo", "scripts/test"]
    assert "exec scripts/test" in (README.parent / ".ci" / "run").read_text()


def test_every_gymtrace_name_the_readme_mentions_exists() -> None:
    import importlib

    text = "\n".join(path.read_text() for path in [README, *DOCS])
    for module, names in re.findall(r"from (gymtrace[\w.]*) import ([\w, ]+)", text):
        imported = importlib.import_module(module)
        for name in names.split(","):
            assert hasattr(imported, name.strip()), f"{module}.{name.strip()}"
    for dotted in set(re.findall(r"\bgymtrace(?:\.[A-Za-z_]\w*)+", text)):
        parts = dotted.split(".")
        obj: object = importlib.import_module("gymtrace")
        for i, part in enumerate(parts[1:], start=1):
            if not hasattr(obj, part):
                try:
                    obj = importlib.import_module(".".join(parts[: i + 1]))
                    continue
                except ImportError:
                    pass
            assert hasattr(obj, part), dotted
            obj = getattr(obj, part)
