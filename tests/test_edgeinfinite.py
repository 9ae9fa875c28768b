"""EdgeInfinite's policy: fit() sizes, short-input routing, whole segments folded after the sink,
the budget held with the memory counted once it exists."""

from __future__ import annotations

import numpy as np
import pytest

from kvpot.errors import KvpotError
from kvpot.policies import EdgeInfinite, make_policy
from kvpot.policies.base import BudgetTooSmall, PotView


def stream_view(n: int, L: int = 2, H: int = 2, shuffle: int | None = None) -> PotView:
    pos = np.broadcast_to(np.arange(n), (L, H, n)).copy()
    if shuffle is not None:  # a different cell order per (layer, head), as after per-head compactions
        rng = np.random.default_rng(shuffle)
        for l in range(L):
            for h in range(H):
                pos[l, h] = rng.permutation(n)
    return PotView(n_layer=L, n_head_kv=H, n_cells=n, positions=pos, scores=None, logprobs=None,
                   chunk_positions=np.arange(n - 8, n), tokens_seen=n)


def test_fit_takes_the_paper_lengths_when_they_fit_and_scales_them_down_otherwise():
    p = EdgeInfinite(gate="g")
    p._mem_cells = 65
    p.fit(4096, 512)
    assert p.lengths() == (300, 200, 2048)
    p = EdgeInfinite(gate="g")
    p._mem_cells = 65
    p.fit(1024, 256)
    sink, window, seg = p.lengths()
    assert sink + window + seg + 65 == 1024
    # below the paper's lengths: the sink's share of the paper, segments of one cell, the window the rest
    assert (sink, seg) == (int(959 * 300 / 2548), 1) and window > 5 * sink
    # a length the spec sets is kept; the others share the rest
    p = EdgeInfinite(gate="g", L_sink=4)
    p.fit(500, 64)
    assert p.L_sink == 4 and sum(p.lengths()) == 500
    p = EdgeInfinite(gate="g", L_window=100)
    p.fit(1024, 64)
    assert p.L_window == 100 and sum(p.lengths()) == 1024 and p.L_sink == int(1024 * 300 / 2548)
    with pytest.raises(BudgetTooSmall, match="exceed the budget"):
        EdgeInfinite(gate="g", L_sink=300, L_window=200, L_seg=2048).fit(2000, 64)
    p = EdgeInfinite(gate="g")
    p._mem_cells = 1000
    with pytest.raises(BudgetTooSmall, match="after the memory"):
        p.fit(1004, 64)


def test_short_input_is_plain_attention():
    p = EdgeInfinite(gate="g", L_sink=4, L_window=8, L_seg=16)
    assert not p.wants_compaction(60, 60, 16)
    assert p.select(stream_view(60), 60) is None
    assert p.memory_fold() is None


@pytest.mark.parametrize("shuffle", [None, 7])
def test_whole_segments_after_the_sink_are_folded(shuffle):
    p = EdgeInfinite(gate="g", L_sink=4, L_window=8, L_seg=16)
    view = stream_view(61, shuffle=shuffle)
    assert p.wants_compaction(61, 40, 16)
    keep = p.select(view, 40)
    fold = p.memory_fold()
    assert p.memory_fold() is None  # handed over once
    # 61 - 4 - 8 = 49 -> 3 segments of 16 = 48 folded: positions 4..51; kept: 0..3 and 52..60
    for l in range(2):
        for h in range(2):
            pos = view.positions[l, h]
            assert sorted(pos[fold[l, h]].tolist()) == list(range(4, 52))
            assert sorted(pos[keep[l, h]].tolist()) == [0, 1, 2, 3, *range(52, 61)]
            assert np.all(np.diff(keep[l, h]) > 0) and np.all(np.diff(fold[l, h]) > 0)


def test_the_memory_counts_against_the_budget_once_it_exists():
    p = EdgeInfinite(gate="g", L_sink=4, L_window=8, L_seg=16)
    p._mem_cells = 10
    assert not p.wants_compaction(40, 40, 8)       # no memory yet: the whole budget is KV
    p.select(stream_view(41), 40)
    assert p.wants_compaction(31, 40, 8)           # now 31 cells + 10 of memory exceed 40
    p.reset()
    assert not p.wants_compaction(31, 40, 8)


def test_a_budget_that_cannot_hold_a_segment_is_refused():
    p = EdgeInfinite(gate="g", L_sink=4, L_window=8, L_seg=64)
    with pytest.raises(BudgetTooSmall):
        p.select(stream_view(41), 40)


def test_spec_and_missing_gate():
    p = make_policy("edgeinfinite:gate=x.gguf,L_sink=3,L_window=5,L_seg=none")
    assert (p.L_sink, p.L_window, p.L_seg) == (3, 5, None)
    assert make_policy("edgeinfinite:L_sink=3").gate == ""  # the gate shipped for the model, if any
    with pytest.raises(KvpotError, match="needs a memory gate for this model"):
        make_policy("edgeinfinite").memory_gate("no-such-model.gguf")


@pytest.mark.parametrize("model", ["smollm2_path", "gemma_path"])
def test_closed_gate_is_the_untrained_gate_shut(model, request):
    """gate=closed (the shut-gate ablation): the untrained gate with every channel's g at CLOSED_G, so
    sigmoid(g) is below f32 rounding of the attention output; the memory is sized as for any gate."""
    from kvpot.converters.adapter import initial_memory_gate
    from kvpot.policies.edgeinfinite import CLOSED_G

    path = request.getfixturevalue(model)
    init, closed = EdgeInfinite(gate="init"), make_policy("edgeinfinite:gate=closed")
    want, got = init.memory_gate(path), closed.memory_gate(path)
    assert (got.g == CLOSED_G).all() and 1 / (1 + np.exp(-CLOSED_G)) < 1e-12
    for name in ("w1", "b1", "w2", "b2"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name))
    assert closed._mem_cells == init._mem_cells > 0
    np.testing.assert_array_equal(want.g, initial_memory_gate(path).g)  # init's gate is not the one shut
