"""Property-based fuzzing (Hypothesis) of the checks after parsing: saved contexts with a valid checksum
whose header fields, engine bookkeeping, arrays and kvpot C state are fuzzed, through
`check_saved` (what `read_context`, and so every reopening, runs before anything is restored); and GGUF
files with fuzzed architecture facts, tensor infos and counts, through `read_header_from` and
`model_facts` (what the model loader runs before llama.cpp opens the file). No model is loaded.

Property (tests/fuzzlib.py): every input is either accepted or refused with one KvpotError line.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import struct

import numpy as np
from fuzzlib import FUZZ, MUTATIONS, batch, check, mutate, write_report
from hypothesis import given
from hypothesis import strategies as st

from kvpot.models.gguf_file import GGUF_MAGIC, model_facts, read_header_from
from kvpot.session.context_file import check_saved, parse_context
from kvpot.state.engine_state import encode_tree
from kvpot.state.state_container import _PREFIX, _SECTION, _TAGS, FORMAT_VERSION, MAGIC, _arrays_bytes


def teardown_module(module) -> None:
    write_report()


# -- saved contexts ----------------------------------------------------------------------------------

L, H, CELLS, SEEN = 2, 3, 5, 42


def _pot(n_compacted: int = 2) -> bytes:
    rope = np.arange(L * H * n_compacted) % SEEN
    return np.concatenate([[int.from_bytes(b"KVPS", "little"), 2, L, H, n_compacted, 16, 1], rope,
                           [n_compacted] * L]).astype("<i4").tobytes()


def _base(policy: str) -> tuple[dict, dict, dict[str, np.ndarray], bytes]:
    """(header, engine values, arrays, POT bytes) of a context kvpot would accept, for `policy`."""
    rng = np.random.default_rng(0)
    arrays = {"positions": rng.integers(0, SEEN, size=(L, H, CELLS))}
    state = {"h2o": {"_acc": rng.random((L, H, CELLS))},
             "imdc:pruner=snapkv": {"_plan": (7, np.arange(3), np.arange(3)), "_declared": 100, "_n_layer": L},
             "infinipot": {"_nuc": rng.random((L, H, CELLS)).astype(np.float32), "_question": "q?"}}[policy]
    values = {"tokens_seen": SEEN, "pos_next": SEEN, "n_compactions": 1, "compact_seconds": 0.5, "nll_sum": 3.0,
              "nll_count": 9, "_carry_lp": float("nan"), "_bos_done": True, "step": 2, "_fetch_cell0": 0,
              "_fetch_n": 0, "_fetch_bs": 0, "_fetch_local": 0, "_mem_cell0": 0, "_mem_n": 0, "_mem_distance": 0,
              "policy": encode_tree(state, arrays, "policy")}
    settings = {"policy": policy, "budget": 16, "chunk": 16, "threads": 1, "prompt": "auto", "max_tokens": 4}
    header = {"format": "kvpot saved context", "kvpot_version": "0", "runtime": {"abi": 4, "llama_commit": "abc"},
              "model": {"name": "m", "path": "/m.gguf", "sha256": "ab" * 32, "architecture": "llama"},
              "policy": policy, "settings": settings, "n_ctx": 64, "prompt_format": "completion",
              "tokens_read": 40, "sources": [{"name": "doc.txt", "size": 200}], "turns": 0}
    return header, values, arrays, _pot()


_POLICIES = ("h2o", "imdc:pruner=snapkv", "infinipot")
_BASES = {p: _base(p) for p in _POLICIES}


def _assemble(header: dict, values: dict, arrays: dict[str, np.ndarray], pot: bytes) -> bytes:
    head = json.dumps(dict(header, engine=values), sort_keys=True).encode()
    parts = [_PREFIX.pack(MAGIC, FORMAT_VERSION, len(head)), head]
    for tag, blob in zip(_TAGS, (b"seq", pot, _arrays_bytes(arrays))):
        parts += [_SECTION.pack(tag, len(blob)), blob]
    body = b"".join(parts)
    return body + hashlib.sha256(body).digest()  # a valid checksum: the checks behind it are what is fuzzed


def _check_context(data: bytes) -> None:
    check_saved(parse_context(data, "fuzzed.kvctx"), "fuzzed.kvctx")


_BOUNDARY = st.sampled_from((0, 1, -1, 15, 16, 63, 64, 65, SEEN - 1, SEEN, SEEN + 1, 2**30, 2**31 - 1, 2**31,
                             2**63 - 1, 2**63, 10**12, -2**31))
_LEAF = st.one_of(_BOUNDARY, st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True),
                  st.booleans(), st.none(), st.text(max_size=8),
                  st.sampled_from(("auto", "chat", "completion", "h2o", "infinipot", "snapkv", "nosuch", "ab" * 32)))
_JSON = st.recursive(_LEAF, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                   st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                     max_leaves=6)
# where a fuzzed value goes: a header field, a settings key, a nested header field, an engine value, a policy field
_FIELD = st.sampled_from(
    [("header", k) for k in ("format", "kvpot_version", "policy", "settings", "n_ctx", "prompt_format", "tokens_read",
                             "sources", "turns", "model", "runtime")]
    + [("settings", k) for k in ("policy", "budget", "chunk", "threads", "prompt", "max_tokens", "extra")]
    + [("model", k) for k in ("name", "path", "sha256", "architecture")] + [("runtime", "abi")]
    + [("engine", k) for k in ("tokens_seen", "pos_next", "n_compactions", "compact_seconds", "nll_sum", "nll_count",
                               "_carry_lp", "_bos_done", "step", "_fetch_cell0", "_fetch_n", "_fetch_bs",
                               "_fetch_local", "_mem_cell0", "_mem_n", "_mem_distance", "policy", "extra")]
    + [("policy", k) for k in ("_acc", "_plan", "_declared", "_n_layer", "_nuc", "_question", "pruner", "x")])
_EDIT = st.one_of(st.tuples(st.just("set"), _FIELD, _JSON), st.tuples(st.just("drop"), _FIELD, st.none()))
_SHAPE = st.lists(st.integers(0, 6), max_size=4).map(tuple)
_DTYPE = st.sampled_from((np.int64, np.int32, np.uint8, np.float32, np.float64, np.bool_))
_ARRAY_EDIT = st.one_of(st.none(), st.tuples(st.sampled_from(("positions", "policy._acc", "policy._nuc", "memory",
                                                              "policy._plan.1")),
                                             _SHAPE, _DTYPE, st.integers(-2**40, 2**40)))
_POT_EDIT = st.one_of(st.none(), st.tuples(st.integers(0, 30), _BOUNDARY), st.tuples(st.just(-1), st.integers(0, 4)))


def _apply(header: dict, values: dict, where: str, key: str, value, drop: bool) -> None:
    target = {"header": header, "settings": header["settings"], "model": header["model"],
              "runtime": header["runtime"], "engine": values,
              "policy": values["policy"] if isinstance(values.get("policy"), dict) else {}}[where]
    if not isinstance(target, dict):
        return  # an earlier edit replaced the table this one goes into
    if drop:
        target.pop(key, None)
    else:
        target[key] = value


@st.composite
def _fuzzed_context(draw) -> bytes:
    header, values, arrays, pot = copy.deepcopy(_BASES[draw(st.sampled_from(_POLICIES))])
    for action, (where, key), value in draw(st.lists(_EDIT, max_size=3)):
        try:
            _apply(header, values, where, key, value, action == "drop")
        except (KeyError, TypeError):  # the table it goes into was replaced by an earlier edit
            pass
    edit = draw(_ARRAY_EDIT)
    if edit is not None:
        name, shape, dtype, value = edit
        arrays[name] = np.full(shape, value % 256 if dtype in (np.uint8, np.bool_) else value).astype(dtype)
    pot_edit = draw(_POT_EDIT)
    if pot_edit is not None:
        word, value = pot_edit
        if word == -1:
            pot = _pot(value)
        else:
            words = np.frombuffer(pot, dtype="<i4").copy()
            words[word % words.size] = np.int64(value).astype(np.int32) if -2**31 <= value < 2**31 else 0
            pot = words.tobytes()
    return _assemble(header, values, arrays, pot)


_context = _fuzzed_context()


@FUZZ
@given(batch(_context))
def test_fuzz_context_header_fields(batch):
    for data in batch:
        check("saved-context fields (valid checksum)", _check_context, data)


@FUZZ
@given(batch(st.tuples(st.sampled_from(_POLICIES), MUTATIONS)))
def test_fuzz_context_header_bytes(batch):
    """The header's JSON text mutated (then the checksum recomputed): what a hand edit does."""
    for policy, plan in batch:
        header, values, arrays, pot = _BASES[policy]
        good = _assemble(header, values, arrays, pot)
        n_head = _PREFIX.unpack_from(good)[2]
        head = mutate(good[_PREFIX.size:_PREFIX.size + n_head], plan)
        body = _PREFIX.pack(MAGIC, FORMAT_VERSION, len(head)) + head + good[_PREFIX.size + n_head:-32]
        check("saved-context header text (valid checksum)", _check_context, body + hashlib.sha256(body).digest())


def test_fuzzed_contexts_start_from_accepted_ones():
    for policy in _POLICIES:
        _check_context(_assemble(*_BASES[policy]))


# -- GGUF facts --------------------------------------------------------------------------------------

def _s(raw: bytes) -> bytes:
    return struct.pack("<Q", len(raw)) + raw


_KV_TYPES = {4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def _kv(key: str, value) -> bytes:
    """One key/value with the GGUF type its Python value suggests (ints too large for a type wrap)."""
    k = _s(key.encode())
    if isinstance(value, bool):
        return k + struct.pack("<I?", 7, value)
    if isinstance(value, int):
        vtype = 5 if -2**31 <= value < 0 else 4 if 0 <= value < 2**32 else 11 if value < 0 else 10
        value = value % 2**64 if vtype == 10 else (value + 2**63) % 2**64 - 2**63 if vtype == 11 else value
        return k + struct.pack("<I", vtype) + struct.pack(_KV_TYPES[vtype], value)
    if isinstance(value, float):
        return k + struct.pack("<Id", 12, value)
    if isinstance(value, list):
        return k + struct.pack("<IIQ", 9, 4, len(value)) + b"".join(struct.pack("<I", v % 2**32) for v in value)
    return k + struct.pack("<I", 8) + _s(str(value).encode())


_FACT_KEYS = ("block_count", "attention.head_count", "attention.head_count_kv", "embedding_length", "context_length",
              "attention.key_length", "attention.value_length", "feed_forward_length", "vocab_size",
              "attention.sliding_window", "attention.sliding_window_pattern")
_GOOD_FACTS = {"block_count": 2, "attention.head_count": 4, "attention.head_count_kv": 2, "embedding_length": 64,
               "context_length": 512}
_FACT_VALUE = st.one_of(_BOUNDARY, st.integers(-2**64, 2**64), st.floats(allow_nan=True, allow_infinity=True),
                        st.booleans(), st.text(max_size=6), st.lists(st.integers(0, 2**32), max_size=4))
_FACTS = st.dictionaries(st.sampled_from(_FACT_KEYS), _FACT_VALUE, max_size=4)
_ARCH = st.one_of(st.sampled_from(("llama", "gemma3", "qwen2")), st.text(max_size=6), st.integers(0, 9))
_DROPS = st.lists(st.sampled_from(tuple(_GOOD_FACTS)), max_size=2)
_TENSOR = st.tuples(st.text(max_size=70), st.lists(st.one_of(st.integers(0, 64), _BOUNDARY), max_size=5),
                    st.sampled_from((0, 1, 2, 4, 8, 12, 30, 43, 99)), st.one_of(st.none(), st.integers(0, 2**64 - 1)))
_TENSORS = st.lists(_TENSOR, max_size=4)
_COUNT = st.one_of(st.none(), st.none(), st.none(), st.integers(0, 2**64 - 1), st.integers(0, 64))
_ALIGN = st.one_of(st.none(), st.none(), st.sampled_from((1, 16, 24, 32, 0, 2**31)))
_TYPE_BYTES = {0: (1, 4), 1: (1, 2), 2: (32, 18), 8: (32, 34), 12: (256, 144), 30: (1, 2)}


def _tensor_info(name: str, dims: list[int], gtype: int, offset: int) -> bytes:
    return (_s(name.encode()) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<q", max(-2**63, min(d, 2**63 - 1)))
                                                                        for d in dims)
            + struct.pack("<IQ", gtype, offset))


@st.composite
def _gguf_strategy(draw) -> bytes:
    arch = draw(_ARCH)
    facts = dict(_GOOD_FACTS, **draw(_FACTS))
    for key in draw(_DROPS):
        facts.pop(key, None)
    kvs = [_kv("general.architecture", arch)] + [_kv(f"{arch}.{k}", v) for k, v in facts.items()]
    align = draw(_ALIGN)
    if align is not None:
        kvs.append(_kv("general.alignment", align))
    infos, data_len = [], 0
    for name, dims, gtype, offset in draw(_TENSORS):
        block, size = _TYPE_BYTES.get(gtype, (1, 1))
        infos.append(_tensor_info(name, dims, gtype, data_len if offset is None else offset))
        n = int(np.prod([max(d, 0) for d in dims], dtype=object)) if dims else 1
        data_len += -(-(n // block * size) // 32) * 32 if n < 2**20 else 0
    n_tensors, n_kv = draw(_COUNT), draw(_COUNT)
    head = GGUF_MAGIC + struct.pack("<IQQ", 3, len(infos) if n_tensors is None else n_tensors,
                                    len(kvs) if n_kv is None else n_kv)
    body = head + b"".join(kvs) + b"".join(infos)
    data = body + b"\0" * (-len(body) % 32) + bytes(min(data_len, 1 << 16))
    plan = draw(st.one_of(st.none(), st.none(), MUTATIONS))
    return mutate(data, plan) if plan else data


_gguf = _gguf_strategy()


def _check_gguf(data: bytes) -> None:
    kv = read_header_from(io.BytesIO(data), "fuzzed.gguf")
    model_facts(kv, "fuzzed.gguf", len(data))


@FUZZ
@given(batch(_gguf))
def test_fuzz_gguf_facts(batch):
    for data in batch:
        check("gguf facts and tensor infos", _check_gguf, data)


def test_fuzzed_gguf_starts_from_an_accepted_file():
    kvs = [_kv("general.architecture", "llama")] + [_kv(f"llama.{k}", v) for k, v in _GOOD_FACTS.items()]
    body = GGUF_MAGIC + struct.pack("<IQQ", 3, 1, len(kvs)) + b"".join(kvs) + _tensor_info("w", [8, 2], 0, 0)
    _check_gguf(body + b"\0" * (-len(body) % 32) + bytes(64))
