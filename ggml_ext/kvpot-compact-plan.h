// compaction planning: where every kept cell goes and which RoPE position it takes (CR-RoPE).
// Pure arithmetic on plain arrays, with no llama.cpp types, so the position rules (where Gemma once
// lost late passkeys) are unit-tested without a model: tests/cpp/test_compact_plan.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

struct kvpot_compact_plan {
    std::vector<int32_t> idx;      // [n_layer][n_head_kv][n_keep] source cell of each slot; a pad repeats the row's first
    std::vector<int32_t> new_rope; // [n_layer][n_head_kv][n_keep] RoPE position of each slot afterwards
    std::vector<int32_t> delta;    // [n_layer][n_head_kv][n_keep] new_rope - old RoPE position (0 without CR-RoPE, for pads)
    int32_t next = 0;              // the position the next token takes
};

// first position of the live sliding window: p_next without one (swa_pos_min < 0 means the window
// part holds no cell); otherwise the window layers still see [max(swa_pos_min, p_next - n_swa), p_next)
int32_t kvpot_plan_window_start(int32_t p_next, int32_t swa_pos_min, int32_t n_swa);

// keep: [n_layer][n_head_kv][n_keep] validated cell indices, layer l's rows live up to n_live[l] (the
// rest is padding). rope_pos_of(l, h, cell): the RoPE position that cell holds for layer l, head h.
// With cr_rope, kept cells older than win0 are packed per head right before W (the most older cells
// any head kept) and cells inside the window keep their distance to its end; without, nothing moves.
kvpot_compact_plan kvpot_plan_compaction(const int32_t * keep, const std::vector<int32_t> & n_live,
                                         int32_t n_layer, int32_t n_head_kv, int32_t n_keep,
                                         const std::function<int32_t(int32_t, int32_t, int32_t)> & rope_pos_of,
                                         int32_t p_next, int32_t win0, bool cr_rope);
