// InfLLM's lookup inside the layer: while set, every ubatch graph scores the block store's blocks of
// each pot layer against that ubatch's own queries, fetches the top ones and writes their K/V into
// reserved cells of the layer's cache before the layer's attention reads it (docs/pot.md, "InfLLM's
// block memory"). The Python side reserves the cells (kvpot_pot_insert) and sets the range.
#pragma once

#include "kvpot-distance.h"
#include "kvpot-state.h"
#include "llama.h"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

struct ggml_context;
struct ggml_cgraph;
struct ggml_tensor;
struct llama_context;
struct llama_ubatch;
class  llama_kv_cache;
class  llm_graph_result;
class  kvpot_block_store;

struct kvpot_lookup;

// what one pot layer's fetch did in the last graph (the custom op's userdata)
struct kvpot_lookup_layer {
    kvpot_lookup *       owner = nullptr;
    uint32_t             layer = 0;   // pot layer = layer of the block store
    std::vector<int32_t> chosen;      // blocks fetched, ascending
    std::vector<int32_t> pos;         // stream positions of their tokens, in cell order
    bool                 fresh = false; // fetched since the last take
    // of the graph being built, for the attention the fetched blocks receive (the cache's frequency score)
    int32_t              n_rows   = 0;    // the ubatch's queries
    int32_t              n_group  = 1;    // query heads per KV head
    float                kq_scale = 1.0f; // the scale the layer's attention applies to Q·K
};

struct kvpot_lookup {
    std::shared_ptr<kvpot_block_store> store;
    int32_t   cell0   = 0; // first reserved cell
    int32_t   n_fetch = 0; // blocks per layer written there: cells [cell0, cell0 + n_fetch * block_size)
    int32_t   n_local = 0; // queries are scored at RoPE angle n_local, keys placed n_local before the ubatch
    int32_t   n_head_kv = 0; // KV heads of every pot layer (rows of the state's rope_pos per layer)
    llama_pos angle   = 0; // RoPE angle of the fetched keys in the last graph built
    bool      built   = false; // the graph being computed fetches (its keys sit at `angle` once it ran)
    bool      hold    = false; // graphs do not fetch: the cells keep the last fetch (kvpot_lookup_hold)
    std::vector<kvpot_lookup_layer> layers;
    std::string error;     // first fetch failure since the last take ("" if none)
};

// in the attention hook of pot layer ipot (model layer il), before the attention: qsum [1, d_k, n_head_kv]
// (the ubatch's queries rotated to n_local and summed, query heads per KV group) chooses the blocks;
// their keys, rotated from RoPE 0 to max(0, pos0 - n_local), and values go into the reserved cells
// n_rows queries of n_group query heads per KV head summed in qsum, kq_scale the attention's scale of Q·K
void kvpot_lookup_build(ggml_context * ctx0, ggml_cgraph * gf, llm_graph_result * res, const llama_context * lctx,
                        llama_kv_cache & kv, const std::shared_ptr<kvpot_lookup> & lk, ggml_tensor * qsum,
                        int32_t ipot, int32_t il, llama_pos pos0, int32_t n_rows, int32_t n_group, float kq_scale);

// a context's InfLLM state. The lookup query (kvpot_query_request): per pot layer, the ubatch queries
// rotated to position q_angle, summed over rows and over the query heads of each KV group, accumulated
// until taken (kvpot_query_take). The lookup (set after the cells are reserved) and the memory cells'
// distance (kvpot_distance_set) name cells: anything that moves cells drops them
struct kvpot_infllm_state : kvpot_method_state {
    bool                                           q_on    = false;
    llama_pos                                      q_angle = 0;
    std::vector<std::vector<float>>                q_acc;     // [n_pot_layer][n_head_kv * d_k]
    std::vector<std::pair<int32_t, ggml_tensor *>> pending_q; // (pot layer, [1, d_k, n_head_kv])
    std::shared_ptr<kvpot_lookup>                  lookup;
    kvpot_distance                                 distance;

    bool active() const override { return q_on || lookup != nullptr || distance.n_cells > 0; }
    void cells_moved() override {
        lookup.reset();
        distance = {};
    }
    void clear_pending() override { pending_q.clear(); }
    bool has_pending() const override { return !pending_q.empty(); }
    // the fetched keys' RoPE angle into the state's rope_pos; the lookup queries into q_acc
    void computed(kvpot_state & st) override;
};

// in the attention hook of pot layer ipot (model layer il), before anything reads the cache: the
// lookup's fetch into its reserved cells, and the lookup query (kvpot_query_request) as a graph output;
// q [d, n_head, n_tokens] the layer's queries after RoPE, kq_scale the attention's scale of Q·K
void kvpot_infllm_attn(kvpot_state & st, ggml_context * ctx0, ggml_cgraph * gf, llm_graph_result * res,
                       const llama_context * lctx, llama_kv_cache & kv, const llama_ubatch & ub, ggml_tensor * q,
                       int32_t n_head_kv, int32_t ipot, int32_t il, float kq_scale);
