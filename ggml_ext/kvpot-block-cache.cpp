// InfLLM's per-layer block cache: lookups, the frequency score and the eviction rules (see kvpot-block-cache.h)
#include "kvpot-block-cache.h"

#include <algorithm>
#include <utility>

const uint8_t * kvpot_block_cache::get(uint32_t block, size_t bytes, const std::function<bool(uint8_t *)> & load) {
    for (entry & e : items) {
        if (e.block == block) {
            hits++;
            e.used = n_lookups;
            return e.rec.data();
        }
    }
    misses++;
    entry e;
    e.block  = block;
    e.loaded = n_loaded++;
    e.used   = n_lookups;
    if (!spare.empty()) {
        e.rec = std::move(spare.back());
        spare.pop_back();
    }
    e.rec.resize(bytes);
    if (!load(e.rec.data())) {
        spare.push_back(std::move(e.rec));
        return nullptr;
    }
    items.push_back(std::move(e));
    return items.back().rec.data();
}

void kvpot_block_cache::settle(const uint32_t * blocks, const float * attention, size_t n, const kvpot_cache_config & cfg,
                               std::mt19937_64 & rng) {
    for (entry & e : items) {
        e.score *= cfg.decay; // s_b * d: a block this lookup did not load received no attention
    }
    for (size_t i = 0; i < n; ++i) {
        for (entry & e : items) {
            if (e.block == blocks[i]) {
                e.score += attention ? (double) attention[i] : 0.0;
                break;
            }
        }
    }
    n_lookups++;
    while (items.size() > cfg.size) {
        erase(victim(cfg, rng));
    }
}

size_t kvpot_block_cache::victim(const kvpot_cache_config & cfg, std::mt19937_64 & rng) const {
    if (cfg.rule == KVPOT_CACHE_RULE_RANDOM) {
        return (size_t) (rng() % items.size());
    }
    // the first of the order each rule sets; the order's last key is the loading order, so no two tie
    auto before = [&](const entry & a, const entry & b) {
        switch (cfg.rule) {
            case KVPOT_CACHE_RULE_FREQ:
                if (a.score != b.score) { return a.score < b.score; }
                [[fallthrough]];
            case KVPOT_CACHE_RULE_LRU:
                if (a.used != b.used) { return a.used < b.used; }
                [[fallthrough]];
            default:
                return a.loaded < b.loaded;
        }
    };
    size_t best = 0;
    for (size_t i = 1; i < items.size(); ++i) {
        if (before(items[i], items[best])) {
            best = i;
        }
    }
    return best;
}

void kvpot_block_cache::erase(size_t i) {
    spare.push_back(std::move(items[i].rec));
    items[i] = std::move(items.back());
    items.pop_back();
}

void kvpot_block_cache::drop_from(uint32_t n_blocks) {
    for (size_t i = items.size(); i-- > 0;) {
        if (items[i].block >= n_blocks) {
            erase(i);
        }
    }
}

void kvpot_block_cache::clear() {
    items.clear();
    spare.clear();
    hits = misses = 0;
    n_loaded = n_lookups = 0;
}
