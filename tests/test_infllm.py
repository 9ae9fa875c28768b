"""InfLLM in the runtime: cells read out and inserted at one RoPE angle, the lookup query captured in the
graph, the host-side lookup against NumPy on the queries and representatives of a real run, bounded
cells and cache, and a reopened context (in-graph lookup) that continues with the same logits."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from potlib import TensorCatcher, decode_chunks, logbook_tokens, new_ctx, numpy_rope, rope_facts

from kvpot.bench.logbook import logbook
from kvpot.engine import Engine, EngineConfig
from kvpot.errors import KvpotError
from kvpot.policies import InfLLM
from kvpot.policies.base import BudgetTooSmall
from kvpot.runtime.llama import ContextParams, LlamaContext
from kvpot.runtime.pot import Pot, PotCallError

CHUNK = 64


@pytest.fixture(scope="module")
def doc_tokens(smol):
    return logbook_tokens(smol, 8, 11, 256)


def test_read_at_and_insert_rotate_like_numpy(smol, smollm2_path, doc_tokens):
    rope = rope_facts(smollm2_path)
    ctx = new_ctx(smol, 512, CHUNK)
    pot = Pot(ctx)
    decode_chunks(ctx, doc_tokens[:200], CHUNK)
    d = 64
    # at its own position a key comes out as stored
    k, v = pot.read_at(50, 1, 50, d, d)
    for il in range(pot.n_layers):
        for h in range(pot.n_head_kv):
            np.testing.assert_array_equal(k[il, h], pot.read(il, h, "k", 50, 1, d))
            np.testing.assert_array_equal(v[il, h], pot.read(il, h, "v", 50, 1, d))
    # at RoPE 0: each key rotated back by its position
    k0, v0 = pot.read_at(40, 64, 0, d, d)
    for il in (0, 13, 29):
        for h in range(pot.n_head_kv):
            stored = pot.read(il, h, "k", 40, 64, d)
            want = numpy_rope(stored, -np.arange(40, 104), rope["base"], rope["neox"])
            np.testing.assert_allclose(k0[il, h], want, rtol=1e-4, atol=1e-4)
    # keep cells 150..199, then insert the 64 cells back at one position
    keep = np.broadcast_to(np.arange(150, 200), (pot.n_layers, pot.n_head_kv, 50))
    pot.compact(keep, False)
    pot.insert(k0, v0, np.zeros(64, np.int32), 123)
    assert pot.stats().n_cells_used == 114
    np.testing.assert_array_equal(pot.cell_positions(114), np.arange(200 - 114, 200))
    for il in (0, 29):
        for h in range(pot.n_head_kv):
            got = pot.read(il, h, "k", 50, 64, d)
            want = numpy_rope(k0[il, h], np.full(64, 123), rope["base"], rope["neox"])
            np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)  # f16 cache
            np.testing.assert_allclose(pot.read(il, h, "v", 50, 64, d), v0[il, h], rtol=1e-3, atol=1e-3)
    decode_chunks(ctx, doc_tokens[200:240], CHUNK, 200)  # decoding goes on after the inserted cells
    assert pot.stats().n_cells_used == 154
    with pytest.raises(PotCallError, match="do not fit"):
        pot.insert(np.zeros((pot.n_layers, pot.n_head_kv, 400, d)), np.zeros((pot.n_layers, pot.n_head_kv, 400, d)),
                   np.zeros(400, np.int32), 0)
    with pytest.raises(PotCallError, match="are not in the pot"):
        pot.read_at(150, 10, 0, d, d)
    ctx.close()


def test_lookup_query_equals_numpy_of_the_captured_queries(smol, smollm2_path, doc_tokens):
    rope = rope_facts(smollm2_path)
    layers = [0, 11, 29]
    catcher = TensorCatcher({f"Qcur-{il}" for il in layers})
    ctx = LlamaContext(smol, ContextParams(n_ctx=512, n_batch=CHUNK, n_threads=2), cb_eval=catcher.callback)
    pot = Pot(ctx)
    decode_chunks(ctx, doc_tokens[:128], CHUNK)
    angle = 300
    pot.query_request(True, angle)
    catcher.caught.clear()
    ctx.decode(doc_tokens[128:128 + CHUNK], 128, logits="last")
    got = pot.query_take(64)
    pot.query_request(False)
    assert got is not None
    assert pot.query_take(64) is None  # taken once
    n_head, n_head_kv = 9, pot.n_head_kv
    for il in layers:
        q = catcher.caught[f"Qcur-{il}"][0]  # [n_tokens, n_head, d], after RoPE at positions 128..
        rows = [numpy_rope(q[i], np.full(n_head, angle - (128 + i)), rope["base"], rope["neox"]) for i in range(CHUNK)]
        want = np.sum(rows, axis=0).reshape(n_head_kv, n_head // n_head_kv, 64).sum(axis=1)
        np.testing.assert_allclose(got[pot.layer_ids.index(il)], want, rtol=1e-3, atol=1e-3 * np.abs(want).max())
    ctx.close()


def test_fit_maps_the_budget():
    p = InfLLM()
    p.fit(2048, 512)
    assert p._fit == dict(n_init=64, block_size=64, topk=8, n_local=1472, exc_block_size=256, max_cached_block=16)
    p = InfLLM(block_size=128, topk=16, n_init=128)
    p.fit(6272, 512)
    assert p._fit["n_local"] == 4096  # the public configuration
    assert p._fit["exc_block_size"] == 512  # an eighth of the budget, capped by the chunk
    for budget, chunk, exc in ((2048, 128, 128), (512, 128, 64), (4096, 1024, 512), (600, 64, 64)):
        p = InfLLM()
        p.fit(budget, chunk)
        assert p._fit["exc_block_size"] == exc
    with pytest.raises(BudgetTooSmall, match="exceeds the budget"):
        InfLLM(n_local=4096, topk=16, block_size=128).fit(2048, 512)
    with pytest.raises(BudgetTooSmall, match="less than a chunk"):
        InfLLM().fit(160, 512)
    with pytest.raises(KvpotError, match="repr_topk"):
        InfLLM(block_size=2, repr_topk=4)


def numpy_choice(store, queries: np.ndarray, topk: int) -> np.ndarray:
    """The blocks each layer recalls, from the captured queries and the stored representatives."""
    L = queries.shape[0]
    out = []
    for layer in range(L):
        reps = np.stack([store.read(layer, b)[1] for b in range(store.n_blocks)]).astype(np.float64)
        scores = np.einsum("nhd,hd->n", reps, queries[layer].astype(np.float64))
        order = np.lexsort((np.arange(scores.size), -scores))
        out.append(np.sort(order[:topk]))
    return np.stack(out)


@pytest.fixture(scope="module")
def long_text():
    text, question, answer = logbook(n_entries=60, seed=4, fact_at=0.3)
    return text, question


def make_engine(path, tmp_path, name="s.kvblk", lookup="graph"):
    policy = InfLLM(store=str(tmp_path / name), lookup=lookup)
    return Engine(str(path), policy, EngineConfig(budget=512, chunk=128, n_threads=2))


@pytest.mark.parametrize("model_fixture", ["smollm2_cut_path", "gemma_cut_path"])  # Gemma-3: iSWA, one KV head, NEOX
def test_engine_recalls_the_numpy_choice_and_stays_bounded(request, model_fixture, long_text, tmp_path):
    model_path = request.getfixturevalue(model_fixture)
    eng = make_engine(model_path, tmp_path, lookup="host")  # the in-graph lookup: test_infllm_lookup.py
    p = eng.policy
    assert p._fit == dict(n_init=16, block_size=64, topk=2, n_local=368, exc_block_size=64, max_cached_block=4)
    events = []
    eng.feed_text(long_text[0], on_chunk=events.append)
    assert eng.tokens_seen > 2000
    assert max(ev.cells_peak for ev in events) <= 512 + 128
    assert all(ev.cells <= 512 and ev.cells == ev.stats.n_cells_used for ev in events)
    store = p._blocks
    info = store.info()
    # every token past the initial ones and the local window is in a block
    assert info.n_blocks * 64 == p._local_start - 16 and eng.tokens_seen - p._local_start <= 368
    assert info.n_cached <= 4 * store.shape[0]  # max_cached_block (2 * topk) a pot layer
    # the blocks in the pot are the ones NumPy picks from the last chunk's queries and the representatives
    want = numpy_choice(store, p._queries, 2)
    np.testing.assert_array_equal(p.choose_blocks(eng.pot.n_layers), want)
    rope = rope_facts(model_path)
    G = eng.pos_next - 368
    for layer in range(eng.pot.n_layers):
        held = set(eng.positions[layer, 0].tolist())
        for b in want[layer]:
            pos, _, k, _ = store.read(layer, int(b))
            assert set(pos.tolist()) <= held
    layer = eng.pot.n_layers // 2
    b = int(want[layer][0])
    pos, _, k, _ = store.read(layer, b)
    cell = int(np.flatnonzero(eng.positions[layer, 0] == pos[0])[0])
    got = eng.pot.read(layer, 0, "k", cell, 64, eng.facts.head_dim_k)
    want_k = numpy_rope(k[0], np.full(64, G), rope["base"], rope["neox"])
    np.testing.assert_allclose(got, want_k, rtol=3e-3, atol=3e-3 * max(1.0, np.abs(want_k).max()))
    eng.close()


def test_reopened_context_continues_with_the_same_logits(smollm2_cut_path, long_text, tmp_path):
    text, question = long_text
    a = make_engine(smollm2_cut_path, tmp_path)
    a.feed_text(text[: len(text) // 2])
    state = a.export_state()
    want = a.next_logits(question)
    b = make_engine(smollm2_cut_path, tmp_path, "unused.kvblk")
    b.import_state(state)
    assert b.policy._blocks.path == a.policy._blocks.path
    np.testing.assert_array_equal(b.next_logits(question), want)
    b.close()
    # a store that changed under the saved context is refused
    a.policy._blocks.close()
    with open(tmp_path / "s.kvblk", "r+b") as f:
        f.seek(200)
        f.write(b"\x01\x02")
    c = make_engine(smollm2_cut_path, tmp_path, "unused2.kvblk")
    with pytest.raises(KvpotError, match="does not match the saved context"):
        c.import_state(state)
    c.close()
    a.close()


@pytest.mark.parametrize("saved", [False, True])
def test_a_store_made_here_goes_with_the_process_unless_a_context_references_it(smollm2_cut_path, tmp_path, saved):
    """A script that reads with InfLLM and exits without closing its engine leaves no block store behind
    (a bench that never closed left ~3 KB per token read under KVPOT_HOME each run); one a saved context
    references stays."""
    code = (
        "import sys\n"
        "from kvpot.bench.logbook import logbook\n"
        "from kvpot.engine import Engine, EngineConfig\n"
        "from kvpot.policies import InfLLM\n"
        "eng = Engine(sys.argv[1], InfLLM(), EngineConfig(budget=512, chunk=128, n_threads=2))\n"
        "eng.feed_text(logbook(n_entries=60, seed=4, fact_at=0.3)[0])\n"
        "state = eng.export_state()  # a snapshot in memory (a session's, after reading) keeps nothing\n"
        "if sys.argv[2] == '1':\n"
        "    eng.policy.keep_on_disk()  # what Session.save does once the context file is written\n"
        "print(eng.policy.disk_bytes())\n"
    )
    res = subprocess.run([sys.executable, "-c", code, str(smollm2_cut_path), str(int(saved))], capture_output=True,
                         text=True, env={**os.environ, "KVPOT_HOME": str(tmp_path)}, timeout=600)
    assert res.returncode == 0, res.stderr
    left = list((tmp_path / "blocks").glob("*.kvblk"))
    assert int(res.stdout.split()[-1]) > 0  # the reading did store blocks
    if saved:
        assert len(left) == 1 and left[0].stat().st_size == int(res.stdout.split()[-1])
    else:
        assert left == []


def test_closing_the_engine_deletes_the_store_it_made(smollm2_cut_path, long_text, tmp_path, monkeypatch):
    monkeypatch.setenv("KVPOT_HOME", str(tmp_path))
    eng = Engine(str(smollm2_cut_path), InfLLM(), EngineConfig(budget=512, chunk=128, n_threads=2))
    eng.feed_text(long_text[0])
    path = eng.policy.lookup_store().path
    assert eng.policy.disk_bytes() == os.path.getsize(path) > 0
    eng.close()
    assert not os.path.exists(path) and eng.policy.disk_bytes() == 0


def test_kvpot_ask_leaves_a_store_only_beside_a_saved_context(smollm2_cut_path, long_text, tmp_path):
    """`kvpot ask` snapshots the state after reading; only --save-context keeps the block store."""
    from conftest import run_cli

    doc = tmp_path / "doc.txt"
    doc.write_text(long_text[0])
    args = ["ask", str(doc), long_text[1], "-m", str(smollm2_cut_path), "-P", "infllm", "--budget", "512", "--chunk", "128",
            "-n", "2", "--prompt-format", "completion"]
    for home, extra, left in (("plain", [], 0), ("saved", ["--save-context", str(tmp_path / "c.kvctx")], 1)):
        res = run_cli(*args, *extra, env={"KVPOT_HOME": str(tmp_path / home)})
        assert res.returncode in (0, 5), res.stderr  # 5: the model answered nothing
        assert len(list((tmp_path / home / "blocks").glob("*.kvblk"))) == left, res.stderr
