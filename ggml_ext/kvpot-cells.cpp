#include "kvpot-cells.h"

#include "llama-context.h"
#include "llama-graph.h"

#include "ggml-backend.h"

ggml_tensor * kvpot_cells_k(ggml_context * ctx, ggml_tensor * k, int64_t dk, int64_t n_head_kv, int64_t n_used,
                            ggml_tensor * idx) {
    // [dk, n_head_kv, n_used] -> [dk, n_used, n_head_kv]: get_rows gathers per KV head (dim 2 of idx's rows)
    ggml_tensor * ks = ggml_view_3d(ctx, k, dk, n_head_kv, n_used, ggml_row_size(k->type, dk), k->nb[1], 0);
    return ggml_get_rows(ctx, ggml_permute(ctx, ks, 0, 2, 1, 3), idx);
}

ggml_tensor * kvpot_cells_v(ggml_context * ctx, ggml_tensor * v, int64_t dv, int64_t n_head_kv, int64_t n_used,
                            int64_t kv_size, bool v_trans, ggml_tensor * idx) {
    if (!v_trans) {
        ggml_tensor * vs = ggml_view_3d(ctx, v, dv, n_head_kv, n_used, ggml_row_size(v->type, dv), v->nb[1], 0);
        return ggml_get_rows(ctx, ggml_permute(ctx, vs, 0, 2, 1, 3), idx);
    }
    // transposed V: channel (h, e) is a row of kv_size cells
    const size_t es = ggml_element_size(v);
    ggml_tensor * vs = ggml_view_3d(ctx, v, n_used, dv, n_head_kv, kv_size*es, kv_size*dv*es, 0); // [n_used, dv, H]
    ggml_tensor * vc = ggml_cont(ctx, ggml_permute(ctx, vs, 1, 0, 2, 3));                         // [dv, n_used, H]
    return ggml_get_rows(ctx, vc, idx);                                                            // [dv, n, H]
}

void kvpot_store_k(ggml_context * ctx, ggml_cgraph * gf, ggml_tensor * k, ggml_tensor * x, int64_t cell0) {
    const int64_t dk = x->ne[0], n = x->ne[1], n_head_kv = x->ne[2];
    ggml_tensor * xc = ggml_cont(ctx, ggml_permute(ctx, x, 0, 2, 1, 3)); // [dk, n_head_kv, n]: the cache's cell layout
    ggml_tensor * kd = ggml_view_2d(ctx, k, dk*n_head_kv, n, k->nb[1], (size_t) cell0*k->nb[1]);
    ggml_build_forward_expand(gf, ggml_cpy(ctx, ggml_reshape_2d(ctx, xc, dk*n_head_kv, n), kd));
}

void kvpot_store_v(ggml_context * ctx, ggml_cgraph * gf, ggml_tensor * v, ggml_tensor * x, int64_t cell0,
                   int64_t kv_size, bool v_trans) {
    const int64_t dv = x->ne[0], n = x->ne[1], n_head_kv = x->ne[2];
    if (!v_trans) {
        ggml_tensor * xc = ggml_cont(ctx, ggml_permute(ctx, x, 0, 2, 1, 3)); // [dv, n_head_kv, n]
        ggml_tensor * vd = ggml_view_2d(ctx, v, dv*n_head_kv, n, v->nb[1], (size_t) cell0*v->nb[1]);
        ggml_build_forward_expand(gf, ggml_cpy(ctx, ggml_reshape_2d(ctx, xc, dv*n_head_kv, n), vd));
        return;
    }
    const size_t es = ggml_element_size(v);
    ggml_tensor * xc = ggml_cont(ctx, ggml_permute(ctx, x, 1, 0, 2, 3)); // [n, dv, n_head_kv]
    ggml_tensor * vd = ggml_view_3d(ctx, v, n, dv, n_head_kv, kv_size*es, kv_size*dv*es, (size_t) cell0*es);
    ggml_build_forward_expand(gf, ggml_cpy(ctx, xc, vd));
}

std::string kvpot_graph_run(llama_context * lctx, const char * what, const kvpot_graph_build & build) {
    auto * sched = lctx->get_sched();
    ggml_backend_sched_reset(sched);
    auto * res = lctx->get_gf_res_reserve();
    res->reset();
    ggml_cgraph * gf = res->get_gf();
    res->add_input(build(res->get_ctx(), gf));
    if (!ggml_backend_sched_alloc_graph(sched, gf)) {
        return std::string("failed to allocate the ") + what + " graph";
    }
    res->set_inputs(nullptr);
    if (lctx->graph_compute(gf, false) != GGML_STATUS_SUCCESS) {
        return std::string("failed to compute the ") + what + " graph";
    }
    ggml_backend_sched_synchronize(sched);
    return "";
}
