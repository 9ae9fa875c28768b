// the graph hooks: score taps and the dead-cell mask, and the calls into each method's graph pieces
// (kvpot_method_state), added while llama.cpp builds a ubatch graph and read back after it computes
#include "kvpot-distance.h"
#include "kvpot-heads.h"
#include "kvpot-hooks.h"
#include "kvpot-input.h"
#include "kvpot-logprobs.h"
#include "kvpot-lookup.h"
#include "kvpot-memory.h"
#include "kvpot-pot.h"
#include "kvpot-state.h"
#include "kvpot.h"

#include "llama-batch.h"
#include "llama-context.h"
#include "llama-graph.h"
#include "llama-hparams.h"

#include "ggml.h"
#include "ggml-backend.h"

#include <cmath>

namespace {

// what the graph being built on this thread taps; set between build_begin and build_end
struct kvpot_build {
    const llama_context * lctx = nullptr;
    kvpot_state *        st   = nullptr;
    llama_kv_cache *     pot  = nullptr;
    const llama_ubatch * ub   = nullptr;
    std::vector<int32_t> rows;          // ubatch rows to tap
    ggml_tensor *        rows_t = nullptr;
};

thread_local kvpot_build g_build;

// per-layer budgets: the cells [live_end, n_compacted) pot layer ipot no longer holds get -INF in
// its mask (a bias row [n_kv] broadcast over the query rows), so they take no part in its attention
ggml_tensor * mask_dead_cells(ggml_context * ctx0, llm_graph_result * res, const kvpot_state & st,
                              ggml_tensor * kq_mask, int32_t ipot) {
    const int64_t  n_kv = kq_mask->ne[0];
    const uint32_t live = st.live_end(ipot);
    if (live >= st.n_compacted || (int64_t) live >= n_kv) {
        return kq_mask;
    }
    std::vector<float> bias((size_t) n_kv, 0.0f);
    for (int64_t c = live; c < (int64_t) st.n_compacted && c < n_kv; ++c) {
        bias[c] = -INFINITY;
    }
    // the bias takes the mask's type (0 and -INF are exact in F16): Metal's ADD needs both operands
    // of one type, and an F16 mask (flash attention) plus an F32 bias would fall back to the CPU
    ggml_tensor * b = nullptr; // [n_kv]
    if (kq_mask->type == GGML_TYPE_F16) {
        std::vector<ggml_fp16_t> bias16(bias.size());
        ggml_fp32_to_fp16_row(bias.data(), bias16.data(), (int64_t) bias.size());
        b = kvpot_add_input<ggml_fp16_t, GGML_TYPE_F16>(res, ctx0, std::move(bias16));
    } else {
        b = kvpot_add_input<float, GGML_TYPE_F32>(res, ctx0, std::move(bias));
    }
    return ggml_add(ctx0, kq_mask, b); // [n_kv, n_tokens_pad, 1, 1], the mask's own type
}

int32_t pot_index_of(const llama_kv_cache & kv, int32_t il) {
    for (size_t i = 0; i < kvpot_kv_access::n_layers(kv); ++i) {
        if ((int32_t) kvpot_kv_access::il(kv, i) == il) {
            return (int32_t) i;
        }
    }
    return -1;
}

// defined after the hooks
void tap_scores(ggml_context * ctx0, ggml_cgraph * gf, llm_graph_result * res, const llama_hparams & hparams,
                ggml_tensor * q, ggml_tensor * k, ggml_tensor * kq_mask, float kq_scale, int32_t ipot);
void tap_logits(ggml_context * ctx0, ggml_cgraph * gf, llm_graph_result * res, ggml_tensor * q, ggml_tensor * k,
                float kq_scale, int32_t ipot);

} // namespace

uint32_t kvpot_hook_graph_nodes(uint32_t n_layer) {
    // per pot layer at most: InfLLM's in-graph lookup (~17 tensors) and its query (~11), the logit or
    // score tap (~15), or EdgeInfinite's read-out and gate (~25), or Locret's heads (~10); with room to
    // spare, as llama.cpp sizes its own count (the graph's tensor pool overflows with an abort otherwise)
    return 96u*n_layer + kvpot_logprobs_graph_nodes();
}

uint32_t kvpot_hook_out_rows(uint32_t n_outputs, uint32_t n_tokens) {
    // per-row log-probs need every row's logits in the graph; llama.cpp still copies out only the
    // marked rows, which kvpot_hook_out_ids puts first
    const bool all = g_build.st && g_build.ub && kvpot_logprobs_wanted(*g_build.st, *g_build.ub);
    return all ? n_tokens : n_outputs;
}

bool kvpot_hook_force_rebuild(const llama_context * lctx) {
    kvpot_state * st = kvpot_state_find(lctx);
    if (!st) {
        return false;
    }
    const bool force = st->force_rebuild || st->active() || st->has_dead_cells();
    st->force_rebuild = false;
    return force;
}

void kvpot_hook_build_begin(const llama_context * lctx, const llama_ubatch & ubatch) {
    g_build = {};
    kvpot_state * st = kvpot_state_find(lctx);
    if (!st || (!st->in_graph() && !st->has_dead_cells())) {
        return;
    }
    kvpot_pot pot;
    if (!kvpot_pot_resolve(const_cast<llama_context *>(lctx), pot).empty()) {
        return;
    }
    g_build.lctx = lctx;
    g_build.st  = st;
    g_build.pot = pot.kv;
    g_build.ub  = &ubatch;
    st->pending_taps.clear();
    for (auto & [id, m] : st->methods) {
        m->clear_pending();
    }
    if (!st->tap_pos.empty()) {
        for (uint32_t i = 0; i < ubatch.n_tokens; ++i) {
            for (llama_pos p : st->tap_pos) {
                if (ubatch.pos[i] == p) {
                    g_build.rows.push_back((int32_t) i);
                    break;
                }
            }
        }
    }
}

void kvpot_hook_qkv(ggml_context * ctx0, ggml_cgraph * gf, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v, int32_t il) {
    kvpot_state * st = g_build.st;
    if (!st || il < 0) {
        return;
    }
    const bool pot_layer = g_build.pot && pot_index_of(*g_build.pot, il) >= 0;
    kvpot_heads_qkv(*st, ctx0, gf, q, k, v, il, pot_layer);
}

ggml_tensor * kvpot_hook_attn(ggml_context * ctx0, ggml_cgraph * gf, llm_graph_result * res, const llama_hparams & hparams,
                              ggml_tensor * q, ggml_tensor * k, ggml_tensor * kq_mask, float kq_scale, int32_t il) {
    if (!g_build.st || k->ne[3] != 1) {
        return kq_mask;
    }
    const int32_t ipot = pot_index_of(*g_build.pot, il);
    if (ipot < 0) {
        return kq_mask;
    }
    kq_mask = mask_dead_cells(ctx0, res, *g_build.st, kq_mask, ipot);
    // InfLLM's lookup first: the fetched blocks must be in their cells before anything reads the cache
    kvpot_state & st = *g_build.st;
    kvpot_infllm_attn(st, ctx0, gf, res, g_build.lctx, *g_build.pot, *g_build.ub, q, (int32_t) k->ne[1], ipot, il, kq_scale);
    if (!g_build.rows.empty()) {
        if (st.tap_mode == KVPOT_TAP_QK && !kvpot_heads_capturing(st)) {
            tap_logits(ctx0, gf, res, q, k, kq_scale, ipot);
        } else {
            tap_scores(ctx0, gf, res, hparams, q, k, kq_mask, kq_scale, ipot);
        }
    }
    // after the taps (they read the mask as the attention would without the memory's distance) and
    // after the lookup's copies (the bias reads the fetched keys)
    return kvpot_distance_mask(ctx0, res, g_build.lctx, *g_build.pot, st, *g_build.ub, q, k, kq_mask, kq_scale, ipot, il);
}

ggml_tensor * kvpot_hook_attn_out(ggml_context * ctx0, ggml_tensor * q, ggml_tensor * cur, float kq_scale, int32_t il) {
    kvpot_state * st = g_build.st;
    if (!st || !kvpot_memory_live(*st) || q->ne[3] != 1) {
        return cur;
    }
    const int32_t ipot = pot_index_of(*g_build.pot, il);
    if (ipot < 0) {
        return cur;
    }
    return kvpot_memory_attn_out(*st, ctx0, q, cur, kq_scale, ipot, il);
}

namespace {

// the K of a pot layer as [d, n_kv, n_head_kv] for mul_mat (src0), from the cache view k [d, n_head_kv, n_kv]
ggml_tensor * keys_by_head(ggml_context * ctx0, ggml_tensor * k) {
    const int64_t d = k->ne[0], n_head_kv = k->ne[1], n_kv = k->ne[2];
    ggml_tensor * kv3 = ggml_view_3d(ctx0, k, d, n_head_kv, n_kv, k->nb[1], k->nb[2], 0);
    if (ggml_is_quantized(k->type) && ggml_is_contiguous(kv3)) {
        // a permuted quantized src0 is not one Vulkan's MUL_MAT takes (it wants dims 0-1 contiguous) and the
        // tap would run on the CPU; dequantize the contiguous view first (CPY q -> F32 is supported everywhere)
        kv3 = ggml_cast(ctx0, kv3, GGML_TYPE_F32);
    }
    return ggml_permute(ctx0, kv3, 0, 2, 1, 3);
}

// the tapped query rows of q [d, n_head, n_tokens] as [d*n_head, n_tap] in F32
ggml_tensor * tapped_rows(ggml_context * ctx0, llm_graph_result * res, ggml_tensor * q) {
    if (!g_build.rows_t) {
        g_build.rows_t = kvpot_add_i32_input(res, ctx0, g_build.rows);
    }
    ggml_tensor * qc = ggml_is_contiguous(q) ? q : ggml_cont(ctx0, q);
    return ggml_get_rows(ctx0, ggml_reshape_2d(ctx0, qc, q->ne[0]*q->ne[1], q->ne[2]), g_build.rows_t);
}

// logit taps (KVPOT_TAP_QK): the attention logit each cell receives from the tapped rows, summed over
// them and over the query heads of each KV group: (sum of the rows' queries) · k · kq_scale. Linear in q,
// so one product per cell instead of tap_scores' [n_kv x n_tap] softmax. No mask: the caller counts a
// cell only for rows that come after it (InfLLM scores a chunk's own cells from later chunks)
void tap_logits(ggml_context * ctx0, ggml_cgraph * gf, llm_graph_result * res, ggml_tensor * q, ggml_tensor * k,
                float kq_scale, int32_t ipot) {
    const int64_t d         = q->ne[0];
    const int64_t n_head    = q->ne[1];
    const int64_t n_head_kv = k->ne[1];
    const int64_t n_kv      = k->ne[2];
    const int64_t n_group   = n_head / n_head_kv;
    const int64_t n_tap     = (int64_t) g_build.rows.size();

    ggml_tensor * qr = tapped_rows(ctx0, res, q);                                   // [d*n_head, n_tap]
    ggml_tensor * t  = ggml_sum_rows(ctx0, ggml_cont(ctx0, ggml_transpose(ctx0, qr))); // [1, d*n_head]
    t = ggml_reshape_3d(ctx0, t, d, n_group, n_head_kv);                           // query head h -> KV head h / n_group
    t = ggml_sum_rows(ctx0, ggml_cont(ctx0, ggml_permute(ctx0, t, 1, 0, 2, 3)));   // [1, d, n_head_kv]
    t = ggml_reshape_3d(ctx0, t, d, 1, n_head_kv);
    ggml_tensor * out = ggml_mul_mat(ctx0, keys_by_head(ctx0, k), t);             // [n_kv, 1, n_head_kv]
    ggml_mul_mat_set_prec(out, GGML_PREC_F32);
    out = ggml_reshape_3d(ctx0, ggml_scale(ctx0, out, kq_scale), 1, n_kv, n_head_kv); // as tap_scores' output
    GGML_UNUSED(n_tap);
    ggml_set_output(out);
    ggml_build_forward_expand(gf, out);
    g_build.st->pending_taps.push_back({ipot, out, n_kv});
}

// score taps: the attention probability each cell receives from the tapped rows, per KV head
void tap_scores(ggml_context * ctx0, ggml_cgraph * gf, llm_graph_result * res, const llama_hparams & hparams,
                ggml_tensor * q, ggml_tensor * k, ggml_tensor * kq_mask, float kq_scale, int32_t ipot) {
    const int64_t n_tap     = (int64_t) g_build.rows.size();
    const int64_t d         = q->ne[0];
    const int64_t n_head    = q->ne[1];
    const int64_t n_head_kv = k->ne[1];
    const int64_t n_kv      = k->ne[2];
    const int64_t n_group   = n_head / n_head_kv;

    // the tapped query rows: [d, n_head, n_tap] -> [d, n_tap, n_head]
    ggml_tensor * qr = tapped_rows(ctx0, res, q);
    kvpot_heads_capture_q(*g_build.st, ctx0, gf, qr, kq_scale, ipot);
    qr = ggml_permute(ctx0, ggml_reshape_3d(ctx0, qr, d, n_head, n_tap), 0, 2, 1, 3);

    // [d, n_kv, n_head_kv]; query head h reads KV head h / n_group (ggml's mul_mat broadcast, as in llama.cpp)
    ggml_tensor * kp = keys_by_head(ctx0, k);

    ggml_tensor * kq = ggml_mul_mat(ctx0, kp, qr); // [n_kv, n_tap, n_head]
    ggml_mul_mat_set_prec(kq, GGML_PREC_F32);
    if (hparams.attn_soft_cap) {
        kq = ggml_scale(ctx0, kq, 1.0f / hparams.f_attn_logit_softcapping);
        kq = ggml_tanh (ctx0, kq);
        kq = ggml_scale(ctx0, kq, hparams.f_attn_logit_softcapping);
    }

    // the same mask rows the main attention uses
    ggml_tensor * m2 = ggml_view_2d(ctx0, kq_mask, kq_mask->ne[0], kq_mask->ne[1], kq_mask->nb[1], 0);
    ggml_tensor * mr = ggml_get_rows(ctx0, m2, g_build.rows_t); // [n_kv, n_tap] f32

    ggml_tensor * p = ggml_soft_max_ext(ctx0, kq, mr, kq_scale, hparams.f_max_alibi_bias); // [n_kv, n_tap, n_head]

    // sum over tapped rows and over the query heads of each KV group: [n_kv, n_tap*n_group, n_head_kv] -> [1, n_kv, n_head_kv]
    p = ggml_reshape_3d(ctx0, p, n_kv, n_tap*n_group, n_head_kv);
    p = ggml_cont(ctx0, ggml_transpose(ctx0, p));
    ggml_tensor * out = ggml_sum_rows(ctx0, p);
    ggml_set_output(out);
    ggml_build_forward_expand(gf, out);

    g_build.st->pending_taps.push_back({ipot, out, n_kv});
}

} // namespace

void kvpot_hook_build_end(const llama_context * lctx, llm_graph_result * res, ggml_context * ctx0, ggml_cgraph * gf) {
    GGML_UNUSED(lctx);
    kvpot_state * st = g_build.st;
    if (st && gf && g_build.ub && kvpot_logprobs_wanted(*st, *g_build.ub)) {
        kvpot_logprobs_build(*st, *g_build.ub, res, ctx0, gf);
    }
    g_build = {};
}

void kvpot_hook_computed(llama_context * lctx, llm_graph_result * res, const llama_ubatch & ubatch) {
    GGML_UNUSED(res);
    GGML_UNUSED(ubatch);
    kvpot_state * st = kvpot_state_find(lctx);
    if (!st) {
        return;
    }
    bool pending = !st->pending_taps.empty();
    for (const auto & [id, m] : st->methods) {
        pending = pending || m->has_pending();
    }
    if (pending) {
        ggml_backend_sched_synchronize(lctx->get_sched());
    }
    std::vector<float> buf;
    for (const auto & tap : st->pending_taps) {
        if (tap.ipot >= (int32_t) st->tap_acc.size()) {
            continue;
        }
        auto & acc = st->tap_acc[tap.ipot];
        const int64_t n_head_kv = tap.t->ne[2];
        const int64_t kv_size   = n_head_kv > 0 ? (int64_t) acc.size() / n_head_kv : 0;
        buf.resize(ggml_nelements(tap.t));
        ggml_backend_tensor_get(tap.t, buf.data(), 0, ggml_nbytes(tap.t));
        for (int64_t h = 0; h < n_head_kv; ++h) {
            for (int64_t c = 0; c < tap.n_kv && c < kv_size; ++c) {
                acc[h*kv_size + c] += buf[h*tap.n_kv + c];
            }
        }
    }
    st->pending_taps.clear();
    for (auto & [id, m] : st->methods) {
        m->computed(*st);
    }
}
