#include "kvpot-memory.h"
#include "kvpot-cells.h"
#include "kvpot-pot.h"

#include "llama-context.h"
#include "llama-graph.h"

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <cmath>
#include <cstdio>

namespace {

struct head_dims {
    int32_t d_k = 0, d_v = 0, n_head = 0, n_head_kv = 0;
};

// the pot layers' attention shapes; empty why when every pot layer has the same
std::string pot_dims(const kvpot_pot & pot, head_dims & out) {
    const llama_kv_cache & kv = *pot.kv;
    const auto & hp = kvpot_kv_access::hparams(kv);
    for (size_t l = 0; l < kvpot_kv_access::n_layers(kv); ++l) {
        const uint32_t il = kvpot_kv_access::il(kv, l);
        const head_dims d = { (int32_t) hp.n_embd_head_k(il), (int32_t) hp.n_embd_head_v(il),
                              (int32_t) hp.n_head(il), (int32_t) hp.n_head_kv(il) };
        if (l > 0 && (d.d_k != out.d_k || d.d_v != out.d_v || d.n_head != out.n_head || d.n_head_kv != out.n_head_kv)) {
            return "the gated memory needs the same head shapes in every pot layer";
        }
        out = d;
    }
    if (!kvpot_kv_access::v(kv, 0)) {
        return "the gated memory needs a V cache";
    }
    // llama.cpp stores quantized K/V Hadamard-rotated; sigma(K) of a rotated key is not sigma of the key
    if (kvpot_kv_access::attn_rot_k(kv)) {
        return "the gated memory needs an f16 or f32 KV cache (this one is quantized and stored rotated)";
    }
    return "";
}

// sigma(x) = ELU(x) + 1
ggml_tensor * elu1(ggml_context * ctx, ggml_tensor * x) {
    return ggml_scale_bias(ctx, ggml_elu(ctx, x), 1.0f, 1.0f);
}

// graph input: the folded cells of every pot layer and KV head (get_rows takes one index row per head)
class kvpot_fold_input : public llm_graph_input_i {
public:
    void set_input(const llama_ubatch * ubatch) override {
        GGML_UNUSED(ubatch);
        ggml_backend_tensor_set(idx, data.data(), 0, data.size()*sizeof(int32_t));
    }
    ggml_tensor * idx = nullptr; // I32 [n_cells, n_head_kv, n_pot]
    std::vector<int32_t> data;
};

} // namespace

std::shared_ptr<kvpot_gate> kvpot_gate_make(const kvpot_pot & pot, int32_t n_pot, int32_t d_v, int32_t d_h, int32_t n_head,
                                            const float * w1, const float * b1, const float * w2, const float * b2,
                                            const float * g, std::string & err) {
    head_dims dims;
    if (std::string why = pot_dims(pot, dims); !why.empty()) {
        err = why;
        return nullptr;
    }
    if (n_pot != (int32_t) kvpot_kv_access::n_layers(*pot.kv)) {
        err = "the memory gate covers " + std::to_string(n_pot) + " layers, the pot has " +
              std::to_string(kvpot_kv_access::n_layers(*pot.kv));
        return nullptr;
    }
    if (d_v != dims.d_v || n_head != dims.n_head) {
        err = "a memory gate for head size " + std::to_string(d_v) + " x " + std::to_string(n_head) +
              " heads does not fit the pot layers (" + std::to_string(dims.d_v) + " x " + std::to_string(dims.n_head) + ")";
        return nullptr;
    }
    if (d_h < 1 || !w1 || !b1 || !w2 || !b2 || !g) {
        err = "memory gate: bad hidden size or weights";
        return nullptr;
    }
    auto gt = std::make_shared<kvpot_gate>();
    gt->d_v = d_v;
    gt->d_h = d_h;
    gt->n_head = n_head;
    for (int32_t l = 0; l < n_pot; ++l) {
        // the buffer type of the layer's K cache (a GPU's memory when the cache is there): the mix runs
        // on the layer's device without copying the weights into every graph
        ggml_context * ctx = gt->weights.ctx_for(ggml_backend_buffer_get_type(kvpot_kv_access::k(*pot.kv, l)->buffer),
                                                 5*(size_t) n_pot);
        gt->w1.push_back(ggml_new_tensor_2d(ctx, GGML_TYPE_F32, d_v, d_h));
        gt->b1.push_back(ggml_new_tensor_1d(ctx, GGML_TYPE_F32, d_h));
        gt->w2.push_back(ggml_new_tensor_2d(ctx, GGML_TYPE_F32, d_h, d_v));
        gt->b2.push_back(ggml_new_tensor_1d(ctx, GGML_TYPE_F32, d_v));
        gt->g .push_back(ggml_new_tensor_2d(ctx, GGML_TYPE_F32, d_v, n_head));
    }
    if (!gt->weights.alloc()) {
        err = "could not allocate the memory gate";
        return nullptr;
    }
    const size_t nw = (size_t) d_h*d_v, ng = (size_t) n_head*d_v;
    for (int32_t l = 0; l < n_pot; ++l) {
        ggml_backend_tensor_set(gt->w1[l], w1 + l*nw,  0, nw*sizeof(float));
        ggml_backend_tensor_set(gt->b1[l], b1 + l*d_h, 0, d_h*sizeof(float));
        ggml_backend_tensor_set(gt->w2[l], w2 + l*nw,  0, nw*sizeof(float));
        ggml_backend_tensor_set(gt->b2[l], b2 + l*d_v, 0, d_v*sizeof(float));
        ggml_backend_tensor_set(gt->g[l],  g  + l*ng,  0, ng*sizeof(float));
    }
    return gt;
}

std::shared_ptr<kvpot_memory> kvpot_memory_make(const kvpot_pot & pot, std::string & err) {
    head_dims dims;
    if (std::string why = pot_dims(pot, dims); !why.empty()) {
        err = why;
        return nullptr;
    }
    const int32_t n_pot = (int32_t) kvpot_kv_access::n_layers(*pot.kv);
    auto mem = std::make_shared<kvpot_memory>();
    mem->d_k = dims.d_k;
    mem->d_v = dims.d_v;
    mem->n_head_kv = dims.n_head_kv;
    for (int32_t l = 0; l < n_pot; ++l) {
        // beside the layer's KV cache: the buffer type of its K (a GPU's memory when the layer is there),
        // so a model split over devices (GPUs, RPC servers) reads each layer's M, z where its attention runs
        ggml_context * ctx = mem->tensors.ctx_for(ggml_backend_buffer_get_type(kvpot_kv_access::k(*pot.kv, l)->buffer),
                                                  2*(size_t) n_pot);
        mem->m.push_back(ggml_new_tensor_3d(ctx, GGML_TYPE_F32, dims.d_k, dims.d_v, dims.n_head_kv));
        mem->z.push_back(ggml_new_tensor_3d(ctx, GGML_TYPE_F32, dims.d_k, 1, dims.n_head_kv));
    }
    if (!mem->tensors.alloc()) {
        err = "could not allocate the gated memory";
        return nullptr;
    }
    for (auto * buf : mem->tensors.bufs) {
        ggml_backend_buffer_clear(buf, 0);
    }
    return mem;
}

std::string kvpot_memory_fold(llama_context * lctx, const kvpot_pot & pot, kvpot_memory & mem,
                              const int32_t * cells, int32_t n_cells) {
    llama_kv_cache & kv = *pot.kv;
    const int32_t  n_pot  = (int32_t) kvpot_kv_access::n_layers(kv);
    const uint32_t n_used = kvpot_kv_access::cells(kv).used_max_p1();
    const int64_t  H = mem.n_head_kv, dk = mem.d_k, dv = mem.d_v;
    const int64_t  kvs = kv.get_size();

    auto inp = std::make_unique<kvpot_fold_input>();
    inp->data.assign(cells, cells + (size_t) n_cells*H*n_pot);

    const bool v_trans = kvpot_kv_access::v_trans(kv);
    std::string why = kvpot_graph_run(lctx, "memory-fold", [&](ggml_context * ctx, ggml_cgraph * gf) {
        inp->idx = ggml_new_tensor_3d(ctx, GGML_TYPE_I32, n_cells, H, n_pot);
        ggml_set_input(inp->idx);
        for (int32_t l = 0; l < n_pot; ++l) {
            ggml_tensor * idx = ggml_view_2d(ctx, inp->idx, n_cells, H, inp->idx->nb[1], l*inp->idx->nb[2]);
            // the segment's keys as the cache holds them (after RoPE) and its values: [dk|dv, n, H] f32
            ggml_tensor * kg = kvpot_cells_k(ctx, kvpot_kv_access::k(kv, l), dk, H, n_used, idx);
            ggml_tensor * vg = kvpot_cells_v(ctx, kvpot_kv_access::v(kv, l), dv, H, n_used, kvs, v_trans, idx);
            // mul_mat contracts dim 0: sigma(K)^T V = mul_mat([n, dk, H], [n, dv, H]) -> [dk, dv, H]
            ggml_tensor * skt = ggml_cont(ctx, ggml_transpose(ctx, elu1(ctx, kg))); // [n, dk, H]
            ggml_tensor * vt  = ggml_cont(ctx, ggml_transpose(ctx, vg));            // [n, dv, H]
            ggml_tensor * dm  = ggml_mul_mat(ctx, skt, vt);
            ggml_prec_set_acc(dm, GGML_PREC_F32);
            ggml_tensor * dz  = ggml_reshape_3d(ctx, ggml_sum_rows(ctx, skt), dk, 1, H); // [1, dk, H] -> [dk, 1, H]
            ggml_build_forward_expand(gf, ggml_cpy(ctx, ggml_add(ctx, mem.m[l], dm), mem.m[l]));
            ggml_build_forward_expand(gf, ggml_cpy(ctx, ggml_add(ctx, mem.z[l], dz), mem.z[l]));
        }
        return std::unique_ptr<llm_graph_input_i>(std::move(inp));
    });
    if (!why.empty()) {
        return why;
    }
    mem.n_folded += n_cells;
    return "";
}

ggml_tensor * kvpot_memory_build(ggml_context * ctx0, const kvpot_gate & gate, const kvpot_memory & mem,
                                 ggml_tensor * q, ggml_tensor * a_dot, float kq_scale, int32_t ipot, int32_t il) {
    const int64_t d_k = q->ne[0], n_head = q->ne[1], n_tokens = q->ne[2];
    const int64_t d_v = mem.d_v;
    char name[GGML_MAX_NAME];

    ggml_tensor * qc = ggml_cont(ctx0, q); // [d_k, n_head, n_tokens]
    const float unscale = kq_scale * sqrtf((float) d_k);
    if (fabsf(unscale - 1.0f) > 1e-6f) {
        qc = ggml_scale(ctx0, qc, unscale);
    }
    snprintf(name, sizeof(name), "kvpot_mem_q-%d", il);
    ggml_set_name(qc, name);

    // sigma(Q) per head: [d_k, n_tokens, n_head]; mul_mat broadcasts M's KV head over its query group
    ggml_tensor * sq  = ggml_cont(ctx0, ggml_permute(ctx0, elu1(ctx0, qc), 0, 2, 1, 3));
    ggml_tensor * num = ggml_mul_mat(ctx0, mem.m[ipot], sq); // [d_v, n_tokens, n_head]
    ggml_tensor * den = ggml_mul_mat(ctx0, mem.z[ipot], sq); // [1,   n_tokens, n_head]
    ggml_prec_set_acc(num, GGML_PREC_F32);
    ggml_prec_set_acc(den, GGML_PREC_F32);
    ggml_tensor * a_mem = ggml_div(ctx0, num, den);
    a_mem = ggml_cont(ctx0, ggml_permute(ctx0, a_mem, 0, 2, 1, 3)); // [d_v, n_head, n_tokens]

    // the memory-gating MLP, shared by the heads of the layer
    ggml_tensor * h = ggml_relu(ctx0, ggml_add(ctx0, ggml_mul_mat(ctx0, gate.w1[ipot], a_mem), gate.b1[ipot])); // [d_h, n_head, n_tokens]
    ggml_tensor * a_tl = ggml_add(ctx0, ggml_mul_mat(ctx0, gate.w2[ipot], h), gate.b2[ipot]);                  // [d_v, n_head, n_tokens]

    // A_com = A_dot + sigmoid(g) (A~ - A_dot), the same as sigmoid(g) A~ + (1 - sigmoid(g)) A_dot
    ggml_tensor * sg  = ggml_reshape_3d(ctx0, ggml_sigmoid(ctx0, gate.g[ipot]), d_v, n_head, 1);
    ggml_tensor * dot = ggml_reshape_3d(ctx0, a_dot, d_v, n_head, n_tokens);
    ggml_tensor * out = ggml_add(ctx0, dot, ggml_mul(ctx0, ggml_sub(ctx0, a_tl, dot), sg)); // [d_v, n_head, n_tokens]
    snprintf(name, sizeof(name), "kvpot_mem_out-%d", il);
    ggml_set_name(out, name);
    GGML_UNUSED(d_k);
    return ggml_reshape_2d(ctx0, out, d_v*n_head, n_tokens);
}

bool kvpot_memory_state::reset(llama_context * lctx, std::string & err) {
    // the memory (M, z) is the document's: freed, then a new, zeroed one beside the model's gate
    memory.reset();
    if (!gate) {
        return false;
    }
    kvpot_pot pot;
    err = kvpot_pot_resolve(lctx, pot);
    if (err.empty()) {
        memory = kvpot_memory_make(pot, err);
    }
    return memory != nullptr;
}

bool kvpot_memory_live(const kvpot_state & st) {
    const kvpot_memory_state * ms = st.find_method<kvpot_memory_state>();
    return ms && ms->live();
}

ggml_tensor * kvpot_memory_attn_out(const kvpot_state & st, ggml_context * ctx0, ggml_tensor * q, ggml_tensor * a_dot,
                                    float kq_scale, int32_t ipot, int32_t il) {
    const kvpot_memory_state * ms = st.find_method<kvpot_memory_state>();
    if (!ms || !ms->live() || ipot < 0 || ipot >= (int32_t) ms->memory->m.size()) {
        return a_dot;
    }
    return kvpot_memory_build(ctx0, *ms->gate, *ms->memory, q, a_dot, kq_scale, ipot, il);
}
