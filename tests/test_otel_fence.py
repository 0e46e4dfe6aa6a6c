"""Private OpenTelemetry is used only behind the fence, ``gymtrace._otel_private``.

Every import of a private OpenTelemetry name, every read or write of a private field of an SDK or
API object, and every ``__class__`` swap lives in ``src/gymtrace/_otel_private/`` with its
capability probe and public fallback (``fastpaths`` registers each). Read from the source
(``ast``), like tests/test_architecture.py. The private field names are not a hand-kept list: they
are collected from the installed SDK and API (``__slots__`` and the ``self._x`` assignments of
their classes), so a field a release adds is fenced too.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap
from functools import cache
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "gymtrace"
FENCE = SRC / "_otel_private"

# The OpenTelemetry modules whose objects gymtrace handles: spans, tracers, providers, processors,
# exporters' base classes, attributes, resources, contexts.
OTEL_MODULES = (
    "opentelemetry.trace",
    "opentelemetry.trace.span",
    "opentelemetry.trace.status",
    "opentelemetry.trace.propagation",
    "opentelemetry.context",
    "opentelemetry.context.contextvars_context",
    "opentelemetry.attributes",
    "opentelemetry.sdk.trace",
    "opentelemetry.sdk.trace.export",
    "opentelemetry.sdk.trace.sampling",
    "opentelemetry.sdk.trace.id_generator",
    "opentelemetry.sdk.resources",
    "opentelemetry.sdk.util",
    "opentelemetry.sdk.util.instrumentation",
)
# The OTLP exporters gymtrace's own subclass (their transport seams are private). Their field names
# are generic (``_client``, ``_timeout``: an OpenAI client and a gym scope have them too), so they
# count only in a module that imports an OpenTelemetry exporter.
EXPORTER_MODULES = (
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
)


# Receivers that are gymtrace's own objects although their fields share a name with an SDK private
# one (``_lock``, ``_done``): gymtrace's attempts loop, its exporters, its span-processor stage.
# Matched by the expression's text (the files may move); each must still occur somewhere.
GYMTRACE_OWN = {
    "loop._done": "gymtrace's attempts loop (_scopes.attempts)",
    "exporter._lock": "gymtrace's AutoExporter (_sdk.export_auto), given a new lock after a fork",
    "_state.stage._lock": "gymtrace's span-processor stage (_sdk.setup), after a fork",
}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


@cache
def otel_private_names(modules: tuple[str, ...] = OTEL_MODULES) -> frozenset[str]:
    """Private attribute names of the installed SDK's and API's classes: their ``__slots__``, the
    ``self._x``/``cls._x`` they assign and the private methods they define."""
    names: set[str] = set()
    for module_name in modules:
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # an exporter not installed here: nothing of it to fence
            continue
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__.startswith("opentelemetry"):
                names |= class_private_names(cls)
    return frozenset(names)


@cache
def class_private_names(cls: type) -> frozenset[str]:
    """The private fields and methods one OpenTelemetry class and its OpenTelemetry bases have."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if not klass.__module__.startswith("opentelemetry"):
            continue
        slots = vars(klass).get("__slots__", ())
        names.update(s for s in ([slots] if isinstance(slots, str) else slots) if _private(s))
        names.update(n for n in vars(klass) if _private(n) and callable(vars(klass)[n]))
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")
                and _private(node.attr)
            ):
                names.add(node.attr)
    return frozenset(names)


class _Checker(ast.NodeVisitor):
    """Collects the private OpenTelemetry uses of one module (outside the fence)."""

    def __init__(self, private_names: frozenset[str]) -> None:
        self.private_names = private_names
        self.found: list[tuple[int, str]] = []
        self.otel_aliases: set[str] = set()  # local names bound to opentelemetry modules
        self.otel_names: dict[str, tuple[str, str]] = {}  # local name -> (module, name) imported
        self.gymtrace_aliases: set[str] = set()  # local names bound to gymtrace's own modules
        self.allowed: set[str] = set()  # GYMTRACE_OWN expressions seen
        self.classes: list[ast.ClassDef] = []

    def _add(self, node: ast.AST, what: str) -> None:
        self.found.append((getattr(node, "lineno", 0), what))

    # (1) private names imported from opentelemetry, or read off an opentelemetry module
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name.split(".")[0] == "gymtrace":
                self.gymtrace_aliases.add(alias.asname or "gymtrace")
            if alias.name.split(".")[0] == "opentelemetry":
                if any(_private(part) for part in alias.name.split(".")):
                    self._add(node, f"import {alias.name}")
                self.otel_aliases.add(alias.asname or alias.name.split(".")[0])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level == 0 and module.split(".")[0] == "gymtrace":
            self.gymtrace_aliases.update(alias.asname or alias.name for alias in node.names)
        if node.level == 0 and module.split(".")[0] == "opentelemetry":
            if any(_private(part) for part in module.split(".")):
                self._add(node, f"from {module} import ...")
            for alias in node.names:
                if _private(alias.name):
                    self._add(node, f"from {module} import {alias.name}")
                else:
                    self.otel_aliases.add(alias.asname or alias.name)
                    self.otel_names[alias.asname or alias.name] = (module, alias.name)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.classes.append(node)
        self.generic_visit(node)
        self.classes.pop()

    # (2) obj._name for a private field name of OpenTelemetry's objects; (1) module._name
    def visit_Attribute(self, node: ast.Attribute) -> None:
        receiver = node.value
        if _private(node.attr):
            if isinstance(receiver, ast.Name) and receiver.id in self.otel_aliases:
                self._add(node, f"{receiver.id}.{node.attr}")
            elif node.attr in self.private_names and not self._own(receiver, node.attr):
                if ast.unparse(node) in GYMTRACE_OWN:
                    self.allowed.add(ast.unparse(node))
                    return
                self._add(
                    node, f"{ast.unparse(node)} ({'write' if isinstance(node.ctx, ast.Store) else 'read'})"
                )
        self.generic_visit(node)

    def _own(self, receiver: ast.expr, attr: str) -> bool:
        # `self._x` / `cls._x` inside a class gymtrace defines is gymtrace's own field, and so is a
        # field of one of gymtrace's own modules (`_settings._lock`).
        # A class that subclasses one of OpenTelemetry's inherits its private fields: there `self._x`
        # is the SDK's field, not gymtrace's.
        if not isinstance(receiver, ast.Name):
            return False
        if receiver.id in ("self", "cls"):
            return bool(self.classes) and attr not in self._inherited(self.classes[-1])
        return receiver.id in self.gymtrace_aliases

    def _inherited(self, node: ast.ClassDef) -> frozenset[str]:
        """The private names a class gymtrace defines inherits from OpenTelemetry base classes."""
        names: frozenset[str] = frozenset()
        for base in node.bases:
            if isinstance(base, ast.Name) and base.id in self.otel_names:
                module, name = self.otel_names[base.id]
                try:
                    cls = getattr(importlib.import_module(module), name)
                except (ImportError, AttributeError):
                    continue
                if isinstance(cls, type):
                    names |= class_private_names(cls)
        return names

    # (3) getattr/setattr/hasattr/delattr(x, "_name") with such a literal
    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if (
            isinstance(func, ast.Name)
            and func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _private(node.args[1].value)
            and (
                node.args[1].value in self.private_names
                or (isinstance(node.args[0], ast.Name) and node.args[0].id in self.otel_aliases)
            )
            and not self._own(node.args[0], node.args[1].value)
        ):
            self._add(node, f"{func.id}({ast.unparse(node.args[0])}, {node.args[1].value!r})")
        self.generic_visit(node)

    # (4) any assignment to .__class__
    def _targets(self, targets: list[ast.expr], node: ast.AST) -> None:
        for target in targets:
            for sub in ast.walk(target):
                if (
                    isinstance(sub, ast.Attribute)
                    and sub.attr == "__class__"
                    and isinstance(sub.ctx, ast.Store)
                ):
                    self._add(node, f"{ast.unparse(sub)} = ... (a __class__ swap)")

    def visit_Assign(self, node: ast.Assign) -> None:
        self._targets(node.targets, node)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._targets([node.target], node)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._targets([node.target], node)
        self.generic_visit(node)


def _imports_an_exporter(tree: ast.Module) -> bool:
    return any(
        (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("opentelemetry.exporter"))
        or (
            isinstance(node, ast.Import)
            and any(a.name.startswith("opentelemetry.exporter") for a in node.names)
        )
        for node in ast.walk(tree)
    )


def _check(source: str) -> _Checker:
    tree = ast.parse(source)
    names = otel_private_names()
    if _imports_an_exporter(tree):
        names |= otel_private_names(EXPORTER_MODULES)
    checker = _Checker(names)
    checker.visit(tree)
    return checker


def private_uses(source: str) -> list[tuple[int, str]]:
    return _check(source).found


def _outside_fence() -> list[Path]:
    return [p for p in sorted(SRC.rglob("*.py")) if FENCE not in p.parents]


def test_private_opentelemetry_is_used_only_behind_the_fence() -> None:
    found = [
        f"{path.relative_to(SRC.parent)}:{line}: {what}"
        for path in _outside_fence()
        for line, what in private_uses(path.read_text(encoding="utf-8"))
    ]
    assert not found, (
        "private OpenTelemetry used outside gymtrace/_otel_private (move it into a function there,"
        " with a capability probe, a public fallback and a fastpaths.register entry):\n  "
        + "\n  ".join(found)
    )


def test_every_gymtrace_own_exception_still_occurs() -> None:
    seen = set().union(*(_check(path.read_text(encoding="utf-8")).allowed for path in _outside_fence()))
    assert sorted(set(GYMTRACE_OWN) - seen) == [], "no longer in the code: remove from GYMTRACE_OWN"


def test_the_private_names_come_from_the_installed_sdk() -> None:
    # The fields the lean span path fills, found by reading the SDK (not listed here by hand).
    expected = {"_attributes", "_events", "_links", "_context", "_end_time", "_dict", "_on_ending"}
    assert expected <= otel_private_names()
    assert {"_client", "_channel", "_stub"} <= otel_private_names(EXPORTER_MODULES)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (
            "from opentelemetry.trace.propagation import _SPAN_KEY",
            "from opentelemetry.trace.propagation import _SPAN_KEY",
        ),
        ("from opentelemetry import trace\nprovider = trace._TRACER_PROVIDER", "trace._TRACER_PROVIDER"),
        ("import opentelemetry.trace as t\nt._TRACER_PROVIDER = None", "t._TRACER_PROVIDER"),
        ("def f(span):\n    return span._attributes", "span._attributes (read)"),
        ("def f(span, a):\n    span._attributes = a", "span._attributes (write)"),
        ("def f(span):\n    return getattr(span, '_events', None)", "getattr(span, '_events')"),
        ("def f(span):\n    setattr(span, '_links', ())", "setattr(span, '_links')"),
        ("def f(tracer, Lean):\n    tracer.__class__ = Lean", "tracer.__class__ = ... (a __class__ swap)"),
        (
            "from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter\n"
            "class Lean(OTLPSpanExporter):\n    def f(self):\n        return self._client",
            "self._client (read)",
        ),
        (
            "class Mine:\n    def f(self, other):\n        return other._attributes",
            "other._attributes (read)",
        ),
    ],
)
def test_the_checker_sees_each_form(source: str, expected: str) -> None:
    assert [what for _, what in private_uses(source)] == [expected]


@pytest.mark.parametrize(
    "source",
    [
        # gymtrace's own classes keep their own private fields, whatever their names.
        "class Mine:\n    def __init__(self):\n        self._attributes = {}\n        self._lock = None",
        "class Mine:\n    def f(self):\n        return getattr(self, '_events', None)",
        # public OpenTelemetry, and private names of gymtrace's own modules.
        "from opentelemetry import trace\nprovider = trace.get_tracer_provider()",
        "from gymtrace import _constants as c\nname = c._private_helper",
        "from gymtrace._model import settings as _settings\n_settings._lock = None",
        "def f(span):\n    return span.attributes, span.__class__",
    ],
)
def test_the_checker_leaves_gymtrace_own_names_alone(source: str) -> None:
    assert private_uses(source) == []
