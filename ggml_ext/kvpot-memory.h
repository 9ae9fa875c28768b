// EdgeInfinite's gated compressive memory inside the llama.cpp graph (Chen et al. 2025, section 3.1).
//
// Per pot layer and KV head: M (d_k x d_v) and z (d_k), zero at start, beside the KV cache, per context.
//   fold a segment (its RoPE'd keys and its values as the cache holds them):
//       M += sigma(K)^T V,   z += sum_j sigma(k_j)                                  (eq. 5, 6)
//   read out for the queries of the ubatch (as the layer's attention receives them):
//       A_mem = sigma(Q) M / (sigma(Q) z)                                          (eq. 7)
//   gate, per query head h (one MLP shared by the heads of a layer, g per head and channel):
//       A~ = W2 ReLU(W1 A_mem + b1) + b2                                           (eq. 8)
//       A_com = sigmoid(g) A~ + (1 - sigmoid(g)) A_dot                             (eq. 9)
// sigma = ELU + 1 (the paper says "a nonlinear activation"; ELU+1 is the Infini-attention and linear-
// attention choice and keeps sigma > 0, so the denominator is > 0 once anything was folded).
// Before the first fold the memory is None (eq. 10): the layer's output is A_dot, the stock computation.
// Query head h reads KV head h / (n_head / n_head_kv), llama.cpp's GQA grouping.
#pragma once

#include "kvpot-state.h"
#include "kvpot-weights.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

struct ggml_context;
struct ggml_tensor;
struct llama_context;
struct kvpot_pot;

// the trained memory-gating module, per pot layer (beside the layer's KV cache; belongs to the model)
struct kvpot_gate {
    kvpot_weights              weights;
    std::vector<ggml_tensor *> w1; // [d_v, d_h]  (ggml order; row-major [d_h][d_v] like torch's Linear)
    std::vector<ggml_tensor *> b1; // [d_h]
    std::vector<ggml_tensor *> w2; // [d_h, d_v]
    std::vector<ggml_tensor *> b2; // [d_v]
    std::vector<ggml_tensor *> g;  // [d_v, n_head]
    int32_t d_v = 0, d_h = 0, n_head = 0;
};

// the memory of one context, per pot layer (each in its layer's KV cache buffer type)
struct kvpot_memory {
    kvpot_weights              tensors; // M and z of every layer, grouped by buffer type
    std::vector<ggml_tensor *> m; // [d_k, d_v, n_head_kv] f32: element (k, v, h) is M_h[k][v]
    std::vector<ggml_tensor *> z; // [d_k, 1, n_head_kv] f32
    int32_t d_k = 0, d_v = 0, n_head_kv = 0;
    int64_t n_folded = 0;         // tokens folded so far; 0: no memory yet (A_dot passes unchanged)
};

// weights row-major, concatenated over the n_pot pot layers: w1 [n_pot][d_h][d_v], b1 [n_pot][d_h],
// w2 [n_pot][d_v][d_h], b2 [n_pot][d_v], g [n_pot][n_head][d_v]; shapes checked against every pot layer
std::shared_ptr<kvpot_gate> kvpot_gate_make(const kvpot_pot & pot, int32_t n_pot, int32_t d_v, int32_t d_h, int32_t n_head,
                                            const float * w1, const float * b1, const float * w2, const float * b2,
                                            const float * g, std::string & err);

// zeroed memory for the pot's layers
std::shared_ptr<kvpot_memory> kvpot_memory_make(const kvpot_pot & pot, std::string & err);

// fold cells[(l*n_head_kv + h)*n_cells + j] into M and z of pot layer l, KV head h: a ggml graph on the
// backend that holds the cache
std::string kvpot_memory_fold(llama_context * lctx, const kvpot_pot & pot, kvpot_memory & mem,
                              const int32_t * cells, int32_t n_cells);

// the graph piece for pot layer ipot: q [d_k, n_head, n_tokens] (the layer's attention queries, after
// RoPE, as the attention received them), kq_scale (the attention's scale of Q·K), a_dot [d_v*n_head,
// n_tokens] (attention output before W_o); returns A_com, same shape as a_dot. The memory reads the
// queries in the unscaled convention (Q·K / sqrt(d_k) is the logit): q * kq_scale * sqrt(d_k), which is q
// itself for models that scale in the attention (llama) and undoes a model's own Q scale (Gemma-3 passes
// Q / sqrt(256) with kq_scale 1; sigma(Q / 16) is nearly constant and would read the memory's mean).
// Intermediate tensors are named kvpot_mem_q-<il> (the queries read) and kvpot_mem_out-<il> for tests.
ggml_tensor * kvpot_memory_build(ggml_context * ctx0, const kvpot_gate & gate, const kvpot_memory & mem,
                                 ggml_tensor * q, ggml_tensor * a_dot, float kq_scale, int32_t ipot, int32_t il);

// a context's EdgeInfinite state: the gate belongs to the model (kept across kvpot_pot_reset), the
// memory M, z to the document (zeroed by the reset). While memory->n_folded > 0 every pot layer mixes
// its read-out into the attention output; a graph built with the mix reads M, z where they live, so it
// may be reused
struct kvpot_memory_state : kvpot_method_state {
    std::shared_ptr<kvpot_gate>   gate;
    std::shared_ptr<kvpot_memory> memory;

    bool live() const { return gate && memory && memory->n_folded > 0; }
    bool active() const override { return false; }
    bool in_graph() const override { return live(); }
    bool reset(llama_context * lctx, std::string & err) override;
};

// the context's memory mixes into the attention output (kvpot_memory_state::live)
bool kvpot_memory_live(const kvpot_state & st);

// in the attention-output hook of pot layer ipot: kvpot_memory_build's A_com while the memory is live,
// else a_dot unchanged
ggml_tensor * kvpot_memory_attn_out(const kvpot_state & st, ggml_context * ctx0, ggml_tensor * q, ggml_tensor * a_dot,
                                    float kq_scale, int32_t ipot, int32_t il);
