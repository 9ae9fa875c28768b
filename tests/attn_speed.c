// One layer's attention of a 512-row chunk over a pot's cells, both ways llama.cpp computes it on the CPU:
// flash attention (ggml_flash_attn_ext, V not transposed) and without it (K·Q, soft_max, V·KQ, V stored
// transposed). Times each and says how far the two results are apart. studies/attn_speed.py builds and
// runs it against the installed llama_cpp's libggml (docs/benchmarks.md, "Flash attention").
//
// usage: attn_speed HEAD_DIM N_HEAD N_HEAD_KV CELLS ROWS THREADS REPS
// prints: flash_off_ms F flash_on_ms F max_abs_diff F nmse F
#include "ggml.h"
#include "ggml-alloc.h"  // ggml_backend_alloc_ctx_tensors
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static float uniform(void) { return rand() / (float) RAND_MAX - 0.5f; }

static double time_graph(ggml_backend_t be, struct ggml_cgraph * gf, int reps) {
    ggml_backend_graph_compute(be, gf);  // first run: pages faulted in, threads started
    double t0 = now_s();
    for (int r = 0; r < reps; r++) {
        ggml_backend_graph_compute(be, gf);
    }
    return (now_s() - t0) / reps;
}

int main(int argc, char ** argv) {
    if (argc != 8) {
        fprintf(stderr, "usage: %s HEAD_DIM N_HEAD N_HEAD_KV CELLS ROWS THREADS REPS\n", argv[0]);
        return 2;
    }
    const int d = atoi(argv[1]), n_head = atoi(argv[2]), n_head_kv = atoi(argv[3]), n_kv = atoi(argv[4]);
    const int n_rows = atoi(argv[5]), threads = atoi(argv[6]), reps = atoi(argv[7]);
    if (d <= 0 || n_head <= 0 || n_head_kv <= 0 || n_head % n_head_kv || n_kv <= 0 || n_rows <= 0 || threads <= 0 || reps <= 0) {
        fprintf(stderr, "bad shape\n");
        return 2;
    }
    struct ggml_init_params ip = {64 * ggml_tensor_overhead() + 2 * ggml_graph_overhead(), NULL, true};
    struct ggml_context * ctx = ggml_init(ip);
    // the chunk's queries, as llama.cpp permutes them for attention
    struct ggml_tensor * q    = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, d, n_rows, n_head);       // [d, rows, heads]
    struct ggml_tensor * k    = ggml_new_tensor_3d(ctx, GGML_TYPE_F16, d, n_kv, n_head_kv);      // [d, cells, kv heads]
    struct ggml_tensor * v    = ggml_new_tensor_3d(ctx, GGML_TYPE_F16, d, n_kv, n_head_kv);      // flash: [d, cells, kv heads]
    struct ggml_tensor * vt   = ggml_new_tensor_3d(ctx, GGML_TYPE_F16, n_kv, d, n_head_kv);      // without: [cells, d, kv heads]
    struct ggml_tensor * mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, n_kv, n_rows);           // [cells, rows]: all visible
    const float scale = 1.0f / sqrtf((float) d);

    struct ggml_tensor * on = ggml_flash_attn_ext(ctx, q, k, v, mask, scale, 0.0f, 0.0f);    // [d, heads, rows]
    struct ggml_tensor * kq = ggml_soft_max_ext(ctx, ggml_mul_mat(ctx, k, q), mask, scale, 0.0f);  // [cells, rows, heads]
    struct ggml_tensor * off = ggml_mul_mat(ctx, vt, kq);                                         // [d, rows, heads]
    struct ggml_cgraph * g_on = ggml_new_graph(ctx);
    struct ggml_cgraph * g_off = ggml_new_graph(ctx);
    ggml_build_forward_expand(g_on, on);
    ggml_build_forward_expand(g_off, off);

    ggml_backend_t be = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(be, threads);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, be);
    if (!buf) {
        fprintf(stderr, "cannot allocate the tensors\n");
        return 1;
    }

    srand(1);
    const size_t nq = ggml_nelements(q), nk = ggml_nelements(k), nm = ggml_nelements(mask);
    float * fq = malloc(nq * sizeof(float));
    ggml_fp16_t * hk = malloc(nk * sizeof(ggml_fp16_t)), * hv = malloc(nk * sizeof(ggml_fp16_t));
    ggml_fp16_t * hvt = malloc(nk * sizeof(ggml_fp16_t)), * hm = calloc(nm, sizeof(ggml_fp16_t));
    for (size_t i = 0; i < nq; i++) fq[i] = uniform();
    for (size_t i = 0; i < nk; i++) hk[i] = ggml_fp32_to_fp16(uniform());
    for (size_t i = 0; i < nk; i++) hv[i] = ggml_fp32_to_fp16(uniform());
    for (int h = 0; h < n_head_kv; h++) {  // the same V, transposed as llama.cpp stores it without flash attention
        for (int c = 0; c < n_kv; c++) {
            for (int i = 0; i < d; i++) {
                hvt[((size_t) h * d + i) * n_kv + c] = hv[((size_t) h * n_kv + c) * d + i];
            }
        }
    }
    ggml_backend_tensor_set(q, fq, 0, ggml_nbytes(q));
    ggml_backend_tensor_set(k, hk, 0, ggml_nbytes(k));
    ggml_backend_tensor_set(v, hv, 0, ggml_nbytes(v));
    ggml_backend_tensor_set(vt, hvt, 0, ggml_nbytes(vt));
    ggml_backend_tensor_set(mask, hm, 0, ggml_nbytes(mask));

    // every tensor, the results included, has its place in buf: no graph allocator needed
    float * r_on = malloc(ggml_nbytes(on)), * r_off = malloc(ggml_nbytes(off));
    const double t_off = time_graph(be, g_off, reps);
    ggml_backend_tensor_get(off, r_off, 0, ggml_nbytes(off));
    const double t_on = time_graph(be, g_on, reps);
    ggml_backend_tensor_get(on, r_on, 0, ggml_nbytes(on));
    double diff = 0, err2 = 0, ref2 = 0;  // off is [d, rows, heads], on is [d, heads, rows]
    for (int h = 0; h < n_head; h++) {
        for (int r = 0; r < n_rows; r++) {
            for (int i = 0; i < d; i++) {
                double a = r_off[((size_t) h * n_rows + r) * d + i], b = r_on[((size_t) r * n_head + h) * d + i];
                diff = fmax(diff, fabs(a - b));
                err2 += (a - b) * (a - b);
                ref2 += a * a;
            }
        }
    }
    // nmse as test-backend-ops reports it: flash attention may accumulate in f16 on the CPU
    printf("flash_off_ms %.2f flash_on_ms %.2f max_abs_diff %.3g nmse %.3g\n", t_off * 1e3, t_on * 1e3, diff,
           ref2 > 0 ? err2 / ref2 : 0.0);
    return 0;
}
