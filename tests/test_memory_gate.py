"""EdgeInfinite's gated memory inside the llama.cpp graph equals the NumPy reference (kvpot.policies.edgeinfinite_memory)
through several folds: M, z equal NumPy folds of the K, V read back from the cache; each pot layer's
output equals gate.mix(read(M, z, Q), A_dot) on the Q and A_dot captured from the same run (cb_eval,
test oracle); before the first fold the layer is stock."""

from __future__ import annotations

import numpy as np
import pytest
from potlib import TensorCatcher

from kvpot.bench.logbook import logbook
from kvpot.converters.adapter import BaseIdentity, MemoryGate
from kvpot.policies.edgeinfinite_memory import fold, read
from kvpot.runtime.llama import ContextParams, LlamaContext, LlamaModel
from kvpot.runtime.pot import Pot, PotCallError


def random_gate(layers: list[int], d_v: int, n_head: int, seed: int = 0, d_h: int = 32) -> MemoryGate:
    rng = np.random.default_rng(seed)
    L = len(layers)
    return MemoryGate(layers=layers,
                      w1=(rng.standard_normal((L, d_h, d_v)) / np.sqrt(d_v)).astype(np.float32),
                      b1=(0.1 * rng.standard_normal((L, d_h))).astype(np.float32),
                      w2=(rng.standard_normal((L, d_v, d_h)) / np.sqrt(d_h)).astype(np.float32),
                      b2=(0.1 * rng.standard_normal((L, d_v))).astype(np.float32),
                      g=rng.standard_normal((L, n_head, d_v)).astype(np.float32))


def read_kv(pot: Pot, cells: np.ndarray, dk: int, dv: int) -> tuple[np.ndarray, np.ndarray]:
    """K, V of these cells: [L, H, n, d] each (cells need not be contiguous)."""
    ks = np.zeros((pot.n_layers, pot.n_head_kv, cells.size, dk))
    vs = np.zeros((pot.n_layers, pot.n_head_kv, cells.size, dv))
    for l in range(pot.n_layers):
        for h in range(pot.n_head_kv):
            for i, c in enumerate(cells):
                ks[l, h, i] = pot.read(l, h, "k", int(c), 1, dk)[0]
                vs[l, h, i] = pot.read(l, h, "v", int(c), 1, dv)[0]
    return ks, vs


CASES = [("smollm2", False), ("smollm2", True), ("gemma", False)]


@pytest.mark.parametrize("which,flash", CASES, ids=[f"{w}-fa{int(f)}" for w, f in CASES])
def test_in_graph_memory_equals_numpy_through_folds(which, flash, request):
    path = request.getfixturevalue("smollm2_path" if which == "smollm2" else "gemma_path")
    base = BaseIdentity.of_model(path)
    dk, dv = base.head_dim_k, base.head_dim_v
    model = LlamaModel(str(path))
    catcher = TensorCatcher(set())
    ctx = LlamaContext(model, ContextParams(n_ctx=256, n_batch=64, n_threads=2, flash_attn=flash),
                       cb_eval=catcher.callback)
    try:
        pot = Pot(ctx)
        ids = pot.layer_ids
        probe = sorted({ids[0], ids[len(ids) // 2], ids[-1]})
        catcher.names = {f"{n}-{il}" for il in probe for n in ("kvpot_mem_q", "kqv_out", "kvpot_mem_out", "Qcur")}
        gate = random_gate(ids, dv, base.n_head, seed=3)
        pot.set_gate(gate)
        tokens = model.tokenize(logbook(n_entries=12, seed=2)[0])
        assert len(tokens) >= 160

        # no memory yet: the graph has no mix at all (stock attention, eq. 10)
        ctx.decode(tokens[:64], 0, logits="last")
        assert pot.folded() == 0 and not any(k.startswith("kvpot_mem_out") for k in catcher.caught)

        L, H = pot.n_layers, pot.n_head_kv
        m_ref = np.zeros((L, H, dk, dv))
        z_ref = np.zeros((L, H, dk))
        n_cells, pos = 64, 64
        for step, (first, n_fold) in enumerate([(8, 32), (8, 16), (4, 24)]):
            seg = np.arange(first, first + n_fold)
            ks, vs = read_kv(pot, seg, dk, dv)
            pot.fold(seg)
            for l in range(L):
                for h in range(H):
                    m_ref[l, h], z_ref[l, h] = fold(m_ref[l, h], z_ref[l, h], ks[l, h], vs[l, h])
            m, z, n_folded = pot.memory()
            np.testing.assert_allclose(m, m_ref, rtol=1e-4, atol=1e-4 * np.abs(m_ref).max())
            np.testing.assert_allclose(z, z_ref, rtol=1e-5, atol=1e-6 * np.abs(z_ref).max())
            assert n_folded == sum(n for _, n in [(8, 32), (8, 16), (4, 24)][:step + 1])
            # the folded cells leave the cache (positions stay: no CR-RoPE)
            keep = np.concatenate([np.arange(first), np.arange(first + n_fold, n_cells)])
            pot.compact(np.broadcast_to(keep, (L, H, keep.size)).copy(), cr_rope=False)
            n_cells = keep.size

            catcher.caught.clear()
            chunk = tokens[pos:pos + 16]
            ctx.decode(chunk, pos, logits="last")
            pos += len(chunk)
            n_cells += len(chunk)
            for il in probe:
                ipot = ids.index(il)
                q = catcher.caught[f"kvpot_mem_q-{il}"][0]                # [T, n_head, d_k]
                # the memory reads the model's queries after RoPE in the unscaled convention (logit =
                # Q.K / sqrt(d_k)): the model's own Qcur, although Gemma-3 hands attention Qcur / 16
                qcur = catcher.caught[f"Qcur-{il}"][0]
                np.testing.assert_allclose(q, qcur, rtol=1e-6, atol=1e-6 * np.abs(qcur).max())
                a_dot = catcher.caught[f"kqv_out-{il}"][0, 0].reshape(len(chunk), base.n_head, dv)
                got = catcher.caught[f"kvpot_mem_out-{il}"][0]            # [T, n_head, d_v]
                want = gate.mix(ipot, read(m_ref[ipot], z_ref[ipot], q), a_dot)
                assert not np.allclose(want, a_dot, atol=1e-3)  # the memory changes the output
                np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3 * np.abs(want).max())

        # a reset forgets the document's memory but keeps the gate
        ctx.clear()
        pot.reset()
        assert pot.folded() == 0
        m, z, _ = pot.memory()
        assert not m.any() and not z.any()
        pot.set_gate(None)
        with pytest.raises(PotCallError, match="no memory gate"):
            pot.fold([0])
    finally:
        ctx.close()
        model.close()


def test_gate_for_another_shape_is_refused_in_c(smollm2_path):
    model = LlamaModel(str(smollm2_path))
    ctx = LlamaContext(model, ContextParams(n_ctx=128, n_batch=32, n_threads=2))
    try:
        pot = Pot(ctx)
        with pytest.raises(PotCallError, match="head size"):
            pot.set_gate(random_gate(pot.layer_ids, 256, 4))
        with pytest.raises(PotCallError, match="layers"):
            pot.set_gate(random_gate(pot.layer_ids[:3], 64, 9))
        with pytest.raises(PotCallError, match="no memory gate"):
            pot.fold([0])
    finally:
        ctx.close()
        model.close()


def test_quantized_cache_is_refused(smollm2_path):
    """llama.cpp stores a quantized K Hadamard-rotated; sigma(K) of a rotated key is not the paper's."""
    model = LlamaModel(str(smollm2_path))
    ctx = LlamaContext(model, ContextParams(n_ctx=128, n_batch=32, n_threads=2, flash_attn=True,
                                            type_k="q8_0", type_v="q8_0"))
    try:
        pot = Pot(ctx)
        with pytest.raises(PotCallError, match="f16 or f32 KV cache"):
            pot.set_gate(random_gate(pot.layer_ids, 64, 9))
    finally:
        ctx.close()
        model.close()
