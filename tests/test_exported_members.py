"""The public surface is small and deliberate: changing it must change this test."""

import gymtrace


def test_public_names_are_pinned() -> None:
    assert set(gymtrace.__all__) == {
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
        "current",
        "current_scope",
        "episode",
        "export_stats",
        "force_flush",
        "model_call",
        "propagation",
        "record_content",
        "record_failure",
        "record_reward",
        "record_usage",
        "rollout",
        "run",
        "seed_session",
        "shutdown",
        "step",
        "testing",
        "tool_call",
        "turn",
        "verify",
    }


def test_every_public_name_exists() -> None:
    for name in gymtrace.__all__:
        assert hasattr(gymtrace, name), name


def test_propagation_and_testing_surfaces_are_pinned() -> None:
    assert {"inject", "extract", "attach", "env_carrier"} <= set(gymtrace.propagation.__all__)
    assert {"capture_spans", "check_trace", "CapturedSpans"} <= set(gymtrace.testing.__all__)
