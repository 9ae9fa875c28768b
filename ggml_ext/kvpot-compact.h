// pot compaction, split as llama.cpp splits find_slot/apply: check (kvpot-compact-check.cpp) ->
// plan (kvpot-compact-plan.cpp, pure positions) -> apply (kvpot-compact.cpp, the one step that mutates)
#pragma once

#include "kvpot-pot.h"
#include "kvpot-state.h"

#include <string>
#include <vector>

struct kvpot_check {
    int32_t     code = 0; // 0, or a KVPOT_ERR_* code
    std::string why;
    bool ok() const { return code == 0; }
};

// validate a keep list against the pot before anything moves; fills n_live[l], the cells layer l keeps
// (n_keep, or fewer when its rows end with KVPOT_PAD)
kvpot_check kvpot_compact_check(const kvpot_pot & pot, const kvpot_state * prev, const int32_t * keep,
                                int32_t n_layer, int32_t n_head_kv, int32_t n_head_pot, int32_t n_keep, bool cr_rope,
                                std::vector<int32_t> & n_live);

// keep: [n_pot_layer][n_head_kv][n_keep] cell indices that passed kvpot_compact_check. Plans the
// positions, gathers (and re-rotates) K/V in one graph, then rewrites cells and state.
// returns "" on success, else why it failed; the cache is unchanged when it fails before compute
std::string kvpot_compact(llama_context * lctx, kvpot_state & st, const kvpot_pot & pot,
                          const int32_t * keep, const std::vector<int32_t> & n_live,
                          int32_t n_head_kv, int32_t n_keep, bool cr_rope);

// RoPE position of the token a cell of a pot layer holds for one KV head
llama_pos kvpot_rope_pos(const kvpot_state & st, const llama_kv_cells & cells, int32_t ipot, int32_t n_head_kv,
                         int32_t head, uint32_t cell);

// rotate the keys x [d, n_head, n] (F32) by delta [n] positions with the rope settings of layer il, the
// same llama.cpp's K-shift uses; rot: the Hadamard matrix of a rotated K cache, or nullptr
ggml_tensor * kvpot_rerope(ggml_context * ctx, const llama_context * lctx, const llama_kv_cache & kv, ggml_tensor * x,
                           ggml_tensor * delta, ggml_tensor * rot, int32_t il);
