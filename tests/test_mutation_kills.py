"""Tests written to kill mutants scripts/mutation found surviving in the decision modules
(docs/testing.md): each pins a boundary or a branch no other fast test reached."""

from __future__ import annotations

import dataclasses

import pytest

from gymtrace._identity import trust as _trust
from gymtrace._model import ids as _ids
from gymtrace._model import settings as _settings
from gymtrace._model.errors import InvalidArgumentError
from gymtrace._model.outcome_rule import Decision, warning_text
from gymtrace._scopes import steps as _steps

# -- trust: configure()'s trust arguments ---------------------------------------------------------


def test_trust_arguments_are_normalised_into_settings_overrides() -> None:
    assert _trust.trust_overrides() == {}
    assert _trust.trust_overrides(mode=" Signed ", secret=" s1 , s2 ", allow=" k1 , , k2 ") == {
        "trust_identity": "signed",
        "identity_secrets": ("s1", "s2"),
        "baggage_allow": frozenset({"k1", "k2"}),
    }
    for keys in ([" k1 ", "", "k2"], (" k1 ", "k2"), {"k1", "k2"}, frozenset({"k1", "k2"})):
        assert _trust.trust_overrides(allow=keys) == {"baggage_allow": frozenset({"k1", "k2"})}
    assert _trust.trust_overrides(allow=[]) == {"baggage_allow": frozenset()}


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            {"mode": "sometimes"},
            f"gymtrace.configure(): argument 'trust_identity' must be one of {_settings.TRUST_MODES},"
            " got 'sometimes'",
        ),
        (
            {"mode": 1},
            f"gymtrace.configure(): argument 'trust_identity' must be one of {_settings.TRUST_MODES}, got 1",
        ),
        ({"secret": " , "}, "gymtrace.configure(): argument 'identity_secret' must be a non-empty string"),
        ({"secret": b"key"}, "gymtrace.configure(): argument 'identity_secret' must be a non-empty string"),
        (
            {"allow": ["k", 1]},
            "gymtrace.configure(): argument 'baggage_allow' must be a comma-separated string or a list of"
            " keys, got ['k', 1]",
        ),
        (
            {"allow": 7},
            "gymtrace.configure(): argument 'baggage_allow' must be a comma-separated string or a list of"
            " keys, got 7",
        ),
    ],
)
def test_a_bad_trust_argument_is_a_one_line_error_naming_it(arguments: dict, message: str) -> None:
    with pytest.raises(InvalidArgumentError) as raised:
        _trust.trust_overrides(**arguments)
    assert str(raised.value) == message


# -- identity parsing: a continuation's reserved step number ---------------------------------------


@pytest.mark.parametrize(
    ("raw", "number"),
    [
        (1, 1),
        ("1", 1),
        ("0012", 12),
        ((1 << 63) - 1, (1 << 63) - 1),
        (str((1 << 63) - 1), (1 << 63) - 1),
        (0, None),
        ("0", None),
        (1 << 63, None),
        ("9" * 19, None),  # 19 digits, above int64
        ("0" * 19 + "1", None),  # 20 characters: never parsed, whatever their value
        (True, None),
        (-1, None),
        ("-1", None),
        ("1.0", None),
        (1.0, None),
        ("\uff11", None),  # a full-width digit: isdigit() but not ASCII
        (None, None),
    ],
)
def test_a_step_number_from_another_process_is_a_positive_int64_or_nothing(
    raw: object, number: int | None
) -> None:
    assert _ids.clean_step_number(raw) == number


# -- the outcome rule's warning -------------------------------------------------------------------


def test_the_outcome_rules_warning_names_the_rollout_what_was_discarded_and_the_fix() -> None:
    decision = Decision("scored", 1.0, 1, 2, discarded=("a reward in attempt 0", "a second reward"))
    assert warning_text("r-1", decision) == (
        "rollout 'r-1': a reward in attempt 0; a second reward. Fix: record the reward inside the final"
        " episode (or between it and the rollout's end) and only once the attempt succeeded; open one"
        " gymtrace.rollout() per sample, not one around several episodes that each score"
    )


# -- step numbering: the step policy argument ------------------------------------------------------


def _settings_with(**values: object) -> _settings.Settings:
    return dataclasses.replace(_settings.active, **values)  # type: ignore[arg-type]


def test_a_step_policy_by_name_takes_its_parameters_from_the_settings() -> None:
    read = _settings_with(step_policy="aggregate", step_first=3, step_slowest=4, step_episode_share=0.25)
    expected = _steps.StepPolicy(policy="aggregate", first=3, slowest=4, episode_share=0.25)
    assert _steps.policy_from(None, read) == expected
    assert _steps.policy_from(" Aggregate ", read) == expected
    assert _steps.policy_from("all", read) == _steps.StepPolicy(
        policy="all", first=3, slowest=4, episode_share=0.25
    )
    given = _steps.StepPolicy(policy="aggregate", first=9)
    assert _steps.policy_from(given, read) is given
    assert _steps.policy_from({"policy": "aggregate", "slowest": 2}, read) == _steps.StepPolicy(
        policy="aggregate", slowest=2
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            {"policy": "all", "fast": 1, "cheap": 2},
            "gymtrace.configure(): argument 'step_policy' has unknown keys ['cheap', 'fast']; a step policy"
            " has ['policy', 'first', 'slowest', 'episode_share']",
        ),
        (
            3,
            "gymtrace.configure(): argument 'step_policy' must be 'all', 'aggregate' or a"
            " gymtrace.StepPolicy, got int",
        ),
        (
            "sometimes",
            f"gymtrace.configure(): argument 'step_policy' must be one of {_settings.STEP_POLICIES},"
            " got 'sometimes'",
        ),
    ],
)
def test_a_bad_step_policy_is_a_one_line_error_naming_it(value: object, message: str) -> None:
    with pytest.raises(InvalidArgumentError) as raised:
        _steps.policy_from(value, _settings.active)  # type: ignore[arg-type]
    assert str(raised.value) == message


# -- trust: which incoming identity is believed ----------------------------------------------------

IDENTITY: dict[str, str | int] = {"gym.run.id": "run-1", "gym.rollout.id": "r-1", "gym.episode.attempt": 1}


@pytest.fixture
def trust_reset() -> object:
    yield
    _trust.reset_trust()


@pytest.mark.usefixtures("trust_reset")
def test_incoming_identity_is_believed_as_the_trust_mode_says() -> None:
    _trust.configure_trust(mode="all")
    assert _trust.accept(dict(IDENTITY), None) == IDENTITY
    assert _trust.accept({}, None) == {}
    _trust.configure_trust(mode="none")
    assert _trust.accept(dict(IDENTITY), None) == {}
    assert _trust.accept(dict(IDENTITY), None, trusted=True) == IDENTITY  # this process's own carrier
    assert _trust.accept(dict(IDENTITY), None, trusted=False) == {}
    _trust.configure_trust(mode="signed", secret="s3cret")
    assert _settings.active.trust_identity == "signed"
    assert _settings.active.identity_secrets == ("s3cret",)
    sig = _trust.signature(IDENTITY)
    assert isinstance(sig, str)
    assert _trust.accept(dict(IDENTITY), sig) == IDENTITY
    assert _trust.accept(dict(IDENTITY), None) == {}
    assert _trust.accept({**IDENTITY, "gym.rollout.id": "r-2"}, sig) == {}  # signed for another
    _trust.configure_trust(mode="none", secret="s3cret")
    assert _trust.accept(dict(IDENTITY), sig) == {}  # a valid signature alone is not the mode
    _trust.configure_trust(allow="k1,k2")
    assert _settings.active.baggage_allow == frozenset({"k1", "k2"})


# -- identity parsing: values from another process -------------------------------------------------


@pytest.mark.parametrize(
    ("key", "raw", "value"),
    [
        ("gym.episode.attempt", 7, 7),
        ("gym.episode.attempt", "7", 7),
        ("gym.episode.attempt", _ids.MAX_INDEX, _ids.MAX_INDEX),
        ("gym.episode.attempt", str(_ids.MAX_INDEX), _ids.MAX_INDEX),
        ("gym.episode.attempt", "0000000001", 1),  # ten characters
        ("gym.episode.attempt", "00000000001", None),  # eleven: never parsed
        ("gym.episode.attempt", _ids.MAX_INDEX + 1, None),
        ("gym.episode.attempt", "x1", None),
        ("gym.episode.attempt", True, None),
        ("gym.rollout.id", "r-1", "r-1"),
        ("gym.rollout.id", 12, "12"),
        ("gym.rollout.id", True, None),
        ("gym.rollout.id", 1.5, None),
    ],
)
def test_an_identity_value_from_another_process_is_valid_or_nothing(
    key: str, raw: object, value: object
) -> None:
    assert _ids.clean_value(key, raw) == value


# -- step numbering: the statistics of aggregated steps --------------------------------------------


def test_aggregated_step_statistics_count_time_errors_and_keep_the_slowest() -> None:
    stats = _steps.StepStats(_steps.StepPolicy(policy="aggregate", first=0, slowest=2, episode_share=0.0))
    stats.record(1, 0, 10, as_span=False, error=True)
    stats.record(2, 100, 130, as_span=False, error=True)
    stats.record(3, 200, 230, as_span=False)  # as slow as step 2: the first of equals stays slowest
    stats.record(4, 300, 310, as_span=True)  # as fast as step 1
    stats.record(5, 400, 420, as_span=False)
    assert (stats.count, stats.errors, stats.spans, stats.total_ns) == (5, 2, 1, 100)
    assert (stats.min_ns, stats.max_ns, stats.slowest_number) == (10, 30, 2)
    # The two slowest that are not spans yet: steps 2 and 3 (30 ns), not 5 (20 ns).
    assert sorted(number for _, number, _, _ in stats.slow) == [2, 3]
    stats.record(6, 500, 530, as_span=False)  # equal to the slowest kept: not a replacement
    assert sorted(number for _, number, _, _ in stats.slow) == [2, 3]
    zero = _steps.StepStats(_steps.StepPolicy(policy="aggregate", first=0, slowest=1, episode_share=0.0))
    zero.record(1, 5, 5, as_span=False)
    zero.record(2, 5, 8, as_span=False)
    assert (zero.min_ns, zero.max_ns) == (0, 3)  # a zero-length step is the minimum, once seen


def test_kept_step_spans_have_their_measured_times_and_come_in_the_order_they_ran() -> None:
    import time

    import gymtrace
    from gymtrace import _constants as c
    from gymtrace.testing import capture_spans

    saved = _steps.current_policy()
    _steps.set_policy(_steps.StepPolicy("aggregate", first=0, slowest=2, episode_share=0.0))
    try:
        with capture_spans() as captured:
            with gymtrace.rollout(rollout_id="r-1", task_id="t", repeat=0), gymtrace.episode():
                for i in range(1, 7):
                    try:
                        with gymtrace.step():
                            if i in (2, 5):
                                time.sleep(0.02 if i == 5 else 0.03)  # step 2 the slower of the two
                            if i == 4:
                                raise ValueError("step 4 broke")
                    except ValueError:
                        pass
    finally:
        _steps.set_policy(saved)
    steps = captured.by_kind("step")
    kept = {s.attributes[c.STEP_NUMBER]: s for s in steps}
    assert sorted(kept) == [2, 4, 5]
    # The slowest are written at the episode's end in the order they ran, not by duration.
    slowest = [s.attributes[c.STEP_NUMBER] for s in steps if s.attributes[c.STEP_KEPT] == c.STEP_KEPT_SLOWEST]
    assert slowest == [2, 5]
    for number, least in ((2, 0.03), (5, 0.02)):
        span = kept[number]
        assert span.name == c.SPAN_STEP
        assert span.end_time - span.start_time >= least * 1e9
        assert span.start_time > kept[4].end_time if number == 5 else span.end_time < kept[4].start_time
    raised = kept[4]
    assert raised.attributes[c.STEP_KEPT] == c.STEP_KEPT_RAISED
    assert raised.start_time < raised.end_time
    assert [e.timestamp for e in raised.events] == [raised.end_time]  # the exception, when it ended


# -- identity parsing: arguments of user code ------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: _ids.check_id("rollout", "rollout_id", 5),
            "gymtrace.rollout(): argument 'rollout_id' must be a string, got int 5",
        ),
        (
            lambda: _ids.check_id("rollout", "rollout_id", ""),
            "gymtrace.rollout(): argument 'rollout_id' must not be empty",
        ),
        (
            lambda: _ids.check_id("rollout", "task_id", "x" * (_ids.MAX_ID_LENGTH + 1)),
            f"gymtrace.rollout(): argument 'task_id' must be at most {_ids.MAX_ID_LENGTH} characters,"
            f" got {_ids.MAX_ID_LENGTH + 1}",
        ),
        (
            lambda: _ids.check_id("run", "run_id", "a\n" + "b" * 60),
            "gymtrace.run(): argument 'run_id' must be printable text without control characters, got "
            + repr(("a\n" + "b" * 60)[:40]),
        ),
        (
            lambda: _ids.check_index("rollout", "repeat", True, 0),
            "gymtrace.rollout(): argument 'repeat' must be an int >= 0, got bool True",
        ),
        (
            lambda: _ids.check_index("episode", "attempt", -1, 0),
            "gymtrace.episode(): argument 'attempt' must be >= 0, got -1",
        ),
        (
            lambda: _ids.check_reward("reward", "1.0"),
            "gymtrace.record_reward(): argument 'reward' must be a real number, got str '1.0'",
        ),
        (
            lambda: _ids.check_reward("reward", float("nan")),
            "gymtrace.record_reward(): argument 'reward' must be finite, got nan",
        ),
    ],
)
def test_a_bad_identity_argument_names_the_call_the_argument_and_the_problem(
    call: object, message: str
) -> None:
    from gymtrace.testing import capture_spans

    with capture_spans(strict=True), pytest.raises(InvalidArgumentError) as raised:
        call()  # type: ignore[operator]
    assert str(raised.value) == message


def test_valid_identity_arguments_pass_through() -> None:
    longest = "x" * _ids.MAX_ID_LENGTH
    assert _ids.check_id("rollout", "rollout_id", longest) == longest
    assert _ids.check_id("rollout", "rollout_id", None) is None
    assert _ids.check_index("rollout", "repeat", 0, 0) == 0
    assert _ids.check_reward("reward", 1) == 1.0 and isinstance(_ids.check_reward("reward", 1), float)


@pytest.mark.parametrize("timeout", [0, -1, 0.0, float("inf"), float("nan"), True, "5", None])
def test_a_timeout_is_a_positive_finite_number_of_seconds(timeout: object) -> None:
    if timeout is None:
        assert _ids.check_timeout("episode", None) is None
        return
    with pytest.raises(InvalidArgumentError) as raised:
        _ids.check_timeout("episode", timeout)
    assert str(raised.value) == (
        f"gymtrace.episode(): argument 'timeout' must be a number of seconds > 0, got {timeout!r:.40}"
    )


@pytest.mark.parametrize("timeout", [0.001, 0.5, 1, 3600])
def test_a_small_or_whole_timeout_is_accepted(timeout: float) -> None:
    assert _ids.check_timeout("episode", timeout) is None


def test_the_sampling_decision_is_the_ids_first_64_bits_against_the_ratio() -> None:
    import hashlib

    for key in ("r-1", "task-7", "é"):
        fraction = int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") / 2**64
        assert _ids.keep_rollout(key, fraction) is False  # strictly below the ratio
        assert _ids.keep_rollout(key, fraction + 1e-9) is True
