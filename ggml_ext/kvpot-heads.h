// Locret's retaining heads inside the llama.cpp graph: per layer, score = fc2 · act(fc1 · [Q; K; V])
// for every token of the ubatch and every KV head, on the layer's pre-RoPE projections
#pragma once

#include "kvpot-weights.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

struct ggml_context;
struct ggml_tensor;
struct llama_model;

struct kvpot_heads {
    kvpot_weights              weights; // fc1, fc2 beside their layer's device
    // fc1 per model layer, split by the input it multiplies (fc1 · [Q; K; V] = fc1_q·Q + fc1_k·K + fc1_v·V),
    // so the graph reads Q, K and V where they are instead of copying them into one [width, n_tokens]
    std::vector<ggml_tensor *> fc1_q; // [n_head*d_k, hidden] (ggml order: ne0 first)
    std::vector<ggml_tensor *> fc1_k; // [n_head_kv*d_k, hidden]
    std::vector<ggml_tensor *> fc1_v; // [n_head_kv*d_v, hidden]
    std::vector<ggml_tensor *> fc2;  // per model layer, [hidden, n_head_kv]
    int32_t act       = 0;           // 0 silu, 1 gelu (tanh form)
    int32_t n_head_kv = 0;
};

// weights from the caller (already checked by the Python adapter reader): fc1 row-major
// [n_layer][hidden][width], fc2 [n_layer][n_head_kv][hidden]; the widths are checked against the
// model. nullptr and a message in err when they do not fit.
std::shared_ptr<kvpot_heads> kvpot_heads_make(const llama_model * model, int32_t n_layer, int32_t hidden, int32_t width,
                                              int32_t n_head_kv, int32_t act, const float * fc1, const float * fc2,
                                              std::string & err);

// [d, n_h, n_tokens] (possibly a view of a fused QKV) -> [d*n_h, n_tokens], copied only when not contiguous
ggml_tensor * kvpot_heads_flat(ggml_context * ctx0, ggml_tensor * t);

// the heads' input for one layer: q [d_k, n_head, n_tokens], k [d_k, n_head_kv, n_tokens],
// v [d_v, n_head_kv, n_tokens] (views allowed) -> x = [Q; K; V] [width, n_tokens]: what the training
// capture returns (the features the heads read, in the adapter's column order)
ggml_tensor * kvpot_heads_input(ggml_context * ctx0, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v);

// the graph piece for layer il on the same q, k, v; returns scores [n_head_kv, n_tokens]
ggml_tensor * kvpot_heads_build(ggml_context * ctx0, const kvpot_heads & heads, ggml_tensor * q, ggml_tensor * k,
                                ggml_tensor * v, int32_t il);
