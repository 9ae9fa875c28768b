// per-context kvpot state: pending tap / log-prob requests, their results, and per-head positions
#pragma once

#include "kvpot-distance.h"
#include "llama.h"

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

struct ggml_tensor;
struct kvpot_heads;
struct kvpot_gate;
struct kvpot_memory;
struct kvpot_lookup;

struct kvpot_tap_out {
    int32_t       ipot;   // index of the pot layer
    ggml_tensor * t;      // [1, n_kv, n_head_kv] attention mass per cell and KV head
    int64_t       n_kv;
};

struct kvpot_state {
    // score taps: positions (llama_pos) of the query rows to tap; results summed over those rows
    std::vector<llama_pos>          tap_pos;
    std::vector<std::vector<float>> tap_acc;   // [n_pot_layer][n_head_kv * kv_size]
    int32_t                         tap_mode = 0; // KVPOT_TAP_ATTENTION or KVPOT_TAP_QK (kvpot_tap_mode)
    int32_t                         tap_rows_seen = 0;

    // log-probs: target token for the row at position lp_pos0 + i
    llama_pos                lp_pos0 = 0;
    std::vector<llama_token> lp_targets;
    std::vector<float>       lp_out;       // NaN until computed
    std::string              lp_error;

    // tensors of the graph being built / just computed
    std::vector<kvpot_tap_out> pending_taps;
    std::vector<ggml_tensor *> pending_lp;      // [1, n_pick] log-probs per block of rows (kvpot-logprobs.cpp)
    std::vector<int32_t>       pending_lp_rows; // index into lp_out for each picked row, in block order

    // the next graph must be rebuilt (after a compaction)
    bool force_rebuild = false;

    // per (pot layer, head) RoPE position of the first n_compacted cells; cells at or past
    // n_compacted were written by decode since and their cell position is the RoPE position
    uint32_t               n_compacted = 0;
    std::vector<llama_pos> rope_pos;  // [n_pot_layer][n_head_kv][n_compacted]
    // per pot layer, how many of the first n_compacted cells the layer holds (per-layer budgets):
    // cells [n_live[l], n_compacted) are dead there, masked out of its attention. Empty: all held
    std::vector<int32_t>   n_live;

    // first dead cell of pot layer ipot (n_compacted when it holds them all)
    uint32_t live_end(int32_t ipot) const { return n_live.empty() ? n_compacted : (uint32_t) n_live[ipot]; }

    int32_t budget = 0;
    int32_t n_compactions = 0;

    // Locret's retaining heads: while set, every ubatch graph scores each token in every layer
    // (kvpot-heads.cpp); kept across kvpot_pot_reset, they belong to the model, not the document
    std::shared_ptr<kvpot_heads>                   heads;
    bool                                           heads_on = true; // score while decoding (off: answering)
    std::vector<std::pair<int32_t, ggml_tensor *>> pending_heads; // (model layer, [n_head_kv, n_tokens])
    std::vector<std::vector<float>>                head_scores;   // per model layer, [n_tokens][n_head_kv] since the last take

    // training capture for the retaining heads (kvpot_capture_enable): per model layer the heads'
    // input [Q; K; V] of every token, per pot layer the tapped query rows after RoPE, times kq_scale
    bool                                           capture_on = false;
    std::vector<std::pair<int32_t, ggml_tensor *>> pending_qkv;  // (model layer, [width, n_tokens])
    std::vector<std::pair<int32_t, ggml_tensor *>> pending_q;    // (pot layer, [d*n_head, n_tap])
    std::vector<std::vector<float>>                captured_qkv; // per model layer, [n_tokens][width] since the last take
    std::vector<std::vector<float>>                captured_q;   // per pot layer, [n_rows][n_head][d] since the last take

    bool active() const {
        return !tap_pos.empty() || !lp_targets.empty() || (heads != nullptr && heads_on) || capture_on || q_on || lookup != nullptr ||
               distance.n_cells > 0;
    }

    // EdgeInfinite's gated memory: the gate belongs to the model (kept across kvpot_pot_reset), the
    // memory M, z to the document (zeroed by the reset). While memory->n_folded > 0 every pot layer
    // mixes its read-out into the attention output (kvpot-memory.cpp)
    std::shared_ptr<kvpot_gate>   gate;
    std::shared_ptr<kvpot_memory> memory;
    bool memory_live() const;

    // InfLLM: per pot layer, the ubatch queries rotated to position q_angle, summed over rows and over
    // the query heads of each KV group, accumulated until taken (kvpot_query_take)
    bool                                           q_on    = false;
    llama_pos                                      q_angle = 0;
    std::vector<std::vector<float>>                q_acc;     // [n_pot_layer][n_head_kv * d_k]
    std::vector<std::pair<int32_t, ggml_tensor *>> pending_lookup_q; // (pot layer, [1, d_k, n_head_kv])
    // InfLLM's lookup inside the layer (kvpot-lookup.h): set after the cells are reserved, dropped by
    // anything that moves cells (compaction, insert, reset, restore)
    std::shared_ptr<kvpot_lookup>                  lookup;
    // InfLLM's memory cells seen at one distance by every query (kvpot-distance.h, kvpot_distance_set);
    // dropped with the lookup by anything that moves cells
    kvpot_distance                                 distance;

    bool has_dead_cells() const {
        for (int32_t n : n_live) {
            if ((uint32_t) n < n_compacted) {
                return true;
            }
        }
        return false;
    }
};

// state of a context, created on first use; the lock guards the registry, not the state
kvpot_state & kvpot_state_get(const llama_context * lctx);
// the state if one exists, else nullptr (hooks must not create state for unrelated contexts)
kvpot_state * kvpot_state_find(const llama_context * lctx);
void kvpot_state_drop(const llama_context * lctx);

// thread-local error message for the C API
void kvpot_set_error(const std::string & msg);
