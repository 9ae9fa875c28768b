// the kvpot_gate_* / kvpot_memory_* C API: validate, then call kvpot-memory.cpp; behind the exception barrier
#include "kvpot.h"
#include "kvpot-barrier.h"
#include "kvpot-memory.h"
#include "kvpot-pot.h"
#include "kvpot-state.h"

#include "llama-context.h"

#include "ggml-backend.h"

#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr uint32_t MEM_MAGIC   = 0x4d50564b; // "KVPM"
constexpr int32_t  MEM_VERSION = 1;
constexpr size_t   MEM_HEADER  = 6*sizeof(int32_t) + sizeof(int64_t);

size_t layer_floats(const kvpot_memory & m) {
    return (size_t) m.n_head_kv*m.d_k*(m.d_v + 1);
}

size_t state_bytes(const kvpot_memory & m) {
    return MEM_HEADER + sizeof(float)*layer_floats(m)*m.m.size();
}

kvpot_memory_state * find_memory(const llama_context * ctx) {
    kvpot_state * st = kvpot_state_find(ctx);
    return st ? st->find_method<kvpot_memory_state>() : nullptr;
}

} // namespace

int32_t kvpot_gate_set(llama_context * ctx, int32_t n_layer, int32_t d_v, int32_t d_h, int32_t n_head,
                       const float * w1, const float * b1, const float * w2, const float * b2, const float * g) {
    return kvpot_with_pot(ctx, [&](kvpot_pot & pot, int32_t) -> int32_t {
        kvpot_state &        st = kvpot_state_get(ctx);
        kvpot_memory_state & ms = st.method<kvpot_memory_state>();
        st.force_rebuild = true;
        if (!w1 && !b1 && !w2 && !b2 && !g) {
            ms.gate.reset();
            ms.memory.reset();
            return 0;
        }
        std::string err;
        auto gate = kvpot_gate_make(pot, n_layer, d_v, d_h, n_head, w1, b1, w2, b2, g, err);
        if (!gate) {
            return kvpot_fail(KVPOT_ERR_ARG, err);
        }
        auto mem = kvpot_memory_make(pot, err);
        if (!mem) {
            return kvpot_fail(KVPOT_ERR_STATE, err);
        }
        ms.gate   = std::move(gate);
        ms.memory = std::move(mem);
        return 0;
    });
}

int32_t kvpot_memory_fold(llama_context * ctx, const int32_t * cells, int32_t n_layer, int32_t n_head_kv, int32_t n_cells) {
    return kvpot_with_pot(ctx, [&](kvpot_pot & pot, int32_t n_head_pot) -> int32_t {
        kvpot_state *        st = kvpot_state_find(ctx);
        kvpot_memory_state * ms = st ? st->find_method<kvpot_memory_state>() : nullptr;
        if (!ms || !ms->memory) {
            return kvpot_fail(KVPOT_ERR_STATE, "no memory gate is set");
        }
        if (n_cells < 1 || !cells || n_layer != (int32_t) kvpot_kv_access::n_layers(*pot.kv) || n_head_kv != n_head_pot) {
            return kvpot_fail(KVPOT_ERR_ARG, "memory fold: the cells must be [pot layers][KV heads][n >= 1]");
        }
        if (!st->n_live.empty()) {
            return kvpot_fail(KVPOT_ERR_STATE, "memory fold: the pot holds per-layer budgets (dead cells)");
        }
        const llama_kv_cells & kc = kvpot_kv_access::cells(*pot.kv);
        for (int64_t row = 0; row < (int64_t) n_layer*n_head_kv; ++row) {
            std::vector<bool> seen(kc.size(), false);
            for (int32_t i = 0; i < n_cells; ++i) {
                const int32_t c = cells[row*n_cells + i];
                if (c < 0 || (uint32_t) c >= kc.size() || kc.is_empty(c)) {
                    return kvpot_fail(KVPOT_ERR_ARG, "memory fold: cell " + std::to_string(c) + " is not in use");
                }
                if (seen[c]) {
                    return kvpot_fail(KVPOT_ERR_ARG, "memory fold: cell " + std::to_string(c) + " given twice");
                }
                seen[c] = true;
            }
        }
        const bool was_live = ms->live();
        const std::string why = kvpot_memory_fold(ctx, pot, *ms->memory, cells, n_cells);
        if (!why.empty()) {
            return kvpot_fail(KVPOT_ERR_COMPUTE, why);
        }
        // the first fold turns the mix on: the next ubatch graph must be built with it
        st->force_rebuild = st->force_rebuild || !was_live;
        return 0;
    });
}

int64_t kvpot_memory_folded(llama_context * ctx) {
    return kvpot_with_pot<int64_t>(ctx, [&](kvpot_pot &, int32_t) -> int64_t {
        const kvpot_memory_state * ms = find_memory(ctx);
        return ms && ms->memory ? ms->memory->n_folded : 0;
    });
}

int64_t kvpot_memory_state_size(llama_context * ctx) {
    return kvpot_with_pot<int64_t>(ctx, [&](kvpot_pot &, int32_t) -> int64_t {
        const kvpot_memory_state * ms = find_memory(ctx);
        return ms && ms->memory ? (int64_t) state_bytes(*ms->memory) : 0;
    });
}

int64_t kvpot_memory_state_get(llama_context * ctx, uint8_t * dst, size_t size) {
    return kvpot_with_pot<int64_t>(ctx, [&](kvpot_pot &, int32_t) -> int64_t {
        const kvpot_memory_state * ms = find_memory(ctx);
        if (!ms || !ms->memory) {
            return kvpot_fail(KVPOT_ERR_STATE, "no memory gate is set");
        }
        const kvpot_memory & m = *ms->memory;
        const size_t need = state_bytes(m);
        if (!dst || size < need) {
            return kvpot_fail(KVPOT_ERR_ARG, "memory buffer of " + std::to_string(size) + " bytes is smaller than " + std::to_string(need));
        }
        const int32_t head[6] = { (int32_t) MEM_MAGIC, MEM_VERSION, (int32_t) m.m.size(), m.n_head_kv, m.d_k, m.d_v };
        std::memcpy(dst, head, sizeof(head));
        std::memcpy(dst + sizeof(head), &m.n_folded, sizeof(int64_t));
        uint8_t * p = dst + MEM_HEADER;
        for (size_t l = 0; l < m.m.size(); ++l) {
            ggml_backend_tensor_get(m.m[l], p, 0, ggml_nbytes(m.m[l]));
            p += ggml_nbytes(m.m[l]);
            ggml_backend_tensor_get(m.z[l], p, 0, ggml_nbytes(m.z[l]));
            p += ggml_nbytes(m.z[l]);
        }
        return (int64_t) need;
    });
}

int64_t kvpot_memory_state_set(llama_context * ctx, const uint8_t * src, size_t size) {
    return kvpot_with_pot<int64_t>(ctx, [&](kvpot_pot &, int32_t) -> int64_t {
        kvpot_state *        st = kvpot_state_find(ctx);
        kvpot_memory_state * ms = st ? st->find_method<kvpot_memory_state>() : nullptr;
        if (!ms || !ms->memory) {
            return kvpot_fail(KVPOT_ERR_STATE, "no memory gate is set");
        }
        kvpot_memory & m = *ms->memory;
        if (!src || size < MEM_HEADER) {
            return kvpot_fail(KVPOT_ERR_ARG, "memory state is truncated (" + std::to_string(size) + " bytes)");
        }
        int32_t head[6];
        int64_t n_folded = 0;
        std::memcpy(head, src, sizeof(head));
        std::memcpy(&n_folded, src + sizeof(head), sizeof(n_folded));
        if ((uint32_t) head[0] != MEM_MAGIC || head[1] != MEM_VERSION) {
            return kvpot_fail(KVPOT_ERR_ARG, "not a kvpot memory state (bad magic or version)");
        }
        if (head[2] != (int32_t) m.m.size() || head[3] != m.n_head_kv || head[4] != m.d_k || head[5] != m.d_v) {
            return kvpot_fail(KVPOT_ERR_ARG, "memory state is for " + std::to_string(head[2]) + " layers x " +
                              std::to_string(head[3]) + " KV heads of " + std::to_string(head[4]) + "x" +
                              std::to_string(head[5]) + ", this context's differs");
        }
        if (size != state_bytes(m) || n_folded < 0) {
            return kvpot_fail(KVPOT_ERR_ARG, "memory state has " + std::to_string(size) + " bytes, expected " +
                              std::to_string(state_bytes(m)));
        }
        const bool was_live = ms->live();
        const uint8_t * p = src + MEM_HEADER;
        for (size_t l = 0; l < m.m.size(); ++l) {
            ggml_backend_tensor_set(m.m[l], p, 0, ggml_nbytes(m.m[l]));
            p += ggml_nbytes(m.m[l]);
            ggml_backend_tensor_set(m.z[l], p, 0, ggml_nbytes(m.z[l]));
            p += ggml_nbytes(m.z[l]);
        }
        m.n_folded = n_folded;
        st->force_rebuild = st->force_rebuild || was_live != ms->live();
        return 0;
    });
}
