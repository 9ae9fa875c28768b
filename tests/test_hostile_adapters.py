"""Hostile adapters and checkpoints: every malformed adapter GGUF, one of another type or made for
another model, and every checkpoint whose declared sizes do not fit, is refused in one line naming the
cause; the checkpoint reader's memory stays within what the tensors hold (run in a child under an
address-space limit, so a reader that allocates what a header claims fails the test, not the machine)."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest
from torch_ckpt import tensor_pickle, write_raw_zip, zeros_deflated

from kvpot.converters.adapter import (
    MEMORY_GATE,
    AdapterError,
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
from kvpot.converters.torch_checkpoint import MAX_PICKLE_BYTES

BASE = BaseIdentity(arch="llama", n_layer=2, n_head=2, n_head_kv=1, head_dim_k=8, head_dim_v=8, n_embd=16,
                    sha256="ab" * 32)
TARGET = ModelTarget(base=BASE, pot_layers=(0, 1), name="base.gguf")
LIMIT = 512 << 20  # the child's address space: far below what the hostile files claim


def heads_contents():
    rng = np.random.default_rng(0)
    heads = RetainingHeads(base=BASE, activation="silu",
                           fc1=[rng.standard_normal((4, BASE.qkv_width())).astype(np.float32) for _ in range(2)],
                           fc2=[rng.standard_normal((1, 4)).astype(np.float32) for _ in range(2)])
    return retaining_heads_contents(heads)


def gate_contents():
    return memory_gate_contents(MemoryGate.initial([0, 1], BASE.head_dim_v, BASE.n_head, base=BASE))


def write_edited(path, contents, edits: dict) -> None:
    """kvpot's own adapter, with key/values replaced ((adder, value)) or dropped (None)."""
    fields, tensors = contents
    out = [f for f in fields if f[1] not in edits]
    out += [(e[0], key, e[1]) for key, e in edits.items() if e is not None]
    _write_adapter(path, BASE.arch, out, tensors)


def test_valid_adapters_are_read_against_the_model_facts(tmp_path):
    write_edited(tmp_path / "h.gguf", heads_contents(), {})
    write_edited(tmp_path / "g.gguf", gate_contents(), {})
    assert read_retaining_heads(tmp_path / "h.gguf", model=TARGET).hidden == 4
    assert read_memory_gate(tmp_path / "g.gguf", model=TARGET).layers == [0, 1]


@pytest.mark.parametrize(("edits", "needle"), [
    ({"kvpot.base.n_layer": ("float32", float("inf"))}, "kvpot.base.n_layer is inf"),
    ({"kvpot.base.n_layer": ("uint32", 0)}, "kvpot.base.n_layer is 0"),
    ({"kvpot.base.n_head": ("string", "nine")}, "kvpot.base.n_head is 'nine'"),
    ({"kvpot.base.n_embd": ("uint64", 2**63)}, "kvpot.base.n_embd"),
    ({"kvpot.base.sha256": ("string", "x\ny")}, "not a SHA-256"),
    ({"kvpot.base.head_dim_k": None}, "lacks kvpot.base.head_dim_k"),
    ({"kvpot.retaining_heads.hidden": ("int32", -4)}, "kvpot.retaining_heads.hidden is -4"),
    ({"kvpot.retaining_heads.activation": ("string", "relu")}, "expected silu or gelu"),
    ({"kvpot.format_version": ("uint32", 2)}, "format version 2"),
    ({"adapter.type": ("string", MEMORY_GATE)}, "not kvpot.retaining_heads"),
    ({"kvpot.base.n_head_kv": ("uint32", 2)}, "made for another model"),
    ({"kvpot.retaining_heads.hidden": ("uint32", 5)},
     f"tensor blk.0.rh_fc1.weight is [4, {BASE.qkv_width()}], expected [5, {BASE.qkv_width()}]"),
])
def test_retaining_heads_refusals(tmp_path, edits, needle):
    path = tmp_path / "h.gguf"
    write_edited(path, heads_contents(), edits)
    with pytest.raises(AdapterError) as info:
        read_retaining_heads(path, model=TARGET)
    assert needle in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(("edits", "needle"), [
    ({"kvpot.memory_gate.layers": ("string", "01")}, "expected increasing layer ids"),
    ({"kvpot.memory_gate.layers": ("array", [1, 0])}, "expected increasing layer ids"),
    ({"kvpot.memory_gate.layers": ("array", [0, 7])}, "expected increasing layer ids below 2"),
    ({"kvpot.memory_gate.layers": ("array", [0])}, "made for another model (layers"),
    ({"kvpot.memory_gate.hidden": ("float64", 8.0)}, "kvpot.memory_gate.hidden is 8.0"),
    ({"kvpot.base.n_head_kv": ("uint32", 3)}, "2 query heads do not share 3 KV heads evenly"),
    ({"kvpot.base.sha256": ("string", "cd" * 32)}, "made for another model (sha256"),
    ({"general.type": ("string", "model")}, "not an adapter GGUF"),
])
def test_memory_gate_refusals(tmp_path, edits, needle):
    path = tmp_path / "g.gguf"
    write_edited(path, gate_contents(), edits)
    with pytest.raises(AdapterError) as info:
        read_memory_gate(path, model=TARGET)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_adapter_tensors_are_checked_before_their_data(tmp_path):
    """A tensor of another name, shape or type is refused from its declaration."""
    fields, tensors = gate_contents()
    cases = {"extra": tensors + [("blk.5.mg_g", np.zeros((2, 8), np.float32), None)],
             "missing": tensors[1:],
             "int": [(n, a.astype(np.int32), None) if i == 0 else (n, a, None) for i, (n, a, _) in enumerate(tensors)]}
    needles = {"extra": "unexpected tensor 'blk.5.mg_g'", "missing": "has no tensor blk.0.mg_w1.weight",
               "int": "has type I32"}
    for name, ts in cases.items():
        path = tmp_path / f"{name}.gguf"
        _write_adapter(path, BASE.arch, fields, ts)
        with pytest.raises(AdapterError) as info:
            read_memory_gate(path, model=TARGET)
        assert needles[name] in str(info.value), (name, info.value)


# -- the checkpoint reader under a memory cap -------------------------------------------------------

_CHILD = f"""
import resource, sys
from kvpot.converters.torch_checkpoint import read_state_dict
from kvpot.errors import KvpotError
resource.setrlimit(resource.RLIMIT_AS, ({LIMIT}, {LIMIT}))
try:
    out = read_state_dict(sys.argv[1])
except KvpotError as e:
    print("refused:", e)
else:
    print("read:", {{k: list(v.shape) for k, v in out.items()}})
"""


def read_capped(path) -> str:
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-c", _CHILD, str(path)], capture_output=True, text=True, env=env,
                         timeout=120)
    assert res.returncode == 0 and not res.stderr, (res.returncode, res.stderr[-2000:])
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 1, res.stdout
    return lines[0]


def _stored(name: str, data: bytes) -> tuple:
    return name, data, 0, zlib.crc32(data), len(data)


@pytest.fixture(scope="module")
def bomb():
    """600 MiB of zeros deflated to ~3 MB."""
    return (600 << 20,) + zeros_deflated(600 << 20)


def test_a_view_larger_than_its_storage_is_refused_before_it_is_built(tmp_path):
    """The 417-byte checkpoint: one (30000, 30000) tensor of stride (0, 0) over one element."""
    path = tmp_path / "stride0.bin"
    pkl = tensor_pickle([("w", "FloatStorage", "0", 1, 0, [30000, 30000], [0, 0])])
    write_raw_zip(path, [_stored("a/data.pkl", pkl), _stored("a/data/0", bytes(4))])
    line = read_capped(path)
    assert line.startswith("refused:") and "reads its storage elements more than once" in line, line


def test_an_entry_larger_than_its_storage_is_refused_before_inflating(tmp_path, bomb):
    size, payload, crc = bomb
    path = tmp_path / "bomb.bin"
    pkl = tensor_pickle([("w", "FloatStorage", "0", 1, 0, [1], [1])])
    write_raw_zip(path, [_stored("a/data.pkl", pkl), ("a/data/0", payload, 8, crc, size)])
    line = read_capped(path)
    assert line.startswith("refused:") and f"storage 0 holds {size:,} bytes, expected 4" in line, line


def test_an_entry_that_inflates_past_its_declared_size_is_cut_there(tmp_path, bomb):
    size, payload, crc = bomb
    path = tmp_path / "liar.bin"
    pkl = tensor_pickle([("w", "FloatStorage", "0", 1, 0, [1], [1])])
    write_raw_zip(path, [_stored("a/data.pkl", pkl), ("a/data/0", payload, 8, crc, 4)])
    line = read_capped(path)
    assert line.startswith("refused:") and "Bad CRC-32" in line, line


def test_only_what_the_tensors_view_is_inflated(tmp_path, bomb):
    """A large storage of which a tensor views one element: read, in the memory of that element."""
    size, payload, crc = bomb
    path = tmp_path / "sparse.bin"
    pkl = tensor_pickle([("w", "HalfStorage", "0", size // 2, 5, [1], [1])])
    write_raw_zip(path, [_stored("a/data.pkl", pkl), ("a/data/0", payload, 8, crc, size)])
    assert read_capped(path) == "read: {'w': [1]}"


@pytest.mark.parametrize(("pkl", "needle"), [
    (b"\x80\x02N" + b"r" + struct.pack("<I", 1 << 31) + b".", f"memo index {1 << 31}"),  # LONG_BINPUT
    (b"\x80\x04\x8e" + (3 << 30).to_bytes(8, "little") + b"abc.", "pickle is damaged"),  # BINBYTES8
    (tensor_pickle([(f"w{i}", "FloatStorage", "0", 1 << 18, 0, [1 << 18], [1]) for i in range(600)]),
     "the same data viewed many times over"),
    (tensor_pickle([("w", "FloatStorage", "0", 1 << 18, 0, [1 << 18], [1])]) + bytes(MAX_PICKLE_BYTES),
     f"at most {MAX_PICKLE_BYTES:,}"),
    (tensor_pickle([("w", "FloatStorage", "0", 4, 0, [2, 2, 2], [1, 2, 4])]), "reaches element 8 of storage 0"),
    (tensor_pickle([("w", "FloatStorage", "0", 4, 0, [-1], [1])]), "negative offset, size or stride"),
])
def test_pickles_that_would_allocate_are_refused(tmp_path, pkl, needle):
    path = tmp_path / "p.bin"
    write_raw_zip(path, [_stored("a/data.pkl", pkl), _stored("a/data/0", bytes(1 << 20))])
    line = read_capped(path)
    assert line.startswith("refused:") and needle in line, line
