"""A trainer with OpenTelemetry telemetry of its own, in its own process: the span names and
attributes NeMo RL's telemetry emits (``nemo_rl/telemetry/`` and ``docs/observability/span-groups.md``
on NeMo RL's ``rajsin/lens-with-goodput`` branch, commit ce32d4208; ``nemo-rl`` itself cannot be
installed here), on the real OpenTelemetry SDK and nothing of gymtrace's.

One ``rl.grpo.step`` (``rl.iteration``, ``rl.epoch``) holds one ``rl.grpo.collect_rollouts``
rollout batch (``rl.weight_version``, ``rl.target_weight_version``, ``rl.num_generations_per_prompt``,
``rl.num_prompt_groups``: the attributes of the async collector's batch span; an umbrella span, so
no ``rl.bucket``), which asks the gym for ``SAMPLES`` rollouts of each of ``PROMPTS`` prompts, every
request carrying the batch span's ``traceparent`` (what an instrumented HTTP client sends); then
``rl.grpo.policy_update`` (``rl.bucket`` ``productive``). Every span is written to ``SPANS_OUT``,
one ``to_json()`` a line. Two gyms:

- ``python stand_in_trainer.py http GYM_URL SPANS_OUT PROMPTS SAMPLES``: one
  ``GET GYM_URL/rollout?task=P&repeat=N&size=SAMPLES`` a rollout (tests/support/_relay_app.py);
- ``python stand_in_trainer.py nemo-gym HEAD_PORT SPANS_OUT PROMPTS SAMPLES DATA AGENT``: the first
  ``PROMPTS`` rows of ``DATA`` through NeMo Gym's entry points for a trainer that drives it
  (``RolloutCollectionHelper.preprocess_examples(num_repeats=SAMPLES)`` then ``run_examples``, as
  the docstrings of NeMo Gym 0.7.0 name them), against the stack whose head server listens on
  ``HEAD_PORT``; prints NeMo Gym's results, one JSON line a rollout.
"""

from __future__ import annotations

import asyncio
import json
import sys
import urllib.request
from collections.abc import Callable
from typing import Any

from opentelemetry import propagate
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor


def _http(gym_url: str, prompts: int, samples: int) -> None:
    for prompt in range(prompts):
        for sample in range(samples):
            headers: dict[str, str] = {}
            propagate.inject(headers)
            url = f"{gym_url}/rollout?task={prompt}&repeat={sample}&size={samples}"
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers)) as answer:
                answer.read()


def _nemo_gym(head_port: str, prompts: int, samples: int, data: str, agent: str) -> None:
    import aiohttp
    from nemo_gym.rollout_collection import RolloutCollectionHelper
    from nemo_gym.server_utils import BaseServerConfig

    # The trainer's HTTP client instrumentation: the current trace context on every request.
    request = aiohttp.ClientSession._request

    async def traced_request(self: Any, method: str, url: Any, **kwargs: Any) -> Any:
        headers = dict(kwargs.pop("headers", None) or {})
        propagate.inject(headers)
        return await request(self, method, url, headers=headers, **kwargs)

    aiohttp.ClientSession._request = traced_request  # type: ignore[method-assign]
    with open(data, encoding="utf-8") as rows_file:
        examples = [json.loads(rows_file.readline()) for _ in range(prompts)]
    helper = RolloutCollectionHelper()
    rows = helper.preprocess_examples(examples, agent_map={"_default": agent}, num_repeats=samples)

    async def collect() -> None:
        head = BaseServerConfig(host="127.0.0.1", port=int(head_port))
        for future in helper.run_examples(rows, head_server_config=head):
            row, result = await future
            print(
                json.dumps(
                    {key: row.get(key) for key in ("_ng_task_index", "_ng_rollout_index")}
                    | {"reward": result.get("reward")}
                ),
                flush=True,
            )

    asyncio.run(collect())  # copies the context: each request's task starts in the batch span


def main(argv: list[str]) -> int:
    mode, target, spans_out, prompts, samples = argv[0], argv[1], argv[2], int(argv[3]), int(argv[4])
    ask: Callable[[], None]
    if mode == "http":
        ask = lambda: _http(target, prompts, samples)  # noqa: E731 - one line per gym
    else:
        ask = lambda: _nemo_gym(target, prompts, samples, argv[5], argv[6])  # noqa: E731
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
                ask()
            with tracer.start_as_current_span(
                "rl.grpo.policy_update", attributes={"rl.bucket": "productive"}
            ):
                pass
        provider.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
