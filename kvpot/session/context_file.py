"""Saved contexts: the compressed memory of a read document, reopened without reading it again.

Layout (docs/formats.md): magic, format version, header length, header (JSON), three tagged
sections (llama.cpp sequence state, kvpot's C state, the engine's arrays as .npy), then the
SHA-256 of everything before it. Written through kvpot.safe_write (a temporary file beside the
target, renamed when complete; only a regular file or a new name is replaced).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from kvpot.errors import KvpotError
from kvpot.safe_write import atomic_write
from kvpot.session.engine_state import (
    INT32_MAX,
    INT64_MAX,
    EngineState,
    SeqInFile,
    check_engine_values,
    check_policy_state,
    check_pot_bytes,
)
from kvpot.session.limits import MAX_CELLS

MAGIC = b"KVPOTCTX"
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<8sII")          # magic, format version, header length
_SECTION = struct.Struct("<4sQ")          # tag, length
_TAGS = (b"SEQ ", b"POT ", b"ARRS")
_DIGEST = 32


@dataclass
class SavedContext:
    header: dict          # model, runtime, policy, settings, sources, session (see docs/formats.md)
    state: EngineState


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


def write_context(path: Path, saved: SavedContext) -> int:
    """Write atomically; returns the file size."""
    st = saved.state
    header = dict(saved.header, engine=st.values)
    head = json.dumps(header, sort_keys=True).encode()
    parts = [_PREFIX.pack(MAGIC, FORMAT_VERSION, len(head)), head]
    for tag, blob in zip(_TAGS, (st.seq, st.pot, _arrays_bytes(st.arrays))):
        parts += [_SECTION.pack(tag, len(blob)), blob]
    digest = hashlib.sha256()
    for p in parts:
        digest.update(p)
    parts.append(digest.digest())
    with atomic_write(path, "context") as f:
        for p in parts:
            f.write(p)
    return sum(len(p) for p in parts)


# header fields later code reads, with their JSON types: a file with the right checksum but
# another shape (a bug, a hand edit, a fuzzer) is refused here rather than as a KeyError later
_HEADER_SCHEMA = {
    "runtime": {"abi": int, "llama_commit": str},
    "model": {"name": str, "path": str, "sha256": str},
    "policy": str,
    "settings": dict,
    "n_ctx": int,
    "tokens_read": int,
    "sources": list,
    "turns": int,
    "engine": dict,
}


def _check_shape(value, schema, where: str) -> None:
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            raise ValueError(f"{where or 'header'} is not an object")
        for key, sub in schema.items():
            if key not in value:
                raise ValueError(f"header has no {where + '.' if where else ''}{key}")
            _check_shape(value[key], sub, f"{where + '.' if where else ''}{key}")
    elif not isinstance(value, schema) or (schema is int and isinstance(value, bool)):
        raise ValueError(f"header field {where} is not a{'n' if schema is int else ''} {schema.__name__}")


def check_context_path(path: Path | str) -> Path:
    """The cheap checks on a --context path, each its own line (before anything is loaded)."""
    if str(path) == "":
        raise KvpotError("--context needs the path of a saved context (it was empty)")
    path = Path(path).expanduser()
    if not path.exists():
        raise KvpotError(f"saved context {path} does not exist")
    if path.is_dir():
        raise KvpotError(f"saved context {path} is a directory, not a file saved with --save-context")
    if not path.is_file():
        raise KvpotError(f"saved context {path} is not a regular file")
    return path


def read_context(path: Path, seq_in_file: bool = False) -> SavedContext:
    """Read and check a saved context, the header's every field included (check_saved): anything
    wrong is one clear KvpotError, before any of it is used. `seq_in_file`: leave the sequence state in the
    file (a SeqInFile that llama.cpp restores from), where the platform can read it from there (POSIX)."""
    path = check_context_path(path)
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            # the checksum first, streamed (nothing of an altered file is parsed), then the sections, each read
            # once into its own buffer: the file is never held whole beside its parts (a 1.5B model's
            # 32K-cell context is ~0.9 GB of sequence state, which is what reopening then restores)
            _check_prefix(f.read(_PREFIX.size), size, path)
            digest = _verify(f, size, path)
            f.seek(0)
            saved = _parse(f, size, path, seq_in_file and hasattr(os, "pread"), digest)
    except OSError as e:
        raise KvpotError(f"cannot read saved context {path}: {e.strerror}") from None
    check_saved(saved, path)
    return saved


def _verify(f: BinaryIO, size: int, path: Path | str, digest: bytes | None = None) -> bytes:
    """The file's checksum against the digest it ends with (and, given one, against `digest`: the file read
    before is the one read now); returns the digest."""
    f.seek(max(size - _DIGEST, 0))
    stored = f.read(_DIGEST)
    if digest is not None and stored != digest:
        raise KvpotError(f"saved context {path} changed since it was opened")
    f.seek(0)
    _check_digest(_chunks(f, size - _DIGEST), stored, path)
    return stored


_READ_BLOCK = 1 << 20


def _chunks(f: BinaryIO, n: int) -> Iterator[bytes]:
    while n > 0:
        block = f.read(min(n, _READ_BLOCK))
        if not block:
            return
        n -= len(block)
        yield block


_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_PROMPT_FORMATS = ("chat", "completion")
_MAX_SOURCES = 1 << 20


def check_saved(saved: SavedContext, path: Path | str = "saved context") -> None:
    """Every header field's type and range, and the engine's state against them (positions and cell
    counts within int32 and the context's size, settings as `ask` checks them, a policy spec kvpot
    runs, arrays and kvpot's C state of the shapes the header implies). A file with a right checksum
    can still be crafted or hand-edited: nothing in it reaches the engine or C code unchecked. Needs
    no model, so it runs before one loads (and under the fuzzer)."""
    try:
        _check_header(saved.header)
        st = saved.state
        n_ctx = saved.header["n_ctx"]
        check_engine_values(st.values, st.arrays, n_ctx)
        if saved.header["tokens_read"] > st.values["tokens_seen"]:
            raise ValueError("tokens_read is more than the engine's tokens_seen")
        if "read_point" in saved.header:
            from kvpot.session.read_point import ReadPoint

            point = ReadPoint.from_header(saved.header["read_point"])
            if point.next_position != st.values["tokens_seen"] or saved.header["turns"]:
                raise ValueError("read_point is not where the engine stopped reading")
        check_pot_bytes(st.pot, st.arrays["positions"], st.values["pos_next"])
        from kvpot.policies import make_policy

        check_policy_state(make_policy(saved.header["policy"]), st.values["policy"], st.arrays)
    except (ValueError, KvpotError) as e:
        raise KvpotError(f"saved context {path} is malformed: {_one_line(e)}") from None


def _check_header(h: dict) -> None:
    from kvpot.session.settings import KEYS, SAVED_BEFORE, describe, setting_problem

    schema = {k: v for k, v in _HEADER_SCHEMA.items() if k != "engine"}  # the engine's part is parsed apart
    _check_shape(h, schema | {"format": str, "kvpot_version": str, "prompt_format": str}, "")
    if h["format"] != "kvpot saved context":
        raise ValueError(f"header field format is {describe(h['format'])}")
    if not _SHA256.match(h["model"]["sha256"]) or not isinstance(h["model"].get("architecture"), str):
        raise ValueError("header field model holds no sha256 digest or architecture")
    settings = h["settings"]
    for key, value in SAVED_BEFORE.items():  # a context saved before the setting existed was read so
        settings.setdefault(key, value)
    if set(settings) != set(KEYS):
        raise ValueError(f"header field settings has keys {sorted(settings)[:8]}, not {list(KEYS)}")
    for key in KEYS:
        problem = setting_problem(key, settings[key])
        if problem:
            raise ValueError(f"settings.{key} {problem}")
    if not isinstance(settings["budget"], int) or settings["threads"] < 1:
        raise ValueError("settings hold an unresolved budget or thread count")
    if settings["policy"] != h["policy"]:
        raise ValueError(f"policy {describe(h['policy'])} is not the one its settings name")
    if h["prompt_format"] not in _PROMPT_FORMATS:
        raise ValueError(f"prompt_format must be one of {', '.join(_PROMPT_FORMATS)}")
    if not 1 <= h["n_ctx"] <= MAX_CELLS:
        raise ValueError(f"n_ctx {h['n_ctx']} is outside 1..{MAX_CELLS}")
    for key, hi in (("tokens_read", INT64_MAX), ("turns", INT32_MAX)):
        if not 0 <= h[key] <= hi:
            raise ValueError(f"{key} {h[key]} is outside 0..{hi}")
    _check_sources(h["sources"])
    if "source_map" in h:  # --sources' map (older contexts have none)
        from kvpot.session.sources import SourceMap

        SourceMap.from_header(h["source_map"])


def _check_sources(sources: list) -> None:
    if len(sources) > _MAX_SOURCES:
        raise ValueError(f"header lists {len(sources)} sources")
    for src in sources:
        if not isinstance(src, dict) or not isinstance(src.get("name"), str):
            raise ValueError("a source in the header has no name")
        size = src.get("size")
        if size is not None and (not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= INT64_MAX):
            raise ValueError(f"source {src['name'][:40]!r} has size {repr(size)[:40]}")


def parse_context(data: bytes, path: Path | str = "saved context") -> SavedContext:
    """Check and decode the bytes of a saved context (the part the fuzzer drives)."""
    _check_prefix(data[:_PREFIX.size], len(data), path)
    _check_digest([memoryview(data)[:-_DIGEST]], data[-_DIGEST:], path)
    return _parse(io.BytesIO(data), len(data), path)


def _check_prefix(prefix: bytes, size: int, path: Path | str) -> None:
    """The magic, the format version, and room for the header and the checksum."""
    if len(prefix) < _PREFIX.size or prefix[:8] != MAGIC:
        raise KvpotError(f"{path} is not a kvpot saved context")
    _, version, n_head = _PREFIX.unpack(prefix)
    if version != FORMAT_VERSION:
        raise KvpotError(f"{path} is saved-context format {version}; this kvpot reads format {FORMAT_VERSION}")
    if size < _PREFIX.size + n_head + _DIGEST:
        raise KvpotError(f"saved context {path} is truncated or corrupted (checksum mismatch)")


def _check_digest(blocks: Iterable[bytes | memoryview], digest: bytes, path: Path | str) -> None:
    """The SHA-256 of everything before the last 32 bytes (given in blocks) against those bytes."""
    h = hashlib.sha256()
    for block in blocks:
        h.update(block)
    if h.digest() != digest:
        raise KvpotError(f"saved context {path} is truncated or corrupted (checksum mismatch)")


def _seq_in_file(f: BinaryIO, offset: int, n: int, size: int, path: Path | str, digest: bytes) -> SeqInFile:
    own = os.fdopen(os.dup(f.fileno()), "rb")

    def verify() -> None:
        try:
            if os.fstat(own.fileno()).st_size != size:
                raise KvpotError(f"saved context {path} changed since it was opened")
            _verify(own, size, path, digest)
        except OSError as e:
            raise KvpotError(f"cannot read saved context {path}: {e.strerror}") from None

    return SeqInFile(own, offset, n, verify)


def _parse(f: BinaryIO, size: int, path: Path | str, seq_in_file: bool = False, digest: bytes = b"") -> SavedContext:
    """The header and the three sections of a file whose checksum (`digest`) is right, read from `f` at its
    start. The sequence state goes into a bytearray of its own, which llama.cpp then reads in place
    (set_seq_state), or with `seq_in_file` stays in the file (SeqInFile, through a duplicate of `f`'s
    descriptor)."""
    end = size - _DIGEST
    try:
        _, _, n_head = _PREFIX.unpack(f.read(_PREFIX.size))
        header = json.loads(f.read(n_head))
        _check_shape(header, _HEADER_SCHEMA, "")
        at = _PREFIX.size + n_head
        blobs: list[bytes | bytearray] = []
        for want in _TAGS:
            if at + _SECTION.size > end:
                raise ValueError(f"section {want!r} is missing")
            tag, n = _SECTION.unpack(f.read(_SECTION.size))
            if tag != want:
                raise ValueError(f"section {want!r} expected, found {tag!r}")
            if at + _SECTION.size + n > end:
                raise ValueError(f"section {want!r} runs past the end of the file")
            if want == b"SEQ " and seq_in_file:
                blobs.append(_seq_in_file(f, at + _SECTION.size, n, size, path, digest))
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
        values = header.pop("engine")
    except (ValueError, KeyError, struct.error, UnicodeDecodeError, EOFError, RecursionError) as e:
        raise KvpotError(f"saved context {path} is malformed: {_one_line(e)}") from None
    return SavedContext(header=header, state=EngineState(seq=blobs[0], pot=blobs[1], values=values, arrays=arrays))


def _one_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:200]
