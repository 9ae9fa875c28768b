"""InfLLM's memory at one distance (ggml_ext/kvpot-distance.cpp): every query sees the memory cells as if
they sat `distance` positions before it, whatever its own position. Checked like a graph piece in
test-backend-ops: the attention probabilities the patched graph computes (kq_soft_max, caught with
cb_eval from the same run) against a NumPy softmax over the same cells, whose memory logits are the
memory keys times each query row rotated to the paper's angle; the same rows without the distance must
miss that reference (so the check can fail)."""

from __future__ import annotations

import numpy as np
import pytest
from potlib import TensorCatcher, decode_chunks, logbook_tokens, numpy_rope, rope_facts

from kvpot.engine import Engine, EngineConfig
from kvpot.models.gguf_file import read_model_facts
from kvpot.policies.infllm import InfLLM
from kvpot.runtime.llama import ContextParams, LlamaContext, LlamaModel
from kvpot.runtime.pot import Pot, PotCallError

N_DOC, N_MEM, DIST = 300, 48, 200  # tokens read; the first N_MEM of them become the memory cells
QUESTION = " Which fact was recorded first, and by whom?"


class MemoryPot:
    """A pot that read N_DOC tokens, with the first N_MEM taken out (keys kept at RoPE 0) so that they can
    be put back after the others at any RoPE angle, as InfLLM's recall places its initial tokens and blocks."""

    def __init__(self, model_path, catcher: TensorCatcher):
        facts = read_model_facts(model_path)
        self.d_k, self.d_v = facts.head_dim_k, facts.head_dim_v
        self.model = LlamaModel(str(model_path))
        self.ctx = LlamaContext(self.model, ContextParams(n_ctx=512, n_batch=128, n_threads=2), cb_eval=catcher.callback)
        self.pot = Pot(self.ctx)
        self.catcher = catcher
        decode_chunks(self.ctx, logbook_tokens(self.model, 40, 3, N_DOC), 128)
        self.compact(np.arange(N_DOC))  # every cell placed, at its own RoPE position
        self.k0, self.v0 = self.pot.read_at(0, N_MEM, 0, self.d_k, self.d_v)
        self.compact(np.arange(N_MEM, N_DOC))
        self.cell0 = N_DOC - N_MEM  # where the memory goes back
        self.p0 = self.pot.stats().pos_next

    def compact(self, cells: np.ndarray) -> None:
        L, H = self.pot.n_layers, self.pot.n_head_kv
        self.pot.compact(np.broadcast_to(cells, (L, H, len(cells))).copy(), False)

    def ask(self, tokens: list[int], angle: int, distance: int | None, il: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Put the memory back at `angle`, decode the question, and take both out again. Returns layer il's
        kq_soft_max [n_head, T, n_kv], its RoPE'd queries [T, n_head, d] and the keys of every cell the
        question saw [H, n, d] (memory and question included, as stored)."""
        self.pot.insert(self.k0, self.v0, np.zeros(N_MEM, np.int32), angle)
        if distance is not None:
            self.pot.distance_set(self.cell0, N_MEM, distance)
        self.catcher.caught.clear()
        self.ctx.decode(tokens, self.p0, logits="last")
        ipot = self.pot.layer_ids.index(il)
        n = self.cell0 + N_MEM + len(tokens)
        keys = np.stack([self.pot.read(ipot, h, "k", 0, n, self.d_k) for h in range(self.pot.n_head_kv)])
        self.ctx.remove_from(self.p0)  # the question, from every cache (Gemma-3's window too)
        self.compact(np.arange(self.cell0))
        return self.catcher.caught[f"kq_soft_max-{il}"][0], self.catcher.caught[f"Qcur-{il}"][0], keys


@pytest.mark.parametrize("model_fixture", ["smollm2_path", "gemma_path"])  # Gemma-3: NEOX, one KV head, Q pre-scaled
def test_memory_logits_are_the_papers_at_every_row(request, model_fixture):
    model_path = request.getfixturevalue(model_fixture)
    rope = rope_facts(model_path)
    catcher = TensorCatcher(set())
    mp = MemoryPot(model_path, catcher)
    il = mp.pot.layer_ids[len(mp.pot.layer_ids) // 2]  # a pot layer (Gemma-3: a global one)
    catcher.names = {f"kq_soft_max-{il}", f"Qcur-{il}"}
    question = mp.model.tokenize(QUESTION)
    T = len(question)
    assert T >= 8
    # the softmax's logit is q.k/sqrt(d) for both: llama scales inside the softmax, Gemma-3 scales Q by
    # 1/sqrt(query_pre_attn_scalar = d) after RoPE (the caught Qcur is before that scale)
    scale = 1.0 / np.sqrt(mp.d_k)
    angle = mp.p0 - DIST - 37  # the memory's RoPE angle in the cache: 37 positions further back than the paper's
    mem = slice(mp.cell0, mp.cell0 + N_MEM)
    own0 = mp.cell0 + N_MEM
    ipot = mp.pot.layer_ids.index(il)

    def miss(sm, q, keys) -> float:
        """Largest difference between the graph's probabilities and the paper's, computed from the rows'
        own queries and the cells' keys (the layers before this one differ between the two runs)."""
        n_head = q.shape[1]
        group = n_head // mp.pot.n_head_kv
        worst = 0.0
        for i in range(T):
            for h in range(n_head):
                kv = h // group
                qi = q[i, h].astype(np.float64)
                logits = keys[kv, :own0 + i + 1].astype(np.float64) @ qi * scale  # causal: the cells before row i, and itself
                # the paper: the query at angle + DIST against the memory keys at angle, whatever row i's position
                q_paper = numpy_rope(qi[None, :], np.array([angle + DIST - (mp.p0 + i)]), rope["base"], rope["neox"])[0]
                k_mem = numpy_rope(mp.k0[ipot, kv], np.full(N_MEM, angle), rope["base"], rope["neox"])
                logits[mem] = k_mem @ q_paper * scale
                want = np.exp(logits - logits.max())
                want /= want.sum()
                worst = max(worst, float(np.abs(sm[h, i, :own0 + i + 1] - want).max()))
                assert np.all(sm[h, i, own0 + i + 1:] == 0)  # still causal
        return worst

    worst = {"constant": miss(*mp.ask(question, angle, DIST, il)), "chunk": miss(*mp.ask(question, angle, None, il))}
    assert worst["constant"] < 2e-3, worst
    assert worst["chunk"] > 10 * worst["constant"], worst  # without the distance the rows miss the reference
    mp.ctx.close()


def test_distance_needs_placed_cells(smollm2_path):
    mp = MemoryPot(smollm2_path, TensorCatcher(set()))
    mp.pot.insert(mp.k0, mp.v0, np.zeros(N_MEM, np.int32), 0)
    with pytest.raises(PotCallError, match="not within the pot"):
        mp.pot.distance_set(mp.cell0, N_MEM + 1, DIST)
    with pytest.raises(PotCallError, match="not within the pot"):
        mp.pot.distance_set(mp.cell0, N_MEM, -1)
    mp.pot.distance_set(mp.cell0, N_MEM, DIST)
    mp.pot.distance_set(0, 0, 0)  # off
    mp.ctx.close()


def test_infllm_sets_the_distance_after_every_recall_and_a_reopened_context_has_it(smollm2_cut_path, tmp_path):
    from kvpot.bench.logbook import logbook

    text = logbook(n_entries=60, seed=4, fact_at=0.3)[0]
    for distance, want in (("constant", True), ("chunk", False)):
        eng = Engine(str(smollm2_cut_path), InfLLM(store=str(tmp_path / f"{distance}.kvblk"), distance=distance),
                     EngineConfig(budget=512, chunk=128, n_threads=2))
        eng.feed_text(text)
        assert eng.n_compactions > 2
        p = eng.policy
        n_mem = p._p("n_init") + min(p._p("topk"), p._store_blocks) * p._p("block_size")
        if want:
            assert (eng.recall_cells.mem_n, eng.recall_cells.mem_distance) == (n_mem, p._p("n_local"))
            assert (eng.positions[0, 0, eng.recall_cells.mem_cell0:eng.recall_cells.mem_cell0 + p._p("n_init")] == np.arange(p._p("n_init"))).all()
        else:
            assert eng.recall_cells.mem_n == 0
        state = eng.export_state()
        logits = eng.next_logits(" What was recorded?")
        eng.import_state(state)
        assert eng.recall_cells.mem_n == (n_mem if want else 0)
        np.testing.assert_array_equal(eng.next_logits(" What was recorded?"), logits)
        eng.close()


def test_flash_attention_takes_the_distance_too(smollm2_path, tmp_path):
    """Flash attention reads the per-head mask in F16: InfLLM's answer logits with it equal those without
    it within F16 noise, and that noise is well below what dropping the constant distance changes."""
    from kvpot.bench.logbook import logbook

    text = logbook(n_entries=60, seed=4, fact_at=0.3)[0]
    out = {}
    for fa, distance in ((False, "constant"), (True, "constant"), (True, "chunk")):
        # blocks stored in f16, the cache's own type: what is compared is the attention path. With the
        # default q4_0 store flash attention drifted 1.4e-3 from the reference against 1.7e-3 for the
        # chunk distance (the store's own effect is measured apart: docs/benchmarks.md)
        eng = Engine(str(smollm2_path), InfLLM(store=str(tmp_path / f"{fa}-{distance}.kvblk"), distance=distance,
                                               store_type="f16"),
                     EngineConfig(budget=512, chunk=128, n_threads=2, flash_attn=fa))
        try:
            eng.feed_text(text)
            out[(fa, distance)] = eng.next_logits(" What was recorded?")
        finally:
            eng.close()
    ref = out[(False, "constant")]

    def off(x):
        return 1.0 - np.corrcoef(x, ref)[0, 1]
    assert int(np.argmax(out[(True, "constant")])) == int(np.argmax(ref))
    # flash attention ignoring the distance would put the two near each other (a ratio near 1); measured
    # 3.0e-4 against 1.2e-3 on one machine, 5.9e-4 against 1.17e-3 on a 2-core AVX2 one
    assert off(out[(True, "constant")]) < 0.75 * off(out[(True, "chunk")])
