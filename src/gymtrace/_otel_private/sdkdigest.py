"""Which SDK the lean span path was built for: the span's field set and the SDK code's digests.

Separate from the span and the tracer because it is the part a new OpenTelemetry release touches:
a release whose span has another field, or whose ``Span``/``ReadableSpan``/``Tracer.start_span``/
``BoundedAttributes`` code differs from the digests in :data:`_BUILT_FOR`, gets the SDK's own spans
until its code is read and its digest added here.
"""

from __future__ import annotations

import hashlib
from typing import Any

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk import trace as sdk_trace

# Every field a lean span gets, set by _lean_span below: exactly the fields the SDK's own span has in
# the releases this module was built for. A release with one more (or one fewer) is not the span
# this module builds, whatever its methods look like (issue 31: a new field that end() read passed a
# check for the known ones, and AttributeError came out of the user's `with`).
_LEAN_FIELDS: frozenset[str] = frozenset(
    {
        "_name",
        "_context",
        "_kind",
        "_instrumentation_info",
        "_instrumentation_scope",
        "_parent",
        "_start_time",
        "_end_time",
        "_attributes",
        "_events",
        "_links",
        "_resource",
        "_status",
        "_sampler",
        "_trace_config",
        "_record_exception",
        "_set_status_on_exception",
        "_span_processor",
        "_limits",
        "_lock",
        "_record_end_metrics",
    }
)


def _code_names(code: Any) -> set[str]:
    """The names a code object and the code nested in it use: attributes, globals, locals (not the
    compiler's own, such as a comprehension's ``.0``, which CPython 3.12 no longer makes)."""
    names = {name for name in (*code.co_names, *code.co_varnames) if not name.startswith(".")}
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _code_names(const)
    return names


def _functions(owner: Any) -> dict[str, Any]:
    """The functions a class defines itself (properties by their getter and setter), by name."""
    found = {}
    for name, member in vars(owner).items():
        for suffix, function in (("", member), (".fget", getattr(member, "fget", None))):
            function = getattr(function, "__func__", function)  # static and class methods
            if hasattr(function, "__code__"):
                found[name + suffix] = function
        setter = getattr(member, "fset", None)
        if hasattr(setter, "__code__"):
            found[name + ".fset"] = setter
    return found


def code_fingerprint(owner: Any, only: tuple[str, ...] = ()) -> str:
    """A digest of the code of ``owner``'s own methods (or of the ``only`` ones): per method, its
    name, argument count and the sorted names it uses. The same across CPython 3.10 to 3.13 for
    the same source (names come from the source, not the bytecode), different as soon as a method
    uses another field or calls another method."""
    functions = _functions(owner)
    lines = []
    for name in sorted(only or functions):
        function = functions.get(name)
        if function is None:
            lines.append(f"{name}: missing")
            continue
        code = function.__code__
        lines.append(
            f"{name}({code.co_argcount},{code.co_kwonlyargcount}): {' '.join(sorted(_code_names(code)))}"
        )
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


# What the lean path was built for: the code of the SDK classes a lean span runs (its methods come
# from Span and ReadableSpan) and of what it stands in for (Tracer.start_span builds the span it
# replaces; BoundedAttributes is filled field by field), by digest, one per SDK release whose code
# differs. The span fields alone cannot tell a release whose end() reads a field set elsewhere, or
# calls a new method. A release not listed here gets the SDK's own spans (one INFO line at
# configure(); tests/test_fast_paths.py fails naming the class), until its code is read and added.
#   python -c "from gymtrace._otel_private.sdkdigest import sdk_code; print(sdk_code())"
_BUILT_FOR: dict[str, frozenset[str]] = {
    # opentelemetry-sdk 1.45.0 and 1.45.1 (the same code), CPython 3.10, 3.11, 3.12 and 3.13.
    "Span": frozenset({"bf3c30d9bf2065b8"}),
    "ReadableSpan": frozenset({"b9f63c4902ddb0b6"}),
    "Tracer.start_span": frozenset({"84a7917195e503d1"}),
    "BoundedAttributes": frozenset({"65f08795021f2043"}),
}


def sdk_code() -> dict[str, str]:
    """The digests of this SDK's code that :data:`_BUILT_FOR` is checked against."""
    return {
        "Span": code_fingerprint(sdk_trace.Span),
        "ReadableSpan": code_fingerprint(sdk_trace.ReadableSpan),
        "Tracer.start_span": code_fingerprint(sdk_trace.Tracer, ("start_span",)),
        "BoundedAttributes": code_fingerprint(BoundedAttributes),
    }


def _span_fields_present() -> list[str]:
    probe = sdk_trace.TracerProvider().get_tracer("gymtrace.probe")
    span: Any = probe.start_span("probe")
    span.end()
    present = set(vars(span))
    # Exactly the fields the lean path sets: one more is a field the SDK's methods may read that a
    # lean span would not have.
    missing = [f"sdk Span.{name}" for name in sorted(_LEAN_FIELDS - present)]
    missing += [f"sdk Span field not built for: {name}" for name in sorted(present - _LEAN_FIELDS)]
    if type(span) is not getattr(sdk_trace, "_Span", None) or _functions(type(span)):
        missing.append("opentelemetry.sdk.trace._Span (the SDK's span class, adding nothing to Span)")
    missing += [
        f"sdk {part}'s code (digest {digest}, built for {', '.join(sorted(_BUILT_FOR[part]))})"
        for part, digest in sdk_code().items()
        if digest not in _BUILT_FOR[part]
    ]
    if not hasattr(span._attributes, "_dict"):
        missing.append("BoundedAttributes._dict")
    return missing


try:
    _MISSING_SPAN_FIELDS = _span_fields_present()
except Exception as exc:  # noqa: BLE001 - an SDK we do not know: keep the SDK's path
    _MISSING_SPAN_FIELDS = [f"sdk Span fields ({type(exc).__name__}: {exc})"]
