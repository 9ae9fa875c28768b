// per-row log-probs inside the graph (InfiniPot's NuC): log p(target) for every row of a chunk while
// llama.cpp keeps and copies logits only for the rows the batch marks as outputs
#pragma once

#include "llama.h"

#include <cstdint>
#include <vector>

struct ggml_cgraph;
struct ggml_context;
struct kvpot_state;
struct llama_ubatch;
class  llm_graph_result;

// the order the graph keeps the ubatch's rows in when every row reaches the output head: rows marked
// as outputs first (ascending), then the others (ascending); the identity when every row is marked
std::vector<int32_t> kvpot_out_rows_order(const llama_ubatch & ub);

// true when some row of this ubatch has a requested target (kvpot_logprobs_request)
bool kvpot_logprobs_wanted(const kvpot_state & st, const llama_ubatch & ub);

// adds the log-prob pieces to the graph: the logits [n_vocab, n_tokens] (rows in kvpot_out_rows_order)
// are soft-maxed a block of rows at a time, so no second full-size tensor lives at once, and only
// log p(target) of each requested row, one float per row, is a graph output
void kvpot_logprobs_build(kvpot_state & st, const llama_ubatch & ub, llm_graph_result * res, ggml_context * ctx0, ggml_cgraph * gf);

// after compute: the rows' log-probs into the request's output
void kvpot_logprobs_read(kvpot_state & st);

// graph nodes the pieces above may add (the graph's node pool is sized up front)
uint32_t kvpot_logprobs_graph_nodes();
