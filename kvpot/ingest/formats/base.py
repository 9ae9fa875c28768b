"""What a document format is to kvpot: how it is recognised, how a file of it is checked before a model
loads, and how its text is read a piece at a time. Each format's module holds one `Format`; the
registry (kvpot.ingest.formats.registry) lists them, and detection and reading walk that list.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from kvpot.errors import KvpotError


class UnreadableInput(KvpotError):
    """A file kvpot recognised but cannot read (broken, encrypted, no text): among several inputs it
    is left out with its reason; alone, its reason is the error."""


@dataclass(frozen=True)
class Doc:
    """One document to read, as a format's `pieces` gets it."""

    path: Path | None   # its file; None for a stream (stdin, a pipe), which only a streaming format gets
    name: str           # how its messages name it
    warn: Callable[[str], None]  # told of what is left out as it is met (a PDF's damaged page)
    open: Callable[[], AbstractContextManager[BinaryIO]]  # its bytes from the start, decompressed if compressed


def _no_check(path: Path, name: str) -> None:
    """Nothing to check before reading: whatever is wrong is said as it is read."""


@dataclass(frozen=True)
class Format:
    """A document format kvpot reads as text.

    A file is claimed by its content, never by its name: by its first bytes (`claims`, else `magic`),
    or, for a zip, by the content of its `mimetype` member (`zip_mimetype`) or else by a member it holds
    (`zip_member`); the first format in the registry's order that claims a file reads it.
    `check` refuses an unreadable file with one line (UnreadableInput) before a model loads; `pieces`
    yields (text, location) a piece at a time. A `streams` format is read in one pass over its bytes
    (Doc.open), so it is read from stdin, a pipe or inside a compressed file too; any other is read from
    its file by seeking in it (Doc.path), and a stream holding it is refused with the way to read it.
    """

    name: str    # the kind it gives (Kind.kind), e.g. "pdf"
    title: str   # how a person names it in messages, e.g. "PDF"
    pieces: Callable[[Doc], Iterator[tuple[str, str]]]
    magic: tuple[bytes, ...] = ()  # what its files start with (a stream's head shorter than one is read on)
    claims: Callable[[bytes], bool] | None = None  # from a file's first bytes; None: it starts with `magic`
    zip_mimetype: str | None = None
    zip_member: str | None = None
    check: Callable[[Path, str], None] = _no_check
    streams: bool = False

    def claimed(self, head: bytes) -> bool:
        """A file whose first bytes are `head` is this format's."""
        return self.claims(head) if self.claims is not None else bool(self.magic) and head.startswith(self.magic)

    @property
    def in_zip(self) -> bool:
        """Its files are zip archives, told apart by their members."""
        return self.zip_mimetype is not None or self.zip_member is not None
