#include "kvpot-weights.h"

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"

ggml_context * kvpot_weights::ctx_for(ggml_backend_buffer_type * buft, size_t n_max) {
    for (auto & [b, ctx] : ctxs) {
        if (b == buft) {
            return ctx;
        }
    }
    ggml_init_params params = { ggml_tensor_overhead()*n_max, nullptr, true };
    ctxs.emplace_back(buft, ggml_init(params));
    return ctxs.back().second;
}

bool kvpot_weights::alloc() {
    for (auto & [buft, ctx] : ctxs) {
        ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, buft);
        if (!buf) {
            return false;
        }
        bufs.push_back(buf);
    }
    return true;
}

kvpot_weights::~kvpot_weights() {
    for (auto * buf : bufs) {
        ggml_backend_buffer_free(buf);
    }
    for (auto & [buft, ctx] : ctxs) {
        ggml_free(ctx);
    }
}
