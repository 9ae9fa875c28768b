"""The pot mechanism inside llama.cpp, checked against stock llama.cpp and NumPy references."""

from __future__ import annotations

import numpy as np
import pytest
from potlib import (
    TensorCatcher,
    decode_chunks,
    hadamard,
    log_softmax_rows,
    logbook_tokens,
    new_ctx,
    numpy_rope,
    pot_logprobs,
    rope_facts,
)

from kvpot.runtime.pot import Pot, PotCallError

CHUNK = 64
N_CTX = 512


@pytest.fixture(scope="module")
def doc_tokens(smol):
    return logbook_tokens(smol, 8, 11, 300)


@pytest.fixture(scope="module")
def question_tokens(smol):
    return smol.tokenize("\nQuestion: what did Ada do?\nAnswer:")


def _logits_after(ctx, tokens, pos0):
    decode_chunks(ctx, tokens, CHUNK, pos0)
    return ctx.logits_last()


CACHE_CONFIGS = [
    pytest.param(False, "f16", "f16", id="fa_off-f16"),
    pytest.param(True, "f16", "f16", id="fa_on-f16"),
    pytest.param(True, "q8_0", "q8_0", id="fa_on-q8_0"),
]


@pytest.mark.parametrize("fa,tk,tv", CACHE_CONFIGS)
def test_keeping_every_cell_matches_stock(smol, doc_tokens, question_tokens, fa, tk, tv):
    """A policy that keeps every cell: the compaction graph runs and logits equal stock llama.cpp.

    (Cells keep their order: a permutation is mathematically neutral but changes float summation
    order, and with Q4 weights llama.cpp quantizes activations to 8 bits, so a 1e-7 change can flip
    a rounding step; per-head reordering is checked exactly by the read-back test below.)"""
    ref = new_ctx(smol, N_CTX, CHUNK, fa, tk, tv)
    p = decode_chunks(ref, doc_tokens, CHUNK)
    want = _logits_after(ref, question_tokens, p)

    ctx = new_ctx(smol, N_CTX, CHUNK, fa, tk, tv)
    pot = Pot(ctx)
    p = decode_chunks(ctx, doc_tokens, CHUNK)
    n = len(doc_tokens)
    pot.compact(np.broadcast_to(np.arange(n), (pot.n_layers, pot.n_head_kv, n)), cr_rope=False)
    assert pot.stats().n_cells_used == n
    got = _logits_after(ctx, question_tokens, p)
    assert np.abs(got - want).max() < 1e-4 * max(1.0, np.abs(want).max())
    ref.close()
    ctx.close()


def _kept_ranges(n: int) -> list[tuple[int, int]]:
    # head, a middle slice and the tail: three separate runs of positions
    return [(0, 40), (120, 170), (n - 60, n)]


def _stock_compacted(smol, tokens, ranges, cr_rope, fa, tk, tv, n_ctx=N_CTX, chunk=CHUNK):
    """Stock llama.cpp only: seq_rm the dropped ranges, save the sequence state and load it into a
    fresh context (llama.cpp lays the kept cells out contiguously, the layout compaction produces),
    then seq_add shifts so the kept tokens sit at 0..n-1 when CR-RoPE is on."""
    import ctypes

    import llama_cpp as L

    n = len(tokens)
    src = new_ctx(smol, n_ctx, chunk, fa, tk, tv)
    decode_chunks(src, tokens, chunk)
    mem = L.llama_get_memory(src.ptr)
    prev = 0
    for a, b in ranges + [(n, n)]:
        if a > prev:
            assert L.llama_memory_seq_rm(mem, 0, prev, a)
        prev = b
    size = L.llama_state_seq_get_size(src.ptr, 0)
    buf = (ctypes.c_uint8 * size)()
    assert L.llama_state_seq_get_data(src.ptr, buf, size, 0) == size
    src.close()
    ref = new_ctx(smol, n_ctx, chunk, fa, tk, tv)
    assert L.llama_state_seq_set_data(ref.ptr, buf, size, 0) == size
    kept = sum(b - a for a, b in ranges)
    if cr_rope:
        mem = L.llama_get_memory(ref.ptr)
        j = 0
        for a, b in ranges:
            if a != j:
                L.llama_memory_seq_add(mem, 0, a, b, j - a)
            j += b - a
        return ref, kept
    return ref, n


@pytest.mark.parametrize("fa,tk,tv", CACHE_CONFIGS)
@pytest.mark.parametrize("cr_rope", [False, True], ids=["keep_pos", "cr_rope"])
def test_same_set_for_every_head_matches_seq_rm(smol, doc_tokens, question_tokens, fa, tk, tv, cr_rope):
    """Compaction with one set for all heads equals stock seq_rm of the rest (+ seq_add shifts for CR-RoPE)."""
    n = len(doc_tokens)
    ranges = [(0, 40), (120, 170), (n - 60, n)]  # head, a middle slice, the tail
    kept = np.concatenate([np.arange(a, b) for a, b in ranges])

    ref, p_ref = _stock_compacted(smol, doc_tokens, ranges, cr_rope, fa, tk, tv)
    want = _logits_after(ref, question_tokens, p_ref)

    ctx = new_ctx(smol, N_CTX, CHUNK, fa, tk, tv)
    pot = Pot(ctx)
    decode_chunks(ctx, doc_tokens, CHUNK)
    pot.compact(np.broadcast_to(kept, (pot.n_layers, pot.n_head_kv, kept.size)), cr_rope=cr_rope)
    st = pot.stats()
    assert st.n_cells_used == kept.size
    assert st.pos_next == p_ref
    got = _logits_after(ctx, question_tokens, st.pos_next)
    assert np.abs(got - want).max() < 1e-4 * max(1.0, np.abs(want).max())
    ref.close()
    ctx.close()


@pytest.mark.parametrize("fa,tk,tv", CACHE_CONFIGS)
def test_per_head_sets_are_read_back_exactly(smol, smollm2_path, doc_tokens, fa, tk, tv):
    """Heads keep different cells: the cache afterwards holds exactly those, and CR-RoPE keys equal NumPy RoPE."""
    d = 64
    rope = rope_facts(smollm2_path)
    ctx = new_ctx(smol, N_CTX, CHUNK, fa, tk, tv)
    pot = Pot(ctx)
    n = len(doc_tokens)
    decode_chunks(ctx, doc_tokens, CHUNK)
    layers = [0, pot.n_layers // 2, pot.n_layers - 1]
    before = {(l, h, w): pot.read(l, h, w, 0, n, d) for l in layers for h in range(pot.n_head_kv) for w in "kv"}

    rng = np.random.default_rng(1)
    n_keep = 100
    keep = np.sort(np.stack([np.stack([rng.choice(n, n_keep, replace=False) for _ in range(pot.n_head_kv)])
                             for _ in range(pot.n_layers)]), axis=-1)
    assert len({tuple(keep[0, h]) for h in range(pot.n_head_kv)}) == pot.n_head_kv  # heads really differ
    pot.compact(keep, cr_rope=False)
    quant = tk == "q8_0"
    tol = dict(rtol=0, atol=0) if not quant else dict(rtol=2e-2, atol=2e-2)
    for (l, h, w), full in before.items():
        after = pot.read(l, h, w, 0, n_keep, d)
        np.testing.assert_allclose(after, full[keep[l, h]], **tol, err_msg=f"layer {l} head {h} {w}")

    # a second compaction with CR-RoPE: keep 60 of the 100 per head, positions restart at 0..59
    before2 = {(l, h): pot.read(l, h, "k", 0, n_keep, d) for l in layers for h in range(pot.n_head_kv)}
    keep2 = np.sort(np.stack([np.stack([rng.choice(n_keep, 60, replace=False) for _ in range(pot.n_head_kv)])
                              for _ in range(pot.n_layers)]), axis=-1)
    pot.compact(keep2, cr_rope=True)
    # quantized K caches are stored rotated by a Hadamard matrix (llama.cpp's attn_rot_k); undo it to compare
    unrot = hadamard(d) if quant else np.eye(d)
    for (l, h), k100 in before2.items():
        orig_pos = keep[l, h][keep2[l, h]]          # token positions (= original RoPE positions)
        want = numpy_rope(k100[keep2[l, h]] @ unrot, np.arange(60) - orig_pos, rope["base"], rope["neox"])
        got = pot.read(l, h, "k", 0, 60, d) @ unrot
        scale = np.abs(want).max()
        assert np.abs(got - want).max() < (0.05 if quant else 0.01) * scale, f"layer {l} head {h}"
    ctx.close()


def test_score_taps_equal_kq_soft_max_rows(smol, doc_tokens):
    """Tapped mass equals the kq_soft_max rows captured with cb_eval (flash attention off), summed."""
    pot_layers = [0, 7, 29]
    catcher = TensorCatcher({f"kq_soft_max-{il}" for il in pot_layers})
    from kvpot.runtime.llama import ContextParams, LlamaContext

    ctx = LlamaContext(smol, ContextParams(n_ctx=N_CTX, n_batch=CHUNK, n_threads=2), cb_eval=catcher.callback)
    pot = Pot(ctx)
    first = doc_tokens[:200]
    decode_chunks(ctx, first, CHUNK)
    batch = doc_tokens[200:200 + CHUNK]
    rows = [3, 17, 40, CHUNK - 1]
    pot.tap_request([200 + r for r in rows])
    catcher.caught.clear()
    ctx.decode(batch, 200, logits="last")
    n_cells = 200 + CHUNK
    got = pot.tap_get(n_cells)
    pot.tap_clear()
    n_head, n_head_kv = 9, pot.n_head_kv
    group = n_head // n_head_kv
    for il in pot_layers:
        sm = catcher.caught[f"kq_soft_max-{il}"][0]  # [n_head, n_tokens, n_kv]
        want = sm[:, rows, :n_cells].sum(axis=1)      # [n_head, n_cells]
        want = want.reshape(n_head_kv, group, n_cells).sum(axis=1)
        np.testing.assert_allclose(got[pot.layer_ids.index(il)], want, rtol=1e-4, atol=1e-5)
        assert np.allclose(got[pot.layer_ids.index(il)].sum(axis=1), len(rows) * group, atol=1e-3)  # rows sum to 1
    ctx.close()


def test_logit_taps_equal_kq_rows(smol, doc_tokens):
    """Logit taps (InfLLM's r_m: the pre-softmax q·k·kq_scale each cell receives) equal the kq rows
    captured with cb_eval, scaled and summed over the tapped rows and each KV group's query heads; a
    later attention tap on the same context is attention again (the mode is per request)."""
    pot_layers = [0, 7, 29]
    catcher = TensorCatcher({f"kq-{il}" for il in pot_layers} | {f"kq_soft_max-{il}" for il in pot_layers})
    from kvpot.runtime.llama import ContextParams, LlamaContext

    ctx = LlamaContext(smol, ContextParams(n_ctx=N_CTX, n_batch=CHUNK, n_threads=2), cb_eval=catcher.callback)
    pot = Pot(ctx)
    decode_chunks(ctx, doc_tokens[:150], CHUNK)  # doc_tokens holds 300: room for two more chunks
    rows = [0, 9, 33, CHUNK - 1]
    n_cells = 150 + CHUNK
    n_head, n_head_kv, d = 9, pot.n_head_kv, 64
    group = n_head // n_head_kv
    pot.tap_request([150 + r for r in rows], "logits")
    catcher.caught.clear()
    ctx.decode(doc_tokens[150:150 + CHUNK], 150, logits="last")
    got = pot.tap_get(n_cells)
    for il in pot_layers:
        kq = catcher.caught[f"kq-{il}"][0]  # [n_head, n_tokens, n_kv], q·k before scale, mask and softmax
        want = (kq[:, rows, :n_cells].astype(np.float64) / np.sqrt(d)).sum(axis=1)
        want = want.reshape(n_head_kv, group, n_cells).sum(axis=1)
        np.testing.assert_allclose(got[pot.layer_ids.index(il)], want, rtol=1e-3, atol=1e-3 * np.abs(want).max())
    pot.tap_request([n_cells + r for r in rows])  # the default again: attention probabilities
    catcher.caught.clear()
    ctx.decode(doc_tokens[n_cells:n_cells + CHUNK], n_cells, logits="last")
    mass = pot.tap_get(n_cells + CHUNK)
    assert np.allclose(mass.sum(axis=2), len(rows) * group, atol=1e-3)  # softmax rows sum to 1
    with pytest.raises(PotCallError, match="tap what"):
        pot.tap_request([1], "bogus")
    ctx.close()


@pytest.mark.parametrize("marked", ["all", "last"])
def test_logprobs_equal_log_softmax_of_logits(smol, doc_tokens, marked):
    """Per-token log p(next) from the graph equals log_softmax of the logits stock llama.cpp returns for
    every row, whether the batch marks every row for logits or only the last (then no other row's
    logits leave the graph, and the last row's logits are still the stock ones)."""
    batch = doc_tokens[:CHUNK]
    targets = doc_tokens[1:CHUNK + 1]
    ref = new_ctx(smol, N_CTX, CHUNK)
    ref.decode(batch, 0, logits="all")
    want = log_softmax_rows(ref, CHUNK)[np.arange(CHUNK), targets]
    ref_last = ref.logits_last()
    ref.close()

    got, last = pot_logprobs(new_ctx(smol, N_CTX, CHUNK), batch, targets, marked)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, atol=1e-3)
    np.testing.assert_allclose(last, ref_last, atol=1e-3, rtol=1e-4)
    assert int(np.argmax(last)) == int(np.argmax(ref_last))


def test_stats_report_cells_and_bytes(smol, doc_tokens):
    ctx = new_ctx(smol, N_CTX, CHUNK)
    pot = Pot(ctx)
    pot.set_budget(128)
    decode_chunks(ctx, doc_tokens[:192], CHUNK)
    st = pot.stats()
    # SmolLM2: 30 layers, 3 KV heads x 64 dims, f16 K and V
    row = 3 * 64 * 2 * 2
    assert (st.n_pot_layers, st.n_head_kv, st.n_cells_used, st.budget) == (30, 3, 192, 128)
    assert st.bytes_used == 30 * row * 192
    assert st.bytes_total == 30 * row * ctx.n_ctx
    assert st.n_swa_used == -1
    ctx.close()


@pytest.mark.parametrize("case,needle", [
    ("index_out_of_range", "out of range or empty"),
    ("empty_cell", "out of range or empty"),
    ("negative", "out of range or empty"),
    ("duplicate", "listed twice"),
    ("wrong_layers", "covers 29 layers but the pot has 30"),
    ("wrong_heads", "covers 2 KV heads but the pot has 3"),
    ("too_many", "is outside 1.."),
    ("zero", "is outside 1.."),
])
def test_bad_compaction_calls_fail_cleanly(smol, doc_tokens, case, needle):
    ctx = new_ctx(smol, N_CTX, CHUNK)
    pot = Pot(ctx)
    decode_chunks(ctx, doc_tokens[:100], CHUNK)
    keep = np.broadcast_to(np.arange(50), (30, 3, 50)).copy()
    if case == "index_out_of_range":
        keep[4, 1, 7] = N_CTX + 5
    elif case == "empty_cell":
        keep[4, 1, 7] = 300
    elif case == "negative":
        keep[0, 0, 0] = -1
    elif case == "duplicate":
        keep[2, 2, 10] = keep[2, 2, 11]
    elif case == "wrong_layers":
        keep = keep[:29]
    elif case == "wrong_heads":
        keep = keep[:, :2]
    elif case == "too_many":
        keep = np.broadcast_to(np.arange(101), (30, 3, 101)).copy()
    elif case == "zero":
        keep = np.zeros((30, 3, 0), dtype=np.int64)
    with pytest.raises(PotCallError, match=needle) as err:
        pot.compact(keep, cr_rope=False)
    assert err.value.code == -1
    # the process lives on and the cache is untouched
    assert pot.stats().n_cells_used == 100
    ctx.decode(doc_tokens[100:110], 100)
    assert pot.stats().n_cells_used == 110
    ctx.close()


def test_bad_tap_and_read_calls_fail_cleanly(smol, doc_tokens):
    ctx = new_ctx(smol, N_CTX, CHUNK)
    pot = Pot(ctx)
    decode_chunks(ctx, doc_tokens[:64], CHUNK)
    with pytest.raises(PotCallError, match="no score tap was requested"):
        pot.tap_get(64)
    pot.tap_request([10])
    with pytest.raises(PotCallError, match="pot layer 30 does not exist"):
        pot.lib.kvpot_tap_get(ctx.ptr, 30, None, 3, 10) and pot._check("kvpot_tap_get", pot.lib.kvpot_tap_get(ctx.ptr, 30, None, 3, 10))
    with pytest.raises(PotCallError, match="does not exist"):
        pot.read(31, 0, "k", 0, 4, 64)
    with pytest.raises(PotCallError, match="out of bounds"):
        pot.read(0, 0, "k", N_CTX - 2, 4, 64)
    with pytest.raises(PotCallError, match="outside 1.."):
        pot.set_budget(0)
    with pytest.raises(PotCallError, match="no log-probs were requested"):
        pot.logprobs_get(4)
    ctx.close()


def test_score_taps_with_quantized_k_cache(smol, doc_tokens):
    """A Q8_0 K cache is dequantized before the tap's product (a permuted quantized operand is not one
    every backend's MUL_MAT takes): taps equal the kq_soft_max rows of the same run, where llama.cpp
    multiplies the Q8_0 cache itself, within Q8_0's rounding."""
    from kvpot.runtime.llama import ContextParams, LlamaContext

    pot_layers = [0, 29]
    catcher = TensorCatcher({f"kq_soft_max-{il}" for il in pot_layers})
    ctx = LlamaContext(smol, ContextParams(n_ctx=N_CTX, n_batch=CHUNK, n_threads=2, type_k="q8_0"),
                       cb_eval=catcher.callback)
    pot = Pot(ctx)
    decode_chunks(ctx, doc_tokens[:200], CHUNK)
    rows = [5, CHUNK - 1]
    pot.tap_request([200 + r for r in rows])
    catcher.caught.clear()
    ctx.decode(doc_tokens[200:200 + CHUNK], 200, logits="last")
    n_cells = 200 + CHUNK
    got = pot.tap_get(n_cells)
    pot.tap_clear()
    for il in pot_layers:
        sm = catcher.caught[f"kq_soft_max-{il}"][0]
        want = sm[:, rows, :n_cells].sum(axis=1).reshape(3, 3, n_cells).sum(axis=1)
        np.testing.assert_allclose(got[pot.layer_ids.index(il)], want, rtol=0, atol=2e-2)
    ctx.close()
