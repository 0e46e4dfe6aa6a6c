"""The encoder process: records from its stdin into a ``BatchExporter``, its counts to its stdout.

Separate from the application's side (``export_process``, ``export_pipe``): this is all the child
runs, and the frame format both sides share.
"""

from __future__ import annotations

import contextlib
import json
import logging
import marshal
import os
import select
import signal
import sys
from typing import Any

from gymtrace._model import environment as env
from gymtrace._otel_private.records import _Rebuilder
from gymtrace._sdk.export import BatchExporter
from gymtrace._sdk.export_targets import file_exporter, otlp_exporter

_HEADER = 4  # frame length, little-endian
# Frame kinds, both directions.
_SPANS, _FLUSH, _SHUTDOWN, _STATS = 0, 1, 2, 3
_STAT_FIELDS = ("exported", "dropped_queue_full", "dropped_export_failed", "retries")


def _frame(message: Any) -> bytes:
    data = marshal.dumps(message)
    return len(data).to_bytes(_HEADER, "little") + data


def build_exporter(target: dict[str, Any]) -> Any:
    """The exporter ``target`` describes (see ``_sdk.setup._processors``)."""
    if target["kind"] == "file":
        return file_exporter(target["path"], target["line_spans"], target["compress"], target["rotate_bytes"])
    return otlp_exporter(target["protocol"], target.get("endpoint"), target.get("headers"))


def child_main() -> None:
    """The encoder process: records from stdin into a :class:`BatchExporter`; counts to stdout."""
    # The application's exit hooks decide when this process stops (shutdown, or the end of the
    # pipe): a Ctrl-C or SIGTERM for the application's process group is not for it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(format="%(message)s", level=logging.WARNING)
    config = json.loads(os.environ.pop(env.GYMTRACE_ENCODER_CONFIG))
    queue = BatchExporter(build_exporter(config["target"]), **config["queue"], encode_on_end=False)
    rebuild = _Rebuilder()
    stdin, out = sys.stdin.fileno(), sys.stdout.buffer
    parent = os.getppid()
    sent: tuple[int, ...] = ()
    shutdown_sequence = 0

    def counts() -> tuple[int, ...]:
        stats = queue.stats()
        return tuple(getattr(stats, name) for name in _STAT_FIELDS)

    def report(sequence: int = 0, ok: bool = True) -> tuple[int, ...]:
        values = counts()
        out.write(_frame((_STATS, sequence, ok, values)))
        out.flush()
        return values

    stop_timeout = queue.shutdown_timeout
    # Ready: the imports are done (a fresh virtualenv compiles them first: seconds). Until this
    # first report arrives, the application's side lets frames wait for the pipe (_STARTING_ROOM).
    sent = report()
    try:
        while True:
            ready, _, _ = select.select([stdin], [], [], 0.1)
            if not ready:
                if os.getppid() != parent:
                    break  # the application's process is gone and something else holds the pipe
                if counts() != sent:
                    sent = report()
                continue
            message = _read_frame(stdin)
            if message is None:
                break  # the application's process closed the pipe, or died: deliver and stop
            kind = message[0]
            if kind == _SPANS:
                _, resources, scopes, records = message
                rebuild.define(resources, scopes)
                for record in records:
                    queue.on_end(rebuild.span(record))
            elif kind == _FLUSH:
                sent = report(message[1], queue.force_flush(message[2]))
            elif kind == _SHUTDOWN:
                shutdown_sequence, stop_timeout = message[1], message[2] / 1000
                break
    finally:
        # Delivered, or counted: the application logs the totals, this process only reports them.
        logging.getLogger("gymtrace").setLevel(logging.ERROR)
        queue.shutdown(int(stop_timeout * 1000))
        with contextlib.suppress(OSError):  # nobody is reading any more
            report(shutdown_sequence)


def _read_frame(fd: int) -> Any:
    """The next message :func:`_frame` wrote to ``fd``, or None at the end of the pipe."""
    header = _read_exactly(fd, _HEADER)
    body = None if header is None else _read_exactly(fd, int.from_bytes(header, "little"))
    return None if body is None else marshal.loads(body)


def _read_exactly(fd: int, size: int) -> bytes | None:
    """``size`` bytes from ``fd`` (unbuffered: ``select`` must see what is unread), or None at
    the end of the pipe."""
    chunks = []
    while size:
        chunk = os.read(fd, size)
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)
