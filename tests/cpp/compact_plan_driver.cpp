// Drives the compaction planner (ggml_ext/kvpot-compact-plan.cpp) on cases read from stdin and
// prints its plans, so tests/test_compact_plan.py can check them against a reference and the
// CR-RoPE rules with no model and no llama.cpp build.
//
// input, per case (whitespace-separated ints):
//   n_layer n_head_kv n_keep n_cells p_next swa_pos_min n_swa cr_rope
//   n_live[n_layer]
//   keep[n_layer][n_head_kv][n_keep]            (KVPOT_PAD = -1 at row ends)
//   rope[n_layer][n_head_kv][n_cells]           (RoPE position of every cell, per layer and head)
// output, per case: "win0 next", then the lines "idx ...", "rope ...", "delta ..."
#include "kvpot-compact-plan.h"

#include <cstdio>
#include <iostream>
#include <vector>

int main() {
    int32_t n_layer, n_head_kv, n_keep, n_cells, p_next, swa_pos_min, n_swa, cr_rope;
    while (std::cin >> n_layer >> n_head_kv >> n_keep >> n_cells >> p_next >> swa_pos_min >> n_swa >> cr_rope) {
        std::vector<int32_t> n_live(n_layer);
        for (auto & n : n_live) std::cin >> n;
        std::vector<int32_t> keep((size_t) n_layer*n_head_kv*n_keep);
        for (auto & c : keep) std::cin >> c;
        std::vector<int32_t> rope((size_t) n_layer*n_head_kv*n_cells);
        for (auto & p : rope) std::cin >> p;
        if (!std::cin) {
            std::fprintf(stderr, "truncated case\n");
            return 2;
        }
        const int32_t win0 = cr_rope ? kvpot_plan_window_start(p_next, swa_pos_min, n_swa) : p_next;
        const kvpot_compact_plan plan = kvpot_plan_compaction(keep.data(), n_live, n_layer, n_head_kv, n_keep,
            [&](int32_t l, int32_t h, int32_t c) { return rope[((size_t) l*n_head_kv + h)*n_cells + c]; },
            p_next, win0, cr_rope != 0);
        std::printf("%d %d\n", win0, plan.next);
        for (const auto * v : { &plan.idx, &plan.new_rope, &plan.delta }) {
            for (size_t i = 0; i < v->size(); ++i) std::printf(i ? " %d" : "%d", (*v)[i]);
            std::printf("\n");
        }
    }
    return 0;
}
