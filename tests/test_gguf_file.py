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


def _vocab_file(path, n: int = 70_000) -> list[str]:
    """A header whose string array spans several of the reader's 1 MiB windows, keys after it."""
    import gguf

    words = [f"tok{i}" * (1 + i % 5) for i in range(n)]  # ~1.4 MB of strings, lengths varied
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_array("tokenizer.ggml.tokens", words)
    w.add_uint32("llama.block_count", 7)
    w.add_string("general.name", "after the vocabulary")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return words


def test_a_skipped_string_array_leaves_the_keys_after_it_read(tmp_path):
    p = tmp_path / "vocab.gguf"
    words = _vocab_file(p)
    kv = read_header(p)
    assert kv["tokenizer.ggml.tokens#count"] == len(words)
    assert kv["llama.block_count"] == 7 and kv["general.name"] == "after the vocabulary"
    assert read_header(p, keep_arrays=frozenset({"tokenizer.ggml.tokens"}))["tokenizer.ggml.tokens"] == words


def test_a_string_in_a_skipped_array_longer_than_the_file_is_refused(tmp_path):
    p = tmp_path / "vocab.gguf"
    words = _vocab_file(p)
    data = bytearray(p.read_bytes())
    last = len(words[-1]).to_bytes(8, "little") + words[-1].encode()
    at = data.index(last)  # the last token's length
    data[at:at + 8] = (10**9).to_bytes(8, "little")
    p.write_bytes(bytes(data))
    with pytest.raises(KvpotError, match="bytes of a string declared, more than"):
        read_header(p)
    for cut in (at + 4, at - 3, len(data) // 2):  # ends inside a length, and inside a string
        p.write_bytes(bytes(data[:cut]))
        with pytest.raises(KvpotError, match="truncated|not a valid GGUF"):
            read_header(p)
