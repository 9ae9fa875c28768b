// kvpot_pot_state_get/set: kvpot's own per-context state as bytes, saved beside llama.cpp's sequence
// state so a saved context reopens with the per-head RoPE positions the next compaction needs.
//
// layout (little-endian, all int32 unless noted):
//   magic 'KVPS', version, n_pot_layer, n_head_kv, n_compacted (uint32), budget, n_compactions,
//   rope_pos[n_pot_layer][n_head_kv][n_compacted], n_live[n_pot_layer] (cells each layer holds)
#include "kvpot.h"
#include "kvpot-barrier.h"
#include "kvpot-pot.h"
#include "kvpot-state.h"

#include "llama-context.h"

#include <cstring>
#include <exception>
#include <string>
#include <vector>

namespace {

constexpr uint32_t SNAP_MAGIC   = 0x5350564b; // "KVPS"
constexpr int32_t  SNAP_VERSION = 2;
constexpr size_t   SNAP_HEADER  = 7*sizeof(int32_t);

struct shape {
    int32_t n_layer   = 0;
    int32_t n_head_kv = 0;
    uint32_t n_used   = 0;
};

shape shape_of(const kvpot_pot & pot, int32_t n_head_kv) {
    shape out;
    out.n_layer   = (int32_t) kvpot_kv_access::n_layers(*pot.kv);
    out.n_head_kv = n_head_kv;
    out.n_used    = kvpot_kv_access::cells(*pot.kv).get_used();
    return out;
}

size_t snap_size(uint32_t n_compacted, const shape & s) {
    return SNAP_HEADER + sizeof(int32_t)*((size_t) s.n_layer*s.n_head_kv*n_compacted + s.n_layer);
}

} // namespace

// every entry point runs behind the C API's exception barrier (kvpot-barrier.h)

int64_t kvpot_pot_state_size(llama_context * ctx) {
    if (!ctx) {
        return kvpot_fail(KVPOT_ERR_ARG, "context is NULL");
    }
    return kvpot_with_pot<int64_t>(ctx, [&](kvpot_pot & pot, int32_t n_head_kv) -> int64_t {
        const kvpot_state * st = kvpot_state_find(ctx);
        return (int64_t) snap_size(st ? st->n_compacted : 0, shape_of(pot, n_head_kv));
    });
}

int64_t kvpot_pot_state_get(llama_context * ctx, uint8_t * dst, size_t size) {
    const int64_t need = kvpot_pot_state_size(ctx);
    if (need < 0) {
        return need;
    }
    if (!dst || size < (size_t) need) {
        return kvpot_fail(KVPOT_ERR_ARG, "state buffer of " + std::to_string(size) + " bytes is smaller than " + std::to_string(need));
    }
    return kvpot_with_pot<int64_t>(ctx, [&](kvpot_pot & pot, int32_t n_head_kv) -> int64_t {
        const shape s = shape_of(pot, n_head_kv);
        const kvpot_state * found = kvpot_state_find(ctx);
        const kvpot_state empty;
        const kvpot_state & st = found ? *found : empty;
        const int32_t head[7] = { (int32_t) SNAP_MAGIC, SNAP_VERSION, s.n_layer, s.n_head_kv, (int32_t) st.n_compacted,
                                  st.budget, st.n_compactions };
        std::memcpy(dst, head, sizeof(head));
        if (!st.rope_pos.empty()) {
            std::memcpy(dst + SNAP_HEADER, st.rope_pos.data(), st.rope_pos.size()*sizeof(llama_pos));
        }
        uint8_t * live = dst + SNAP_HEADER + st.rope_pos.size()*sizeof(llama_pos);
        for (int32_t l = 0; l < s.n_layer; ++l) {
            const int32_t n = (int32_t) st.live_end(l);
            std::memcpy(live + l*sizeof(int32_t), &n, sizeof(n));
        }
        return need;
    });
}

int64_t kvpot_pot_state_set(llama_context * ctx, const uint8_t * src, size_t size) {
    if (!ctx || !src) {
        return kvpot_fail(KVPOT_ERR_ARG, "context or state buffer is NULL");
    }
    return kvpot_with_pot<int64_t>(ctx, [&](kvpot_pot & pot, int32_t n_head_kv) -> int64_t {
        const shape s = shape_of(pot, n_head_kv);
        if (size < SNAP_HEADER) {
            return kvpot_fail(KVPOT_ERR_ARG, "kvpot state is truncated (" + std::to_string(size) + " bytes)");
        }
        int32_t head[7];
        std::memcpy(head, src, sizeof(head));
        if ((uint32_t) head[0] != SNAP_MAGIC || head[1] != SNAP_VERSION) {
            return kvpot_fail(KVPOT_ERR_ARG, "not a kvpot state (bad magic or version)");
        }
        if (head[2] != s.n_layer || head[3] != s.n_head_kv) {
            return kvpot_fail(KVPOT_ERR_ARG, "kvpot state is for " + std::to_string(head[2]) + " pot layers x " +
                              std::to_string(head[3]) + " KV heads, this context has " + std::to_string(s.n_layer) +
                              " x " + std::to_string(s.n_head_kv));
        }
        const int32_t n_compacted = head[4];
        if (n_compacted < 0 || (uint32_t) n_compacted > s.n_used) {
            return kvpot_fail(KVPOT_ERR_ARG, "kvpot state covers " + std::to_string(n_compacted) +
                              " compacted cells but the cache holds " + std::to_string(s.n_used) +
                              " (restore the llama.cpp sequence state first)");
        }
        const size_t n_pos = (size_t) s.n_layer*s.n_head_kv*n_compacted;
        const size_t want  = SNAP_HEADER + (n_pos + s.n_layer)*sizeof(int32_t);
        if (size != want) {
            return kvpot_fail(KVPOT_ERR_ARG, "kvpot state has " + std::to_string(size) + " bytes, expected " + std::to_string(want));
        }
        std::vector<int32_t> n_live(s.n_layer);
        std::memcpy(n_live.data(), src + SNAP_HEADER + n_pos*sizeof(llama_pos), n_live.size()*sizeof(int32_t));
        bool all_live = true;
        for (int32_t n : n_live) {
            if (n < (n_compacted > 0 ? 1 : 0) || n > n_compacted) {
                return kvpot_fail(KVPOT_ERR_ARG, "kvpot state: a layer holds " + std::to_string(n) + " of " +
                                  std::to_string(n_compacted) + " compacted cells");
            }
            all_live = all_live && n == n_compacted;
        }
        kvpot_state & st = kvpot_state_get(ctx);
        st.n_compacted   = (uint32_t) n_compacted;
        st.budget        = head[5];
        st.n_compactions = head[6];
        st.rope_pos.assign(n_pos, 0);
        if (n_pos) {
            std::memcpy(st.rope_pos.data(), src + SNAP_HEADER, n_pos*sizeof(llama_pos));
        }
        st.n_live = all_live ? std::vector<int32_t>() : std::move(n_live);
        st.cells_moved(); // a restored context sets its InfLLM lookup and distance again
        st.force_rebuild = true;
        return 0;
    });
}

int32_t kvpot_pot_settle(llama_context * ctx) {
    if (!ctx) {
        return kvpot_fail(KVPOT_ERR_ARG, "context is NULL");
    }
    return kvpot_guarded([&]() -> int32_t {
        try {
            // llama.cpp applies K-shifts (e.g. the window part's shift after a CR-RoPE compaction) at the
            // next decode; a saved state must hold keys that already match their positions
            ctx->memory_update(false);
        } catch (const std::exception & e) {
            return kvpot_fail(KVPOT_ERR_COMPUTE, std::string("applying pending K-shifts failed: ") + e.what());
        }
        return 0;
    });
}
