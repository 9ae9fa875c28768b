// the kvpot_* C API: validate every argument, then call into the pot; never throw across the C boundary
#include "kvpot.h"
#include "kvpot-barrier.h"
#include "kvpot-compact.h"
#include "kvpot-pot.h"
#include "kvpot-state.h"

#include "llama-context.h"

#include "ggml.h"
#include "ggml-backend.h"

#include <cmath>
#include <exception>
#include <string>
#include <utility>
#include <vector>

int32_t kvpot_fail(int32_t code, const std::string & msg) {
    kvpot_set_error(msg);
    return code;
}

int32_t kvpot_resolve(llama_context * ctx, kvpot_pot & pot, int32_t & n_head_kv) {
    const std::string why = kvpot_pot_resolve(ctx, pot);
    if (!why.empty()) {
        return kvpot_fail(KVPOT_ERR_STATE, why);
    }
    const auto & hparams = kvpot_kv_access::hparams(*pot.kv);
    n_head_kv = -1;
    for (size_t l = 0; l < kvpot_kv_access::n_layers(*pot.kv); ++l) {
        const int32_t h = (int32_t) hparams.n_head_kv(kvpot_kv_access::il(*pot.kv, l));
        if (n_head_kv >= 0 && h != n_head_kv) {
            return kvpot_fail(KVPOT_ERR_STATE, "the pot needs the same number of KV heads in every pot layer");
        }
        n_head_kv = h;
    }
    if (n_head_kv <= 0) {
        return kvpot_fail(KVPOT_ERR_STATE, "the pot has no layers");
    }
    return 0;
}

namespace {

int64_t layer_row_bytes(const llama_kv_cache & kv, size_t l) {
    int64_t b = (int64_t) kvpot_kv_access::k(kv, l)->nb[1];
    if (ggml_tensor * v = kvpot_kv_access::v(kv, l)) {
        b += (int64_t) ggml_row_size(v->type, v->ne[0]);
    }
    return b;
}

} // namespace

int32_t kvpot_pot_stats_get(llama_context * ctx, kvpot_pot_stats * out) {
    if (!out) {
        return kvpot_fail(KVPOT_ERR_ARG, "stats output is NULL");
    }
    return kvpot_with_pot(ctx, [&](kvpot_pot & pot, int32_t n_head_kv) -> int32_t {
        const llama_kv_cache & kv = *pot.kv;
        const auto & cells = kvpot_kv_access::cells(kv);
        kvpot_state & st = kvpot_state_get(ctx);
        *out = {};
        out->n_pot_layers  = (int32_t) kvpot_kv_access::n_layers(kv);
        out->n_head_kv     = n_head_kv;
        out->n_cells_used  = (int32_t) cells.get_used();
        out->n_cells_total = (int32_t) kv.get_size();
        out->n_swa_used    = pot.swa ? (int32_t) kvpot_kv_access::cells(*pot.swa).get_used() : -1;
        out->budget        = st.budget;
        out->n_compactions = st.n_compactions;
        out->pos_next      = cells.seq_pos_max(0) + 1;
        for (size_t l = 0; l < kvpot_kv_access::n_layers(kv); ++l) {
            const int64_t row = layer_row_bytes(kv, l);
            out->bytes_used  += row * out->n_cells_used;
            out->bytes_total += row * out->n_cells_total;
        }
        return 0;
    });
}

int32_t kvpot_pot_layers(llama_context * ctx, int32_t * il_out, int32_t n_max) {
    return kvpot_with_pot(ctx, [&](kvpot_pot & pot, int32_t n_head_kv) -> int32_t {
        const auto ids = kvpot_pot_layer_ids(*pot.kv);
        if (il_out && n_max > 0) {
            for (int32_t i = 0; i < n_max && i < (int32_t) ids.size(); ++i) {
                il_out[i] = ids[i];
            }
        }
        return (int32_t) ids.size();
    });
}

int32_t kvpot_pot_set_budget(llama_context * ctx, int32_t n_cells) {
    return kvpot_with_pot(ctx, [&](kvpot_pot & pot, int32_t n_head_kv) -> int32_t {
        if (n_cells < 1 || (uint32_t) n_cells > pot.kv->get_size()) {
            return kvpot_fail(KVPOT_ERR_ARG, "budget " + std::to_string(n_cells) + " is outside 1.." + std::to_string(pot.kv->get_size()) + " (the context size)");
        }
        kvpot_state_get(ctx).budget = n_cells;
        return 0;
    });
}

int32_t kvpot_pot_reset(llama_context * ctx) {
    return kvpot_guarded([&]() -> int32_t {
        if (!ctx) {
            return kvpot_fail(KVPOT_ERR_ARG, "context is NULL");
        }
        // a method's part that belongs to the model (Locret's heads, EdgeInfinite's gate) outlives the
        // document being forgotten: its state stays, with the document's part cleared (kvpot_method_state::reset)
        kvpot_state::method_map methods;
        // llama.cpp's last graph may hold what the old state built into it (a method's weights that have
        // since been freed, taps, captures): the next decode must build its graph anew, so a context
        // that had a state keeps one that says so, even when nothing else of it survives
        kvpot_state * old = kvpot_state_find(ctx);
        const bool had_state = old != nullptr;
        if (old) {
            methods = std::move(old->methods);
        }
        kvpot_state_drop(ctx);
        std::string err;
        for (auto it = methods.begin(); it != methods.end();) {
            std::string why;
            if (it->second->reset(ctx, why)) {
                ++it;
            } else {
                it = methods.erase(it);
            }
            if (err.empty()) {
                err = why;
            }
        }
        if (had_state || !methods.empty() || !err.empty()) {
            kvpot_state & st = kvpot_state_get(ctx);
            st.methods = std::move(methods);
            st.force_rebuild = true;
        }
        if (!err.empty()) {
            return kvpot_fail(KVPOT_ERR_STATE, err);
        }
        return 0;
    });
}

int32_t kvpot_pot_compact(llama_context * ctx, const int32_t * keep, int32_t n_layer, int32_t n_head_kv, int32_t n_keep, bool cr_rope) {
    return kvpot_with_pot(ctx, [&](kvpot_pot & pot, int32_t n_head_pot) -> int32_t {
        std::vector<int32_t> n_live;
        const kvpot_check check = kvpot_compact_check(pot, kvpot_state_find(ctx), keep, n_layer, n_head_kv, n_head_pot,
                                                      n_keep, cr_rope, n_live);
        if (!check.ok()) {
            return kvpot_fail(check.code, check.why);
        }
        kvpot_state & st = kvpot_state_get(ctx);
        const std::string why = kvpot_compact(ctx, st, pot, keep, n_live, n_head_kv, n_keep, cr_rope);
        if (!why.empty()) {
            return kvpot_fail(KVPOT_ERR_COMPUTE, why);
        }
        return 0;
    });
}

int32_t kvpot_tap_request(llama_context * ctx, const llama_pos * pos, int32_t n_pos) {
    return kvpot_with_pot(ctx, [&](kvpot_pot & pot, int32_t n_head_kv) -> int32_t {
        if (n_pos < 0 || (n_pos > 0 && !pos)) {
            return kvpot_fail(KVPOT_ERR_ARG, "tap positions: bad list");
        }
        kvpot_state & st = kvpot_state_get(ctx);
        st.tap_pos.assign(pos, pos + n_pos);
        st.tap_acc.assign(n_pos > 0 ? kvpot_kv_access::n_layers(*pot.kv) : 0,
                          std::vector<float>((size_t) n_head_kv*pot.kv->get_size(), 0.0f));
        return 0;
    });
}

int32_t kvpot_tap_mode(llama_context * ctx, int32_t mode) {
    return kvpot_with_pot(ctx, [&](kvpot_pot & pot, int32_t n_head_kv) -> int32_t {
        GGML_UNUSED(pot);
        GGML_UNUSED(n_head_kv);
        if (mode != KVPOT_TAP_ATTENTION && mode != KVPOT_TAP_QK) {
            return kvpot_fail(KVPOT_ERR_ARG, "tap mode must be KVPOT_TAP_ATTENTION (0) or KVPOT_TAP_QK (1), got " +
                                             std::to_string(mode));
        }
        kvpot_state & st = kvpot_state_get(ctx);
        st.force_rebuild = st.force_rebuild || st.tap_mode != mode;
        st.tap_mode = mode;
        return 0;
    });
}

int32_t kvpot_tap_get(llama_context * ctx, int32_t ipot, float * out, int32_t n_head_kv, int32_t n_cells) {
    return kvpot_with_pot(ctx, [&](kvpot_pot & pot, int32_t n_head_pot) -> int32_t {
        kvpot_state & st = kvpot_state_get(ctx);
        if (st.tap_acc.empty()) {
            return kvpot_fail(KVPOT_ERR_STATE, "no score tap was requested");
        }
        if (ipot < 0 || ipot >= (int32_t) st.tap_acc.size()) {
            return kvpot_fail(KVPOT_ERR_ARG, "pot layer " + std::to_string(ipot) + " does not exist (the pot has " + std::to_string(st.tap_acc.size()) + ")");
        }
        const int64_t kv_size = pot.kv->get_size();
        if (!out || n_head_kv != n_head_pot || n_cells < 0 || n_cells > kv_size) {
            return kvpot_fail(KVPOT_ERR_ARG, "tap output: wrong head count or cell count");
        }
        const auto & acc = st.tap_acc[ipot];
        for (int32_t h = 0; h < n_head_kv; ++h) {
            for (int32_t c = 0; c < n_cells; ++c) {
                out[(size_t) h*n_cells + c] = acc[(size_t) h*kv_size + c];
            }
        }
        return 0;
    });
}

int32_t kvpot_pot_read(llama_context * ctx, int32_t ipot, int32_t head, int32_t which, int32_t cell0, int32_t n_cells, float * out, int32_t n_out) {
    return kvpot_with_pot(ctx, [&](kvpot_pot & pot, int32_t n_head_kv) -> int32_t {
        const llama_kv_cache & kv = *pot.kv;
        if (ipot < 0 || ipot >= (int32_t) kvpot_kv_access::n_layers(kv)) {
            return kvpot_fail(KVPOT_ERR_ARG, "pot layer " + std::to_string(ipot) + " does not exist");
        }
        if (head < 0 || head >= n_head_kv || (which != 0 && which != 1)) {
            return kvpot_fail(KVPOT_ERR_ARG, "head or tensor selector out of range");
        }
        const int64_t kv_size = kv.get_size();
        if (cell0 < 0 || n_cells < 0 || cell0 + n_cells > kv_size) {
            return kvpot_fail(KVPOT_ERR_ARG, "cell range out of bounds");
        }
        ggml_tensor * t = which == 0 ? kvpot_kv_access::k(kv, ipot) : kvpot_kv_access::v(kv, ipot);
        if (!t) {
            return kvpot_fail(KVPOT_ERR_STATE, "this layer has no V");
        }
        const int64_t d = t->ne[0] / n_head_kv;
        if (!out || (int64_t) n_out != d*n_cells) {
            return kvpot_fail(KVPOT_ERR_ARG, "output must hold n_cells * head_dim = " + std::to_string(d*n_cells) + " floats");
        }
        const auto * traits = ggml_get_type_traits(t->type);
        if (which == 1 && kvpot_kv_access::v_trans(kv)) {
            if (t->type != GGML_TYPE_F16 && t->type != GGML_TYPE_F32) {
                return kvpot_fail(KVPOT_ERR_STATE, "transposed V of this type cannot be read");
            }
            const size_t es = ggml_element_size(t);
            std::vector<uint8_t> raw(es*n_cells);
            std::vector<float> row(n_cells);
            for (int64_t e = 0; e < d; ++e) {
                ggml_backend_tensor_get(t, raw.data(), ((head*d + e)*kv_size + cell0)*es, raw.size());
                if (t->type == GGML_TYPE_F16) {
                    ggml_fp16_to_fp32_row((const ggml_fp16_t *) raw.data(), row.data(), n_cells);
                } else {
                    memcpy(row.data(), raw.data(), raw.size());
                }
                for (int32_t c = 0; c < n_cells; ++c) {
                    out[(size_t) c*d + e] = row[c];
                }
            }
            return 0;
        }
        const size_t head_bytes = ggml_row_size(t->type, d);
        std::vector<uint8_t> raw(head_bytes);
        for (int32_t c = 0; c < n_cells; ++c) {
            ggml_backend_tensor_get(t, raw.data(), (size_t) (cell0 + c)*t->nb[1] + head*head_bytes, head_bytes);
            if (t->type == GGML_TYPE_F32) {
                memcpy(out + (size_t) c*d, raw.data(), head_bytes);
            } else if (traits->to_float) {
                traits->to_float(raw.data(), out + (size_t) c*d, d);
            } else {
                return kvpot_fail(KVPOT_ERR_STATE, std::string("cannot convert cache type ") + ggml_type_name(t->type));
            }
        }
        return 0;
    });
}

int32_t kvpot_pot_cell_pos(llama_context * ctx, int32_t * out, int32_t n) {
    return kvpot_with_pot(ctx, [&](kvpot_pot & pot, int32_t n_head_kv) -> int32_t {
        const auto & cells = kvpot_kv_access::cells(*pot.kv);
        if (!out || n < 0 || (uint32_t) n > cells.size()) {
            return kvpot_fail(KVPOT_ERR_ARG, "cell range out of bounds");
        }
        for (int32_t i = 0; i < n; ++i) {
            out[i] = cells.is_empty(i) ? -1 : cells.pos_get(i);
        }
        return 0;
    });
}
