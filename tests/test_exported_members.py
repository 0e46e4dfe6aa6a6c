"""Private on purpose: each module's public surface, held against the private modules it takes from.

The public surface is small and deliberate: every public name a module defines or takes from
gymtrace is in its ``__all__`` and nothing else is (like httpx's ``test_all_imports_are_exported``),
and the top-level list is pinned, so changing the surface must change this test."""

from __future__ import annotations

import ast
import importlib
import inspect
from types import ModuleType

import pytest

import gymtrace

PUBLIC_MODULES = [
    "gymtrace",
    "gymtrace.propagation",
    "gymtrace.testing",
    "gymtrace.sampling",
    "gymtrace.instrumentation",
    "gymtrace.integrations.aiohttp",
    "gymtrace.integrations.asgi",
    "gymtrace.integrations.concurrent",
    "gymtrace.integrations.httpx",
    "gymtrace.integrations.nemo_gym",
    "gymtrace.integrations.autoinstrument",
    "gymtrace.integrations.openai",
]


# Modules whose surface is what they re-export.
FACADES = {
    "gymtrace",
    "gymtrace.integrations.concurrent",
    "gymtrace.integrations.nemo_gym",
    "gymtrace.instrumentation",
    "gymtrace.sampling",
}


def _bound_names(body: list[ast.stmt], *, facade: bool, lazy: bool = False) -> set[str]:
    names: set[str] = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif (
            isinstance(node, ast.ImportFrom)
            and (node.module or "").startswith("gymtrace")
            and (facade or lazy)
        ):
            # The package re-exports what its private modules implement; other modules import
            # for their own use, so only what they define is their surface.
            names.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.If):  # `if TYPE_CHECKING:` imports of names loaded on first use
            names.update(_bound_names(node.body, facade=facade, lazy=True))
    return names


def public_names(module: ModuleType) -> list[str]:
    """Every public name the module's own source binds at top level."""
    facade = module.__name__ in FACADES
    names = _bound_names(ast.parse(inspect.getsource(module)).body, facade=facade)
    return sorted(n for n in names if not n.startswith("_") or n == "__version__")


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_all_public_names_are_exported_and_nothing_else(name: str) -> None:
    module = importlib.import_module(name)
    assert sorted(module.__all__) == public_names(module)
    for exported in module.__all__:
        assert hasattr(module, exported), exported


def test_the_top_level_surface_is_pinned() -> None:
    assert sorted(gymtrace.__all__) == [
        "ActiveScope",
        "Attempt",
        "Attempts",
        "Configuration",
        "Current",
        "ExportStats",
        "GymTraceError",
        "HierarchyViolationError",
        "IdentitySpanProcessor",
        "InvalidArgumentError",
        "Scope",
        "StepPolicy",
        "__version__",
        "agent_invocation",
        "attempts",
        "configure",
        "configure_content",
        "consume",
        "current",
        "current_scope",
        "episode",
        "export_stats",
        "force_flush",
        "get_configuration",
        "is_configured",
        "model_call",
        "propagation",
        "record_content",
        "record_failure",
        "record_reward",
        "record_usage",
        "rollout",
        "run",
        "seed_session",
        "set_policy_version",
        "shutdown",
        "step",
        "testing",
        "tool_call",
        "train_step",
        "turn",
        "verify",
    ]


def test_the_documented_propagation_and_testing_names_are_there() -> None:
    # Their __all__ is checked exactly against each module's namespace above; these are the names
    # the README documents, which must not drop out of it.
    documented = {"inject", "extract", "attach", "env_carrier", "submit", "map", "carry", "ContextCarrier"}
    assert documented <= set(gymtrace.propagation.__all__)
    assert sorted(gymtrace.testing.__all__) == [
        "CapturedSpans",
        "capture_spans",
        "check_trace",
        "reset",
        "strict",
    ]


def test_the_integration_seam_is_pinned() -> None:
    # Integrations (gymtrace's own and third parties') build on gymtrace.instrumentation: it changes
    # only by addition, so this list only grows.
    import gymtrace.instrumentation

    assert sorted(gymtrace.instrumentation.__all__) == [
        "InvalidArgumentError",
        "STEPS_OWNED_ELSEWHERE",
        "STEP_POLICIES",
        "accept_identity",
        "bind_tracer_provider",
        "check_tracer_provider",
        "chosen_step_parameters",
        "continue_scope",
        "current_identity",
        "deterministic_id",
        "end_scope",
        "episode_carrier",
        "episode_id",
        "get_tracer",
        "guard",
        "gym_destination",
        "hand_off",
        "identity_fallback",
        "incoming_identity",
        "inject_context",
        "innermost_scope",
        "may_carry_identity",
        "misuse",
        "note_caller",
        "pinned_ids",
        "read_int",
        "report_error",
        "rerun",
        "rollout_sampled_out",
        "set_identity_aliases",
        "set_identity_fallback",
        "stamp_identity",
        "start_scope",
        "step_policy_attributes",
        "step_policy_inputs",
        "step_statistics_attributes",
        "use_tracer_provider",
        "warn",
        "warn_once",
        "write_step",
    ]


def test_the_attribute_names_module_is_every_name_gymtrace_writes() -> None:
    # One table spells the names; gymtrace.attributes shows the public ones, each the table's own
    # value (which are public is pinned by tests/test_attributes_public.py).
    from gymtrace import _constants, attributes

    expected = sorted(attributes.__all__)
    assert set(expected) <= {name for name in vars(_constants) if name.isupper()}
    assert all(getattr(attributes, name) == getattr(_constants, name) for name in expected)
    assert attributes.ROLLOUT_ID == "gym.rollout.id"
