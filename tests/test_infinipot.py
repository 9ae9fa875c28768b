"""InfiniPot: one CCD cycle against appendix B in NumPy, catalysts never kept, the pot bounded by |M|,
and the passkey found where truncation loses it."""

from __future__ import annotations

import numpy as np
import pytest

from kvpot.bench.logbook import logbook
from kvpot.bench.niah import read_and_ask
from kvpot.engine import Engine, EngineConfig
from kvpot.errors import KvpotError
from kvpot.policies import InfiniPot, Truncate, make_policy
from kvpot.policies.base import PotView


def _appendix_b_reference(attn: np.ndarray, token_loss: np.ndarray, cache_size: int, nuc_size: int) -> list:
    """Appendix B, line by line, for one (layer, head): attn over the real (non-CaP) tokens."""
    attn = attn.astype(np.float64).copy()
    nuc_indices = np.argsort(-token_loss, kind="stable")[:nuc_size]      # token_loss.topk(NuC_size)
    attn[nuc_indices] = attn.max() + 1.0                                 # "one unit above the maximum"
    keep = np.argsort(-attn, kind="stable")[:cache_size]                 # attn_cache.topk(cache_size)
    return sorted(keep.tolist())


def test_one_ccd_cycle_matches_appendix_b():
    rng = np.random.default_rng(7)
    L, H, n_real, n_cap, C = 2, 3, 40, 5, 12
    pol = InfiniPot(pot=64, keep=C, nuc_ratio=0.5, n_sink=0)  # the paper's selection exactly
    positions = np.broadcast_to(np.arange(n_real), (L, H, n_real)).astype(np.int64)
    logprobs = -rng.exponential(2.0, n_real).astype(np.float32)
    logprobs[0] = np.nan  # the stream's first token has no prediction
    view = PotView(n_layer=L, n_head_kv=H, n_cells=n_real, positions=positions, scores=None, logprobs=logprobs,
                   chunk_positions=np.arange(n_real), tokens_seen=n_real)
    pol.after_chunk(view)
    # the catalyst's rows were tapped: mass on every cell including the catalyst's own
    scores = rng.random((L, H, n_real + n_cap)).astype(np.float32)
    full_pos = np.concatenate([positions, -np.ones((L, H, n_cap), dtype=np.int64)], axis=2)
    view = PotView(n_layer=L, n_head_kv=H, n_cells=n_real + n_cap, positions=full_pos, scores=scores,
                   logprobs=None, chunk_positions=np.arange(0), tokens_seen=n_real)
    keep = pol.select(view, C)
    token_loss = np.nan_to_num(-logprobs, nan=0.0)
    for l in range(L):
        for h in range(H):
            want = _appendix_b_reference(scores[l, h, :n_real], token_loss, C, int(round(0.5 * C)))
            assert keep[l, h].tolist() == want
            assert keep[l, h].max() < n_real  # no catalyst cell
    # the heads really chose differently (CaP is per head) while sharing the NuC picks
    assert len({tuple(keep[0, h]) for h in range(H)}) > 1
    top_nuc = set(np.argsort(-token_loss, kind="stable")[:6].tolist())
    assert all(top_nuc <= set(keep[l, h].tolist()) for l in range(L) for h in range(H))


@pytest.mark.parametrize("pooling", ["maxpool", "avgpool"])
def test_pooled_cap_takes_an_attended_tokens_neighbours(pooling):
    """kernel > 1: each cell's CaP score is pooled over the kernel's window of the document's cells
    (written out below as a loop over each head's cells), the catalyst's cells take no part, and the
    rest is appendix B on the pooled scores."""
    rng = np.random.default_rng(11)
    L, H, n_real, n_cap, C, k = 2, 2, 30, 3, 10, 5
    positions = np.broadcast_to(np.arange(n_real), (L, H, n_real)).astype(np.int64)
    logprobs = -rng.exponential(2.0, n_real).astype(np.float32)
    scores = rng.random((L, H, n_real + n_cap)).astype(np.float32) * 0.1
    scores[:, :, 12] = 5.0                 # the word the catalyst attends to, digits around it score low
    scores[:, :, n_real:] = 100.0          # the catalyst's own cells, which must not pool into the last ones
    full_pos = np.concatenate([positions, -np.ones((L, H, n_cap), dtype=np.int64)], axis=2)
    pol = InfiniPot(pot=64, keep=C, nuc_ratio=0.3, n_sink=0, kernel=k, pooling=pooling)
    pol.after_chunk(PotView(L, H, n_real, positions, None, logprobs, np.arange(n_real), n_real))
    keep = pol.select(PotView(L, H, n_real + n_cap, full_pos, scores, None, np.arange(0), n_real), C)
    token_loss = -logprobs.astype(np.float64)
    for l in range(L):
        for h in range(H):
            s = scores[l, h, :n_real].astype(np.float64)
            pooled = np.empty(n_real)
            for i in range(n_real):
                window = [s[j] if 0 <= j < n_real else None for j in range(i - k // 2, i + k // 2 + 1)]
                inside = [w for w in window if w is not None]
                pooled[i] = max(inside) if pooling == "maxpool" else sum(inside) / k  # zero padding
            assert keep[l, h].tolist() == _appendix_b_reference(pooled, token_loss, C, round(0.3 * C))
    # with maxpool the attended word's whole window is kept; without pooling its neighbours are not
    if pooling == "maxpool":
        assert set(range(10, 15)) <= set(keep[0, 0].tolist())
    plain = InfiniPot(pot=64, keep=C, nuc_ratio=0.3, n_sink=0)
    plain.after_chunk(PotView(L, H, n_real, positions, None, logprobs, np.arange(n_real), n_real))
    assert not set(range(10, 15)) <= set(plain.select(
        PotView(L, H, n_real + n_cap, full_pos, scores, None, np.arange(0), n_real), C)[0, 0].tolist())


def test_the_first_tokens_stay_in_every_head_as_attention_sinks():
    """SmolLM2 has no BOS: its first tokens are the sinks. With NuC taking half of |C|, a head whose
    catalyst rows gave them little mass used to drop them; now they are kept first, and the rest is
    appendix B over the other cells with the slots left."""
    rng = np.random.default_rng(3)
    L, H, n_real, n_cap, C, n_sink = 2, 3, 60, 4, 16, 4
    positions = np.broadcast_to(np.arange(n_real), (L, H, n_real)).astype(np.int64)
    logprobs = -rng.exponential(2.0, n_real).astype(np.float32)
    logprobs[0] = np.nan
    scores = rng.random((L, H, n_real + n_cap)).astype(np.float32)
    scores[1, 2, :n_sink] = 0.0  # one head's catalyst rows ignore the first tokens
    logprobs[1] = -50.0          # and one sink is the most novel token: it must not take a NuC slot
    full_pos = np.concatenate([positions, -np.ones((L, H, n_cap), dtype=np.int64)], axis=2)
    chunk = PotView(L, H, n_real, positions, None, logprobs, np.arange(n_real), n_real)
    view = PotView(L, H, n_real + n_cap, full_pos, scores, None, np.arange(0), n_real)
    token_loss = np.nan_to_num(-logprobs, nan=0.0)
    T = round(0.5 * C)
    for sinks in (0, n_sink):
        pol = InfiniPot(pot=128, keep=C, nuc_ratio=0.5, n_sink=sinks)
        pol.after_chunk(chunk)
        keep = pol.select(view, C)
        for l in range(L):
            for h in range(H):
                rest = _appendix_b_reference(scores[l, h, sinks:n_real], token_loss[sinks:], C - sinks, T)
                assert keep[l, h].tolist() == list(range(sinks)) + [sinks + i for i in rest], (sinks, l, h)
    # without sinks (the paper's selection) the ignoring head loses its first tokens
    dropped = InfiniPot(pot=128, keep=C, nuc_ratio=0.5, n_sink=0)
    dropped.after_chunk(chunk)
    assert not set(range(n_sink)) <= set(dropped.select(view, C)[1, 2].tolist())


def test_without_cap_the_rest_goes_to_recent_tokens():
    pol = InfiniPot(pot=64, keep=10, nuc_ratio=0.0, cap="none", n_sink=0)
    assert pol.catalyst_text() is None
    pos = np.broadcast_to(np.arange(30), (1, 1, 30)).astype(np.int64)
    pol.after_chunk(PotView(1, 1, 30, pos, None, None, np.arange(30), 30))
    keep = pol.select(PotView(1, 1, 30, pos, None, None, np.arange(0), 30), 10)
    assert keep[0, 0].tolist() == list(range(20, 30))


def test_catalyst_variants_and_question():
    assert InfiniPot(cap="G").catalyst_text() == "Summarize the critical points highlighted in this section."
    auto = InfiniPot()
    assert auto.catalyst_text().startswith("Summarize")
    auto.set_question("Who wrote it?")
    assert auto.catalyst_text().endswith("Question: Who wrote it?")
    assert InfiniPot(cap="custom", cap_text="Find names.").catalyst_text() == "Find names."
    assert InfiniPot(cap="P").catalyst_text() == "\n\n\n"


@pytest.mark.parametrize("spec,needle", [
    ("infinipot:pot=100,keep=100", "below pot"),
    ("infinipot:keep=0", "at least 1"),
    ("infinipot:nuc_ratio=1.5", "within [0, 1]"),
    ("infinipot:cap=X", "cap must be one of"),
    ("infinipot:cap=custom", "needs cap_text"),
    ("infinipot:kernel=4", "positive odd number"),
    ("infinipot:pooling=minpool", "pooling must be one of"),
])
def test_nonsense_parameters_are_refused(spec, needle):
    with pytest.raises(KvpotError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        make_policy(spec)


@pytest.mark.parametrize("cr_rope", [True, False])
def test_pot_bounded_and_catalyst_never_kept(smollm2_path, cr_rope):
    text, question, _ = logbook(n_entries=40, seed=9)
    pol = InfiniPot(pot=256, keep=128, cr_rope=cr_rope)
    eng = Engine(str(smollm2_path), pol, EngineConfig(chunk=64, n_threads=2))
    eng.set_question(question)
    events = []
    eng.feed_text(text, on_chunk=events.append)
    assert eng.n_compactions >= 3
    assert max(ev.cells_peak for ev in events) <= 256
    assert max(ev.stats.n_cells_used for ev in events) <= 256
    assert (eng.positions >= 0).all()  # no catalyst cell survived
    for ev in events:
        if ev.compacted:
            assert ev.cells == 128 and ev.stats.n_cells_used == 128
    if cr_rope:
        last = [ev for ev in events if ev.compacted][-1]
        assert last.stats.pos_next <= 128 + 64
    assert eng.compact_seconds > 0
    eng.close()


@pytest.mark.slow
def test_passkey_found_at_every_depth_where_truncation_misses_the_middle(gemma_path):
    """Gemma-3-270M, 2K-token haystack (7 distillations), |M| = 512, |C| = 256, CaP-Q."""
    found = {}
    eng = Engine(str(gemma_path), InfiniPot(pot=512, keep=256), EngineConfig(chunk=128, n_threads=2))
    for depth in (0.1, 0.5, 0.9):
        r = read_and_ask(eng, "infinipot", "gemma3-270m", 2048, depth, seed=1)
        found[depth] = r.correct
        assert r.compactions > 5
    eng.close()
    assert found == {0.1: True, 0.5: True, 0.9: True}, found
    trunc = Engine(str(gemma_path), Truncate(), EngineConfig(budget=256, chunk=128, n_threads=2))
    r = read_and_ask(trunc, "truncate", "gemma3-270m", 2048, 0.5, seed=1)
    trunc.close()
    assert not r.correct, f"truncation kept the middle of the haystack? answer {r.answer!r}"
