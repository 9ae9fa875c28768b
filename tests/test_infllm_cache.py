"""InfLLM's block cache per layer (ggml_ext/kvpot-block-cache.*, the paper's appendix D): each eviction rule
against a Python model of it computed here, the frequency score's attention against NumPy on the query and
keys of the same lookup, per-layer hits + misses against the lookups the read made, and the read's logits
the same whichever rule evicts (the cache changes which reads come from the file, never what is fetched)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_infllm import make_engine
from test_infllm_lookup import BS, N_LOCAL, TOPK, block_cells, blocks_held

from kvpot.bench.logbook import logbook
from kvpot.errors import KvpotError
from kvpot.policies import make_policy
from kvpot.runtime.blocks import BlockStore, BlockStoreError

SHAPE = dict(n_layer=2, n_head_kv=1, d_k=32, d_v=32, block_size=2)


def small_store(path, n_blocks: int, size: int) -> BlockStore:
    store = BlockStore(path, **SHAPE, kv_type="f16", max_cached=size, create=True)
    z = np.zeros((2, 1, 2, 32), np.float32)
    for b in range(n_blocks):
        store.append(np.arange(2 * b, 2 * b + 2, dtype=np.int32), np.zeros((2, 1, 32), np.float32), z, z)
    return store


class ModelCache:
    """The rule as kvpot-block-cache.h states it: every cached block's s_b decays by d at each lookup and the
    blocks read gain their attention; then, while over size, the rule's first block leaves (freq: lowest
    s_b, then least recently used, then first loaded; lru: least recently used, then first loaded; fifo:
    first loaded)."""

    def __init__(self, rule: str, size: int, decay: float):
        self.rule, self.size, self.decay = rule, size, float(np.float32(decay))  # C takes the decay as a float
        self.held: dict[int, list] = {}  # block -> [score, loaded, used]
        self.hits = self.misses = self.n_loaded = self.n_lookups = 0

    def lookup(self, blocks, attention) -> None:
        for b in blocks:
            if b in self.held:
                self.hits += 1
                self.held[b][2] = self.n_lookups
            else:
                self.misses += 1
                self.held[b] = [0.0, self.n_loaded, self.n_lookups]
                self.n_loaded += 1
        for e in self.held.values():
            e[0] *= self.decay
        for b, a in zip(blocks, attention):
            self.held[b][0] += float(a)
        self.n_lookups += 1
        key = {"freq": lambda e: (e[0], e[2], e[1]), "lru": lambda e: (e[2], e[1]), "fifo": lambda e: (e[1],)}[self.rule]
        while len(self.held) > self.size:
            del self.held[min(self.held, key=lambda b: key(self.held[b]))]


def lookups(seed: int, n: int, n_blocks: int):
    """n lookups of 1-3 distinct blocks each, with attention in float32 (some zero: ties on the score)."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        blocks = rng.choice(n_blocks, size=int(rng.integers(1, 4)), replace=False).astype(np.int32)
        att = rng.uniform(0, 3, blocks.size).astype(np.float32) * (rng.random(blocks.size) > 0.2)
        yield blocks, att


@pytest.mark.parametrize("rule", ["freq", "lru", "fifo"])
def test_each_rule_evicts_the_block_its_python_model_evicts(tmp_path, rule):
    size, decay = 3, 0.1
    store = small_store(tmp_path / "s.kvblk", 8, size)
    store.set_cache(rule, decay)
    model = ModelCache(rule, size, decay)
    for blocks, att in lookups(1, 200, 8):
        store.cache_lookup(0, blocks, att)
        model.lookup(blocks.tolist(), att)
        got = store.cache(0)
        assert sorted(model.held) == got.blocks.tolist()
        want = np.array([model.held[b][0] for b in sorted(model.held)], np.float32)
        np.testing.assert_allclose(got.scores, want, rtol=1e-6, atol=0)
        assert (got.hits, got.misses) == (model.hits, model.misses)
    assert model.hits > 0 and model.misses > size  # hits, and evictions
    # layer 1 saw no lookup: each layer has its own cache
    other = store.cache(1)
    assert (other.hits, other.misses, other.blocks.size) == (0, 0, 0)
    store.close()


def test_the_rules_keep_different_blocks():
    """The sequence above tells the rules apart: a rule ignored would fail the test above."""
    models = {rule: ModelCache(rule, 3, 0.1) for rule in ("freq", "lru", "fifo")}
    kept = {rule: [] for rule in models}
    for blocks, att in lookups(1, 200, 8):
        for rule, m in models.items():
            m.lookup(blocks.tolist(), att)
            kept[rule].append(sorted(m.held))
    assert kept["freq"] != kept["lru"] != kept["fifo"] != kept["freq"]


def test_the_freq_rule_evicts_the_lowest_decayed_score(tmp_path):
    """Size 2, decay 0.1. Block 0 gets 5.0, then block 1 gets 0.1 (0: 0.5), then loading block 2 (1.0) leaves
    0: 0.05, 1: 0.01, 2: 1.0, and block 1 leaves, though block 0 is the least recently used (LRU's choice).
    Then block 3 (0.2): 0: 0.005, 2: 0.1, 3: 0.2, and block 0 leaves."""
    store = small_store(tmp_path / "s.kvblk", 4, 2)
    store.set_cache("freq", 0.1)
    store.cache_lookup(0, [0], [5.0])
    store.cache_lookup(0, [1], [0.1])
    store.cache_lookup(0, [2], [1.0])
    assert store.cache(0).blocks.tolist() == [0, 2]
    store.cache_lookup(0, [3], [0.2])
    got = store.cache(0)
    assert got.blocks.tolist() == [2, 3]
    np.testing.assert_allclose(got.scores, [0.1, 0.2], rtol=1e-6)
    store.close()


def test_random_rule_is_seeded_and_bounded(tmp_path):
    runs = []
    for name, seed in (("a", 7), ("b", 7), ("c", 8)):
        store = small_store(tmp_path / f"{name}.kvblk", 8, 3)
        store.set_cache("random", seed=seed)
        held = []
        for blocks, att in lookups(2, 100, 8):
            store.cache_lookup(0, blocks, att)
            held.append(store.cache(0).blocks.tolist())
            assert len(held[-1]) <= 3
        runs.append(held)
        store.close()
    assert runs[0] == runs[1] != runs[2]


def test_a_read_is_a_lookup_of_its_block_alone_with_no_attention(tmp_path):
    store = small_store(tmp_path / "s.kvblk", 8, 3)
    model = ModelCache("freq", 3, 0.1)  # a store opens with the paper's rule and decay
    for i, (blocks, att) in enumerate(lookups(3, 120, 8)):
        if i % 3 == 0:
            pos = store.read(0, int(blocks[0]))[0]
            assert pos.tolist() == [2 * int(blocks[0]), 2 * int(blocks[0]) + 1]
            model.lookup([int(blocks[0])], [0.0])
        else:
            store.cache_lookup(0, blocks, att)
            model.lookup(blocks.tolist(), att)
        got = store.cache(0)
        assert got.blocks.tolist() == sorted(model.held) and (got.hits, got.misses) == (model.hits, model.misses)
    store.close()


def test_bad_rules_and_decays_are_one_line_errors(tmp_path):
    store = small_store(tmp_path / "s.kvblk", 2, 2)
    with pytest.raises(BlockStoreError, match="cache rule 'lfu' is not one of freq, lru, fifo, random"):
        store.set_cache("lfu")
    with pytest.raises(BlockStoreError, match=r"cache decay 1\.5.* is not within 0\.\.1"):
        store.set_cache("freq", 1.5)
    with pytest.raises(BlockStoreError, match="block 5 of layer 0 is not in the store"):
        store.cache_lookup(0, [1, 5], [1.0, 1.0])
    assert store.cache(0).blocks.tolist() == [1]  # the lookup ended for the block it read
    store.close()
    with pytest.raises(KvpotError, match="infllm: cache must be one of freq, lru, fifo, random, got 'lfu'"):
        make_policy("infllm:cache=lfu")
    with pytest.raises(KvpotError, match="infllm: cache_decay must be within 0..1"):
        make_policy("infllm:cache_decay=2")


@pytest.fixture(scope="module")
def text_and_question():
    text, question, _ = logbook(n_entries=60, seed=4, fact_at=0.3)
    return text, question


def counting_lookups(eng) -> list[int]:
    """Wrap the engine's lookup_take: the list gets n_fetch for every lookup the graph made (a take that
    finds the layers fetched), the read's own count of blocks each layer asked for."""
    made: list[int] = []
    take = eng.pot.lookup_take

    def counted(n_fetch, block_size):
        got = take(n_fetch, block_size)
        if got is not None:
            made.append(n_fetch)
        return got

    eng.pot.lookup_take = counted
    return made


def test_per_layer_counts_are_the_lookups_and_the_logits_are_the_same_for_every_rule(smollm2_cut_path,
                                                                                       text_and_question, tmp_path):
    text, question = text_and_question
    logits = {}
    for rule in ("freq", "fifo", "random", "lru"):
        eng = make_engine(smollm2_cut_path, tmp_path, f"{rule}.kvblk")
        eng.policy.cache = rule
        made = counting_lookups(eng)
        eng.feed_text(text)
        stats = eng.policy.cache_stats()
        assert stats["rule"] == rule and stats["per_layer"] and stats["size"] == 2 * TOPK
        n_layer = eng.pot.n_layers
        assert len(stats["hits"]) == len(stats["misses"]) == n_layer
        assert len(made) > 10
        for layer in range(n_layer):
            assert stats["hits"][layer] + stats["misses"][layer] == sum(made), layer
            assert eng.policy._blocks.cache(layer).blocks.size <= 2 * TOPK
        if rule == "freq":
            assert sum(stats["hits"]) > 0  # the cache served reads
        logits[rule] = eng.next_logits(question)
        eng.close()
    for rule in ("fifo", "random", "lru"):
        np.testing.assert_array_equal(logits[rule], logits["freq"])


def test_the_score_a_lookup_adds_is_the_attention_numpy_computes(smollm2_cut_path, text_and_question, tmp_path):
    """After the caches are emptied, one decode looks each layer's blocks up once: each cached block's score
    is then the attention that lookup gave it, computed here from the same lookup's query (captured from
    the graph) and the stored keys: the mean query's softmax over the fetched tokens, per KV head, times
    the rows decoded, averaged over the heads."""
    text, question = text_and_question
    eng = make_engine(smollm2_cut_path, tmp_path)
    eng.feed_text(text)
    store = eng.policy._blocks
    cell0 = block_cells(eng)
    store.set_cache("freq", 0.1)
    pos0 = eng.pos_next
    eng.pot.query_request(True, N_LOCAL)
    eng.next_logits(question)
    queries = eng.pot.query_take(eng.facts.head_dim_k)  # [L, H, d_k]: rows and query heads summed
    eng.pot.query_request(False)
    n_rows = eng.pos_next - pos0
    assert n_rows <= eng.policy._p("exc_block_size")  # one ubatch: one lookup per layer
    n_group = eng.facts.n_head // eng.facts.n_head_kv
    held = [store.cache(layer) for layer in range(eng.pot.n_layers)]  # before the reads below, lookups too
    chosen = blocks_held(eng, store, cell0)
    for layer in range(eng.pot.n_layers):
        keys = np.stack([store.read(layer, int(b))[2] for b in chosen[layer]], axis=1)  # [H, TOPK, BS, d_k]
        H = keys.shape[0]
        q = queries[layer].astype(np.float64) / (n_rows * n_group)
        logit = np.einsum("hd,hbtd->hbt", q, keys.astype(np.float64)) / math.sqrt(eng.facts.head_dim_k)
        p = np.exp(logit - logit.max(axis=(1, 2), keepdims=True))
        p /= p.sum(axis=(1, 2), keepdims=True)
        want = p.sum(axis=2).mean(axis=0) * n_rows  # [TOPK]
        got = held[layer]
        assert got.blocks.tolist() == sorted(chosen[layer].tolist())
        np.testing.assert_allclose(got.scores, want[np.argsort(chosen[layer])], rtol=1e-4)
        assert got.scores.sum() == pytest.approx(n_rows, rel=1e-5) and H == eng.pot.n_head_kv
    assert BS == store.shape[4]
    eng.close()
