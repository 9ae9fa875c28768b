"""Documents beyond plain text: what a file is (by content), whether it can be read, and its text a
piece at a time with where each piece comes from (page, chapter, paragraph or line).

identify() runs before any model loads and refuses an unreadable document with one line
(UnreadableInput); identify_stream() does the same for a stream (stdin, a pipe) from its first bytes;
pieces() reads one lazily.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from kvpot.ingest.formats.compressed import Checked, decompressed_head, stream_head
from kvpot.ingest.formats.detect import COMPRESSED_MAGIC, UnreadableInput, detect, looks_like_html, zip_kind
from kvpot.ingest.formats.html import html_pieces
from kvpot.ingest.textfile import SNIFF_BYTES, looks_binary

COMPRESSIONS = set(COMPRESSED_MAGIC.values())


@dataclass(frozen=True)
class Kind:
    kind: str                 # text, html, pdf, epub, docx, odt, or binary (not read)
    codec: str | None = None  # the compression around it (gzip, xz, bzip2, zstd), if any

    @property
    def plain(self) -> bool:
        """Plain text, read as the bytes are: its size is its text's size."""
        return self.kind == "text" and self.codec is None


def identify(path: Path, head: bytes, name: str) -> Kind:
    """What `path` is and, for a document, that it can be read (else UnreadableInput). `head` is
    the file's first bytes."""
    kind = detect(head)
    if kind in COMPRESSIONS:
        return _inside(decompressed_head(kind, path, name, SNIFF_BYTES), kind, name)
    if kind == "pdf":
        from kvpot.ingest.formats.pdf import check_pdf

        check_pdf(path, name)
        return Kind("pdf")
    if kind == "zip":
        kind = zip_kind(path, name)
        if kind == "epub":
            from kvpot.ingest.formats.epub import check_epub

            check_epub(path, name)
        else:
            from kvpot.ingest.formats.office import check_office

            check_office(kind, path, name)
        return Kind(kind)
    if looks_binary(head):
        return Kind("binary")
    return Kind(kind)


def _inside(inner: bytes, codec: str, name: str) -> Kind:
    """What a compressed input holds, from its first decompressed bytes."""
    if not inner.strip():
        raise UnreadableInput(f"{name} is empty once decompressed")
    if looks_binary(inner):  # a tarball, a compressed image: not text
        return Kind("binary", codec)
    return Kind("html" if looks_like_html(inner) else "text", codec)


def identify_stream(head: bytes, whole: bool, name: str) -> Kind:
    """What a stream that cannot seek (stdin, a pipe) holds, from its first bytes `head` (all of it
    when `whole`): text or HTML, either compressed (a compressed `head` that is `whole` is
    decompressed to its end, to refuse a truncated or corrupt one now), or binary. PDF, EPUB, DOCX
    and ODT are read by seeking in the file: refused, with the way to read them."""
    kind = detect(head)
    if kind == "pdf":
        raise UnreadableInput(f"{name} holds a PDF, which kvpot reads only from a file (it seeks in it): "
                              "save it and pass its path")
    if kind == "zip":
        raise UnreadableInput(f"{name} holds a zip archive (an EPUB, DOCX or ODT?), which kvpot reads only "
                              "from a file (it seeks in it): save it and pass its path")
    if kind in COMPRESSIONS:
        return _inside(stream_head(kind, head, whole, name, SNIFF_BYTES), kind, name)
    if looks_binary(head):
        return Kind("binary")
    return Kind(kind)


def pieces(kind: Kind, path: Path | None, name: str, warn: Callable[[str], None] = lambda msg: None,
           stream: BinaryIO | None = None) -> Iterator[tuple[str, str]]:
    """(text, location) of a document that is not plain text, a piece at a time. `warn` is told of
    what is left out as it is met (a PDF's damaged page); `stream`: the bytes of a stream source
    (stdin, a pipe: HTML or compressed text only), read instead of `path`."""
    if kind.kind == "pdf":
        from kvpot.ingest.formats.pdf import pdf_pieces

        yield from pdf_pieces(path, name, warn)
    elif kind.kind == "epub":
        from kvpot.ingest.formats.epub import epub_pieces

        yield from epub_pieces(path, name)
    elif kind.kind in ("docx", "odt"):
        from kvpot.ingest.formats.office import office_pieces

        yield from office_pieces(kind.kind, path, name)
    elif kind.kind == "html":
        with open_bytes(kind, path, name, stream) as f:
            yield from html_pieces(f)
    else:
        raise ValueError(f"{kind} is read as text by the caller")


def open_bytes(kind: Kind, path: Path | None, name: str, stream: BinaryIO | None = None):
    """The file's bytes (or `stream`'s, left open), decompressed when it is compressed (errors are
    this input's one line)."""
    if stream is not None:
        return Checked(kind.codec, stream, name, "stream") if kind.codec else nullcontext(stream)
    return Checked(kind.codec, path, name) if kind.codec else open(path, "rb")


__all__ = ["Kind", "UnreadableInput", "identify", "identify_stream", "pieces", "open_bytes"]
