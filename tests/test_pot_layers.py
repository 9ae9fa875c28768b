"""Per-layer budgets in the pot: a layer that keeps fewer cells has the rest masked out of its
attention. Checked against NumPy softmax of the captured attention scores (cb_eval oracle), and
through save/restore of the pot's state."""

from __future__ import annotations

import numpy as np
import pytest
from potlib import TensorCatcher, decode_chunks
from test_pot import doc_tokens  # noqa: F401  (the same SmolLM2 document fixture; the model comes from conftest)

from kvpot.runtime.llama import ContextParams, LlamaContext
from kvpot.runtime.pot import Pot, PotCallError

CHUNK = 64
N_CTX = 512
N_READ = 200   # tokens read before the compaction
WIDTH = 120    # the longest keep row
CAUGHT = [0, 7, 29]


def ragged_keep(n_layer: int, n_head: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A different random set per (layer, head), a different count per layer (layer 7 the widest),
    rows padded with -1."""
    rng = np.random.default_rng(seed)
    n_live = rng.integers(40, WIDTH, n_layer)
    n_live[7] = WIDTH
    keep = np.full((n_layer, n_head, WIDTH), -1, dtype=np.int64)
    for l in range(n_layer):
        for h in range(n_head):
            keep[l, h, :n_live[l]] = np.sort(rng.choice(N_READ, n_live[l], replace=False))
    return keep, n_live


def softmax_reference(kq: np.ndarray, scale: float, visible: np.ndarray) -> np.ndarray:
    """soft_max_ext(kq, mask, scale) with mask 0 where visible, -inf elsewhere; kq [heads, rows, n_kv]."""
    x = np.where(visible[None], kq.astype(np.float64) * scale, -np.inf)
    x -= x.max(axis=-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("seed", [0, 1])
def test_dead_cells_leave_each_layers_softmax(smol, doc_tokens, seed):
    catcher = TensorCatcher({f"kq-{il}" for il in CAUGHT} | {f"kq_soft_max-{il}" for il in CAUGHT})
    ctx = LlamaContext(smol, ContextParams(n_ctx=N_CTX, n_batch=CHUNK, n_threads=2), cb_eval=catcher.callback)
    pot = Pot(ctx)
    decode_chunks(ctx, doc_tokens[:N_READ], CHUNK)
    keep, n_live = ragged_keep(pot.n_layers, pot.n_head_kv, seed)
    pot.compact(keep, cr_rope=False)
    assert pot.stats().n_cells_used == WIDTH

    catcher.caught.clear()
    pos0 = pot.stats().pos_next
    new = doc_tokens[N_READ:N_READ + 32]
    ctx.decode(new, pos0, logits="last")
    n_cells = WIDTH + len(new)
    cell_pos = pot.cell_positions(n_cells)
    row_pos = pos0 + np.arange(len(new))
    scale = 1.0 / np.sqrt(64)  # SmolLM2: head size 64
    for il in CAUGHT:
        l = pot.layer_ids.index(il)
        kq = catcher.caught[f"kq-{il}"][0]          # [n_head, n_tokens, n_kv]
        sm = catcher.caught[f"kq_soft_max-{il}"][0]
        n_kv = kq.shape[-1]
        held = np.zeros(n_kv, dtype=bool)
        held[:n_live[l]] = True                    # the cells this layer kept
        held[WIDTH:n_cells] = True                 # and the chunk just read
        causal = np.full((len(new), n_kv), False)
        causal[:, :n_cells] = cell_pos[None, :] <= row_pos[:, None]
        want = softmax_reference(kq[:, :len(new)], scale, causal & held[None])
        np.testing.assert_allclose(sm[:, :len(new)], want, rtol=2e-3, atol=2e-6)
        assert not sm[:, :len(new), n_live[l]:WIDTH].any()  # exactly zero on the dead cells
    ctx.close()


def test_dead_cells_survive_save_and_restore(smol, doc_tokens):
    """The per-layer counts are part of the pot's state: a restored context continues identically,
    and a dead cell cannot be kept again."""
    ctx = LlamaContext(smol, ContextParams(n_ctx=N_CTX, n_batch=CHUNK, n_threads=2))
    pot = Pot(ctx)
    decode_chunks(ctx, doc_tokens[:N_READ], CHUNK)
    keep, n_live = ragged_keep(pot.n_layers, pot.n_head_kv, 3)
    pot.compact(keep, cr_rope=True)
    pot.settle()
    seq, state = ctx.seq_state(), pot.state_bytes()

    other = LlamaContext(smol, ContextParams(n_ctx=N_CTX, n_batch=CHUNK, n_threads=2))
    other_pot = Pot(other)
    other.set_seq_state(seq)
    other_pot.set_state_bytes(state)
    pos0 = pot.stats().pos_next
    assert other_pot.stats().pos_next == pos0
    new = doc_tokens[N_READ:N_READ + 40]
    decode_chunks(ctx, new, CHUNK, pos0)
    decode_chunks(other, new, CHUNK, pos0)
    np.testing.assert_array_equal(other.logits_last(), ctx.logits_last())

    # a context that forgot the counts (plain restore of the cells) answers differently
    plain = np.frombuffer(state, dtype=np.int32).copy()
    plain[-pot.n_layers:] = WIDTH
    third = LlamaContext(smol, ContextParams(n_ctx=N_CTX, n_batch=CHUNK, n_threads=2))
    third.set_seq_state(seq)
    Pot(third).set_state_bytes(plain.tobytes())
    decode_chunks(third, new, CHUNK, pos0)
    assert np.abs(third.logits_last() - ctx.logits_last()).max() > 1e-2

    # every layer but 7 no longer holds its cells n_live[l]..WIDTH-1: asking for them again fails
    assert n_live.min() < WIDTH
    again = np.broadcast_to(np.arange(WIDTH + 1), (pot.n_layers, pot.n_head_kv, WIDTH + 1)).copy()
    with pytest.raises(PotCallError, match="no longer held by this layer"):
        pot.compact(again, cr_rope=False)
    for c in (ctx, other, third):
        c.close()


@pytest.mark.parametrize("case,needle", [
    ("heads_differ", "same number of cells"),
    ("empty_layer", "same number of cells"),
    ("bad_state", "a layer holds"),
])
def test_bad_ragged_calls_fail_cleanly(smol, doc_tokens, case, needle):
    ctx = LlamaContext(smol, ContextParams(n_ctx=N_CTX, n_batch=CHUNK, n_threads=2))
    pot = Pot(ctx)
    decode_chunks(ctx, doc_tokens[:100], CHUNK)
    keep = np.broadcast_to(np.arange(50), (pot.n_layers, pot.n_head_kv, 50)).copy()
    if case == "bad_state":
        pot.compact(keep, cr_rope=False)
        state = np.frombuffer(pot.state_bytes(), dtype=np.int32).copy()
        state[-1] = 51
        with pytest.raises(PotCallError, match=needle):
            pot.set_state_bytes(state.tobytes())
    else:
        if case == "heads_differ":
            keep[3, 1, 40:] = -1
        else:
            keep[3, :, :] = -1
        with pytest.raises(PotCallError, match=needle):
            pot.compact(keep, cr_rope=False)
        assert pot.stats().n_cells_used == 100
    ctx.close()


def test_dead_cells_with_flash_attention_f16_mask(smol, doc_tokens):
    """With flash attention the mask is F16 and the dead-cell bias is F16 too (one type for ADD, which
    Metal requires): taps see exactly zero on dead cells, and in the first layer equal the taps with
    the F32 mask (flash attention off)."""
    got = {}
    for fa in (False, True):
        ctx = LlamaContext(smol, ContextParams(n_ctx=N_CTX, n_batch=CHUNK, n_threads=2, flash_attn=fa))
        pot = Pot(ctx)
        decode_chunks(ctx, doc_tokens[:N_READ], CHUNK)
        keep, n_live = ragged_keep(pot.n_layers, pot.n_head_kv, 5)
        pot.compact(keep, cr_rope=False)
        pos0 = pot.stats().pos_next
        new = doc_tokens[N_READ:N_READ + 32]
        pot.tap_request([pos0 + 3, pos0 + len(new) - 1])
        ctx.decode(new, pos0, logits="last")
        taps = pot.tap_get(WIDTH + len(new))
        pot.tap_clear()
        for l in range(pot.n_layers):
            assert not taps[l, :, n_live[l]:WIDTH].any(), l
        np.testing.assert_allclose(taps.sum(axis=-1), 2 * 3, atol=1e-3)  # 2 rows x 3 query heads per KV head
        got[fa] = taps
        ctx.close()
    # layer 0 sees the same Q, K and mask values either way (later layers differ by flash attention's
    # own rounding, amplified by Q4 activation quantization): its taps agree to float precision
    np.testing.assert_allclose(got[True][0], got[False][0], rtol=0, atol=1e-5)
