// InfLLM's block memory: evicted K/V in blocks of block_size tokens with one representative key per
// KV head, kept in a file (docs/formats.md, "InfLLM block store") with a bounded in-RAM LRU cache of
// decoded blocks. K and V are stored as f16, q8_0 or q4_0 each (ggml's row formats: the store is the
// largest thing kvpot writes, ~28 KB per token on a 28-layer model in f16; keys and values may differ,
// as keys with a few large channels need a finer format than values); representatives stay f32.
// Plain C++, ggml's row conversions and POSIX, no llama.cpp types: kvpot-api-blocks.cpp wraps it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
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

// one block of one layer, decoded to f32
struct kvpot_block_data {
    std::vector<int32_t> pos;  // [block_size] stream position of each token
    std::vector<float>   repr; // [n_head_kv][d_k]
    std::vector<float>   k;    // [n_head_kv][block_size][d_k]
    std::vector<float>   v;    // [n_head_kv][block_size][d_v]
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
    static kvpot_block_store * open(const std::string & path, kvpot_blocks_shape shape, uint32_t max_cached,
                                    bool create, std::string & why);

    const kvpot_blocks_shape & shape() const { return shp; }
    uint32_t n_blocks() const { return nblk; }
    uint32_t max_cached() const { return cap; }
    size_t   n_cached() const { return lru.size(); }
    uint64_t record_bytes() const { return rec; }
    uint64_t file_bytes() const { return HEADER_BYTES + (uint64_t) nblk*shp.n_layer*rec; }
    uint64_t hits = 0, misses = 0;

    // append one block to every layer (the same tokens leave the local window of every layer):
    // pos [block_size], repr [n_layer][n_head_kv][d_k], k [n_layer][n_head_kv][block_size][d_k],
    // v [n_layer][n_head_kv][block_size][d_v]; returns the block's index, or "" / why in `why`
    int64_t append(const int32_t * pos, const float * repr, const float * k, const float * v, std::string & why);

    // a block of a layer, through the LRU cache (at most max_cached decoded blocks in RAM)
    const kvpot_block_data * get(uint32_t layer, uint32_t block, std::string & why);

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

    std::string        path;
    int                fd   = -1;
    kvpot_blocks_shape shp;
    uint64_t           rec  = 0;
    uint32_t           nblk = 0;
    uint32_t           cap  = 0;
    bool               writable = true;
    std::vector<uint8_t> scratch; // one record, read with pread (the store is never mapped)

    // LRU of decoded blocks, key = layer * 2^32 + block
    std::list<uint64_t> order; // most recent first
    struct entry { kvpot_block_data data; std::list<uint64_t>::iterator it; };
    std::unordered_map<uint64_t, entry> lru;
};
