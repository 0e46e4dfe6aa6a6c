"""A fake OpenAI-compatible Responses API upstream for the NeMo Gym stack tests, in its own process.

``python fake_responses_upstream.py PORT_FILE HEADERS_FILE [FAIL_FLAG_FILE [HANG_FLAG_FILE]]`` listens on an ephemeral
loopback port (written to PORT_FILE), appends each request's headers to HEADERS_FILE as a JSON line,
and answers ``POST /v1/responses`` deterministically: a ``get_weather`` call for a question without
"humidity" (reward 1 once the tool answered), a plain message otherwise (reward 0), and a message
after a tool output; for ``example_multi_step``'s tools, the sequence in ``_multi_step``. While
FAIL_FLAG_FILE exists, a question containing "going out" is answered with HTTP 400, so that rollout
fails until the test removes the flag, and ``example_multi_step``'s task 1 ("hot climates") gets
extraction arguments that are not JSON, so its verify raises; while HANG_FLAG_FILE exists, the
first model call of a question containing "outside" (task 3) waits until it is removed.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_lock = threading.Lock()


def _response(output: list[dict[str, Any]], model: str) -> dict[str, Any]:
    return {
        "id": f"resp_{time.monotonic_ns()}",
        "created_at": time.time(),
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "metadata": {},
        "model": model,
        "object": "response",
        "output": output,
        "parallel_tool_calls": True,
        "temperature": 1.0,
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "status": "completed",
        "usage": {
            "input_tokens": 10,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 5,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 15,
        },
    }


def _call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": f"fc_{time.monotonic_ns()}",
        "call_id": f"call_{time.monotonic_ns()}",
        "type": "function_call",
        "name": name,
        "arguments": json.dumps(arguments),
        "status": "completed",
    }


def _multi_step(items: list[Any], model: str, malformed: bool = False) -> dict[str, Any]:
    """example_multi_step's tools: one lookup, then two lookups in one response (parallel tool
    calls), then the extraction, then a message: 4 model calls and 4 tool calls a rollout."""
    text = " ".join(str(i.get("content")) for i in items if isinstance(i, dict) and "role" in i)
    synonyms = re.findall(r"has a synonym '([^']+)'", text) or ["a", "b", "c"]
    outputs = [i for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"]
    if not outputs:
        return _response([_call("get_synonym_value", {"synonym": synonyms[0]})], model)
    if len(outputs) == 1:
        return _response(
            [_call("get_synonym_value", {"synonym": s}) for s in (synonyms + synonyms)[1:3]], model
        )
    if len(outputs) == 3:
        values = [json.loads(o["output"]).get("synonym_value", 0) for o in outputs]
        call = _call("extract_synonym_values", {"synonym_values": values})
        if malformed:
            call["arguments"] = "{not json"  # example_multi_step's verify json.loads it: it raises
        return _response([call], model)
    return _response([_message("Done.")], model)


def _answer(body: dict[str, Any], malformed: bool = False) -> dict[str, Any]:
    items = body.get("input") or []
    model = str(body.get("model") or "fake-model")
    tools = {t.get("name") for t in body.get("tools") or () if isinstance(t, dict)}
    if "get_synonym_value" in tools and isinstance(items, list):
        return _multi_step(items, model, malformed)
    last = items[-1] if isinstance(items, list) and items else None
    if isinstance(last, dict) and last.get("type") == "function_call_output":
        return _response([_message("It is sunny in San Francisco.")], model)
    question = " ".join(
        str(item.get("content")) for item in items if isinstance(item, dict) and item.get("role") == "user"
    )
    if "humidity" in question:
        return _response([_message("I cannot tell.")], model)
    call = {
        "id": f"fc_{time.monotonic_ns()}",
        "call_id": f"call_{time.monotonic_ns()}",
        "type": "function_call",
        "name": "get_weather",
        "arguments": json.dumps({"city": "San Francisco"}),
        "status": "completed",
    }
    return _response([call], model)


def _message(text: str) -> dict[str, Any]:
    return {
        "id": f"msg_{time.monotonic_ns()}",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def main() -> None:
    port_file, headers_file = sys.argv[1], sys.argv[2]
    fail_flag = sys.argv[3] if len(sys.argv) > 3 else None
    hang_flag = sys.argv[4] if len(sys.argv) > 4 else None

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length") or 0))
            with _lock, open(headers_file, "a", encoding="utf-8") as f:
                f.write(json.dumps({"path": self.path, "headers": dict(self.headers.items())}) + "\n")
            body = json.loads(raw or b"{}")
            question = json.dumps(body.get("input"))
            if (
                hang_flag
                and os.path.exists(hang_flag)
                and "outside" in question
                and "function_call_output" not in question
            ):
                # A model that hangs on task 3's first call until the flag is removed; ".seen" says
                # a request is hanging.
                with open(hang_flag + ".seen", "a") as seen:
                    seen.write("hung\n")
                while os.path.exists(hang_flag):
                    time.sleep(0.1)
            if fail_flag and os.path.exists(fail_flag) and "going out" in question:
                self._send(400, {"error": {"message": "injected failure", "type": "invalid_request_error"}})
                return
            malformed = bool(fail_flag and os.path.exists(fail_flag) and "hot climates" in question)
            self._send(200, _answer(body, malformed))

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    class Server(ThreadingHTTPServer):
        # socketserver's listen backlog is 5: a model server opening a connection per request
        # overflowed it, and the kernel's SYN retransmits (1, 2, 4, ... 32 s) then stretched a
        # 200-rollout run from 26 s to over 2 minutes (nstat's ListenOverflows counted them).
        request_queue_size = 1024

    server = Server(("127.0.0.1", 0), Handler)
    with open(port_file + ".tmp", "w") as f:
        f.write(str(server.server_address[1]))
    os.replace(port_file + ".tmp", port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
