"""Property-based fuzzing (Hypothesis) of the weights-only checkpoint reader
(kvpot.converters.torch_checkpoint.read_state_dict), with its memory bound asserted.

Property (tests/fuzzlib.py): every input is either accepted or refused with one KvpotError line; and
the reader's peak of traced allocations (tracemalloc: Python objects and NumPy arrays) stays below a
bound computed from the input: a small multiple of the bytes the file holds, inflated. Inputs:
  * structured: zips written field by field (tests/torch_ckpt.py) holding a state-dict pickle whose
    views have fuzzed storage types, element counts, offsets, sizes and strides, and storage entries
    whose declared sizes, payloads and compression are fuzzed (deflated zeros inflate ~1000x);
    the pickle's bytes mutated in one input of four;
  * mutated: the bytes of a valid checkpoint (torch.save's layout) flipped, cut, extended, overwritten.

`make test` runs KVPOT_FUZZ_EXAMPLES (default 300) per target; KVPOT_FUZZ_EXAMPLES=100000 the long run.
"""

from __future__ import annotations

import os
import tempfile
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
from fuzzlib import FUZZ, MUTATIONS, batch, check, mutate, write_report
from hypothesis import given
from hypothesis import strategies as st
from torch_ckpt import tensor_pickle, write_checkpoint, write_raw_zip

from kvpot.converters.torch_checkpoint import read_state_dict

_DIR = Path(tempfile.mkdtemp(prefix="kvpot-fuzz-ckpt-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
_INFLATED_MAX = 256 << 10  # the largest payload a structured input inflates to
# the reader may hold an entry's bytes, the array viewing them, its float32 widening and a copy at once
_FACTOR, _SLACK = 8, 2 << 20


def teardown_module(module) -> None:
    write_report()
    for f in _DIR.iterdir():
        f.unlink()
    _DIR.rmdir()


def _read_bounded(path: Path, real_bytes: int) -> None:
    """read_state_dict under tracemalloc: the peak must stay within the bound of the input's real bytes."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        try:
            read_state_dict(path)
        finally:
            peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    bound = _FACTOR * real_bytes + _SLACK
    assert peak <= bound, f"the reader peaked at {peak:,} bytes for an input holding {real_bytes:,}"


# -- structured ----------------------------------------------------------------------------------------------

_TAGS = ("FloatStorage", "HalfStorage", "BFloat16Storage", "DoubleStorage", "LongStorage", "IntStorage",
         "ByteStorage", "")
_COUNT = st.one_of(st.integers(-2, 16), st.sampled_from((2**20, 2**31 - 1, 30000)))
_VIEW = st.tuples(st.sampled_from(("w", "fc1", "x")), st.sampled_from(_TAGS[:3] + _TAGS), st.sampled_from("012"),
                  _COUNT, st.one_of(st.integers(-1, 4), st.just(2**31 - 1)),
                  st.lists(_COUNT, max_size=3), st.lists(st.one_of(st.integers(-1, 8), st.just(2**31 - 1)), max_size=3))
# a storage entry: key, payload (stored bytes, or deflated zeros of some length), declared size (its own
# length, or another), stored or deflated
_ENTRY = st.tuples(st.sampled_from("0123"), st.one_of(st.binary(max_size=96), st.integers(0, _INFLATED_MAX)),
                   st.one_of(st.none(), st.sampled_from((0, 1, 4, 64, 2**31, 2**32 - 1))), st.booleans())
_CHECKPOINT = st.tuples(st.lists(_VIEW, min_size=1, max_size=3), st.lists(_ENTRY, max_size=3),
                        st.one_of(st.none(), st.none(), st.none(), MUTATIONS))
# an honest checkpoint (views that fit their storages, entries of their declared sizes), so the reader's
# accepting path is fuzzed too: name, storage type, offset, shape, reversed strides (a transposed view),
# whether the entry is deflated, and one fuzzed view or entry put in its place, half the time
_HONEST_VIEW = st.tuples(st.sampled_from(("w", "fc1", "fc2")), st.sampled_from(_TAGS[:6]), st.integers(0, 2),
                         st.lists(st.integers(0, 4), max_size=3), st.booleans(), st.booleans())
_HONEST = st.tuples(st.lists(_HONEST_VIEW, min_size=1, max_size=3),
                    st.one_of(st.none(), st.tuples(st.integers(0, 2), _VIEW), st.tuples(st.integers(0, 2), _ENTRY)))
_ITEMSIZE = {"FloatStorage": 4, "HalfStorage": 2, "BFloat16Storage": 2, "DoubleStorage": 8, "LongStorage": 8,
             "IntStorage": 4}


def _zeros_deflated(n: int) -> tuple[bytes, int]:
    comp = zlib.compressobj(1, zlib.DEFLATED, -15)
    raw = bytes(n)
    return comp.compress(raw) + comp.flush(), zlib.crc32(raw)


def _structured(spec) -> None:
    views, entries, plan = spec
    pkl = tensor_pickle(views)
    if plan:
        pkl = mutate(pkl, plan)
    files = [("a/data.pkl", pkl, 0, zlib.crc32(pkl), len(pkl))]
    real = len(pkl)
    seen = set()
    for key, payload, declared, deflate in entries:
        if key in seen:
            continue
        seen.add(key)
        if isinstance(payload, int):
            size = payload
            data, crc = _zeros_deflated(size)
            method = 8
        else:
            size, crc = len(payload), zlib.crc32(payload)
            data, method = (zlib.compress(payload)[2:-4], 8) if deflate else (payload, 0)
        files.append((f"a/data/{key}", data, method, crc, size if declared is None else declared))
        real += size
    path = _DIR / "structured.bin"
    write_raw_zip(path, files)
    _read_bounded(path, real + path.stat().st_size)


def _honest(spec) -> tuple:
    """The structured spec of an honest checkpoint, with at most one view or entry swapped for a fuzzed one."""
    views, swap = spec
    out_views, entries = [], []
    for i, (name, tag, offset, shape, transposed, deflate) in enumerate(views):
        numel = int(np.prod(shape)) if shape else 1
        stride = [int(np.prod(shape[d + 1:])) for d in range(len(shape))]
        if transposed and len(shape) == 2:
            shape, stride = shape[::-1], stride[::-1]
        key = str(i)
        out_views.append((f"{name}.{i}", tag, key, offset + numel, offset, shape, stride))
        entries.append((key, bytes((offset + numel) * _ITEMSIZE[tag]), None, deflate))
    if swap is not None:
        at, fuzzed = swap
        if len(fuzzed) == 7:
            out_views[at % len(out_views)] = fuzzed
        else:
            entries[at % len(entries)] = fuzzed
    return out_views, entries, None


@FUZZ
@given(batch(_CHECKPOINT))
def test_fuzz_checkpoint_structured(batch):
    for spec in batch:
        check("checkpoint, structured", _structured, spec)


@FUZZ
@given(batch(_HONEST))
def test_fuzz_checkpoint_honest(batch):
    for spec in batch:
        check("checkpoint, honest with one fuzzed part", _structured, _honest(spec))


# -- mutated bytes --------------------------------------------------------------------------------------------

def _valid_bytes() -> bytes:
    path = _DIR / "valid.bin"
    rng = np.random.default_rng(0)
    write_checkpoint(path, {"model.layers.0.self_attn.fc1.weight": rng.standard_normal((4, 6)).astype(np.float32),
                            "model.layers.0.self_attn.fc2.weight": rng.standard_normal((2, 4)).astype(np.float32)})
    read_state_dict(path)
    return path.read_bytes()


VALID = _valid_bytes()


def _mutated(data: bytes) -> None:
    path = _DIR / "mutated.bin"
    path.write_bytes(data)
    _read_bounded(path, len(data))


@FUZZ
@given(batch(MUTATIONS))
def test_fuzz_checkpoint_mutated(batch):
    for plan in batch:
        check("checkpoint, mutated bytes", _mutated, mutate(VALID, plan))


def test_inputs_start_from_readable_checkpoints():
    """Both strategies reach acceptance (else they would only test refusals)."""
    _mutated(VALID)
    _structured(([("w", "FloatStorage", "0", 4, 0, [2, 2], [2, 1])], [("0", bytes(16), None, True)], None))
