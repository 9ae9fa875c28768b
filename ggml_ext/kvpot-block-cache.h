// InfLLM's cache of stored blocks, one per pot layer, as the paper's appendix D has it: a cache of
// fixed size per layer (the paper's default: twice the blocks one lookup loads), its blocks ranked by
// a frequency score. An entry is a block's record as the file holds it (the store's row formats, not
// f32): a hit saves the read from the file, as the paper's hit saves the copy from CPU to GPU memory,
// and the cache costs RAM in the stored format.
//
// The frequency score (appendix D, eq. 1): after every lookup of a layer,
//     s_b <- s_b * d + sum over the lookup's queries j and the block's tokens i of attention(q_j, k_i)
// for every block b in that layer's cache; a cached block the lookup did not load received no attention,
// so its score only decays. d is the decay (the paper's 0.1). Then, while the cache holds more than its
// size, the block with the lowest score leaves (ties: the least recently used, then the first loaded).
// A new block's score starts at 0, so it gets the attention of the lookup that loaded it before any
// block leaves. LRU, FIFO and random are the paper's comparison rules (its Figure 4).
//
// Plain C++, no ggml or llama.cpp types; one object per layer, all its changes through get and settle.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

// how a full cache picks the block that leaves; the values are kvpot.h's KVPOT_CACHE_*
enum kvpot_cache_rule : int32_t {
    KVPOT_CACHE_RULE_FREQ   = 0, // lowest frequency score (above)
    KVPOT_CACHE_RULE_LRU    = 1, // least recently used
    KVPOT_CACHE_RULE_FIFO   = 2, // first loaded
    KVPOT_CACHE_RULE_RANDOM = 3, // uniformly at random
};

struct kvpot_cache_config {
    kvpot_cache_rule rule  = KVPOT_CACHE_RULE_FREQ;
    double           decay = 0.1; // d
    uint32_t         size  = 1;   // blocks a layer's cache holds after each lookup
};

class kvpot_block_cache {
public:
    struct entry {
        uint32_t             block  = 0;
        double               score  = 0.0; // s_b
        uint64_t             loaded = 0;   // order of loading (FIFO)
        uint64_t             used   = 0;   // last lookup that read it (LRU)
        std::vector<uint8_t> rec;          // the block's record, as in the file
    };

    // the record of `block`, `bytes` long: a hit (counted) returns the cached one; a miss (counted) makes
    // an entry and fills it with load(buffer), returning nullptr and keeping no entry when load fails.
    // Entries are only dropped by settle, so every pointer returned since the last settle stays valid
    const uint8_t * get(uint32_t block, size_t bytes, const std::function<bool(uint8_t *)> & load);

    // the end of a lookup that read blocks [n] through get: every score decays, block i gains attention[i],
    // and blocks leave by the rule until at most cfg.size remain
    void settle(const uint32_t * blocks, const float * attention, size_t n, const kvpot_cache_config & cfg,
                std::mt19937_64 & rng);

    // forget the blocks from n_blocks on (a store shown shorter), or every block and the counts (clear)
    void drop_from(uint32_t n_blocks);
    void clear();

    const std::vector<entry> & entries() const { return items; }
    uint64_t hits   = 0;
    uint64_t misses = 0;

private:
    size_t victim(const kvpot_cache_config & cfg, std::mt19937_64 & rng) const;
    void   erase(size_t i);

    std::vector<entry>                items;
    std::vector<std::vector<uint8_t>> spare;      // buffers of entries that left, reused by later misses
    uint64_t                          n_loaded = 0;
    uint64_t                          n_lookups = 0;
};
