// kvpot C API: the pot (bounded per-layer, per-KV-head KV memory) and its helpers.
// Compiled into libllama by ggml_ext.cmake; every symbol is prefixed kvpot_.
#pragma once

#include "llama.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef LLAMA_SHARED
#    if defined(_WIN32) && !defined(__MINGW32__)
#        ifdef LLAMA_BUILD
#            define KVPOT_API __declspec(dllexport)
#        else
#            define KVPOT_API __declspec(dllimport)
#        endif
#    else
#        define KVPOT_API __attribute__ ((visibility ("default")))
#    endif
#else
#    define KVPOT_API
#endif

// bumped whenever a kvpot_* signature or struct layout changes; the Python side
// refuses a libllama whose ABI number differs from the one it was written for
#define KVPOT_ABI_VERSION 16

#ifdef __cplusplus
extern "C" {
#endif

// kvpot release string, e.g. "0.1.0"
KVPOT_API const char * kvpot_version(void);

// KVPOT_ABI_VERSION of the compiled library
KVPOT_API int32_t kvpot_abi_version(void);

// llama.cpp commit the library was built from (as pinned by the kvpot build)
KVPOT_API const char * kvpot_llama_commit(void);

// comma-separated names of the ggml backends registered in this build, e.g. "CPU" or "CUDA,CPU";
// the string is owned by the library and stays valid until the next call
KVPOT_API const char * kvpot_backends(void);

// comma-separated names of the CPU device's extra weight buffer types (e.g. "CPU_REPACK"): where the
// model loader may put weights besides plain CPU memory. kvpot builds without "AMX" (llama.cpp
// issue 20824); tests read this list to prove it. Owned by the library, valid until the next call.
KVPOT_API const char * kvpot_cpu_extra_bufts(void);

// the CPU backend's compile-time features as "NAME=VALUE" pairs, comma-separated (ggml's own
// ggml_backend_get_features list, e.g. "SSE3=1,AVX2=1,...,REPACK=1"); "" without a CPU backend
KVPOT_API const char * kvpot_cpu_features(void);

// on SIGSEGV, SIGBUS, SIGILL, SIGFPE or SIGABRT, write `text` (copied; at most 1023 bytes) to stderr
// before passing the signal on to the handler installed before this call (e.g. Python's
// faulthandler), so a native crash names the kvpot version and runtime to report. Returns 0.
KVPOT_API int32_t kvpot_crash_banner_install(const char * text);

// route llama.cpp's and ggml's log through kvpot_log_filter: errors reach stderr unless they are
// known to be harmless for kvpot (kvpot-log.cpp names them and why); info, warnings and debug text do
// not. With a path, every message of every level is also appended to that file (NULL or "": none; a
// later call replaces the file). The filter is C: no message ever calls back into Python, whatever
// thread logs it. Returns 0, or KVPOT_ERR_ARG when the file cannot be opened.
KVPOT_API int32_t kvpot_log_setup(const char * path);

// the filter itself, a ggml_log_callback (exported so a caller can check it is the one installed)
KVPOT_API void kvpot_log_filter(enum ggml_log_level level, const char * text, void * user_data);

// give back the resident pages of the model file's mapping that hold weights llama.cpp copied
// elsewhere at load time (the CPU's repacked layouts, a GPU's buffers): with mmap they stay resident
// beside their copy, doubling those weights' share of RSS (kvpot-mapped.cpp says why it is safe).
// `path`: the GGUF the model was loaded from. Returns the bytes given back (0 without a mapping, or
// where the platform cannot), or KVPOT_ERR_ARG when the file cannot be read as GGUF.
KVPOT_API int64_t kvpot_model_release_copied(const struct llama_model * model, const char * path);

// a llama_progress_callback (llama_model_params.progress_callback) that, each time the loader reports
// progress, gives back the resident pages of every read-only mapping of the file named by `user_data`
// (a NUL-terminated path, kept alive by the caller until loading ends). llama.cpp maps the whole file
// resident (MAP_POPULATE) and then copies weights out of it one tensor at a time; without this, every
// copy is resident beside its source until kvpot_model_release_copied runs after loading, so loading
// peaks at the file plus all its copies. Pages still read in place fault back in from the page cache
// when first used (kvpot-mapped.cpp says why that changes nothing computed). Linux and Android (it
// reads /proc/self/maps); elsewhere it releases nothing. Returns false, so llama.cpp cancels the load,
// when a signal is waiting in the descriptor given to kvpot_abort_watch; else true.
KVPOT_API bool kvpot_load_progress_release(float progress, void * user_data);

//
// the pot: the KV cache of a context (for iSWA models, its non-SWA layers), bounded and compacted
// per layer and per KV head. Every call returns >= 0 on success and a negative KVPOT_ERR_* on
// failure, with a message in kvpot_last_error(); bad arguments never crash.
//

#define KVPOT_ERR_ARG     -1  // an argument is out of range, a duplicate, or of the wrong length
#define KVPOT_ERR_STATE   -2  // the context cannot do this (no pot, wrong memory type, nothing requested)
#define KVPOT_ERR_COMPUTE -3  // a graph failed to allocate or compute

// message of the last failed kvpot_* call on this thread
KVPOT_API const char * kvpot_last_error(void);

struct kvpot_pot_stats {
    int32_t   n_pot_layers;  // model layers whose KV lives in the pot
    int32_t   n_head_kv;     // KV heads per pot layer
    int32_t   n_cells_used;  // cells in use (the same for every pot layer)
    int32_t   n_cells_total; // cells allocated (the context size)
    int32_t   n_swa_used;    // cells in use in the sliding-window part, -1 without one
    int32_t   budget;        // configured budget (kvpot_pot_set_budget), 0 if none
    int32_t   n_compactions; // compactions since the last reset
    int32_t   pos_next;      // position the next token must take
    int64_t   bytes_used;    // K+V bytes held by the used cells of the pot layers
    int64_t   bytes_total;   // K+V bytes allocated for the pot layers
};

KVPOT_API int32_t kvpot_pot_stats_get(struct llama_context * ctx, struct kvpot_pot_stats * out);

// model layer ids of the pot layers, in pot order; returns how many (writes at most n_max)
KVPOT_API int32_t kvpot_pot_layers(struct llama_context * ctx, int32_t * il_out, int32_t n_max);

// record the budget the policy works to (reported by stats; the engine enforces it)
KVPOT_API int32_t kvpot_pot_set_budget(struct llama_context * ctx, int32_t n_cells);

// forget kvpot's per-context state (requests, per-head positions); call after clearing the memory
KVPOT_API int32_t kvpot_pot_reset(struct llama_context * ctx);

// keep-list padding for a layer that keeps fewer cells than n_keep
#define KVPOT_PAD -1

// keep, for every pot layer l and KV head h, the cells keep[(l*n_head_kv + h)*n_keep + j], j < n_keep:
// they move to cells 0..n_keep-1 (in the given order) and every other cell is freed. With cr_rope the
// keys are re-rotated so that cell j holds position j (CR-RoPE); otherwise each key keeps its position.
// A layer may keep fewer (per-layer budgets): its rows end with KVPOT_PAD, the same count in every
// head; the padded cells are dead in that layer (masked out of its attention, never kept again)
// until the next compaction. Runs as a ggml graph on the backend holding the cache. Only sequence 0
// may be in the cache.
KVPOT_API int32_t kvpot_pot_compact(struct llama_context * ctx, const int32_t * keep,
                                    int32_t n_layer, int32_t n_head_kv, int32_t n_keep, bool cr_rope);

// score taps: for the query rows at these positions in the next llama_decode calls, accumulate the
// attention probability each cell receives, per pot layer and KV head (query heads of a group and
// tapped rows summed). n_pos = 0 clears the request. Results stay until the next request.
KVPOT_API int32_t kvpot_tap_request(struct llama_context * ctx, const llama_pos * pos, int32_t n_pos);

// copy the tapped mass of pot layer ipot as out[h*n_cells + c] for cells c < n_cells
KVPOT_API int32_t kvpot_tap_get(struct llama_context * ctx, int32_t ipot, float * out, int32_t n_head_kv, int32_t n_cells);

// log p(targets[i] | prefix) for the token at position pos0 + i, computed in the graph for every row of
// the batch whatever rows it marks for logits (only the marked rows' logits are copied out, so a chunk
// marking only its last row never materialises full logits outside the graph); n = 0 clears the request
KVPOT_API int32_t kvpot_logprobs_request(struct llama_context * ctx, llama_pos pos0, const llama_token * targets, int32_t n);

// copy the log-probs of the last request (NaN where none was computed)
KVPOT_API int32_t kvpot_logprobs_get(struct llama_context * ctx, float * out, int32_t n);

// read back cells [cell0, cell0 + n_cells) of one pot layer and KV head as floats, out[c*d + e];
// which = 0 for K (as stored: after RoPE), 1 for V. Meant for tests and inspection.
KVPOT_API int32_t kvpot_pot_read(struct llama_context * ctx, int32_t ipot, int32_t head, int32_t which,
                                 int32_t cell0, int32_t n_cells, float * out, int32_t n_out);

// cell positions (-1 for an empty cell) of cells [0, n)
KVPOT_API int32_t kvpot_pot_cell_pos(struct llama_context * ctx, int32_t * out, int32_t n);

// kvpot's own state of a context (per-head RoPE positions of compacted cells, budget, counters) as
// bytes, to save beside llama_state_seq_get_data. size: bytes needed; get: writes them, returns the
// count; set: restores them after llama_state_seq_set_data (checks the pot's shape and cells)
KVPOT_API int64_t kvpot_pot_state_size(struct llama_context * ctx);
KVPOT_API int64_t kvpot_pot_state_get(struct llama_context * ctx, uint8_t * dst, size_t size);
KVPOT_API int64_t kvpot_pot_state_set(struct llama_context * ctx, const uint8_t * src, size_t size);

// restore sequence `seq_id` from `size` bytes of the open file `fd` at `offset`, as
// llama_state_seq_get_data wrote them, read in pieces straight into the cache's tensors: the state is
// never held whole beside the cache it fills. Returns the bytes read (== size), or KVPOT_ERR_ARG for a
// state that is not one or does not fit this context (llama.cpp's reason in kvpot_last_error), and
// KVPOT_ERR_STATE where the platform has no pread. After a failure the cache may hold part of the state:
// discard the context. POSIX only (Linux, Android, macOS).
KVPOT_API int64_t kvpot_state_seq_read_fd(struct llama_context * ctx, int32_t fd, int64_t offset, int64_t size,
                                          llama_seq_id seq_id);

// apply the K-shifts llama.cpp keeps pending until the next decode; call before saving a sequence state
KVPOT_API int32_t kvpot_pot_settle(struct llama_context * ctx);

// Locret's retaining heads (weights already checked by the caller, e.g. kvpot.converters.adapter):
// fc1 row-major [n_layer][hidden][width] with width = n_head*d_k + n_head_kv*(d_k + d_v) (the layer's
// [Q; K; V] of one token, before RoPE), fc2 [n_layer][n_head_kv][hidden]; act 0 = SiLU, 1 = GELU (tanh).
// While set, every decode computes fc2 · act(fc1 · [Q; K; V]) for each token of each layer inside the
// graph. fc1 = fc2 = NULL removes them. The heads survive kvpot_pot_reset.
KVPOT_API int32_t kvpot_heads_set(struct llama_context * ctx, int32_t n_layer, int32_t hidden, int32_t width,
                                  int32_t n_head_kv, int32_t act, const float * fc1, const float * fc2);

// score (on, the default once set) or not (off: e.g. while answering, so llama.cpp may reuse its graph)
KVPOT_API int32_t kvpot_heads_enable(struct llama_context * ctx, bool on);

// scores of model layer il for the tokens decoded since the last take, in decode order:
// out[t*n_head_kv + h]; returns the number of tokens and forgets them
KVPOT_API int32_t kvpot_heads_take(struct llama_context * ctx, int32_t il, float * out, int32_t n_tokens, int32_t n_head_kv);

// ---- Locret: training capture for the retaining heads (issue 13) ----

// capture (on) or not (off, the default) what training the retaining heads needs, in every following
// decode: per model layer the heads' input [Q; K; V] of each token (the tensor kvpot_heads_set's heads
// read, before RoPE), and per pot layer the query rows tapped by kvpot_tap_request after RoPE, times
// the attention's kq_scale (so q·k is the pre-softmax score). Switching drops what was captured;
// kvpot_pot_reset switches it off.
KVPOT_API int32_t kvpot_capture_enable(struct llama_context * ctx, bool on);

// [Q; K; V] of model layer il for the tokens decoded since the last take, in decode order:
// out[t*width + e]; returns the number of tokens and forgets them
KVPOT_API int32_t kvpot_capture_qkv_take(struct llama_context * ctx, int32_t il, float * out, int32_t n_tokens, int32_t width);

// tapped query rows of pot layer ipot since the last take, in decode order: out[(r*n_head + h)*d + e];
// returns the number of rows and forgets them
KVPOT_API int32_t kvpot_capture_q_take(struct llama_context * ctx, int32_t ipot, float * out, int32_t n_rows, int32_t n_head, int32_t d);

//
// EdgeInfinite: gated compressive memory (kvpot-memory.h). Per pot layer and KV head a memory M (d_k x d_v)
// and z (d_k); folded segments leave the cache and live on in M, z; each pot layer mixes the read-out
// sigma(Q) M / sigma(Q) z, passed through the gate's MLP, into its attention output before W_o.
//

// the memory-gating module, row-major and concatenated over the n_layer pot layers (checked against
// them): w1 [n_layer][d_h][d_v], b1 [n_layer][d_h], w2 [n_layer][d_v][d_h], b2 [n_layer][d_v],
// g [n_layer][n_head][d_v]. Setting it also gives the context a zeroed memory. All NULL removes both.
// The gate survives kvpot_pot_reset (the memory is zeroed there). Needs an f16/f32 KV cache.
KVPOT_API int32_t kvpot_gate_set(struct llama_context * ctx, int32_t n_layer, int32_t d_v, int32_t d_h, int32_t n_head,
                                 const float * w1, const float * b1, const float * w2, const float * b2, const float * g);

// fold, for every pot layer l and KV head h, the cells cells[(l*n_head_kv + h)*n_cells + j] (distinct, in use)
// into that head's memory: M += sigma(K)^T V, z += sum sigma(k) with K, V as the cache holds them (keys
// after RoPE). The cells stay in the cache (compact them away after). From the first fold on, every
// decode mixes the memory in.
KVPOT_API int32_t kvpot_memory_fold(struct llama_context * ctx, const int32_t * cells, int32_t n_layer,
                                    int32_t n_head_kv, int32_t n_cells);

// tokens folded into the memory since it was zeroed (0: no memory, attention is stock)
KVPOT_API int64_t kvpot_memory_folded(struct llama_context * ctx);

// the memory as bytes, for saved contexts and tests. Layout (little-endian): int32 magic 'KVPM', version,
// n_layer, n_head_kv, d_k, d_v; int64 n_folded; then per pot layer float32 M [n_head_kv][d_v][d_k]
// (element M_h[k][v] at (h*d_v + v)*d_k + k), then float32 z [n_head_kv][d_k]. size: bytes needed
// (0 without a gate); get writes them; set restores them into a context with the same gate shapes.
KVPOT_API int64_t kvpot_memory_state_size(struct llama_context * ctx);
KVPOT_API int64_t kvpot_memory_state_get(struct llama_context * ctx, uint8_t * dst, size_t size);
KVPOT_API int64_t kvpot_memory_state_set(struct llama_context * ctx, const uint8_t * src, size_t size);

//
// InfLLM (issue 15): block memory. Evicted K/V in blocks of block_size tokens with one representative
// key per KV head, in a file (docs/formats.md) that lookups read through a cache per layer (the paper's
// appendix D); cells read out of the pot and inserted into it at one RoPE angle; the lookup query of each
// pot layer, captured in the graph.
//

struct kvpot_blocks; // an open block store

struct kvpot_blocks_info {
    int32_t n_layer;      // pot layers
    int32_t n_head_kv;
    int32_t d_k;
    int32_t d_v;
    int32_t block_size;   // tokens per block
    int32_t n_blocks;     // blocks per layer
    int32_t max_cached;   // blocks each layer's cache holds after a lookup
    int32_t n_cached;     // blocks the caches of all layers hold now
    int64_t record_bytes; // bytes of one block of one layer in the file
    int64_t file_bytes;
    int64_t hits;         // lookups' block reads served from a cache, all layers
    int64_t misses;       // lookups' block reads from the file, all layers
    int32_t k_type;       // ggml_type of the stored K rows: GGML_TYPE_F16, GGML_TYPE_Q8_0 or GGML_TYPE_Q4_0
    int32_t v_type;       // ggml_type of the stored V rows, the same three
};

// create (create = true: a new, empty store; an existing path is refused, never replaced) or open a block store.
// Opening checks magic, version, shape (a size argument of 0 takes the file's, k_type and v_type too) and
// that the file holds whole blocks; NULL with kvpot_last_error() when it does not. k_type, v_type: the
// ggml_type K and V are stored as (F16, Q8_0 or Q4_0 each; a quantised one needs its dim in multiples of 32).
KVPOT_API struct kvpot_blocks * kvpot_blocks_open(const char * path, int32_t n_layer, int32_t n_head_kv, int32_t d_k,
                                                  int32_t d_v, int32_t block_size, int32_t k_type, int32_t v_type,
                                                  int32_t max_cached, bool create);
KVPOT_API void    kvpot_blocks_free(struct kvpot_blocks * bs);
KVPOT_API int32_t kvpot_blocks_info_get(struct kvpot_blocks * bs, struct kvpot_blocks_info * out);

// append one block to every layer: pos [block_size] stream positions, repr [n_layer][n_head_kv][d_k],
// k [n_layer][n_head_kv][block_size][d_k], v [n_layer][n_head_kv][block_size][d_v] (keys as they are to
// be scored and re-rotated: kvpot stores them at RoPE position 0). Returns the block's index.
KVPOT_API int32_t kvpot_blocks_append(struct kvpot_blocks * bs, const int32_t * pos, const float * repr,
                                      const float * k, const float * v);

// one block of one layer, read as a lookup of it alone that gives it no attention (kvpot_blocks_cache_lookup);
// pos [block_size], repr [n_head_kv][d_k], k [n_head_kv][block_size][d_k], v [n_head_kv][block_size][d_v];
// any output may be NULL
KVPOT_API int32_t kvpot_blocks_read(struct kvpot_blocks * bs, int32_t layer, int32_t block, int32_t * pos, float * repr,
                                    float * k, float * v);

// relevance of every block of a layer to q [n_head_kv][d_k]: sum over heads of q_h . repr_h (in double);
// out[k]: the top k blocks, best first, ties to the lower index; scores [n_blocks] may be NULL. The
// representatives are read from the file in parts, so the store may be larger than RAM. Returns k.
KVPOT_API int32_t kvpot_blocks_topk(struct kvpot_blocks * bs, int32_t layer, const float * q, int32_t k,
                                    int32_t * out, float * scores);

// the eviction rule of the per-layer block caches (kvpot_blocks_cache_set)
#define KVPOT_CACHE_FREQ   0 // the paper's: the lowest frequency score s_b <- s_b * decay + attention received
#define KVPOT_CACHE_LRU    1 // the least recently used
#define KVPOT_CACHE_FIFO   2 // the first loaded
#define KVPOT_CACHE_RANDOM 3 // one at random (seeded)

// the rule of every layer's cache, the score's decay d (0..1, the paper's 0.1; only KVPOT_CACHE_FREQ reads
// it) and the random rule's seed; empties the caches and zeroes their counts. A store opens with
// KVPOT_CACHE_FREQ, decay 0.1, seed 0; each layer's cache holds max_cached blocks after a lookup.
KVPOT_API int32_t kvpot_blocks_cache_set(struct kvpot_blocks * bs, int32_t rule, float decay, uint32_t seed);

// one lookup of a layer's cache, as the in-graph lookup makes it once it chose its blocks: blocks [n] read
// through the cache (a hit or a miss each), then every cached block's score decays (s_b * decay) and
// blocks[i]'s gains attention[i] (NULL: none), then blocks leave by the rule until max_cached remain.
// Returns n.
KVPOT_API int32_t kvpot_blocks_cache_lookup(struct kvpot_blocks * bs, int32_t layer, const int32_t * blocks,
                                            const float * attention, int32_t n);

// a layer's cache: its hits and misses since the rule was set, and up to n_out of the blocks it holds with
// their scores s_b, ascending by block (any output may be NULL). Returns how many blocks it holds.
KVPOT_API int32_t kvpot_blocks_cache_get(struct kvpot_blocks * bs, int32_t layer, int64_t * hits, int64_t * misses,
                                         int32_t * blocks, float * scores, int32_t n_out);

// show only the first n_blocks blocks (a reopened context's); the file is never cut, and appending is refused
// while it holds more
KVPOT_API int32_t kvpot_blocks_truncate(struct kvpot_blocks * bs, int32_t n_blocks);

// flush the file to the disk (before a saved context references it)
KVPOT_API int32_t kvpot_blocks_sync(struct kvpot_blocks * bs);

// read cells [cell0, cell0 + n_cells) of every pot layer with K re-rotated to RoPE position rope_to (the
// same rope settings as the compaction): k_out [n_layer][n_head_kv][n_cells][d_k], v_out likewise with d_v
KVPOT_API int32_t kvpot_pot_read_at(struct llama_context * ctx, int32_t cell0, int32_t n_cells, llama_pos rope_to,
                                    float * k_out, float * v_out);

// append n_cells cells after the pot, per layer and KV head, k [n_layer][n_head_kv][n_cells][d_k] stored
// at RoPE positions rope_from [n_cells] and re-rotated to rope_to (every inserted key at that one
// position), v likewise; the cells then take consecutive positions ending before the next token's
// (they only serve the causal mask). The pot must have no holes and no dead cells.
KVPOT_API int32_t kvpot_pot_insert(struct llama_context * ctx, int32_t n_cells, const float * k, const float * v,
                                   const llama_pos * rope_from, llama_pos rope_to);

// capture (on) or not the lookup query of every pot layer in the next decodes: the queries after RoPE,
// re-rotated to position `angle`, summed over the rows and over the query heads of each KV group;
// accumulated until taken. A request clears what was accumulated.
KVPOT_API int32_t kvpot_query_request(struct llama_context * ctx, bool on, llama_pos angle);

// the query of pot layer ipot accumulated since the request or the last take: out [n_head_kv][d_k];
// returns n_out, or 0 when nothing was captured, and forgets it
KVPOT_API int32_t kvpot_query_take(struct llama_context * ctx, int32_t ipot, float * out, int32_t n_out);

// InfLLM's lookup inside the layer (bs NULL: off). While set, every ubatch graph, in each pot layer
// before its attention, scores the store's blocks of that layer against the ubatch's queries (rotated
// to RoPE position n_local, summed over rows and over the query heads of each KV group; relevance
// summed over KV heads), takes the top n_fetch, and writes their keys (rotated from RoPE 0 to
// max(0, pos0 - n_local), pos0 the ubatch's first position) and values into cells
// [cell0, cell0 + n_fetch * block_size), which must be placed cells (kvpot_pot_insert reserves them).
// A compaction, insert, reset or restore drops it. The store stays open while the context uses it.
KVPOT_API int32_t kvpot_lookup_set(struct llama_context * ctx, struct kvpot_blocks * bs, int32_t cell0, int32_t n_fetch,
                                   int32_t n_local);

// the blocks pot layer ipot fetched in the last graph (ascending) and the stream positions of their
// tokens in cell order: blocks [n_fetch], pos [n_fetch * block_size]; returns n_fetch, 0 when nothing
// was fetched since the last take, or an error (a fetch that failed in the graph reports here)
KVPOT_API int32_t kvpot_lookup_take(struct llama_context * ctx, int32_t ipot, int32_t * blocks, int32_t n_blocks,
                                    int32_t * pos, int32_t n_pos);

// hold (true) the lookup: later graphs do not fetch and the cells keep the last fetch, until released
// (kvpot holds it while generating an answer: one generated token's query is a poor choice of blocks)
KVPOT_API int32_t kvpot_lookup_hold(struct llama_context * ctx, bool hold);

// InfLLM's context memory at one distance: from the next graph on, every query of every pot layer sees
// the cells [cell0, cell0 + n_cells) as if they sat `distance` positions before it, whatever its own
// position (the paper's initial tokens and retrieved blocks "at distance n_local"), through a per-head
// bias on those cells' attention logits (ggml_ext/kvpot-distance.h). n_cells 0 turns it off. Refused
// for models that soft-cap attention logits. A compaction, insert, reset or restore drops it.
KVPOT_API int32_t kvpot_distance_set(struct llama_context * ctx, int32_t cell0, int32_t n_cells, int32_t distance);

// what the score taps (kvpot_tap_request) measure from the next request on:
#define KVPOT_TAP_ATTENTION 0 // the attention probability each cell receives (softmax rows; the default)
#define KVPOT_TAP_QK        1 // the attention logit q·k·kq_scale each cell receives, before softmax (InfLLM's
                              // r_m, unnormalised): one [n_kv] product with the rows' summed query per
                              // KV head, no [n_kv x n_rows] matrix
KVPOT_API int32_t kvpot_tap_mode(struct llama_context * ctx, int32_t mode);

// a signal stops a decode in progress (ggml_ext/kvpot-abort.cpp): fd is the read end of the pipe given
// to Python's signal.set_wakeup_fd (-1: watch nothing); a decode of a context armed with
// kvpot_abort_arm(ctx, true) stops after the graph node during which something became readable there,
// and llama_decode returns 2 with the ubatch's cells removed. The caller empties the pipe. Both return 0
// (KVPOT_ERR_ARG for a null context). CPU backend only: other backends run their graph to its end.
KVPOT_API int32_t kvpot_abort_watch(int32_t fd);
KVPOT_API int32_t kvpot_abort_arm(struct llama_context * ctx, bool on);

#ifdef __cplusplus
}
#endif
