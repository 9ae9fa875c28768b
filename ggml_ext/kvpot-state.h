// per-context kvpot state: the pot's per-head positions and layer budgets, the score taps, and each
// method's own state (kvpot_method_state)
#pragma once

#include "llama.h"

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <typeindex>
#include <typeinfo>
#include <unordered_map>
#include <utility>
#include <vector>

struct ggml_tensor;
struct kvpot_state;
struct llama_context;

struct kvpot_tap_out {
    int32_t       ipot;   // index of the pot layer
    ggml_tensor * t;      // [1, n_kv, n_head_kv] attention mass per cell and KV head
    int64_t       n_kv;
};

// one method's per-context state (NuC's log-probs, Locret's heads, EdgeInfinite's memory, InfLLM's
// lookup), declared in the method's own header; kvpot_state holds one of each type in use and reaches
// it through these calls only
struct kvpot_method_state {
    virtual ~kvpot_method_state() = default;

    // every ubatch graph must be built anew while true (the method adds per-ubatch pieces or reads)
    virtual bool active() const = 0;
    // the graph being built takes the method's pieces (the hooks run for it); a reused graph keeps them
    virtual bool in_graph() const { return active(); }
    // the pot's cells moved (compaction, insert, restore): drop what names cells
    virtual void cells_moved() {}
    // a graph is being built: forget the output tensors of the last one
    virtual void clear_pending() {}
    // the graph just computed has outputs of this method to read back (after a scheduler sync)
    virtual bool has_pending() const { return false; }
    // after every computed graph: read the pending outputs back, and anything else that follows a compute
    virtual void computed(kvpot_state & st) { (void) st; }
    // kvpot_pot_reset forgets the document: clear the document's part and return true to stay (what
    // belongs to the model, kept across resets), or return false to go with the document; a failure
    // sets err (and returns false)
    virtual bool reset(llama_context * lctx, std::string & err) {
        (void) lctx;
        (void) err;
        return false;
    }
};

struct kvpot_state {
    // score taps: positions (llama_pos) of the query rows to tap; results summed over those rows
    std::vector<llama_pos>          tap_pos;
    std::vector<std::vector<float>> tap_acc;   // [n_pot_layer][n_head_kv * kv_size]
    int32_t                         tap_mode = 0; // KVPOT_TAP_ATTENTION or KVPOT_TAP_QK (kvpot_tap_mode)
    int32_t                         tap_rows_seen = 0;

    // tensors of the graph being built / just computed
    std::vector<kvpot_tap_out> pending_taps;

    // the next graph must be rebuilt (after a compaction)
    bool force_rebuild = false;

    // per (pot layer, head) RoPE position of the first n_compacted cells; cells at or past
    // n_compacted were written by decode since and their cell position is the RoPE position
    uint32_t               n_compacted = 0;
    std::vector<llama_pos> rope_pos;  // [n_pot_layer][n_head_kv][n_compacted]
    // per pot layer, how many of the first n_compacted cells the layer holds (per-layer budgets):
    // cells [n_live[l], n_compacted) are dead there, masked out of its attention. Empty: all held
    std::vector<int32_t>   n_live;

    // first dead cell of pot layer ipot (n_compacted when it holds them all)
    uint32_t live_end(int32_t ipot) const { return n_live.empty() ? n_compacted : (uint32_t) n_live[ipot]; }

    int32_t budget = 0;
    int32_t n_compactions = 0;

    // the methods' states, one per type, created by method<T>() on first use
    using method_map = std::unordered_map<std::type_index, std::unique_ptr<kvpot_method_state>>;
    method_map methods;

    template <typename T>
    T & method() {
        auto & slot = methods[std::type_index(typeid(T))];
        if (!slot) {
            slot = std::make_unique<T>();
        }
        return static_cast<T &>(*slot);
    }

    // the method's state if one was created, else nullptr (hooks must not create one)
    template <typename T>
    T * find_method() {
        auto it = methods.find(std::type_index(typeid(T)));
        return it == methods.end() ? nullptr : static_cast<T *>(it->second.get());
    }

    template <typename T>
    const T * find_method() const {
        auto it = methods.find(std::type_index(typeid(T)));
        return it == methods.end() ? nullptr : static_cast<const T *>(it->second.get());
    }

    bool active()   const { return taps_or_any(&kvpot_method_state::active); }
    bool in_graph() const { return taps_or_any(&kvpot_method_state::in_graph); }

    // the score taps are requested, or some method answers true to `ask`
    bool taps_or_any(bool (kvpot_method_state::*ask)() const) const {
        if (!tap_pos.empty()) {
            return true;
        }
        for (const auto & [id, m] : methods) {
            if ((m.get()->*ask)()) {
                return true;
            }
        }
        return false;
    }

    void cells_moved() {
        for (auto & [id, m] : methods) {
            m->cells_moved();
        }
    }

    bool has_dead_cells() const {
        for (int32_t n : n_live) {
            if ((uint32_t) n < n_compacted) {
                return true;
            }
        }
        return false;
    }
};

// state of a context, created on first use; the lock guards the registry, not the state
kvpot_state & kvpot_state_get(const llama_context * lctx);
// the state if one exists, else nullptr (hooks must not create state for unrelated contexts)
kvpot_state * kvpot_state_find(const llama_context * lctx);
void kvpot_state_drop(const llama_context * lctx);

// thread-local error message for the C API
void kvpot_set_error(const std::string & msg);
