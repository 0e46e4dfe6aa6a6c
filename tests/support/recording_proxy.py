"""A loopback HTTP server that is both a forward proxy and an origin, and records every request's
headers (run in its own process by tests/test_identity_matrix.py).

The identity tests have no internet: a client reaches a "public" host (``http://api.openai.com``)
or a gym host by name (``http://env-1.gym.internal``) through this server as its HTTP proxy, so the
URL the client, and every gymtrace rule, sees is the real one, while the request ends here. It
answers every request itself (no upstream): ``.../chat/completions`` like the OpenAI API, anything
else with ``{"ok": true}``. Requests sent to it directly (origin-form, a loopback model upstream)
are recorded the same way. ``GET /__records__`` (direct) returns what was recorded, in order, as
``{"url", "proxied", "headers"}`` objects with lower-cased header names.

Usage: ``python recording_proxy.py`` prints the port it listens on (127.0.0.1) and serves until
it is terminated.
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

RECORDS: list[dict[str, Any]] = []
_LOCK = threading.Lock()

COMPLETION = {
    "id": "chatcmpl-matrix",
    "object": "chat.completion",
    "created": 1,
    "model": "matrix-model",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "42"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the clients expect of a proxy

    def _answer(self, body: object, status: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        proxied = self.path.startswith(("http://", "https://"))
        if not proxied and self.path == "/__records__":
            with _LOCK:
                self._answer(list(RECORDS))
            return
        url = self.path if proxied else f"http://{self.headers.get('Host', '')}{self.path}"
        record = {
            "url": url,
            "proxied": proxied,
            # Repeated headers are joined, as a receiver's framework would show them.
            "headers": {k.lower(): ", ".join(self.headers.get_all(k) or []) for k in self.headers},
        }
        with _LOCK:
            RECORDS.append(record)
        self._answer(COMPLETION if self.path.split("?", 1)[0].endswith("/chat/completions") else {"ok": True})

    do_GET = _handle
    do_POST = _handle

    def log_message(self, format: str, *args: Any) -> None:
        return


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
