#include "kvpot-heads.h"

#include "llama-model.h"

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <algorithm>

std::shared_ptr<kvpot_heads> kvpot_heads_make(const llama_model * model, int32_t n_layer, int32_t hidden, int32_t width,
                                              int32_t n_head_kv, int32_t act, const float * fc1, const float * fc2,
                                              std::string & err) {
    const auto & hp = model->hparams;
    if (n_layer != (int32_t) hp.n_layer()) {
        err = "retaining heads cover " + std::to_string(n_layer) + " layers, the model has " + std::to_string(hp.n_layer());
        return nullptr;
    }
    if (hidden < 1 || (act != 0 && act != 1) || !fc1 || !fc2) {
        err = "retaining heads: bad hidden size, activation or weights";
        return nullptr;
    }
    for (int32_t il = 0; il < n_layer; ++il) {
        const int64_t want = (int64_t) hp.n_head(il)*hp.n_embd_head_k(il)
                           + (int64_t) hp.n_head_kv(il)*(hp.n_embd_head_k(il) + hp.n_embd_head_v(il));
        if (want != width || (int32_t) hp.n_head_kv(il) != n_head_kv) {
            err = "retaining heads of width " + std::to_string(width) + " x " + std::to_string(n_head_kv) +
                  " KV heads do not fit layer " + std::to_string(il) + " (width " + std::to_string(want) + ")";
            return nullptr;
        }
    }
    auto h = std::make_shared<kvpot_heads>();
    h->act = act;
    h->n_head_kv = n_head_kv;
    for (int32_t il = 0; il < n_layer; ++il) {
        // the layer's device (a GPU when the model is offloaded): the heads run there without copies
        ggml_context * ctx = h->weights.ctx_for(ggml_backend_dev_buffer_type(model->dev_layer(il)), 4*(size_t) n_layer);
        const int64_t w_q = (int64_t) hp.n_head(il)*hp.n_embd_head_k(il);
        const int64_t w_k = (int64_t) n_head_kv*hp.n_embd_head_k(il);
        h->fc1_q.push_back(ggml_new_tensor_2d(ctx, GGML_TYPE_F32, w_q, hidden));
        h->fc1_k.push_back(ggml_new_tensor_2d(ctx, GGML_TYPE_F32, w_k, hidden));
        h->fc1_v.push_back(ggml_new_tensor_2d(ctx, GGML_TYPE_F32, width - w_q - w_k, hidden));
        h->fc2.push_back(ggml_new_tensor_2d(ctx, GGML_TYPE_F32, hidden, n_head_kv));
    }
    if (!h->weights.alloc()) {
        err = "could not allocate the retaining heads";
        return nullptr;
    }
    const size_t n1 = (size_t) hidden*width, n2 = (size_t) n_head_kv*hidden;
    std::vector<float> part;
    for (int32_t il = 0; il < n_layer; ++il) {
        // fc1's rows are [Q | K | V] columns: each split tensor takes its columns of every row
        const float * w = fc1 + il*n1;
        size_t col = 0;
        for (ggml_tensor * t : {h->fc1_q[il], h->fc1_k[il], h->fc1_v[il]}) {
            const size_t cols = (size_t) t->ne[0];
            part.resize(cols*hidden);
            for (int32_t r = 0; r < hidden; ++r) {
                std::copy(w + r*width + col, w + r*width + col + cols, part.begin() + r*cols);
            }
            ggml_backend_tensor_set(t, part.data(), 0, part.size()*sizeof(float));
            col += cols;
        }
        ggml_backend_tensor_set(h->fc2[il], fc2 + il*n2, 0, n2*sizeof(float));
    }
    return h;
}

ggml_tensor * kvpot_heads_flat(ggml_context * ctx0, ggml_tensor * t) {
    return ggml_is_contiguous(t) ? ggml_reshape_2d(ctx0, t, t->ne[0]*t->ne[1], t->ne[2])
                                 : ggml_cont_2d(ctx0, t, t->ne[0]*t->ne[1], t->ne[2]);
}

ggml_tensor * kvpot_heads_input(ggml_context * ctx0, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v) {
    ggml_tensor * qk = ggml_concat(ctx0, kvpot_heads_flat(ctx0, q), kvpot_heads_flat(ctx0, k), 0);
    return ggml_concat(ctx0, qk, kvpot_heads_flat(ctx0, v), 0); // [width, n_tokens]
}

ggml_tensor * kvpot_heads_build(ggml_context * ctx0, const kvpot_heads & heads, ggml_tensor * q, ggml_tensor * k,
                                ggml_tensor * v, int32_t il) {
    // fc1 · [Q; K; V] as three products on Q, K and V in place: no [width, n_tokens] copy per layer
    ggml_tensor * h = ggml_mul_mat(ctx0, heads.fc1_q[il], kvpot_heads_flat(ctx0, q));      // [hidden, n_tokens]
    h = ggml_add(ctx0, h, ggml_mul_mat(ctx0, heads.fc1_k[il], kvpot_heads_flat(ctx0, k)));
    h = ggml_add(ctx0, h, ggml_mul_mat(ctx0, heads.fc1_v[il], kvpot_heads_flat(ctx0, v)));
    h = heads.act == 0 ? ggml_silu(ctx0, h) : ggml_gelu(ctx0, h);
    return ggml_mul_mat(ctx0, heads.fc2[il], h);                                            // [n_head_kv, n_tokens]
}
