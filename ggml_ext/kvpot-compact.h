// pot compaction: gather kept cells (a different set per layer and KV head) to the front, optionally re-rotate keys
#pragma once

#include "kvpot-pot.h"
#include "kvpot-state.h"

#include <string>

// keep: [n_pot_layer][n_head_kv][n_keep] cell indices, already validated; layer l keeps the first
// n_live[l] of each row (the rest is padding: those cells are dead in that layer afterwards).
// returns "" on success, else why it failed; the cache is unchanged when it fails before compute
std::string kvpot_compact(llama_context * lctx, kvpot_state & st, const kvpot_pot & pot,
                          const int32_t * keep, const std::vector<int32_t> & n_live,
                          int32_t n_head_kv, int32_t n_keep, bool cr_rope);

// RoPE position of the token a cell of a pot layer holds for one KV head
llama_pos kvpot_rope_pos(const kvpot_state & st, const llama_kv_cells & cells, int32_t ipot, int32_t n_head_kv,
                         int32_t head, uint32_t cell);
