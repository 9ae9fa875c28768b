// One-vector graph inputs: a 1-D tensor that set_input fills from a host vector. kvpot's graph
// pieces (taps, dead-cell masks, CR-RoPE deltas, InfLLM's fetch deltas and distances) all feed
// the graph this way. Never reusable (can_reuse stays false), so a graph holding one is rebuilt
// for every ubatch.
#pragma once

#include "llama-graph.h"

#include "ggml.h"
#include "ggml-backend.h"

#include <memory>
#include <utility>
#include <vector>

template <typename T, ggml_type TYPE>
class kvpot_input_vec : public llm_graph_input_i {
public:
    kvpot_input_vec(std::vector<T> data, std::shared_ptr<void> keep) : data(std::move(data)), keep(std::move(keep)) {}

    void set_input(const llama_ubatch * ubatch) override {
        GGML_UNUSED(ubatch);
        if (t && t->buffer) {
            ggml_backend_tensor_set(t, data.data(), 0, data.size()*sizeof(T));
        }
    }

    ggml_tensor *         t = nullptr;
    std::vector<T>        data;
    std::shared_ptr<void> keep; // what the graph's custom ops point to, alive as long as the graph
};

// a [data.size()] input tensor of `res`, created in `ctx`
template <typename T, ggml_type TYPE>
ggml_tensor * kvpot_add_input(llm_graph_result * res, ggml_context * ctx, std::vector<T> data,
                              std::shared_ptr<void> keep = nullptr) {
    auto inp = std::make_unique<kvpot_input_vec<T, TYPE>>(std::move(data), std::move(keep));
    inp->t = ggml_new_tensor_1d(ctx, TYPE, (int64_t) inp->data.size());
    ggml_set_input(inp->t);
    ggml_tensor * t = inp->t;
    res->add_input(std::move(inp));
    return t;
}

inline ggml_tensor * kvpot_add_i32_input(llm_graph_result * res, ggml_context * ctx, std::vector<int32_t> data,
                                         std::shared_ptr<void> keep = nullptr) {
    return kvpot_add_input<int32_t, GGML_TYPE_I32>(res, ctx, std::move(data), std::move(keep));
}
