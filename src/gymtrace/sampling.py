"""Head sampling that keeps or drops whole rollouts, consistently in every process.

Example::

    from gymtrace.sampling import RolloutSampler
    gymtrace.configure(sampler=RolloutSampler(0.1, by="task"))   # or GYMTRACE_SAMPLE_RATIO=0.1

The decision for a rollout is a hash of its rollout ID (``by="rollout"``) or of its task ID
(``by="task"``, which keeps or drops a whole GRPO group together). Every span below a rollout
follows the rollout's decision through its parent, across processes too, since the sampled flag
travels in ``traceparent``; a retried attempt or an episode continued hours later from a carrier
is decided by the same hash. Spans outside rollouts (runs, unrelated spans) are always kept.

A dropped rollout still leaves one span, written when it ends: its summary (a ``gym.rollout``
span with ``gym.rollout.detail=false``: outcome, reward, attempts, duration, token totals, the
training keys), kept by the sampler like the outcome records that conclude it, so that
``gymtrace stats``, pass@k and the training figures count every rollout while only the kept ones
have episodes, steps and calls.

``import gymtrace.sampling`` and :func:`keep_rollout` need only opentelemetry-api;
:class:`RolloutSampler` is an SDK sampler and needs the SDK (``pip install 'gymtrace[sdk]'``): it is
loaded on first use, and without the SDK that use raises an ``ImportError`` naming the extra.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gymtrace._model.ids import keep_rollout

if TYPE_CHECKING:
    from gymtrace._sdk.sampler import RolloutSampler

__all__ = ["RolloutSampler", "keep_rollout"]


def __getattr__(name: str) -> Any:
    # RolloutSampler subclasses the SDK's Sampler: loaded when first asked for, so that importing
    # this module (and keep_rollout) works with opentelemetry-api alone.
    if name == "RolloutSampler":
        try:
            from gymtrace._sdk.sampler import RolloutSampler
        except ImportError as exc:
            raise ImportError(
                "gymtrace.sampling.RolloutSampler needs the OpenTelemetry SDK: pip install 'gymtrace[sdk]'"
            ) from exc
        return RolloutSampler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
