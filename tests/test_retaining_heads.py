"""Locret's retaining heads inside the llama.cpp graph: the scores the graph computes equal a NumPy
fc2(act(fc1([Q; K; V]))) on the pre-RoPE Q, K, V captured from the same run (cb_eval, test oracle),
for both test models (SmolLM2: SiLU; Gemma-3: GELU, heads reading Q/K before q_norm/k_norm)."""

from __future__ import annotations

import numpy as np
import pytest
from potlib import TensorCatcher

from kvpot.bench.logbook import logbook
from kvpot.converters.adapter import BaseIdentity, RetainingHeads
from kvpot.runtime.llama import ContextParams, LlamaContext, LlamaModel
from kvpot.runtime.pot import Pot, PotCallError

HIDDEN = 24


def random_heads(base: BaseIdentity, activation: str, seed: int = 0) -> RetainingHeads:
    rng = np.random.default_rng(seed)
    w = base.qkv_width()
    return RetainingHeads(
        base=base, activation=activation,
        fc1=[rng.standard_normal((HIDDEN, w), dtype=np.float32) / np.sqrt(w) for _ in range(base.n_layer)],
        fc2=[rng.standard_normal((base.n_head_kv, HIDDEN), dtype=np.float32) for _ in range(base.n_layer)])


@pytest.mark.parametrize("which", ["smollm2", "gemma"])
def test_in_graph_scores_equal_numpy_on_captured_qkv(which, request):
    path = request.getfixturevalue("smollm2_path" if which == "smollm2" else "gemma_path")
    base = BaseIdentity.of_model(path)
    heads = random_heads(base, "silu" if which == "smollm2" else "gelu")
    catcher = TensorCatcher(set(), first=True)
    model = LlamaModel(str(path))
    ctx = LlamaContext(model, ContextParams(n_ctx=256, n_batch=64, n_threads=2), cb_eval=catcher.callback)
    try:
        pot = Pot(ctx)
        ids = pot.layer_ids  # every layer of SmolLM2; Gemma-3's global layers (5, 11, 17)
        layers = [ids[0], ids[len(ids) // 2], ids[-1]]
        catcher.names = {f"{n}-{il}" for il in layers for n in ("Qcur", "Kcur", "Vcur")}
        pot.set_heads(heads)
        doc, _, _ = logbook(n_entries=3, seed=1)
        tokens = model.tokenize(doc)[:64]
        ctx.decode(tokens, 0, logits="last")
        for il in layers:
            # the first tensor of each name in build_qkv is the projection itself: [n_tokens, n_head * d]
            q, k, v = (catcher.caught[f"{n}-{il}"].reshape(len(tokens), -1) for n in ("Qcur", "Kcur", "Vcur"))
            assert q.shape[1] == base.n_head * base.head_dim_k and k.shape[1] == base.n_head_kv * base.head_dim_k
            want = heads.scores(il, np.concatenate([q, k, v], axis=1))
            got = pot.take_head_scores(il, len(tokens))
            assert got.shape == (len(tokens), base.n_head_kv)
            np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3 * np.abs(want).max())
        # layers outside the pot (Gemma-3's sliding-window layers) are not scored at all
        for il in sorted(set(range(base.n_layer)) - set(ids)):
            assert pot.take_head_scores(il, len(tokens)).shape == (0, base.n_head_kv), il
        # taken scores are forgotten; the next decode's come on their own, ubatch after ubatch
        ctx.decode(tokens[:10], len(tokens), logits="last")
        assert pot.take_head_scores(ids[0], len(tokens)).shape == (10, base.n_head_kv)
        assert pot.take_head_scores(ids[0], len(tokens)).shape == (0, base.n_head_kv)
        # the heads survive a reset of the pot (they belong to the model, not the document)
        ctx.clear()
        pot.reset()
        ctx.decode(tokens[:7], 0, logits="last")
        assert pot.take_head_scores(ids[0], len(tokens)).shape == (7, base.n_head_kv)
        pot.set_heads(None)
        with pytest.raises(PotCallError, match="no retaining heads"):
            pot.take_head_scores(0, len(tokens))
    finally:
        ctx.close()
        model.close()


def test_heads_for_another_shape_are_refused_in_c(smollm2_path, gemma_path):
    """Python checks adapters first; the C entry point refuses a wrong width on its own too."""
    gemma_heads = random_heads(BaseIdentity.of_model(gemma_path), "gelu")
    model = LlamaModel(str(smollm2_path))
    ctx = LlamaContext(model, ContextParams(n_ctx=128, n_batch=32, n_threads=2))
    try:
        with pytest.raises(PotCallError, match="layers|width"):
            Pot(ctx).set_heads(gemma_heads)
    finally:
        ctx.close()
        model.close()
