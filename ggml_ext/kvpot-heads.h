// Locret's retaining heads inside the llama.cpp graph: per layer, score = fc2 · act(fc1 · [Q; K; V])
// for every token of the ubatch and every KV head, on the layer's pre-RoPE projections
#pragma once

#include "kvpot-state.h"
#include "kvpot-weights.h"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

struct ggml_cgraph;
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

// a context's Locret state. The heads: while set and on, every ubatch graph scores each token in every
// pot layer; they belong to the model, so kvpot_pot_reset keeps them (and `on`) and drops the scores.
// The training capture (kvpot_capture_enable): per model layer the heads' input [Q; K; V] of every
// token, per pot layer the tapped query rows after RoPE, times kq_scale
struct kvpot_heads_state : kvpot_method_state {
    std::shared_ptr<kvpot_heads>                   heads;
    bool                                           on = true; // score while decoding (off: answering)
    std::vector<std::pair<int32_t, ggml_tensor *>> pending_scores; // (model layer, [n_head_kv, n_tokens])
    std::vector<std::vector<float>>                scores;         // per model layer, [n_tokens][n_head_kv] since the last take

    bool                                           capture_on = false;
    std::vector<std::pair<int32_t, ggml_tensor *>> pending_qkv;  // (model layer, [width, n_tokens])
    std::vector<std::pair<int32_t, ggml_tensor *>> pending_q;    // (pot layer, [d*n_head, n_tap])
    std::vector<std::vector<float>>                captured_qkv; // per model layer, [n_tokens][width] since the last take
    std::vector<std::vector<float>>                captured_q;   // per pot layer, [n_rows][n_head][d] since the last take

    bool active() const override { return (heads != nullptr && on) || capture_on; }
    void clear_pending() override;
    bool has_pending() const override;
    // appends the scores and the captured rows, ubatch after ubatch, until taken
    void computed(kvpot_state & st) override;
    bool reset(llama_context * lctx, std::string & err) override;
};

// in the QKV hook of model layer il (pot_layer: il is a pot layer): the capture's [Q; K; V] and, for pot
// layers while the heads are on, their scores
void kvpot_heads_qkv(kvpot_state & st, ggml_context * ctx0, ggml_cgraph * gf, ggml_tensor * q, ggml_tensor * k,
                     ggml_tensor * v, int32_t il, bool pot_layer);

// the training capture is on: score taps stay attention taps, whose query rows it records
bool kvpot_heads_capturing(const kvpot_state & st);

// in a score tap of pot layer ipot: Locret's labels, the tapped rows qr [d*n_head, n_tap] times kq_scale
// (q·k of these rows is then the pre-softmax score)
void kvpot_heads_capture_q(kvpot_state & st, ggml_context * ctx0, ggml_cgraph * gf, ggml_tensor * qr, float kq_scale,
                           int32_t ipot);
