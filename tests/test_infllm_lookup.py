"""InfLLM's lookup inside the layer (ggml_ext/kvpot-lookup.cpp): each ubatch's graph chooses, per pot
layer, the blocks its own queries rank highest and writes them into the reserved cells before the
layer's attention. Checked against NumPy on the queries captured from the same graph and the stored
representatives and keys, and against the host-side recall of the same blocks (the logits of the
question must be the same)."""

from __future__ import annotations

import numpy as np
import pytest
from potlib import numpy_rope, rope_facts
from test_infllm import make_engine, numpy_choice

from kvpot.bench.logbook import logbook

N_INIT, BS, TOPK, N_LOCAL = 16, 64, 2, 368  # InfLLM.fit(512, 128), asserted below


@pytest.fixture(scope="module")
def text_and_question():
    text, question, _ = logbook(n_entries=60, seed=4, fact_at=0.3)
    return text, question


def block_cells(eng) -> int:
    """First cell of the fetched blocks: after the local cells and the initial tokens."""
    pos = eng.positions[0, 0]
    local = pos >= eng.policy._local_start
    cell0 = int(np.count_nonzero(local)) + N_INIT
    assert not local[cell0:cell0 + TOPK * BS].any() and (pos[cell0 - N_INIT:cell0] == np.arange(N_INIT)).all()
    return cell0


def blocks_held(eng, store, cell0: int) -> np.ndarray:
    """[L, TOPK]: the stored blocks whose tokens the fetched cells of each layer hold (from positions)."""
    out = []
    for layer in range(eng.pot.n_layers):
        held = eng.positions[layer, 0, cell0:cell0 + TOPK * BS]
        starts = {int(store.read(layer, b)[0][0]): b for b in range(store.n_blocks)}
        out.append([starts[int(held[j * BS])] for j in range(TOPK)])
    return np.array(out)


@pytest.mark.parametrize("model_fixture", ["smollm2_cut_path", "gemma_cut_path"])  # Gemma-3: iSWA, one KV head, NEOX
def test_graph_fetches_what_numpy_chooses_from_the_ubatchs_own_queries(request, model_fixture, text_and_question, tmp_path):
    model_path = request.getfixturevalue(model_fixture)
    text, question = text_and_question
    eng = make_engine(model_path, tmp_path)
    p = eng.policy
    assert p.lookup == "graph"
    assert p._fit == dict(n_init=N_INIT, block_size=BS, topk=TOPK, n_local=N_LOCAL, exc_block_size=64, max_cached_block=4)
    events = []
    eng.feed_text(text, on_chunk=events.append)
    assert all(ev.cells <= 512 and ev.cells == ev.stats.n_cells_used for ev in events)
    store = p._blocks
    assert store.n_blocks > 3 * TOPK  # a real choice: most blocks are left out
    cell0 = block_cells(eng)
    # the question: one ubatch, its queries captured by the same graph that looks the blocks up
    pos0 = eng.pos_next
    eng.pot.query_request(True, N_LOCAL)
    logits = eng.next_logits(question)
    queries = eng.pot.query_take(eng.facts.head_dim_k)
    eng.pot.query_request(False)
    # the answer is generated with the question's blocks held: every generated token would otherwise
    # fetch again, at an angle one position further, so the cells would change
    held = eng.pot.read(0, 0, "k", cell0, TOPK * BS, eng.facts.head_dim_k)
    n_before = eng.pos_next
    list(eng.generate(logits, 4))
    assert eng.pos_next > n_before  # tokens were decoded
    np.testing.assert_array_equal(eng.pot.read(0, 0, "k", cell0, TOPK * BS, eng.facts.head_dim_k), held)
    want = numpy_choice(store, queries, TOPK)
    np.testing.assert_array_equal(blocks_held(eng, store, cell0), want)
    # the cells hold those blocks' keys, rotated from RoPE 0 to n_local before the question
    rope = rope_facts(model_path)
    for layer in (0, eng.pot.n_layers - 1):
        for j, b in enumerate(want[layer]):
            _, _, k, v = store.read(layer, int(b))
            for head in range(eng.pot.n_head_kv):
                got_k = eng.pot.read(layer, head, "k", cell0 + j * BS, BS, eng.facts.head_dim_k)
                want_k = numpy_rope(k[head], np.full(BS, pos0 - N_LOCAL), rope["base"], rope["neox"])
                np.testing.assert_allclose(got_k, want_k, rtol=3e-3, atol=3e-3 * max(1.0, np.abs(want_k).max()))
                got_v = eng.pot.read(layer, head, "v", cell0 + j * BS, BS, eng.facts.head_dim_v)
                np.testing.assert_allclose(got_v, v[head], rtol=3e-3, atol=3e-3 * max(1.0, np.abs(v[head]).max()))
    eng.close()


def test_graph_lookup_gives_the_logits_of_the_host_recall_of_the_same_blocks(smollm2_cut_path, text_and_question, tmp_path):
    text, question = text_and_question
    # both read the document the same way (host lookup), so their pots and stores are the same
    a = make_engine(smollm2_cut_path, tmp_path, "a.kvblk", lookup="host")
    b = make_engine(smollm2_cut_path, tmp_path, "b.kvblk", lookup="host")
    a.feed_text(text)
    b.feed_text(text)
    np.testing.assert_array_equal(a.positions, b.positions)
    # a: the question's own queries choose inside the graph
    a.policy.lookup = "graph"
    rc = a.recall_cells
    rc.fetch_cell0, rc.fetch_n, rc.fetch_bs, rc.fetch_local = block_cells(a), TOPK, BS, N_LOCAL
    before = blocks_held(a, a.policy._blocks, rc.fetch_cell0)  # what the last chunk's queries chose
    rc.set_lookup()
    want = a.next_logits(question)
    chosen = blocks_held(a, a.policy._blocks, rc.fetch_cell0)
    # the graph did fetch: the question's queries choose other blocks than the last chunk's in some layers
    assert (chosen != before).any()
    # the host-side recall of the same blocks (the question decoded twice, the recall forced): the same
    # ops on the same stored K/V (RoPE from 0 in F32, copied into the F16 cache), so the same logits
    b.policy.choose_blocks = lambda n_layer: chosen
    got = b.next_logits(question)
    np.testing.assert_array_equal(got, want)
    a.close()
    b.close()
