"""Property-based fuzzing (Hypothesis) of the two loaders that read files a user hands kvpot before
any C code sees them: the saved-context reader and the GGUF header checks.

Property (tests/fuzzlib.py): every input is either accepted or refused with one KvpotError line.
Inputs are built three ways so they
reach past the first check: raw bytes; structurally valid files with fuzzed fields (the saved
context's checksum recomputed, so the parser behind it is reached); valid files with fuzzed
mutations (byte flips, cuts, insertions), checksum recomputed again.

Hypothesis rather than a coverage-guided fuzzer (atheris): it is pip-installable everywhere
kvpot's tests run, well kept, shrinks a failure to a small input, and composes with the file
structure above; the readers are pure Python, where structure matters more than branch feedback.

`make test` runs KVPOT_FUZZ_EXAMPLES (default 300) per target; `make fuzz` runs 100,000 each and
writes the counts to KVPOT_FUZZ_REPORT (docs/fuzzing.md has the recorded run).
"""

from __future__ import annotations

import hashlib
import io
import json
import struct

import numpy as np
from fuzzlib import FUZZ, MUTATIONS, batch, check, mutate, write_report
from hypothesis import given
from hypothesis import strategies as st

from kvpot.models.gguf_file import GGUF_MAGIC, read_header_from
from kvpot.session.context_file import parse_context
from kvpot.state.state_container import _PREFIX, _SECTION, _TAGS, FORMAT_VERSION, MAGIC


def teardown_module(module) -> None:
    write_report()


# -- saved contexts ----------------------------------------------------------------------------------

_json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63), st.floats(allow_nan=False), st.text(max_size=8))
_json = st.recursive(_json_leaf, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                         st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                     max_leaves=8)


def _good_header() -> dict:
    return {"format": "kvpot saved context", "kvpot_version": "0", "runtime": {"abi": 4, "llama_commit": "abc"},
            "model": {"name": "m", "path": "/m.gguf", "sha256": "0" * 64, "architecture": "llama"},
            "policy": "streaming", "settings": {"budget": 16}, "n_ctx": 256, "prompt_format": "completion",
            "tokens_read": 3, "sources": [{"name": "a", "size": 3}], "turns": 0,
            "engine": {"tokens_seen": 3, "policy": {"x": {"__array__": "policy.x"}}}}


_HEADER_KEY = st.sampled_from(tuple(sorted(_good_header())))
# replace, drop or retype some fields (a dropped key drawn again is dropped again: a no-op)
_HEADER_EDITS = st.lists(st.one_of(st.tuples(st.just("drop"), _HEADER_KEY, st.none()),
                                   st.tuples(st.just("replace"), _HEADER_KEY, _json),
                                   st.tuples(st.just("keep"), _HEADER_KEY, st.none())), max_size=3)


@st.composite
def _header_strategy(draw) -> dict:
    h = _good_header()
    for action, key, value in draw(_HEADER_EDITS):
        if action == "drop":
            h.pop(key, None)
        elif action == "replace":
            h[key] = value
    return h


_header = _header_strategy()


def _arrays_blob(arrays: dict[str, bytes]) -> bytes:
    out = b""
    for name, raw in arrays.items():
        nb = name.encode()
        out += struct.pack("<I", len(nb)) + nb + struct.pack("<Q", len(raw)) + raw
    return out


def _npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


_ARRAY = st.tuples(st.lists(st.integers(0, 4), max_size=3).map(tuple),           # shape
                   st.sampled_from((np.int64, np.float32, np.int8, np.uint16)),    # dtype
                   st.one_of(st.none(), MUTATIONS),                               # mutations of its .npy bytes
                   st.sampled_from(("positions", "policy.x", "a")))                # its name
_ARRAYS = st.lists(_ARRAY, max_size=3)


@st.composite
def _arrays_strategy(draw) -> bytes:
    items = {}
    for i, (shape, dtype, plan, name) in enumerate(draw(_ARRAYS)):
        raw = _npy(np.zeros(shape, dtype=dtype))
        items[name if name != "a" else f"a{i}"] = mutate(raw, plan) if plan else raw
    return _arrays_blob(items)


_arrays = _arrays_strategy()


def _assemble(header: bytes, blobs: list[bytes], tags=_TAGS, version: int = FORMAT_VERSION) -> bytes:
    parts = [_PREFIX.pack(MAGIC, version, len(header)), header]
    for tag, blob in zip(tags, blobs):
        parts += [_SECTION.pack(tag, len(blob)), blob]
    body = b"".join(parts)
    return body + hashlib.sha256(body).digest()


def _with_digest(data: bytes) -> bytes:
    """Recompute the trailing SHA-256 so a mutation reaches the parser behind the checksum."""
    if len(data) < 32:
        return data
    body = data[:-32]
    return body + hashlib.sha256(body).digest()


_BAD_HEADER = st.one_of(st.none(), st.sampled_from((b"", b"[]", b"{", b"\xff\xfe", b"null", b'{"engine": 1}')))
_BLOB = st.binary(max_size=64)
_VERSION = st.sampled_from((FORMAT_VERSION,) * 6 + (0, 2))
# mutations, and whether the checksum is recomputed after them (3 times in 4)
_CONTEXT_MUTATION = st.one_of(st.none(), st.tuples(MUTATIONS, st.integers(0, 3)))


@st.composite
def _context_strategy(draw) -> bytes:
    header = json.dumps(draw(_header)).encode()
    bad = draw(_BAD_HEADER)
    if bad is not None:
        header = bad or header
    blobs = [draw(_BLOB), draw(_BLOB), draw(_arrays)]
    data = _assemble(header, blobs, version=draw(_VERSION))
    mutation = draw(_CONTEXT_MUTATION)
    if mutation is not None:
        data = mutate(data, mutation[0])
        if mutation[1]:
            data = _with_digest(data)
    return data


_context_file = _context_strategy()


@FUZZ
@given(batch(st.binary(max_size=256)))
def test_fuzz_context_raw_bytes(batch):
    for data in batch:
        check("context, raw bytes", parse_context, MAGIC + data if data[:1] == b"K" else data)


@FUZZ
@given(batch(_context_file))
def test_fuzz_context_structured(batch):
    for data in batch:
        check("context, structured and mutated", parse_context, data)


def test_good_synthetic_context_is_accepted():
    """The structured strategy starts from files the reader accepts (else it would only test refusals)."""
    arrays = _arrays_blob({"positions": _npy(np.zeros((1, 1, 3), np.int64)), "policy.x": _npy(np.zeros(3))})
    saved = parse_context(_assemble(json.dumps(_good_header()).encode(), [b"s", b"p", arrays]))
    assert saved.header["n_ctx"] == 256 and saved.state.arrays["positions"].shape == (1, 1, 3)


# -- GGUF headers -----------------------------------------------------------------------------------

def _gguf_string(s: bytes) -> bytes:
    return struct.pack("<Q", len(s)) + s


_SCALAR_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_SCALAR_RAW = {t: st.binary(min_size=struct.calcsize(f), max_size=struct.calcsize(f)) for t, f in _SCALAR_FMT.items()}
_GGUF_STRING = st.binary(max_size=12)


def _gguf_value_strategy(depth: int):
    """A typed GGUF value (type tag + payload); arrays of depth 0 hold values of depth 1."""
    vtypes = st.sampled_from((4, 5, 6, 7, 8, 10, 12, 9) if depth == 0 else (4, 8, 10))
    items = st.lists(_gguf_value_strategy(depth + 1), max_size=5) if depth == 0 else None
    etypes = st.sampled_from((4, 8, 0))

    @st.composite
    def value(draw) -> bytes:
        vtype = draw(vtypes)
        if vtype == 8:
            return struct.pack("<I", 8) + _gguf_string(draw(_GGUF_STRING))
        if vtype == 9:
            etype = draw(etypes)
            elems = draw(items)  # values of other types: a mistyped array, as a broken file has
            body = b"".join(v[4:] if etype != 0 else b"\x01" for v in elems)
            return struct.pack("<I", 9) + struct.pack("<IQ", etype, len(elems)) + body
        return struct.pack("<I", vtype) + draw(_SCALAR_RAW[vtype])

    return value()


_KEYS = (b"general.architecture", b"general.name", b"general.type", b"llama.block_count",
         b"llama.attention.head_count", b"tokenizer.ggml.tokens", b"tokenizer.chat_template", b"x")
_GGUF_ENTRIES = st.lists(st.tuples(st.sampled_from(_KEYS), _gguf_value_strategy(0)), max_size=5)
_GGUF_VERSION = st.sampled_from((3, 3, 3, 2, 1, 4))
_N_TENSORS = st.integers(0, 10)
_ONE_IN_FIVE = st.integers(0, 4)
_U64 = st.integers(0, 2**64 - 1)
_GGUF_MUTATION = st.one_of(st.none(), MUTATIONS)


@st.composite
def _gguf_strategy(draw) -> bytes:
    entries = [_gguf_string(key) + value for key, value in draw(_GGUF_ENTRIES)]
    version = draw(_GGUF_VERSION)
    n_tensors = draw(_N_TENSORS)
    n_kv = len(entries) if draw(_ONE_IN_FIVE) else draw(_U64)  # the true count 4 times in 5
    data = GGUF_MAGIC + struct.pack("<IQQ", version, n_tensors, n_kv) + b"".join(entries)
    plan = draw(_GGUF_MUTATION)
    return mutate(data, plan) if plan else data


_gguf_file = _gguf_strategy()


def _read_gguf(data: bytes) -> None:
    read_header_from(io.BytesIO(data), "fuzzed.gguf", frozenset({"tokenizer.ggml.tokens"}))


@FUZZ
@given(batch(st.binary(max_size=128)))
def test_fuzz_gguf_raw_bytes(batch):
    for data in batch:
        check("gguf header, raw bytes", _read_gguf, GGUF_MAGIC + data)


@FUZZ
@given(batch(_gguf_file))
def test_fuzz_gguf_structured(batch):
    for data in batch:
        check("gguf header, structured and mutated", _read_gguf, data)


def test_gguf_header_of_a_real_model_is_accepted(smollm2_path):
    """The reader the fuzzer drives accepts a real model's header (so refusals are not all it does)."""
    with open(smollm2_path, "rb") as f:
        kv = read_header_from(f, smollm2_path)
    assert kv["general.architecture"] == "llama"
