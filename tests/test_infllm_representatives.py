"""InfLLM's representative keys (the paper's section 3.2) against NumPy on the scores captured in a real
run: r_m, the mean attention logit a token receives from the queries of later chunks while it is local,
is kept here independently from every chunk's logit tap, and each stored block's representative per KV
head must be the mean of the keys (at RoPE 0) of its repr_topk tokens with the highest r_m. Checked for
each row format of the store: the representatives stay f32 whatever the K/V format."""

from __future__ import annotations

import numpy as np
import pytest

from kvpot.bench.logbook import logbook
from kvpot.engine import Engine, EngineConfig
from kvpot.policies import InfLLM


@pytest.mark.parametrize("store_type", ["f16", "q4_0"])
def test_representatives_are_the_top_r_m_keys_of_the_captured_scores(smollm2_path, tmp_path, store_type):
    text = logbook(n_entries=40, seed=5, fact_at=0.4)[0]
    policy = InfLLM(store=str(tmp_path / "s.kvblk"), lookup="host", store_type=store_type)
    eng = Engine(str(smollm2_path), policy, EngineConfig(budget=512, chunk=128, n_threads=2))
    n_init = None
    summed: dict[int, np.ndarray] = {}  # stream position -> [L, H] logits received from later chunks
    rows: dict[int, int] = {}           # stream position -> query rows counted
    evicted: set[int] = set()
    want: list[tuple[np.ndarray, np.ndarray]] = []  # per block appended: (stream positions, reps [L, H, d_k])

    after_chunk, evict = policy.after_chunk, policy._evict

    def record_chunk(view):
        if view.scores is not None and view.chunk_positions.size:
            pos = view.positions[0, 0]
            start = int(view.chunk_positions.min())
            for cell in np.flatnonzero((pos >= n_init) & (pos < start)):
                p = int(pos[cell])
                if p in evicted:  # a recalled block's token: it left the local window already
                    continue
                summed[p] = summed.get(p, 0) + view.scores[..., cell].astype(np.float64)
                rows[p] = rows.get(p, 0) + int(view.chunk_positions.size)
        after_chunk(view)

    def record_evict(view, cells, pos):
        k, _ = view.read_cells(int(cells[0]), int(cells.size), 0)
        stream = pos[cells]
        bs, r = policy._p("block_size"), policy.repr_topk
        for b in range(cells.size // bs):
            sl = slice(b * bs, (b + 1) * bs)
            r_m = np.stack([summed.get(int(p), np.zeros(k.shape[:2])) / max(rows.get(int(p), 0), 1)
                            for p in stream[sl]], axis=-1)  # [L, H, bs]
            reps = np.zeros(k.shape[:2] + (k.shape[3],))
            for layer in range(k.shape[0]):
                for head in range(k.shape[1]):
                    top = sorted(range(bs), key=lambda i: (-r_m[layer, head, i], i))[:r]  # ties: earlier
                    reps[layer, head] = k[layer, head, sl][top].astype(np.float64).mean(axis=0)
            want.append((stream[sl].copy(), reps))
        evicted.update(int(p) for p in stream)
        evict(view, cells, pos)

    policy.after_chunk, policy._evict = record_chunk, record_evict
    n_init = policy._p("n_init")
    eng.feed_text(text)
    store = policy._blocks
    assert store.info().kv_type == store_type
    assert len(want) == store.n_blocks >= 4
    assert any(rows.values()) and all(r > 0 for r in rows.values())
    for b, (stream, reps) in enumerate(want):
        for layer in range(reps.shape[0]):
            pos, repr_, _, _ = store.read(layer, b)
            np.testing.assert_array_equal(pos, stream)
            np.testing.assert_allclose(repr_, reps[layer], rtol=1e-5, atol=1e-5)
    # the scores matter: the mean of all of a block's keys is not what is stored (not a trivial pass)
    k_all = store.read(0, 0)[2]
    assert not np.allclose(store.read(0, 0)[1], k_all.mean(axis=1), atol=1e-3)
    eng.close()
