// InfLLM's context memory at one distance (kvpot-distance.h). Graph piece per pot layer:
//
//   q [d, n_head, T] --reshape [d, 1, n_head*T]--ROPE by (angle_c + distance - pos_i)--> q' ; dq = q' - q
//   per run of memory cells with one RoPE angle per KV head:  k [d, n_run, n_head_kv] x dq [d, T, n_head]
//     --MUL_MAT--> [n_run, T, n_head]      (query head h reads KV head h / n_group, as the attention does)
//   runs --CONCAT dim 0--> bias [n_mem, T, n_head] * kq_scale --PAD to [n_kv, n_pad, n_head] with zeros-->
//   + mask [n_kv, n_pad, 1] (broadcast over heads)
//
// RoPE is a rotation by position, so rotating the already-rotated query by angle_c + distance - pos_i
// gives the query the paper's angle relative to a key at angle_c. The cells InfLLM's lookup fetches in
// this same graph sit at the lookup's angle; the others at their recorded RoPE angle (kvpot_state::rope_pos).
#include "kvpot-distance.h"
#include "kvpot-blocks.h"
#include "kvpot-compact.h"
#include "kvpot-input.h"
#include "kvpot-lookup.h"
#include "kvpot-pot.h"
#include "kvpot-state.h"

#include "llama-batch.h"
#include "llama-graph.h"

#include "ggml.h"
#include "ggml-backend.h"

#include <vector>

ggml_tensor * kvpot_distance_mask(ggml_context * ctx0, llm_graph_result * res, const llama_context * lctx,
                                  llama_kv_cache & kv, const kvpot_state & st, const llama_ubatch & ub,
                                  ggml_tensor * q, ggml_tensor * k, ggml_tensor * kq_mask, float kq_scale,
                                  int32_t ipot, int32_t il) {
    const kvpot_infllm_state * inf = st.find_method<kvpot_infllm_state>();
    if (!inf) {
        return kq_mask;
    }
    const kvpot_distance & md = inf->distance;
    const int64_t n_kv = kq_mask->ne[0];
    if (md.n_cells <= 0 || md.cell0 + md.n_cells > n_kv || kq_mask->ne[2] != 1 || kq_mask->ne[3] != 1 ||
        k->ne[2] != n_kv) {
        return kq_mask;
    }
    const int64_t d         = q->ne[0];
    const int64_t n_head    = q->ne[1];
    const int64_t n_tokens  = q->ne[2];
    const int64_t n_head_kv = k->ne[1];
    const int64_t n_group   = n_head / n_head_kv;
    const int64_t n_pad     = kq_mask->ne[1];

    // each memory cell's RoPE angle per KV head; InfLLM's fetch of this graph puts its keys at lk.angle
    const llama_kv_cells & cells = kvpot_kv_access::cells(kv);
    const kvpot_lookup * lk = inf->lookup && !inf->lookup->hold && inf->lookup->built &&
                              ipot < (int32_t) inf->lookup->layers.size() ? inf->lookup.get() : nullptr;
    const int64_t f0 = lk ? lk->cell0 : 0;
    const int64_t f1 = lk ? f0 + (int64_t) lk->n_fetch*lk->store->shape().block_size : 0;
    auto angle = [&](int64_t c, int64_t h) -> llama_pos {
        return c >= f0 && c < f1 ? lk->angle : kvpot_rope_pos(st, cells, ipot, (int32_t) n_head_kv, (int32_t) h, (uint32_t) c);
    };

    ggml_tensor * qc = ggml_cont(ctx0, q);
    if (qc->type != GGML_TYPE_F32) {
        qc = ggml_cast(ctx0, qc, GGML_TYPE_F32);
    }
    ggml_tensor * q1 = ggml_reshape_3d(ctx0, qc, d, 1, n_head*n_tokens); // row (h, i) at h + n_head*i
    ggml_tensor * bias = nullptr;
    const int64_t c_end = md.cell0 + md.n_cells;
    for (int64_t c0 = md.cell0; c0 < c_end;) {
        // a run: cells whose angle equals c0's in every KV head
        int64_t c1 = c0 + 1;
        for (; c1 < c_end; ++c1) {
            bool same = true;
            for (int64_t h = 0; h < n_head_kv && same; ++h) {
                same = angle(c1, h) == angle(c0, h);
            }
            if (!same) {
                break;
            }
        }
        std::vector<int32_t> delta((size_t) (n_head*n_tokens));
        for (int64_t i = 0; i < n_tokens; ++i) {
            for (int64_t h = 0; h < n_head; ++h) {
                delta[(size_t) (h + n_head*i)] = angle(c0, h / n_group) + md.distance - ub.pos[i];
            }
        }
        ggml_tensor * dt = kvpot_add_i32_input(res, ctx0, std::move(delta)); // [n_head*T]: the query deltas of a run

        ggml_tensor * qr = kvpot_rerope(ctx0, lctx, kv, q1, dt, nullptr, il);
        ggml_tensor * dq = ggml_sub(ctx0, ggml_reshape_3d(ctx0, qr, d, n_head, n_tokens), qc); // [d, n_head, T]
        dq = ggml_permute(ctx0, dq, 0, 2, 1, 3);                                                // [d, T, n_head]
        ggml_tensor * kr = ggml_view_3d(ctx0, k, d, n_head_kv, c1 - c0, k->nb[1], k->nb[2], (size_t) c0*k->nb[2]);
        if (ggml_is_quantized(kr->type)) {
            kr = ggml_cast(ctx0, kr, GGML_TYPE_F32); // a contiguous run of cells: dequantize before permuting
        }
        kr = ggml_permute(ctx0, kr, 0, 2, 1, 3);                                                // [d, n_run, n_head_kv]
        ggml_tensor * b = ggml_mul_mat(ctx0, kr, dq);                                           // [n_run, T, n_head]
        bias = bias ? ggml_concat(ctx0, bias, b, 0) : b;
        c0 = c1;
    }
    bias = ggml_scale(ctx0, bias, kq_scale);
    // zeros around the memory cells and below the ubatch's rows, then the shared mask broadcast over heads
    bias = ggml_pad_ext(ctx0, bias, (int) md.cell0, (int) (n_kv - c_end), 0, (int) (n_pad - n_tokens), 0, 0, 0, 0);
    if (kq_mask->type != GGML_TYPE_F32) {
        bias = ggml_cast(ctx0, bias, kq_mask->type); // the mask's own type (flash attention: F16)
    }
    return ggml_add(ctx0, bias, kq_mask); // [n_kv, n_pad, n_head]
}
