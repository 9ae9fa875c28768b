// pot_check: the pot on one machine, as plain C++ over libllama + kvpot.h (no Python), so that the same
// run can be made on x86 and on aarch64 (natively or under qemu) and the outputs compared
// (tests/compare_pot_check.py). It loads a model, reads a few hundred tokens in chunks, taps the
// attention of the last chunk's rows, keeps the top cells per layer and KV head, compacts with
// CR-RoPE, reads a question and prints:
//   kept <layer> <head> <cell>...      the cells each (layer, KV head) kept, in cell order
//   score <layer> <head> <s>...        the tapped mass of those cells and of the first dropped one
//   stock <v>...                       the logits after the document, before any compaction (stock llama.cpp)
//   stock_q <v>...                     stock llama.cpp's logits after the whole document and the question
//   logits <v>...                      the logits after the question (every 97th id, plus the top 10)
//   top <id>...                        the top 10 token ids
//   nuc <v>... / nuc_ref <v>...        log p(next token) of a chunk's rows from InfiniPot's in-graph NuC,
//                                      and from log_softmax of the same rows' full logits
//   heads <v>... / heads_ref <v>...    Locret's retaining-head scores (seeded weights) of a chunk, every
//                                      layer, from the graph and from the same weights applied here to
//                                      the captured heads input
//   memory <v>... / memory_ref <v>...  EdgeInfinite's M and z after folding N_FOLD cells (every 7th
//                                      float), from the graph and summed here from the cache's K and V
//   gated <v>... / ungated <v>...      the logits after the question with that memory mixed in by a
//                                      seeded gate, and without a gate over the same kept cells
//   lookup <b>... / lookup_ref <b>...  InfLLM: the blocks each layer's graph fetched for the question,
//                                      and the top blocks for the query that graph captured, ranked here
//   lookup_scores <v>...               every block's relevance per layer (for near-ties)
//   fetched <v>... / fetched_ref <v>...  the fetched cells' K (back at RoPE 0) and V, every 7th float, and
//                                      the same floats of the blocks each layer fetched, from the store's input
//   fetched_at <v>... / fetched_at_ref <v>...  their K as the cache holds it (at the lookup's angle), and
//                                      the stored keys rotated to that angle by pot_check's own RoPE
//   recalled <v>...                    the logits after the question with those blocks fetched
//   recalled_ref <v>...                the same with those blocks' cells put in by the host instead
//                                      (memory, gated, ungated, lookup*, recalled: with an f16 cache only)
// With REF (the output of an earlier run, e.g. on x86) the run then compacts a second copy of the
// document with REF's kept cells and prints `imposed <v>...`: the logits after the question for those
// cells, so that compaction and CR-RoPE are compared on identical cells even where the two CPUs' taps
// rank a near-tie differently.
//
// usage: [POT_CHECK_LOG=1] [POT_CHECK_FLASH=1] [POT_CHECK_TYPE_K=f16|q8_0] [POT_CHECK_TYPE_V=f16|q8_0]
//        pot_check MODEL.gguf [n_threads [REF.txt]]
#include "llama.h"
#include "kvpot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

static const int32_t N_CTX   = 512;
static const int32_t CHUNK   = 64;
static const int32_t N_DOC   = 320;
static const int32_t N_KEEP  = 96;

static const int32_t N_FOLD  = 128;     // cells folded into EdgeInfinite's memory
static const size_t  MEM_HEADER = 6*sizeof(int32_t) + sizeof(int64_t); // kvpot_memory_state_get's header

// reproducible weights in [-scale, scale) for the retaining heads and the memory gate
static std::vector<float> seeded(size_t n, float scale, uint32_t seed) {
    std::vector<float> out(n);
    uint32_t x = 2654435761u*seed + 1u;
    for (float & e : out) {
        x = x*1664525u + 1013904223u;
        e = scale*(2.0f*(float) (x >> 8)/16777216.0f - 1.0f);
    }
    return out;
}

static std::vector<float> every(const std::vector<float> & v, size_t step) {
    std::vector<float> out;
    for (size_t i = 0; i < v.size(); i += step) out.push_back(v[i]);
    return out;
}

// one key rotated to position pos as llama.cpp's RoPE rotates it, in double: NORM pairs (2i, 2i + 1),
// NEOX pairs (i, i + d/2); theta_i = pos * base^(-2i/d) (no frequency scaling: the models pot_check runs)
static void rope_host(float * x, int32_t d, double pos, double base, bool neox) {
    for (int32_t i = 0; i < d/2; ++i) {
        const double th = pos*std::pow(base, -2.0*i/d);
        const int32_t a = neox ? i : 2*i, b = neox ? i + d/2 : 2*i + 1;
        const double x0 = x[a], x1 = x[b];
        x[a] = (float) (x0*std::cos(th) - x1*std::sin(th));
        x[b] = (float) (x0*std::sin(th) + x1*std::cos(th));
    }
}

// the model's RoPE base, from its GGUF metadata (llama.cpp's default 10000 where the file has none)
static double rope_base(const llama_model * model) {
    char arch[64] = {0}, val[64] = {0};
    if (llama_model_meta_val_str(model, "general.architecture", arch, sizeof(arch)) < 0) return 10000.0;
    const std::string key = std::string(arch) + ".rope.freq_base";
    return llama_model_meta_val_str(model, key.c_str(), val, sizeof(val)) < 0 ? 10000.0 : std::atof(val);
}

static void print_row(const char * tag, const std::vector<float> & v) {
    printf("%s", tag);
    for (float e : v) printf(" %.6g", e);
    printf("\n");
}

// every 97th of the n_vocab logits of the last decode's last row: what every logits line prints
static std::vector<float> sampled_logits(llama_context * ctx, int32_t n_vocab) {
    const float * lg = llama_get_logits_ith(ctx, -1);
    std::vector<float> out;
    for (int32_t t = 0; t < n_vocab; t += 97) out.push_back(lg[t]);
    return out;
}

static void die(const char * what) {
    fprintf(stderr, "pot_check: %s: %s\n", what, kvpot_last_error());
    exit(1);
}

static std::vector<llama_token> tokenize(const llama_vocab * vocab, const std::string & text, bool add_bos) {
    std::vector<llama_token> out(text.size() + 8);
    int32_t n = llama_tokenize(vocab, text.c_str(), (int32_t) text.size(), out.data(), (int32_t) out.size(), add_bos, false);
    if (n < 0) {
        out.resize(-n);
        n = llama_tokenize(vocab, text.c_str(), (int32_t) text.size(), out.data(), (int32_t) out.size(), add_bos, false);
    }
    out.resize(std::max(n, 0));
    return out;
}

// a deterministic logbook: days of weather, cargo and crew, one access code in the middle
static std::string logbook() {
    static const char * weather[] = {"calm", "a stiff westerly", "rain squalls", "fog until noon", "a long swell"};
    static const char * cargo[]   = {"salt", "timber", "wool", "copper", "barley", "lamp oil"};
    static const char * crew[]    = {"Ada", "Tomas", "Ilse", "Rurik", "Mara", "Joss"};
    std::string s = "Logbook of the schooner Marrow, kept by the first mate.\n\n";
    uint32_t x = 12345;
    for (int day = 1; day <= 40; ++day) {
        x = x*1103515245u + 12345u;
        const uint32_t r = x >> 8;
        s += "Day " + std::to_string(day) + ": " + weather[r % 5] + ". Loaded " + std::to_string(10 + r % 90) +
             " barrels of " + cargo[(r >> 4) % 6] + "; " + crew[(r >> 8) % 6] + " kept the watch.\n";
        if (day == 20) {
            s += "The access code for the salt warehouse is 48213.\n";
        }
    }
    return s;
}

static void decode(llama_context * ctx, llama_batch & batch, const llama_token * toks, int32_t n, llama_pos pos0, bool all_logits) {
    batch.n_tokens = n;
    for (int32_t i = 0; i < n; ++i) {
        batch.token[i]     = toks[i];
        batch.pos[i]       = pos0 + i;
        batch.n_seq_id[i]  = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i]    = all_logits || i == n - 1;
    }
    if (llama_decode(ctx, batch) != 0) {
        fprintf(stderr, "pot_check: llama_decode failed at %d\n", pos0);
        exit(1);
    }
}

// a fresh cache (llama.cpp's and the pot's), then doc[0, n) in chunks
static void reread(llama_context * ctx, llama_batch & batch, const std::vector<llama_token> & doc, int32_t n) {
    llama_memory_clear(llama_get_memory(ctx), true);
    kvpot_pot_reset(ctx);
    for (int32_t p = 0; p < n; p += CHUNK) {
        decode(ctx, batch, doc.data() + p, CHUNK, p, false);
    }
}

int main(int argc, char ** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.gguf [n_threads]\n", argv[0]);
        return 2;
    }
    const int n_threads = argc > 2 ? atoi(argv[2]) : 2;

    // errors only, unless POT_CHECK_LOG is set: then every message (which device holds the layers and
    // the KV cache, for a run on a GPU backend)
    static const bool log_all = getenv("POT_CHECK_LOG") != nullptr;
    llama_log_set([](ggml_log_level level, const char * text, void *) {
        if (log_all || level == GGML_LOG_LEVEL_ERROR) {
            fputs(text, stderr);
        }
    }, nullptr);
    llama_backend_init();

    llama_model_params mp = llama_model_default_params();
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "pot_check: cannot load %s\n", argv[1]);
        return 1;
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int32_t n_vocab = llama_vocab_n_tokens(vocab);

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx           = N_CTX;
    cp.n_batch         = CHUNK;
    cp.n_ubatch        = CHUNK;
    cp.n_seq_max       = 1;
    cp.n_threads       = n_threads;
    cp.n_threads_batch = n_threads;
    // POT_CHECK_FLASH=1: flash attention, so V is stored untransposed (compaction moves V rows as it
    // moves K rows) and the mask, with the pot's dead-cell bias in it, is F16
    const char * flash = getenv("POT_CHECK_FLASH");
    const bool flash_on = flash && *flash && std::string(flash) != "0";
    cp.flash_attn_type = flash_on ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    // POT_CHECK_TYPE_K=q8_0: a quantized K cache, so compaction moves q8_0 rows and the taps read them;
    // POT_CHECK_TYPE_V=q8_0 the same for V (llama.cpp needs flash attention for a quantized V)
    for (const char * var : {"POT_CHECK_TYPE_K", "POT_CHECK_TYPE_V"}) {
        const char * t = getenv(var);
        ggml_type & type = std::string(var).back() == 'K' ? cp.type_k : cp.type_v;
        if (t && std::string(t) == "q8_0") {
            type = GGML_TYPE_Q8_0;
        } else if (t && *t && std::string(t) != "f16") {
            fprintf(stderr, "pot_check: %s must be f16 or q8_0, not %s\n", var, t);
            return 2;
        }
    }
    if (cp.type_v != GGML_TYPE_F16 && !flash_on) {
        fprintf(stderr, "pot_check: POT_CHECK_TYPE_V=q8_0 needs POT_CHECK_FLASH=1\n");
        return 2;
    }
    cp.no_perf         = true;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "pot_check: cannot create a context\n");
        return 1;
    }
    llama_batch batch = llama_batch_init(CHUNK, 0, 1);

    std::vector<llama_token> doc = tokenize(vocab, logbook(), true);
    if ((int32_t) doc.size() < N_DOC) {
        fprintf(stderr, "pot_check: document too short (%zu tokens)\n", doc.size());
        return 1;
    }
    doc.resize(N_DOC);

    // read all chunks but the last, then tap every 8th row of the last one
    for (int32_t p = 0; p < N_DOC - CHUNK; p += CHUNK) {
        decode(ctx, batch, doc.data() + p, CHUNK, p, false);
    }
    std::vector<llama_pos> rows;
    for (int32_t r = 7; r < CHUNK; r += 8) {
        rows.push_back(N_DOC - CHUNK + r);
    }
    if (kvpot_tap_request(ctx, rows.data(), (int32_t) rows.size()) < 0) die("kvpot_tap_request");
    decode(ctx, batch, doc.data() + N_DOC - CHUNK, CHUNK, N_DOC - CHUNK, false);
    print_row("stock", sampled_logits(ctx, n_vocab));

    kvpot_pot_stats st;
    if (kvpot_pot_stats_get(ctx, &st) < 0) die("kvpot_pot_stats_get");
    const int32_t n_layer = st.n_pot_layers;
    const int32_t n_head  = st.n_head_kv;
    std::vector<int32_t> il(n_layer);
    kvpot_pot_layers(ctx, il.data(), n_layer);

    printf("model %s type_k %s type_v %s flash %d layers %d kv_heads %d cells %d\n", argv[1],
           cp.type_k == GGML_TYPE_Q8_0 ? "q8_0" : "f16", cp.type_v == GGML_TYPE_Q8_0 ? "q8_0" : "f16", (int) flash_on,
           n_layer, n_head, st.n_cells_used);
    std::vector<int32_t> keep((size_t) n_layer*n_head*N_KEEP);
    std::vector<float> tap((size_t) n_head*N_DOC);
    for (int32_t l = 0; l < n_layer; ++l) {
        if (kvpot_tap_get(ctx, l, tap.data(), n_head, N_DOC) < 0) die("kvpot_tap_get");
        for (int32_t h = 0; h < n_head; ++h) {
            const float * s = tap.data() + (size_t) h*N_DOC;
            std::vector<int32_t> order(N_DOC);
            std::iota(order.begin(), order.end(), 0);
            std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return s[a] > s[b]; });
            const float first_dropped = s[order[N_KEEP]];
            order.resize(N_KEEP);
            std::sort(order.begin(), order.end());
            std::copy(order.begin(), order.end(), keep.begin() + ((size_t) l*n_head + h)*N_KEEP);
            printf("kept %d %d", il[l], h);
            for (int32_t c : order) printf(" %d", c);
            printf("\nscore %d %d", il[l], h);
            for (int32_t c : order) printf(" %.6g", s[c]);
            printf(" %.6g\n", first_dropped);
        }
    }
    if (kvpot_tap_request(ctx, nullptr, 0) < 0) die("kvpot_tap_request");
    if (kvpot_pot_compact(ctx, keep.data(), n_layer, n_head, N_KEEP, true) < 0) die("kvpot_pot_compact");
    if (kvpot_pot_stats_get(ctx, &st) < 0) die("kvpot_pot_stats_get");
    printf("after cells %d pos_next %d compactions %d\n", st.n_cells_used, st.pos_next, st.n_compactions);

    const std::vector<llama_token> q = tokenize(vocab, "\nQuestion: what is the access code for the salt warehouse?\nAnswer:", false);
    decode(ctx, batch, q.data(), (int32_t) q.size(), st.pos_next, false);
    const float * logits = llama_get_logits_ith(ctx, -1);
    std::vector<int32_t> top(n_vocab);
    std::iota(top.begin(), top.end(), 0);
    std::partial_sort(top.begin(), top.begin() + 10, top.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    printf("logits");
    for (int32_t t = 0; t < n_vocab; t += 97) printf(" %.6g", logits[t]);
    for (int32_t i = 0; i < 10; ++i) printf(" %.6g", logits[top[i]]);
    printf("\ntop");
    for (int32_t i = 0; i < 10; ++i) printf(" %d", top[i]);
    printf("\n");

    if (argc > 3) {
        // the same document in a fresh cache, compacted with the reference run's cells
        std::ifstream ref(argv[3]);
        std::map<std::pair<int32_t, int32_t>, std::vector<int32_t>> rows_ref;
        for (std::string line; std::getline(ref, line);) {
            std::istringstream is(line);
            std::string tag;
            int32_t l, h;
            if (!(is >> tag) || tag != "kept" || !(is >> l >> h)) {
                continue;
            }
            for (int32_t c; is >> c;) rows_ref[{l, h}].push_back(c);
        }
        for (int32_t l = 0; l < n_layer; ++l) {
            for (int32_t h = 0; h < n_head; ++h) {
                const auto & r = rows_ref[{il[l], h}];
                if ((int32_t) r.size() != N_KEEP) {
                    fprintf(stderr, "pot_check: %s has no kept row for layer %d head %d\n", argv[3], il[l], h);
                    return 1;
                }
                std::copy(r.begin(), r.end(), keep.begin() + ((size_t) l*n_head + h)*N_KEEP);
            }
        }
        reread(ctx, batch, doc, N_DOC);
        if (kvpot_pot_compact(ctx, keep.data(), n_layer, n_head, N_KEEP, true) < 0) die("kvpot_pot_compact");
        if (kvpot_pot_stats_get(ctx, &st) < 0) die("kvpot_pot_stats_get");
        decode(ctx, batch, q.data(), (int32_t) q.size(), st.pos_next, false);
        print_row("imposed", sampled_logits(ctx, n_vocab));
    }

    // InfiniPot's NuC: log p(next token) of every row of a chunk, computed inside the graph while the
    // chunk marks only its last row for logits (what kvpot reads with), against log_softmax of the same
    // rows' full logits from a plain decode of the same chunk, both on this device
    {
        const int32_t p0 = N_DOC - 2*CHUNK;
        std::vector<float> nuc(CHUNK), ref(CHUNK);
        reread(ctx, batch, doc, p0);
        if (kvpot_logprobs_request(ctx, p0, doc.data() + p0 + 1, CHUNK) < 0) die("kvpot_logprobs_request");
        decode(ctx, batch, doc.data() + p0, CHUNK, p0, false);
        if (kvpot_logprobs_get(ctx, nuc.data(), CHUNK) < 0) die("kvpot_logprobs_get");
        if (kvpot_logprobs_request(ctx, 0, nullptr, 0) < 0) die("kvpot_logprobs_request");

        reread(ctx, batch, doc, p0);
        decode(ctx, batch, doc.data() + p0, CHUNK, p0, true);
        for (int32_t i = 0; i < CHUNK; ++i) {
            const float * lg = llama_get_logits_ith(ctx, i);
            const float mx = *std::max_element(lg, lg + n_vocab);
            double sum = 0.0;
            for (int32_t t = 0; t < n_vocab; ++t) sum += exp((double) lg[t] - mx);
            ref[i] = (float) (lg[doc[p0 + 1 + i]] - mx - log(sum));
        }
        printf("nuc");
        for (float v : nuc) printf(" %.6g", v);
        printf("\nnuc_ref");
        for (float v : ref) printf(" %.6g", v);
        printf("\n");
    }

    // Locret's retaining heads with seeded weights: every layer scores a chunk inside the graph, against
    // fc2 · SiLU(fc1 · x) computed here from x, the same device's captured heads input [Q; K; V]
    const int32_t n_layer_m = llama_model_n_layer(model);
    const int32_t n_head_q  = llama_model_n_head(model);
    const int32_t d_head    = llama_model_n_embd(model) / n_head_q; // llama: d_k = d_v = n_embd / n_head
    {
        const int32_t width  = n_head_q*d_head + 2*n_head*d_head;
        const int32_t hidden = 32;
        const std::vector<float> fc1 = seeded((size_t) n_layer_m*hidden*width, 1.0f/sqrtf((float) width), 1);
        const std::vector<float> fc2 = seeded((size_t) n_layer_m*n_head*hidden, 1.0f/sqrtf((float) hidden), 2);
        llama_memory_clear(llama_get_memory(ctx), true);
        kvpot_pot_reset(ctx);
        if (kvpot_heads_set(ctx, n_layer_m, hidden, width, n_head, 0, fc1.data(), fc2.data()) < 0) die("kvpot_heads_set");
        if (kvpot_capture_enable(ctx, true) < 0) die("kvpot_capture_enable");
        decode(ctx, batch, doc.data(), CHUNK, 0, false);
        std::vector<float> got, want, sc((size_t) CHUNK*n_head), x((size_t) CHUNK*width);
        for (int32_t l = 0; l < n_layer_m; ++l) {
            if (kvpot_heads_take(ctx, l, sc.data(), CHUNK, n_head) != CHUNK) die("kvpot_heads_take");
            if (kvpot_capture_qkv_take(ctx, l, x.data(), CHUNK, width) != CHUNK) die("kvpot_capture_qkv_take");
            got.insert(got.end(), sc.begin(), sc.end());
            for (int32_t t = 0; t < CHUNK; ++t) {
                std::vector<double> hid(hidden);
                for (int32_t j = 0; j < hidden; ++j) {
                    const float * w = fc1.data() + ((size_t) l*hidden + j)*width;
                    double a = 0.0;
                    for (int32_t e = 0; e < width; ++e) a += (double) w[e]*x[(size_t) t*width + e];
                    hid[j] = a/(1.0 + exp(-a)); // SiLU
                }
                for (int32_t h = 0; h < n_head; ++h) {
                    const float * w = fc2.data() + ((size_t) l*n_head + h)*hidden;
                    double a = 0.0;
                    for (int32_t j = 0; j < hidden; ++j) a += (double) w[j]*hid[j];
                    want.push_back((float) a);
                }
            }
        }
        print_row("heads", got);
        print_row("heads_ref", want);
        if (kvpot_capture_enable(ctx, false) < 0) die("kvpot_capture_enable");
        if (kvpot_heads_set(ctx, 0, 0, 0, 0, 0, nullptr, nullptr) < 0) die("kvpot_heads_set");
    }

    // EdgeInfinite's gated memory with a seeded gate (it needs an f16 or f32 cache: f16 runs only). The
    // first N_FOLD cells of every pot layer and KV head are folded, M += sigma(K)^T V and z += sum sigma(k)
    // with sigma = ELU + 1, checked against the same sums here over the cache's own K and V; the cells
    // are then compacted away and the question is read with the memory mixed in (`gated`), and again
    // without a gate over the same kept cells (`ungated`: the memory must change the answer's logits)
    if (cp.type_k == GGML_TYPE_F16 && cp.type_v == GGML_TYPE_F16) {
        const int32_t d_h = 32, n_fold = N_FOLD, n_rest = N_DOC - N_FOLD;
        const std::vector<float> w1 = seeded((size_t) n_layer*d_h*d_head, 1.0f/sqrtf((float) d_head), 3);
        const std::vector<float> b1 = seeded((size_t) n_layer*d_h, 0.1f, 4);
        const std::vector<float> w2 = seeded((size_t) n_layer*d_head*d_h, 1.0f/sqrtf((float) d_h), 5);
        const std::vector<float> b2 = seeded((size_t) n_layer*d_head, 0.1f, 6);
        const std::vector<float> g((size_t) n_layer*n_head_q*d_head, 2.0f); // sigmoid(2) = 0.88: mostly memory
        std::vector<int32_t> fold((size_t) n_layer*n_head*n_fold), rest((size_t) n_layer*n_head*n_rest);
        for (size_t r = 0; r < (size_t) n_layer*n_head; ++r) {
            std::iota(fold.begin() + r*n_fold, fold.begin() + (r + 1)*n_fold, 0);
            std::iota(rest.begin() + r*n_rest, rest.begin() + (r + 1)*n_rest, n_fold);
        }
        for (const bool gated : {true, false}) {
            if (gated) {
                if (kvpot_gate_set(ctx, n_layer, d_head, d_h, n_head_q, w1.data(), b1.data(), w2.data(), b2.data(),
                                   g.data()) < 0) die("kvpot_gate_set");
            } else if (kvpot_gate_set(ctx, 0, 0, 0, 0, nullptr, nullptr, nullptr, nullptr, nullptr) < 0) {
                die("kvpot_gate_set");
            }
            reread(ctx, batch, doc, N_DOC);
            if (gated) {
                if (kvpot_memory_fold(ctx, fold.data(), n_layer, n_head, n_fold) < 0) die("kvpot_memory_fold");
                std::vector<uint8_t> bytes((size_t) kvpot_memory_state_size(ctx));
                if (kvpot_memory_state_get(ctx, bytes.data(), bytes.size()) < 0) die("kvpot_memory_state_get");
                std::vector<float> mem((bytes.size() - MEM_HEADER)/sizeof(float)), ref;
                memcpy(mem.data(), bytes.data() + MEM_HEADER, mem.size()*sizeof(float));
                std::vector<float> k((size_t) n_fold*d_head), v((size_t) n_fold*d_head);
                for (int32_t l = 0; l < n_layer; ++l) {
                    std::vector<float> z((size_t) n_head*d_head);
                    for (int32_t h = 0; h < n_head; ++h) {
                        if (kvpot_pot_read(ctx, l, h, 0, 0, n_fold, k.data(), (int32_t) k.size()) < 0) die("kvpot_pot_read");
                        if (kvpot_pot_read(ctx, l, h, 1, 0, n_fold, v.data(), (int32_t) v.size()) < 0) die("kvpot_pot_read");
                        for (float & e : k) e = e > 0.0f ? e + 1.0f : expf(e); // ELU + 1
                        for (int32_t b = 0; b < d_head; ++b) {      // M_h [d_v][d_k]
                            for (int32_t a = 0; a < d_head; ++a) {
                                double m = 0.0;
                                for (int32_t c = 0; c < n_fold; ++c) m += (double) k[(size_t) c*d_head + a]*v[(size_t) c*d_head + b];
                                ref.push_back((float) m);
                            }
                        }
                        for (int32_t a = 0; a < d_head; ++a) {
                            double s = 0.0;
                            for (int32_t c = 0; c < n_fold; ++c) s += k[(size_t) c*d_head + a];
                            z[(size_t) h*d_head + a] = (float) s;
                        }
                    }
                    ref.insert(ref.end(), z.begin(), z.end());
                }
                if (ref.size() != mem.size()) {
                    fprintf(stderr, "pot_check: memory of %zu floats, expected %zu\n", mem.size(), ref.size());
                    return 1;
                }
                print_row("memory", every(mem, 7));
                print_row("memory_ref", every(ref, 7));
            }
            if (kvpot_pot_compact(ctx, rest.data(), n_layer, n_head, n_rest, true) < 0) die("kvpot_pot_compact");
            if (kvpot_pot_stats_get(ctx, &st) < 0) die("kvpot_pot_stats_get");
            decode(ctx, batch, q.data(), (int32_t) q.size(), st.pos_next, false);
            print_row(gated ? "gated" : "ungated", sampled_logits(ctx, n_vocab));
        }
    }

    // InfLLM's lookup inside the layer (f16 runs, after the gate is gone): the first N_FOLD cells go to
    // a block store as BLOCK-token blocks (keys at RoPE 0, each block's mean key as its representative),
    // the rest stay, N_FETCH blocks' cells are reserved, and the question's graph chooses and fetches
    // blocks per layer. `lookup` is what each layer's graph fetched, `lookup_ref` the top blocks for the
    // query the same graph captured, ranked on the host by kvpot_blocks_topk (in double); `lookup_scores`
    // every block's relevance (near-ties); `recalled` the logits after the question
    if (cp.type_k == GGML_TYPE_F16 && cp.type_v == GGML_TYPE_F16) {
        const int32_t BLOCK = 16, N_FETCH = 2, N_LOCAL = 64, n_blocks = N_FOLD / BLOCK, n_rest = N_DOC - N_FOLD;
        reread(ctx, batch, doc, N_DOC);
        std::vector<float> k((size_t) n_layer*n_head*N_FOLD*d_head), v(k.size());
        if (kvpot_pot_read_at(ctx, 0, N_FOLD, 0, k.data(), v.data()) < 0) die("kvpot_pot_read_at");
        char path[] = "/tmp/pot_check-XXXXXX";
        const int fd = mkstemp(path);
        if (fd < 0) {
            fprintf(stderr, "pot_check: cannot make a temporary file name\n");
            return 1;
        }
        close(fd);
        unlink(path); // kvpot_blocks_open(create) refuses an existing path
        kvpot_blocks * bs = kvpot_blocks_open(path, n_layer, n_head, d_head, d_head, BLOCK, GGML_TYPE_F16,
                                              GGML_TYPE_F16, 2*N_FETCH, true);
        if (!bs) die("kvpot_blocks_open");
        for (int32_t b = 0; b < n_blocks; ++b) {
            std::vector<int32_t> pos(BLOCK);
            std::iota(pos.begin(), pos.end(), b*BLOCK);
            std::vector<float> bk, bv, repr((size_t) n_layer*n_head*d_head, 0.0f);
            for (int32_t r = 0; r < n_layer*n_head; ++r) {
                const size_t at = ((size_t) r*N_FOLD + (size_t) b*BLOCK)*d_head;
                bk.insert(bk.end(), k.begin() + at, k.begin() + at + (size_t) BLOCK*d_head);
                bv.insert(bv.end(), v.begin() + at, v.begin() + at + (size_t) BLOCK*d_head);
                for (int32_t t = 0; t < BLOCK; ++t) {
                    for (int32_t e = 0; e < d_head; ++e) repr[(size_t) r*d_head + e] += k[at + (size_t) t*d_head + e]/BLOCK;
                }
            }
            if (kvpot_blocks_append(bs, pos.data(), repr.data(), bk.data(), bv.data()) != b) die("kvpot_blocks_append");
        }
        std::vector<int32_t> rest((size_t) n_layer*n_head*n_rest);
        for (size_t r = 0; r < (size_t) n_layer*n_head; ++r) {
            std::iota(rest.begin() + r*n_rest, rest.begin() + (r + 1)*n_rest, N_FOLD);
        }
        // text positions kept (InfLLM does not re-encode), so the reserved cells have positions to take
        if (kvpot_pot_compact(ctx, rest.data(), n_layer, n_head, n_rest, false) < 0) die("kvpot_pot_compact");
        const int32_t n_cells = N_FETCH*BLOCK;
        std::vector<float> zk((size_t) n_layer*n_head*n_cells*d_head, 0.0f);
        std::vector<llama_pos> zpos(n_cells, 0);
        if (kvpot_pot_insert(ctx, n_cells, zk.data(), zk.data(), zpos.data(), 0) < 0) die("kvpot_pot_insert");
        if (kvpot_lookup_set(ctx, bs, n_rest, N_FETCH, N_LOCAL) < 0) die("kvpot_lookup_set");
        if (kvpot_query_request(ctx, true, N_LOCAL) < 0) die("kvpot_query_request");
        if (kvpot_pot_stats_get(ctx, &st) < 0) die("kvpot_pot_stats_get");
        decode(ctx, batch, q.data(), (int32_t) q.size(), st.pos_next, false);
        const std::vector<float> recalled = sampled_logits(ctx, n_vocab);
        std::vector<float> got, want, scores, qv((size_t) n_head*d_head), sc(n_blocks);
        std::vector<int32_t> fetched(N_FETCH), fpos(n_cells), top(N_FETCH);
        for (int32_t l = 0; l < n_layer; ++l) {
            if (kvpot_lookup_take(ctx, l, fetched.data(), N_FETCH, fpos.data(), n_cells) != N_FETCH) die("kvpot_lookup_take");
            if (kvpot_query_take(ctx, l, qv.data(), (int32_t) qv.size()) != (int32_t) qv.size()) die("kvpot_query_take");
            if (kvpot_blocks_topk(bs, l, qv.data(), N_FETCH, top.data(), sc.data()) != N_FETCH) die("kvpot_blocks_topk");
            std::sort(top.begin(), top.end());
            got.insert(got.end(), fetched.begin(), fetched.end());
            want.insert(want.end(), top.begin(), top.end());
            scores.insert(scores.end(), sc.begin(), sc.end());
        }
        // the fetched cells read back at RoPE 0 (every 7th float of K, then of V) against the blocks the
        // store holds for what each layer fetched: the fetch, its RoPE to the lookup's angle and the copy
        // into the cache checked on this machine alone, apart from the attention that reads them
        std::vector<float> fk((size_t) n_layer*n_head*n_cells*d_head), fv(fk.size()), rk(fk.size()), rv(fk.size());
        if (kvpot_pot_read_at(ctx, n_rest, n_cells, 0, fk.data(), fv.data()) < 0) die("kvpot_pot_read_at");
        for (int32_t l = 0; l < n_layer; ++l) {
            for (int32_t h = 0; h < n_head; ++h) {
                const size_t r = (size_t) l*n_head + h;
                for (int32_t c = 0; c < n_cells; ++c) {
                    const size_t from = (r*N_FOLD + (size_t) got[(size_t) l*N_FETCH + c/BLOCK]*BLOCK + c%BLOCK)*d_head;
                    std::copy_n(k.begin() + from, d_head, rk.begin() + (r*n_cells + c)*d_head);
                    std::copy_n(v.begin() + from, d_head, rv.begin() + (r*n_cells + c)*d_head);
                }
            }
        }
        std::vector<float> fetched_kv = every(fk, 7), fetched_ref = every(rk, 7);
        const std::vector<float> fv7 = every(fv, 7), rv7 = every(rv, 7);
        fetched_kv.insert(fetched_kv.end(), fv7.begin(), fv7.end());
        fetched_ref.insert(fetched_ref.end(), rv7.begin(), rv7.end());
        // and K as the cache holds it, at the lookup's angle, against the stored (f16) keys rotated to that
        // angle here: the rotation itself, which a rotation there and back in one wrong mode would hide
        const llama_pos angle = std::max(0, st.pos_next - N_LOCAL);
        for (float & e : rk) e = ggml_fp16_to_fp32(ggml_fp32_to_fp16(e));
        for (float & e : rv) e = ggml_fp16_to_fp32(ggml_fp32_to_fp16(e));
        std::vector<float> at_angle = rk;
        const bool neox = llama_model_rope_type(model) == LLAMA_ROPE_TYPE_NEOX;
        if (llama_model_rope_freq_scale_train(model) != 1.0f) die("rope frequency scaling (not in pot_check's host RoPE)");
        for (size_t i = 0; i < at_angle.size(); i += d_head) rope_host(at_angle.data() + i, d_head, angle, rope_base(model), neox);
        if (kvpot_pot_read_at(ctx, n_rest, n_cells, angle, fk.data(), fv.data()) < 0) die("kvpot_pot_read_at");
        print_row("lookup", got);
        print_row("lookup_ref", want);
        print_row("lookup_scores", scores);
        print_row("fetched", fetched_kv);
        print_row("fetched_ref", fetched_ref);
        print_row("fetched_at", every(fk, 7));
        print_row("fetched_at_ref", every(at_angle, 7));
        print_row("recalled", recalled);
        if (kvpot_query_request(ctx, false, 0) < 0) die("kvpot_query_request");
        if (kvpot_lookup_set(ctx, nullptr, 0, 0, 0) < 0) die("kvpot_lookup_set");

        // the same blocks put in by the host instead (kvpot_pot_insert, their keys rounded to f16 as the
        // store holds them, rotated from RoPE 0 to the lookup's angle), then the same question:
        // `recalled_ref` must equal `recalled` on this device, so whatever differs between two devices
        // after the lookup is llama.cpp's attention over the same cells, not the lookup
        reread(ctx, batch, doc, N_DOC);
        if (kvpot_pot_compact(ctx, rest.data(), n_layer, n_head, n_rest, false) < 0) die("kvpot_pot_compact");
        if (kvpot_pot_stats_get(ctx, &st) < 0) die("kvpot_pot_stats_get");
        const std::vector<llama_pos> at_zero(n_cells, 0);
        if (kvpot_pot_insert(ctx, n_cells, rk.data(), rv.data(), at_zero.data(), angle) < 0) {
            die("kvpot_pot_insert");
        }
        if (kvpot_pot_stats_get(ctx, &st) < 0) die("kvpot_pot_stats_get");
        decode(ctx, batch, q.data(), (int32_t) q.size(), st.pos_next, false);
        print_row("recalled_ref", sampled_logits(ctx, n_vocab));
        kvpot_blocks_free(bs);
        unlink(path);
    }

    // stock llama.cpp at the question's last row: the whole document, no pot operation, then the
    // question; the logits every check after the question is calibrated by across two machines
    reread(ctx, batch, doc, N_DOC);
    decode(ctx, batch, q.data(), (int32_t) q.size(), N_DOC, false);
    print_row("stock_q", sampled_logits(ctx, n_vocab));

    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
