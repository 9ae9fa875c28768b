"""gzip, xz, bzip2 and zstd streams (rotated logs, compressed dumps), decompressed as they are read.

gzip, xz and bzip2 come with Python; zstd needs the zstandard package (an extra: `pip install
zstandard`), and a .zst input without it is refused with that command.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import zlib
from pathlib import Path
from typing import BinaryIO

from kvpot.ingest.formats.detect import UnreadableInput

# a compressed file up to this size is decompressed whole (and thrown away) before reading, so a
# truncated or corrupt one is refused before a model loads; a larger one is checked as it is read
VERIFY_BYTES = 32 << 20


def _zstd_open(path: Path, name: str) -> BinaryIO:
    try:
        import zstandard
    except ImportError:
        raise UnreadableInput(f"{name} is zstd-compressed: pip install zstandard to read it") from None
    return zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), read_across_frames=True,
                                                       closefd=True)


def open_decompressed(codec: str, path: Path, name: str) -> BinaryIO:
    """A binary stream of the decompressed bytes; every gzip member (or zstd frame) in turn."""
    if codec == "zstd":
        return _zstd_open(path, name)
    return {"gzip": gzip.open, "xz": lzma.open, "bzip2": bz2.open}[codec](path, "rb")


def _errors() -> tuple[type[BaseException], ...]:
    errs: tuple[type[BaseException], ...] = (EOFError, OSError, lzma.LZMAError, zlib.error, ValueError)
    try:
        import zstandard
        errs += (zstandard.ZstdError,)
    except ImportError:
        pass
    return errs


class Checked:
    """A decompressed stream whose errors (truncation, corruption) are this input's one line."""

    def __init__(self, codec: str, path: Path, name: str):
        self.codec, self.name = codec, name
        self._f = open_decompressed(codec, path, name)

    def read(self, n: int) -> bytes:
        try:
            return self._f.read(n)
        except _errors() as e:
            raise UnreadableInput(broken(self.codec, self.name, e)) from None

    def close(self) -> None:
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def broken(codec: str, name: str, e: BaseException) -> str:
    why = str(e).splitlines()[0] if str(e) else type(e).__name__
    return f"{name} is a truncated or corrupt {codec} file ({why})"


def decompressed_head(codec: str, path: Path, name: str, n: int) -> bytes:
    """The first n decompressed bytes; a small file is decompressed to its end to prove it whole."""
    with Checked(codec, path, name) as f:
        head = b""
        while len(head) < n:
            raw = f.read(n - len(head))
            if not raw:
                return head
            head += raw
        if path.stat().st_size <= VERIFY_BYTES:
            while f.read(1 << 20):
                pass
    return head
