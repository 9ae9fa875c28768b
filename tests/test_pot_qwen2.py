"""The pot on qwen2 (Qwen2.5-Coder-0.5B: QKV biases, NEOX RoPE with base 1e6, 14 heads / 2 KV heads,
head dim 64), checked as on llama (test_pot.py) and Gemma-3 (test_pot_gemma.py): compaction against stock
llama.cpp, per-head read-back, CR-RoPE against NumPy, score taps against the kq_soft_max rows, and
Locret's heads input. References come from the same run (stock llama.cpp, cb_eval captures, the GGUF's
bias tensors), never pasted.

What qwen2 adds is the bias on Q, K and V: llama.cpp adds it right after each projection (build_qkv)
and before RoPE, so the cache holds RoPE(W_k x + b_k) and everything the pot computes from Q or K
(taps, CR-RoPE, the retaining heads) must see the biased tensors. A K bias is not a constant shift of
the attention logits here: RoPE rotates it by each key's position, so a tap built on unbiased keys
would get other rows (checked below, so these tests would notice).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from potlib import TensorCatcher, decode_chunks, hadamard, logbook_tokens, new_ctx, numpy_rope, rope_facts
from test_pot import _stock_compacted  # the same stock-only reference path
from test_retaining_heads import random_heads

from kvpot.converters.adapter import BaseIdentity
from kvpot.runtime.llama import ContextParams, LlamaContext
from kvpot.runtime.pot import Pot

CHUNK = 64
N_CTX = 384
N_DOC = 128
N_LAYER, N_HEAD, N_HEAD_KV, D = 24, 14, 2, 64
GROUP = N_HEAD // N_HEAD_KV


@pytest.fixture(scope="module")
def tokens(qwen05):
    return logbook_tokens(qwen05, 8, 11, N_DOC + 2 * CHUNK)  # the document, then two chunks for the taps


@pytest.fixture(scope="module")
def doc_tokens(tokens):
    return tokens[:N_DOC]


@pytest.fixture(scope="module")
def question_tokens(qwen05):
    return qwen05.tokenize("\nQuestion: what did Ada do?\nAnswer:")


@pytest.fixture(scope="module")
def biases(qwen05_path):
    return gguf_f32_tensors(qwen05_path, "attn_q.bias", "attn_k.bias", "attn_v.bias")


def gguf_f32_tensors(path, *suffixes: str) -> dict[str, np.ndarray]:
    """The F32 tensors named blk.N.SUFFIX, read straight from the GGUF file (gguf-py's reader builds
    an object per vocabulary entry and takes seconds on qwen2's 152K tokens)."""
    from kvpot.models.gguf_file import _Reader  # read_header's walk, which skips arrays

    out = {}
    with open(path, "rb", buffering=1 << 16) as f:
        r = _Reader(f)
        assert r.take(4) == b"GGUF" and r.unpack("<I", 4) == 3
        n_tensors, n_kv = r.unpack("<Q", 8), r.unpack("<Q", 8)
        alignment = 32
        for _ in range(n_kv):
            key = r.string()
            val = r.value(r.unpack("<I", 4), keep=False)
            if key == "general.alignment":
                alignment = val
        infos = {}
        for _ in range(n_tensors):
            name = r.string()
            dims = [r.unpack("<q", 8) for _ in range(r.unpack("<I", 4))]
            infos[name] = (dims, r.unpack("<I", 4), r.unpack("<Q", 8))
        data = f.tell() + (-f.tell() % alignment)
        for name, (dims, gtype, offset) in infos.items():
            if name.startswith("blk.") and name.split(".", 2)[2] in suffixes:
                assert gtype == 0, f"{name} is ggml type {gtype}, not F32"
                f.seek(data + offset)
                out[name] = np.frombuffer(f.read(4 * math.prod(dims)), dtype=np.float32)
    return out


class Occurrences(TensorCatcher):
    """Every F32 tensor named in `names`, in graph order, across decodes (qwen2's build_qkv names the
    projection, the bias add, the reshape and, in the model's graph, the RoPE result all "Kcur-il")."""

    def __init__(self, names: set[str]):
        super().__init__(names)
        self.seen: dict[str, list[np.ndarray]] = {}

    def _cb(self, t, ask, user_data):
        keep = super()._cb(t, ask, user_data)
        if not ask:
            name = self.ggml.ggml_get_name(t).decode()
            self.seen.setdefault(name, []).append(self.caught[name])
        return keep


def qkv_steps(occ: Occurrences, what: str, il: int, n_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """(projection, projection + bias) of one decode, each [n_tokens, n_heads * D]."""
    seq = occ.seen[f"{what}-{il}"]
    assert len(seq) == (4 if what != "Vcur" else 3), f"{what}-{il}: {len(seq)} tensors of that name"
    proj, biased, reshaped = (a.reshape(n_tokens, -1) for a in seq[:3])
    np.testing.assert_array_equal(reshaped, biased)  # the reshape is the bias add's result
    return proj, biased


def test_pot_is_every_layer(qwen05, doc_tokens):
    ctx = new_ctx(qwen05, N_CTX, CHUNK)
    pot = Pot(ctx)
    assert pot.layer_ids == list(range(N_LAYER)) and pot.n_head_kv == N_HEAD_KV
    decode_chunks(ctx, doc_tokens[:CHUNK], CHUNK)
    st = pot.stats()
    row = N_HEAD_KV * D * 2 * 2  # f16 K and V
    assert (st.n_cells_used, st.n_swa_used, st.bytes_used) == (CHUNK, -1, N_LAYER * row * CHUNK)
    ctx.close()


@pytest.mark.parametrize("fa", [False, True], ids=["fa_off", "fa_on"])
def test_keeping_every_cell_matches_stock(qwen05, doc_tokens, question_tokens, fa):
    ref = new_ctx(qwen05, N_CTX, CHUNK, fa)
    p = decode_chunks(ref, doc_tokens, CHUNK)
    decode_chunks(ref, question_tokens, CHUNK, p)
    want = ref.logits_last()
    ctx = new_ctx(qwen05, N_CTX, CHUNK, fa)
    pot = Pot(ctx)
    decode_chunks(ctx, doc_tokens, CHUNK)
    pot.compact(np.broadcast_to(np.arange(N_DOC), (N_LAYER, N_HEAD_KV, N_DOC)), cr_rope=False)
    assert pot.stats().n_cells_used == N_DOC
    decode_chunks(ctx, question_tokens, CHUNK, p)
    got = ctx.logits_last()
    assert np.abs(got - want).max() < 1e-4 * max(1.0, np.abs(want).max())
    ref.close()
    ctx.close()


@pytest.mark.parametrize("fa", [False, True], ids=["fa_off", "fa_on"])
@pytest.mark.parametrize("cr_rope", [False, True], ids=["keep_pos", "cr_rope"])
def test_same_set_for_every_head_matches_seq_rm(qwen05, doc_tokens, question_tokens, fa, cr_rope):
    """One set for all heads equals stock seq_rm of the rest (+ seq_add shifts, llama.cpp's own K
    re-rotation, for CR-RoPE)."""
    ranges = [(0, 16), (50, 70), (N_DOC - 30, N_DOC)]  # head, a middle slice, the tail
    kept = np.concatenate([np.arange(a, b) for a, b in ranges])
    ref, p_ref = _stock_compacted(qwen05, doc_tokens, ranges, cr_rope, fa, "f16", "f16", n_ctx=N_CTX, chunk=CHUNK)
    decode_chunks(ref, question_tokens, CHUNK, p_ref)
    want = ref.logits_last()

    ctx = new_ctx(qwen05, N_CTX, CHUNK, fa)
    pot = Pot(ctx)
    decode_chunks(ctx, doc_tokens, CHUNK)
    pot.compact(np.broadcast_to(kept, (N_LAYER, N_HEAD_KV, kept.size)), cr_rope=cr_rope)
    st = pot.stats()
    assert (st.n_cells_used, st.pos_next) == (kept.size, p_ref)
    decode_chunks(ctx, question_tokens, CHUNK, p_ref)
    got = ctx.logits_last()
    assert np.abs(got - want).max() < 1e-4 * max(1.0, np.abs(want).max())
    ref.close()
    ctx.close()


@pytest.mark.parametrize("fa,tk", [(False, "f16"), (True, "q8_0")], ids=["fa_off-f16", "fa_on-q8_0"])
def test_per_head_sets_are_read_back_exactly(qwen05, qwen05_path, doc_tokens, fa, tk):
    """Heads keep different cells (V transposed with flash attention off): the cache afterwards holds
    exactly those, and a second compaction's CR-RoPE keys equal NumPy RoPE of the first's."""
    rope = rope_facts(qwen05_path)
    ctx = new_ctx(qwen05, N_CTX, CHUNK, fa, tk, tk)
    pot = Pot(ctx)
    decode_chunks(ctx, doc_tokens, CHUNK)
    layers = [0, N_LAYER // 2, N_LAYER - 1]
    before = {(l, h, w): pot.read(l, h, w, 0, N_DOC, D) for l in layers for h in range(N_HEAD_KV) for w in "kv"}
    rng = np.random.default_rng(1)
    n_keep = 60
    keep = np.sort(np.stack([np.stack([rng.choice(N_DOC, n_keep, replace=False) for _ in range(N_HEAD_KV)])
                             for _ in range(N_LAYER)]), axis=-1)
    assert all((keep[l, 0] != keep[l, 1]).any() for l in layers)  # the two heads really differ
    pot.compact(keep, cr_rope=False)
    quant = tk == "q8_0"
    tol = dict(rtol=0, atol=0) if not quant else dict(rtol=2e-2, atol=2e-2)
    for (l, h, w), full in before.items():
        np.testing.assert_allclose(pot.read(l, h, w, 0, n_keep, D), full[keep[l, h]], **tol, err_msg=f"layer {l} head {h} {w}")

    before2 = {(l, h): pot.read(l, h, "k", 0, n_keep, D) for l in layers for h in range(N_HEAD_KV)}
    keep2 = np.sort(np.stack([np.stack([rng.choice(n_keep, 40, replace=False) for _ in range(N_HEAD_KV)])
                              for _ in range(N_LAYER)]), axis=-1)
    pot.compact(keep2, cr_rope=True)
    assert pot.stats().pos_next == 40
    unrot = hadamard(D) if quant else np.eye(D)  # quantized K is stored Hadamard-rotated (attn_rot_k)
    for (l, h), k60 in before2.items():
        orig_pos = keep[l, h][keep2[l, h]]
        want = numpy_rope(k60[keep2[l, h]] @ unrot, np.arange(40) - orig_pos, rope["base"], rope["neox"])
        got = pot.read(l, h, "k", 0, 40, D) @ unrot
        assert np.abs(got - want).max() < (0.05 if quant else 0.01) * np.abs(want).max(), f"layer {l} head {h}"
    ctx.close()


def test_cr_rope_keys_equal_numpy_rope_of_the_biased_keys(qwen05, qwen05_path, doc_tokens, biases):
    """Per layer and KV head: the cache holds NEOX RoPE (base 1e6, from the GGUF) of the biased
    pre-RoPE keys captured with cb_eval (their bias checked against the GGUF's attn_k.bias), V holds
    the biased values, and after a compaction with a different set per layer and head the CR-RoPE
    keys equal NumPy RoPE of those biased keys at 0..n-1."""
    rope = rope_facts(qwen05_path)
    # qwen2.rope.freq_base in the GGUF; llama.cpp's llama_model_rope_type lists LLM_ARCH_QWEN2 as NEOX
    assert rope == {"base": 1e6, "neox": True}
    occ = Occurrences({f"{w}-{il}" for il in range(N_LAYER) for w in ("Kcur", "Vcur")})
    ctx = LlamaContext(qwen05, ContextParams(n_ctx=N_CTX, n_batch=CHUNK, n_threads=2), cb_eval=occ.callback)
    pot = Pot(ctx)
    k_pre = {il: [] for il in range(N_LAYER)}
    v_pre = {il: [] for il in range(N_LAYER)}
    for s in range(0, N_DOC, CHUNK):
        occ.seen.clear()
        ctx.decode(doc_tokens[s:s + CHUNK], s, logits="last")
        for il in range(N_LAYER):
            proj, k = qkv_steps(occ, "Kcur", il, CHUNK)
            np.testing.assert_allclose(k - proj, np.broadcast_to(biases[f"blk.{il}.attn_k.bias"], k.shape),
                                       rtol=0, atol=1e-5 * np.abs(k).max())
            k_pre[il].append(k)
            v_pre[il].append(qkv_steps(occ, "Vcur", il, CHUNK)[1])
    k_pre = {il: np.concatenate(a).reshape(N_DOC, N_HEAD_KV, D) for il, a in k_pre.items()}
    v_pre = {il: np.concatenate(a).reshape(N_DOC, N_HEAD_KV, D) for il, a in v_pre.items()}
    pos = np.arange(N_DOC)
    for il in range(N_LAYER):
        for h in range(N_HEAD_KV):
            want = numpy_rope(k_pre[il][:, h], pos, rope["base"], rope["neox"])
            got = pot.read(il, h, "k", 0, N_DOC, D)
            assert np.abs(got - want).max() < 2e-3 * np.abs(want).max(), f"layer {il} head {h}: cache K"
            np.testing.assert_array_equal(pot.read(il, h, "v", 0, N_DOC, D),
                                          v_pre[il][:, h].astype(np.float16).astype(np.float32))

    rng = np.random.default_rng(4)
    n_keep = 50
    keep = np.sort(np.stack([np.stack([rng.choice(N_DOC, n_keep, replace=False) for _ in range(N_HEAD_KV)])
                             for _ in range(N_LAYER)]), axis=-1)
    pot.compact(keep, cr_rope=True)
    assert pot.stats().pos_next == n_keep
    for il in range(N_LAYER):
        for h in range(N_HEAD_KV):
            want = numpy_rope(k_pre[il][keep[il, h], h], np.arange(n_keep), rope["base"], rope["neox"])
            got = pot.read(il, h, "k", 0, n_keep, D)
            assert np.abs(got - want).max() < 2e-3 * np.abs(want).max(), f"layer {il} head {h}: CR-RoPE K"
            np.testing.assert_array_equal(pot.read(il, h, "v", 0, n_keep, D),
                                          v_pre[il][keep[il, h], h].astype(np.float16).astype(np.float32))
    ctx.decode(doc_tokens[:8], n_keep)  # decoding continues after the restarted positions
    assert pot.stats().n_cells_used == n_keep + 8
    ctx.close()


def _softmax_rows(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_score_taps_equal_kq_soft_max_rows(qwen05, qwen05_path, tokens, biases):
    """Attention taps equal the kq_soft_max rows captured with cb_eval (flash attention off), summed
    over the rows and each KV group's 7 query heads; logit taps equal the kq rows times kq_scale.

    On qwen2 those rows are computed from biased keys, RoPE(W_k x + b_k): that the taps see the
    biased K is the point. The same rows computed with the K bias taken out of the keys are far from
    the taps, so a tap that missed the bias fails here."""
    rope = rope_facts(qwen05_path)
    layers = [0, N_LAYER // 2, N_LAYER - 1]
    catcher = TensorCatcher({f"{n}-{il}" for il in layers for n in ("kq_soft_max", "kq", "Qcur")})
    ctx = LlamaContext(qwen05, ContextParams(n_ctx=N_CTX, n_batch=CHUNK, n_threads=2), cb_eval=catcher.callback)
    pot = Pot(ctx)
    p0 = N_DOC - CHUNK  # the document's last chunk is tapped, the one after it logit-tapped
    decode_chunks(ctx, tokens[:p0], CHUNK)
    rows = [0, 11, 40, CHUNK - 1]
    n_cells = p0 + CHUNK
    scale = 1.0 / math.sqrt(D)
    pot.tap_request([p0 + r for r in rows])
    catcher.caught.clear()
    ctx.decode(tokens[p0:n_cells], p0, logits="last")
    got = pot.tap_get(n_cells)
    cells = np.arange(n_cells)
    for il in layers:
        sm = catcher.caught[f"kq_soft_max-{il}"][0]               # [n_head, n_tokens, n_kv]
        want = sm[:, rows, :n_cells].sum(axis=1).reshape(N_HEAD_KV, GROUP, n_cells).sum(axis=1)
        mass = got[pot.layer_ids.index(il)]
        np.testing.assert_allclose(mass, want, rtol=1e-4, atol=1e-5)
        assert np.allclose(mass.sum(axis=1), len(rows) * GROUP, atol=1e-3)
        # the rows again from kq (q . RoPE(k + b_k)), then without b_k: q . RoPE(b_k) varies per cell
        kq = catcher.caught[f"kq-{il}"][0][:, rows, :n_cells].astype(np.float64)   # [n_head, rows, n_cells]
        q = catcher.caught[f"Qcur-{il}"][0][rows].astype(np.float64)              # [rows, n_head, D], after RoPE
        bk = biases[f"blk.{il}.attn_k.bias"].reshape(N_HEAD_KV, D)
        rot_b = np.stack([numpy_rope(np.broadcast_to(bk[h], (n_cells, D)), cells, rope["base"], rope["neox"])
                          for h in range(N_HEAD_KV)])                            # [n_head_kv, n_cells, D]
        q_b = np.einsum("rhd,hcd->hrc", q, np.repeat(rot_b, GROUP, axis=0))   # [n_head, rows, n_cells]
        masked = np.where(cells[None, None, :] > (p0 + np.array(rows))[None, :, None], -np.inf, 0.0)
        as_kq = _softmax_rows(kq * scale + masked).sum(axis=1).reshape(N_HEAD_KV, GROUP, n_cells).sum(axis=1)
        unbiased = _softmax_rows((kq - q_b) * scale + masked).sum(axis=1).reshape(N_HEAD_KV, GROUP, n_cells).sum(axis=1)
        np.testing.assert_allclose(mass, as_kq, rtol=0, atol=1e-3)
        assert np.abs(unbiased - mass).max() > 0.05, f"layer {il}: the K bias barely moves the rows"

    pot.tap_request([n_cells + r for r in rows], "logits")
    catcher.caught.clear()
    ctx.decode(tokens[n_cells:n_cells + CHUNK], n_cells, logits="last")
    got = pot.tap_get(n_cells + CHUNK)
    for il in layers:
        kq = catcher.caught[f"kq-{il}"][0]  # q.k before scale, mask and softmax
        want = (kq[:, rows, :n_cells + CHUNK].astype(np.float64) * scale).sum(axis=1)
        want = want.reshape(N_HEAD_KV, GROUP, n_cells + CHUNK).sum(axis=1)
        np.testing.assert_allclose(got[pot.layer_ids.index(il)], want, rtol=1e-3, atol=1e-3 * np.abs(want).max())
    ctx.close()


def test_retaining_heads_read_the_biased_qkv(qwen05, qwen05_path, doc_tokens, biases):
    """Locret's heads input [Q; K; V] (the training capture) is the biased pre-RoPE projections
    captured with cb_eval, whose bias is the GGUF's attn_{q,k,v}.bias, and the in-graph scores equal
    a NumPy fc2(silu(fc1(.))) on them, not on the unbiased projections."""
    base = BaseIdentity.of_model(qwen05_path)
    assert (base.n_head, base.n_head_kv, base.head_dim_k) == (N_HEAD, N_HEAD_KV, D)
    heads = random_heads(base, "silu")
    layers = [0, N_LAYER // 2, N_LAYER - 1]
    occ = Occurrences({f"{w}-{il}" for il in layers for w in ("Qcur", "Kcur", "Vcur")})
    ctx = LlamaContext(qwen05, ContextParams(n_ctx=128, n_batch=CHUNK, n_threads=2), cb_eval=occ.callback)
    try:
        pot = Pot(ctx)
        pot.set_heads(heads)
        pot.capture(True)
        n = CHUNK
        ctx.decode(doc_tokens[:n], 0, logits="last")
        for il in layers:
            pre, post = {}, {}
            for w, b in (("Qcur", "attn_q.bias"), ("Kcur", "attn_k.bias"), ("Vcur", "attn_v.bias")):
                pre[w], post[w] = qkv_steps(occ, w, il, n)
                bias = biases[f"blk.{il}.{b}"]
                np.testing.assert_allclose(post[w] - pre[w], np.broadcast_to(bias, pre[w].shape),
                                           rtol=0, atol=1e-5 * np.abs(post[w]).max(), err_msg=f"{w}-{il}")
            x = np.concatenate([post["Qcur"], post["Kcur"], post["Vcur"]], axis=1)
            np.testing.assert_allclose(pot.take_qkv(il, n, base.qkv_width()), x, rtol=1e-6, atol=1e-6)
            want = heads.scores(il, x)
            got = pot.take_head_scores(il, n)
            assert got.shape == (n, N_HEAD_KV)
            np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3 * np.abs(want).max())
            unbiased = heads.scores(il, np.concatenate([pre["Qcur"], pre["Kcur"], pre["Vcur"]], axis=1))
            assert np.abs(unbiased - got).max() > 0.1 * np.abs(want).max(), f"layer {il}: the biases barely matter"
    finally:
        ctx.close()
