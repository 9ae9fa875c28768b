"""Property-based fuzzing (Hypothesis) of the adapter loaders: Locret's retaining heads and
EdgeInfinite's memory gate (kvpot.converters.adapter), checked against a base model's facts.

Property (tests/fuzzlib.py): every input is either accepted or refused with one KvpotError line.
Inputs start from adapters kvpot's own writer makes (`_write_adapter` with the key/values and tensors
of `retaining_heads_contents` / `memory_gate_contents`), so they reach past the GGUF header checks:
  * structured: key/values dropped, or replaced by values of other GGUF types and ranges; tensors
    dropped, renamed, reshaped or retyped;
  * mutated: the bytes of a valid adapter flipped, cut, extended, overwritten.
The base model's facts are a ModelTarget built once (no model loads per input); an accepted adapter
must agree with them (the loaders' contract), which the check asserts.

`make test` runs KVPOT_FUZZ_EXAMPLES (default 300) per target; KVPOT_FUZZ_EXAMPLES=100000 the long run.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
from fuzzlib import FUZZ, MUTATIONS, batch, check, mutate, write_report
from hypothesis import given
from hypothesis import strategies as st

from kvpot.converters.adapter import (
    MEMORY_GATE,
    RETAINING_HEADS,
    BaseIdentity,
    MemoryGate,
    ModelTarget,
    RetainingHeads,
    _write_adapter,
    memory_gate_contents,
    read_memory_gate,
    read_retaining_heads,
    retaining_heads_contents,
)

BASE = BaseIdentity(arch="llama", n_layer=2, n_head=4, n_head_kv=2, head_dim_k=4, head_dim_v=4, n_embd=16,
                    sha256="5e" * 32)
TARGET = ModelTarget(base=BASE, pot_layers=(0, 1), name="base.gguf")
_DIR = Path(tempfile.mkdtemp(prefix="kvpot-fuzz-adapters-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))


def teardown_module(module) -> None:
    write_report()
    for f in _DIR.iterdir():
        f.unlink()
    _DIR.rmdir()


def _heads_contents():
    rng = np.random.default_rng(0)
    heads = RetainingHeads(base=BASE, activation="silu",
                           fc1=[rng.standard_normal((3, BASE.qkv_width())).astype(np.float32) for _ in range(2)],
                           fc2=[rng.standard_normal((BASE.n_head_kv, 3)).astype(np.float32) for _ in range(2)])
    return retaining_heads_contents(heads, dtype="f16")


def _gate_contents():
    return memory_gate_contents(MemoryGate.initial([0, 1], BASE.head_dim_v, BASE.n_head, d_h=3, base=BASE))


CONTENTS = {RETAINING_HEADS: _heads_contents(), MEMORY_GATE: _gate_contents()}


def _load(kind: str, path: Path) -> None:
    """The loader for `kind`, and the contract of what it accepts: made for the target, shapes that fit."""
    if kind == RETAINING_HEADS:
        heads = read_retaining_heads(path, model=TARGET)
        assert heads.base == BASE and len(heads.fc1) == BASE.n_layer
        assert all(w.shape == (heads.hidden, BASE.qkv_width()) for w in heads.fc1)
    else:
        gate = read_memory_gate(path, model=TARGET)
        assert gate.base == BASE and tuple(gate.layers) == TARGET.pot_layers
        assert gate.d_v == BASE.head_dim_v and gate.n_head == BASE.n_head


def _write(fields, tensors, name: str) -> Path:
    path = _DIR / name
    _write_adapter(path, BASE.arch, fields, tensors)
    return path


def _valid_bytes(kind: str) -> bytes:
    path = _write(*CONTENTS[kind], "valid.gguf")
    data = path.read_bytes()
    _load(kind, path)  # the starting point is accepted
    return data


VALID = {kind: _valid_bytes(kind) for kind in CONTENTS}


# -- structured: kvpot's own adapter with its key/values and tensors edited ----------------------------------

_KEYS = sorted({key for fields, _ in CONTENTS.values() for _, key, _ in fields}
               | {"general.architecture", "kvpot.memory_gate.layers", "kvpot.retaining_heads.hidden", "x.unknown"})
_INTS = st.one_of(st.integers(-3, 40), st.sampled_from((2**31 - 1, 2**31, 2**32 - 1, 2**63 - 1, 1 << 20, (1 << 20) + 1)))
_VALUE = st.one_of(
    st.tuples(st.just("uint32"), st.integers(0, 2**32 - 1)),
    st.tuples(st.just("int32"), st.integers(-2**31, 2**31 - 1)),
    st.tuples(st.just("uint64"), st.sampled_from((0, 1, 2, 4, 2**63, 2**64 - 1))),
    st.tuples(st.just("int32"), _INTS.filter(lambda v: -2**31 <= v < 2**31)),
    st.tuples(st.just("float32"), st.floats(width=32)),
    st.tuples(st.just("float64"), st.sampled_from((0.0, 1.0, 4.0, float("nan"), float("inf"), -1.0))),
    st.tuples(st.just("bool"), st.booleans()),
    st.tuples(st.just("string"), st.one_of(st.sampled_from(("silu", "gelu", "relu", "llama", "gemma3", "5e" * 32,
                                                             RETAINING_HEADS, MEMORY_GATE, "adapter", "model", "")),
                                           st.text(max_size=12))),
    st.tuples(st.just("array"), st.one_of(st.lists(st.integers(-2, 4), max_size=4),
                                          st.lists(st.text(max_size=3), min_size=1, max_size=2))),
)
_FIELD_EDIT = st.one_of(st.tuples(st.just("drop"), st.sampled_from(_KEYS), st.none()),
                        st.tuples(st.just("set"), st.sampled_from(_KEYS), _VALUE))
_TENSOR_EDIT = st.tuples(st.sampled_from(("drop", "rename", "reshape", "f32", "f16", "i32", "dup")),
                         st.integers(0, 1 << 10), st.sampled_from(("blk.0.mg_g", "blk.2.rh_fc1.weight", "x", "blk.1.mg_w1.bias")))
_EDITS = st.tuples(st.sampled_from((RETAINING_HEADS, MEMORY_GATE)), st.lists(_FIELD_EDIT, max_size=3),
                   st.lists(_TENSOR_EDIT, max_size=2))


def _edit_tensors(tensors: list, edits: list) -> list:
    out = list(tensors)
    for what, at, name in edits:
        if not out:
            break
        i = at % len(out)
        n, a, raw = out[i]
        if what == "drop":
            del out[i]
        elif what == "rename":
            if name not in {t[0] for t in out}:
                out[i] = (name, a, raw)
        elif what == "reshape":
            out[i] = (n, np.zeros((a.size + 1,), np.float32), None)
        elif what == "dup":
            out.append((n + ".b" if n + ".b" not in {t[0] for t in out} else "y", a, raw))
        else:
            out[i] = (n, np.asarray(a, dtype={"f32": np.float32, "f16": np.float16, "i32": np.int32}[what]), None)
    return out


def _structured(spec) -> None:
    kind, field_edits, tensor_edits = spec
    fields, tensors = CONTENTS[kind]
    fields = list(fields)
    for action, key, value in field_edits:
        fields = [f for f in fields if f[1] != key]
        if action == "set":
            if key == "general.architecture" and value[0] != "string":
                continue  # the writer sets the architecture itself; only its text can differ
            fields.append((value[0], key, value[1]))
    try:
        path = _write(fields, _edit_tensors(tensors, tensor_edits), "structured.gguf")
    except Exception:  # gguf-py refuses some combinations when writing (duplicate keys, mistyped arrays)
        return
    _load(kind, path)


@FUZZ
@given(batch(_EDITS))
def test_fuzz_adapter_structured(batch):
    for spec in batch:
        check(f"adapter, structured ({'heads' if spec[0] == RETAINING_HEADS else 'gate'})", _structured, spec)


# -- mutated bytes ------------------------------------------------------------------------------------------

def _mutated(kind: str):
    def load(data: bytes) -> None:
        path = _DIR / "mutated.gguf"
        path.write_bytes(data)
        _load(kind, path)
    return load


_LOADERS = {kind: _mutated(kind) for kind in VALID}


@FUZZ
@given(batch(st.tuples(st.sampled_from((RETAINING_HEADS, MEMORY_GATE)), MUTATIONS)))
def test_fuzz_adapter_mutated(batch):
    for kind, plan in batch:
        check(f"adapter, mutated bytes ({'heads' if kind == RETAINING_HEADS else 'gate'})", _LOADERS[kind],
              mutate(VALID[kind], plan))


def test_structured_inputs_start_from_accepted_adapters():
    """Both strategies start from files the loaders accept (else they would only test refusals)."""
    for kind in VALID:
        _structured((kind, [], []))
        _LOADERS[kind](VALID[kind])
