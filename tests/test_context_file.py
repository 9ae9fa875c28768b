"""Saved-context files: round trip, and every kind of damage refused with one clear line."""

from __future__ import annotations

import numpy as np
import pytest

from kvpot.errors import KvpotError
from kvpot.session.context_file import SavedContext, read_context, write_context
from kvpot.state.engine_state import EngineState, decode_tree, encode_tree


def _saved() -> SavedContext:
    """A context with every field a saved one has (read_context checks them all), made without a model."""
    rng = np.random.default_rng(0)
    arrays = {"positions": rng.integers(0, 42, size=(2, 3, 5))}
    policy = encode_tree({"_retention": rng.random((2, 5)).astype(np.float32), "_plan": (7, np.arange(3), np.arange(3)),
                          "_declared": None}, arrays, "policy")
    # kvpot's C state for 2 layers x 3 KV heads, nothing compacted yet (docs/formats.md, POT)
    pot = np.array([int.from_bytes(b"KVPS", "little"), 2, 2, 3, 0, 16, 0, 0, 0], dtype="<i4").tobytes()
    values = {"tokens_seen": 42, "pos_next": 42, "n_compactions": 0, "compact_seconds": 0.0, "nll_sum": 0.0,
              "nll_count": 0, "_carry_lp": 0.5, "_bos_done": True, "step": 2, "policy": policy}
    state = EngineState(seq=bytes(rng.integers(0, 256, 999, dtype=np.uint8)), pot=pot, values=values, arrays=arrays)
    settings = {"policy": "imdc:pruner=snapkv", "budget": 16, "chunk": 16, "threads": 1, "prompt": "auto", "max_tokens": 4,
                "flash_attn": "on", "question_before": "off", "locator": "keys"}
    header = {"format": "kvpot saved context", "kvpot_version": "0", "runtime": {"abi": 4, "llama_commit": "abc"},
              "model": {"name": "m", "path": "/m.gguf", "sha256": "ab" * 32, "architecture": "llama"},
              "policy": "imdc:pruner=snapkv", "settings": settings, "n_ctx": 256, "prompt_format": "completion", "tokens_read": 42,
              "sources": [], "turns": 0}
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
    assert tree["_plan"][0] == 7 and isinstance(tree["_plan"], tuple) and tree["_declared"] is None
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind


def test_reading_holds_the_sequence_state_once(tmp_path):
    """Reopening a 32K-cell pot reads ~0.9 GB of sequence state: read_context must not hold the whole file
    beside its parts (or hash a copy of it). Python's own allocations while reading a context whose
    sequence state is 32 MiB stay under 1.25x that state; reading the bytes whole and slicing them
    would peak near 2x. The bytes parse_context is given decode to the same context."""
    import dataclasses
    import tracemalloc

    from kvpot.session.context_file import parse_context

    seq = bytes(np.random.default_rng(1).integers(0, 256, 32 << 20, dtype=np.uint8))
    saved = _saved()
    saved = dataclasses.replace(saved, state=dataclasses.replace(saved.state, seq=seq))
    path = tmp_path / "c.kvctx"
    write_context(path, saved)
    tracemalloc.start()
    try:
        back = read_context(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert back.state.seq == seq
    assert peak < 1.25 * len(seq), f"reading a {len(seq) >> 20} MiB state peaked at {peak / 2**20:.0f} MiB"
    again = parse_context(path.read_bytes(), path)
    assert again.header == back.header and again.state.seq == seq and again.state.pot == back.state.pot


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


@pytest.mark.parametrize("key", ["flash_attn", "question_before"])
def test_a_header_from_before_a_setting_reads_as_read_without_it(tmp_path, key):
    """Contexts saved before flash_attn and question_before existed were read without flash attention and
    without the question before the document; a value no kvpot writes is refused, naming the key."""
    saved = _saved()
    saved.header["settings"].pop(key, None)
    path = tmp_path / "old.kvctx"
    write_context(path, saved)
    assert read_context(path).header["settings"][key] == "off"
    saved.header["settings"][key] = "maybe"
    write_context(path, saved)
    with pytest.raises(KvpotError, match=f"settings.{key} must be one of (auto, )?on, off, got 'maybe'"):
        read_context(path)


def test_missing_folder_and_file(tmp_path):
    with pytest.raises(KvpotError, match="does not exist"):
        write_context(tmp_path / "no" / "c.kvctx", _saved())
    with pytest.raises(KvpotError, match="does not exist"):
        read_context(tmp_path / "none.kvctx")


def _point(**changes) -> dict:
    point = {"pos": 40, "skip": 2, "char": 100, "sha256": "0" * 64, "skip_sha256": "f" * 64,
             "sources": [["a.txt", "/docs/a.txt"]]}
    return dict(point, **changes)


@pytest.mark.parametrize("point, needle", [
    (_point(), None),
    (_point(skip=3), "read_point is not where the engine stopped reading"),
    (_point(pos=-1, skip=43), "read_point.pos is not a count"),
    (_point(char=True), "read_point.char is not a count"),
    (_point(sha256="xyz"), "read_point.sha256 is not a SHA-256 digest"),
    (_point(sources=[["a.txt", "docs/a.txt"]]), "absolute paths"),
    (_point(sources=[]), r"\[name, path\] pairs"),
    (dict(_point(), extra=1), "must hold pos, skip"),
], ids=["sound", "past-the-engine", "negative", "bool", "digest", "relative-path", "no-sources", "extra-field"])
def test_a_read_point_is_checked_against_the_engine(tmp_path, point, needle):
    """A stopped read's point (where --continue goes on) must name the engine's next token and hold a
    digest and absolute paths: a hand-edited one is refused before any file is opened."""
    saved = _saved()
    saved.header["read_point"] = point
    path = tmp_path / "c.kvctx"
    write_context(path, saved)
    if needle is None:
        assert read_context(path).header["read_point"] == point
    else:
        with pytest.raises(KvpotError, match=f"malformed: .*{needle}"):
            read_context(path)
