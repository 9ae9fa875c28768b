// InfLLM's block memory: evicted K/V in blocks of block_size tokens with one representative key per
// KV head, kept in a file (docs/formats.md, "InfLLM block store") that lookups read through a cache per
// layer (kvpot-block-cache.h: the paper's frequency score, or LRU, FIFO, random). K and V are stored as f16, q8_0 or q4_0 each (ggml's row formats: the store is the
// largest thing kvpot writes, ~28 KB per token on a 28-layer model in f16; keys and values may differ,
// as keys with a few large channels need a finer format than values); representatives stay f32.
// Plain C++, ggml's row conversions and POSIX, no llama.cpp types: kvpot-api-blocks.cpp wraps it.
#pragma once

#include "kvpot-block-cache.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

struct kvpot_blocks_shape {
    uint32_t n_layer    = 0; // pot layers
    uint32_t n_head_kv  = 0;
    uint32_t d_k        = 0;
    uint32_t d_v        = 0;
    uint32_t block_size = 0; // tokens per block
    uint32_t k_type     = 1; // ggml_type of stored K rows: GGML_TYPE_F16 (1), Q8_0 (8) or Q4_0 (2)
    uint32_t v_type     = 1; // ggml_type of stored V rows, the same three
};

class kvpot_block_store {
public:
    static constexpr char     MAGIC[8]     = {'K', 'V', 'P', 'O', 'T', 'B', 'L', 'K'};
    // version 2 added one row-format field for K and V, version 3 a second one for V; a version-1 file
    // (K/V in f16) and a version-2 file (K and V in one format) still open
    static constexpr uint32_t VERSION      = 3;
    static constexpr uint32_t HEADER_BYTES = 64;
    // blocks scored per pass of topk: the representatives are read in parts of this many blocks, so
    // scoring a store of any size needs O(part) memory (see docs/formats.md)
    static constexpr uint32_t SCORE_PART   = 1024;

    ~kvpot_block_store();

    // create a new store (the path must not exist: O_EXCL) or open one; on failure returns nullptr and
    // sets why. Opening checks the magic, version, header size, shape (a shape field of 0 takes the
    // file's, the row formats included; every size bounded so none overflows) and that the file holds whole blocks, so a
    // truncated or foreign file is refused before any block is read. A store the process may not write
    // (read-only: a saved context references it) opens for reading only.
    // max_cached: the blocks each layer's cache holds after a lookup
    static kvpot_block_store * open(const std::string & path, kvpot_blocks_shape shape, uint32_t max_cached,
                                    bool create, std::string & why);

    const kvpot_blocks_shape & shape() const { return shp; }
    uint32_t n_blocks() const { return nblk; }
    uint32_t max_cached() const { return cfg.size; }
    uint64_t record_bytes() const { return rec; }
    uint64_t file_bytes() const { return HEADER_BYTES + (uint64_t) nblk*shp.n_layer*rec; }
    // over every layer's cache
    size_t   n_cached() const;
    uint64_t hits() const;
    uint64_t misses() const;

    // append one block to every layer (the same tokens leave the local window of every layer):
    // pos [block_size], repr [n_layer][n_head_kv][d_k], k [n_layer][n_head_kv][block_size][d_k],
    // v [n_layer][n_head_kv][block_size][d_v]; returns the block's index, or "" / why in `why`
    int64_t append(const int32_t * pos, const float * repr, const float * k, const float * v, std::string & why);

    // the caches' rule, decay d (0..1) and random seed; empties every layer's cache and its counts
    bool set_cache(kvpot_cache_rule rule, double decay, uint64_t seed, std::string & why);
    const kvpot_cache_config & cache_config() const { return cfg; }
    const kvpot_block_cache & cache(uint32_t layer) const { return caches[layer]; }

    // a lookup of a layer's blocks: record() each block through the layer's cache, decode it, then settle()
    // with the attention each received (the cache's frequency score). A record stays valid until settle
    const uint8_t * record(uint32_t layer, uint32_t block, std::string & why);
    void settle(uint32_t layer, const uint32_t * blocks, const float * attention, size_t n);

    // a block of a layer: a lookup of it alone through the layer's cache, the block receiving no attention
    bool read(uint32_t layer, uint32_t block, int32_t * pos, float * repr, float * k, float * v, std::string & why);

    // a record's fields in f32; any output may be NULL. Head h's keys go to k + h * k_head_stride (floats),
    // its values to v + h * v_head_stride, so a lookup decodes blocks straight into its cells' layout
    void decode(const uint8_t * record, int32_t * pos, float * repr, float * k, size_t k_head_stride, float * v,
                size_t v_head_stride) const;

    // relevance of every block of a layer to the query q [n_head_kv][d_k] (query heads of a KV group
    // summed): sum over heads of q_h . repr_h; the top k block indices, best first (ties: lower index)
    bool topk(uint32_t layer, const float * q, uint32_t k, int32_t * out, float * scores, std::string & why);

    // show only the first n blocks (a reopened context's); the file is never cut, and append refuses
    // from then on while the file holds more
    bool limit(uint32_t n, std::string & why);

    // flush written blocks to the disk (before a saved context references the store)
    bool sync(std::string & why);

private:
    kvpot_block_store() = default;
    uint64_t offset(uint32_t layer, uint32_t block) const {
        return HEADER_BYTES + ((uint64_t) block*shp.n_layer + layer)*rec;
    }

    bool check_block(uint32_t layer, uint32_t block, std::string & why) const;
    bool read_record(uint32_t layer, uint32_t block, uint8_t * dst, std::string & why) const;

    std::string        path;
    int                fd   = -1;
    kvpot_blocks_shape shp;
    uint64_t           rec  = 0;
    uint32_t           nblk = 0;
    bool               writable = true;

    kvpot_cache_config             cfg;
    std::vector<kvpot_block_cache> caches; // [n_layer]
    std::mt19937_64                rng;    // the random rule's
};
