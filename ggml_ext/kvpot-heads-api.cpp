// the Locret part of the C API (kvpot_heads_*, kvpot_capture_*): validate, then set or read the
// context's kvpot_heads_state (kvpot-heads.h); behind the exception barrier
#include "kvpot.h"
#include "kvpot-barrier.h"
#include "kvpot-heads.h"
#include "kvpot-pot.h"
#include "kvpot-state.h"

#include "llama-context.h"

#include <algorithm>
#include <string>
#include <vector>

namespace {

kvpot_heads_state * find_heads(const llama_context * ctx) {
    kvpot_state * st = kvpot_state_find(ctx);
    return st ? st->find_method<kvpot_heads_state>() : nullptr;
}

} // namespace

int32_t kvpot_heads_set(llama_context * ctx, int32_t n_layer, int32_t hidden, int32_t width, int32_t n_head_kv,
                        int32_t act, const float * fc1, const float * fc2) {
    return kvpot_with_pot(ctx, [&](kvpot_pot &, int32_t) -> int32_t {
        kvpot_state &       st = kvpot_state_get(ctx);
        kvpot_heads_state & hs = st.method<kvpot_heads_state>();
        st.force_rebuild = true;
        hs.scores.clear();
        if (!fc1 && !fc2) {
            hs.heads.reset();
            return 0;
        }
        std::string err;
        auto heads = kvpot_heads_make(llama_get_model(ctx), n_layer, hidden, width, n_head_kv, act, fc1, fc2, err);
        if (!heads) {
            return kvpot_fail(KVPOT_ERR_ARG, err);
        }
        hs.heads = std::move(heads);
        return 0;
    });
}

int32_t kvpot_heads_enable(llama_context * ctx, bool on) {
    return kvpot_with_pot(ctx, [&](kvpot_pot &, int32_t) -> int32_t {
        kvpot_state &       st = kvpot_state_get(ctx);
        kvpot_heads_state & hs = st.method<kvpot_heads_state>();
        if (on && !hs.heads) {
            return kvpot_fail(KVPOT_ERR_STATE, "no retaining heads are set");
        }
        st.force_rebuild = st.force_rebuild || hs.on != on;
        hs.on = on;
        return 0;
    });
}

int32_t kvpot_heads_take(llama_context * ctx, int32_t il, float * out, int32_t n_tokens, int32_t n_head_kv) {
    return kvpot_with_pot(ctx, [&](kvpot_pot &, int32_t) -> int32_t {
        kvpot_heads_state * hs = find_heads(ctx);
        if (!hs || !hs->heads) {
            return kvpot_fail(KVPOT_ERR_STATE, "no retaining heads are set");
        }
        if (n_head_kv != hs->heads->n_head_kv || il < 0 || il >= (int32_t) hs->heads->fc2.size()) {
            return kvpot_fail(KVPOT_ERR_ARG, "retaining head scores: bad layer or KV-head count");
        }
        if (il >= (int32_t) hs->scores.size()) {
            return 0;
        }
        auto & s = hs->scores[il];
        const int32_t n_have = (int32_t) (s.size() / n_head_kv);
        if (!out || n_tokens < n_have) {
            return kvpot_fail(KVPOT_ERR_ARG, "retaining head scores: the output holds " + std::to_string(n_tokens) +
                              " tokens, " + std::to_string(n_have) + " were scored");
        }
        std::copy(s.begin(), s.end(), out);
        s.clear();
        return n_have;
    });
}

int32_t kvpot_capture_enable(llama_context * ctx, bool on) {
    return kvpot_with_pot(ctx, [&](kvpot_pot &, int32_t) -> int32_t {
        kvpot_state &       st = kvpot_state_get(ctx);
        kvpot_heads_state & hs = st.method<kvpot_heads_state>();
        st.force_rebuild = st.force_rebuild || hs.capture_on != on;
        hs.capture_on = on;
        hs.captured_qkv.clear();
        hs.captured_q.clear();
        return 0;
    });
}

namespace {

// hand over rows of `row` floats captured for index i, then forget them
int32_t capture_take(std::vector<std::vector<float>> & src, int32_t i, float * out, int32_t n_rows, int64_t row,
                     const char * what) {
    if (i < 0 || row < 1) {
        return kvpot_fail(KVPOT_ERR_ARG, std::string(what) + ": bad layer or row size");
    }
    if (i >= (int32_t) src.size() || src[i].empty()) {
        return 0;
    }
    auto & s = src[i];
    if ((int64_t) s.size() % row != 0) {
        return kvpot_fail(KVPOT_ERR_ARG, std::string(what) + ": " + std::to_string(s.size()) +
                          " captured values are not rows of " + std::to_string(row));
    }
    const int64_t n_have = (int64_t) s.size() / row;
    if (!out || n_rows < n_have) {
        return kvpot_fail(KVPOT_ERR_ARG, std::string(what) + ": the output holds " + std::to_string(n_rows) +
                          " rows, " + std::to_string(n_have) + " were captured");
    }
    std::copy(s.begin(), s.end(), out);
    s.clear();
    return (int32_t) n_have;
}

} // namespace

int32_t kvpot_capture_qkv_take(llama_context * ctx, int32_t il, float * out, int32_t n_tokens, int32_t width) {
    return kvpot_with_pot(ctx, [&](kvpot_pot &, int32_t) -> int32_t {
        kvpot_heads_state * hs = find_heads(ctx);
        if (!hs || !hs->capture_on) {
            return kvpot_fail(KVPOT_ERR_STATE, "capture is off");
        }
        return capture_take(hs->captured_qkv, il, out, n_tokens, width, "captured [Q; K; V]");
    });
}

int32_t kvpot_capture_q_take(llama_context * ctx, int32_t ipot, float * out, int32_t n_rows, int32_t n_head, int32_t d) {
    return kvpot_with_pot(ctx, [&](kvpot_pot &, int32_t) -> int32_t {
        kvpot_heads_state * hs = find_heads(ctx);
        if (!hs || !hs->capture_on) {
            return kvpot_fail(KVPOT_ERR_STATE, "capture is off");
        }
        return capture_take(hs->captured_q, ipot, out, n_rows, (int64_t) n_head*d, "captured query rows");
    });
}
