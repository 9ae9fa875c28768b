"""Documents beyond plain text: what a file is (by content), whether it can be read, and its text a
piece at a time with where each piece comes from (page, chapter, paragraph or line).

identify() runs before any model loads and refuses an unreadable document with one line
(UnreadableInput); identify_stream() does the same for a stream (stdin, a pipe) from its first bytes;
pieces() reads one lazily. The formats are those the registry lists (kvpot.ingest.formats.registry),
asked in its order; nothing here names one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import kvpot.ingest.formats.registry as registry
from kvpot.ingest.formats.base import Doc, Format, UnreadableInput
from kvpot.ingest.formats.compressed import Checked, decompressed_head, stream_head
from kvpot.ingest.formats.detect import (
    claimed,
    codec,
    compression,
    is_zip,
    listing,
    magics,
    named,
    zip_format,
    zipped_titles,
)
from kvpot.ingest.textfile import SNIFF_BYTES, looks_binary

TEXT, BINARY = "text", "binary"


@dataclass(frozen=True)
class Kind:
    kind: str                 # a registered format's name (pdf, epub, html...), text, or binary (not read)
    codec: str | None = None  # the compression around it (gzip, xz, bzip2, zstd), if any

    @property
    def plain(self) -> bool:
        """Plain text, read as the bytes are: its size is its text's size."""
        return self.kind == TEXT and self.codec is None

    @property
    def binary(self) -> bool:
        """Not text and no format kvpot reads: left out."""
        return self.kind == BINARY

    @property
    def document(self) -> Format | None:
        """The format that reads it; None for text (read by the caller) and binary."""
        return named(self.kind)


def identify(path: Path, head: bytes, name: str) -> Kind:
    """What `path` is and, for a document, that it can be read (else UnreadableInput). `head` is
    the file's first bytes."""
    found = claimed(head)
    if found is None and is_zip(head):
        found = zip_format(path, name)
    if found is not None:
        found.check(path, name)
        return Kind(found.name)
    if (c := codec(head)) is not None:
        return _inside(decompressed_head(c, path, name, SNIFF_BYTES), c, name)
    return Kind(BINARY if looks_binary(head) else TEXT)


def _inside(inner: bytes, codec: str, name: str) -> Kind:
    """What a compressed input holds, from its first decompressed bytes: a format read in one pass,
    text, or binary."""
    if not inner.strip():
        raise UnreadableInput(f"{name} is empty once decompressed")
    if looks_binary(inner):  # a tarball, a compressed image: not text
        return Kind(BINARY, codec)
    found = claimed(inner, streams_only=True)
    return Kind(found.name if found is not None else TEXT, codec)


def identify_stream(head: bytes, whole: bool, name: str) -> Kind:
    """What a stream that cannot seek (stdin, a pipe) holds, from its first bytes `head` (all of it
    when `whole`): a format read in one pass (HTML) or text, either compressed (a compressed `head`
    that is `whole` is decompressed to its end, to refuse a truncated or corrupt one now), or binary.
    A format read by seeking in its file (PDF, the zip formats) is refused, with the way to read it."""
    found = claimed(head)
    if found is not None and not found.streams:
        raise UnreadableInput(f"{name} holds a {found.title}, which kvpot reads only from a file (it seeks in it): "
                              "save it and pass its path")
    if found is not None:
        return Kind(found.name)
    if is_zip(head):
        raise UnreadableInput(f"{name} holds a zip archive ({zipped_titles(' or ')}?), which kvpot reads only "
                              "from a file (it seeks in it): save it and pass its path")
    if (c := codec(head)) is not None:
        return _inside(stream_head(c, head, whole, name, SNIFF_BYTES), c, name)
    return Kind(BINARY if looks_binary(head) else TEXT)


def pieces(kind: Kind, path: Path | None, name: str, warn: Callable[[str], None] = lambda msg: None,
           stream: BinaryIO | None = None) -> Iterator[tuple[str, str]]:
    """(text, location) of a document that is not plain text, a piece at a time, read by its format.
    `warn` is told of what is left out as it is met (a PDF's damaged page); `stream`: the bytes of a
    stream source (stdin, a pipe: a streaming format, maybe compressed), read instead of `path`."""
    fmt = kind.document
    if fmt is None:
        raise ValueError(f"{kind} is read as text by the caller")
    yield from fmt.pieces(Doc(path, name, warn, lambda: open_bytes(kind, path, name, stream)))


def open_bytes(kind: Kind, path: Path | None, name: str, stream: BinaryIO | None = None):
    """The file's bytes (or `stream`'s, left open), decompressed when it is compressed (errors are
    this input's one line)."""
    if stream is not None:
        return Checked(kind.codec, stream, name, "stream") if kind.codec else nullcontext(stream)
    return Checked(kind.codec, path, name) if kind.codec else open(path, "rb")


def read_as() -> str:
    """What kvpot reads, as a person names it: "text, PDF, EPUB, DOCX, ODT, HTML or compressed text"."""
    return listing(["text", *(f.title for f in registry.FORMATS), "compressed text"], " or ")


__all__ = ["Kind", "Format", "UnreadableInput", "identify", "identify_stream", "pieces", "open_bytes",
           "compression", "magics", "read_as"]
