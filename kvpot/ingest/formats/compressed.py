"""gzip, xz, bzip2 and zstd streams (rotated logs, compressed dumps), decompressed as they are read,
from a file or from a stream that cannot seek (stdin, a pipe).

gzip, xz and bzip2 come with Python; zstd needs the zstandard package (an extra: `pip install
zstandard`), and a .zst input without it is refused with that command.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import zlib
from pathlib import Path
from typing import BinaryIO

from kvpot.ingest.formats.base import UnreadableInput

# a compressed file up to this size is decompressed whole (and thrown away) before reading, so a
# truncated or corrupt one is refused before a model loads; a larger one is checked as it is read.
# A compressed stream (stdin, a pipe) up to this size is held in memory to be checked the same way,
# since it cannot be read twice.
VERIFY_BYTES = 32 << 20


ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# what the first bytes of each compressed stream are (RFC 1952, the xz and bzip2 formats, RFC 8878)
COMPRESSED_MAGIC = {
    b"\x1f\x8b": "gzip",
    b"\xfd7zXZ\x00": "xz",
    b"BZh": "bzip2",
    ZSTD_MAGIC: "zstd",
}


class ZstdFrames:
    """The bytes of a zstd stream passed through to the decompressor, its frames walked on the way
    (RFC 8878 section 3.1: a frame header, blocks that each give their size, an optional checksum;
    skippable frames give theirs), so that a stream ending inside a frame is known: the zstandard
    package's stream reader ends such a stream without an error."""

    def __init__(self, source: BinaryIO, owned: bool):
        self.source, self.owned = source, owned
        self._head = bytearray()   # the header being read
        self._need = 4             # its length (a frame's magic first)
        self._state = "magic"      # magic, descriptor, skippable size, block, or bad
        self._skip = 0             # bytes to pass before the next header
        self._checksum = False     # the frame ends with a 4-byte checksum

    @property
    def at_frame_end(self) -> bool:
        return self._state == "magic" and not self._skip and not self._head

    def read(self, n: int = -1) -> bytes:
        data = self.source.read(n)
        self._walk(data)
        return data

    def close(self) -> None:
        if self.owned:
            self.source.close()

    def _walk(self, data: bytes) -> None:
        i = 0
        while i < len(data) and self._state != "bad":
            if self._skip:
                take = min(self._skip, len(data) - i)
                self._skip -= take
                i += take
                continue
            take = min(self._need - len(self._head), len(data) - i)
            self._head += data[i:i + take]
            i += take
            if len(self._head) == self._need:
                head, self._head = bytes(self._head), bytearray()
                self._header(head)

    def _header(self, head: bytes) -> None:
        if self._state == "magic":
            if head == ZSTD_MAGIC:
                self._state, self._need = "descriptor", 1
            elif head[0] & 0xF0 == 0x50 and head[1:] == b"\x2a\x4d\x18":  # a skippable frame
                self._state, self._need = "skippable size", 4
            else:
                self._state = "bad"  # not a frame: the decompressor says what is wrong
        elif self._state == "descriptor":
            d = head[0]
            single = d >> 5 & 1
            self._checksum = bool(d >> 2 & 1)
            self._skip = (0 if single else 1) + (0, 1, 2, 4)[d & 3] + (single, 2, 4, 8)[d >> 6]
            self._state, self._need = "block", 3
        elif self._state == "skippable size":
            self._skip = int.from_bytes(head, "little")
            self._state, self._need = "magic", 4
        else:  # a block header: last-block bit, type, size (an RLE block holds one byte)
            h = int.from_bytes(head, "little")
            self._skip = 1 if h >> 1 & 3 == 1 else h >> 3
            if h & 1:
                self._skip += 4 if self._checksum else 0
                self._state, self._need = "magic", 4


def _zstd_open(source: Path | BinaryIO, name: str) -> tuple[BinaryIO, ZstdFrames]:
    try:
        import zstandard
    except ImportError:
        raise UnreadableInput(f"{name} is zstd-compressed: pip install zstandard to read it") from None
    owned = isinstance(source, Path)
    frames = ZstdFrames(open(source, "rb") if owned else source, owned)
    return zstandard.ZstdDecompressor().stream_reader(frames, read_across_frames=True, closefd=True), frames


def open_decompressed(codec: str, source: Path | BinaryIO, name: str) -> BinaryIO:
    """A binary stream of the decompressed bytes; every gzip member (or zstd frame) in turn. `source`
    is a file's path, or a stream read forward only (left open when the result is closed). A zstd
    stream cut inside a frame ends early without an error: Checked says it."""
    if codec == "zstd":
        return _zstd_open(source, name)[0]
    if isinstance(source, Path):
        return {"gzip": gzip.open, "xz": lzma.open, "bzip2": bz2.open}[codec](source, "rb")
    if codec == "gzip":
        return gzip.GzipFile(fileobj=source, mode="rb")
    return {"xz": lzma.LZMAFile, "bzip2": bz2.BZ2File}[codec](source, "rb")


def _errors() -> tuple[type[BaseException], ...]:
    errs: tuple[type[BaseException], ...] = (EOFError, OSError, lzma.LZMAError, zlib.error, ValueError)
    try:
        import zstandard
        errs += (zstandard.ZstdError,)
    except ImportError:
        pass
    return errs


class Checked:
    """A decompressed stream whose errors (truncation, corruption) are this input's one line. `what`
    names the input in that line: "file", or "stream" for stdin and pipes."""

    def __init__(self, codec: str, source: Path | BinaryIO, name: str, what: str = "file"):
        self.codec, self.name, self.what = codec, name, what
        self._frames: ZstdFrames | None = None
        if codec == "zstd":
            self._f, self._frames = _zstd_open(source, name)
        else:
            self._f = open_decompressed(codec, source, name)

    def read(self, n: int = -1) -> bytes:
        try:
            out = self._f.read(n)
        except _errors() as e:
            raise UnreadableInput(broken(self.codec, self.name, e, self.what)) from None
        if not out and n and self._frames is not None and not self._frames.at_frame_end:
            raise UnreadableInput(broken(self.codec, self.name, EOFError("it ends inside a frame"), self.what))
        return out

    def close(self) -> None:
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def broken(codec: str, name: str, e: BaseException, what: str = "file") -> str:
    why = str(e).splitlines()[0] if str(e) else type(e).__name__
    return f"{name} is a truncated or corrupt {codec} {what} ({why})"


def decompressed_head(codec: str, path: Path, name: str, n: int) -> bytes:
    """The first n decompressed bytes; a small file is decompressed to its end to prove it whole."""
    with Checked(codec, path, name) as f:
        return _read_head(f, n, verify=path.stat().st_size <= VERIFY_BYTES)


def stream_head(codec: str, raw: bytes, whole: bool, name: str, n: int) -> bytes:
    """The first n decompressed bytes of a compressed stream whose first bytes are `raw`; when `raw`
    is the whole stream (`whole`), it is decompressed to its end to prove it whole."""
    with Checked(codec, io.BytesIO(raw), name, "stream") as f:
        return _read_head(f, n, verify=whole)


# the most one byte of gzip's deflate can stand for (deflate's limit is ~1032:1); past it a size is not plausible
GZIP_MAX_RATIO = 1032
# zstd can reach far higher ratios (a run of one byte), but text does not: a larger claim is not trusted
ZSTD_MAX_RATIO = 4096


def text_size(codec: str, path: Path, size: int) -> int | None:
    """A compressed file's uncompressed size where its format says it, for a progress estimate;
    None where it does not or the claim is not plausible (an honest "unknown", not a wrong number).
    gzip: the last member's ISIZE trailer, which is the size mod 2^32, so it is trusted only when
    one size fits both it and deflate's ratio, and is at least half the compressed size (a file of
    several members, whose last is small, is unknown). zstd: the first frame's content size, when
    the frame header has one and it is plausible. xz and bzip2: unknown."""
    try:
        with open(path, "rb") as f:
            if codec == "gzip":
                if size < 18 + 8:
                    return None
                f.seek(size - 4)
                isize = int.from_bytes(f.read(4), "little")
                lo, hi = size // 2, size * GZIP_MAX_RATIO
                first = isize + max(0, -(-(lo - isize) // (1 << 32))) * (1 << 32)  # the least size >= lo
                return first if first <= hi < first + (1 << 32) else None  # one fits, not two
            if codec == "zstd":
                n = zstd_content_size(f.read(18))
                return n if n is not None and size // 2 <= n <= size * ZSTD_MAX_RATIO else None
    except OSError:
        return None
    return None


def zstd_content_size(head: bytes) -> int | None:
    """The content size a zstd frame header declares (RFC 8878 3.1.1.1), or None when it has none."""
    if len(head) < 6 or not head.startswith(ZSTD_MAGIC):
        return None
    d = head[4]
    fcs_flag, single, dict_flag = d >> 6, d >> 5 & 1, d & 3
    width = (single, 2, 4, 8)[fcs_flag]
    if not width:
        return None
    at = 5 + (0 if single else 1) + (0, 1, 2, 4)[dict_flag]
    if len(head) < at + width:
        return None
    n = int.from_bytes(head[at:at + width], "little")
    return n + 256 if width == 2 else n


def _read_head(f, n: int, verify: bool) -> bytes:
    """The first n bytes of a decompressing reader; with `verify`, the rest is decompressed too (and
    dropped), so a corrupt or truncated end is refused before anything is read for real."""
    head = b""
    while len(head) < n:
        got = f.read(n - len(head))
        if not got:
            return head
        head += got
    if verify:
        while f.read(1 << 20):
            pass
    return head
