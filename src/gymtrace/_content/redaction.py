"""Redaction: values under secret-looking keys become ``"[REDACTED]"``, in data and in JSON text."""

from __future__ import annotations

import re
from typing import Final

from gymtrace._content.policy import is_secret_key

__all__ = ["REDACTED", "redact_json_text"]

REDACTED: Final = "[REDACTED]"

# A "key": "value" pair in JSON text, for text too long (or too broken) to parse.
_JSON_PAIR: Final = re.compile(r'"((?:[^"\\]|\\.){1,200})"(\s*:\s*)"(?:[^"\\]|\\.)*"')


def redact_json_text(text: str) -> str:
    def replace_secret(match: re.Match[str]) -> str:
        if is_secret_key(match.group(1)):
            return f'"{match.group(1)}"{match.group(2)}"{REDACTED}"'
        return match.group(0)

    return _JSON_PAIR.sub(replace_secret, text)
