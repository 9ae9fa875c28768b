// per-row log-probs inside the graph (kvpot-logprobs.h)
#include "kvpot-logprobs.h"

#include "kvpot.h"
#include "kvpot-barrier.h"
#include "kvpot-hooks.h"
#include "kvpot-input.h"
#include "kvpot-state.h"

#include "llama-batch.h"
#include "llama-graph.h"

#include "ggml.h"
#include "ggml-backend.h"

#include <algorithm>
#include <limits>
#include <string>

namespace {

// the logits are soft-maxed in at most this many blocks of rows: each block's soft-max is freed
// once its targets are picked, so the extra memory is n_vocab * ceil(n_rows / N) floats, not a
// second copy of the logits (Gemma-3: 262,144 x 512 rows x 4 bytes = 512 MiB per copy)
constexpr int64_t LP_MAX_BLOCKS = 16;

} // namespace

std::vector<int32_t> kvpot_out_rows_order(const llama_ubatch & ub) {
    std::vector<int32_t> order;
    order.reserve(ub.n_tokens);
    for (uint32_t i = 0; i < ub.n_tokens; ++i) {
        if (!ub.output || ub.output[i]) {
            order.push_back((int32_t) i);
        }
    }
    if (ub.output) {
        for (uint32_t i = 0; i < ub.n_tokens; ++i) {
            if (!ub.output[i]) {
                order.push_back((int32_t) i);
            }
        }
    }
    return order;
}

bool kvpot_logprobs_wanted(const kvpot_state & st, const llama_ubatch & ub) {
    const kvpot_logprobs_state * lp = st.find_method<kvpot_logprobs_state>();
    if (!lp || lp->targets.empty()) {
        return false;
    }
    for (uint32_t i = 0; i < ub.n_tokens; ++i) {
        const int64_t idx = (int64_t) ub.pos[i] - lp->pos0;
        if (idx >= 0 && idx < (int64_t) lp->targets.size()) {
            return true;
        }
    }
    return false;
}

bool kvpot_hook_out_ids(const llama_ubatch * ubatch, int32_t * data) {
    if (!ubatch || !ubatch->output) {
        return false;
    }
    const std::vector<int32_t> order = kvpot_out_rows_order(*ubatch);
    bool identity = true;
    for (size_t j = 0; j < order.size(); ++j) {
        identity = identity && order[j] == (int32_t) j;
        data[j] = order[j];
    }
    return !identity;
}

void kvpot_logprobs_build(kvpot_state & st, const llama_ubatch & ub, llm_graph_result * res, ggml_context * ctx0, ggml_cgraph * gf) {
    kvpot_logprobs_state * lp = st.find_method<kvpot_logprobs_state>();
    if (!lp) {
        return;
    }
    ggml_tensor * logits = res->get_logits(); // [n_vocab, n_rows]
    if (!logits) {
        return;
    }
    const int64_t n_vocab = logits->ne[0];
    const int64_t n_rows  = logits->ne[1];
    if (n_rows != (int64_t) ub.n_tokens) {
        lp->error = "log-probs need every row of the batch to reach the output head";
        return;
    }
    const std::vector<int32_t> order = kvpot_out_rows_order(ub);
    const int64_t block = (n_rows + LP_MAX_BLOCKS - 1)/LP_MAX_BLOCKS;
    for (int64_t r0 = 0; r0 < n_rows; r0 += block) {
        const int64_t nb = std::min(block, n_rows - r0);
        std::vector<int32_t> pick; // flat index (row in block * n_vocab + target) of each requested row
        for (int64_t r = r0; r < r0 + nb; ++r) {
            const int64_t idx = (int64_t) ub.pos[order[r]] - lp->pos0;
            if (idx < 0 || idx >= (int64_t) lp->targets.size()) {
                continue;
            }
            const llama_token tok = lp->targets[idx];
            if (tok < 0 || tok >= n_vocab) {
                continue;
            }
            pick.push_back((int32_t) ((r - r0)*n_vocab + tok));
            lp->pending_rows.push_back((int32_t) idx);
        }
        if (pick.empty()) {
            continue;
        }
        ggml_tensor * idx_t = kvpot_add_i32_input(res, ctx0, std::move(pick));                         // [n_pick]
        ggml_tensor * rows  = ggml_view_2d(ctx0, logits, n_vocab, nb, logits->nb[1], (size_t) r0*logits->nb[1]);
        ggml_tensor * sm    = ggml_soft_max(ctx0, rows);                                                  // [n_vocab, nb]
        ggml_tensor * got   = ggml_get_rows(ctx0, ggml_reshape_2d(ctx0, sm, 1, n_vocab*nb), idx_t);     // [1, n_pick]
        ggml_tensor * lpt   = ggml_log(ctx0, got);
        ggml_set_output(lpt);
        ggml_build_forward_expand(gf, lpt);
        lp->pending.push_back(lpt);
    }
}

void kvpot_logprobs_state::computed(kvpot_state &) {
    if (pending.empty()) {
        return;
    }
    std::vector<float> buf;
    size_t i = 0;
    for (ggml_tensor * t : pending) {
        buf.resize(ggml_nelements(t));
        ggml_backend_tensor_get(t, buf.data(), 0, ggml_nbytes(t));
        for (size_t j = 0; j < buf.size() && i < pending_rows.size(); ++j, ++i) {
            out[pending_rows[i]] = buf[j];
        }
    }
    pending.clear();
    pending_rows.clear();
}

uint32_t kvpot_logprobs_graph_nodes() {
    // per block: the index input, view, soft-max, reshape, get_rows, log
    return 8u*LP_MAX_BLOCKS;
}

int32_t kvpot_logprobs_request(llama_context * ctx, llama_pos pos0, const llama_token * targets, int32_t n) {
    return kvpot_with_pot(ctx, [&](kvpot_pot &, int32_t) -> int32_t {
        if (n < 0 || (n > 0 && !targets) || pos0 < 0) {
            return kvpot_fail(KVPOT_ERR_ARG, "log-prob request: bad list");
        }
        kvpot_logprobs_state & lp = kvpot_state_get(ctx).method<kvpot_logprobs_state>();
        lp.pos0 = pos0;
        lp.targets.assign(targets, targets + n);
        lp.out.assign(n, std::numeric_limits<float>::quiet_NaN());
        lp.error.clear();
        return 0;
    });
}

int32_t kvpot_logprobs_get(llama_context * ctx, float * out, int32_t n) {
    return kvpot_guarded([&]() -> int32_t {
        kvpot_state *          st = kvpot_state_find(ctx);
        kvpot_logprobs_state * lp = st ? st->find_method<kvpot_logprobs_state>() : nullptr;
        if (!lp || lp->out.empty()) {
            return kvpot_fail(KVPOT_ERR_STATE, "no log-probs were requested");
        }
        if (!lp->error.empty()) {
            return kvpot_fail(KVPOT_ERR_STATE, lp->error);
        }
        if (!out || n != (int32_t) lp->out.size()) {
            return kvpot_fail(KVPOT_ERR_ARG, "log-prob output must hold " + std::to_string(lp->out.size()) + " values");
        }
        std::copy(lp->out.begin(), lp->out.end(), out);
        return 0;
    });
}
