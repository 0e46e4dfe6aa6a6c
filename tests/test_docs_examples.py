"""Every code example in README.md and docs/ runs as written, by the rule in CONTRIBUTING.md ("Docs").

- A ```python block is a complete program: it runs alone, in a child process with a clean
  environment and an empty temporary directory as its working directory, and exits 0 within
  ``TIMEOUT`` seconds.
- A ```bash block on the line right after ``<!-- docs-test: run -->`` runs under ``bash -eu`` in a
  temporary directory where the README's quickstart has written ``./gymtrace-traces.jsonl``, with
  ``gymtrace`` on the PATH (this interpreter's), and exits 0.
- A ```py block is a fragment (a server, a client that needs a live peer): it must compile, and
  every gymtrace name it mentions must exist (so must every name any page mentions).
- Anything else (```text, a bare fence) is output or pseudo-code.
"""

from __future__ import annotations

import importlib
import os
import re
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from child_process import clean_env, run_gymtrace, run_python

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
RUN_MARK = "<!-- docs-test: run -->"
TIMEOUT = 60


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    marked: bool  # the line before the fence is RUN_MARK

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def _blocks(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        if lines[i].lstrip().startswith("```"):
            # A fence may be indented (inside a list item): its code is, by as much.
            indent = len(lines[i]) - len(lines[i].lstrip())
            lang = lines[i].strip()[3:].strip().split(" ")[0]
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("```"))
            code = "\n".join(line[indent:] for line in lines[i + 1 : end]) + "\n"
            marked = i > 0 and lines[i - 1].strip() == RUN_MARK
            blocks.append(Block(page, i + 1, lang, code, marked))
            i = end
        i += 1
    return blocks


BLOCKS = [block for page in PAGES for block in _blocks(page)]
PYTHON = [b for b in BLOCKS if b.lang == "python"]
BASH_RUN = [b for b in BLOCKS if b.lang == "bash" and b.marked]
FRAGMENTS = [b for b in BLOCKS if b.lang == "py"]
QUICKSTART = next(b for b in PYTHON if b.page == README)


@pytest.mark.parametrize("block", PYTHON, ids=[b.id for b in PYTHON])
def test_python_example_runs(tmp_path: Path, block: Block) -> None:
    out = run_python(code=block.code, cwd=tmp_path, timeout=TIMEOUT)
    assert out.returncode == 0, f"{block.id} failed:\n{out.stderr}"


@pytest.fixture(scope="module")
def quickstart_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A directory where the quickstart ran, and one holding a ``gymtrace`` of this interpreter."""
    cwd = tmp_path_factory.mktemp("quickstart")
    run_python(code=QUICKSTART.code, cwd=cwd, check=True, timeout=TIMEOUT)
    bin_dir = tmp_path_factory.mktemp("bin")
    command = bin_dir / "gymtrace"
    command.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m gymtrace "$@"\n')
    command.chmod(command.stat().st_mode | stat.S_IXUSR)
    return cwd, bin_dir


@pytest.mark.parametrize("block", BASH_RUN, ids=[b.id for b in BASH_RUN])
def test_marked_bash_example_runs(quickstart_dir: tuple[Path, Path], block: Block) -> None:
    cwd, bin_dir = quickstart_dir
    env = clean_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    out = subprocess.run(
        ["bash", "-euc", block.code],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert out.returncode == 0, f"{block.id} failed:\n{out.stdout}\n{out.stderr}"


def test_there_are_marked_bash_examples_to_run() -> None:
    # A typo in the mark would silently run nothing.
    assert BASH_RUN
    assert all(b.lang == "bash" for b in BLOCKS if b.marked)


@pytest.mark.parametrize("block", FRAGMENTS, ids=[b.id for b in FRAGMENTS])
def test_python_fragment_compiles(block: Block) -> None:
    compile(block.code, block.id, "exec")


def test_readme_main_example_traces_what_it_says(tmp_path: Path) -> None:
    run_python(code=QUICKSTART.code, cwd=tmp_path, check=True)
    tree = run_gymtrace("tree", "gymtrace-traces.jsonl", "--run", "run-1", cwd=tmp_path, check=True).stdout
    assert tree.count("gym.rollout [rollout]") == 2
    assert "outcome=scored" in tree and "reward=1" in tree


def test_readme_starts_with_the_demo_and_test_commands() -> None:
    first_block = re.search(r"```bash\n(.*?)```", README.read_text(), flags=re.DOTALL)
    assert first_block is not None
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert commands == ["scripts/demo", "scripts/test"]
    assert "exec scripts/test" in (ROOT / ".ci" / "run").read_text()


def test_readme_is_what_a_newcomer_finishes() -> None:
    # Issue 27: what a newcomer needs, under 250 lines; the rest is in docs/.
    assert len(README.read_text().splitlines()) < 250


def test_every_relative_link_of_the_readme_resolves() -> None:
    # The site's strict build checks the links between docs/ pages; the README is read on GitHub.
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", README.read_text()):
        assert (ROOT / target).exists(), target


def test_every_gymtrace_name_the_docs_mention_exists() -> None:
    text = "\n".join(path.read_text() for path in PAGES)
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
