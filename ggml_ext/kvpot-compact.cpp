#include "kvpot-compact.h"

#include "llama-context.h"
#include "llama-graph.h"
#include "llama-model.h"

#include "ggml.h"
#include "ggml-backend.h"

#include <algorithm>

namespace {

// graph inputs of one compaction: gather indices, RoPE deltas, and the Hadamard matrix of rotated K caches
class kvpot_compact_input : public llm_graph_input_i {
public:
    void set_input(const llama_ubatch * ubatch) override {
        GGML_UNUSED(ubatch);
        ggml_backend_tensor_set(idx, idx_data.data(), 0, idx_data.size()*sizeof(int32_t));
        if (delta && delta->buffer) {
            ggml_backend_tensor_set(delta, delta_data.data(), 0, delta_data.size()*sizeof(int32_t));
        }
        if (k_rot && k_rot->buffer) {
            kvpot_kv_access::set_input_k_rot(*kv, k_rot);
        }
    }

    const llama_kv_cache * kv = nullptr;
    ggml_tensor * idx   = nullptr; // I32 [n_keep, n_head_kv, n_layer]
    ggml_tensor * delta = nullptr; // I32 [n_keep*n_head_kv, n_layer]
    ggml_tensor * k_rot = nullptr;
    std::vector<int32_t> idx_data;
    std::vector<int32_t> delta_data;
};

// the same rope settings llama.cpp's K-shift uses (llama_kv_cache::build_rope_shift)
ggml_tensor * rerope(ggml_context * ctx, const llama_context * lctx, const llama_kv_cache & kv, ggml_tensor * x,
                     ggml_tensor * delta, ggml_tensor * rot, int32_t il) {
    const auto & cparams = lctx->get_cparams();
    const auto & hparams = kvpot_kv_access::hparams(kv);
    const auto & model   = kvpot_kv_access::model(kv);
    const int rope_type  = hparams.rope_type == LLAMA_ROPE_TYPE_MROPE || hparams.rope_type == LLAMA_ROPE_TYPE_IMROPE
                         ? LLAMA_ROPE_TYPE_NEOX : hparams.rope_type;
    if (rot) {
        x = llama_mul_mat_hadamard(ctx, x, rot); // rotate back (rot^2 == I)
    }
    x = ggml_rope_ext(ctx, x, delta, model.get_rope_factors(cparams, il), hparams.n_rot(il), rope_type,
                      cparams.n_ctx_orig_yarn, model.get_rope_freq_base(cparams, il), model.get_rope_freq_scale(cparams, il),
                      cparams.yarn_ext_factor, cparams.yarn_attn_factor, cparams.yarn_beta_fast, cparams.yarn_beta_slow);
    if (rot) {
        x = llama_mul_mat_hadamard(ctx, x, rot);
    }
    return x;
}

} // namespace

llama_pos kvpot_rope_pos(const kvpot_state & st, const llama_kv_cells & cells, int32_t ipot, int32_t n_head_kv,
                         int32_t head, uint32_t cell) {
    if (cell < st.n_compacted) {
        return st.rope_pos[((size_t) ipot*n_head_kv + head)*st.n_compacted + cell];
    }
    return cells.pos_get(cell);
}

std::string kvpot_compact(llama_context * lctx, kvpot_state & st, const kvpot_pot & pot,
                          const int32_t * keep_in, const std::vector<int32_t> & n_live,
                          int32_t n_head_kv, int32_t n_keep, bool cr_rope) {
    llama_kv_cache & kv = *pot.kv;
    llama_kv_cells & cells = kvpot_kv_access::cells(kv);
    const auto & hparams = kvpot_kv_access::hparams(kv);
    const int32_t n_layer = (int32_t) kvpot_kv_access::n_layers(kv);
    const uint32_t n_used = cells.used_max_p1();
    const llama_pos p_next = cells.seq_pos_max(0) + 1;

    // a padded slot j >= n_live[l] gathers the row's first kept cell with its RoPE unchanged: a
    // placeholder the attention mask hides from layer l until the next compaction frees it
    std::vector<int32_t> keep(keep_in, keep_in + (size_t) n_layer*n_head_kv*n_keep);
    for (int32_t l = 0; l < n_layer; ++l) {
        for (int32_t h = 0; h < n_head_kv; ++h) {
            const size_t row = ((size_t) l*n_head_kv + h)*n_keep;
            for (int32_t j = n_live[l]; j < n_keep; ++j) {
                keep[row + j] = keep[row];
            }
        }
    }

    // CR-RoPE (InfiniPot 3.5): kept cells restart at small positions, 0..n_keep-1 when the model has no
    // sliding window. With one (Gemma-3 iSWA) the window layers still hold the live window [win0, p_next), so
    // a kept cell inside it keeps its distance to the window's end (the window layers see it there too) and the
    // older kept cells of each head are packed right before it; the window restarts at W, the most older cells
    // any head kept. Positions stay below |C| + n_swa however long the stream.
    llama_pos win0 = p_next;
    if (cr_rope && pot.swa) {
        const llama_pos swa_min = pot.swa->seq_pos_min(0);
        if (swa_min >= 0) {
            win0 = std::max<llama_pos>(swa_min, p_next - (llama_pos) hparams.n_swa);
        }
    }
    std::vector<llama_pos> old_rope((size_t) n_layer*n_head_kv*n_keep);
    llama_pos W = 0;
    for (int32_t l = 0; l < n_layer; ++l) {
        for (int32_t h = 0; h < n_head_kv; ++h) {
            llama_pos n_old = 0;
            for (int32_t j = 0; j < n_keep; ++j) {
                const size_t i = ((size_t) l*n_head_kv + h)*n_keep + j;
                old_rope[i] = kvpot_rope_pos(st, cells, l, n_head_kv, h, (uint32_t) keep[i]);
                n_old += j < n_live[l] && old_rope[i] < win0;
            }
            W = std::max(W, n_old);
        }
    }
    const llama_pos next = cr_rope ? W + (p_next - win0) : p_next;

    std::vector<llama_pos> new_rope(old_rope.size());
    auto inp = std::make_unique<kvpot_compact_input>();
    inp->kv = &kv;
    inp->idx_data = keep;
    if (cr_rope) {
        inp->delta_data.resize(new_rope.size());
    }
    for (int32_t l = 0; l < n_layer; ++l) {
        for (int32_t h = 0; h < n_head_kv; ++h) {
            const size_t row = ((size_t) l*n_head_kv + h)*n_keep;
            llama_pos n_old = 0;
            for (int32_t j = 0; j < n_live[l]; ++j) {
                n_old += old_rope[row + j] < win0;
            }
            llama_pos k_old = 0;
            for (int32_t j = 0; j < n_keep; ++j) {
                const size_t i = row + j;
                const llama_pos old = old_rope[i];
                if (!cr_rope || j >= n_live[l]) {
                    new_rope[i] = old;
                    continue;
                }
                new_rope[i] = old < win0 ? W - n_old + k_old++ : W + (old - win0);
                inp->delta_data[i] = new_rope[i] - old;
            }
        }
    }

    auto * sched = lctx->get_sched();
    ggml_backend_sched_reset(sched);
    auto * res = lctx->get_gf_res_reserve();
    res->reset();
    ggml_context * ctx = res->get_ctx();
    ggml_cgraph  * gf  = res->get_gf();

    inp->idx = ggml_new_tensor_3d(ctx, GGML_TYPE_I32, n_keep, n_head_kv, n_layer);
    ggml_set_input(inp->idx);
    if (cr_rope) {
        inp->delta = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, (int64_t) n_keep*n_head_kv, n_layer);
        ggml_set_input(inp->delta);
        if (kvpot_kv_access::attn_rot_k(kv)) {
            inp->k_rot = kvpot_kv_access::build_input_k_rot(kv, ctx);
        }
    }

    const bool v_trans = kvpot_kv_access::v_trans(kv);
    for (int32_t l = 0; l < n_layer; ++l) {
        const int32_t il  = (int32_t) kvpot_kv_access::il(kv, l);
        ggml_tensor * k   = kvpot_kv_access::k(kv, l);
        ggml_tensor * v   = kvpot_kv_access::v(kv, l);
        const int64_t dk  = hparams.n_embd_head_k(il);
        const int64_t dv  = hparams.n_embd_head_v(il);
        const int64_t kvs = kv.get_size();

        ggml_tensor * idx = ggml_view_2d(ctx, inp->idx, n_keep, n_head_kv, inp->idx->nb[1], l*inp->idx->nb[2]);

        // K: [dk, n_head_kv, n_used] -> [dk, n_used, n_head_kv] -> gather -> [dk, n_keep, n_head_kv] f32
        ggml_tensor * ks = ggml_view_3d(ctx, k, dk, n_head_kv, n_used, ggml_row_size(k->type, dk), k->nb[1], 0);
        ggml_tensor * kg = ggml_get_rows(ctx, ggml_permute(ctx, ks, 0, 2, 1, 3), idx);
        if (cr_rope) {
            ggml_tensor * delta = ggml_view_1d(ctx, inp->delta, (int64_t) n_keep*n_head_kv, l*inp->delta->nb[1]);
            kg = rerope(ctx, lctx, kv, ggml_reshape_3d(ctx, kg, dk, 1, (int64_t) n_keep*n_head_kv), delta, inp->k_rot, il);
            kg = ggml_reshape_3d(ctx, kg, dk, n_keep, n_head_kv);
        }
        kg = ggml_cont(ctx, ggml_permute(ctx, kg, 0, 2, 1, 3)); // [dk, n_head_kv, n_keep]: the cache's cell layout
        ggml_tensor * kd = ggml_view_2d(ctx, k, dk*n_head_kv, n_keep, k->nb[1], 0);
        ggml_build_forward_expand(gf, ggml_cpy(ctx, ggml_reshape_2d(ctx, kg, dk*n_head_kv, n_keep), kd));

        if (!v) {
            continue;
        }
        if (!v_trans) {
            ggml_tensor * vs = ggml_view_3d(ctx, v, dv, n_head_kv, n_used, ggml_row_size(v->type, dv), v->nb[1], 0);
            ggml_tensor * vg = ggml_get_rows(ctx, ggml_permute(ctx, vs, 0, 2, 1, 3), idx);
            vg = ggml_cont(ctx, ggml_permute(ctx, vg, 0, 2, 1, 3));
            ggml_tensor * vd = ggml_view_2d(ctx, v, dv*n_head_kv, n_keep, v->nb[1], 0);
            ggml_build_forward_expand(gf, ggml_cpy(ctx, ggml_reshape_2d(ctx, vg, dv*n_head_kv, n_keep), vd));
        } else {
            // transposed V: channel (h, e) is a row of kv_size cells
            const size_t es = ggml_element_size(v);
            ggml_tensor * vs = ggml_view_3d(ctx, v, n_used, dv, n_head_kv, kvs*es, kvs*dv*es, 0); // [n_used, dv, n_head_kv]
            ggml_tensor * vc = ggml_cont(ctx, ggml_permute(ctx, vs, 1, 0, 2, 3));                // [dv, n_used, n_head_kv]
            ggml_tensor * vg = ggml_get_rows(ctx, vc, idx);                                      // [dv, n_keep, n_head_kv]
            vg = ggml_cont(ctx, ggml_permute(ctx, vg, 1, 0, 2, 3));                              // [n_keep, dv, n_head_kv]
            ggml_tensor * vd = ggml_view_3d(ctx, v, n_keep, dv, n_head_kv, kvs*es, kvs*dv*es, 0);
            ggml_build_forward_expand(gf, ggml_cpy(ctx, vg, vd));
        }
    }
    res->add_input(std::move(inp));

    if (!ggml_backend_sched_alloc_graph(sched, gf)) {
        return "failed to allocate the compaction graph";
    }
    res->set_inputs(nullptr);
    if (lctx->graph_compute(gf, false) != GGML_STATUS_SUCCESS) {
        return "failed to compute the compaction graph";
    }
    ggml_backend_sched_synchronize(sched);

    // cells: 0..n_keep-1 now hold the kept tokens of seq 0. A cell's own position only serves the causal mask
    // (each head's RoPE position is in rope_pos), so the cells take the n_keep positions before `next`
    cells.reset();
    for (int32_t j = 0; j < n_keep; ++j) {
        cells.pos_set(j, next - n_keep + j);
        cells.seq_add(j, 0);
    }
    kvpot_kv_access::set_head(kv, n_keep);
    if (cr_rope && pot.swa && next != p_next) {
        pot.swa->seq_add(0, -1, -1, next - p_next); // applied as a stock K-shift at the next decode
    }

    st.rope_pos      = std::move(new_rope);
    st.n_compacted   = (uint32_t) n_keep;
    st.n_live        = std::all_of(n_live.begin(), n_live.end(), [&](int32_t n) { return n == n_keep; })
                     ? std::vector<int32_t>() : n_live;
    st.force_rebuild = true;
    st.n_compactions++;
    return "";
}
