// Tensors kvpot keeps per layer (retaining heads, the memory gate, EdgeInfinite's M and z), each in
// the buffer type of the device that holds the layer using it: a GPU's memory when the model is
// offloaded, host memory on the CPU. Host weights under a GPU layer would be copied into every graph as a split input
// (GGML_SCHED_MAX_SPLIT_INPUTS of them per split), and cut the layer's graph into more splits.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

struct ggml_context;
struct ggml_backend_buffer;
struct ggml_backend_buffer_type;

struct kvpot_weights {
    std::vector<std::pair<ggml_backend_buffer_type *, ggml_context *>> ctxs; // one per buffer type
    std::vector<ggml_backend_buffer *> bufs;

    // the context whose tensors go to buft (made on first use, room for n_max tensors)
    ggml_context * ctx_for(ggml_backend_buffer_type * buft, size_t n_max);
    // allocate every context's tensors in its buffer type; false when one allocation fails
    bool alloc();

    kvpot_weights() = default;
    kvpot_weights(const kvpot_weights &) = delete;
    kvpot_weights & operator=(const kvpot_weights &) = delete;
    ~kvpot_weights();
};
