"""Fuzz the incoming side of propagation: hostile headers never hurt the process they reach.

Only the public functions are used (``extract``, ``attach``, ``inject``, ``identity_from_context``),
so the properties hold whatever the implementation. Inputs: garbage and near-valid
``traceparent``; ``baggage`` that is malformed, oversized (up to megabytes) or carries identity
values with control characters, bidi overrides, lone surrogates (what ``os.environ`` holds for
undecodable bytes) or megabytes of text; carrier keys in any case and values of the wrong type.

Properties:

- ``extract`` and ``attach`` never raise, whatever the carrier;
- every identity value that comes out (the identity keys, and a training run's group and policy
  version) is short printable text (or a small non-negative int for ``gym.rollout.repeat`` /
  ``gym.episode.attempt``, an int for a decimal ``gym.policy.version``) that encodes as UTF-8, so
  it can never break an OTLP export or spoof what Jaeger displays;
- ``attach`` always detaches: the current context after the block is the one before it, also when
  the block raises;
- what ``inject`` writes from an extracted context extracts to the same identity.

Run with ``--hypothesis-show-statistics`` to see how many cases ran.
"""

from __future__ import annotations

import string
import unicodedata
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from opentelemetry import context as otel_context

from gymtrace import propagation

IDENTITY_KEYS = (
    "gym.run.id",
    "gym.task.id",
    "gym.rollout.id",
    "gym.rollout.repeat",
    "gym.episode.attempt",
    "gym.episode.id",
)
# A training run's keys travel with the identity (docs/distributed.md); the version in baggage reads
# back as an int when it is a canonical decimal (up to 18 digits, signed), else as text.
TRAINING_KEYS = ("gym.group.id", "gym.policy.version")
INT_KEYS = {"gym.rollout.repeat", "gym.episode.attempt"}
MAX_ID_LENGTH = 256  # "short": the bound propagation documents for incoming IDs

FUZZ = settings(
    max_examples=400,
    deadline=None,  # megabyte inputs take milliseconds; a deadline would only add flakiness
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# Every code point but lone surrogates (those have their own test below): control characters,
# bidi overrides, separators, private use, unassigned.
hostile_chars = st.characters(exclude_categories=["Cs"])
surrogates = st.characters(categories=["Cs"])
hostile_text = st.text(alphabet=hostile_chars, max_size=40)
hex_text = st.text(alphabet="0123456789abcdefABCDEF-xz", max_size=40)


@st.composite
def huge_text(draw: st.DrawFn) -> str:
    """Up to ~2 MB, built by repetition (hypothesis would take forever to draw it char by char)."""
    unit = draw(st.text(alphabet=hostile_chars, min_size=1, max_size=8))
    size = draw(st.sampled_from([300, 10_000, 100_000, 2_000_000]))
    return unit * draw(st.integers(1, size // len(unit)))


@st.composite
def traceparents(draw: st.DrawFn) -> str:
    shape = draw(st.sampled_from(["valid-ish", "hex", "hostile", "huge"]))
    if shape == "valid-ish":
        parts = [
            draw(st.sampled_from(["00", "01", "ff", "0", "000", "zz", ""])),
            draw(
                st.sampled_from(
                    ["0" * 32, "4bf92f3577b34da6a3ce929d0e0e4736", "4BF92F3577B34DA6A3CE929D0E0E4736"]
                )
            )
            if draw(st.booleans())
            else draw(hex_text),
            draw(st.sampled_from(["0" * 16, "00f067aa0ba902b7"])) if draw(st.booleans()) else draw(hex_text),
            draw(st.sampled_from(["00", "01", "03", "0g", ""])),
        ]
        extra = draw(st.lists(hex_text, max_size=2))
        return "-".join(parts + extra)
    if shape == "hex":
        return draw(hex_text)
    if shape == "hostile":
        return draw(hostile_text)
    return draw(huge_text())


@st.composite
def baggage_values(draw: st.DrawFn) -> str:
    choice = draw(st.integers(0, 5))
    if choice == 0:
        return draw(huge_text())
    if choice == 1:  # percent-encoded bytes, valid UTF-8 or not (controls, surrogates, overlongs)
        raw = draw(st.binary(max_size=30))
        return "".join(f"%{b:02X}" for b in raw)
    if choice == 2:  # hostile text, percent-encoded as a well-behaved sender would
        return "".join(f"%{b:02X}" for b in draw(hostile_text).encode("utf-8"))
    if choice == 3:
        return draw(st.one_of(st.text(alphabet=string.printable, max_size=300), st.integers().map(str)))
    return draw(hostile_text)


@st.composite
def baggage_headers(draw: st.DrawFn) -> str:
    entries = []
    for _ in range(draw(st.integers(0, 12))):
        key = (
            draw(st.sampled_from(IDENTITY_KEYS + TRAINING_KEYS))
            if draw(st.booleans())
            else draw(hostile_text)
        )
        value = draw(baggage_values())
        sep = draw(st.sampled_from(["=", "=", "=", "", "==", " = "]))
        props = draw(st.sampled_from(["", ";prop=1", ";", ";;=;"]))
        entries.append(f"{key}{sep}{value}{props}")
    joiner = draw(st.sampled_from([",", ",", " , ", ",,", ";"]))
    header = joiner.join(entries)
    if len(header) < 20_000 and draw(st.integers(0, 9)) == 0:
        header = header * draw(st.integers(2, 50))  # over every size limit, in entries and bytes
    return header


wrong_types = st.one_of(
    st.none(), st.integers(), st.binary(max_size=20), st.lists(st.text(max_size=5), max_size=3)
)


@st.composite
def carriers(draw: st.DrawFn) -> dict[Any, Any]:
    carrier: dict[Any, Any] = {}
    if draw(st.booleans()):
        carrier[draw(st.sampled_from(["traceparent", "TRACEPARENT", "Traceparent"]))] = draw(traceparents())
    if draw(st.booleans()):
        carrier[draw(st.sampled_from(["baggage", "BAGGAGE", "Baggage"]))] = draw(baggage_headers())
    if draw(st.booleans()):
        carrier[draw(st.sampled_from(["tracestate", "TRACESTATE"]))] = draw(
            st.one_of(hostile_text, huge_text())
        )
    if draw(st.integers(0, 4)) == 0:
        carrier[draw(st.sampled_from(["traceparent", "baggage", "tracestate"]))] = draw(wrong_types)
    for _ in range(draw(st.integers(0, 2))):
        carrier[draw(st.one_of(hostile_text, st.integers(), st.binary(max_size=8)))] = draw(
            st.one_of(hostile_text, wrong_types)
        )
    return carrier


def is_safe_text(value: str) -> bool:
    """What every incoming ID must be now: bounded, no control characters, encodable as UTF-8."""
    if not 0 < len(value) <= MAX_ID_LENGTH or any(unicodedata.category(ch) == "Cc" for ch in value):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: OTLP (protobuf) cannot encode it
        return False
    return True


def is_short_printable(value: str) -> bool:
    """The full promise: also no format characters (bidi overrides, zero-width) or separators."""
    return is_safe_text(value) and value.isprintable()


def assert_identity_is_safe(identity: dict[str, Any], text_ok: Any = is_safe_text) -> None:
    assert set(identity) <= {*IDENTITY_KEYS, *TRAINING_KEYS}, identity
    for key, value in identity.items():
        if key in INT_KEYS:
            assert type(value) is int and 0 <= value <= 10**9, (key, value)
        elif key == "gym.policy.version" and type(value) is int:
            assert abs(value) < 10**18, value
        else:
            assert isinstance(value, str) and text_ok(value), (key, value[:80])


@FUZZ
@given(carrier=carriers())
@example(carrier={"baggage": "gym.policy.version=gym.policy.version=,gym.group.id=g,gym.rollout.id=r"})
def test_extract_never_raises_and_yields_only_safe_identity(carrier: dict[Any, Any]) -> None:
    ctx = propagation.extract(carrier)
    assert isinstance(ctx, otel_context.Context)
    assert_identity_is_safe(propagation.identity_from_context(ctx))


@FUZZ
@given(carrier=carriers(), raise_inside=st.booleans())
def test_attach_always_detaches(carrier: dict[Any, Any], raise_inside: bool) -> None:
    before = otel_context.get_current()
    with pytest.raises(KeyError) if raise_inside else _nothing():
        with propagation.attach(carrier) as ctx:
            assert otel_context.get_current() is ctx
            assert_identity_is_safe(propagation.identity_from_context(ctx))
            if raise_inside:
                raise KeyError("user code failed")
    assert otel_context.get_current() is before


@FUZZ
@given(carrier=carriers())
def test_inject_from_an_extracted_context_round_trips_the_identity(carrier: dict[Any, Any]) -> None:
    ctx = propagation.extract(carrier)
    identity = propagation.identity_from_context(ctx)
    with propagation.attach(carrier):
        out = propagation.inject({}, destination=propagation.GYM_INTERNAL)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in out.items()), out
    again = propagation.identity_from_context(propagation.extract(out))
    assert again == identity


@FUZZ
@given(value=st.one_of(hostile_text, huge_text(), baggage_values()), key=st.sampled_from(IDENTITY_KEYS))
def test_a_single_hostile_identity_value_is_dropped_or_kept_safe(key: str, value: str) -> None:
    for header in (f"{key}={value}", value):
        for carrier in ({"baggage": header}, {"BAGGAGE": header}):
            assert_identity_is_safe(propagation.identity_from_context(propagation.extract(carrier)))


# Known gaps, found by this file, for the propagation hardening to close. strict: once
# fixed they XPASS and fail, so the marker is removed with the fix.


@FUZZ
@example(value="gym.rollout.id=r\udcff")  # BAGGAGE=gym.rollout.id=r\xff in the environment
@given(
    # At least one lone surrogate somewhere, among hostile characters (no filtering needed).
    value=st.tuples(
        st.text(alphabet=hostile_chars, max_size=20),
        surrogates,
        st.text(alphabet=st.one_of(hostile_chars, surrogates), max_size=20),
    ).map("".join)
)
def test_undecodable_environment_bytes_never_raise(value: str) -> None:
    for name in ("BAGGAGE", "TRACEPARENT", "TRACESTATE"):
        with propagation.attach({name: value}) as ctx:
            assert_identity_is_safe(propagation.identity_from_context(ctx))


@FUZZ
@example(value="%E2%80%AEabc")
@given(value=baggage_values())
def test_identity_values_are_printable(value: str) -> None:
    ctx = propagation.extract({"baggage": f"gym.rollout.id={value}"})
    assert_identity_is_safe(propagation.identity_from_context(ctx), text_ok=is_short_printable)


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
