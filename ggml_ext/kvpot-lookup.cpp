// InfLLM's lookup inside the layer (kvpot-lookup.h). Graph piece per pot layer:
//
//   qsum [1, d_k, H] --CUSTOM (CPU: score every block, top n_fetch, read them through the layer's cache)-->
//   fetched F32 [H*m*d_k + H*m*d_v]:  K [d_k, m, H] at RoPE 0 | V [d_v, m, H]      (m = n_fetch * block_size)
//   K --ROPE by (angle - 0)--> CPY into cells [cell0, cell0 + m) of the layer's K; V --CPY--> the V cells
//
// The copies are expanded into the graph before the layer's attention nodes, and ggml runs nodes in the
// order they were expanded (llama.cpp's own cpy_k relies on this), so the attention reads the fetched
// cells. The representatives stay in the store's file and are scored by the store's own part-wise
// topk (bounded memory for a store of any size); ggml has no op that reads a file, so the fetch is a
// custom op and runs on the CPU whatever the backend (with a GPU, the scheduler copies qsum down and
// the fetched rows up: two extra splits per pot layer).
#include "kvpot-lookup.h"
#include "kvpot-blocks.h"
#include "kvpot-cells.h"
#include "kvpot-compact.h"
#include "kvpot-input.h"
#include "kvpot-pot.h"

#include "llama-batch.h"
#include "llama-context.h"
#include "llama-graph.h"

#include "ggml.h"
#include "ggml-backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace {

// InfLLM's lookup query: the ubatch's queries [d, n_head, n_tokens] (after RoPE at their own positions)
// rotated to position `angle`, summed over the rows and over the query heads of each KV group: [1, d, n_head_kv]
ggml_tensor * query_sum(ggml_context * ctx0, llm_graph_result * res, const llama_context * lctx, const llama_kv_cache & kv,
                        const llama_ubatch & ub, ggml_tensor * q, int32_t n_head_kv, llama_pos angle, int32_t il) {
    const int64_t d        = q->ne[0];
    const int64_t n_head   = q->ne[1];
    const int64_t n_tokens = q->ne[2];
    const int64_t n_group  = n_head / n_head_kv;
    std::vector<int32_t> delta((size_t) n_tokens);
    for (int64_t i = 0; i < n_tokens; ++i) {
        delta[i] = angle - ub.pos[i];
    }
    ggml_tensor * dt = kvpot_add_i32_input(res, ctx0, std::move(delta)); // [n_tokens]
    ggml_tensor * qc = ggml_cont(ctx0, q);
    if (qc->type != GGML_TYPE_F32) {
        qc = ggml_cast(ctx0, qc, GGML_TYPE_F32);
    }
    qc = kvpot_rerope(ctx0, lctx, kv, qc, dt, nullptr, il);                       // [d, n_head, n_tokens]
    ggml_tensor * t = ggml_cont(ctx0, ggml_permute(ctx0, qc, 1, 2, 0, 3));        // [n_tokens, d, n_head]
    t = ggml_sum_rows(ctx0, t);                                                   // [1, d, n_head]
    t = ggml_reshape_3d(ctx0, t, d, n_group, n_head_kv);                          // query head h -> KV head h / n_group
    return ggml_sum_rows(ctx0, ggml_cont(ctx0, ggml_permute(ctx0, t, 1, 0, 2, 3))); // [1, d, n_head_kv]
}

// the attention each fetched block receives, for its cache's frequency score (kvpot-block-cache.h). The
// paper sums attention(q_j, k_i) over the lookup's queries j and the block's tokens i, after the
// attention; here it is taken before, from what the lookup holds: the ubatch's mean query per KV head
// (qsum [H][d_k] over n_rows rows and n_group query heads, at RoPE angle n_local: the distance the
// attention sees the blocks at), times the attention's scale of Q·K, soft-maxed over the n_blocks
// fetched blocks' tokens (k [H][m][d_k], m cells per head), averaged over the KV heads, times n_rows.
// So the blocks' shares of one lookup are the paper's but for one factor common to them all: the share
// of each row's attention the memory takes, which needs every row's whole softmax (the attention's own
// cost). out [n_blocks]
void memory_attention(const float * qsum, const float * k, size_t H, size_t m, size_t dk, size_t n_blocks, size_t bs,
                      int32_t n_rows, int32_t n_group, float kq_scale, float * out) {
    const size_t n = n_blocks*bs;
    const double scale = (double) kq_scale / ((double) std::max(n_rows, 1)*std::max(n_group, 1));
    std::vector<double> w(n);
    std::fill_n(out, n_blocks, 0.0f);
    for (size_t h = 0; h < H; ++h) {
        const float * q = qsum + h*dk;
        double top = -INFINITY;
        for (size_t t = 0; t < n; ++t) {
            const float * kt = k + (h*m + t)*dk;
            double dot = 0.0;
            for (size_t i = 0; i < dk; ++i) {
                dot += (double) q[i]*kt[i];
            }
            w[t] = dot*scale;
            top = std::max(top, w[t]);
        }
        double z = 0.0;
        for (size_t t = 0; t < n; ++t) {
            w[t] = std::exp(w[t] - top);
            z += w[t];
        }
        for (size_t t = 0; t < n; ++t) {
            out[t / bs] += (float) (w[t] / z * n_rows / (double) H);
        }
    }
}

// the custom op: runs on one thread (n_tasks 1). A failure leaves zeros in the fetched cells and is
// reported by kvpot_lookup_take after the decode (a graph op cannot fail the compute)
void fetch_blocks(ggml_tensor * dst, int ith, int nth, void * userdata) {
    GGML_UNUSED(nth);
    if (ith != 0) {
        return;
    }
    auto & ly = *static_cast<kvpot_lookup_layer *>(userdata);
    kvpot_lookup & lk = *ly.owner;
    kvpot_block_store & store = *lk.store;
    const auto & shp = store.shape();
    const size_t H = shp.n_head_kv, dk = shp.d_k, dv = shp.d_v, bs = shp.block_size;
    const size_t n = (size_t) lk.n_fetch, m = n*bs;
    float * out = (float *) dst->data;
    const float * q = (const float *) dst->src[0]->data; // [H][d_k], contiguous F32
    std::memset(out, 0, ggml_nbytes(dst));
    ly.chosen.clear();
    ly.pos.assign(m, -1);
    ly.fresh = true;
    std::string why;
    if (store.n_blocks() < n) {
        why = "the block store holds " + std::to_string(store.n_blocks()) + " blocks, the lookup fetches " + std::to_string(n);
    } else if (store.n_blocks() == n) {
        for (uint32_t b = 0; b < n; ++b) {
            ly.chosen.push_back((int32_t) b);
        }
    } else {
        ly.chosen.resize(n);
        if (store.topk(ly.layer, q, (uint32_t) n, ly.chosen.data(), nullptr, why)) {
            std::sort(ly.chosen.begin(), ly.chosen.end());
        } else {
            ly.chosen.clear();
        }
    }
    // each block through the layer's cache, decoded straight into its cells: K [H][m][d_k], V [H][m][d_v]
    float * ko = out;
    float * vo = out + H*m*dk;
    std::vector<uint32_t> got;
    for (size_t j = 0; j < ly.chosen.size() && why.empty(); ++j) {
        const uint8_t * rec = store.record(ly.layer, (uint32_t) ly.chosen[j], why);
        if (!rec) {
            break;
        }
        store.decode(rec, ly.pos.data() + j*bs, nullptr, ko + j*bs*dk, m*dk, vo + j*bs*dv, m*dv);
        got.push_back((uint32_t) ly.chosen[j]);
    }
    std::vector<float> attention(got.size());
    memory_attention(q, ko, H, m, dk, got.size(), bs, ly.n_rows, ly.n_group, ly.kq_scale, attention.data());
    store.settle(ly.layer, got.data(), attention.data(), got.size());
    if (!why.empty() && lk.error.empty()) {
        lk.error = "InfLLM lookup, pot layer " + std::to_string(ly.layer) + ": " + why;
    }
}

} // namespace

void kvpot_lookup_build(ggml_context * ctx0, ggml_cgraph * gf, llm_graph_result * res, const llama_context * lctx,
                        llama_kv_cache & kv, const std::shared_ptr<kvpot_lookup> & lk, ggml_tensor * qsum,
                        int32_t ipot, int32_t il, llama_pos pos0, int32_t n_rows, int32_t n_group, float kq_scale) {
    const auto & shp = lk->store->shape();
    const int64_t H = shp.n_head_kv, dk = shp.d_k, dv = shp.d_v;
    const int64_t m = (int64_t) lk->n_fetch*shp.block_size;
    kvpot_lookup_layer & ly = lk->layers[ipot];
    ly.n_rows   = n_rows;
    ly.n_group  = n_group;
    ly.kq_scale = kq_scale;
    // the keys sit n_local before the ubatch that reads them (the paper's "as if at distance n_local")
    lk->angle = std::max<llama_pos>(0, pos0 - lk->n_local);
    lk->built = true;

    // one RoPE delta per fetched key [H*m]; the input keeps the lookup (the custom op's userdata) alive
    // as long as the graph that calls it
    ggml_tensor * delta = kvpot_add_i32_input(res, ctx0, std::vector<int32_t>((size_t) (H*m), lk->angle), lk);

    ggml_tensor * args[1] = {qsum};
    ggml_tensor * got = ggml_custom_4d(ctx0, GGML_TYPE_F32, H*m*(dk + dv), 1, 1, 1, args, 1, fetch_blocks, 1, &ly);
    ggml_tensor * kf = ggml_view_3d(ctx0, got, dk, 1, H*m, dk*sizeof(float), dk*sizeof(float), 0);
    ggml_tensor * vf = ggml_view_3d(ctx0, got, dv, m, H, dv*sizeof(float), dv*m*sizeof(float), (size_t) (H*m*dk)*sizeof(float));
    ggml_tensor * kr = kvpot_rerope(ctx0, lctx, kv, kf, delta, nullptr, il);          // [d_k, 1, H*m]
    kvpot_store_k(ctx0, gf, kvpot_kv_access::k(kv, ipot), ggml_reshape_3d(ctx0, kr, dk, m, H), lk->cell0);
    kvpot_store_v(ctx0, gf, kvpot_kv_access::v(kv, ipot), vf, lk->cell0, kv.get_size(), kvpot_kv_access::v_trans(kv));
}

void kvpot_infllm_attn(kvpot_state & st, ggml_context * ctx0, ggml_cgraph * gf, llm_graph_result * res,
                       const llama_context * lctx, llama_kv_cache & kv, const llama_ubatch & ub, ggml_tensor * q,
                       int32_t n_head_kv, int32_t ipot, int32_t il, float kq_scale) {
    kvpot_infllm_state * inf = st.find_method<kvpot_infllm_state>();
    if (!inf) {
        return;
    }
    ggml_tensor * qs = nullptr;
    if (inf->lookup && !inf->lookup->hold && ipot < (int32_t) inf->lookup->layers.size()) {
        qs = query_sum(ctx0, res, lctx, kv, ub, q, n_head_kv, inf->lookup->n_local, il);
        kvpot_lookup_build(ctx0, gf, res, lctx, kv, inf->lookup, qs, ipot, il, ub.pos[0], (int32_t) q->ne[2],
                           (int32_t) (q->ne[1] / n_head_kv), kq_scale);
    }
    if (inf->q_on) {
        // captured for the host-side lookup, or to check the in-graph one (the same tensor at the same angle)
        ggml_tensor * t = qs && inf->q_angle == inf->lookup->n_local ? qs : query_sum(ctx0, res, lctx, kv, ub, q, n_head_kv, inf->q_angle, il);
        ggml_set_output(t);
        ggml_build_forward_expand(gf, t);
        inf->pending_q.push_back({ipot, t});
    }
}

void kvpot_infllm_state::computed(kvpot_state & st) {
    if (lookup && lookup->built) {
        // the fetched keys now sit at the lookup's angle in every head of every pot layer
        kvpot_lookup & lk = *lookup;
        lk.built = false;
        const size_t n_pot = lk.layers.size();
        const size_t m = (size_t) lk.n_fetch*lk.store->shape().block_size;
        const size_t n_head_kv = (size_t) lk.n_head_kv;
        if ((size_t) lk.cell0 + m <= st.n_compacted && st.rope_pos.size() == n_pot*n_head_kv*st.n_compacted) {
            for (size_t r = 0; r < n_pot*n_head_kv; ++r) {
                std::fill_n(st.rope_pos.begin() + r*st.n_compacted + lk.cell0, m, lk.angle);
            }
        }
    }
    std::vector<float> buf;
    for (const auto & [ipot, t] : pending_q) {
        if (ipot >= (int32_t) q_acc.size()) {
            q_acc.resize(ipot + 1);
        }
        auto & acc = q_acc[ipot];
        buf.resize(ggml_nelements(t));
        ggml_backend_tensor_get(t, buf.data(), 0, ggml_nbytes(t));
        acc.resize(buf.size(), 0.0f);
        for (size_t i = 0; i < buf.size(); ++i) {
            acc[i] += buf[i];
        }
    }
    pending_q.clear();
}
