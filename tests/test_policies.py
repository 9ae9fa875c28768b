"""Pot policies: one list of every policy through the same contract checks, then per-policy
references recomputed here, with plain loops, from each paper's definition."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from kvpot.errors import KvpotError
from kvpot.policies import (
    H2O,
    IMDC,
    POLICIES,
    BudgetTooSmall,
    EdgeInfinite,
    FullAttention,
    InfiniPot,
    InfLLM,
    LengthAware,
    Locret,
    Policy,
    PotView,
    SnapKV,
    StreamingLLM,
    TapRequest,
    Truncate,
    make_policy,
)
from kvpot.policies.snapkv import pool1d

L, H = 3, 2

ALL_POLICIES = [
    FullAttention(),
    Truncate(),
    StreamingLLM(),
    StreamingLLM(n_sink=0),
    StreamingLLM(n_sink=9),
    SnapKV(),
    SnapKV(window=8, kernel=7, pooling="maxpool"),
    SnapKV(window=3, kernel=1),
    H2O(),
    H2O(heavy_ratio=0.25),
    H2O(heavy_ratio=0.0),
    H2O(heavy_ratio=1.0),
    Locret(heads="heads.gguf", n_s=8),
    Locret(heads="heads.gguf", n_s=0),
    EdgeInfinite(gate="gate.gguf", L_sink=4, L_window=8, L_seg=16),
    EdgeInfinite(gate="gate.gguf", L_sink=0, L_window=3, L_seg=5),
    InfLLM(),
    InfLLM(n_init=8, block_size=16, repr_topk=2),
    InfiniPot(),
    InfiniPot(nuc_ratio=0.0, cr_rope=False),
    IMDC(pruner=SnapKV(window=8, kernel=3), m_0=16),
    IMDC(pruner=StreamingLLM(), function="fixed"),
]
EVICTING = [p for p in ALL_POLICIES if not isinstance(p, FullAttention)]


def policy_id(p: Policy) -> str:
    return repr(p)


# ---------------------------------------------------------------- building pots


def random_view(rng: np.random.Generator, n_cells: int, *, with_scores: bool = True,
                n_layer: int = L, n_head: int = H) -> PotView:
    """A pot whose every (layer, head) holds a different random subset of the stream, in random cell order."""
    tokens_seen = n_cells + int(rng.integers(0, 3 * n_cells))
    positions = np.empty((n_layer, n_head, n_cells), dtype=np.int64)
    for layer in range(n_layer):
        for head in range(n_head):
            positions[layer, head] = rng.permutation(rng.choice(tokens_seen, n_cells, replace=False))
    scores = rng.random((n_layer, n_head, n_cells), dtype=np.float32) + np.float32(1e-3) if with_scores else None
    chunk = np.arange(max(0, tokens_seen - 16), tokens_seen, dtype=np.int64)
    # the retaining heads' scores of the chunk, which the engine returns whenever a policy asks for them
    # (with_scores is about attention taps, which a pot may lack)
    head_scores = rng.random((n_layer, n_head, chunk.size), dtype=np.float32)
    return PotView(n_layer=n_layer, n_head_kv=n_head, n_cells=n_cells, positions=positions, scores=scores,
                   logprobs=None, chunk_positions=chunk, tokens_seen=tokens_seen, head_scores=head_scores)


def view_of(positions: np.ndarray, scores: np.ndarray | None = None, tokens_seen: int | None = None) -> PotView:
    positions = np.asarray(positions, dtype=np.int64)
    n_layer, n_head, n = positions.shape
    seen = int(positions.max()) + 1 if tokens_seen is None else tokens_seen
    return PotView(n_layer=n_layer, n_head_kv=n_head, n_cells=n, positions=positions,
                   scores=None if scores is None else np.asarray(scores, dtype=np.float32),
                   logprobs=None, chunk_positions=np.arange(seen - 1, seen, dtype=np.int64), tokens_seen=seen)


def ready(p: Policy, budget: int, chunk: int, expected: int) -> tuple[Policy, int]:
    """A fresh copy of the listed policy, prepared as the engine prepares it before reading (fit to the
    budget and chunk, told the input's length), and the cells its select keeps at the first step
    (budget_at: InfiniPot keeps |C| of a |M|-cell pot, IMDC its schedule's m_0, the others the budget)."""
    p = copy.deepcopy(p)
    p.reset()
    p.fit(budget, chunk)
    LengthAware.of(p).set_expected_length(expected)
    return p, p.budget_at(0, budget)


def min_budget(p: Policy, chunk: int | None = None) -> int:
    """The smallest budget the policy accepts, asked from the policy itself: check_budget alone, or with
    a chunk, fit as the engine calls it (InfLLM's local window must hold a chunk and a block)."""
    for budget in range(1, 4096):
        try:
            if chunk is None:
                p.check_budget(budget)
            else:
                copy.deepcopy(p).fit(budget, chunk)
            return budget
        except BudgetTooSmall:
            pass
    raise AssertionError(f"{p!r} accepts no budget")


def folds(p: Policy) -> bool:
    """EdgeInfinite folds whole segments into its memory: it keeps at most the budget, not exactly."""
    return isinstance(p, EdgeInfinite)


def check_keep(keep: np.ndarray, n_cells: int, budget: int, n_layer: int = L, n_head: int = H,
               at_most: bool = False) -> None:
    assert isinstance(keep, np.ndarray)
    assert keep.dtype == np.int64
    if at_most:
        assert keep.shape[:2] == (n_layer, n_head) and 1 <= keep.shape[2] <= budget
    else:
        assert keep.shape == (n_layer, n_head, budget)
    assert np.all(np.diff(keep, axis=-1) > 0), "rows must be sorted ascending without duplicates"
    assert keep.min() >= 0 and keep.max() < n_cells


def kept_positions(view: PotView, keep: np.ndarray, layer: int, head: int) -> set[int]:
    return {int(view.positions[layer, head, c]) for c in keep[layer, head]}


def row_set(keep: np.ndarray, layer: int, head: int) -> set[int]:
    return {int(c) for c in keep[layer, head]}


# ---------------------------------------------------------------- the same checks for every policy


def test_the_shared_list_holds_every_registered_policy():
    """A policy added to the registry goes through the checks below too (docs/architecture.md, "Adding a method")."""
    assert {p.name for p in ALL_POLICIES} == set(POLICIES)


@pytest.mark.parametrize("policy", ALL_POLICIES, ids=policy_id)
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("with_scores", [True, False], ids=["scores", "no-scores"])
def test_contract_on_random_pots(policy: Policy, seed: int, with_scores: bool):
    rng = np.random.default_rng(seed)
    least = max(min_budget(policy, chunk=16), 40)
    n_cells = int(rng.integers(least + 10, least + 161))
    budget = int(rng.integers(least, n_cells))
    view = random_view(rng, n_cells, with_scores=with_scores)
    policy, kept = ready(policy, budget, 16, expected=4 * n_cells)
    assert isinstance(policy.before_chunk(16), TapRequest)
    policy.after_chunk(view)
    keep = policy.select(view, kept)
    if isinstance(policy, FullAttention):
        assert keep is None
        return
    check_keep(keep, n_cells, kept, at_most=folds(policy))
    # per (layer, head) really: the kept stream positions differ between heads of a random pot
    assert kept_positions(view, keep, 0, 0) != kept_positions(view, keep, 0, 1)
    policy.after_compaction(keep)


@pytest.mark.parametrize("policy", ALL_POLICIES, ids=policy_id)
@pytest.mark.parametrize("extra", [0, -1, -7])
def test_nothing_to_do_when_the_pot_fits(policy: Policy, extra: int):
    rng = np.random.default_rng(11)
    budget = max(60, min_budget(policy, chunk=16))
    view = random_view(rng, budget + extra)
    policy, _ = ready(policy, budget, 16, expected=4 * budget)
    policy.after_chunk(view)
    # the engine asks wants_compaction before select: a pot that fits is never compacted
    assert not policy.wants_compaction(view.n_cells, budget, 0)
    if not isinstance(policy, InfiniPot):  # InfiniPot's select distills whatever full pot it is handed
        assert policy.select(view, budget) is None


@pytest.mark.parametrize("policy", ALL_POLICIES, ids=policy_id)
def test_before_chunk_asks_for_a_tap_request(policy: Policy):
    policy, _ = ready(policy, 512, 128, expected=4096)
    req = policy.before_chunk(128)
    assert isinstance(req, TapRequest)
    assert req.tap_last >= -1


@pytest.mark.parametrize("policy", EVICTING, ids=policy_id)
def test_engine_loop_stays_within_budget(policy: Policy):
    """Chunks of new tokens appended to the pot, compacted whenever over budget, as the engine does."""
    rng = np.random.default_rng(5)
    chunk = 20
    budget = max(48, min_budget(policy, chunk))
    steps = 8 + 2 * budget // chunk  # several compactions whatever the budget
    positions = np.zeros((L, H, 0), dtype=np.int64)
    seen = 0
    policy, _ = ready(policy, budget, chunk, expected=steps * chunk)
    for step in range(steps):
        req = policy.before_chunk(chunk)
        new = np.broadcast_to(np.arange(seen, seen + chunk), (L, H, chunk))
        positions = np.concatenate([positions, new], axis=-1)
        seen += chunk
        n = positions.shape[-1]
        scores = rng.random((L, H, n), dtype=np.float32) if req.tap_last != 0 else None
        heads = rng.random((L, H, chunk), dtype=np.float32) if req.head_scores else None
        view = PotView(n_layer=L, n_head_kv=H, n_cells=n, positions=positions, scores=scores, logprobs=None,
                       chunk_positions=np.arange(seen - chunk, seen), tokens_seen=seen, head_scores=heads)
        policy.after_chunk(view)
        kept = policy.budget_at(step, budget)
        keep = policy.select(view, kept) if policy.wants_compaction(n, kept, 0) else None
        if keep is not None:
            check_keep(keep, n, kept, at_most=folds(policy))
            positions = np.take_along_axis(positions, keep, axis=-1)
            policy.after_compaction(keep)
    # EdgeInfinite folds whole segments and InfiniPot distills a full pot to |C|: at most the budget
    exact = not (folds(policy) or isinstance(policy, InfiniPot))
    assert positions.shape[-1] == budget if exact else 1 <= positions.shape[-1] <= budget
    # every policy keeps the newest token, except H2O with the whole budget given to heavy hitters
    # and Locret without stabilizers (its scores alone decide; here they are all equal), and InfiniPot, whose
    # CaP and NuC scores alone rank the cells past its sinks (no recent window)
    if not (isinstance(policy, H2O) and round(budget * policy.heavy_ratio) == budget) and \
            not (isinstance(policy, Locret) and policy.n_s == 0) and not isinstance(policy, InfiniPot):
        assert np.all(positions.max(axis=-1) == seen - 1)


# ---------------------------------------------------------------- Truncate


def test_truncate_hand_example():
    # cell:       0  1  2  3  4  5
    positions = [[[5, 0, 3, 9, 1, 7]]]
    keep = Truncate().select(view_of(positions), 3)
    # head: budget // 2 = 1 smallest position (0 -> cell 1); tail: 2 largest (9 -> cell 3, 7 -> cell 5)
    assert keep.tolist() == [[[1, 3, 5]]]
    keep = Truncate().select(view_of(positions), 4)
    assert keep.tolist() == [[[1, 3, 4, 5]]]


@pytest.mark.parametrize("seed", range(5))
def test_truncate_matches_head_and_tail_per_head(seed: int):
    rng = np.random.default_rng(100 + seed)
    view = random_view(rng, int(rng.integers(50, 201)))
    budget = int(rng.integers(1, view.n_cells))
    keep = Truncate().select(view, budget)
    check_keep(keep, view.n_cells, budget)
    for layer in range(L):
        for head in range(H):
            pos = [int(p) for p in view.positions[layer, head]]
            by_position = sorted(range(len(pos)), key=lambda c: pos[c])
            n_head = budget // 2
            expected = set(by_position[:n_head]) | set(by_position[len(pos) - (budget - n_head):])
            assert row_set(keep, layer, head) == expected


# ---------------------------------------------------------------- StreamingLLM


def test_streaming_hand_example():
    positions = [[[40, 2, 0, 33, 1, 50, 3, 41, 20]]]
    keep = StreamingLLM(n_sink=2).select(view_of(positions), 5)
    # sinks: positions 0, 1 (cells 2, 4); recent: 50, 41, 40 (cells 5, 7, 0)
    assert keep.tolist() == [[[0, 2, 4, 5, 7]]]


@pytest.mark.parametrize("n_sink", [0, 4, 10])
@pytest.mark.parametrize("seed", range(3))
def test_streaming_keeps_sinks_and_recent_per_head(n_sink: int, seed: int):
    rng = np.random.default_rng(200 + seed)
    view = random_view(rng, int(rng.integers(50, 201)))
    budget = int(rng.integers(n_sink + 1, view.n_cells))
    keep = StreamingLLM(n_sink=n_sink).select(view, budget)
    check_keep(keep, view.n_cells, budget)
    for layer in range(L):
        for head in range(H):
            ranked = sorted(int(p) for p in view.positions[layer, head])
            expected = set(ranked[:n_sink]) | set(ranked[len(ranked) - (budget - n_sink):])
            assert kept_positions(view, keep, layer, head) == expected


def test_streaming_refuses_bad_parameters():
    with pytest.raises(KvpotError, match="n_sink"):
        StreamingLLM(n_sink=-1)
    view = random_view(np.random.default_rng(0), 60)
    with pytest.raises(ValueError, match="budget"):
        StreamingLLM(n_sink=4).select(view, 4)
    with pytest.raises(KvpotError):  # the same refusal reaches the CLI as one line
        StreamingLLM(n_sink=8).select(view, 3)


# ---------------------------------------------------------------- SnapKV


def avg_pool1d_reference(x: list[float], kernel: int) -> list[float]:
    """torch.nn.functional.avg_pool1d(x, kernel, stride=1, padding=kernel // 2), count_include_pad=True."""
    pad = kernel // 2
    padded = [0.0] * pad + list(x) + [0.0] * pad
    out = []
    for i in range(len(padded) - kernel + 1):
        total = 0.0
        for k in range(kernel):
            total += padded[i + k]
        out.append(total / kernel)
    return out


def max_pool1d_reference(x: list[float], kernel: int) -> list[float]:
    """torch.nn.functional.max_pool1d(x, kernel, stride=1, padding=kernel // 2): padding is -inf."""
    pad = kernel // 2
    out = []
    for i in range(len(x)):
        best = -float("inf")
        for j in range(i - pad, i + pad + 1):
            if 0 <= j < len(x) and x[j] > best:
                best = x[j]
        out.append(best)
    return out


def test_pool1d_known_values():
    x = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    # torch: avg_pool1d(..., 3, 1, 1) -> [1, 2, 3, 4, 3]; the edges divide the zero padding in too
    np.testing.assert_allclose(pool1d(x, 3, "avgpool"), [1.0, 2.0, 3.0, 4.0, 3.0])
    np.testing.assert_allclose(pool1d(x, 5, "avgpool"), [6 / 5, 10 / 5, 15 / 5, 14 / 5, 12 / 5])
    np.testing.assert_allclose(pool1d(np.array([1.0, 3.0, 2.0, 5.0, 4.0]), 3, "maxpool"), [3, 3, 5, 5, 5])
    np.testing.assert_allclose(pool1d(np.array([-1.0, -3.0, -2.0]), 3, "maxpool"), [-1, -1, -2])
    np.testing.assert_allclose(pool1d(x, 1, "avgpool"), x)


@pytest.mark.parametrize("kernel", [1, 3, 5, 7])
@pytest.mark.parametrize("pooling", ["avgpool", "maxpool"])
def test_pool1d_matches_loop_reference(kernel: int, pooling: str):
    rng = np.random.default_rng(kernel)
    x = rng.random((2, 3, 37))
    got = pool1d(x, kernel, pooling)
    ref = avg_pool1d_reference if pooling == "avgpool" else max_pool1d_reference
    for i in range(2):
        for j in range(3):
            np.testing.assert_allclose(got[i, j], ref(list(x[i, j]), kernel), rtol=1e-12)


def snapkv_reference(view: PotView, budget: int, window: int, kernel: int, pooling: str) -> list[list[set[int]]]:
    """Kept cell sets per (layer, head), straight from the paper: vote, pool the prefix in stream order, top-k."""
    pool = avg_pool1d_reference if pooling == "avgpool" else max_pool1d_reference
    result = []
    for layer in range(view.n_layer):
        row = []
        for head in range(view.n_head_kv):
            pos = [int(p) for p in view.positions[layer, head]]
            in_order = sorted(range(len(pos)), key=lambda c: pos[c])
            prefix, observation = in_order[:-window], in_order[-window:]
            votes = [float(view.scores[layer, head, c]) for c in prefix]
            pooled = pool(votes, kernel)
            best = sorted(range(len(prefix)), key=lambda i: -pooled[i])[: budget - window]
            row.append({prefix[i] for i in best} | set(observation))
        result.append(row)
    return result


@pytest.mark.parametrize("policy", [SnapKV(), SnapKV(window=8, kernel=7), SnapKV(window=16, kernel=3, pooling="maxpool"),
                                    SnapKV(window=4, kernel=1)], ids=policy_id)
@pytest.mark.parametrize("seed", range(4))
def test_snapkv_matches_reference(policy: SnapKV, seed: int):
    rng = np.random.default_rng(300 + seed)
    view = random_view(rng, int(rng.integers(50, 201)))
    budget = int(rng.integers(policy.window + 1, view.n_cells))
    keep = policy.select(view, budget)
    check_keep(keep, view.n_cells, budget)
    expected = snapkv_reference(view, budget, policy.window, policy.kernel, policy.pooling)
    for layer in range(L):
        for head in range(H):
            assert row_set(keep, layer, head) == expected[layer][head]


def test_snapkv_pooling_prefers_clusters_in_stream_order():
    # stream order: a lone spike at position 2, a cluster around position 6, then a window of 2
    votes = [0.0, 0.0, 10.0, 0.0, 0.0, 4.0, 4.0, 4.0, 0.0, 0.0, 0.0, 0.0]
    n = len(votes)
    cells = np.random.default_rng(1).permutation(n)  # cell cells[i] holds stream position i
    positions = np.empty(n, dtype=np.int64)
    scores = np.empty(n)
    positions[cells] = np.arange(n)
    scores[cells] = votes
    view = view_of(positions[None, None], scores[None, None])
    keep = SnapKV(window=2, kernel=3).select(view, 3)
    # avgpool over the prefix: spike -> 10/3, cluster centre -> 12/3: the cluster wins; window = positions 10, 11
    assert sorted(int(view.positions[0, 0, c]) for c in keep[0, 0]) == [6, 10, 11]
    # without pooling the spike would win
    keep = SnapKV(window=2, kernel=1).select(view, 3)
    assert sorted(int(view.positions[0, 0, c]) for c in keep[0, 0]) == [2, 10, 11]


def test_snapkv_without_taps_keeps_the_most_recent():
    rng = np.random.default_rng(7)
    view = random_view(rng, 120, with_scores=False)
    keep = SnapKV().select(view, 50)
    check_keep(keep, 120, 50)
    for layer in range(L):
        for head in range(H):
            ranked = sorted(int(p) for p in view.positions[layer, head])
            assert kept_positions(view, keep, layer, head) == set(ranked[-50:])


def test_snapkv_taps_the_observation_window():
    assert SnapKV().before_chunk(512) == TapRequest(tap_last=32)
    assert SnapKV(window=16).before_chunk(8) == TapRequest(tap_last=16)


def test_snapkv_refuses_bad_parameters():
    for kwargs in ({"kernel": 4}, {"kernel": 0}, {"pooling": "minpool"}, {"window": 0}):
        with pytest.raises(KvpotError):
            SnapKV(**kwargs)
    view = random_view(np.random.default_rng(0), 80)
    with pytest.raises(ValueError, match="window"):
        SnapKV(window=32).select(view, 32)


# ---------------------------------------------------------------- H2O


def h2o_reference(positions: np.ndarray, acc: np.ndarray, budget: int, heavy_ratio: float) -> list[list[set[int]]]:
    heavy = round(budget * heavy_ratio)
    result = []
    for layer in range(positions.shape[0]):
        row = []
        for head in range(positions.shape[1]):
            pos = [int(p) for p in positions[layer, head]]
            in_order = sorted(range(len(pos)), key=lambda c: pos[c])
            n_recent = budget - heavy
            recent = in_order[len(pos) - n_recent:]
            older = in_order[: len(pos) - n_recent]
            hitters = sorted(older, key=lambda c: -float(acc[layer, head, c]))[:heavy]
            row.append(set(recent) | set(hitters))
        result.append(row)
    return result


def test_h2o_hand_example():
    policy = H2O()
    positions = np.arange(6)[None, None]
    policy.after_chunk(view_of(positions, [[[5.0, 1.0, 3.0, 0.5, 0.2, 0.1]]]))
    # heavy = 2: cells 0 and 2 among the older 0..3; recent = 2: cells 4, 5
    assert policy.select(view_of(positions), 4).tolist() == [[[0, 2, 4, 5]]]
    # a second chunk (cells 6, 7 new, 4 and 5 now older): cell 1 totals 1 + 4.5 = 5.5 and joins cell 0 (5)
    # ahead of cell 2 (3); cells 4, 5 (0.2, 0.1) lose their place
    positions = np.arange(8)[None, None]
    policy.after_chunk(view_of(positions, [[[0.0, 4.5, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0]]]))
    assert policy.select(view_of(positions), 4).tolist() == [[[0, 1, 6, 7]]]


def test_h2o_accumulates_across_chunks_and_compaction():
    rng = np.random.default_rng(42)
    policy = H2O(heavy_ratio=0.4)
    assert policy.before_chunk(30) == TapRequest(tap_last=-1)

    # chunk 1: 30 cells
    pos1 = np.stack([np.stack([rng.permutation(30) for _ in range(H)]) for _ in range(L)])
    s1 = rng.random((L, H, 30), dtype=np.float32)
    policy.after_chunk(view_of(pos1, s1, tokens_seen=30))
    # chunk 2: 25 new cells appended (positions 30..54); every cell gets mass again
    pos2 = np.concatenate([pos1, np.broadcast_to(np.arange(30, 55), (L, H, 25))], axis=-1)
    s2 = rng.random((L, H, 55), dtype=np.float32)
    view2 = view_of(pos2, s2, tokens_seen=55)
    policy.after_chunk(view2)

    acc = np.zeros((L, H, 55))
    for layer in range(L):
        for head in range(H):
            for c in range(30):
                acc[layer, head, c] += float(s1[layer, head, c])
            for c in range(55):
                acc[layer, head, c] += float(s2[layer, head, c])
    keep = policy.select(view2, 20)
    check_keep(keep, 55, 20)
    expected = h2o_reference(pos2, acc, 20, 0.4)
    for layer in range(L):
        for head in range(H):
            assert row_set(keep, layer, head) == expected[layer][head]

    # compaction: kept cell keep[l, h, j] becomes cell j, its mass with it
    policy.after_compaction(keep)
    moved_pos = np.zeros((L, H, 20), dtype=np.int64)
    moved_acc = np.zeros((L, H, 20))
    for layer in range(L):
        for head in range(H):
            for j, c in enumerate(keep[layer, head]):
                moved_pos[layer, head, j] = pos2[layer, head, c]
                moved_acc[layer, head, j] = acc[layer, head, c]

    # chunk 3: 15 new cells, positions 55..69
    pos3 = np.concatenate([moved_pos, np.broadcast_to(np.arange(55, 70), (L, H, 15))], axis=-1)
    s3 = rng.random((L, H, 35), dtype=np.float32)
    view3 = view_of(pos3, s3, tokens_seen=70)
    policy.after_chunk(view3)
    acc3 = np.concatenate([moved_acc, np.zeros((L, H, 15))], axis=-1) + s3.astype(np.float64)
    keep3 = policy.select(view3, 20)
    check_keep(keep3, 35, 20)
    expected3 = h2o_reference(pos3, acc3, 20, 0.4)
    for layer in range(L):
        for head in range(H):
            assert row_set(keep3, layer, head) == expected3[layer][head]


def test_h2o_reset_forgets_the_accumulator():
    policy = H2O()
    positions = np.arange(6)[None, None]
    policy.after_chunk(view_of(positions, [[[9.0, 0.0, 0.0, 0.0, 0.0, 0.0]]]))
    assert 0 in policy.select(view_of(positions), 4)[0, 0]
    policy.reset()
    # no mass observed: the most recent cells only
    assert policy.select(view_of(positions), 4).tolist() == [[[2, 3, 4, 5]]]


def test_h2o_refuses_bad_parameters():
    for ratio in (-0.1, 1.5):
        with pytest.raises(KvpotError, match="heavy_ratio"):
            H2O(heavy_ratio=ratio)


# ---------------------------------------------------------------- registry


def test_registry_names():
    from kvpot.policies import IMDC, InfiniPot

    assert POLICIES == {"full": FullAttention, "truncate": Truncate, "streaming": StreamingLLM,
                        "snapkv": SnapKV, "h2o": H2O, "infinipot": InfiniPot, "imdc": IMDC, "locret": Locret,
                        "edgeinfinite": EdgeInfinite, "infllm": InfLLM}
    for name, cls in POLICIES.items():
        assert cls.name == name
        assert cls.__doc__ and len(cls.__doc__) > 40


@pytest.mark.parametrize(("spec", "expected"), [
    ("full", FullAttention()),
    ("truncate", Truncate()),
    ("snapkv", SnapKV()),
    ("snapkv:window=16,kernel=7", SnapKV(window=16, kernel=7)),
    (" snapkv : window = 16 , pooling = maxpool ", SnapKV(window=16, pooling="maxpool")),
    ("streaming:n_sink=8", StreamingLLM(n_sink=8)),
    ("h2o:heavy_ratio=0.25", H2O(heavy_ratio=0.25)),
    ("H2O", H2O()),
])
def test_make_policy_parses(spec: str, expected: Policy):
    got = make_policy(spec)
    assert type(got) is type(expected)
    assert got == expected


def test_make_policy_converts_to_the_field_type():
    p = make_policy("snapkv:window=16,kernel=7")
    assert type(p.window) is int and type(p.kernel) is int
    assert type(make_policy("h2o:heavy_ratio=1").heavy_ratio) is float


@pytest.mark.parametrize(("spec", "needles"), [
    ("lru", ["unknown policy 'lru'", "full, truncate, streaming, snapkv, h2o"]),
    ("snapkv:size=3", ["no parameter 'size'", "window, kernel, pooling"]),
    ("full:n_sink=3", ["no parameter 'n_sink'", "none"]),
    ("snapkv:window=abc", ["window", "int", "'abc'"]),
    ("snapkv:window=1.5", ["window", "int"]),
    ("h2o:heavy_ratio=lots", ["heavy_ratio", "float"]),
    ("snapkv:window", ["key=value"]),
    ("snapkv:window=8,window=9", ["twice"]),
    ("snapkv:kernel=4", ["kernel", "odd"]),
    ("streaming:n_sink=-2", ["n_sink"]),
    ("imdc", ["needs pruner"]),
    ("imdc:m_max=512", ["needs pruner"]),
    ("imdc:pruner=lru", ["pruner", "'lru'", "snapkv"]),
    ("imdc:pruner=imdc", ["pruner", "'imdc'"]),
    ("imdc:pruner=snapkv,m_0=lots", ["m_0", "int", "'lots'"]),
    ("imdc:pruner=h2o,function=adaptive", ["per-cell state", "h2o"]),
])
def test_make_policy_errors_are_one_clear_line(spec: str, needles: list[str]):
    with pytest.raises(KvpotError) as info:
        make_policy(spec)
    message = str(info.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, message
