// validation of a keep list before anything moves: shapes, padding, cells
#include "kvpot-compact.h"

#include "kvpot.h"

namespace {

kvpot_check bad(int32_t code, std::string why) {
    return { code, std::move(why) };
}

std::string at(int32_t l, int32_t h, int32_t c) {
    return "layer " + std::to_string(l) + " head " + std::to_string(h) + ": cell " + std::to_string(c);
}

// the pot's layout: one sequence, the K layout the gather assumes, RoPE that CR-RoPE can redo
kvpot_check check_pot(const llama_kv_cache & kv, int32_t n_head_kv, bool cr_rope) {
    const auto & cells   = kvpot_kv_access::cells(kv);
    const auto & hparams = kvpot_kv_access::hparams(kv);
    for (uint32_t i = 0; i < cells.size(); ++i) {
        if (!cells.is_empty(i) && (cells.seq_count(i) != 1 || !cells.seq_has(i, 0))) {
            return bad(KVPOT_ERR_STATE, "the pot holds cells of sequences other than 0");
        }
    }
    for (size_t l = 0; l < kvpot_kv_access::n_layers(kv); ++l) {
        const int32_t il = (int32_t) kvpot_kv_access::il(kv, l);
        if (kvpot_kv_access::k(kv, l)->ne[0] != (int64_t) hparams.n_embd_head_k(il)*n_head_kv) {
            return bad(KVPOT_ERR_STATE, "unsupported K layout in layer " + std::to_string(il));
        }
        if (cr_rope && (!hparams.has_rope(il) || hparams.n_rot(il) != hparams.n_embd_head_k(il))) {
            return bad(KVPOT_ERR_STATE, "CR-RoPE needs full-dimension RoPE in every pot layer (layer " + std::to_string(il) + ")");
        }
    }
    return {};
}

// per-layer budgets: a layer keeping fewer cells ends each of its rows with KVPOT_PAD, the same count per head
kvpot_check live_counts(const int32_t * keep, int32_t n_layer, int32_t n_head_kv, int32_t n_keep, std::vector<int32_t> & n_live) {
    n_live.assign(n_layer, n_keep);
    for (int32_t l = 0; l < n_layer; ++l) {
        for (int32_t h = 0; h < n_head_kv; ++h) {
            const int32_t * row = keep + ((size_t) l*n_head_kv + h)*n_keep;
            int32_t n = n_keep;
            while (n > 0 && row[n - 1] == KVPOT_PAD) {
                --n;
            }
            if (h == 0) {
                n_live[l] = n;
            }
            if (n == 0 || n != n_live[l]) {
                return bad(KVPOT_ERR_ARG, "layer " + std::to_string(l) + ": every KV head must keep the same number of cells, at least one");
            }
        }
    }
    return {};
}

// every live slot names a cell in use that its layer still holds, once per row
kvpot_check check_cells(const llama_kv_cells & cells, const kvpot_state * prev, const int32_t * keep,
                        const std::vector<int32_t> & n_live, int32_t n_head_kv, int32_t n_keep) {
    std::vector<uint32_t> stamp(cells.size(), UINT32_MAX);
    for (int32_t l = 0; l < (int32_t) n_live.size(); ++l) {
        // cells this layer no longer holds (an earlier per-layer compaction) cannot come back
        const uint32_t dead0 = prev ? prev->live_end(l) : 0;
        const uint32_t dead1 = prev ? prev->n_compacted : 0;
        for (int32_t h = 0; h < n_head_kv; ++h) {
            const uint32_t row = (uint32_t) (l*n_head_kv + h);
            for (int32_t j = 0; j < n_live[l]; ++j) {
                const int32_t c = keep[(size_t) row*n_keep + j];
                if (c < 0 || (uint32_t) c >= cells.size() || cells.is_empty(c)) {
                    return bad(KVPOT_ERR_ARG, at(l, h, c) + " is out of range or empty");
                }
                if ((uint32_t) c >= dead0 && (uint32_t) c < dead1) {
                    return bad(KVPOT_ERR_ARG, at(l, h, c) + " is no longer held by this layer");
                }
                if (stamp[c] == row) {
                    return bad(KVPOT_ERR_ARG, at(l, h, c) + " is listed twice");
                }
                stamp[c] = row;
            }
        }
    }
    return {};
}

} // namespace

kvpot_check kvpot_compact_check(const kvpot_pot & pot, const kvpot_state * prev, const int32_t * keep,
                                int32_t n_layer, int32_t n_head_kv, int32_t n_head_pot, int32_t n_keep, bool cr_rope,
                                std::vector<int32_t> & n_live) {
    const llama_kv_cache & kv = *pot.kv;
    const auto & cells = kvpot_kv_access::cells(kv);
    const int32_t n_layer_pot = (int32_t) kvpot_kv_access::n_layers(kv);
    if (!keep) {
        return bad(KVPOT_ERR_ARG, "keep list is NULL");
    }
    if (n_layer != n_layer_pot) {
        return bad(KVPOT_ERR_ARG, "keep list covers " + std::to_string(n_layer) + " layers but the pot has " + std::to_string(n_layer_pot));
    }
    if (n_head_kv != n_head_pot) {
        return bad(KVPOT_ERR_ARG, "keep list covers " + std::to_string(n_head_kv) + " KV heads but the pot has " + std::to_string(n_head_pot));
    }
    const uint32_t n_used = cells.get_used();
    if (n_keep < 1 || (uint32_t) n_keep > n_used) {
        return bad(KVPOT_ERR_ARG, "n_keep " + std::to_string(n_keep) + " is outside 1.." + std::to_string(n_used) + " (cells in use)");
    }
    if (kvpot_check c = check_pot(kv, n_head_kv, cr_rope); !c.ok()) {
        return c;
    }
    if (kvpot_check c = live_counts(keep, n_layer, n_head_kv, n_keep, n_live); !c.ok()) {
        return c;
    }
    return check_cells(cells, prev, keep, n_live, n_head_kv, n_keep);
}
