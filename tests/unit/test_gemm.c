// test_gemm.c: both CPU GEMM libraries (gemm.c: OpenBLAS and oneDNN's sgemm) against a double-precision
// product, for the three products a linear layer makes (forward A @ B^T, input gradient A @ B, weight
// gradient A^T @ B accumulated with beta = 1) at odd row counts; each library is deterministic for
// a given thread count. Also the automatic choice between them and the CPU feature flags' consistency.
#include "test.h"

#include "ops/cpu/cpu_ops.h"
#include "shardlm/cpu_features.h"
#include "shardlm/rng.h"


typedef void (*gemm_fn)(int, int, int, int, int, float, const float *, int, const float *, int, float, float *, int);

static float *rand_f(size_t n, uint64_t seed) {
    sl_rng r = sl_rng_make(seed, 0, 0, 0);
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = (float)sl_rng_normal(&r);
    return x;
}

// C (M,N) = alpha op(A) op(B) + beta C in double, row-major, with the same leading dimensions.
static void ref_gemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                     int ldb, float beta, const float *C0, double *C, int ldc) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0;
            for (int k = 0; k < K; k++)
                s += (double)(ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k]) *
                     (double)(tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j]);
            C[(size_t)i * ldc + j] = alpha * s + beta * (double)C0[(size_t)i * ldc + j];
        }
}

// One product through `gemm` against the reference: max error relative to the largest |C|.
static double check(gemm_fn gemm, int ta, int tb, int M, int N, int K, float beta) {
    int lda = ta ? M : K, ldb = tb ? K : N, ldc = N;
    float *A = rand_f((size_t)M * K, 1 + M), *B = rand_f((size_t)K * N, 2 + N), *C = rand_f((size_t)M * N, 3);
    float *C0 = malloc((size_t)M * N * sizeof(float));
    memcpy(C0, C, (size_t)M * N * sizeof(float));
    double *want = malloc((size_t)M * N * sizeof(double)), worst = 0, scale = 1e-30;
    ref_gemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C0, want, ldc);
    gemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
    for (size_t i = 0; i < (size_t)M * N; i++) {
        worst = fmax(worst, fabs(C[i] - want[i]));
        scale = fmax(scale, fabs(want[i]));
    }
    // determinism: the same call again gives the same bits
    float *again = rand_f((size_t)M * N, 3);
    gemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, again, ldc);
    int same = !memcmp(again, C, (size_t)M * N * sizeof(float));
    free(A); free(B); free(C); free(C0); free(want); free(again);
    return same ? worst / scale : 1.0;
}

static void check_library(gemm_fn gemm, const char *name) {
    static const int rows[] = {1, 7, 33, 1023};
    for (int r = 0; r < 4; r++) {
        int N = rows[r], IC = 67, OC = 45;
        double fwd = check(gemm, 0, 1, N, OC, IC, 0.0f);    // out = inp @ weight^T
        double dinp = check(gemm, 0, 0, N, IC, OC, 0.0f);   // dinp = dout @ weight
        double dw = check(gemm, 1, 0, OC, IC, N, 1.0f);     // dweight += dout^T @ inp
        CHECK_MSG(fwd < 1e-5 && dinp < 1e-5 && dw < 1e-5, "%s, %d rows: relative errors %.2g %.2g %.2g (1.0: not "
                  "deterministic)", name, N, fwd, dinp, dw);
    }
    // a forward deeper than wide (K 300 > N 260, at least 256 rows: oneDNN's is split by rows across
    // threads), into fresh output and accumulated into it (beta 1), at a row count the threads
    // cannot share evenly
    static const int tall[] = {256, 1023};
    for (int r = 0; r < 2; r++) {
        double fresh = check(gemm, 0, 1, tall[r], 260, 300, 0.0f), acc = check(gemm, 0, 1, tall[r], 260, 300, 1.0f);
        CHECK_MSG(fresh < 1e-5 && acc < 1e-5, "%s, %d rows, 300 -> 260: relative errors %.2g %.2g (1.0: not "
                  "deterministic)", name, tall[r], fresh, acc);
    }
}

TEST(openblas_matches_double_reference) { check_library(cpu_gemm_openblas, "OpenBLAS"); }
TEST(onednn_matches_double_reference) { check_library(cpu_gemm_onednn, "oneDNN"); }

TEST(chosen_gemm_is_described) {
    const char *d = sl_cpu_gemm_description();
    CHECK_MSG(d && (strstr(d, "OpenBLAS") || strstr(d, "oneDNN")), "description '%s'", d ? d : "(null)");
}

// The library the description names first: with SHARDLM_GEMM unset (auto), oneDNN's sgemm on a CPU
// with AVX2 and OpenBLAS on one without; with SHARDLM_GEMM=openblas|onednn, that one.
TEST(choice_follows_avx2_or_setting) {
    const char *forced = getenv("SHARDLM_GEMM"), *want;
    if (forced && !strcmp(forced, "openblas")) want = "OpenBLAS";
    else if (forced && !strcmp(forced, "onednn")) want = "oneDNN";
    else want = sl_cpu_features_get()->avx2 ? "oneDNN" : "OpenBLAS";
    const char *d = sl_cpu_gemm_description();
    CHECK_MSG(d && !strncmp(d, want, strlen(want)), "avx2 %d, SHARDLM_GEMM %s: description '%s', expected %s first",
              sl_cpu_features_get()->avx2, forced ? forced : "(unset)", d ? d : "(null)", want);
}

TEST(cpu_features_are_consistent) {
    const sl_cpu_features *f = sl_cpu_features_get();
    char buf[256];
    sl_cpu_features_describe(buf, sizeof buf);
    CHECK(buf[0] != '\0');
    // an extension implies its base: AVX-512 sub-features need avx512f, which needs the AVX state
    CHECK(!f->avx512_bf16 || f->avx512f);
    CHECK(!f->avx512_vnni || f->avx512f);
    CHECK(!f->avx512f || f->avx2 || !f->fma);
#if defined(__AVX512F__)
    CHECK_MSG(f->avx512f, "built for AVX-512 but not detected");
#endif
#if defined(__AVX2__)
    CHECK_MSG(f->avx2, "built for AVX2 but not detected");
#endif
}

TEST_MAIN()
