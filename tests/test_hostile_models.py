"""Crafted GGUF files: every count the header declares is checked against the file's size, the tensor
infos as llama.cpp's loader checks them, and the architecture facts against what llama.cpp accepts,
all in Python before llama.cpp opens the file (one line, nothing printed by llama.cpp)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from conftest import assert_one_line_error, run_cli

from kvpot.errors import KvpotError
from kvpot.models.gguf_file import read_header, read_model_facts

REPO = Path(__file__).resolve().parent.parent
U32, U64, F32, STR, ARR = 4, 10, 6, 8, 9


def _s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def kv(key: str, vtype: int, value) -> bytes:
    if vtype == STR:
        body = _s(value)
    elif vtype == ARR:
        etype, items = value
        body = struct.pack("<IQ", etype, len(items)) + b"".join(struct.pack("<I", i) for i in items)
    else:
        body = struct.pack({U32: "<I", U64: "<Q", F32: "<f"}[vtype], value)
    return _s(key) + struct.pack("<I", vtype) + body


def tensor(name: str, dims: list[int], gtype: int = 0, offset: int = 0) -> bytes:
    return _s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<q", d) for d in dims) + \
        struct.pack("<IQ", gtype, offset)


LLAMA = [kv("general.architecture", STR, "llama"), kv("llama.block_count", U32, 2),
         kv("llama.attention.head_count", U32, 4), kv("llama.attention.head_count_kv", U32, 2),
         kv("llama.embedding_length", U32, 64), kv("llama.context_length", U32, 512)]


def gguf(kvs=LLAMA, tensors=(), n_tensors: int | None = None, n_kv: int | None = None, data: bytes = b"") -> bytes:
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors) if n_tensors is None else n_tensors,
                                 len(kvs) if n_kv is None else n_kv)
    body = head + b"".join(kvs) + b"".join(tensors)
    return body + b"\0" * (-len(body) % 32) + data


ONE_TENSOR = [tensor("w", [8, 2])]  # f32: 64 bytes of data

CASES = [
    ("tensor count 2**64-1", gguf(n_tensors=2**64 - 1), "18,446,744,073,709,551,615 tensors declared"),
    ("tensor count past the file", gguf(n_tensors=1000), "1,000 tensors declared"),
    ("key/value count past the file", gguf(n_kv=100_000), "100,000 key/values declared"),
    ("string longer than the file", gguf([_s("general.name") + struct.pack("<I", STR) + struct.pack("<Q", 2**40)]),
     "bytes of a string declared"),
    ("array longer than the file", gguf([*LLAMA, kv("x", ARR, (U32, []))[:-8] + struct.pack("<Q", 2**31)]),
     "array items declared"),
    ("array of an unknown type", gguf([*LLAMA, kv("x", ARR, (77, []))]), "unknown GGUF value type 77"),
    ("five dimensions", gguf(tensors=[tensor("w", [1, 1, 1, 1, 1])]), "has 5 dimensions"),
    ("negative dimension", gguf(tensors=[tensor("w", [-8])]), "negative dimension"),
    ("unknown ggml type", gguf(tensors=[tensor("w", [8], gtype=4)]), "unknown ggml type 4"),
    ("row not a whole block", gguf(tensors=[tensor("w", [33], gtype=2)]), "not a multiple of its type's block (32)"),
    ("duplicate tensor", gguf(tensors=[tensor("w", [8]), tensor("w", [8], offset=32)], data=bytes(64)),
     "declared twice"),
    ("name too long", gguf(tensors=[tensor("w" * 64, [8])], data=bytes(32)), "at most 63"),
    ("offset out of order", gguf(tensors=[tensor("w", [8], offset=32)], data=bytes(64)), "expected 0"),
    ("data past the end", gguf(tensors=ONE_TENSOR, data=bytes(63)), "past the end of the file"),
    ("huge tensor", gguf(tensors=[tensor("w", [2**40, 2**40])], data=bytes(64)), "past the end of the file"),
    ("alignment not a power of 2", gguf([*LLAMA, kv("general.alignment", U32, 24)], ONE_TENSOR, data=bytes(64)),
     "not a power of 2"),
]


@pytest.mark.parametrize("data, needle", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_crafted_headers_are_refused(tmp_path, data, needle):
    p = tmp_path / "m.gguf"
    p.write_bytes(data)
    with pytest.raises(KvpotError) as e:
        read_model_facts(p)
    assert "\n" not in str(e.value) and needle in str(e.value), str(e.value)


def _facts_file(tmp_path, changes: dict, drop: str | None = None) -> Path:
    kvs = {"general.architecture": (STR, "llama"), "llama.block_count": (U32, 2), "llama.attention.head_count": (U32, 4),
           "llama.attention.head_count_kv": (U32, 2), "llama.embedding_length": (U32, 64)}
    kvs.update(changes)
    kvs.pop(drop, None)
    p = tmp_path / "m.gguf"
    p.write_bytes(gguf([kv(k, t, v) for k, (t, v) in kvs.items()], ONE_TENSOR, data=bytes(64)))
    return p


@pytest.mark.parametrize("changes, drop, needle", [
    ({"llama.block_count": (U32, 0)}, None, "llama.block_count = 0 is outside what llama.cpp accepts (1 to 512)"),
    ({"llama.block_count": (U64, 2**40)}, None, "llama.block_count = 1099511627776 is outside"),
    ({"llama.attention.head_count": (U32, 0)}, None, "llama.attention.head_count = 0 is outside"),
    ({"llama.attention.head_count_kv": (U32, 3)}, None, "4 attention heads cannot share 3 KV heads"),
    ({"llama.context_length": (U64, 2**40)}, None, "llama.context_length = 1099511627776 is outside"),
    ({"llama.attention.key_length": (U32, 2**20)}, None, "llama.attention.key_length = 1048576 is outside"),
    ({}, "llama.block_count", "has no llama.block_count"),
    ({}, "llama.embedding_length", "has no llama.embedding_length"),
    ({"general.architecture": (U32, 7)}, None, "has no general.architecture"),
])
def test_impossible_model_facts_are_refused(tmp_path, changes, drop, needle):
    with pytest.raises(KvpotError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        read_model_facts(_facts_file(tmp_path, changes, drop))


def test_a_well_formed_crafted_model_is_accepted(tmp_path):
    """The refusals above are about what each case changes: the same file unchanged passes."""
    facts = read_model_facts(_facts_file(tmp_path, {"llama.attention.sliding_window": (F32, 128.0)}))
    assert (facts.n_layer, facts.n_head, facts.n_head_kv, facts.head_dim_k, facts.sliding_window) == (2, 4, 2, 16, 128)


def test_real_models_and_shipped_adapters_pass(smollm2_path, gemma_path):
    for path in (smollm2_path, gemma_path):
        assert read_model_facts(path).n_layer > 0
    adapters = sorted((REPO / "models").glob("*.gguf"))
    assert adapters
    for path in adapters:
        assert read_header(path)["general.type"] == "adapter"


def test_cli_refuses_before_llama_cpp(tmp_path):
    """`ask -m` with a 2**64-1 tensor count: one kvpot line, nothing from llama.cpp's loader."""
    model = tmp_path / "m.gguf"
    model.write_bytes(gguf(n_tensors=2**64 - 1))
    doc = tmp_path / "doc.txt"
    doc.write_text("a short document\n")
    res = run_cli("ask", str(doc), "what?", "-m", str(model), "--budget", "64", env={"KVPOT_HOME": str(tmp_path)})
    assert res.returncode == 1
    assert_one_line_error(res.stderr, "tensors declared")
    assert "gguf" not in res.stderr.replace(str(model), "")


@pytest.mark.parametrize("key, value, needle", [
    ("general.architecture", "lla\nma", "is not an architecture llama.cpp knows"),
    ("general.type", "adap\nter", "is a GGUF 'adap\\nter', not a model"),
])
def test_strings_from_the_file_stay_on_one_line(tmp_path, key, value, needle):
    """Found by tests/test_fuzz_headers.py: text from the file is escaped before it goes into an error."""
    with pytest.raises(KvpotError) as e:
        read_model_facts(_facts_file(tmp_path, {key: (STR, value)}))
    assert "\n" not in str(e.value) and needle in str(e.value), str(e.value)
