#include "kvpot-compact-plan.h"

#include <algorithm>

int32_t kvpot_plan_window_start(int32_t p_next, int32_t swa_pos_min, int32_t n_swa) {
    if (swa_pos_min < 0) {
        return p_next;
    }
    return std::max(swa_pos_min, p_next - n_swa);
}

kvpot_compact_plan kvpot_plan_compaction(const int32_t * keep, const std::vector<int32_t> & n_live,
                                         int32_t n_layer, int32_t n_head_kv, int32_t n_keep,
                                         const std::function<int32_t(int32_t, int32_t, int32_t)> & rope_pos_of,
                                         int32_t p_next, int32_t win0, bool cr_rope) {
    const size_t n_slots = (size_t) n_layer*n_head_kv*n_keep;
    kvpot_compact_plan plan;
    plan.idx.assign(keep, keep + n_slots);
    plan.new_rope.resize(n_slots);
    plan.delta.assign(n_slots, 0);

    // a padded slot j >= n_live[l] gathers the row's first kept cell with its RoPE unchanged: a
    // placeholder the attention mask hides from layer l until the next compaction frees it
    std::vector<int32_t> old_rope(n_slots);
    std::vector<int32_t> n_old((size_t) n_layer*n_head_kv, 0); // kept cells older than the window, per row
    int32_t W = 0;
    for (int32_t l = 0; l < n_layer; ++l) {
        for (int32_t h = 0; h < n_head_kv; ++h) {
            const size_t r   = (size_t) l*n_head_kv + h;
            const size_t row = r*n_keep;
            for (int32_t j = 0; j < n_keep; ++j) {
                if (j >= n_live[l]) {
                    plan.idx[row + j] = plan.idx[row];
                }
                old_rope[row + j] = rope_pos_of(l, h, plan.idx[row + j]);
                n_old[r] += j < n_live[l] && old_rope[row + j] < win0;
            }
            W = std::max(W, n_old[r]);
        }
    }

    // CR-RoPE (InfiniPot 3.5): positions restart small. Without a window every head's kept cells
    // take 0..n_keep-1 (win0 == p_next, all cells are older). With one (Gemma-3 iSWA), the window
    // restarts at W, so positions stay below |C| + n_swa however long the stream.
    plan.next = cr_rope ? W + (p_next - win0) : p_next;
    for (int32_t l = 0; l < n_layer; ++l) {
        for (int32_t h = 0; h < n_head_kv; ++h) {
            const size_t r   = (size_t) l*n_head_kv + h;
            const size_t row = r*n_keep;
            int32_t k_old = 0;
            for (int32_t j = 0; j < n_keep; ++j) {
                const size_t i = row + j;
                const int32_t old = old_rope[i];
                if (!cr_rope || j >= n_live[l]) {
                    plan.new_rope[i] = old;
                    continue;
                }
                plan.new_rope[i] = old < win0 ? W - n_old[r] + k_old++ : W + (old - win0);
                plan.delta[i]    = plan.new_rope[i] - old;
            }
        }
    }
    return plan;
}
