// the InfLLM part of the C API: the block store, reading pot cells out at one RoPE angle, inserting
// cells (retrieved blocks, initial tokens) at one RoPE angle, and the per-layer lookup query
#include "kvpot.h"
#include "kvpot-barrier.h"
#include "kvpot-blocks.h"
#include "kvpot-cells.h"
#include "kvpot-compact.h"
#include "kvpot-lookup.h"
#include "kvpot-pot.h"
#include "kvpot-state.h"

#include "llama-context.h"
#include "llama-graph.h"

#include "ggml.h"
#include "ggml-backend.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

struct kvpot_blocks {
    // shared with a context whose graphs fetch from it (kvpot_lookup_set): freeing the handle first is safe
    std::shared_ptr<kvpot_block_store> store;
};

namespace {

int32_t blocks_fail(const std::string & why) {
    return kvpot_fail(KVPOT_ERR_ARG, why);
}

// 1-D I32 graph input for the read/insert graphs
class kvpot_i32_input : public llm_graph_input_i {
public:
    void set_input(const llama_ubatch * ubatch) override {
        GGML_UNUSED(ubatch);
        for (auto & [t, data] : i32) {
            ggml_backend_tensor_set(t, data.data(), 0, data.size()*sizeof(int32_t));
        }
        for (auto & [t, data] : f32) {
            ggml_backend_tensor_set(t, data->data(), 0, ggml_nbytes(t));
        }
    }
    ggml_tensor * add(ggml_context * ctx, std::vector<int32_t> data) {
        ggml_tensor * t = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, (int64_t) data.size());
        ggml_set_input(t);
        i32.emplace_back(t, std::move(data));
        return t;
    }
    std::vector<std::pair<ggml_tensor *, std::vector<int32_t>>>        i32;
    std::vector<std::pair<ggml_tensor *, const std::vector<float> *>>  f32; // host data owned by the caller
};

// build and compute one graph of I32/F32 inputs (kvpot_graph_run); after it returns, tensors marked
// as outputs can be read
std::string run_graph(llama_context * lctx, const std::function<void(ggml_context *, ggml_cgraph *, kvpot_i32_input &)> & build,
                      const std::function<void()> & after) {
    std::string why = kvpot_graph_run(lctx, "block", [&](ggml_context * g, ggml_cgraph * gf) {
        auto inp = std::make_unique<kvpot_i32_input>();
        build(g, gf, *inp);
        return std::unique_ptr<llm_graph_input_i>(std::move(inp));
    });
    if (why.empty()) {
        after();
    }
    return why;
}

// the pot must hold plain cells: no pending per-layer dead cells, no Hadamard-rotated K
std::string check_plain(const kvpot_pot & pot, const kvpot_state & st) {
    if (kvpot_kv_access::attn_rot_k(*pot.kv)) {
        return "block memory needs a K cache without Hadamard rotation (f16 or f32)";
    }
    if (st.has_dead_cells()) {
        return "block memory cannot work on a pot with per-layer budgets";
    }
    return "";
}

} // namespace

kvpot_blocks * kvpot_blocks_open(const char * path, int32_t n_layer, int32_t n_head_kv, int32_t d_k, int32_t d_v,
                                 int32_t block_size, int32_t k_type, int32_t v_type, int32_t max_cached, bool create) {
    try {
        if (!path || n_layer < 0 || n_head_kv < 0 || d_k < 0 || d_v < 0 || block_size < 0 || k_type < 0 || v_type < 0
            || max_cached < 1) {
            kvpot_fail(KVPOT_ERR_ARG, "block store: path is NULL or a size is negative");
            return nullptr;
        }
        std::string why;
        kvpot_blocks_shape shape{(uint32_t) n_layer, (uint32_t) n_head_kv, (uint32_t) d_k, (uint32_t) d_v, (uint32_t) block_size,
                                 (uint32_t) k_type, (uint32_t) v_type};
        kvpot_block_store * s = kvpot_block_store::open(path, shape, (uint32_t) max_cached, create, why);
        if (!s) {
            kvpot_fail(KVPOT_ERR_ARG, why);
            return nullptr;
        }
        auto * out = new kvpot_blocks();
        out->store.reset(s);
        return out;
    } catch (const std::exception & e) {
        kvpot_fail(KVPOT_ERR_STATE, std::string("internal error: ") + e.what());
        return nullptr;
    }
}

void kvpot_blocks_free(kvpot_blocks * bs) {
    delete bs;
}

int32_t kvpot_blocks_info_get(kvpot_blocks * bs, kvpot_blocks_info * out) {
    return kvpot_guarded([&]() -> int32_t {
        if (!bs || !out) {
            return blocks_fail("block store or output is NULL");
        }
        const auto & s = *bs->store;
        out->n_layer      = (int32_t) s.shape().n_layer;
        out->n_head_kv    = (int32_t) s.shape().n_head_kv;
        out->d_k          = (int32_t) s.shape().d_k;
        out->d_v          = (int32_t) s.shape().d_v;
        out->block_size   = (int32_t) s.shape().block_size;
        out->n_blocks     = (int32_t) s.n_blocks();
        out->max_cached   = (int32_t) s.max_cached();
        out->n_cached     = (int32_t) s.n_cached();
        out->record_bytes = (int64_t) s.record_bytes();
        out->file_bytes   = (int64_t) s.file_bytes();
        out->hits         = (int64_t) s.hits();
        out->misses       = (int64_t) s.misses();
        out->k_type       = (int32_t) s.shape().k_type;
        out->v_type       = (int32_t) s.shape().v_type;
        return 0;
    });
}

int32_t kvpot_blocks_append(kvpot_blocks * bs, const int32_t * pos, const float * repr, const float * k, const float * v) {
    return kvpot_guarded([&]() -> int32_t {
        if (!bs) {
            return blocks_fail("block store is NULL");
        }
        std::string why;
        const int64_t b = bs->store->append(pos, repr, k, v, why);
        return b < 0 ? kvpot_fail(KVPOT_ERR_STATE, why) : (int32_t) b;
    });
}

int32_t kvpot_blocks_read(kvpot_blocks * bs, int32_t layer, int32_t block, int32_t * pos, float * repr, float * k, float * v) {
    return kvpot_guarded([&]() -> int32_t {
        if (!bs || layer < 0 || block < 0) {
            return blocks_fail("block store is NULL or the layer/block is negative");
        }
        std::string why;
        return bs->store->read((uint32_t) layer, (uint32_t) block, pos, repr, k, v, why) ? 0 : blocks_fail(why);
    });
}

static_assert(KVPOT_CACHE_FREQ == KVPOT_CACHE_RULE_FREQ && KVPOT_CACHE_LRU == KVPOT_CACHE_RULE_LRU &&
              KVPOT_CACHE_FIFO == KVPOT_CACHE_RULE_FIFO && KVPOT_CACHE_RANDOM == KVPOT_CACHE_RULE_RANDOM,
              "kvpot.h's cache rules are kvpot-block-cache.h's");

int32_t kvpot_blocks_cache_set(kvpot_blocks * bs, int32_t rule, float decay, uint32_t seed) {
    return kvpot_guarded([&]() -> int32_t {
        if (!bs) {
            return blocks_fail("block store is NULL");
        }
        std::string why;
        return bs->store->set_cache((kvpot_cache_rule) rule, (double) decay, seed, why) ? 0 : blocks_fail(why);
    });
}

int32_t kvpot_blocks_cache_lookup(kvpot_blocks * bs, int32_t layer, const int32_t * blocks, const float * attention, int32_t n) {
    return kvpot_guarded([&]() -> int32_t {
        if (!bs || layer < 0 || n < 0 || (n > 0 && !blocks)) {
            return blocks_fail("block store or blocks is NULL, or the layer/count is negative");
        }
        kvpot_block_store & store = *bs->store;
        std::vector<uint32_t> got;
        std::string why;
        for (int32_t i = 0; i < n; ++i) {
            if (blocks[i] < 0 || !store.record((uint32_t) layer, (uint32_t) blocks[i], why)) {
                why = why.empty() ? "block " + std::to_string(blocks[i]) + " is negative" : why;
                break;
            }
            got.push_back((uint32_t) blocks[i]);
        }
        // the blocks read so far are in the cache: the lookup ends for them, the cache back to its size
        store.settle((uint32_t) layer, got.data(), attention, got.size());
        return why.empty() ? n : blocks_fail(why);
    });
}

int32_t kvpot_blocks_cache_get(kvpot_blocks * bs, int32_t layer, int64_t * hits, int64_t * misses, int32_t * blocks,
                               float * scores, int32_t n_out) {
    return kvpot_guarded([&]() -> int32_t {
        if (!bs || layer < 0 || n_out < 0 || layer >= (int32_t) bs->store->shape().n_layer) {
            return blocks_fail("block store is NULL, or the layer is not in the store, or the count is negative");
        }
        const kvpot_block_cache & c = bs->store->cache((uint32_t) layer);
        if (hits)   { *hits = (int64_t) c.hits; }
        if (misses) { *misses = (int64_t) c.misses; }
        std::vector<std::pair<uint32_t, double>> held;
        for (const auto & e : c.entries()) {
            held.emplace_back(e.block, e.score);
        }
        std::sort(held.begin(), held.end());
        for (size_t i = 0; i < held.size() && i < (size_t) n_out; ++i) {
            if (blocks) { blocks[i] = (int32_t) held[i].first; }
            if (scores) { scores[i] = (float) held[i].second; }
        }
        return (int32_t) held.size();
    });
}

int32_t kvpot_blocks_topk(kvpot_blocks * bs, int32_t layer, const float * q, int32_t k, int32_t * out, float * scores) {
    return kvpot_guarded([&]() -> int32_t {
        if (!bs || layer < 0 || k < 0) {
            return blocks_fail("block store is NULL or the layer/k is negative");
        }
        std::string why;
        if (!bs->store->topk((uint32_t) layer, q, (uint32_t) k, out, scores, why)) {
            return blocks_fail(why);
        }
        return k;
    });
}

int32_t kvpot_blocks_truncate(kvpot_blocks * bs, int32_t n_blocks) {
    return kvpot_guarded([&]() -> int32_t {
        if (!bs || n_blocks < 0) {
            return blocks_fail("block store is NULL or the count is negative");
        }
        std::string why;
        return bs->store->limit((uint32_t) n_blocks, why) ? 0 : blocks_fail(why);
    });
}

int32_t kvpot_blocks_sync(kvpot_blocks * bs) {
    return kvpot_guarded([&]() -> int32_t {
        if (!bs) {
            return blocks_fail("block store is NULL");
        }
        std::string why;
        return bs->store->sync(why) ? 0 : kvpot_fail(KVPOT_ERR_STATE, why);
    });
}

int32_t kvpot_pot_read_at(llama_context * ctx, int32_t cell0, int32_t n_cells, llama_pos rope_to, float * k_out, float * v_out) {
    return kvpot_with_pot(ctx, [&](kvpot_pot & pot, int32_t n_head_kv) -> int32_t {
        llama_kv_cache & kv = *pot.kv;
        const llama_kv_cells & cells = kvpot_kv_access::cells(kv);
        kvpot_state & st = kvpot_state_get(ctx);
        if (std::string why = check_plain(pot, st); !why.empty()) {
            return kvpot_fail(KVPOT_ERR_STATE, why);
        }
        const int32_t n_used = (int32_t) cells.used_max_p1();
        if (cell0 < 0 || n_cells < 1 || cell0 + n_cells > n_used || !k_out || !v_out) {
            return kvpot_fail(KVPOT_ERR_ARG, "cells [" + std::to_string(cell0) + ", " + std::to_string(cell0 + n_cells)
                              + ") are not in the pot's " + std::to_string(n_used) + " cells, or an output is NULL");
        }
        for (int32_t c = cell0; c < cell0 + n_cells; ++c) {
            if (cells.is_empty(c)) {
                return kvpot_fail(KVPOT_ERR_ARG, "cell " + std::to_string(c) + " is empty");
            }
        }
        const auto & hparams = kvpot_kv_access::hparams(kv);
        const int32_t n_layer = (int32_t) kvpot_kv_access::n_layers(kv);
        const bool v_trans = kvpot_kv_access::v_trans(kv);
        std::vector<ggml_tensor *> ko(n_layer), vo(n_layer);
        size_t k_off = 0, v_off = 0;
        std::string why = run_graph(ctx, [&](ggml_context * g, ggml_cgraph * gf, kvpot_i32_input & inp) {
            std::vector<int32_t> idx;
            for (int32_t h = 0; h < n_head_kv; ++h) {
                for (int32_t c = 0; c < n_cells; ++c) {
                    idx.push_back(cell0 + c);
                }
            }
            ggml_tensor * idx_t = inp.add(g, idx); // [n_cells * n_head_kv]: the same cells for every head
            for (int32_t l = 0; l < n_layer; ++l) {
                const int32_t il = (int32_t) kvpot_kv_access::il(kv, l);
                const int64_t dk = hparams.n_embd_head_k(il), dv = hparams.n_embd_head_v(il);
                ggml_tensor * k = kvpot_kv_access::k(kv, l);
                ggml_tensor * v = kvpot_kv_access::v(kv, l);
                ggml_tensor * ix = ggml_reshape_2d(g, idx_t, n_cells, n_head_kv);
                std::vector<int32_t> delta;
                for (int32_t h = 0; h < n_head_kv; ++h) {
                    for (int32_t c = 0; c < n_cells; ++c) {
                        delta.push_back(rope_to - kvpot_rope_pos(st, cells, l, n_head_kv, h, (uint32_t) (cell0 + c)));
                    }
                }
                ggml_tensor * dt = inp.add(g, delta);
                // K: [dk, n_cells, n_head_kv] f32, rotated to rope_to
                ggml_tensor * kg = kvpot_cells_k(g, k, dk, n_head_kv, n_used, ix);
                kg = kvpot_rerope(g, ctx, kv, ggml_reshape_3d(g, kg, dk, 1, (int64_t) n_cells*n_head_kv), dt, nullptr, il);
                kg = ggml_cont(g, kg);
                ggml_set_output(kg);
                ggml_build_forward_expand(gf, kg);
                ko[l] = kg;
                // V: [dv, n_cells, n_head_kv] f32
                ggml_tensor * vg = kvpot_cells_v(g, v, dv, n_head_kv, n_used, kv.get_size(), v_trans, ix);
                vg = ggml_cont(g, vg);
                ggml_set_output(vg);
                ggml_build_forward_expand(gf, vg);
                vo[l] = vg;
            }
        }, [&]() {
            for (int32_t l = 0; l < n_layer; ++l) {
                ggml_backend_tensor_get(ko[l], k_out + k_off, 0, ggml_nbytes(ko[l]));
                k_off += ggml_nelements(ko[l]);
                ggml_backend_tensor_get(vo[l], v_out + v_off, 0, ggml_nbytes(vo[l]));
                v_off += ggml_nelements(vo[l]);
            }
        });
        st.force_rebuild = true; // the scheduler ran another graph: llama.cpp must not reuse its last one
        return why.empty() ? 0 : kvpot_fail(KVPOT_ERR_COMPUTE, why);
    });
}

int32_t kvpot_pot_insert(llama_context * ctx, int32_t n_cells, const float * k, const float * v,
                         const llama_pos * rope_from, llama_pos rope_to) {
    return kvpot_with_pot(ctx, [&](kvpot_pot & pot, int32_t n_head_kv) -> int32_t {
        llama_kv_cache & kv = *pot.kv;
        llama_kv_cells & cells = kvpot_kv_access::cells(kv);
        kvpot_state & st = kvpot_state_get(ctx);
        if (std::string why = check_plain(pot, st); !why.empty()) {
            return kvpot_fail(KVPOT_ERR_STATE, why);
        }
        const int32_t n_used = (int32_t) cells.used_max_p1();
        const int32_t kv_size = (int32_t) kv.get_size();
        if (n_cells < 1 || n_used + n_cells > kv_size || !k || !v || !rope_from) {
            return kvpot_fail(KVPOT_ERR_ARG, std::to_string(n_cells) + " cells do not fit after the pot's " + std::to_string(n_used)
                              + " of " + std::to_string(kv_size) + ", or an input is NULL");
        }
        if ((int32_t) cells.get_used() != n_used) {
            return kvpot_fail(KVPOT_ERR_STATE, "the pot has holes; compact it before inserting");
        }
        const llama_pos p_next = n_used ? cells.seq_pos_max(0) + 1 : 0;
        if (p_next < n_used + n_cells) {
            return kvpot_fail(KVPOT_ERR_ARG, "cannot hold more cells than positions read");
        }
        const auto & hparams = kvpot_kv_access::hparams(kv);
        const int32_t n_layer = (int32_t) kvpot_kv_access::n_layers(kv);
        const bool v_trans = kvpot_kv_access::v_trans(kv);
        // host copies of the inputs, one per layer: k [n_head_kv][n_cells][dk], v [n_head_kv][n_cells][dv]
        std::vector<std::vector<float>> kin(n_layer), vin(n_layer);
        size_t k_off = 0, v_off = 0;
        for (int32_t l = 0; l < n_layer; ++l) {
            const int32_t il = (int32_t) kvpot_kv_access::il(kv, l);
            const size_t nk = (size_t) n_head_kv*n_cells*hparams.n_embd_head_k(il);
            const size_t nv = (size_t) n_head_kv*n_cells*hparams.n_embd_head_v(il);
            kin[l].assign(k + k_off, k + k_off + nk);
            vin[l].assign(v + v_off, v + v_off + nv);
            k_off += nk; v_off += nv;
        }
        std::vector<int32_t> delta;
        for (int32_t h = 0; h < n_head_kv; ++h) {
            for (int32_t c = 0; c < n_cells; ++c) {
                delta.push_back(rope_to - rope_from[c]);
            }
        }
        std::string why = run_graph(ctx, [&](ggml_context * g, ggml_cgraph * gf, kvpot_i32_input & inp) {
            ggml_tensor * dt = inp.add(g, delta);
            for (int32_t l = 0; l < n_layer; ++l) {
                const int32_t il = (int32_t) kvpot_kv_access::il(kv, l);
                const int64_t dk = hparams.n_embd_head_k(il), dv = hparams.n_embd_head_v(il);
                ggml_tensor * kc = kvpot_kv_access::k(kv, l);
                ggml_tensor * vc = kvpot_kv_access::v(kv, l);
                ggml_tensor * ki = ggml_new_tensor_3d(g, GGML_TYPE_F32, dk, 1, (int64_t) n_cells*n_head_kv);
                ggml_set_input(ki);
                inp.f32.emplace_back(ki, &kin[l]);
                ggml_tensor * kr = kvpot_rerope(g, ctx, kv, ki, dt, nullptr, il);
                kvpot_store_k(g, gf, kc, ggml_reshape_3d(g, kr, dk, n_cells, n_head_kv), n_used);

                ggml_tensor * vi = ggml_new_tensor_3d(g, GGML_TYPE_F32, dv, n_cells, n_head_kv);
                ggml_set_input(vi);
                inp.f32.emplace_back(vi, &vin[l]);
                kvpot_store_v(g, gf, vc, vi, n_used, kv.get_size(), v_trans);
            }
        }, []() {});
        if (!why.empty()) {
            st.force_rebuild = true;
            return kvpot_fail(KVPOT_ERR_COMPUTE, why);
        }
        // every head's RoPE position of every cell, then the cells take consecutive positions ending
        // before p_next (a cell's own position only serves the causal mask, as after a compaction)
        const uint32_t n_new = (uint32_t) (n_used + n_cells);
        std::vector<llama_pos> rope((size_t) n_layer*n_head_kv*n_new);
        for (int32_t l = 0; l < n_layer; ++l) {
            for (int32_t h = 0; h < n_head_kv; ++h) {
                llama_pos * row = rope.data() + ((size_t) l*n_head_kv + h)*n_new;
                for (int32_t c = 0; c < n_used; ++c) {
                    row[c] = kvpot_rope_pos(st, cells, l, n_head_kv, h, (uint32_t) c);
                }
                for (int32_t c = 0; c < n_cells; ++c) {
                    row[n_used + c] = rope_to;
                }
            }
        }
        st.cells_moved(); // InfLLM's lookup and distance: the caller sets them again
        cells.reset();
        for (uint32_t j = 0; j < n_new; ++j) {
            cells.pos_set(j, p_next - (llama_pos) n_new + (llama_pos) j);
            cells.seq_add(j, 0);
        }
        kvpot_kv_access::set_head(kv, n_new);
        st.rope_pos = std::move(rope);
        st.n_compacted = n_new;
        st.n_live.clear();
        st.force_rebuild = true;
        return 0;
    });
}

int32_t kvpot_query_request(llama_context * ctx, bool on, llama_pos angle) {
    return kvpot_with_pot(ctx, [&](kvpot_pot & pot, int32_t) -> int32_t {
        kvpot_infllm_state & inf = kvpot_state_get(ctx).method<kvpot_infllm_state>();
        if (on && kvpot_kv_access::attn_rot_k(*pot.kv)) {
            return kvpot_fail(KVPOT_ERR_STATE, "lookup queries need a K cache without Hadamard rotation (f16 or f32)");
        }
        inf.q_on = on;
        inf.q_angle = angle;
        inf.q_acc.clear();
        inf.pending_q.clear();
        return 0;
    });
}

int32_t kvpot_query_take(llama_context * ctx, int32_t ipot, float * out, int32_t n_out) {
    return kvpot_with_pot(ctx, [&](kvpot_pot & pot, int32_t) -> int32_t {
        kvpot_infllm_state & inf = kvpot_state_get(ctx).method<kvpot_infllm_state>();
        if (ipot < 0 || ipot >= (int32_t) kvpot_kv_access::n_layers(*pot.kv) || !out) {
            return kvpot_fail(KVPOT_ERR_ARG, "pot layer out of range or output NULL");
        }
        if (ipot >= (int32_t) inf.q_acc.size() || inf.q_acc[ipot].empty()) {
            return 0;
        }
        auto & acc = inf.q_acc[ipot];
        if ((int32_t) acc.size() != n_out) {
            return kvpot_fail(KVPOT_ERR_ARG, "query output must hold " + std::to_string(acc.size()) + " floats");
        }
        memcpy(out, acc.data(), acc.size()*sizeof(float));
        acc.clear();
        return n_out;
    });
}

int32_t kvpot_lookup_set(llama_context * ctx, kvpot_blocks * bs, int32_t cell0, int32_t n_fetch, int32_t n_local) {
    return kvpot_with_pot(ctx, [&](kvpot_pot & pot, int32_t n_head_kv) -> int32_t {
        kvpot_state &        st  = kvpot_state_get(ctx);
        kvpot_infllm_state & inf = st.method<kvpot_infllm_state>();
        if (!bs) {
            inf.lookup.reset();
            st.force_rebuild = true;
            return 0;
        }
        if (std::string why = check_plain(pot, st); !why.empty()) {
            return kvpot_fail(KVPOT_ERR_STATE, why);
        }
        const kvpot_block_store & store = *bs->store;
        const auto & shp = store.shape();
        const llama_kv_cache & kv = *pot.kv;
        const int32_t n_layer = (int32_t) kvpot_kv_access::n_layers(kv);
        const auto & hparams = kvpot_kv_access::hparams(kv);
        if ((int32_t) shp.n_layer != n_layer || (int32_t) shp.n_head_kv != n_head_kv ||
            (int64_t) shp.d_k != (int64_t) hparams.n_embd_head_k(kvpot_kv_access::il(kv, 0)) ||
            (int64_t) shp.d_v != (int64_t) hparams.n_embd_head_v(kvpot_kv_access::il(kv, 0))) {
            return kvpot_fail(KVPOT_ERR_ARG, "the block store's shape does not match the pot");
        }
        const int64_t m = (int64_t) n_fetch*shp.block_size;
        if (n_fetch < 1 || (uint32_t) n_fetch > store.n_blocks() || n_local < 0 || cell0 < 0 ||
            cell0 + m > (int64_t) st.n_compacted) {
            return kvpot_fail(KVPOT_ERR_ARG, "lookup of " + std::to_string(n_fetch) + " of " + std::to_string(store.n_blocks())
                              + " blocks into cells from " + std::to_string(cell0) + ": not within the pot's "
                              + std::to_string(st.n_compacted) + " placed cells");
        }
        auto lk = std::make_shared<kvpot_lookup>();
        lk->store   = bs->store;
        lk->cell0   = cell0;
        lk->n_fetch = n_fetch;
        lk->n_local = n_local;
        lk->n_head_kv = n_head_kv;
        lk->layers.resize(n_layer);
        for (int32_t l = 0; l < n_layer; ++l) {
            lk->layers[l].owner = lk.get();
            lk->layers[l].layer = (uint32_t) l;
        }
        inf.lookup = std::move(lk);
        st.force_rebuild = true;
        return 0;
    });
}

int32_t kvpot_lookup_take(llama_context * ctx, int32_t ipot, int32_t * blocks, int32_t n_blocks, int32_t * pos, int32_t n_pos) {
    return kvpot_with_pot(ctx, [&](kvpot_pot &, int32_t) -> int32_t {
        kvpot_infllm_state & inf = kvpot_state_get(ctx).method<kvpot_infllm_state>();
        if (!inf.lookup) {
            return kvpot_fail(KVPOT_ERR_STATE, "no lookup is set");
        }
        kvpot_lookup & lk = *inf.lookup;
        if (!lk.error.empty()) {
            std::string why = std::move(lk.error);
            lk.error.clear();
            return kvpot_fail(KVPOT_ERR_COMPUTE, why);
        }
        if (ipot < 0 || ipot >= (int32_t) lk.layers.size() || !blocks || !pos) {
            return kvpot_fail(KVPOT_ERR_ARG, "pot layer out of range or output NULL");
        }
        kvpot_lookup_layer & ly = lk.layers[ipot];
        if (!ly.fresh) {
            return 0;
        }
        if ((int32_t) ly.chosen.size() != n_blocks || (int32_t) ly.pos.size() != n_pos) {
            return kvpot_fail(KVPOT_ERR_ARG, "lookup outputs must hold " + std::to_string(ly.chosen.size()) + " blocks and "
                              + std::to_string(ly.pos.size()) + " positions");
        }
        memcpy(blocks, ly.chosen.data(), ly.chosen.size()*sizeof(int32_t));
        memcpy(pos, ly.pos.data(), ly.pos.size()*sizeof(int32_t));
        ly.fresh = false;
        return n_blocks;
    });
}

int32_t kvpot_lookup_hold(llama_context * ctx, bool hold) {
    return kvpot_with_pot(ctx, [&](kvpot_pot &, int32_t) -> int32_t {
        kvpot_infllm_state & inf = kvpot_state_get(ctx).method<kvpot_infllm_state>();
        if (inf.lookup) {
            inf.lookup->hold = hold;
        }
        return 0;
    });
}

int32_t kvpot_distance_set(llama_context * ctx, int32_t cell0, int32_t n_cells, int32_t distance) {
    return kvpot_with_pot(ctx, [&](kvpot_pot & pot, int32_t) -> int32_t {
        kvpot_state &        st  = kvpot_state_get(ctx);
        kvpot_infllm_state & inf = st.method<kvpot_infllm_state>();
        st.force_rebuild = true;
        if (n_cells == 0) {
            inf.distance = {};
            return 0;
        }
        if (std::string why = check_plain(pot, st); !why.empty()) {
            return kvpot_fail(KVPOT_ERR_STATE, why);
        }
        if (kvpot_kv_access::hparams(*pot.kv).attn_soft_cap) {
            // the cap is applied to the logits before the mask, so a bias on the mask is not the paper's logit
            return kvpot_fail(KVPOT_ERR_STATE, "a memory distance needs a model without attention logit soft-capping");
        }
        if (cell0 < 0 || n_cells < 0 || distance < 0 || (int64_t) cell0 + n_cells > (int64_t) st.n_compacted) {
            return kvpot_fail(KVPOT_ERR_ARG, "memory cells from " + std::to_string(cell0) + ", " + std::to_string(n_cells)
                              + " of them, at distance " + std::to_string(distance) + ": not within the pot's "
                              + std::to_string(st.n_compacted) + " placed cells");
        }
        inf.distance = {cell0, n_cells, distance};
        return 0;
    });
}
