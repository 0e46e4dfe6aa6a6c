"""Private on purpose: tests that kill mutants of the private decision modules, each called directly.

Tests written to kill mutants scripts/mutation found surviving in the decision modules
(docs/testing.md): each pins a boundary or a branch no other fast test reached."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
from collections.abc import Iterator

import pytest

from gymtrace._identity import trust as _trust
from gymtrace._model import ids as _ids
from gymtrace._model import settings as _settings
from gymtrace._model.errors import InvalidArgumentError
from gymtrace._model.outcome_rule import (
    CANCELLED,
    COMPLETED,
    FAILED,
    PENDING,
    Attempt,
    Decision,
    Facts,
    decide,
    state_of,
    warning_text,
)
from gymtrace._read import compare as _compare
from gymtrace._read import passk as _passk
from gymtrace._read.outcomes import RolloutOutcome
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


@pytest.mark.usefixtures("trust_reset")
def test_a_training_identity_is_signed_v2_over_its_training_keys_and_any_other_v1() -> None:
    _trust.configure_trust(mode="signed", secret="s3cret")
    plain = _trust.signature(IDENTITY)
    training = _trust.signature({**IDENTITY, "gym.group.id": "g-1"})
    assert isinstance(plain, str) and plain.startswith("v1.")
    assert isinstance(training, str) and training.startswith("v2.")
    assert _trust.verified(IDENTITY, plain)
    # A signature of an unknown version is refused, whatever follows its prefix.
    assert not _trust.verified(IDENTITY, "v9." + plain[3:])
    assert not _trust.verified(IDENTITY, plain[3:])


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
    from gymtrace import attributes as c
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


# -- trust: where identity may go ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("localhost", True),
        ("api.localhost", True),
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("[::1]", True),
        ("localhostx", False),
        ("notlocalhost", False),
        ("localhost.example.com", False),
        ("10.0.0.1", False),
        ("[::2]", False),
        ("api.openai.com", False),
        ("", False),
    ],
)
def test_only_loopback_names_and_addresses_are_loopback(host: str, loopback: bool) -> None:
    assert _trust._is_loopback(host) is loopback


@contextlib.contextmanager
def _propagate_to(monkeypatch: pytest.MonkeyPatch, patterns: str) -> Iterator[None]:
    """``GYMTRACE_PROPAGATE_TO=patterns`` in force for the block, the settings read again both ways."""
    monkeypatch.setenv("GYMTRACE_PROPAGATE_TO", patterns)
    _settings.reload()
    try:
        yield
    finally:
        monkeypatch.delenv("GYMTRACE_PROPAGATE_TO")
        _settings.reload()


@pytest.fixture
def gym_hosts(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # The operator's list of the gym's own hosts: one by name, one by name and port, and one a
    # URL without a host must not match by accident.
    with _propagate_to(monkeypatch, "*.gym.internal, models.lab:8443, x*"):
        yield


@pytest.mark.usefixtures("gym_hosts")
@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("http://env-1.gym.internal/step", True),
        ("https://ENV-1.Gym.Internal:9000/", True),  # host names compare lower-case
        ("http://models.lab:8443/v1", True),  # host:port pattern
        ("http://models.lab:8080/v1", False),  # the same host on another port is not listed
        ("http://models.lab/v1", False),
        ("http://gym.internal.evil.com/", False),
        ("http://api.openai.com/v1", False),
        ("http://127.0.0.1:8000/", True),  # loopback, nothing said by a framework
        ("http://[::1]:8000/", True),
        ("http://localhost:99999/", False),  # a port out of range: no URL, no identity
        ("http://[::1/", False),  # unparseable
        ("not a url", False),
        ("/relative/path", False),
    ],
)
def test_identity_goes_to_listed_gym_hosts_and_loopback_only(url: str, allowed: bool) -> None:
    assert _trust.may_carry_identity(url) is allowed


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("http://gym.lab/run", True),  # host:* names the scheme's default port too
        ("http://gym.lab:8000/run", True),
        ("https://web.lab/v1", True),  # 443, the port https goes to
        ("wss://web.lab/v1", True),
        ("http://web.lab/v1", False),  # 80 is not listed
        ("https://web.lab:8443/v1", False),
        ("gopher://gym.lab/x", False),  # no default port known: only a bare-host pattern matches
    ],
)
def test_a_url_without_a_port_is_matched_at_its_schemes_default_port(
    monkeypatch: pytest.MonkeyPatch, url: str, allowed: bool
) -> None:
    with _propagate_to(monkeypatch, "gym.lab:*, web.lab:443"):
        assert _trust.may_carry_identity(url) is allowed


def test_identity_to_an_unknown_destination_is_denied_and_to_the_gym_itself_allowed() -> None:
    assert _trust.may_carry_identity(None) is False
    assert _trust.may_carry_identity(_trust.GYM_INTERNAL) is True
    assert _trust.may_carry_identity("GYM_INTERNAL") is False  # only the object, never a string
    assert repr(_trust.GYM_INTERNAL) == "gymtrace.propagation.GYM_INTERNAL"

    class Url:  # an object whose str() is the URL (httpx.URL, yarl.URL)
        def __str__(self) -> str:
            return "http://127.0.0.1:9/"

    assert _trust.may_carry_identity(Url()) is True


@pytest.mark.usefixtures("gym_hosts")
def test_what_a_framework_says_of_the_destination_overrides_loopback_not_the_operators_list() -> None:
    for inside, loopback, public, listed in ((True, True, True, True), (False, False, False, True)):
        token = _trust.destination_inside.set(inside)
        try:
            assert _trust.may_carry_identity("http://127.0.0.1:8000/") is loopback
            assert _trust.may_carry_identity("http://api.openai.com/") is public
            assert _trust.may_carry_identity("http://env-1.gym.internal/") is listed
        finally:
            _trust.destination_inside.reset(token)


def test_gym_destination_holds_for_its_block_nested_and_as_a_decorator_sync_or_async() -> None:
    from gymtrace import instrumentation

    url = "http://127.0.0.1:8000/"
    assert _trust.may_carry_identity(url) is True
    with instrumentation.gym_destination(False):
        assert _trust.may_carry_identity(url) is False
        with instrumentation.gym_destination(True):
            assert _trust.may_carry_identity(url) is True
        assert _trust.may_carry_identity(url) is False
    assert _trust.may_carry_identity(url) is True
    with pytest.raises(KeyError), instrumentation.gym_destination(False):
        raise KeyError("the block's own error")
    assert _trust.may_carry_identity(url) is True  # left as it was, whatever the block raised
    once = instrumentation.gym_destination(False)
    with once:
        with pytest.raises(RuntimeError, match="entered once"), once:
            pass
        assert _trust.may_carry_identity(url) is False  # the refused entry changed nothing
    assert _trust.may_carry_identity(url) is True

    outside = instrumentation.gym_destination(False)

    @outside
    def send(destination: str) -> bool:
        return _trust.may_carry_identity(destination)

    @outside
    async def send_later(destination: str) -> bool:
        await asyncio.sleep(0)
        return _trust.may_carry_identity(destination)

    async def both() -> list[bool]:
        # Two calls of one decorated function in flight at once: each enters the block of its own.
        return list(await asyncio.gather(send_later(url), send_later(url)))

    assert send(url) is False and send(url) is False
    assert send.__name__ == "send" and send_later.__name__ == "send_later"
    assert asyncio.run(both()) == [False, False]
    assert _trust.may_carry_identity(url) is True


# -- compare and pass@k: what a run's outcomes say -------------------------------------------------


def _run(tasks: dict[str, list[float | None]], name: str = "run") -> list[RolloutOutcome]:
    """A run's final outcomes: per task, its repeats' rewards (None: the repeat was not scored)."""
    return [
        RolloutOutcome(
            run_id=name,
            task_id=task,
            rollout_id=f"{name}-{task}-{repeat}",
            repeat=repeat,
            outcome="unscored" if reward is None else "scored",
            reward=reward,
            attempts=1,
            services=("",),
            source="root",
            trace_id=f"{name}{task}{repeat}",
        )
        for task, rewards in tasks.items()
        for repeat, reward in enumerate(rewards)
    ]


def test_compare_reports_every_tasks_means_counts_and_shares_in_its_json() -> None:
    a = _run({"t1": [1.0, 0.0, None, 1.0], "t2": [0.5], "only-a": [1.0]})
    b = _run({"t1": [1.0, 1.0], "t2": [0.0, None], "only-b": [0.25]})
    result = _compare.compare(a, b).as_json()
    assert result == {
        "tasks": [
            {
                "task_id": "only-a",
                "a_mean": 1.0,
                "b_mean": None,
                "delta": None,
                "a_n": 1,
                "b_n": 0,
                "a_unscored": 0,
                "b_unscored": 0,
            },
            {
                "task_id": "only-b",
                "a_mean": None,
                "b_mean": 0.25,
                "delta": None,
                "a_n": 0,
                "b_n": 1,
                "a_unscored": 0,
                "b_unscored": 0,
            },
            {
                "task_id": "t1",
                "a_mean": 2 / 3,
                "b_mean": 1.0,
                "delta": pytest.approx(1 / 3),
                "a_n": 3,
                "b_n": 2,
                "a_unscored": 1,
                "b_unscored": 0,
            },
            {
                "task_id": "t2",
                "a_mean": 0.5,
                "b_mean": 0.0,
                "delta": -0.5,
                "a_n": 1,
                "b_n": 1,
                "a_unscored": 0,
                "b_unscored": 1,
            },
        ],
        "delta": pytest.approx((1 / 3 - 0.5) / 2),
        "ci95": None,
        "pass_to_fail": ["t2"],
        "fail_to_pass": [],
        "verdict": "too_few_tasks",
        "reason": "2 tasks scored in both runs; a verdict needs at least 6 (no test reaches 95% confidence"
        " on fewer pairs)",
        "a_unscored_share": 1 / 6,
        "b_unscored_share": 1 / 5,
        "pass_threshold": 0.5,
    }


def test_compare_lists_tasks_in_natural_order_digits_as_numbers() -> None:
    ids = ["t10", "t2", "t1", "s9x10", "s9x9", "s10x1", "b", "a"]
    result = _compare.compare(_run({t: [1.0] for t in ids}), _run({t: [1.0] for t in ids}))
    assert [t.task_id for t in result.tasks] == ["a", "b", "s9x9", "s9x10", "s10x1", "t1", "t2", "t10"]


def test_compare_of_one_paired_task_says_one_task_in_its_reason() -> None:
    result = _compare.compare(_run({"t": [0.5]}), _run({"t": [0.75]}))
    assert result.reason == (
        "1 task scored in both runs; a verdict needs at least 6 (no test reaches 95% confidence on fewer pairs)"
    )
    assert result.verdict == "too_few_tasks" and result.delta == 0.25 and result.ci95 is None


def test_compare_of_empty_runs_has_no_data_and_no_refusal() -> None:
    result = _compare.compare([], [])
    assert (result.verdict, result.reason) == ("no_data", "no task is scored in both runs")
    assert result.a_unscored_share == result.b_unscored_share == 0.0 and result.delta is None
    # A run with nothing against a fully scored run: nothing lost on either side, nothing to pair.
    assert _compare.compare([], _run({"t": [1.0]})).verdict == "no_data"


def test_compare_refuses_only_a_gap_of_unscored_shares_above_the_limit() -> None:
    tasks = {f"t{i}": [1.0, 1.0, 1.0, 1.0] for i in range(6)}
    a = _run(tasks)
    b = _run({**tasks, "t0": [1.0, None, None, None], "t1": [None, None, None, 1.0]})  # 6 of 24 lost
    at_limit = _compare.compare(a, b, max_unscored_gap_pp=25.0)
    assert at_limit.verdict == "inconclusive" and at_limit.b_unscored_share == 0.25
    refused = _compare.compare(a, b, max_unscored_gap_pp=24.9)
    assert refused.verdict == "refused"
    assert refused.reason == (
        "unscored shares differ by 25.0 points (A 0.0%, B 25.0%), more than 24.9: a run that lost more"
        " rollouts is not comparable on the ones it kept"
    )
    # B minus A or A minus B: the gap is the same size either way.
    assert _compare.compare(b, a, max_unscored_gap_pp=24.9).verdict == "refused"


def test_compare_of_equal_runs_is_inconclusive_with_an_interval_of_zero() -> None:
    tasks = {f"t{i}": [1.0, 0.0] for i in range(6)}
    steady = {f"t{i}": [0.5, 0.5] for i in range(6)}
    result = _compare.compare(_run(steady), _run(steady))
    assert result.ci95 == (0.0, 0.0) and result.verdict == "inconclusive"
    assert result.reason == "the 95% interval of B - A contains 0"
    noisy = _compare.compare(_run(tasks), _run(tasks))
    low, high = noisy.ci95 or (None, None)
    assert low < 0 < high and noisy.verdict == "inconclusive"


def test_compare_says_which_run_is_better_when_the_interval_excludes_zero() -> None:
    low_run = {f"t{i}": [0.0, 0.25] for i in range(6)}
    high_run = {f"t{i}": [0.75, 1.0] for i in range(6)}
    better = _compare.compare(_run(low_run), _run(high_run))
    assert (better.verdict, better.reason) == ("b_better", "the 95% interval of B - A is above 0")
    assert better.ci95 is not None and 0.5 <= better.ci95[0] <= better.ci95[1] <= 1.0
    worse = _compare.compare(_run(high_run), _run(low_run))
    assert (worse.verdict, worse.reason) == ("a_better", "the 95% interval of B - A is below 0")
    assert worse.fail_to_pass == () and worse.pass_to_fail == tuple(f"t{i}" for i in range(6))
    assert better.pass_to_fail == () and better.fail_to_pass == tuple(f"t{i}" for i in range(6))


def test_a_flip_reads_a_tasks_mean_at_the_threshold_as_a_pass() -> None:
    result = _compare.compare(_run({"t": [0.25]}), _run({"t": [0.5]}))
    assert result.fail_to_pass == ("t",) and result.pass_to_fail == ()
    at = _compare.compare(_run({"t": [0.5]}), _run({"t": [0.25]}), threshold=0.25)
    assert at.fail_to_pass == () and at.pass_to_fail == () and at.as_json()["pass_threshold"] == 0.25


def test_the_interval_of_tasks_that_never_vary_is_their_delta_exactly() -> None:
    pairs = [([0.0, 0.0], [1.0, 1.0]), ([0.5], [0.5]), ([0.25, 0.25, 0.25], [0.5, 0.5])]
    low, high = _compare.bootstrap_ci95(pairs)
    # Tasks are resampled: a draw of three tasks has a mean delta in {0, 1/12, ..., 1}.
    assert 0.0 <= low <= high <= 1.0 and low < high
    assert _compare.bootstrap_ci95([([1.0], [0.0])] * 3) == (-1.0, -1.0)
    assert _compare.bootstrap_ci95(pairs) == (low, high)  # a fixed seed: the same interval


@pytest.mark.parametrize(
    ("n", "passed", "k", "value"),
    [
        (1, 1, 1, 1.0),
        (1, 0, 1, 0.0),
        (4, 1, 1, 0.25),
        (4, 1, 2, 0.5),
        (4, 2, 2, 1 - 1 / 6),
        (4, 2, 3, 1.0),  # fewer failures than draws: a pass is certain
        (5, 0, 5, 0.0),
        (5, 5, 5, 1.0),
        (10, 3, 4, 1 - 35 / 210),
    ],
)
def test_pass_at_k_is_the_unbiased_estimate(n: int, passed: int, k: int, value: float) -> None:
    assert _passk.pass_at_k(n, passed, k) == pytest.approx(value)


@pytest.mark.parametrize(("n", "passed", "k"), [(3, 4, 1), (3, -1, 1), (3, 1, 0), (3, 1, 4), (0, 0, 1)])
def test_pass_at_k_outside_its_domain_is_a_one_line_error(n: int, passed: int, k: int) -> None:
    with pytest.raises(ValueError) as raised:
        _passk.pass_at_k(n, passed, k)
    assert str(raised.value) == (
        f"pass@k needs 0 <= passed <= n and 1 <= k <= n, got n={n}, passed={passed}, k={k}"
    )


def test_pass_at_k_per_task_counts_tasks_with_too_few_scored_repeats_and_unscored_ones() -> None:
    outcomes = _run({"t2": [1.0, 0.0, None], "t1": [0.5, 0.25], "short": [1.0, None], "none": [None]})
    outcomes.append(dataclasses.replace(outcomes[0], task_id=None, rollout_id="no-task"))
    result = _passk.per_task(outcomes, 2)
    assert result.as_json() == {
        "k": 2,
        "mean": pytest.approx((1.0 + 1.0) / 2),
        "tasks": {"t1": 1.0, "t2": 1.0},
        "too_few_repeats": 2,
        "unscored": 1,  # t2's; the tasks left out are not counted
    }
    at_1 = _passk.per_task(outcomes, 1, threshold=0.75)
    assert at_1.tasks == {"short": 1.0, "t1": 0.0, "t2": 0.5} and at_1.too_few == 1 and at_1.unscored == 2
    assert _passk.per_task([], 1).as_json() == {
        "k": 1,
        "mean": None,
        "tasks": {},
        "too_few_repeats": 0,
        "unscored": 0,
    }
    with pytest.raises(ValueError, match=r"^pass@k needs k >= 1, got 0$"):
        _passk.per_task(outcomes, 0)


def test_pass_at_n_is_listed_for_tasks_with_more_than_one_repeat() -> None:
    lines = _passk.pass_at_n(_run({"b": [0.0, 0.5, None], "a": [1.0], "c": [None, None]}))
    assert [line.as_json() | {"task": line.task_id} for line in lines] == [
        {"task": "b", "k": 2, "n": 2, "passed": 1, "unscored": 1, "value": 1.0},
        {"task": "c", "k": 0, "n": 0, "passed": 0, "unscored": 2, "value": None},
    ]


# -- the outcome rule, case by case ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("facts", "decision"),
    [
        pytest.param(Facts(), Decision("unscored", None, 0, 1), id="nothing recorded"),
        pytest.param(Facts(reward=0.5), Decision("scored", 0.5, 0, 1), id="a reward, no episode"),
        pytest.param(Facts(handed_off=True), Decision("pending", None, 0, 1), id="handed off, no episode"),
        pytest.param(
            Facts(reward=0.5, failure="ValueError"),
            Decision(
                "unscored",
                None,
                0,
                1,
                (
                    "reward 0.5 was recorded before a failure (ValueError) ended the rollout; its only"
                    " attempt failed, and a failed attempt is never scored",
                ),
            ),
            id="a reward, then a failure, no episode",
        ),
        pytest.param(
            Facts(failure="ValueError", handed_off=True),
            Decision("unscored", None, 0, 1),
            id="failed handing off",
        ),
        pytest.param(
            Facts((Attempt(0, COMPLETED, 1.0), Attempt(1, COMPLETED, 0.5))),
            Decision(
                "scored",
                0.5,
                1,
                2,
                (
                    "attempt 0 completed with reward 1, but attempt 1 followed it; a rollout is scored by"
                    " its final attempt only",
                ),
            ),
            id="the final attempt scores",
        ),
        pytest.param(
            Facts((Attempt(1, COMPLETED, 0.5), Attempt(0, COMPLETED, 1.0))),
            Decision(
                "scored",
                0.5,
                1,
                2,
                (
                    "attempt 0 completed with reward 1, but attempt 1 followed it; a rollout is scored by"
                    " its final attempt only",
                ),
            ),
            id="the final attempt is the highest number, not the last given",
        ),
        pytest.param(
            Facts((Attempt(0, FAILED, 0.5), Attempt(1, COMPLETED))),
            Decision(
                "unscored",
                None,
                1,
                2,
                (
                    "reward 0.5 of attempt 0 was recorded before the attempt failed; a failed attempt is never scored",
                ),
            ),
            id="a failed attempt's reward is discarded",
        ),
        pytest.param(
            Facts((Attempt(0, COMPLETED), Attempt(1, FAILED, 0.5), Attempt(2, COMPLETED))),
            Decision(
                "unscored",
                None,
                2,
                3,
                (
                    "reward 0.5 of attempt 1 was recorded before the attempt failed; a failed attempt is never scored",
                ),
            ),
            id="every attempt's discarded reward is said, after one without a reward",
        ),
        pytest.param(
            Facts((Attempt(0, PENDING, 0.5), Attempt(1, COMPLETED, 1.0))),
            Decision("scored", 1.0, 1, 2),
            id="an earlier attempt concluded elsewhere is not a discarded reward",
        ),
        pytest.param(
            Facts((Attempt(0, FAILED, 0.5, definite=True), Attempt(1, COMPLETED, 1.0))),
            Decision("scored", 1.0, 1, 2),
            id="an earlier attempt's own span is not a discarded reward",
        ),
        pytest.param(
            Facts((Attempt(1, FAILED, order=(0,), definite=True), Attempt(1, COMPLETED, 0.75, order=(1, 5)))),
            Decision(
                "unscored",
                None,
                1,
                2,
                (
                    "reward 0.75 was recorded for attempt 1 elsewhere or later, but the attempt failed; a"
                    " failed attempt is never scored",
                ),
            ),
            id="a record elsewhere never revives a failed episode",
        ),
        pytest.param(
            Facts((Attempt(0, CANCELLED, order=(0,), definite=True), Attempt(0, COMPLETED, order=(1, 5)))),
            Decision("unscored", None, 0, 1),
            id="a cancelled episode stays cancelled",
        ),
        pytest.param(
            Facts((Attempt(0, COMPLETED, 0.25, definite=True), Attempt(0, COMPLETED, 1.0, order=(1, 5)))),
            Decision("scored", 1.0, 0, 1),
            id="a later record of a completed attempt counts",
        ),
        pytest.param(
            Facts((Attempt(0, COMPLETED, 0.25), Attempt(0, COMPLETED, 1.0))),
            Decision(
                "scored",
                1.0,
                0,
                1,
                (
                    "attempt 0 was recorded again after it completed with reward 0.25; attempt numbers are"
                    " never reused, the last recorded counts",
                ),
            ),
            id="a reused attempt number: the last recorded counts",
        ),
        pytest.param(
            Facts((Attempt(0, COMPLETED), Attempt(1, COMPLETED)), reward=0.5),
            Decision("scored", 0.5, 1, 2),
            id="a rollout reward scores a final attempt without one",
        ),
        pytest.param(
            Facts((Attempt(0, COMPLETED), Attempt(1, COMPLETED, 1.0)), reward=0.5),
            Decision(
                "scored",
                1.0,
                1,
                2,
                (
                    "reward 0.5 was recorded on the rollout outside its episodes, but its final attempt 1"
                    " has a reward of its own (1), which counts",
                ),
            ),
            id="the final attempt's own reward beats the rollout's",
        ),
        pytest.param(
            Facts((Attempt(0, COMPLETED), Attempt(1, FAILED)), reward=0.5),
            Decision(
                "unscored",
                None,
                1,
                2,
                (
                    "reward 0.5 was recorded on the rollout after its final attempt 1 failed; a failed"
                    " attempt is never scored",
                ),
            ),
            id="a rollout reward after a failed final attempt",
        ),
        pytest.param(
            Facts((Attempt(0, PENDING),), reward=0.5),
            Decision(
                "pending",
                None,
                0,
                1,
                (
                    "reward 0.5 was recorded on the rollout after its final attempt 0 pending; a pending"
                    " attempt is never scored",
                ),
            ),
            id="concluded elsewhere",
        ),
        pytest.param(
            Facts((Attempt(0, COMPLETED, handed_off=True),)), Decision("pending", None, 0, 1), id="hand-off"
        ),
        pytest.param(
            Facts((Attempt(0, COMPLETED, handed_off=True), Attempt(1, COMPLETED))),
            Decision("unscored", None, 1, 2),
            id="an earlier attempt's hand-off is its own",
        ),
        pytest.param(
            Facts((Attempt(0, COMPLETED), Attempt(1, COMPLETED)), handed_off=True),
            Decision("pending", None, 1, 2),
            id="a hand-off on the rollout is the final attempt's",
        ),
        pytest.param(
            Facts((Attempt(0, FAILED, handed_off=True),), handed_off=True),
            Decision("unscored", None, 0, 1),
            id="a failed attempt is never pending",
        ),
        pytest.param(
            Facts((Attempt(2, COMPLETED, 1.0),)), Decision("scored", 1.0, 2, 3), id="one attempt numbered 2"
        ),
        pytest.param(
            Facts((Attempt(0, COMPLETED, 1.0),), started=3),
            Decision("scored", 1.0, 0, 3),
            id="more episodes opened",
        ),
        pytest.param(
            Facts((Attempt(0, COMPLETED), Attempt(1, COMPLETED, 1.0)), started=5),
            Decision("scored", 1.0, 1, 5),
            id="more episodes opened than numbers seen",
        ),
    ],
)
def test_the_outcome_rule_decides_each_documented_case(facts: Facts, decision: Decision) -> None:
    assert decide(facts) == decision
    assert decide(facts).scored is (decision.outcome == "scored")


def test_a_rollout_level_outcome_stands_for_the_attempt_state_it_names() -> None:
    assert [state_of(o) for o in ("scored", "pending", "unscored", "cancelled", None)] == [
        COMPLETED,
        PENDING,
        FAILED,
        CANCELLED,
        CANCELLED,
    ]


def test_the_interval_is_the_middle_95_percent_of_a_tasks_repeat_noise() -> None:
    # Eight tasks, each 10 of 20 repeats passing in A and 11 of 20 in B: every task is alike, so the
    # interval is the repeats' noise alone. A side's mean of 20 coin flips has variance 0.25 / 20;
    # a task's delta twice that; the mean of 8 deltas an eighth: sd 0.0559, so 0.05 +- 1.96 sd.
    pairs = [([1.0] * 10 + [0.0] * 10, [1.0] * 11 + [0.0] * 9)] * 8
    low, high = _compare.bootstrap_ci95(pairs)
    half_width = 1.96 * (2 * 0.25 / 20 / 8) ** 0.5
    assert low == pytest.approx(0.05 - half_width, abs=0.015)
    assert high == pytest.approx(0.05 + half_width, abs=0.015)
    # 30 repeats a side: fewer resamples than the most (the draws are capped), the same meaning.
    pairs = [([1.0] * 15 + [0.0] * 15, [1.0] * 16 + [0.0] * 14)] * 8
    low, high = _compare.bootstrap_ci95(pairs)
    half_width = 1.96 * (2 * 0.25 / 30 / 8) ** 0.5
    assert low == pytest.approx(1 / 30 - half_width, abs=0.015)
    assert high == pytest.approx(1 / 30 + half_width, abs=0.015)


def test_the_interval_is_the_same_for_the_same_inputs_and_seed() -> None:
    pairs = [([0.1 * i, 0.37, 0.91], [0.2, 0.05 * i, 0.6]) for i in range(8)]
    first = _compare.bootstrap_ci95(pairs)
    assert _compare.bootstrap_ci95(pairs) == first
    assert _compare.bootstrap_ci95([(list(a), list(b)) for a, b in pairs], seed=_compare.SEED) == first
    assert _compare.bootstrap_ci95(pairs, seed=7) != first  # the seed, not a constant, decides


def test_compare_refuses_a_gap_above_ten_points_by_default() -> None:
    a = _run({f"t{i}": [1.0] for i in range(19)})
    b = _run({f"t{i}": [None if i < 2 else 1.0] for i in range(19)})  # 2 of 19 lost: 10.5 points
    assert _compare.compare(a, b).verdict == "refused"
    assert _compare.compare(a, b, max_unscored_gap_pp=10.6).verdict != "refused"


@pytest.mark.parametrize(
    ("a", "b", "threshold", "pass_to_fail", "fail_to_pass"),
    [
        (0.3, 0.1, 0.25, ("t",), ()),  # both below the default 0.5: a flip only at 0.25
        (0.1, 0.3, 0.25, (), ("t",)),
        (1.0, 0.6, 0.75, ("t",), ()),  # both above the default: a flip only at 0.75
        (0.6, 1.0, 0.75, (), ("t",)),
    ],
)
def test_a_flip_is_judged_at_the_threshold_given_for_both_runs(
    a: float, b: float, threshold: float, pass_to_fail: tuple[str, ...], fail_to_pass: tuple[str, ...]
) -> None:
    result = _compare.compare(_run({"t": [a]}), _run({"t": [b]}), threshold=threshold)
    assert (result.pass_to_fail, result.fail_to_pass) == (pass_to_fail, fail_to_pass)


def test_rewards_by_task_skips_rollouts_without_a_task_and_takes_only_scored_rewards() -> None:
    # A rollout recorded without a task ID (first in the list) says nothing about any task, and
    # must not stop the rollouts after it from counting; a pending rollout whose last episode
    # reported a reward counts as a repeat, but its reward is not the task's until it is scored.
    no_task = dataclasses.replace(_run({"x": [1.0]})[0], task_id=None)
    pending = dataclasses.replace(_run({"t": [0.25]})[0], outcome="pending", rollout_id="t-pending")
    found = _passk.rewards_by_task([no_task, *_run({"t": [1.0, None]}), pending])
    assert found == {"t": (3, [1.0])}


# -- identity parsing: versions and derived IDs ---------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "version"),
    [
        (7, 7),
        (True, None),  # a bool is not a version
        ("7", 7),
        ("-2", -2),
        ("07", "07"),  # not the canonical decimal: text
        ("-07", "-07"),
        ("v7", "v7"),
        ("1" * 18, int("1" * 18)),
        ("-" + "1" * 18, -int("1" * 18)),
        ("1" * 19, "1" * 19),  # past 18 digits a version stays text
        ("", None),
        ("a\nb", None),
        (1.5, None),
    ],
)
def test_a_version_read_from_text_is_an_int_only_in_canonical_decimal(text: object, version: object) -> None:
    assert _ids.read_version(text) == version
    assert type(_ids.read_version(text)) is type(version)


def test_a_derived_id_takes_1_to_32_bytes_and_is_never_zero() -> None:
    assert 0 < _ids.deterministic_id("a", size=1) < 2**8
    assert 0 < _ids.deterministic_id("a", size=32) < 2**256
    for size in (0, 33, True, 8.0):
        with pytest.raises(InvalidArgumentError):
            _ids.deterministic_id("a", size=size)  # type: ignore[arg-type]
    # Parts whose hash starts with a zero byte: a one-byte ID of 0 would be invalid, so it is 1.
    zero = next(f"k{i}" for i in range(100_000) if hashlib.sha256(f"k{i}".encode()).digest()[0] == 0)
    assert _ids.deterministic_id(zero, size=1) == 1
