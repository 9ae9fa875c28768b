// the pot: the KV cache (or, for iSWA models, its non-SWA part) that kvpot bounds and compacts
#pragma once

#include "llama-kv-cache.h"
#include "llama-kv-cache-iswa.h"

#include <cstdint>
#include <string>
#include <vector>

struct llama_context;

// the one friend of llama_kv_cache (patch 0002): every read or write of its private
// tensors and cells goes through here
struct kvpot_kv_access {
    static ggml_tensor * k(const llama_kv_cache & kv, size_t ikv) { return kv.layers[ikv].k; }
    static ggml_tensor * v(const llama_kv_cache & kv, size_t ikv) { return kv.layers[ikv].v; }
    static uint32_t il(const llama_kv_cache & kv, size_t ikv) { return kv.layers[ikv].il; }
    static size_t n_layers(const llama_kv_cache & kv) { return kv.layers.size(); }
    static bool v_trans(const llama_kv_cache & kv) { return kv.v_trans; }
    static uint32_t n_stream(const llama_kv_cache & kv) { return kv.n_stream; }
    static bool attn_rot_k(const llama_kv_cache & kv) { return kv.attn_rot_k; }
    static const llama_hparams & hparams(const llama_kv_cache & kv) { return kv.hparams; }
    static const llama_model & model(const llama_kv_cache & kv) { return kv.model; }
    static llama_kv_cells & cells(llama_kv_cache & kv) { return kv.v_cells[0]; }
    static const llama_kv_cells & cells(const llama_kv_cache & kv) { return kv.v_cells[0]; }
    static void set_head(llama_kv_cache & kv, uint32_t head) { kv.v_heads[0] = head; }
    static ggml_tensor * build_input_k_rot(const llama_kv_cache & kv, ggml_context * ctx) { return kv.build_input_k_rot(ctx); }
    static void set_input_k_rot(const llama_kv_cache & kv, ggml_tensor * dst) { kv.set_input_k_rot(dst); }
};

struct kvpot_pot {
    llama_kv_cache * kv  = nullptr; // the pot
    llama_kv_cache * swa = nullptr; // the sliding-window part of an iSWA cache (not bounded by kvpot)
};

// resolve the pot of a context; empty string on success, else why not
std::string kvpot_pot_resolve(llama_context * lctx, kvpot_pot & out);

// model layer ids of the pot layers, in cache order
std::vector<int32_t> kvpot_pot_layer_ids(const llama_kv_cache & kv);
