"""The file an engine's state is written in: a saved context (`ask --save-context`) and a long
`bench throughput` read's save are both one. It knows bytes, not what they mean: a JSON header with the
engine's values under "engine", and the state's three sections. What a header must hold is the caller's
check (kvpot.session.context_file, kvpot.bench.read_checkpoint).

Layout (docs/formats.md): magic, format version, header length, header (JSON), three tagged sections
(llama.cpp sequence state, kvpot's C state, the engine's arrays as .npy), then the SHA-256 of everything
before it. Written through kvpot.safe_write (a temporary file beside the target, renamed when complete;
only a regular file or a new name is replaced). Read checksum first, streamed, so that nothing of an
altered file is parsed, then each section once into its own buffer: the file is never held whole beside
its parts (a 1.5B model's 32K-cell state is ~0.9 GB of sequence state)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import struct
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np

from kvpot.errors import KvpotError
from kvpot.safe_write import atomic_write
from kvpot.state.engine_state import EngineState, SeqInFile

MAGIC = b"KVPOTCTX"
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<8sII")          # magic, format version, header length
_SECTION = struct.Struct("<4sQ")          # tag, length
_TAGS = (b"SEQ ", b"POT ", b"ARRS")
_DIGEST = 32
_READ_BLOCK = 1 << 20


def write_state(path: Path, header: dict, state: EngineState, what: str) -> int:
    """Write `header` (JSON-able; the state's values go in beside it as "engine") and `state` atomically;
    returns the file size. `what` names the file in errors ("context", "bench checkpoint")."""
    head = json.dumps(dict(header, engine=state.values), sort_keys=True).encode()
    parts = [_PREFIX.pack(MAGIC, FORMAT_VERSION, len(head)), head]
    for tag, blob in zip(_TAGS, (state.seq, state.pot, _arrays_bytes(state.arrays))):
        parts += [_SECTION.pack(tag, len(blob)), blob]
    digest = hashlib.sha256()
    for p in parts:
        digest.update(p)
    parts.append(digest.digest())
    with atomic_write(path, what) as f:
        for p in parts:
            f.write(p)
    return sum(len(p) for p in parts)


HeaderCheck = Callable[[dict], None]  # raises ValueError for a header of the wrong shape


def read_state(path: Path, what: str, check_header: HeaderCheck | None = None,
               seq_in_file: bool = False) -> tuple[dict, EngineState]:
    """The header (without "engine") and the state of the file at `path`, its checksum checked first; any
    fault one KvpotError naming `what` ("saved context"). `check_header` sees the header (with "engine")
    before any section is read. `seq_in_file`: leave the sequence state in the file (a SeqInFile that
    llama.cpp restores from), where the platform can read it from there (POSIX)."""
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            _check_prefix(f.read(_PREFIX.size), size, path, what)
            digest = _verify(f, size, path, what)
            f.seek(0)
            return _parse(f, size, path, what, check_header, seq_in_file and hasattr(os, "pread"), digest)
    except OSError as e:
        raise KvpotError(f"cannot read {what} {path}: {e.strerror}") from None


def parse_state(data: bytes, path: Path | str, what: str,
                check_header: HeaderCheck | None = None) -> tuple[dict, EngineState]:
    """read_state over bytes in memory (the part the fuzzer drives)."""
    _check_prefix(data[:_PREFIX.size], len(data), path, what)
    _check_digest([memoryview(data)[:-_DIGEST]], data[-_DIGEST:], path, what)
    return _parse(io.BytesIO(data), len(data), path, what, check_header)


def one_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:200]


def _arrays_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    # a sequence of (name length, name, .npy bytes length, .npy bytes); .npy never holds pickles here
    out = io.BytesIO()
    for name, arr in arrays.items():
        raw = io.BytesIO()
        np.save(raw, np.ascontiguousarray(arr), allow_pickle=False)
        nb = name.encode()
        out.write(struct.pack("<I", len(nb)) + nb + struct.pack("<Q", raw.tell()) + raw.getvalue())
    return out.getvalue()


def _arrays_from(data: bytes) -> dict[str, np.ndarray]:
    arrays, at = {}, 0
    while at < len(data):
        (n,) = struct.unpack_from("<I", data, at)
        if at + 4 + n > len(data):
            raise ValueError("an array name runs past its section")
        name = data[at + 4:at + 4 + n].decode()
        at += 4 + n
        (m,) = struct.unpack_from("<Q", data, at)
        if at + 8 + m > len(data):
            raise ValueError(f"array {name!r} runs past its section")
        try:
            arr = np.load(io.BytesIO(data[at + 8:at + 8 + m]), allow_pickle=False)
        except Exception as e:  # numpy parses the .npy header with Python's tokenizer: its errors vary
            raise ValueError(f"array {name!r} is not a valid .npy ({type(e).__name__})") from None
        if not isinstance(arr, np.ndarray) or arr.dtype.hasobject:
            raise ValueError(f"array {name!r} is not a plain array")
        arrays[name] = arr
        at += 8 + m
    return arrays


def _check_prefix(prefix: bytes, size: int, path: Path | str, what: str) -> None:
    """The magic, the format version, and room for the header and the checksum."""
    if len(prefix) < _PREFIX.size or prefix[:8] != MAGIC:
        raise KvpotError(f"{path} is not a kvpot {what}")
    _, version, n_head = _PREFIX.unpack(prefix)
    if version != FORMAT_VERSION:
        raise KvpotError(f"{path} is {what} format {version}; this kvpot reads format {FORMAT_VERSION}")
    if size < _PREFIX.size + n_head + _DIGEST:
        raise KvpotError(f"{what} {path} is truncated or corrupted (checksum mismatch)")


def _verify(f: BinaryIO, size: int, path: Path | str, what: str, digest: bytes | None = None) -> bytes:
    """The file's checksum against the digest it ends with (and, given one, against `digest`: the file read
    before is the one read now); returns the digest."""
    f.seek(max(size - _DIGEST, 0))
    stored = f.read(_DIGEST)
    if digest is not None and stored != digest:
        raise KvpotError(f"{what} {path} changed since it was opened")
    f.seek(0)
    _check_digest(_chunks(f, size - _DIGEST), stored, path, what)
    return stored


def _chunks(f: BinaryIO, n: int) -> Iterator[bytes]:
    while n > 0:
        block = f.read(min(n, _READ_BLOCK))
        if not block:
            return
        n -= len(block)
        yield block


def _check_digest(blocks: Iterable[bytes | memoryview], digest: bytes, path: Path | str, what: str) -> None:
    """The SHA-256 of everything before the last 32 bytes (given in blocks) against those bytes."""
    h = hashlib.sha256()
    for block in blocks:
        h.update(block)
    if h.digest() != digest:
        raise KvpotError(f"{what} {path} is truncated or corrupted (checksum mismatch)")


def _seq_in_file(f: BinaryIO, offset: int, n: int, size: int, path: Path | str, what: str, digest: bytes) -> SeqInFile:
    own = os.fdopen(os.dup(f.fileno()), "rb")

    def verify() -> None:
        try:
            if os.fstat(own.fileno()).st_size != size:
                raise KvpotError(f"{what} {path} changed since it was opened")
            _verify(own, size, path, what, digest)
        except OSError as e:
            raise KvpotError(f"cannot read {what} {path}: {e.strerror}") from None

    return SeqInFile(own, offset, n, verify)


def _parse(f: BinaryIO, size: int, path: Path | str, what: str, check_header: HeaderCheck | None = None,
           seq_in_file: bool = False, digest: bytes = b"") -> tuple[dict, EngineState]:
    """The header and the three sections of a file whose checksum (`digest`) is right, read from `f` at its
    start. The sequence state goes into a bytearray of its own, which llama.cpp then reads in place
    (set_seq_state), or with `seq_in_file` stays in the file (SeqInFile, through a duplicate of `f`'s
    descriptor)."""
    end = size - _DIGEST
    try:
        _, _, n_head = _PREFIX.unpack(f.read(_PREFIX.size))
        header = json.loads(f.read(n_head))
        if check_header is not None:
            check_header(header)
        if not isinstance(header, dict):
            raise ValueError("header is not an object")
        values = header.pop("engine", None)
        if not isinstance(values, dict):
            raise ValueError("header has no engine" if values is None else "header field engine is not a dict")
        at = _PREFIX.size + n_head
        blobs: list[bytes | bytearray | SeqInFile] = []
        for want in _TAGS:
            if at + _SECTION.size > end:
                raise ValueError(f"section {want!r} is missing")
            tag, n = _SECTION.unpack(f.read(_SECTION.size))
            if tag != want:
                raise ValueError(f"section {want!r} expected, found {tag!r}")
            if at + _SECTION.size + n > end:
                raise ValueError(f"section {want!r} runs past the end of the file")
            if want == b"SEQ " and seq_in_file:
                blobs.append(_seq_in_file(f, at + _SECTION.size, n, size, path, what, digest))
                f.seek(n, os.SEEK_CUR)
                at += _SECTION.size + n
                continue
            blob = bytearray(n)
            if f.readinto(blob) != n:
                raise ValueError(f"section {want!r} could not be read whole")
            blobs.append(blob if want == b"SEQ " else bytes(blob))  # the small ones as bytes, as C's char* takes
            at += _SECTION.size + n
        if at != end:
            raise ValueError(f"{end - at} bytes after the last section")
        arrays = _arrays_from(blobs[2])
    except (ValueError, KeyError, struct.error, UnicodeDecodeError, EOFError, RecursionError) as e:
        raise KvpotError(f"{what} {path} is malformed: {one_line(e)}") from None
    return header, EngineState(seq=blobs[0], pot=blobs[1], values=values, arrays=arrays)
