"""GGUF checks done in Python before a file reaches llama.cpp."""

from __future__ import annotations

import pytest

from kvpot.errors import KvpotError
from kvpot.models.gguf_file import read_header, read_model_facts


def _write_gguf(path, kv: dict, arch: str = "llama"):
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    for key, value in kv.items():
        if isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_uint32(key, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()


def test_header_reader_agrees_with_gguf_py(smollm2_path):
    """Every scalar and string key our reader returns equals gguf-py's reading of the same file."""
    import gguf

    ours = read_header(smollm2_path)
    ref = gguf.GGUFReader(str(smollm2_path), "r")
    compared = 0
    for key, field in ref.fields.items():
        if key.startswith("GGUF.") or field.types[0] == gguf.GGUFValueType.ARRAY:
            continue
        want = field.contents()
        got = ours[key]
        assert got == pytest.approx(want) if isinstance(want, float) else got == want, key
        compared += 1
    assert compared > 10
    # arrays are skipped, their lengths kept (the vocabulary size sizes the logits in kvpot.session.auto_budget)
    tokens = ref.fields["tokenizer.ggml.tokens"]
    assert ours["tokenizer.ggml.tokens#count"] == len(tokens.data)


def test_not_gguf(tmp_path):
    p = tmp_path / "model.gguf"
    p.write_bytes(b"PK\x03\x04 a zip file")
    with pytest.raises(KvpotError, match="is not a GGUF file"):
        read_model_facts(p)


def test_truncated(smollm2_path, tmp_path):
    p = tmp_path / "cut.gguf"
    with open(smollm2_path, "rb") as f:
        p.write_bytes(f.read(5000))
    with pytest.raises(KvpotError, match="truncated"):
        read_model_facts(p)


def test_adapter_is_not_a_model(tmp_path):
    p = tmp_path / "adapter.gguf"
    _write_gguf(p, {"general.type": "adapter", "adapter.type": "kvpot.retaining_heads"})
    with pytest.raises(KvpotError, match="GGUF adapter, not a model"):
        read_model_facts(p)


def test_missing_and_directory(tmp_path):
    with pytest.raises(KvpotError, match="does not exist"):
        read_model_facts(tmp_path / "nope.gguf")
    with pytest.raises(KvpotError, match="is a directory"):
        read_model_facts(tmp_path)
