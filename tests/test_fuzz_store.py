"""Property-based fuzzing (Hypothesis) of InfLLM's block store open (ggml_ext/kvpot-blocks.cpp): a
`.kvblk` file is read by C code through mmap, so a size the header claims must be checked against the
file's length before any byte is read; a crash here (SIGFPE, SIGSEGV, SIGBUS) kills the test process.

Property (tests/fuzzlib.py): every file is either opened (its info read, its last block of every layer
read, a top-k scored) or refused with one KvpotError line. Inputs start from a valid store kvpot wrote
(a small shape): raw bytes after the magic; header fields set to edge values (0, 1, 2^20, 2^31, 2^32-1,
...) with the body cut or grown; and byte-level mutations of the whole file.

`make test` runs KVPOT_FUZZ_EXAMPLES (default 300) per target; the long run (100,000 each) writes the
counts to KVPOT_FUZZ_REPORT.
"""

from __future__ import annotations

import os
import struct
import tempfile
from functools import cache

import numpy as np
from fuzzlib import FUZZ, MUTATIONS, batch, check, mutate, write_report
from hypothesis import given
from hypothesis import strategies as st

from kvpot.runtime.blocks import BlockStore

SHAPE = dict(n_layer=2, n_head_kv=2, d_k=4, d_v=3, block_size=2)
N_BLOCKS = 3
FIELDS = 7  # version, header bytes, layers, KV heads, d_k, d_v, block_size (uint32 each, from offset 8)


def teardown_module(module) -> None:
    write_report()


@cache
def _folder() -> str:
    return tempfile.mkdtemp(prefix="kvpot-fuzz-store-")


@cache
def _valid_store() -> bytes:
    """A store kvpot wrote: 3 blocks of the small shape."""
    path = os.path.join(_folder(), "valid.kvblk")
    rng = np.random.default_rng(0)
    L, H, dk, dv, bs = (SHAPE[k] for k in ("n_layer", "n_head_kv", "d_k", "d_v", "block_size"))
    with BlockStore(path, **SHAPE, max_cached=2, create=True) as store:
        for b in range(N_BLOCKS):
            store.append(np.arange(b * bs, (b + 1) * bs), rng.standard_normal((L, H, dk)),
                         rng.standard_normal((L, H, bs, dk)), rng.standard_normal((L, H, bs, dv)))
    with open(path, "rb") as f:
        data = f.read()
    os.unlink(path)
    return data


def _open(data: bytes) -> None:
    """Open the bytes as a store (create=False) and use it as InfLLM does."""
    path = os.path.join(_folder(), "fuzzed.kvblk")
    with open(path, "wb") as f:
        f.write(data)
    with BlockStore(path, max_cached=2) as store:
        info = store.info()
        if info.n_blocks:
            L, H, dk, dv, bs = store.shape
            for layer in range(L):
                store.read(layer, info.n_blocks - 1)
            store.topk(0, np.ones((H, dk), np.float32), 1)


_EDGE = st.sampled_from((0, 1, 2, 3, 4, 63, 64, 65, 1 << 16, (1 << 20) - 1, 1 << 20, (1 << 20) + 1, 1 << 31,
                         (1 << 32) - 1))
_U32 = st.one_of(_EDGE, st.integers(0, (1 << 32) - 1))
_FIELD_EDITS = st.lists(st.tuples(st.integers(0, FIELDS - 1), _U32), max_size=3)
# a shape whose block size overflows 64 bits (layers x record = 2^80 + 2^64, i.e. 0 modulo 2^64: a division
# by zero in a reader that multiplies unchecked), which random edits would hardly meet; and one a field
# short of it. (layers, KV heads, d_k, d_v, block_size)
WRAPPING_SHAPES = ((1 << 20, 1 << 20, (1 << 19) - 1, 8, 1 << 20), (1 << 20, 1 << 20, (1 << 19) - 1, 8, 1))
_PRESET = st.one_of(st.none(), st.none(), st.sampled_from(WRAPPING_SHAPES))
# the body: cut to a length, or grown by zeros (a header whose shape claims more blocks than the file holds)
_BODY = st.one_of(st.none(), st.tuples(st.just("cut"), st.integers(0, 4096)), st.tuples(st.just("grow"), st.integers(1, 4096)))
_MUTATION = st.one_of(st.none(), MUTATIONS)


@st.composite
def _store_strategy(draw) -> bytes:
    data = bytearray(_valid_store())
    preset = draw(_PRESET)
    if preset is not None:
        data[16:36] = struct.pack("<5I", *preset)
    for field, value in draw(_FIELD_EDITS):
        data[8 + 4 * field: 12 + 4 * field] = struct.pack("<I", value)
    body = draw(_BODY)
    if body is not None:
        kind, n = body
        data = data[:64 + n] if kind == "cut" else data + bytes(n)
    plan = draw(_MUTATION)
    return mutate(bytes(data), plan) if plan else bytes(data)


_store_file = _store_strategy()


@FUZZ
@given(batch(st.binary(max_size=256)))
def test_fuzz_store_raw_bytes(batch):
    for data in batch:
        check("block store, raw bytes", _open, b"KVPOTBLK" + data)


@FUZZ
@given(batch(_store_file))
def test_fuzz_store_structured(batch):
    for data in batch:
        check("block store, header fields and mutations", _open, data)


def test_valid_store_is_opened():
    """The structured strategy starts from a store the reader opens (else it would only test refusals)."""
    _open(_valid_store())
    path = os.path.join(_folder(), "fuzzed.kvblk")
    with BlockStore(path) as store:
        assert store.n_blocks == N_BLOCKS and store.shape == (2, 2, 4, 3, 2)
