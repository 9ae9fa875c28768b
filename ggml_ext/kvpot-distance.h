// InfLLM's context memory at one distance (docs/pot.md, "InfLLM's block memory"): the paper attends the
// initial tokens and the retrieved blocks with every query rotated to n_local and every memory key at
// RoPE 0, so each query sees the whole memory exactly n_local positions back, whatever its own position.
// kvpot places the memory cells at one RoPE angle in the cache; this graph piece corrects, per query row
// and head, the logits of those cells to what the paper's rotation gives, through the attention mask:
//
//   bias[c, i, h] = kq_scale * k_c . (rope(q_ih, angle_c + distance - pos_i) - q_ih)   for memory cells c
//
// so softmax(kq * kq_scale + mask + bias) is the paper's softmax over initial + retrieved + local tokens.
// The mask becomes [n_kv, n_tokens_pad, n_head] (soft_max and flash attention both broadcast a mask
// over heads). Models that soft-cap the attention logits cannot take it (the cap comes before the mask).
#pragma once

#include "llama.h"

#include <cstdint>

struct ggml_context;
struct ggml_tensor;
struct llama_context;
struct llama_ubatch;
struct kvpot_state;
class  llama_kv_cache;
class  llm_graph_result;

// the memory cells of every pot layer and the distance every query sees them at (kvpot_distance_set);
// n_cells 0: off
struct kvpot_distance {
    int32_t cell0    = 0;
    int32_t n_cells  = 0;
    int32_t distance = 0;
};

// in the attention hook of pot layer ipot (model layer il), after InfLLM's lookup wrote its cells: the
// layer's mask with the bias above on the memory cells (unchanged when the context's InfLLM state,
// kvpot_infllm_state, holds no distance)
ggml_tensor * kvpot_distance_mask(ggml_context * ctx0, llm_graph_result * res, const llama_context * lctx,
                                  llama_kv_cache & kv, const kvpot_state & st, const llama_ubatch & ub,
                                  ggml_tensor * q, ggml_tensor * k, ggml_tensor * kq_mask, float kq_scale,
                                  int32_t ipot, int32_t il);
