"""IdentitySpanProcessor: gym identity on spans that other libraries start inside gym scopes."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry import context as otel_context

from gymtrace import _constants as c
from gymtrace._identity.carriers import identity_from_context
from gymtrace._model.errors import guard
from gymtrace._otel_private.spanfields import SkipsOwnSpans, attribute_dict
from gymtrace._scopes import training as _training
from gymtrace._scopes.active_scope import SCOPE_KEY, ActiveScope

_ON_START_GUARD = guard("IdentitySpanProcessor.on_start")

# Extra attributes derived from the identity (NeMo Gym's names, when
# gymtrace.integrations.nemo_gym.instrument(aliases=True) asks for them); None: none.
_aliases: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None


def set_aliases(derive: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None) -> None:
    global _aliases
    _aliases = derive
    # Aliases are derived for gymtrace's own spans too: none may skip the general path then.
    IdentitySpanProcessor.skip_own = derive is None


class IdentitySpanProcessor(SkipsOwnSpans):
    """Stamps ``gym.run.id``, ``gym.rollout.id``, ``gym.episode.attempt``, ... onto every span
    started in a gym scope, including spans of HTTP clients and model SDKs. Outside any gym scope
    it takes the identity from the W3C baggage of the span's parent context (validated, and only
    as far as ``GYMTRACE_TRUST_IDENTITY`` believes it), so spans of a process that received a
    propagated context carry it too.

    ``gymtrace.configure()`` installs it. With a ``TracerProvider`` of your own, add it yourself::

        provider.add_span_processor(gymtrace.IdentitySpanProcessor())

    It implements the SDK's ``SpanProcessor`` interface by duck typing, so gymtrace's
    instrumentation does not import the SDK.
    """

    def start_other(self, span: Any, parent_context: otel_context.Context | None = None) -> None:
        # on_start (SkipsOwnSpans) has returned already for gymtrace's own spans.
        with _ON_START_GUARD:
            ctx = parent_context if parent_context is not None else otel_context.get_current()
            frame = ctx.get(SCOPE_KEY)
            # No gym scope in this process yet: an HTTP server span that the official ASGI
            # instrumentation starts from the extracted headers, before gymtrace's middleware runs,
            # has only the propagated baggage, believed per the trust setting.
            identity = frame.identity if isinstance(frame, ActiveScope) else identity_from_context(ctx)
            derive = _aliases
            if not identity and derive is None:
                return
            # The SDK span's plain dict when it has one: ``span.attributes`` wraps it twice, and
            # ``in`` on the wrapper runs Python-level Mapping code on every span (~0.5 µs).
            plain = attribute_dict(span)
            attributes = plain if plain is not None else span.attributes
            if attributes is not None and c.KIND in attributes:
                # A gymtrace span: it was started with its identity.
                if derive is not None:
                    span.set_attributes(derive(attributes))
                return
            if not identity:
                return
            version = _training.version
            if version is not None and c.ROLLOUT_ID in identity:
                # Below a rollout: the process's policy version as this span starts.
                identity = {**identity, c.POLICY_VERSION: version}
            span.set_attributes(identity)
            if derive is not None:
                span.set_attributes(derive(identity))

    def _on_ending(self, span: Any) -> None:
        return None

    def on_end(self, span: Any) -> None:
        return None

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
