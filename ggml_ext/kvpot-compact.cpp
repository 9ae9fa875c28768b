#include "kvpot-compact.h"
#include "kvpot-lookup.h"
#include "kvpot-cells.h"
#include "kvpot-compact-plan.h"

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

} // namespace

// the same rope settings llama.cpp's K-shift uses (llama_kv_cache::build_rope_shift)
ggml_tensor * kvpot_rerope(ggml_context * ctx, const llama_context * lctx, const llama_kv_cache & kv, ggml_tensor * x,
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

llama_pos kvpot_rope_pos(const kvpot_state & st, const llama_kv_cells & cells, int32_t ipot, int32_t n_head_kv,
                         int32_t head, uint32_t cell) {
    if (cell < st.n_compacted) {
        return st.rope_pos[((size_t) ipot*n_head_kv + head)*st.n_compacted + cell];
    }
    return cells.pos_get(cell);
}

namespace {

// the graph: per layer, gather each head's kept cells to the front (re-rotating K by the plan's deltas)
std::string run_gather(llama_context * lctx, const kvpot_pot & pot, const kvpot_compact_plan & plan,
                       int32_t n_head_kv, int32_t n_keep, bool cr_rope) {
    llama_kv_cache & kv = *pot.kv;
    llama_kv_cells & cells = kvpot_kv_access::cells(kv);
    const auto & hparams = kvpot_kv_access::hparams(kv);
    const int32_t n_layer = (int32_t) kvpot_kv_access::n_layers(kv);
    const uint32_t n_used = cells.used_max_p1();

    auto inp = std::make_unique<kvpot_compact_input>();
    inp->kv = &kv;
    inp->idx_data = plan.idx;
    if (cr_rope) {
        inp->delta_data = plan.delta;
    }

    const bool v_trans = kvpot_kv_access::v_trans(kv);
    const int64_t kvs = kv.get_size();
    return kvpot_graph_run(lctx, "compaction", [&](ggml_context * ctx, ggml_cgraph * gf) {
        inp->idx = ggml_new_tensor_3d(ctx, GGML_TYPE_I32, n_keep, n_head_kv, n_layer);
        ggml_set_input(inp->idx);
        if (cr_rope) {
            inp->delta = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, (int64_t) n_keep*n_head_kv, n_layer);
            ggml_set_input(inp->delta);
            if (kvpot_kv_access::attn_rot_k(kv)) {
                inp->k_rot = kvpot_kv_access::build_input_k_rot(kv, ctx);
            }
        }
        for (int32_t l = 0; l < n_layer; ++l) {
            const int32_t il = (int32_t) kvpot_kv_access::il(kv, l);
            ggml_tensor * k  = kvpot_kv_access::k(kv, l);
            ggml_tensor * v  = kvpot_kv_access::v(kv, l);
            const int64_t dk = hparams.n_embd_head_k(il);
            const int64_t dv = hparams.n_embd_head_v(il);

            ggml_tensor * idx = ggml_view_2d(ctx, inp->idx, n_keep, n_head_kv, inp->idx->nb[1], l*inp->idx->nb[2]);

            ggml_tensor * kg = kvpot_cells_k(ctx, k, dk, n_head_kv, n_used, idx); // [dk, n_keep, n_head_kv]
            if (cr_rope) {
                ggml_tensor * delta = ggml_view_1d(ctx, inp->delta, (int64_t) n_keep*n_head_kv, l*inp->delta->nb[1]);
                kg = kvpot_rerope(ctx, lctx, kv, ggml_reshape_3d(ctx, kg, dk, 1, (int64_t) n_keep*n_head_kv), delta, inp->k_rot, il);
                kg = ggml_reshape_3d(ctx, kg, dk, n_keep, n_head_kv);
            }
            kvpot_store_k(ctx, gf, k, kg, 0);
            if (v) {
                kvpot_store_v(ctx, gf, v, kvpot_cells_v(ctx, v, dv, n_head_kv, n_used, kvs, v_trans, idx), 0, kvs, v_trans);
            }
        }
        return std::unique_ptr<llm_graph_input_i>(std::move(inp));
    });
}

// the one step that mutates: cells 0..n_keep-1 now hold the kept tokens of seq 0
void apply_cells(kvpot_state & st, const kvpot_pot & pot, kvpot_compact_plan && plan,
                 const std::vector<int32_t> & n_live, int32_t n_keep, bool cr_rope, llama_pos p_next) {
    llama_kv_cache & kv = *pot.kv;
    llama_kv_cells & cells = kvpot_kv_access::cells(kv);
    // a cell's own position only serves the causal mask (each head's RoPE position is in rope_pos),
    // so the cells take the n_keep positions before `next`
    cells.reset();
    for (int32_t j = 0; j < n_keep; ++j) {
        cells.pos_set(j, plan.next - n_keep + j);
        cells.seq_add(j, 0);
    }
    kvpot_kv_access::set_head(kv, n_keep);
    if (cr_rope && pot.swa && plan.next != p_next) {
        pot.swa->seq_add(0, -1, -1, plan.next - p_next); // applied as a stock K-shift at the next decode
    }

    st.rope_pos      = std::move(plan.new_rope);
    st.n_compacted   = (uint32_t) n_keep;
    st.cells_moved(); // InfLLM's reserved cells moved
    st.n_live        = std::all_of(n_live.begin(), n_live.end(), [&](int32_t n) { return n == n_keep; })
                     ? std::vector<int32_t>() : n_live;
    st.force_rebuild = true;
    st.n_compactions++;
}

} // namespace

std::string kvpot_compact(llama_context * lctx, kvpot_state & st, const kvpot_pot & pot,
                          const int32_t * keep, const std::vector<int32_t> & n_live,
                          int32_t n_head_kv, int32_t n_keep, bool cr_rope) {
    static_assert(sizeof(llama_pos) == sizeof(int32_t), "the planner works on int32 positions");
    llama_kv_cache & kv = *pot.kv;
    const llama_kv_cells & cells = kvpot_kv_access::cells(kv);
    const int32_t n_layer = (int32_t) kvpot_kv_access::n_layers(kv);
    const llama_pos p_next = cells.seq_pos_max(0) + 1;

    // the live window only matters to CR-RoPE; without it every position stays where it is
    llama_pos win0 = p_next;
    if (cr_rope && pot.swa) {
        win0 = kvpot_plan_window_start(p_next, pot.swa->seq_pos_min(0), (int32_t) kvpot_kv_access::hparams(kv).n_swa);
    }
    kvpot_compact_plan plan = kvpot_plan_compaction(keep, n_live, n_layer, n_head_kv, n_keep,
        [&](int32_t l, int32_t h, int32_t c) { return kvpot_rope_pos(st, cells, l, n_head_kv, h, (uint32_t) c); },
        p_next, win0, cr_rope);

    if (std::string why = run_gather(lctx, pot, plan, n_head_kv, n_keep, cr_rope); !why.empty()) {
        return why;
    }
    apply_cells(st, pot, std::move(plan), n_live, n_keep, cr_rope, p_next);
    return "";
}
