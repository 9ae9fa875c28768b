// per-row log-probs inside the graph (InfiniPot's NuC): log p(target) for every row of a chunk while
// llama.cpp keeps and copies logits only for the rows the batch marks as outputs
#pragma once

#include "kvpot-state.h"
#include "llama.h"

#include <cstdint>
#include <string>
#include <vector>

struct ggml_cgraph;
struct ggml_context;
struct ggml_tensor;
struct llama_ubatch;
class  llm_graph_result;

// a context's log-prob request (kvpot_logprobs_request): the target token for the row at position
// pos0 + i, and its log-prob once computed
struct kvpot_logprobs_state : kvpot_method_state {
    llama_pos                pos0 = 0;
    std::vector<llama_token> targets;
    std::vector<float>       out;   // NaN until computed
    std::string              error;
    // the last graph built computed the output head a block of rows at a time (no full-size logits)
    bool                     head_split = false;

    // the graph's [1, n_pick] log-probs per block of rows, and the index into out of each picked row,
    // in block order
    std::vector<ggml_tensor *> pending;
    std::vector<int32_t>       pending_rows;

    bool active() const override { return !targets.empty(); }
    void clear_pending() override {
        pending.clear();
        pending_rows.clear();
    }
    bool has_pending() const override { return !pending.empty(); }
    // the rows' log-probs into out
    void computed(kvpot_state & st) override;
};

// the order the graph keeps the ubatch's rows in when every row reaches the output head: rows marked
// as outputs first (ascending), then the others (ascending); the identity when every row is marked
std::vector<int32_t> kvpot_out_rows_order(const llama_ubatch & ub);

// true when some row of this ubatch has a requested target (kvpot_logprobs_request)
bool kvpot_logprobs_wanted(const kvpot_state & st, const llama_ubatch & ub);

// adds the log-prob pieces to the graph: the output head runs on a block of rows at a time, its logits
// soft-maxed in place and freed before the next block, and only log p(target) of each requested row,
// one float per row, is a graph output; the model's own head is rebuilt on the marked rows (the logits
// llama.cpp copies out), so no [n_vocab, n_tokens] tensor is computed. A head kvpot cannot rebuild
// (an op other than mul_mat, add, mul, scale, unary between the final norm and the logits) keeps the
// model's full logits and takes the blocks from them
void kvpot_logprobs_build(kvpot_state & st, const llama_ubatch & ub, llm_graph_result * res, ggml_context * ctx0, ggml_cgraph * gf);

// graph nodes the pieces above may add (the graph's node pool is sized up front)
uint32_t kvpot_logprobs_graph_nodes();
