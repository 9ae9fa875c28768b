// graph pieces shared by every kvpot graph that moves cells of the pot (compaction, EdgeInfinite's
// memory fold, InfLLM's read-out and insert): gathering one layer's K or V cells per KV head in either
// V layout, writing them back into the cache's cell layout, and running such a graph on the context's
// scheduler the way llama.cpp runs its K-shift
#pragma once

#include "ggml.h"

#include <functional>
#include <memory>
#include <string>

struct llama_context;
class llm_graph_input_i;

// the cells idx [n, n_head_kv] (I32, one row of cell indices per KV head) of a layer's K cache
// k [dk*n_head_kv, kv_size] -> [dk, n, n_head_kv] F32
ggml_tensor * kvpot_cells_k(ggml_context * ctx, ggml_tensor * k, int64_t dk, int64_t n_head_kv, int64_t n_used,
                            ggml_tensor * idx);

// the same for V, stored per cell (v_trans false: [dv*n_head_kv, kv_size]) or per channel (v_trans true:
// [kv_size, dv*n_head_kv], llama.cpp's layout without flash attention) -> [dv, n, n_head_kv] F32
ggml_tensor * kvpot_cells_v(ggml_context * ctx, ggml_tensor * v, int64_t dv, int64_t n_head_kv, int64_t n_used,
                            int64_t kv_size, bool v_trans, ggml_tensor * idx);

// write x [dk, n, n_head_kv] into cells cell0..cell0+n-1 of the K cache (converted to its type)
void kvpot_store_k(ggml_context * ctx, ggml_cgraph * gf, ggml_tensor * k, ggml_tensor * x, int64_t cell0);

// write x [dv, n, n_head_kv] into cells cell0..cell0+n-1 of the V cache, in its layout
void kvpot_store_v(ggml_context * ctx, ggml_cgraph * gf, ggml_tensor * v, ggml_tensor * x, int64_t cell0,
                   int64_t kv_size, bool v_trans);

// build one graph in the context's reserved graph result (build returns the graph's input, which
// sets its host data), allocate it on the scheduler, compute it and wait; "" or why it failed
// (`what` names the graph in that message). The caller marks the state for a graph rebuild.
using kvpot_graph_build = std::function<std::unique_ptr<llm_graph_input_i>(ggml_context *, ggml_cgraph *)>;
std::string kvpot_graph_run(llama_context * lctx, const char * what, const kvpot_graph_build & build);
