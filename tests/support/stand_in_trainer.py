"""A trainer with OpenTelemetry telemetry of its own, in its own process: the span names and
attributes NeMo RL's telemetry emits (``nemo_rl/telemetry/`` and ``docs/observability/span-groups.md``
on NeMo RL's ``rajsin/lens-with-goodput`` branch, commit ce32d4208; ``nemo-rl`` itself cannot be
installed here), on the real OpenTelemetry SDK and nothing of gymtrace's.

``python stand_in_trainer.py GYM_URL SPANS_OUT PROMPTS SAMPLES``: one ``rl.grpo.step`` (``rl.iteration``,
``rl.epoch``) holding one ``rl.grpo.collect_rollouts`` rollout batch (``rl.weight_version``,
``rl.target_weight_version``, ``rl.num_generations_per_prompt``, ``rl.num_prompt_groups``, the attributes
of the async collector's batch span; an umbrella span, so no ``rl.bucket``), which asks the gym
for ``SAMPLES`` rollouts of each of ``PROMPTS`` prompts, one HTTP request each carrying the batch
span's ``traceparent`` (what an instrumented HTTP client sends); then ``rl.grpo.policy_update``
(``rl.bucket`` ``productive``). Every span is written to ``SPANS_OUT``, one ``to_json()`` a line.
"""

from __future__ import annotations

import sys
import urllib.request

from opentelemetry import propagate
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor


def main(gym_url: str, spans_out: str, prompts: int, samples: int) -> int:
    with open(spans_out, "w", encoding="utf-8") as out:
        provider = TracerProvider(resource=Resource.create({"service.name": "nemo-rl-stand-in"}))
        exporter = ConsoleSpanExporter(out=out, formatter=lambda span: span.to_json(indent=None) + "\n")
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        tracer = provider.get_tracer("nemo_rl.telemetry")
        with tracer.start_as_current_span("rl.grpo.step", attributes={"rl.iteration": 1, "rl.epoch": 1}):
            batch = {
                "rl.weight_version": 0,
                "rl.target_weight_version": 1,
                "rl.num_generations_per_prompt": samples,
                "rl.num_prompt_groups": prompts,
            }
            with tracer.start_as_current_span("rl.grpo.collect_rollouts", attributes=batch):
                for prompt in range(prompts):
                    for sample in range(samples):
                        headers: dict[str, str] = {}
                        propagate.inject(headers)
                        url = f"{gym_url}/rollout?task={prompt}&repeat={sample}&size={samples}"
                        with urllib.request.urlopen(urllib.request.Request(url, headers=headers)) as answer:
                            answer.read()
            with tracer.start_as_current_span(
                "rl.grpo.policy_update", attributes={"rl.bucket": "productive"}
            ):
                pass
        provider.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
