"""IMDC's per-layer schedules (appendix A.1's SQUARE-SQRT, eq. 2-3's adaptive function), checked
against the equations computed here with plain loops, then run through the engine on SmolLM2."""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_imdc import paper_memory, paper_n

from kvpot.bench.logbook import logbook
from kvpot.engine import Engine, EngineConfig
from kvpot.policies import IMDC, PotView, SnapKV, StreamingLLM, Truncate
from kvpot.policies.base import DEAD, PAD, check_keep
from kvpot.policies.imdc_schedule import proportional_share, retention_ratio
from kvpot.policies.wrappers import select_per_layer


def planned(n_tokens: int, **kwargs) -> IMDC:
    kwargs = {"m_max": 1024, "chunk": 512, **kwargs}  # what fit(budget=1024, chunk=512) would set
    policy = IMDC(Truncate(), **kwargs)  # a pruner that works with any memory size: these test the schedule
    policy.set_expected_length(n_tokens)
    return policy


@pytest.mark.parametrize("n_layer", [1, 2, 3, 30])
@pytest.mark.parametrize(("m_max", "c", "n_tokens"), [(1024, 512, 16384), (1024, 1024, 32768), (300, 256, 5000)])
def test_square_sqrt_puts_eq_7_below_and_eq_8_above(n_layer: int, m_max: int, c: int, n_tokens: int):
    policy = planned(n_tokens, m_max=m_max, chunk=c, function="square-sqrt")
    n = paper_n(n_tokens, c)
    m_0 = max(1, m_max // n)
    square, sqrt = paper_memory("square", m_max, m_0, n), paper_memory("sqrt", m_max, m_0, n)
    for i in range(n):
        got = policy.layer_memory(i, n_layer)
        for j in range(n_layer):
            want = square[i] if j < n_layer // 2 else sqrt[i]  # lower half SQUARE, upper half SQRT
            assert want - 1 < got[j] <= want + 1e-9, (i, j, got)
        # the chunks are planned with the pair's mean, which integrates like LINEAR (appendix A.1)
        assert policy.schedule()[i][1] == (math.floor(square[i] + 1e-9) + math.floor(sqrt[i] + 1e-9)) // 2
    assert np.all(policy.layer_memory(n - 1, n_layer) == m_max)
    # the cache holds the longest step of the layer with the most memory (SQRT)
    sched = policy.schedule()
    peak = max(ci + (math.floor(sqrt[i - 1] + 1e-9) if i else 0) for i, (ci, _) in enumerate(sched))
    assert policy.cache_cells(0, 0) == peak


@pytest.mark.parametrize("seed", range(8))
def test_adaptive_follows_eq_3(seed: int):
    rng = np.random.default_rng(seed)
    n_layer = int(rng.integers(2, 31))
    policy = planned(32768, m_max=1024, chunk=512, function="adaptive")
    sched = policy.schedule()
    n, m_0 = len(sched), 1024 // 64
    # step 0 sizes every layer b_0; step 1 has no retention measured yet: b_1
    assert np.all(policy.layer_memory(0, n_layer) == sched[0][1])
    assert np.all(policy.layer_memory(1, n_layer) == sched[1][1])
    policy._retention = rng.uniform(0.2, 1.0, n_layer)
    for i in range(2, n):
        b = sched[i][1]
        got = policy.layer_memory(i, n_layer)
        assert got.sum() == min(n_layer * b, n_layer * 1024)   # eq. 3 shares N b_i among the layers
        assert got.min() >= min(m_0, b) and got.max() <= 1024  # each layer within [m_0, m_max]
        want = policy._retention / policy._retention.sum() * n_layer * b
        if np.all((want >= min(m_0, b)) & (want <= 1024)):
            assert np.all(np.abs(got - want) < 1), (i, got, want)
        else:  # layers pinned to a bound; the others share the rest in proportion to p
            free = (got > min(m_0, b)) & (got < 1024)
            rest = got[free].sum()
            want_free = policy._retention[free] / policy._retention[free].sum() * rest
            assert np.all(np.abs(got[free] - want_free) < 1 + 1e-9)


def test_proportional_share_hand_examples():
    assert proportional_share(10, np.array([1, 1, 2]), 0, 10).tolist() == [3, 2, 5]   # 2.5, 2.5, 5: the unit left goes to the lower layer
    assert proportional_share(300, np.array([1.0, 0.0, 0.0]), 50, 200).tolist() == [200, 50, 50]
    assert proportional_share(30, np.zeros(3), 1, 100).tolist() == [10, 10, 10]
    assert proportional_share(1000, np.array([1, 2]), 1, 100).tolist() == [100, 100]  # clamped to N hi


def test_retention_is_eq_2():
    """|M_{i-1} ∩ M_i| / |M_i| per layer, averaged over heads, with plain sets."""
    rng = np.random.default_rng(4)
    L, H, n_mem, n_chunk = 3, 2, 40, 24
    start = 500
    positions = np.empty((L, H, n_mem + n_chunk), dtype=np.int64)
    for l in range(L):
        for h in range(H):
            positions[l, h, :n_mem] = np.sort(rng.choice(start, n_mem, replace=False))
            positions[l, h, n_mem:] = np.arange(start, start + n_chunk)
    positions[2, :, 30:n_mem] = DEAD  # layer 2 held only 30 cells of its memory
    view = PotView(n_layer=L, n_head_kv=H, n_cells=n_mem + n_chunk, positions=positions, scores=None,
                   logprobs=None, chunk_positions=np.arange(start, start + n_chunk), tokens_seen=start + n_chunk)
    sizes = [20, 35, 10]
    keep = np.full((L, H, 35), PAD, dtype=np.int64)
    for l in range(L):
        for h in range(H):
            live = [c for c in range(view.n_cells) if positions[l, h, c] != DEAD]
            keep[l, h, :sizes[l]] = np.sort(rng.choice(live, sizes[l], replace=False))
    check_keep(keep, positions, "test")
    want = []
    for l in range(L):
        ratios = []
        for h in range(H):
            before = {int(p) for p in positions[l, h, :n_mem] if p >= 0}
            now = {int(positions[l, h, c]) for c in keep[l, h, :sizes[l]]}
            ratios.append(len(before & now) / len(now))
        want.append(sum(ratios) / H)
    np.testing.assert_allclose(retention_ratio(view, keep), want)


@pytest.mark.parametrize("seed", range(4))
def test_select_per_layer_with_streaming_keeps_sinks_and_recent_of_each_layer(seed: int):
    rng = np.random.default_rng(seed)
    L, H, N = 4, 3, 90
    positions = np.stack([np.stack([rng.permutation(300)[:N] for _ in range(H)]) for _ in range(L)]).astype(np.int64)
    for l in range(L):
        positions[l, :, 10 * l:10 * l + 7 * l] = DEAD  # layer l lost 7 l cells, the same in every head
    view = PotView(n_layer=L, n_head_kv=H, n_cells=N, positions=positions, scores=None, logprobs=None,
                   chunk_positions=np.arange(290, 300), tokens_seen=300)
    budgets = np.array([30, 90, 12, 50])
    keep = select_per_layer(StreamingLLM(n_sink=4), view, budgets)
    n_live = check_keep(keep, positions, "streaming")
    for l in range(L):
        live = N - 7 * l
        assert n_live[l] == min(budgets[l], live)
        for h in range(H):
            held = sorted(int(p) for p in positions[l, h] if p != DEAD)
            want = set(held) if budgets[l] >= live else set(held[:4]) | set(held[len(held) - (budgets[l] - 4):])
            assert {int(positions[l, h, c]) for c in keep[l, h, :n_live[l]]} == want


@pytest.mark.parametrize("function", ["square-sqrt", "adaptive"])
def test_engine_runs_per_layer_schedules(smollm2_path, function: str):
    """After every step each pot layer holds exactly the cells its schedule gives it, the runtime
    agrees (dead cells masked, never kept), and a saved state continues identically."""
    text, question, _ = logbook(n_entries=24, seed=7)
    policy = IMDC(SnapKV(window=16), m_max=256, chunk=128, function=function, m_0=64)
    eng = Engine(str(smollm2_path), policy, EngineConfig(budget=256, chunk=128, n_threads=2))
    held_log = []
    L = eng.pot.n_layers
    planned = {}  # step -> the sizes layer_memory gave before that step's compaction
    read = [0]

    def on_chunk(ev):
        step = eng.step - 1  # the step just read
        held = (eng.positions[:, 0, :] != DEAD).sum(axis=1)
        held_log.append(held)
        assert np.all((eng.positions[:, 0, :] != DEAD) == (eng.positions != DEAD).all(axis=1))
        assert ev.stats.n_cells_used == eng.n_cells
        # a layer keeps its planned size, or all it held when that is fewer (late steps read few tokens)
        held_before = (held_log[-2] if len(held_log) > 1 else 0) + ev.tokens_read - read[-1]
        read.append(ev.tokens_read)
        if ev.compacted:
            want = planned.get(step, policy.layer_memory(0, L) if step == 0 else None)
            assert np.array_equal(held, np.minimum(want, held_before))
        # adaptive: what the next step will keep, from the retention this compaction measured
        planned[step + 1] = policy.layer_memory(step + 1, L)

    tokens = eng.model.tokenize(text)
    eng.feed_stream([tokens], expected=len(tokens), on_chunk=on_chunk)
    assert len(held_log) == len(policy.schedule()) and eng.n_compactions >= len(held_log) - 1
    assert any(len(set(h.tolist())) > 1 for h in held_log)  # layers really differ
    if function == "adaptive":
        assert policy._retention is not None and policy._retention.shape == (L,)

    state = eng.export_state()
    logits = eng.next_logits(f"\nQuestion: {question}\nAnswer:")
    again = Engine(str(smollm2_path), IMDC(SnapKV(window=16), m_max=256, chunk=128, function=function, m_0=64),
                   EngineConfig(budget=256, chunk=128, n_threads=2))
    again.import_state(state)
    np.testing.assert_array_equal(again.positions, eng.positions[:, :, :again.n_cells])
    np.testing.assert_allclose(again.next_logits(f"\nQuestion: {question}\nAnswer:"), logits, atol=1e-4)
    eng.close()
    again.close()
