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
#include <cstring>
#include <limits>
#include <string>
#include <unordered_map>
#include <unordered_set>

namespace {

// a chunk's rows reach the output head a block at a time: each block's logits [n_vocab, rows] are
// soft-maxed in place and freed once its targets are picked, so the graph holds one block's logits
// rather than the chunk's (Gemma-3: 262,144 x 512 rows x 4 bytes = 512 MiB; a 64-row block, 64 MiB)
constexpr int64_t LP_BLOCK_ROWS = 64;
// at most this many blocks (larger blocks for ubatches over LP_BLOCK_ROWS * LP_MAX_BLOCKS rows):
// the graph's node pool is sized up front
constexpr int64_t LP_MAX_BLOCKS = 16;
// the output head's nodes from the final norm to the logits, at most (mul_mat, scale, bias, softcap,
// lora terms)
constexpr int64_t LP_MAX_HEAD_NODES = 12;

// the graph's output head: the nodes on a path from the final norm's output (t_embd) to t_logits, in
// graph order, when each is an op that treats rows independently and can be rebuilt on a subset of
// rows; empty when the head is anything else (then the full logits are used as they are)
std::vector<ggml_tensor *> head_nodes(ggml_cgraph * gf, ggml_tensor * embd, ggml_tensor * logits) {
    if (!embd || !logits || embd == logits || !ggml_is_contiguous(embd) || embd->ne[1] != logits->ne[1] ||
        ggml_nrows(embd) != embd->ne[1]) {
        return {};
    }
    const int n = ggml_graph_n_nodes(gf);
    std::unordered_set<const ggml_tensor *> below; // reached from embd
    std::vector<ggml_tensor *> order;
    for (int i = 0; i < n; ++i) {
        ggml_tensor * t = ggml_graph_node(gf, i);
        for (int j = 0; j < GGML_MAX_SRC; ++j) {
            if (t->src[j] && (t->src[j] == embd || below.count(t->src[j]))) {
                below.insert(t);
                order.push_back(t);
                break;
            }
        }
    }
    if (!below.count(logits)) {
        return {};
    }
    std::unordered_set<const ggml_tensor *> head; // of those, the ones logits depends on
    head.insert(logits);
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
        if (!head.count(*it)) {
            continue;
        }
        for (int j = 0; j < GGML_MAX_SRC; ++j) {
            if ((*it)->src[j] && below.count((*it)->src[j])) {
                head.insert((*it)->src[j]);
            }
        }
    }
    std::vector<ggml_tensor *> out;
    for (ggml_tensor * t : order) {
        if (!head.count(t)) {
            continue;
        }
        // the row operand of each op must be on the path, its other operand a weight (or a row-broadcast)
        auto on_path = [&](const ggml_tensor * s) { return s == embd || head.count(s) > 0; };
        bool ok = false;
        switch (t->op) {
            case GGML_OP_MUL_MAT:
                ok = on_path(t->src[1]) && !on_path(t->src[0]);
                break;
            case GGML_OP_ADD:
            case GGML_OP_MUL:
                ok = on_path(t->src[0]) && (on_path(t->src[1]) ? ggml_are_same_shape(t->src[0], t->src[1])
                                                               : ggml_nrows(t->src[1]) == 1);
                break;
            case GGML_OP_SCALE:
            case GGML_OP_UNARY:
                ok = on_path(t->src[0]);
                break;
            default:
                break;
        }
        if (!ok || ggml_nrows(t) != t->ne[1] || (int64_t) out.size() >= LP_MAX_HEAD_NODES) {
            return {};
        }
        out.push_back(t);
    }
    // nothing else in the graph may read the head's inner nodes or the logits
    for (int i = 0; i < n; ++i) {
        ggml_tensor * t = ggml_graph_node(gf, i);
        if (head.count(t)) {
            continue;
        }
        for (int j = 0; j < GGML_MAX_SRC; ++j) {
            if (t->src[j] && head.count(t->src[j])) {
                return {};
            }
        }
    }
    return out;
}

// the head rebuilt on `rows` (a view of embd's columns): the same ops, weights and parameters
ggml_tensor * head_on_rows(ggml_context * ctx0, const std::vector<ggml_tensor *> & head, ggml_tensor * embd, ggml_tensor * rows) {
    std::unordered_map<const ggml_tensor *, ggml_tensor *> copy{{embd, rows}};
    auto map = [&](ggml_tensor * s) {
        auto it = copy.find(s);
        return it == copy.end() ? s : it->second;
    };
    ggml_tensor * cur = nullptr;
    for (ggml_tensor * t : head) {
        switch (t->op) {
            case GGML_OP_MUL_MAT: cur = ggml_mul_mat(ctx0, t->src[0], map(t->src[1]));    break;
            case GGML_OP_ADD:     cur = ggml_add(ctx0, map(t->src[0]), map(t->src[1]));    break;
            case GGML_OP_MUL:     cur = ggml_mul(ctx0, map(t->src[0]), map(t->src[1]));    break;
            case GGML_OP_SCALE:   cur = ggml_scale(ctx0, map(t->src[0]), 1.0f);            break;
            case GGML_OP_UNARY:   cur = ggml_unary(ctx0, map(t->src[0]), ggml_get_unary_op(t)); break;
            default:              GGML_ABORT("kvpot: head_nodes admitted an op head_on_rows cannot rebuild");
        }
        memcpy(cur->op_params, t->op_params, sizeof(t->op_params)); // scale, bias, precision, unary op
        copy[t] = cur;
    }
    return cur;
}

// the graph again without the nodes in `drop`, in the same order, each node computed or not as before.
// Leafs (inputs, weights) come back as the remaining nodes' operands, in the order they were met; the
// dropped nodes read only the embeddings and the head's weights, which the rebuilt head reads again
void graph_without(ggml_cgraph * gf, const std::vector<ggml_tensor *> & drop) {
    const std::unordered_set<const ggml_tensor *> gone(drop.begin(), drop.end());
    std::vector<ggml_tensor *> nodes;
    for (int i = 0; i < ggml_graph_n_nodes(gf); ++i) {
        if (!gone.count(ggml_graph_node(gf, i))) {
            nodes.push_back(ggml_graph_node(gf, i));
        }
    }
    ggml_graph_clear(gf);
    for (ggml_tensor * t : nodes) {
        if (t->flags & GGML_TENSOR_FLAG_COMPUTE) {
            ggml_build_forward_expand(gf, t);
        } else {
            ggml_build_forward_order(gf, t);
        }
    }
}

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
    int64_t n_marked = 0;
    for (uint32_t i = 0; i < ub.n_tokens; ++i) {
        n_marked += (!ub.output || ub.output[i]) ? 1 : 0;
    }

    // where the head can be rebuilt on a subset of rows: the logits llama.cpp copies out come from the
    // marked rows only (they are first, kvpot_out_rows_order), each block of rows gets its own head,
    // and the full-size head leaves the graph; otherwise each block is a view of the full logits
    ggml_tensor * embd = res->get_embd(); // [n_embd, n_rows], the final norm's output
    // (a batch that marks every row needs the full logits anyway: the blocks are views of them)
    const std::vector<ggml_tensor *> head = n_marked < n_rows ? head_nodes(gf, embd, logits) : std::vector<ggml_tensor *>{};
    lp->head_split = !head.empty();
    auto embd_rows = [&](int64_t r0, int64_t nr) {
        return ggml_view_2d(ctx0, embd, embd->ne[0], nr, embd->nb[1], (size_t) r0*embd->nb[1]);
    };
    if (lp->head_split) {
        graph_without(gf, head);
        // at least one row: llama.cpp copies nothing from a ubatch with no marked rows
        ggml_tensor * kept = head_on_rows(ctx0, head, embd, embd_rows(0, std::max<int64_t>(n_marked, 1))); // [n_vocab, n_marked]
        ggml_set_name(kept, "result_output");
        ggml_set_output(kept);
        ggml_build_forward_expand(gf, kept);
        res->t_logits = kept;
    }

    const int64_t block = std::max(LP_BLOCK_ROWS, (n_rows + LP_MAX_BLOCKS - 1)/LP_MAX_BLOCKS);
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
        ggml_tensor * idx_t = kvpot_add_i32_input(res, ctx0, std::move(pick));                           // [n_pick]
        ggml_tensor * rows  = lp->head_split
            ? head_on_rows(ctx0, head, embd, embd_rows(r0, nb))                                            // [n_vocab, nb]
            : ggml_view_2d(ctx0, logits, n_vocab, nb, logits->nb[1], (size_t) r0*logits->nb[1]);
        ggml_tensor * sm    = lp->head_split ? ggml_soft_max_inplace(ctx0, rows) : ggml_soft_max(ctx0, rows); // [n_vocab, nb]
        ggml_tensor * got   = ggml_get_rows(ctx0, ggml_reshape_2d(ctx0, sm, 1, n_vocab*nb), idx_t);       // [1, n_pick]
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
    // per block: the index input, the rows' view, the head's nodes, soft-max, reshape, get_rows, log;
    // and the head on the marked rows
    return (uint32_t) ((8 + LP_MAX_HEAD_NODES)*(LP_MAX_BLOCKS + 1));
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
