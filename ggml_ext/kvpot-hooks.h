// hooks that kvpot's patches call from inside llama.cpp (C++, internal; not part of the C API)
#pragma once

#include <cstdint>

struct ggml_context;
struct ggml_cgraph;
struct ggml_tensor;
struct llama_context;
struct llama_hparams;
struct llama_ubatch;
class  llm_graph_result;

// llama_context::graph_max_nodes: graph nodes kvpot's pieces may add on top of llama.cpp's own count
// (taps, the lookup and its query, retaining heads, the gated memory: a few dozen per layer)
uint32_t kvpot_hook_graph_nodes(uint32_t n_layer);

// llm_graph_context::build_inp_out_ids: rows the graph carries past the last layer to the output head:
// n_tokens while the ubatch being built wants per-row log-probs (kvpot-logprobs.h), else n_outputs
uint32_t kvpot_hook_out_rows(uint32_t n_outputs, uint32_t n_tokens);

// llm_graph_input_out_ids::set_input when the graph carries every row: writes the rows marked as outputs
// first, then the others, and returns true, so the first n_outputs rows of the logits are the ones
// llama.cpp copies out; returns false (nothing written: the identity order) when every row is marked
bool kvpot_hook_out_ids(const llama_ubatch * ubatch, int32_t * data);

// llama_context::process_ubatch: true when the previous graph must not be reused
// (taps or log-probs requested, or the pot was compacted since it was built)
bool kvpot_hook_force_rebuild(const llama_context * lctx);

// llama_context::process_ubatch, around model.build_graph(): the attention hooks below
// only act between these two calls, for the context being built
void kvpot_hook_build_begin(const llama_context * lctx, const llama_ubatch & ubatch);
void kvpot_hook_build_end  (const llama_context * lctx, llm_graph_result * res, ggml_context * ctx0, ggml_cgraph * gf);

// llm_graph_context::build_attn, for layers whose KV lives in the pot, right before build_attn_mha:
//   q       [n_embd_head, n_head,    n_tokens]      (after any Hadamard rotation)
//   k       [n_embd_head, n_head_kv, n_kv, n_stream] (view of the cache)
//   kq_mask [n_kv, n_tokens_pad, 1, n_stream]
// returns the mask this layer's attention uses: kq_mask itself, or kq_mask plus -INF on the cells
// the layer no longer holds (per-layer budgets)
ggml_tensor * kvpot_hook_attn(ggml_context * ctx0, ggml_cgraph * gf, llm_graph_result * res, const llama_hparams & hparams,
                              ggml_tensor * q, ggml_tensor * k, ggml_tensor * kq_mask, float kq_scale, int32_t il);

// llm_graph_context::build_qkv, before it returns the (reshaped) projections of layer il:
//   q [n_embd_head_k, n_head, n_tokens], k [n_embd_head_k, n_head_kv, n_tokens], v [n_embd_head_v, n_head_kv, n_tokens]
// before RoPE and before any q/k norm the model applies afterwards (views of a fused QKV allowed)
void kvpot_hook_qkv(ggml_context * ctx0, ggml_cgraph * gf, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v, int32_t il);

// llm_graph_context::build_attn (KV-cache and iSWA forms), after the attention output of layer il is
// complete and before W_o: q [n_embd_head_k, n_head, n_tokens] as the attention received it (after RoPE,
// and after any scale the model applies to Q itself, as Gemma-3 does), kq_scale the scale the attention
// applies to Q·K, cur [n_embd_head_v*n_head, n_tokens]. Returns cur, or EdgeInfinite's gated mix of it with
// the layer's compressive memory (pot layers, once anything was folded)
ggml_tensor * kvpot_hook_attn_out(ggml_context * ctx0, ggml_tensor * q, ggml_tensor * cur, float kq_scale, int32_t il);

// llama_context::process_ubatch, after a successful graph_compute: read tapped outputs back
void kvpot_hook_computed(llama_context * lctx, llm_graph_result * res, const llama_ubatch & ubatch);

// llama_context::~llama_context: drop the context's kvpot state (a later context may get its address)
void kvpot_hook_context_free(const llama_context * lctx);
