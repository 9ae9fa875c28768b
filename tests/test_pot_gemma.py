"""The pot on Gemma-3 (iSWA): the global layers hold the pot, the sliding-window layers keep their window."""

from __future__ import annotations

import numpy as np
import pytest
from potlib import TensorCatcher, decode_chunks, logbook_tokens, new_ctx, numpy_rope, rope_facts
from test_pot import _stock_compacted  # the same stock-only reference path

from kvpot.runtime.llama import ContextParams, LlamaContext
from kvpot.runtime.pot import Pot

CHUNK = 256
N_CTX = 2048
N_DOC = 1200


@pytest.fixture(scope="module")
def doc_tokens(gemma):
    return logbook_tokens(gemma, 60, 5, N_DOC)


@pytest.fixture(scope="module")
def question_tokens(gemma):
    return gemma.tokenize("\nQuestion: what did Ada do?\nAnswer:")


def test_pot_is_the_global_layers(gemma, doc_tokens):
    ctx = new_ctx(gemma, N_CTX, CHUNK)
    pot = Pot(ctx)
    # Gemma-3: every sixth layer is global (5 sliding-window layers, then 1 global)
    assert pot.layer_ids == [5, 11, 17]
    assert pot.n_head_kv == 1
    decode_chunks(ctx, doc_tokens, CHUNK)
    st = pot.stats()
    assert st.n_cells_used == N_DOC
    assert 512 <= st.n_swa_used < N_DOC  # the window part keeps only about its window
    ctx.close()


@pytest.mark.parametrize("fa", [False, True], ids=["fa_off", "fa_on"])
def test_keeping_every_cell_matches_stock(gemma, doc_tokens, question_tokens, fa):
    ref = new_ctx(gemma, N_CTX, CHUNK, fa)
    p = decode_chunks(ref, doc_tokens, CHUNK)
    decode_chunks(ref, question_tokens, CHUNK, p)
    want = ref.logits_last()
    ctx = new_ctx(gemma, N_CTX, CHUNK, fa)
    pot = Pot(ctx)
    decode_chunks(ctx, doc_tokens, CHUNK)
    pot.compact(np.broadcast_to(np.arange(N_DOC), (pot.n_layers, 1, N_DOC)), cr_rope=False)
    decode_chunks(ctx, question_tokens, CHUNK, p)
    got = ctx.logits_last()
    assert np.abs(got - want).max() < 1e-4 * max(1.0, np.abs(want).max())
    ref.close()
    ctx.close()


@pytest.mark.parametrize("fa", [False, True], ids=["fa_off", "fa_on"])
@pytest.mark.parametrize("cr_rope", [False, True], ids=["keep_pos", "cr_rope"])
def test_same_set_matches_stock_seq_rm(gemma, doc_tokens, question_tokens, fa, cr_rope):
    """The kept tail covers the 512-token window, so the window layers attend to the same tokens.

    Not bit-exact: stock seq_rm also rewrites the window layers' cell layout (the pot leaves them
    alone), which changes float summation order, and llama.cpp quantizes activations to 8 bits for
    Q4 weights, so last-bit differences can flip a rounding step. The pot layers' contents are
    checked exactly by the read-back test; here the logits must agree on the answer.
    """
    n = len(doc_tokens)
    ranges = [(0, 40), (300, 350), (n - 600, n)]
    kept = np.concatenate([np.arange(a, b) for a, b in ranges])
    ref, p_ref = _stock_compacted_gemma(gemma, doc_tokens, ranges, cr_rope, fa)
    decode_chunks(ref, question_tokens, CHUNK, p_ref)
    want = ref.logits_last()

    ctx = new_ctx(gemma, N_CTX, CHUNK, fa)
    pot = Pot(ctx)
    decode_chunks(ctx, doc_tokens, CHUNK)
    pot.compact(np.broadcast_to(kept, (pot.n_layers, pot.n_head_kv, kept.size)), cr_rope=cr_rope)
    assert pot.stats().pos_next == p_ref
    decode_chunks(ctx, question_tokens, CHUNK, p_ref)
    got = ctx.logits_last()
    assert np.argmax(got) == np.argmax(want)
    top = set(np.argsort(want)[-10:])
    assert len(top & set(np.argsort(got)[-10:])) >= 8
    assert np.corrcoef(got, want)[0, 1] > 0.999
    ref.close()
    ctx.close()


def _stock_compacted_gemma(gemma, tokens, ranges, cr_rope, fa):
    return _stock_compacted(gemma, tokens, ranges, cr_rope, fa, "f16", "f16", n_ctx=N_CTX, chunk=CHUNK)


def cr_rope_positions(old: np.ndarray, win0: int) -> tuple[np.ndarray, int]:
    """CR-RoPE beside a sliding window, written from the rule (not from the C code): per head, kept
    tokens inside the live window [win0, ...) keep their distance to the window's end and the older
    ones are packed right before it; the window restarts at W, the most older tokens any head kept.
    old: [L, H, n] stream positions, sorted per head. Returns the new positions and W."""
    n_old = (old < win0).sum(axis=-1)
    W = int(n_old.max())
    new = np.empty_like(old)
    for l, h in np.ndindex(old.shape[:2]):
        o = old[l, h]
        k = int(n_old[l, h])
        new[l, h, :k] = W - k + np.arange(k)
        new[l, h, k:] = W + o[k:] - win0
    return new, W


def test_cr_rope_keys_equal_numpy_rope_per_layer(gemma, gemma_path, doc_tokens):
    """Each global layer keeps its own set; CR-RoPE re-rotates with the global layers' base (NEOX)
    to the positions of the rule above, and decoding continues after the window."""
    rope = rope_facts(gemma_path)
    d = 256
    ctx = new_ctx(gemma, N_CTX, CHUNK)
    pot = Pot(ctx)
    n = len(doc_tokens)
    decode_chunks(ctx, doc_tokens, CHUNK)
    rng = np.random.default_rng(3)
    keep = np.sort(np.stack([rng.choice(n, 700, replace=False)[None, :] for _ in range(pot.n_layers)]), axis=-1)
    before = {l: pot.read(l, 0, w, 0, n, d) for l in range(pot.n_layers) for w in ("k",)}
    vbefore = {l: pot.read(l, 0, "v", 0, n, d) for l in range(pot.n_layers)}
    pot.compact(keep, cr_rope=True)
    new_pos, W = cr_rope_positions(keep, n - 512)  # the live window: the last 512 tokens
    assert W < 700 and pot.stats().pos_next == W + 512
    for l in range(pot.n_layers):
        want = numpy_rope(before[l][keep[l, 0]], new_pos[l, 0] - keep[l, 0], rope["base"], rope["neox"])
        got = pot.read(l, 0, "k", 0, 700, d)
        assert np.abs(got - want).max() < 0.01 * np.abs(want).max(), f"pot layer {l}"
        np.testing.assert_array_equal(pot.read(l, 0, "v", 0, 700, d), vbefore[l][keep[l, 0]])
    # the window part was shifted with the pot: decoding continues after it
    ctx.decode(doc_tokens[:8], W + 512)
    assert pot.stats().n_cells_used == 708
    ctx.close()


def test_score_taps_equal_kq_soft_max_on_global_layers(gemma, doc_tokens):
    catcher = TensorCatcher({f"kq_soft_max-{il}" for il in (5, 11, 17)})
    ctx = LlamaContext(gemma, ContextParams(n_ctx=N_CTX, n_batch=CHUNK, n_threads=2), cb_eval=catcher.callback)
    pot = Pot(ctx)
    decode_chunks(ctx, doc_tokens[:768], CHUNK)
    rows = [0, 100, CHUNK - 1]
    pot.tap_request([768 + r for r in rows])
    catcher.caught.clear()
    ctx.decode(doc_tokens[768:768 + CHUNK], 768)
    n_cells = 768 + CHUNK
    got = pot.tap_get(n_cells)
    for i, il in enumerate(pot.layer_ids):
        sm = catcher.caught[f"kq_soft_max-{il}"][0]           # [n_head=4, n_tokens, n_kv]
        want = sm[:, rows, :n_cells].sum(axis=(0, 1))[None]   # 4 query heads share the one KV head
        np.testing.assert_allclose(got[i], want, rtol=1e-4, atol=1e-5)
    ctx.close()


def test_cr_rope_with_fewer_cells_than_the_window_keeps_the_window(gemma, doc_tokens):
    """Keeping the last 256 < 512 cells: all are inside the window, so they keep their place in it
    (512 - 256 ..) and no window cell is pushed below 0."""
    ctx = new_ctx(gemma, N_CTX, CHUNK)
    pot = Pot(ctx)
    decode_chunks(ctx, doc_tokens, CHUNK)
    swa_before = pot.stats().n_swa_used
    keep = np.broadcast_to(np.arange(N_DOC - 256, N_DOC), (pot.n_layers, 1, 256))
    pot.compact(keep, cr_rope=True)
    assert pot.stats().pos_next == 512
    ctx.decode(doc_tokens[:4], 512)  # the window shift runs here
    st = pot.stats()
    assert st.n_cells_used == 260
    assert st.n_swa_used >= 512  # the live window survived the shift
    assert st.n_swa_used <= swa_before + 4
    ctx.close()
