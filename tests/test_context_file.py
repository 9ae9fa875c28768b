"""Saved-context files: round trip, and every kind of damage refused with one clear line."""

from __future__ import annotations

import numpy as np
import pytest

from kvpot.errors import KvpotError
from kvpot.session.context_file import SavedContext, read_context, write_context
from kvpot.session.engine_state import EngineState, decode_tree, encode_tree


def _saved() -> SavedContext:
    rng = np.random.default_rng(0)
    arrays = {"positions": rng.integers(0, 1000, size=(2, 3, 5))}
    policy = encode_tree({"_nuc": rng.random((2, 3, 5)).astype(np.float32), "_plan": (7, np.arange(3)), "_q": None},
                         arrays, "policy")
    state = EngineState(seq=bytes(rng.integers(0, 256, 999, dtype=np.uint8)), pot=b"KVPS" + bytes(24),
                        values={"tokens_seen": 42, "policy": policy}, arrays=arrays)
    header = {"runtime": {"abi": 4, "llama_commit": "abc"}, "model": {"name": "m", "path": "/m.gguf", "sha256": "ab" * 32},
              "policy": "streaming", "settings": {"budget": 16}, "n_ctx": 256, "tokens_read": 42, "sources": [],
              "turns": 0}
    return SavedContext(header=header, state=state)


def test_round_trip(tmp_path):
    saved = _saved()
    path = tmp_path / "c.kvctx"
    size = write_context(path, saved)
    assert size == path.stat().st_size
    back = read_context(path)
    assert back.header == saved.header
    assert back.state.seq == saved.state.seq and back.state.pot == saved.state.pot
    assert back.state.values == saved.state.values
    for k, v in saved.state.arrays.items():
        np.testing.assert_array_equal(back.state.arrays[k], v)
    tree = decode_tree(back.state.values["policy"], back.state.arrays)
    assert tree["_plan"][0] == 7 and isinstance(tree["_plan"], tuple) and tree["_q"] is None
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind


def test_encode_refuses_objects():
    with pytest.raises(TypeError, match="cannot save"):
        encode_tree({"x": object()}, {}, "p")


@pytest.mark.parametrize("damage, needle", [
    (lambda b: b[: len(b) // 2], "truncated or corrupted"),
    (lambda b: b[:100] + bytes([b[100] ^ 1]) + b[101:], "truncated or corrupted"),
    (lambda b: b"NOTKVPOT" + b[8:], "not a kvpot saved context"),
    (lambda b: b[:8] + (99).to_bytes(4, "little") + b[12:], "format 99"),
    (lambda b: b"", "not a kvpot saved context"),
])
def test_damage_is_refused(tmp_path, damage, needle):
    path = tmp_path / "c.kvctx"
    write_context(path, _saved())
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(KvpotError, match=needle):
        read_context(path)


def test_a_header_without_the_fields_reopening_needs_is_refused(tmp_path):
    """A file whose checksum is right but whose header lacks what reopening reads (a hand edit, a bug)."""
    saved = _saved()
    del saved.header["runtime"]
    path = tmp_path / "c.kvctx"
    write_context(path, saved)
    with pytest.raises(KvpotError, match="malformed: header has no runtime"):
        read_context(path)


def test_missing_folder_and_file(tmp_path):
    with pytest.raises(KvpotError, match="does not exist"):
        write_context(tmp_path / "no" / "c.kvctx", _saved())
    with pytest.raises(KvpotError, match="does not exist"):
        read_context(tmp_path / "none.kvctx")
