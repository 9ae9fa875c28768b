#include "kvpot-pot.h"

#include "llama-context.h"

std::string kvpot_pot_resolve(llama_context * lctx, kvpot_pot & out) {
    if (!lctx) {
        return "context is NULL";
    }
    llama_memory_t mem = llama_get_memory(lctx);
    if (!mem) {
        return "context has no memory";
    }
    out = {};
    if (auto * iswa = dynamic_cast<llama_kv_cache_iswa *>(mem)) {
        out.kv  = iswa->get_base();
        out.swa = iswa->get_swa();
    } else if (auto * kv = dynamic_cast<llama_kv_cache *>(mem)) {
        out.kv = kv;
    } else {
        return "the context's memory is not a llama_kv_cache (recurrent and hybrid models have no pot)";
    }
    if (kvpot_kv_access::n_stream(*out.kv) != 1) {
        return "the pot needs a single KV stream (n_seq_max = 1 or a unified cache)";
    }
    return "";
}

std::vector<int32_t> kvpot_pot_layer_ids(const llama_kv_cache & kv) {
    std::vector<int32_t> ids;
    for (size_t i = 0; i < kvpot_kv_access::n_layers(kv); ++i) {
        ids.push_back((int32_t) kvpot_kv_access::il(kv, i));
    }
    return ids;
}
