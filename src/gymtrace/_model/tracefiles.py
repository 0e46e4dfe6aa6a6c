"""Trace files on disk: one naming rule for the writer and every reader, segments written one
whole compressed block at a time, and read back as lines whatever their compression.

``traces.jsonl`` with ``GYMTRACE_FILE_COMPRESS=gzip`` is written as ``traces.jsonl.gz`` until it
holds ``GYMTRACE_FILE_ROTATE_MB``, then ``traces.000001.jsonl.gz``, ...; a child process writes
``traces.pid-4242.jsonl.gz``, ... (:func:`child_path`). :func:`trace_files` finds them all.

Every export is one gzip member (zstd frame) appended in one write, so the segment being written is
readable at every moment, a process killed mid-write leaves at most its last member cut short
(:func:`open_lines` skips it with a warning), and a reader can start at any member: two processes
read one big file from either side of one (:func:`member_start`). No segment is ever renamed: the
writers of one file (the export thread, the encoder process, a forked child) each move on when the
segment is full, and agree on the next one without talking to each other.
"""

from __future__ import annotations

import io
import os
import re
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gymtrace._model import environment as env

Warn = Callable[[str], None]

# zlib level 1: within a few percent of level 6's size on these repetitive lines, at a fraction of
# its time (benchmarks/file_size.py prints both).
_GZIP_LEVEL = 1
_ZSTD_LEVEL = 3
_SEGMENT = re.compile(r"\.([0-9]{6})$")
_READ_BLOCK = 1 << 20
_COMPRESSION_OF_SUFFIX = {suffix: name for name, suffix in env.COMPRESSED_SUFFIXES.items()}
_COMPRESSED = "(?:" + "|".join(map(re.escape, env.COMPRESSED_SUFFIXES.values())) + ")?"
_ZSTD_HINT = "zstd needs Python 3.14 or the zstandard package: pip install 'gymtrace[zstd]'"
# How every request gymtrace (and the Collector's file exporter) writes begins. JSON text holds it
# only there: inside a string its quotes would be escaped.
REQUEST_START = b'{"resourceSpans":'
# How a gzip member (its magic number and deflate) and a zstd frame (its magic number) begin.
_MEMBER_MAGIC = {env.COMPRESS_GZIP: b"\x1f\x8b\x08", env.COMPRESS_ZSTD: b"\x28\xb5\x2f\xfd"}
# How far past a byte a reader looks for the next member to cut a compressed file at, and the most
# it decompresses of one to know it is one: gymtrace writes an export a member (~30 KB of ~0.5 MB
# of lines at 512 spans); a file compressed whole (one member) has none to cut at.
_MEMBER_SEARCH = 64 << 20
_MEMBER_LIMIT = 64 << 20


# A byte range of a file, [start, end), that starts at the start of a line of a plain file, or where
# a gzip member (zstd frame) of a compressed one starts and ends (a reader splits a big file between
# processes: see ``_read.source.halves``); None: the whole file.
Part = tuple[int, int] | None


class TraceFileError(ValueError):
    """A file of OTLP/JSON lines could not be read; the message names the file and line."""


# -- the naming rule ------------------------------------------------------------------------------


def compression_of(path: str | os.PathLike[str]) -> str | None:
    """The compression a file's name says (``.gz``: gzip, ``.zst``: zstd), or None."""
    return _COMPRESSION_OF_SUFFIX.get(Path(path).suffix)


def _parts(name: str) -> tuple[str, int, str, str]:
    """A trace file's name as (stem, segment, suffix, compression suffix):
    ``traces.000002.jsonl.gz`` is ``("traces", 2, ".jsonl", ".gz")``."""
    compressed = next((s for s in _COMPRESSION_OF_SUFFIX if name.endswith(s)), "")
    name = name[: len(name) - len(compressed)]
    suffix = env.TRACE_SUFFIX if name.endswith(env.TRACE_SUFFIX) else Path(name).suffix
    stem = name[: len(name) - len(suffix)]
    segment = _SEGMENT.search(stem)
    if segment is None:
        return stem, 0, suffix, compressed
    return stem[: segment.start()], int(segment.group(1)), suffix, compressed


def segment_path(path: str | os.PathLike[str], segment: int, compression: str) -> Path:
    """Segment ``segment`` of the file configured as ``path``, compressed as ``compression`` (a
    suffix of ``path`` that names a compression wins): segment 0 is ``path`` itself."""
    p = Path(path)
    stem, _, suffix, compressed = _parts(p.name)
    if not compressed:
        compressed = env.COMPRESSED_SUFFIXES.get(compression, "")
    number = f".{segment:06d}" if segment else ""
    return p.with_name(f"{stem}{number}{suffix}{compressed}")


def first_segment(path: str | os.PathLike[str]) -> Path:
    """The name a file's segments are found by: ``traces.000003.jsonl.gz`` -> ``traces.jsonl``."""
    p = Path(path)
    stem, _, suffix, _ = _parts(p.name)
    return p.with_name(stem + suffix)


def child_path(path: str, pid: int) -> str:
    """The file a child process writes when its parent writes ``path`` (processes appending to one
    file could interleave their lines): ``traces.jsonl`` -> ``traces.pid-{pid}.jsonl``."""
    p = Path(path)
    stem, _, suffix, compressed = _parts(p.name)
    return str(p.with_name(f"{stem}{env.CHILD_TAG}{pid}{suffix}{compressed}"))


def _order(p: Path) -> tuple[str, str, int, str]:
    # A file's segments in their order (segment 0 first, 000010 after 000009), beside its children.
    stem, segment, suffix, compressed = _parts(p.name)
    return str(p.parent), stem + suffix, segment, compressed


def _is_trace_file(name: str) -> bool:
    return _parts(name)[2] == env.TRACE_SUFFIX


def trace_files(
    path: str | os.PathLike[str], warn: Warn | None = None, *, children: bool = False
) -> list[Path]:
    """The files that hold what was written to ``path``, in order.

    A directory (``GYMTRACE_FILE=DIR/``): every ``*.jsonl``, ``*.jsonl.gz`` and ``*.jsonl.zst``
    file in it (another file is named to ``warn`` and skipped; hidden files are left alone). A file
    name: its segments, whatever their compression (``traces.jsonl`` or ``traces.jsonl.gz`` names
    ``traces.jsonl``, ``traces.jsonl.gz``, ``traces.000001.jsonl.gz``, ...) and, with ``children``,
    its child processes' files and their segments. When none exists, ``[path]`` (opening it
    says so)."""
    p = Path(path)
    if p.is_dir():
        files = []
        for f in p.iterdir():
            if f.name.startswith(".") or not f.is_file():
                continue
            if _is_trace_file(f.name):
                files.append(f)
            elif warn is not None:
                warn(f"{f}: not a trace file (*.jsonl, *.jsonl.gz, *.jsonl.zst), skipped")
        return sorted(files, key=_order)
    stem, segment, suffix, _ = _parts(p.name)
    segments = r"(?:\.[0-9]{6})?" if not segment else ""
    own = re.escape(f"{stem}.{segment:06d}" if segment else stem)
    pids = rf"(?:{re.escape(env.CHILD_TAG)}[0-9]+)*" if children else ""
    rule = re.compile(f"{own}{pids}{segments}{re.escape(suffix)}{_COMPRESSED}")
    try:
        found = [f for f in p.parent.iterdir() if rule.fullmatch(f.name) and f.is_file()]
    except OSError:
        found = []
    return sorted(found, key=_order) or [p]


def trace_files_of(names: Iterable[str | os.PathLike[str]], warn: Warn | None = None) -> list[Path]:
    """Every file the names given stand for (:func:`trace_files` of each), each once however many
    names cover it (``gymtrace stats traces*`` names a file and its segments; a list this made,
    given again, is itself)."""
    return list(dict.fromkeys(f for name in names for f in trace_files(name, warn)))


# -- writing --------------------------------------------------------------------------------------


def _zstd() -> Any:
    """The zstd module: the standard library's (Python 3.14) or ``zstandard``; None if neither."""
    try:
        from compression import zstd  # type: ignore[import-not-found, unused-ignore]

        return zstd
    except ImportError:
        pass
    try:
        import zstandard
    except ImportError:
        return None
    return zstandard


def zstd_available() -> bool:
    return _zstd() is not None


def compressor(compression: str) -> Callable[[bytes], bytes] | None:
    """What makes one whole gzip member or zstd frame of a block of lines (None: written plain)."""
    if compression == env.COMPRESS_GZIP:

        def gzip_member(data: bytes) -> bytes:
            # wbits 31: a gzip member (header and CRC). zlib releases the GIL while it compresses.
            packer = zlib.compressobj(_GZIP_LEVEL, zlib.DEFLATED, 31)
            return packer.compress(data) + packer.flush()

        return gzip_member
    if compression == env.COMPRESS_ZSTD:
        module = _zstd()
        if module is None:
            raise ImportError(_ZSTD_HINT)
        if module.__name__ == "zstandard":
            # A compressor is not for two threads at once, and costs little to make.
            def zstd_frame(data: bytes) -> bytes:
                frame: bytes = module.ZstdCompressor(level=_ZSTD_LEVEL).compress(data)
                return frame

            return zstd_frame

        def stdlib_frame(data: bytes) -> bytes:
            frame: bytes = module.compress(data, level=_ZSTD_LEVEL)
            return frame

        return stdlib_frame
    return None


class SegmentWriter:
    """Appends whole blocks to the segments of ``path`` (see the module's docstring), moving to the
    next segment once the one being written holds ``rotate_bytes`` (0: never). Not thread-safe:
    its owner serialises the writes."""

    def __init__(self, path: str, compression: str, rotate_bytes: int) -> None:
        self.path = path
        self.compression = compression_of(path) or compression
        self.rotate_bytes = rotate_bytes
        self.segment = 0
        self._file: Any = None

    def write(self, data: bytes) -> None:
        if self._file is None:
            self._open(self.segment)
        elif self.rotate_bytes and os.fstat(self._file.fileno()).st_size >= self.rotate_bytes:
            self._open(self.segment + 1)
        # Unbuffered and O_APPEND: one write() system call lands whole after every other writer's,
        # and a partial write is finished here.
        view = memoryview(data)
        while view:
            view = view[self._file.write(view) :]

    def _open(self, segment: int) -> None:
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        while True:
            target = segment_path(self.path, segment, self.compression)
            # A full segment (another writer of this file moved on, or an earlier run's) is passed.
            try:
                full = bool(self.rotate_bytes) and os.stat(target).st_size >= self.rotate_bytes
            except FileNotFoundError:
                full = False
            if not full:
                break
            segment += 1
        opened = open(target, "ab", buffering=0)  # noqa: SIM115 - kept open until close()
        self.close()
        self._file, self.segment = opened, segment

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


# -- reading --------------------------------------------------------------------------------------


def _decompressor(compression: str, path: Path) -> Callable[[], Any]:
    """What makes a decompressor of one gzip member or zstd frame (``.decompress``, ``.eof``,
    ``.unused_data``, as ``zlib``'s)."""
    if compression == env.COMPRESS_GZIP:
        return lambda: zlib.decompressobj(31)
    module = _zstd()
    if module is None:
        raise TraceFileError(f"{path}: {_ZSTD_HINT}")
    if module.__name__ == "zstandard":
        return lambda: module.ZstdDecompressor().decompressobj()
    make: Callable[[], Any] = module.ZstdDecompressor
    return make


def line_cut_short(path: str | os.PathLike[str], number: int) -> str:
    """What a reader says of a plain file's last line that a writer left without its end."""
    return f"{path}: its last line ({number}) is cut short (a writer stopped mid-line?): skipped"


class _CutShort(Exception):
    """The stream ended inside a member (frame): its writer stopped mid-write, or is writing it."""


def _blocks(f: Any, make: Callable[[], Any], path: Path, left: int | None = None) -> Iterator[bytes]:
    """The decompressed bytes of a file of concatenated members (frames), from where ``f`` is and
    ``left`` bytes of it if given; :class:`_CutShort` at the end if the last one is unfinished."""
    unpack = None
    while True:
        data = f.read(_READ_BLOCK if left is None else min(_READ_BLOCK, left))
        if not data:
            break
        if left is not None:
            left -= len(data)
        while data:
            if unpack is None:
                unpack = make()
            try:
                out = unpack.decompress(data)
            except Exception as exc:  # zlib.error, ZstdError: bytes no writer of this format wrote
                raise TraceFileError(f"{path}: not a {path.suffix} stream gymtrace can read ({exc})") from exc
            if out:
                yield out
            if unpack.eof:
                data, unpack = unpack.unused_data, None
            else:
                data = b""
    if unpack is not None:
        raise _CutShort


def _lines(blocks: Iterator[bytes], path: Path, warn: Warn | None, still_written: bool) -> Iterator[bytes]:
    rest: list[bytes] = []
    try:
        for block in blocks:
            end = block.rfind(b"\n")
            if end < 0:
                rest.append(block)
                continue
            rest.append(block[: end + 1])
            yield from io.BytesIO(b"".join(rest))  # its lines, split in C
            rest = [block[end + 1 :]]
    except _CutShort:
        if still_written:
            return  # the member being written: whole at the next read
        message = f"{path}: cut short (a writer stopped mid-write?): the lines of its last block after the cut skipped"
        if warn is None:
            raise TraceFileError(message) from None
        warn(message)
        return
    last = b"".join(rest)
    if last:
        yield last  # a last line without its newline: the reader's rule for a plain file applies


@contextmanager
def open_lines(
    path: str | os.PathLike[str],
    *,
    warn: Warn | None = None,
    still_written: bool = False,
    part: Part = None,
) -> Iterator[Iterable[bytes]]:
    """The lines of one trace file, or of its byte range ``part`` (:data:`Part`), as bytes with
    their newlines, decompressed by its suffix (``.gz``, ``.zst``; else plain, the open file itself
    when whole).

    A compressed file cut short inside its last member (frame) yields the whole lines before the
    cut, then: nothing more if ``still_written`` (``gymtrace live``: it is whole at the next read),
    one warning naming the file if ``warn`` is given, else :class:`TraceFileError`. Bytes that do
    not decompress raise :class:`TraceFileError` naming the file."""
    p = Path(path)
    compression = compression_of(p)
    make = None if compression is None else _decompressor(compression, p)
    with open(p, "rb") as f:
        if part is not None:
            f.seek(part[0])
        if make is not None:
            left = None if part is None else part[1] - part[0]
            yield _lines(_blocks(f, make, p, left), p, warn, still_written)
        else:
            yield f if part is None else _plain_lines(f, *part)


def _plain_lines(f: Any, at: int, end: int) -> Iterator[bytes]:
    """The lines of a plain file ``f`` from byte ``at`` (where it is) up to byte ``end``."""
    while at < end:
        raw = f.readline()
        if not raw:
            return
        at += len(raw)
        yield raw


def member_start(path: str | os.PathLike[str], at: int) -> int | None:
    """Where the first gzip member (zstd frame) of compressed trace file ``path`` that starts at or
    after byte ``at`` begins, so that a second reader can read the file from there while a first
    reads it up to there; None if none begins within reach.

    A member is taken where it decompresses whole into lines of trace requests: gymtrace writes
    each export as one, whereas the magic number a member begins with can also turn up inside
    compressed bytes. A file compressed whole (``gzip FILE``) has no member past its first, and is
    read by one reader."""
    p = Path(path)
    compression = compression_of(p)
    if compression is None:
        raise ValueError(f"{p}: not compressed")  # a caller's mistake
    magic = _MEMBER_MAGIC[compression]
    make = _decompressor(compression, p)
    with open(p, "rb") as f:
        end = min(os.fstat(f.fileno()).st_size, at + _MEMBER_SEARCH)
        block_at = at
        while block_at < end:
            f.seek(block_at)
            # A magic number across two blocks is found in the first: each block overlaps the next.
            block = f.read(min(_READ_BLOCK, end - block_at) + len(magic) - 1)
            found = block.find(magic)
            while found >= 0:
                if block_at + found >= end:
                    break
                if _whole_member(f, block_at + found, make):
                    return block_at + found
                found = block.find(magic, found + 1)
            block_at += _READ_BLOCK
    return None


def _whole_member(f: Any, at: int, make: Callable[[], Any]) -> bool:
    """Whether one member (frame) begins at byte ``at`` of ``f``: it decompresses to its end into
    lines that begin with a request (read no further than a stray magic number needs to fail)."""
    f.seek(at)
    unpack = make()
    head, last, made = b"", b"", 0
    while not unpack.eof:
        data = f.read(1 << 16)
        if not data:
            return False  # cut short, or not a member
        try:
            out = unpack.decompress(data)
        except Exception:  # noqa: BLE001 - zlib.error, ZstdError: not a member that begins here
            return False
        if out:
            if len(head) < len(REQUEST_START):
                head += out[: len(REQUEST_START) - len(head)]
                if not REQUEST_START.startswith(head):
                    return False
            last, made = out[-1:], made + len(out)
            if made > _MEMBER_LIMIT:
                return False
    # It began as a request does (checked as it came: text shorter than that cannot end a line).
    return last == b"\n"
