#include "kvpot-heads.h"

#include "llama-model.h"

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <algorithm>
#include <utility>

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

void kvpot_heads_state::clear_pending() {
    pending_scores.clear();
    pending_qkv.clear();
    pending_q.clear();
}

bool kvpot_heads_state::has_pending() const {
    return !pending_scores.empty() || !pending_qkv.empty() || !pending_q.empty();
}

void kvpot_heads_state::computed(kvpot_state &) {
    // appended ubatch after ubatch until taken (a decode longer than n_ubatch spans several)
    auto append = [](std::vector<std::vector<float>> & dst, const std::vector<std::pair<int32_t, ggml_tensor *>> & src) {
        for (const auto & [i, t] : src) {
            if (i >= (int32_t) dst.size()) {
                dst.resize(i + 1);
            }
            auto & out = dst[i];
            const size_t n0 = out.size();
            out.resize(n0 + ggml_nelements(t));
            ggml_backend_tensor_get(t, out.data() + n0, 0, ggml_nbytes(t));
        }
    };
    append(scores, pending_scores);
    append(captured_qkv, pending_qkv);
    append(captured_q, pending_q);
    clear_pending();
}

bool kvpot_heads_state::reset(llama_context *, std::string &) {
    scores.clear();
    capture_on = false;
    captured_qkv.clear();
    captured_q.clear();
    clear_pending();
    return heads != nullptr;
}

void kvpot_heads_qkv(kvpot_state & st, ggml_context * ctx0, ggml_cgraph * gf, ggml_tensor * q, ggml_tensor * k,
                     ggml_tensor * v, int32_t il, bool pot_layer) {
    kvpot_heads_state * hs = st.find_method<kvpot_heads_state>();
    if (!hs) {
        return;
    }
    // scored for the pot's layers only: the engine reads no other (Gemma-3's sliding-window layers keep
    // their window whatever the policy says, and their heads would be computed for nothing)
    const bool score = hs->heads && hs->on && il < (int32_t) hs->heads->fc2.size() && pot_layer;
    if (hs->capture_on) {
        // training reads [Q; K; V] of the very tensors the heads read
        ggml_tensor * x = kvpot_heads_input(ctx0, q, k, v); // [width, n_tokens]
        ggml_set_output(x);
        ggml_build_forward_expand(gf, x);
        hs->pending_qkv.push_back({il, x});
    }
    if (score) {
        ggml_tensor * s = kvpot_heads_build(ctx0, *hs->heads, q, k, v, il); // [n_head_kv, n_tokens]
        ggml_set_output(s);
        ggml_build_forward_expand(gf, s);
        hs->pending_scores.push_back({il, s});
    }
}

bool kvpot_heads_capturing(const kvpot_state & st) {
    const kvpot_heads_state * hs = st.find_method<kvpot_heads_state>();
    return hs && hs->capture_on;
}

void kvpot_heads_capture_q(kvpot_state & st, ggml_context * ctx0, ggml_cgraph * gf, ggml_tensor * qr, float kq_scale,
                           int32_t ipot) {
    kvpot_heads_state * hs = st.find_method<kvpot_heads_state>();
    if (!hs || !hs->capture_on) {
        return;
    }
    ggml_tensor * qs = ggml_scale(ctx0, qr, kq_scale); // [d*n_head, n_tap]
    ggml_set_output(qs);
    ggml_build_forward_expand(gf, qs);
    hs->pending_q.push_back({ipot, qs});
}
