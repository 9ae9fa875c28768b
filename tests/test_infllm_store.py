"""InfLLM's block store (ggml_ext/kvpot-blocks.*): round trip through the file, refusal of truncated and
foreign files, the per-layer caches and RSS bounded while the store grows, and the lookup against NumPy."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest

from kvpot.runtime.blocks import BlockStore, BlockStoreError


def random_block(rng, L, H, dk, dv, bs, pos0=0):
    return (np.arange(pos0, pos0 + bs, dtype=np.int32), rng.standard_normal((L, H, dk)).astype(np.float32),
            rng.standard_normal((L, H, bs, dk)).astype(np.float32), rng.standard_normal((L, H, bs, dv)).astype(np.float32))


SHAPE = dict(n_layer=2, n_head_kv=3, d_k=8, d_v=6, block_size=4)


def make_store(path, rng, n_blocks, max_cached=4):
    store = BlockStore(path, **SHAPE, max_cached=max_cached, create=True)
    blocks = [random_block(rng, 2, 3, 8, 6, 4, pos0=4 * b) for b in range(n_blocks)]
    for b, blk in enumerate(blocks):
        assert store.append(*blk) == b
    return store, blocks


def check_same(store, blocks):
    for b, (pos, repr_, k, v) in enumerate(blocks):
        for layer in range(2):
            gpos, grepr, gk, gv = store.read(layer, b)
            np.testing.assert_array_equal(gpos, pos)
            np.testing.assert_array_equal(grepr, repr_[layer])  # f32 on disk
            np.testing.assert_array_equal(gk, k[layer].astype(np.float16).astype(np.float32))  # f16 on disk
            np.testing.assert_array_equal(gv, v[layer].astype(np.float16).astype(np.float32))


def test_store_round_trips_and_reopens(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "s.kvblk"
    store, blocks = make_store(path, rng, 7)
    check_same(store, blocks)
    info = store.info()
    assert (info.n_blocks, info.n_layer, info.block_size) == (7, 2, 4)
    assert info.file_bytes == os.path.getsize(path) == 64 + 7 * 2 * info.record_bytes
    store.close()
    again = BlockStore(path)  # the shape comes from the file
    assert again.shape == (2, 3, 8, 6, 4)
    check_same(again, blocks)
    again.append(*random_block(rng, 2, 3, 8, 6, 4))  # and it grows on
    assert again.n_blocks == 8
    again.close()


@pytest.mark.parametrize(("damage", "needle"), [
    ("truncate", "truncated"),
    ("magic", "not a kvpot block store"),
    ("version", "version 9 is not supported"),
    ("short", "shorter than its header"),
    ("shape", "made for 2 layers, not 5"),
])
def test_bad_stores_are_refused_with_one_line(tmp_path, damage, needle):
    rng = np.random.default_rng(1)
    path = tmp_path / "s.kvblk"
    store, _ = make_store(path, rng, 3)
    store.close()
    data = bytearray(path.read_bytes())
    kwargs = {}
    if damage == "truncate":
        data = data[:-5]
    elif damage == "magic":
        data[:8] = b"GGUF\x03\x00\x00\x00"
    elif damage == "version":
        data[8:12] = struct.pack("<I", 9)
    elif damage == "short":
        data = data[:40]
    elif damage == "shape":
        kwargs = dict(n_layer=5)
    path.write_bytes(bytes(data))
    with pytest.raises(BlockStoreError) as err:
        BlockStore(path, **kwargs)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_missing_store_and_bad_reads_fail_cleanly(tmp_path):
    with pytest.raises(BlockStoreError, match="No such file"):
        BlockStore(tmp_path / "nothing.kvblk")
    store, _ = make_store(tmp_path / "s.kvblk", np.random.default_rng(2), 2)
    with pytest.raises(BlockStoreError, match="not in the store"):
        store.read(0, 2)
    with pytest.raises(BlockStoreError, match="not in the store"):
        store.read(2, 0)
    with pytest.raises(BlockStoreError, match="cannot choose 3 of 2"):
        store.topk(0, np.zeros((3, 8), np.float32), 3)
    with pytest.raises(BlockStoreError, match="shape"):
        store.append(np.arange(3), np.zeros((2, 3, 8)), np.zeros((2, 3, 4, 8)), np.zeros((2, 3, 4, 6)))
    store.close()
    with pytest.raises(BlockStoreError, match="closed"):
        store.read(0, 0)


def test_a_store_cut_short_by_another_process_is_a_read_error_not_a_crash(tmp_path):
    """Another process truncates the file under an open store: reading a block past the new end and
    scoring the blocks fail with one line (a page of a mapped file past its end would be SIGBUS)."""
    path = tmp_path / "cut.kvblk"
    store, blocks = make_store(path, np.random.default_rng(5), 6, max_cached=1)
    record = (store.info().file_bytes - 64) // (6 * 2)
    os.truncate(path, 64 + 2 * 2 * record)  # blocks 0 and 1 whole, for both layers
    np.testing.assert_array_equal(store.read(1, 1)[0], blocks[1][0])
    with pytest.raises(BlockStoreError, match=r"cannot read block 4 of block store .*cut\.kvblk"):
        store.read(0, 4)
    with pytest.raises(BlockStoreError, match=r"cannot read block store .*cut\.kvblk"):
        store.topk(0, np.ones((3, 8), np.float32), 2)
    store.close()


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_caches_and_rss_stay_bounded_while_the_store_grows(tmp_path):
    """A store of ~100 MiB looked up through caches of 3 blocks per layer: at most 3 records a layer held,
    and the process's RSS grows by far less than the file (records and representatives are read with
    pread, never mapped)."""
    L, H, dk, dv, bs = 3, 1, 256, 256, 128
    store = BlockStore(tmp_path / "big.kvblk", n_layer=L, n_head_kv=H, d_k=dk, d_v=dv, block_size=bs,
                       max_cached=3, create=True)
    rng = np.random.default_rng(3)
    blk = random_block(rng, L, H, dk, dv, bs)
    q = rng.standard_normal((H, dk)).astype(np.float32)
    base = None
    for b in range(400):
        store.append(blk[0] + b * bs, blk[1], blk[2], blk[3])
        if b % 20 == 19:
            for layer in range(L):
                store.cache_lookup(layer, [b, b - 10], [1.0, 0.5])
                store.read(layer, b - 5)  # a lookup of one block
                store.topk(layer, q, 4)
            info = store.info()
            assert all(store.cache(layer).blocks.size <= 3 for layer in range(L))
            if base is None:
                base = rss_bytes()
    info = store.info()
    assert info.file_bytes > 90 << 20
    assert info.misses > 0 and info.n_cached == 3 * L
    grown = rss_bytes() - base
    assert grown < info.file_bytes // 8, f"RSS grew by {grown} bytes for a {info.file_bytes}-byte store"
    store.close()


def numpy_topk(reps: np.ndarray, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """reps [n, H, dk], q [H, dk]: relevance sum_h q_h . repr_h in float64; top k, ties to the lower index."""
    scores = np.einsum("nhd,hd->n", reps.astype(np.float64), q.astype(np.float64))
    order = np.lexsort((np.arange(scores.size), -scores))
    return order[:k], scores


@pytest.mark.parametrize("n_blocks", [5, 2500])  # 2500 blocks: scored in three parts of 1024
def test_topk_matches_numpy(tmp_path, n_blocks):
    L, H, dk, bs = 2, 3, 8, 2
    store = BlockStore(tmp_path / "s.kvblk", n_layer=L, n_head_kv=H, d_k=dk, d_v=4, block_size=bs, max_cached=2,
                       create=True)
    rng = np.random.default_rng(n_blocks)
    reps = rng.standard_normal((n_blocks, L, H, dk)).astype(np.float32)
    reps[n_blocks // 2] = reps[1]  # a tie: the lower index wins
    kv = np.zeros((L, H, bs, dk), np.float32), np.zeros((L, H, bs, 4), np.float32)
    for b in range(n_blocks):
        store.append(np.arange(bs, dtype=np.int32), reps[b], *kv)
    for layer in range(L):
        for trial in range(3):
            q = rng.standard_normal((H, dk)).astype(np.float32)
            if trial == 2:
                q = reps[1, layer] * 3  # make the tied pair the best
            k = min(4, n_blocks)
            want, want_scores = numpy_topk(reps[:, layer], q, k)
            got, got_scores = store.topk(layer, q, k)
            np.testing.assert_array_equal(got, want)
            np.testing.assert_allclose(got_scores, want_scores, rtol=1e-6, atol=1e-6)
            if trial == 2:
                assert got[0] == 1
    store.close()


def test_limit_shows_a_prefix_and_never_writes_over_the_rest(tmp_path):
    """A reopened context sees only its blocks; the file keeps the later ones (another context's), and
    appending there is refused rather than written over them."""
    rng = np.random.default_rng(4)
    path = tmp_path / "s.kvblk"
    store, blocks = make_store(path, rng, 5)
    store.close()
    before = path.read_bytes()
    again = BlockStore(path)
    again.limit(3)
    assert again.n_blocks == 3
    check_same(again, blocks[:3])
    with pytest.raises(BlockStoreError, match="not in the store"):
        again.read(0, 3)
    assert again.topk(0, np.ones((3, 8), np.float32), 3)[1].shape == (3,)
    with pytest.raises(BlockStoreError, match="holds blocks after"):
        again.append(*random_block(rng, 2, 3, 8, 6, 4))
    with pytest.raises(BlockStoreError, match="cannot show 4 of 3"):
        again.limit(4)
    again.close()
    assert path.read_bytes() == before
