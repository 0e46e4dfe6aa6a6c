"""What NeMo Gym's requests and bodies look like: its paths, and Responses API / chat completions
bodies read into function calls, rewards and GenAI attributes (tokens, finish reasons, tool calls).

Separate from the servers and the agent that use it because it is pure reading of NeMo Gym's wire:
no span, no context (tests/test_nemo_gym_wire.py pins it body by body).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from gymtrace import attributes as c

_PREFIX_PATH = re.compile(r"^/ng-rollout/([A-Za-z0-9][A-Za-z0-9._-]*)(/.*)$")
_RUN, _SEED, _VERIFY = "/run", "/seed_session", "/verify"
_MODEL_PATHS = ("/v1/responses", "/v1/chat/completions", "/v1/messages")
_BODY_LIMIT = 4 << 20  # request and response bodies read for identity and reward: NeMo Gym's are small


async def _read_response(response: Any) -> Any:
    """The JSON of an aiohttp response, read once (aiohttp keeps the bytes for NeMo Gym's own read)."""
    body = await response.read()
    return json.loads(body) if body and len(body) <= _BODY_LIMIT else None


def _reward_of(result: Any) -> float | None:
    reward = result.get("reward") if isinstance(result, Mapping) else None
    if isinstance(reward, bool) or not isinstance(reward, (int, float)):
        return None
    return float(reward)


def _function_calls(body: Any) -> list[tuple[str, str]]:
    """The (name, call ID) of each function call a Responses API or chat completions body asks for."""
    calls: list[tuple[str, str]] = []
    if not isinstance(body, Mapping):
        return calls
    for item in body.get("output") or ():
        if isinstance(item, Mapping) and item.get("type") == "function_call":
            name, call_id = item.get("name"), item.get("call_id")
            if isinstance(name, str) and isinstance(call_id, str):
                calls.append((name, call_id))
    for choice in body.get("choices") or ():
        message = choice.get("message") if isinstance(choice, Mapping) else None
        for call in (message.get("tool_calls") or ()) if isinstance(message, Mapping) else ():
            function = call.get("function") if isinstance(call, Mapping) else None
            name = function.get("name") if isinstance(function, Mapping) else None
            call_id = call.get("id") if isinstance(call, Mapping) else None
            if isinstance(name, str) and isinstance(call_id, str):
                calls.append((name, call_id))
    return calls


def _usage_attributes(body: Any) -> dict[str, Any]:
    """GenAI attributes of a Responses API or chat completions response body: tokens (input,
    output, cached, reasoning), response ID, finish reasons, the tool call IDs it asks for."""
    out: dict[str, Any] = {}
    if not isinstance(body, Mapping):
        return out
    response_id, model = body.get("id"), body.get("model")
    if isinstance(response_id, str):
        out[c.GEN_AI_RESPONSE_ID] = response_id
    if isinstance(model, str):
        out[c.GEN_AI_RESPONSE_MODEL] = model
    usage = body.get("usage")
    if isinstance(usage, Mapping):
        responses_api = "input_tokens" in usage
        pairs = (
            (c.GEN_AI_USAGE_INPUT_TOKENS, "input_tokens" if responses_api else "prompt_tokens", None),
            (c.GEN_AI_USAGE_OUTPUT_TOKENS, "output_tokens" if responses_api else "completion_tokens", None),
            (
                c.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,
                "input_tokens_details" if responses_api else "prompt_tokens_details",
                "cached_tokens",
            ),
            (
                c.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS,
                "output_tokens_details" if responses_api else "completion_tokens_details",
                "reasoning_tokens",
            ),
        )
        for attribute, key, inner in pairs:
            value = usage.get(key)
            if inner is not None:
                value = value.get(inner) if isinstance(value, Mapping) else None
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                out[attribute] = value
    reasons: list[str] = []
    if isinstance(body.get("output"), list):  # Responses API: a status, and why it is incomplete
        details = body.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, Mapping) else None
        if isinstance(reason, str):
            reasons.append(reason)
        elif any(isinstance(i, Mapping) and i.get("type") == "function_call" for i in body["output"]):
            reasons.append("tool_calls")
        elif body.get("status") == "completed":
            reasons.append("stop")
    for choice in body.get("choices") or ():
        reason = choice.get("finish_reason") if isinstance(choice, Mapping) else None
        if isinstance(reason, str):
            reasons.append(reason)
    if reasons:
        out[c.GEN_AI_RESPONSE_FINISH_REASONS] = reasons
    call_ids = [call_id for _, call_id in _function_calls(body)]
    if call_ids:
        out[c.GEN_AI_RESPONSE_TOOL_CALL_IDS] = call_ids
    return out
