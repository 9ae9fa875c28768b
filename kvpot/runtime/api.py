"""Raw ctypes declarations of the kvpot_* C API (ggml_ext/kvpot.h), C signature beside each.

Nothing here owns resources; `kvpot.runtime.library` binds these to the loaded libllama.
"""

from __future__ import annotations

import ctypes

c_ctx_p = ctypes.c_void_p  # struct llama_context *
c_i32_p = ctypes.POINTER(ctypes.c_int32)
c_f32_p = ctypes.POINTER(ctypes.c_float)

KVPOT_ERR_ARG = -1
KVPOT_ERR_STATE = -2
KVPOT_ERR_COMPUTE = -3


class kvpot_pot_stats(ctypes.Structure):
    """struct kvpot_pot_stats"""

    _fields_ = [
        ("n_pot_layers", ctypes.c_int32),
        ("n_head_kv", ctypes.c_int32),
        ("n_cells_used", ctypes.c_int32),
        ("n_cells_total", ctypes.c_int32),
        ("n_swa_used", ctypes.c_int32),
        ("budget", ctypes.c_int32),
        ("n_compactions", ctypes.c_int32),
        ("pos_next", ctypes.c_int32),
        ("bytes_used", ctypes.c_int64),
        ("bytes_total", ctypes.c_int64),
    ]


class kvpot_blocks_info(ctypes.Structure):
    """struct kvpot_blocks_info"""

    _fields_ = [
        ("n_layer", ctypes.c_int32),
        ("n_head_kv", ctypes.c_int32),
        ("d_k", ctypes.c_int32),
        ("d_v", ctypes.c_int32),
        ("block_size", ctypes.c_int32),
        ("n_blocks", ctypes.c_int32),
        ("max_cached", ctypes.c_int32),
        ("n_cached", ctypes.c_int32),
        ("record_bytes", ctypes.c_int64),
        ("file_bytes", ctypes.c_int64),
        ("hits", ctypes.c_int64),
        ("misses", ctypes.c_int64),
        ("k_type", ctypes.c_int32),
        ("v_type", ctypes.c_int32),
    ]


c_blocks_p = ctypes.c_void_p  # struct kvpot_blocks *

# (name, restype, argtypes) -- kept in the order of kvpot.h
SIGNATURES: list[tuple[str, object, list]] = [
    # const char * kvpot_version(void);
    ("kvpot_version", ctypes.c_char_p, []),
    # int32_t kvpot_abi_version(void);
    ("kvpot_abi_version", ctypes.c_int32, []),
    # const char * kvpot_llama_commit(void);
    ("kvpot_llama_commit", ctypes.c_char_p, []),
    # const char * kvpot_backends(void);
    ("kvpot_backends", ctypes.c_char_p, []),
    # const char * kvpot_cpu_extra_bufts(void);
    ("kvpot_cpu_extra_bufts", ctypes.c_char_p, []),
    # const char * kvpot_cpu_features(void);
    ("kvpot_cpu_features", ctypes.c_char_p, []),
    # int32_t kvpot_crash_banner_install(const char * text);
    ("kvpot_crash_banner_install", ctypes.c_int32, [ctypes.c_char_p]),
    # int32_t kvpot_log_setup(const char * path);
    ("kvpot_log_setup", ctypes.c_int32, [ctypes.c_char_p]),
    # void kvpot_log_filter(enum ggml_log_level level, const char * text, void * user_data);
    ("kvpot_log_filter", None, [ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p]),
    # int64_t kvpot_model_release_copied(const struct llama_model * model, const char * path);
    ("kvpot_model_release_copied", ctypes.c_int64, [ctypes.c_void_p, ctypes.c_char_p]),
    # bool kvpot_load_progress_release(float progress, void * user_data);
    ("kvpot_load_progress_release", ctypes.c_bool, [ctypes.c_float, ctypes.c_void_p]),
    # const char * kvpot_last_error(void);
    ("kvpot_last_error", ctypes.c_char_p, []),
    # int32_t kvpot_pot_stats_get(struct llama_context * ctx, struct kvpot_pot_stats * out);
    ("kvpot_pot_stats_get", ctypes.c_int32, [c_ctx_p, ctypes.POINTER(kvpot_pot_stats)]),
    # int32_t kvpot_pot_layers(struct llama_context * ctx, int32_t * il_out, int32_t n_max);
    ("kvpot_pot_layers", ctypes.c_int32, [c_ctx_p, c_i32_p, ctypes.c_int32]),
    # int32_t kvpot_pot_set_budget(struct llama_context * ctx, int32_t n_cells);
    ("kvpot_pot_set_budget", ctypes.c_int32, [c_ctx_p, ctypes.c_int32]),
    # int32_t kvpot_pot_reset(struct llama_context * ctx);
    ("kvpot_pot_reset", ctypes.c_int32, [c_ctx_p]),
    # int32_t kvpot_pot_compact(struct llama_context * ctx, const int32_t * keep,
    #                           int32_t n_layer, int32_t n_head_kv, int32_t n_keep, bool cr_rope);
    ("kvpot_pot_compact", ctypes.c_int32, [c_ctx_p, c_i32_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_bool]),
    # int32_t kvpot_tap_request(struct llama_context * ctx, const llama_pos * pos, int32_t n_pos);
    ("kvpot_tap_request", ctypes.c_int32, [c_ctx_p, c_i32_p, ctypes.c_int32]),
    # int32_t kvpot_tap_get(struct llama_context * ctx, int32_t ipot, float * out, int32_t n_head_kv, int32_t n_cells);
    ("kvpot_tap_get", ctypes.c_int32, [c_ctx_p, ctypes.c_int32, c_f32_p, ctypes.c_int32, ctypes.c_int32]),
    # int32_t kvpot_logprobs_request(struct llama_context * ctx, llama_pos pos0, const llama_token * targets, int32_t n);
    ("kvpot_logprobs_request", ctypes.c_int32, [c_ctx_p, ctypes.c_int32, c_i32_p, ctypes.c_int32]),
    # int32_t kvpot_logprobs_get(struct llama_context * ctx, float * out, int32_t n);
    ("kvpot_logprobs_get", ctypes.c_int32, [c_ctx_p, c_f32_p, ctypes.c_int32]),
    # int32_t kvpot_pot_read(struct llama_context * ctx, int32_t ipot, int32_t head, int32_t which,
    #                        int32_t cell0, int32_t n_cells, float * out, int32_t n_out);
    ("kvpot_pot_read", ctypes.c_int32, [c_ctx_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32,
                                        ctypes.c_int32, c_f32_p, ctypes.c_int32]),
    # int32_t kvpot_pot_cell_pos(struct llama_context * ctx, int32_t * out, int32_t n);
    ("kvpot_pot_cell_pos", ctypes.c_int32, [c_ctx_p, c_i32_p, ctypes.c_int32]),
    # int64_t kvpot_pot_state_size(struct llama_context * ctx);
    ("kvpot_pot_state_size", ctypes.c_int64, [c_ctx_p]),
    # int64_t kvpot_pot_state_get(struct llama_context * ctx, uint8_t * dst, size_t size);
    ("kvpot_pot_state_get", ctypes.c_int64, [c_ctx_p, ctypes.c_char_p, ctypes.c_size_t]),
    # int64_t kvpot_pot_state_set(struct llama_context * ctx, const uint8_t * src, size_t size);
    ("kvpot_pot_state_set", ctypes.c_int64, [c_ctx_p, ctypes.c_char_p, ctypes.c_size_t]),
    # int64_t kvpot_state_seq_read_fd(struct llama_context * ctx, int32_t fd, int64_t offset, int64_t size,
    #                                 llama_seq_id seq_id);
    ("kvpot_state_seq_read_fd", ctypes.c_int64, [c_ctx_p, ctypes.c_int32, ctypes.c_int64, ctypes.c_int64, ctypes.c_int32]),
    # int32_t kvpot_pot_settle(struct llama_context * ctx);
    ("kvpot_pot_settle", ctypes.c_int32, [c_ctx_p]),
    # int32_t kvpot_heads_set(struct llama_context * ctx, int32_t n_layer, int32_t hidden, int32_t width,
    #                         int32_t n_head_kv, int32_t act, const float * fc1, const float * fc2);
    ("kvpot_heads_set", ctypes.c_int32, [c_ctx_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32,
                                         ctypes.c_int32, c_f32_p, c_f32_p]),
    # int32_t kvpot_heads_enable(struct llama_context * ctx, bool on);
    ("kvpot_heads_enable", ctypes.c_int32, [c_ctx_p, ctypes.c_bool]),
    # int32_t kvpot_heads_take(struct llama_context * ctx, int32_t il, float * out, int32_t n_tokens, int32_t n_head_kv);
    ("kvpot_heads_take", ctypes.c_int32, [c_ctx_p, ctypes.c_int32, c_f32_p, ctypes.c_int32, ctypes.c_int32]),
    # int32_t kvpot_capture_enable(struct llama_context * ctx, bool on);
    ("kvpot_capture_enable", ctypes.c_int32, [c_ctx_p, ctypes.c_bool]),
    # int32_t kvpot_capture_qkv_take(struct llama_context * ctx, int32_t il, float * out, int32_t n_tokens, int32_t width);
    ("kvpot_capture_qkv_take", ctypes.c_int32, [c_ctx_p, ctypes.c_int32, c_f32_p, ctypes.c_int32, ctypes.c_int32]),
    # int32_t kvpot_capture_q_take(struct llama_context * ctx, int32_t ipot, float * out, int32_t n_rows,
    #                              int32_t n_head, int32_t d);
    ("kvpot_capture_q_take", ctypes.c_int32, [c_ctx_p, ctypes.c_int32, c_f32_p, ctypes.c_int32, ctypes.c_int32,
                                              ctypes.c_int32]),
    # EdgeInfinite
    # int32_t kvpot_gate_set(struct llama_context * ctx, int32_t n_layer, int32_t d_v, int32_t d_h, int32_t n_head,
    #                        const float * w1, const float * b1, const float * w2, const float * b2, const float * g);
    ("kvpot_gate_set", ctypes.c_int32, [c_ctx_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32,
                                        c_f32_p, c_f32_p, c_f32_p, c_f32_p, c_f32_p]),
    # int32_t kvpot_memory_fold(struct llama_context * ctx, const int32_t * cells, int32_t n_layer,
    #                           int32_t n_head_kv, int32_t n_cells);
    ("kvpot_memory_fold", ctypes.c_int32, [c_ctx_p, c_i32_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32]),
    # int64_t kvpot_memory_folded(struct llama_context * ctx);
    ("kvpot_memory_folded", ctypes.c_int64, [c_ctx_p]),
    # int64_t kvpot_memory_state_size(struct llama_context * ctx);
    ("kvpot_memory_state_size", ctypes.c_int64, [c_ctx_p]),
    # int64_t kvpot_memory_state_get(struct llama_context * ctx, uint8_t * dst, size_t size);
    ("kvpot_memory_state_get", ctypes.c_int64, [c_ctx_p, ctypes.c_char_p, ctypes.c_size_t]),
    # int64_t kvpot_memory_state_set(struct llama_context * ctx, const uint8_t * src, size_t size);
    ("kvpot_memory_state_set", ctypes.c_int64, [c_ctx_p, ctypes.c_char_p, ctypes.c_size_t]),
    # -- InfLLM: block memory --
    # struct kvpot_blocks * kvpot_blocks_open(const char * path, int32_t n_layer, int32_t n_head_kv, int32_t d_k,
    #                                         int32_t d_v, int32_t block_size, int32_t k_type, int32_t v_type,
    #                                         int32_t max_cached, bool create);
    ("kvpot_blocks_open", c_blocks_p, [ctypes.c_char_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32,
                                       ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_bool]),
    # void kvpot_blocks_free(struct kvpot_blocks * bs);
    ("kvpot_blocks_free", None, [c_blocks_p]),
    # int32_t kvpot_blocks_info_get(struct kvpot_blocks * bs, struct kvpot_blocks_info * out);
    ("kvpot_blocks_info_get", ctypes.c_int32, [c_blocks_p, ctypes.POINTER(kvpot_blocks_info)]),
    # int32_t kvpot_blocks_append(struct kvpot_blocks * bs, const int32_t * pos, const float * repr,
    #                             const float * k, const float * v);
    ("kvpot_blocks_append", ctypes.c_int32, [c_blocks_p, c_i32_p, c_f32_p, c_f32_p, c_f32_p]),
    # int32_t kvpot_blocks_read(struct kvpot_blocks * bs, int32_t layer, int32_t block, int32_t * pos, float * repr,
    #                           float * k, float * v);
    ("kvpot_blocks_read", ctypes.c_int32, [c_blocks_p, ctypes.c_int32, ctypes.c_int32, c_i32_p, c_f32_p, c_f32_p, c_f32_p]),
    # int32_t kvpot_blocks_topk(struct kvpot_blocks * bs, int32_t layer, const float * q, int32_t k,
    #                           int32_t * out, float * scores);
    ("kvpot_blocks_topk", ctypes.c_int32, [c_blocks_p, ctypes.c_int32, c_f32_p, ctypes.c_int32, c_i32_p, c_f32_p]),
    # int32_t kvpot_blocks_truncate(struct kvpot_blocks * bs, int32_t n_blocks);
    ("kvpot_blocks_truncate", ctypes.c_int32, [c_blocks_p, ctypes.c_int32]),
    # int32_t kvpot_blocks_sync(struct kvpot_blocks * bs);
    ("kvpot_blocks_sync", ctypes.c_int32, [c_blocks_p]),
    # int32_t kvpot_pot_read_at(struct llama_context * ctx, int32_t cell0, int32_t n_cells, llama_pos rope_to,
    #                           float * k_out, float * v_out);
    ("kvpot_pot_read_at", ctypes.c_int32, [c_ctx_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, c_f32_p, c_f32_p]),
    # int32_t kvpot_pot_insert(struct llama_context * ctx, int32_t n_cells, const float * k, const float * v,
    #                          const llama_pos * rope_from, llama_pos rope_to);
    ("kvpot_pot_insert", ctypes.c_int32, [c_ctx_p, ctypes.c_int32, c_f32_p, c_f32_p, c_i32_p, ctypes.c_int32]),
    # int32_t kvpot_query_request(struct llama_context * ctx, bool on, llama_pos angle);
    ("kvpot_query_request", ctypes.c_int32, [c_ctx_p, ctypes.c_bool, ctypes.c_int32]),
    # int32_t kvpot_query_take(struct llama_context * ctx, int32_t ipot, float * out, int32_t n_out);
    ("kvpot_query_take", ctypes.c_int32, [c_ctx_p, ctypes.c_int32, c_f32_p, ctypes.c_int32]),
    # int32_t kvpot_lookup_set(struct llama_context * ctx, struct kvpot_blocks * bs, int32_t cell0, int32_t n_fetch,
    #                          int32_t n_local);
    ("kvpot_lookup_set", ctypes.c_int32, [c_ctx_p, c_blocks_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32]),
    # int32_t kvpot_lookup_take(struct llama_context * ctx, int32_t ipot, int32_t * blocks, int32_t n_blocks,
    #                           int32_t * pos, int32_t n_pos);
    ("kvpot_lookup_take", ctypes.c_int32, [c_ctx_p, ctypes.c_int32, c_i32_p, ctypes.c_int32, c_i32_p, ctypes.c_int32]),
    # int32_t kvpot_lookup_hold(struct llama_context * ctx, bool hold);
    ("kvpot_lookup_hold", ctypes.c_int32, [c_ctx_p, ctypes.c_bool]),
    # int32_t kvpot_distance_set(struct llama_context * ctx, int32_t cell0, int32_t n_cells, int32_t distance);
    ("kvpot_distance_set", ctypes.c_int32, [c_ctx_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32]),
    # int32_t kvpot_tap_mode(struct llama_context * ctx, int32_t mode);
    ("kvpot_tap_mode", ctypes.c_int32, [c_ctx_p, ctypes.c_int32]),
    # int32_t kvpot_abort_watch(int32_t fd);
    ("kvpot_abort_watch", ctypes.c_int32, [ctypes.c_int32]),
    # int32_t kvpot_abort_arm(struct llama_context * ctx, bool on);
    ("kvpot_abort_arm", ctypes.c_int32, [c_ctx_p, ctypes.c_bool]),
]


# InfLLM's per-layer block caches, declared where the runtime has them: a runtime built before them
# reads through one LRU cache shared by the layers and has no per-layer counts (kvpot.runtime.blocks
# BlockStore.layer_caches says which)
LAYER_CACHE_SIGNATURES: list[tuple[str, object, list]] = [
    # int32_t kvpot_blocks_cache_set(struct kvpot_blocks * bs, int32_t rule, float decay, uint32_t seed);
    ("kvpot_blocks_cache_set", ctypes.c_int32, [c_blocks_p, ctypes.c_int32, ctypes.c_float, ctypes.c_uint32]),
    # int32_t kvpot_blocks_cache_lookup(struct kvpot_blocks * bs, int32_t layer, const int32_t * blocks,
    #                                   const float * attention, int32_t n);
    ("kvpot_blocks_cache_lookup", ctypes.c_int32, [c_blocks_p, ctypes.c_int32, c_i32_p, c_f32_p, ctypes.c_int32]),
    # int32_t kvpot_blocks_cache_get(struct kvpot_blocks * bs, int32_t layer, int64_t * hits, int64_t * misses,
    #                                int32_t * blocks, float * scores, int32_t n_out);
    ("kvpot_blocks_cache_get", ctypes.c_int32, [c_blocks_p, ctypes.c_int32, ctypes.POINTER(ctypes.c_int64),
                                                ctypes.POINTER(ctypes.c_int64), c_i32_p, c_f32_p, ctypes.c_int32]),
]


def declare(lib: ctypes.CDLL) -> None:
    """Set restype/argtypes on every kvpot_* symbol; AttributeError if one of SIGNATURES is missing."""
    for name, restype, argtypes in SIGNATURES + [s for s in LAYER_CACHE_SIGNATURES if hasattr(lib, s[0])]:
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
