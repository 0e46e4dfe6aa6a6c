"""The layout in CONTRIBUTING.md holds: imports point one way, and the core imports at module level.

Read from the source (``ast``), so the test needs no optional dependency and sees imports that a
fresh interpreter would only run later, inside functions.
"""

from __future__ import annotations

import ast
import fnmatch
import functools
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "gymtrace"

# Lowest first. A module may import modules of its own layer or of lower layers, never higher; the
# whole graph must also be free of cycles. Patterns match dotted names below ``gymtrace``.
LAYERS: list[tuple[str, list[str]]] = [
    (
        "constants",
        [
            "_version",
            "_constants",
            # The sub-packages' own __init__ modules import nothing.
            "_model",
            "_scopes",
            "_identity",
            "_read",
            "_sdk",
            "_import",
            "_model.environment",
            "_model.exceptions",
            "_model.numbers",
            "_otel_private",
            "_otel_private.fastpaths",
            "attributes",
        ],
    ),
    ("settings and errors", ["_model.env_reading", "_model.settings", "_model.errors", "_model.forks"]),
    (
        "values",
        [
            "_model.ids",
            "_model.anyvalue",
            "_model.failures",
            "_model.outcome_rule",
            "_model.spandata",
            "_model.tracefiles",
            "_scopes.tracing",
            # The fence's parts that the engine and the identity processor read through.
            "_otel_private.provider",
            "_otel_private.spanfields",
            "_identity.trust",
            "_scopes.scope_carrier",
            "_scopes.state",
            "_scopes.training",
            "_content",
            "_content.*",
            "_scopes.metrics",
        ],
    ),
    (
        "levels",
        [
            "_scopes.outcome_spans",
            "_scopes.active_scope",
            "_scopes.live",
            "_scopes.level_spans",
            "_scopes.levels",
            "_scopes.steps",
            "_scopes.consumed",
        ],
    ),
    ("engine", ["_scopes.open_scopes", "_scopes.blocks", "_scopes.decorate", "_scopes.scope"]),
    (
        "public API",
        [
            "_scopes.record",
            "_scopes.api",
            "_scopes.attempts",
            "propagation",
            "_identity.carriers",
            "_identity.processor",
            "sampling",
            "instrumentation",
        ],
    ),
    ("setup and readers", ["_read.*", "_sdk.*", "_otel_private.*"]),
    ("package", ["testing", "__init__"]),
    (
        "integrations and CLI",
        [
            "integrations",
            "integrations.*",
            "demo",
            "demo.*",
            "http",
            "asgi",
            "_import.*",
            "_cli",
            "_cli.*",
            "__main__",
        ],
    ),
]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def _layer(name: str) -> int:
    for index, (_, patterns) in enumerate(LAYERS):
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns):
            return index
    raise AssertionError(f"gymtrace.{name} is in no layer: add it to LAYERS here and to CONTRIBUTING.md")


@functools.cache  # parsed once: every test reads the same source, and parsing it all took ~1.5 s
def _modules() -> dict[str, ast.Module]:
    return {_module_name(p): ast.parse(p.read_text(encoding="utf-8")) for p in sorted(SRC.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.Module, *, module_level: bool) -> Iterator[tuple[str, int]]:
    """(imported gymtrace module, line) at module level (outside ``if TYPE_CHECKING``) or inside
    functions."""

    def gymtrace_names(node: ast.AST) -> Iterator[str]:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "gymtrace" or alias.name.startswith("gymtrace."):
                    yield alias.name.removeprefix("gymtrace").lstrip(".") or "__init__"
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "gymtrace":
                for alias in node.names:  # `from gymtrace import _constants as c`
                    yield (
                        alias.name
                        if (SRC / f"{alias.name}.py").exists() or (SRC / alias.name).is_dir()
                        else "__init__"
                    )
            elif node.module.startswith("gymtrace."):
                module = node.module.removeprefix("gymtrace.")
                folder = SRC.joinpath(*module.split("."))
                for alias in node.names:  # `from gymtrace._scopes import frame as _frame`
                    yield (
                        f"{module}.{alias.name}"
                        if (folder / f"{alias.name}.py").exists() or (folder / alias.name).is_dir()
                        else module
                    )

    def walk(node: ast.AST, in_function: bool) -> Iterator[tuple[str, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                continue
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, (ast.Import, ast.ImportFrom)) and in_function != module_level:
                for name in gymtrace_names(child):
                    yield name, child.lineno
            yield from walk(child, nested)

    yield from walk(tree, False)


def _imports_the_sdk(tree: ast.Module | None) -> bool:
    return tree is not None and any(
        isinstance(node, ast.ImportFrom)
        and (node.module or "").startswith(("opentelemetry.sdk", "opentelemetry.exporter"))
        for node in tree.body
    )


def test_every_module_has_a_layer() -> None:
    for name in _modules():
        _layer(name)


def test_imports_point_down_the_layers() -> None:
    wrong = []
    for name, tree in _modules().items():
        for imported, line in _imports(tree, module_level=True):
            if _layer(imported) > _layer(name):
                wrong.append(
                    f"gymtrace.{name}:{line} imports gymtrace.{imported}"
                    f" ({LAYERS[_layer(name)][0]} -> {LAYERS[_layer(imported)][0]})"
                )
    assert wrong == []


def test_only_the_fork_registry_registers_with_the_os() -> None:
    # One place says what a forked child redoes, in one order; an integration is written as a user
    # would write it (no private module), so it registers its own.
    calls = [
        f"gymtrace.{name}:{node.lineno}"
        for name, tree in _modules().items()
        if name != "_model.forks" and not name.startswith("integrations")
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr == "register_at_fork"
    ]
    assert calls == [], "register with gymtrace._model.forks.in_child instead"


def test_there_is_no_import_cycle() -> None:
    graph = {
        name: {imported for imported, _ in _imports(tree, module_level=True) if imported != name}
        for name, tree in _modules().items()
    }
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            cycle = [*path[path.index(name) :], name]
            pytest.fail("import cycle: " + " -> ".join(cycle))
        state[name] = 1
        for imported in sorted(graph.get(name, ())):
            visit(imported, [*path, name])
        state[name] = 2

    for name in sorted(graph):
        visit(name, [])


# Imported inside a function on purpose, below the top layer: what a traced process needs only for
# a feature it may never use, so that every process opentelemetry-instrument starts does not pay it
# (docs/performance.md). Each is listed with what it waits for, must point down the layers or stay
# within its own, and must not be imported first at exit: an import in an exit handler after Ctrl-C
# turned the process's status from 130 into 1 (tests/test_process_endings.py caught it with the
# readers' outcome module deferred to a rollout's metrics; the rule they apply now sits beside it,
# in _model.outcome_rule, so a traced process needs no readers at all).
_DEFERRED = {
    ("_sdk.processors", "_sdk.backends"): "GYMTRACE_BACKEND=mlflow or phoenix",
}


def test_the_core_imports_gymtrace_modules_at_module_level() -> None:
    # A function-level import of gymtrace's own modules hides a cycle or a wrong direction. The top
    # layer (integrations, demo, CLI) may import lazily: it pulls in optional libraries.
    # Modules that import the OpenTelemetry SDK at module level are the exception: the API-only
    # install must be able to import everything else; so are the imports _DEFERRED names.
    top = len(LAYERS) - 1
    modules = _modules()
    late = [
        f"gymtrace.{name}:{line} imports gymtrace.{imported} inside a function"
        for name, tree in modules.items()
        if _layer(name) < top
        for imported, line in _imports(tree, module_level=False)
        if not _imports_the_sdk(modules.get(imported)) and (name, imported) not in _DEFERRED
    ]
    assert late == []


def test_a_deferred_import_is_where_it_is_listed_and_points_down_the_layers() -> None:
    modules = _modules()
    for (name, imported), why in _DEFERRED.items():
        found = {module for module, _ in _imports(modules[name], module_level=False)}
        assert imported in found, f"gymtrace.{name} no longer defers gymtrace.{imported} ({why}): drop it"
        assert _layer(imported) <= _layer(name), f"gymtrace.{name} defers gymtrace.{imported}, a layer up"
        # Nor does what it defers import it back, at module level: a cycle the cycle test cannot see.
        back = {module for module, _ in _imports(modules[imported], module_level=True)}
        assert name not in back, f"gymtrace.{imported} imports gymtrace.{name}: a cycle through ({why})"


# -- integrations are written the way a user could write them ------------------------------------------

_INTEGRATIONS = sorted(name for name in _modules() if name.startswith("integrations."))


def _private_uses(tree: ast.Module) -> list[str]:
    """Private gymtrace modules imported (anywhere in the module), and private names read off
    gymtrace modules (``sampling._something``, ``asgi._helper``)."""
    found = [
        f"line {line}: imports gymtrace.{imported}"
        for module_level in (True, False)
        for imported, line in _imports(tree, module_level=module_level)
        if imported != "__init__" and any(part.startswith("_") for part in imported.split("."))
    ]
    bound: set[str] = set()  # names bound to gymtrace modules or their members
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bound.update(
                (a.asname or a.name).split(".")[0] for a in node.names if a.name.startswith("gymtrace")
            )
        elif (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gymtrace")) or (
            isinstance(node, ast.ImportFrom) and node.level > 0
        ):
            bound.update(a.asname or a.name for a in node.names)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and isinstance(node.value, ast.Name)
            and node.value.id in bound
        ):
            found.append(f"line {node.lineno}: reads {node.value.id}.{node.attr}")
    return found


@pytest.mark.parametrize("name", _INTEGRATIONS)
def test_an_integration_uses_only_the_public_api_and_the_seam(name: str) -> None:
    # CONTRIBUTING: an integration imports the public API and gymtrace.instrumentation, nothing
    # private, so the core can change behind it.
    assert _private_uses(_modules()[name]) == []


def _self_logging(tree: ast.Module) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name == "logging" for a in node.names):
            found.append(f"line {node.lineno}: imports logging")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr
            in ("debug", "info", "warning", "warn", "error", "exception", "critical", "log")
            and isinstance(node.func.value, ast.Name)
            and "log" in node.func.value.id.lower()
        ):
            found.append(f"line {node.lineno}: {node.func.value.id}.{node.func.attr}(...)")
    return found


@pytest.mark.parametrize("name", _INTEGRATIONS)
def test_an_integration_reports_through_the_guard_and_never_logs_itself(name: str) -> None:
    # A failure an integration logs itself is invisible to strict mode and to the tests; through
    # gymtrace.instrumentation (report_error, guard, warn_once, warn) it is loud where someone watches.
    assert _self_logging(_modules()[name]) == []


def test_the_architecture_checks_see_a_private_import_and_self_logging() -> None:
    # The two checks above must be able to fail.
    tree = ast.parse(
        "import logging\nfrom gymtrace._scopes import frame\nfrom gymtrace import sampling\n"
        "logger = logging.getLogger('gymtrace')\nlogger.warning('x')\nsampling._decided(1)\n"
    )
    assert len(_private_uses(tree)) == 2
    assert len(_self_logging(tree)) == 2
