"""Saved contexts: the compressed memory of a read document, reopened without reading it again.

Layout (docs/formats.md): magic, format version, header length, header (JSON), three tagged
sections (llama.cpp sequence state, kvpot's C state, the engine's arrays as .npy), then the
SHA-256 of everything before it. Written to a temporary file in the same folder, then renamed.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvpot.engine_state import EngineState
from kvpot.errors import KvpotError

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
        name = data[at + 4:at + 4 + n].decode()
        at += 4 + n
        (m,) = struct.unpack_from("<Q", data, at)
        arrays[name] = np.load(io.BytesIO(data[at + 8:at + 8 + m]), allow_pickle=False)
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
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise KvpotError(f"cannot save the context: folder {folder} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            for p in parts:
                f.write(p)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path.stat().st_size


def read_context(path: Path) -> SavedContext:
    """Read and check a saved context; anything wrong is one clear KvpotError."""
    path = Path(path)
    if not path.is_file():
        raise KvpotError(f"saved context {path} does not exist")
    data = path.read_bytes()
    if len(data) < _PREFIX.size or data[:8] != MAGIC:
        raise KvpotError(f"{path} is not a kvpot saved context")
    _, version, n_head = _PREFIX.unpack_from(data)
    if version != FORMAT_VERSION:
        raise KvpotError(f"{path} is saved-context format {version}; this kvpot reads format {FORMAT_VERSION}")
    if len(data) < _PREFIX.size + n_head + _DIGEST or hashlib.sha256(data[:-_DIGEST]).digest() != data[-_DIGEST:]:
        raise KvpotError(f"saved context {path} is truncated or corrupted (checksum mismatch)")
    try:
        header = json.loads(data[_PREFIX.size:_PREFIX.size + n_head])
        at = _PREFIX.size + n_head
        blobs = []
        for want in _TAGS:
            tag, n = _SECTION.unpack_from(data, at)
            if tag != want:
                raise ValueError(f"section {want!r} expected, found {tag!r}")
            blobs.append(data[at + _SECTION.size:at + _SECTION.size + n])
            at += _SECTION.size + n
        arrays = _arrays_from(blobs[2])
        values = header.pop("engine")
    except (ValueError, KeyError, struct.error, UnicodeDecodeError) as e:
        raise KvpotError(f"saved context {path} is malformed: {e}") from None
    return SavedContext(header=header, state=EngineState(seq=blobs[0], pot=blobs[1], values=values, arrays=arrays))
