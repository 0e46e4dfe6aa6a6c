"""gymtrace's native reader (Rust): the summary readers' span filter over whole lines of a trace file.

Used by ``gymtrace._read.source`` through ``gymtrace._read.native``; not a public API."""

from collections.abc import Callable, Iterator
from typing import Any

class Lines(Iterator[tuple[bytes | list[Any], bool]]):
    """The lines of a plain trace file, each reduced as it is read (or made into the spans kept),
    with whether it has no newline."""

    def __next__(self) -> tuple[bytes | list[Any], bool]: ...

class Reducer:
    def __init__(
        self,
        keys: tuple[str, str, str, str, str, str, str, str, str],
        read_kinds: set[str],
        part_by_kind: dict[str, int],
        part_by_operation: dict[str, int],
        build: tuple[Callable[[dict[str, Any]], Any], type, dict[str, int], list[str], list[str]] | None = None,
        check: set[str] | None = None,
    ) -> None: ...
    def reduce(self, line: bytes) -> bytes | list[Any]: ...
    def read(self, fd: int, start: int, stop: int | None = None) -> Lines: ...
    def discard(self) -> None: ...
    def times(self) -> dict[tuple[str, str, int], bytes]: ...
    def ends(self) -> dict[tuple[str, str], int]: ...
    def tokens(self) -> list[tuple[str, str, int, str | int | None, str | int | None]]: ...
