// gemm.c: the CPU backend's fp32 GEMM (cpu_sgemm) and the choice of library behind it. oneDNN's sgemm
// is the default wherever the CPU has AVX2: it generates its kernels for the instruction sets it
// finds. On an AMD EPYC (Zen 4, AVX-512) it trained 6-9% faster a step than OpenBLAS 0.3.21 on its own
// AVX-512 (Cooperlake) kernels (bench/gemm_libs.sh, bench/RESULTS.md "CPU GEMM library"), and Debian's
// OpenBLAS picks its kernels by CPU model: on a CPU it does not know it falls back to its SSE3
// (Prescott) kernels, 4x slower than the CPU allows. Without AVX2 (older x86, other architectures)
// OpenBLAS is used. SHARDLM_GEMM=openblas|onednn forces either. The rule reads only cpuid, never a
// clock: timing both at start chose differently from run to run on a busy machine, and results are
// bit-reproducible only on one library. `shardlm report` measures both (sl_cpu_gemm_measure).
#include "ops/cpu/cpu_ops.h"
#include "shardlm/cpu_features.h"
#include "shardlm/settings.h"

#include <cblas.h>
#include <dnnl.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static int use_onednn;
static char description[256];
static pthread_once_t once = PTHREAD_ONCE_INIT;

void cpu_gemm_openblas(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                       int ldb, float beta, float *C, int ldc) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda,
                B, ldb, beta, C, ldc);
}

static void onednn_or_openblas(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                               const float *B, int ldb, float beta, float *C, int ldc) {
    if (dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc) != dnnl_success)
        cpu_gemm_openblas(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// A linear layer's forward into a narrower output (out = inp @ W^T with depth K above width N: LLaMA's
// down_proj 2048 -> 768, GPT-2's mlp c_proj 3072 -> 768) is where oneDNN 2.6's own plan for several
// threads falls short: 164 GFLOP/s on 2 threads against 198 when each thread runs its own block of
// rows alone (AMD EPYC Zen 4, 12 cold weights; bench/RESULTS.md "CPU GEMM library" shows the shape at
// 0.85-0.94x OpenBLAS). So such a product is split by rows here. Not inside a parallel region (the
// caller's threads are busy) and not for small products, where one plan is as good.
static int split_rows(int ta, int tb, int M, int N, int K) {
    return !ta && tb && K > N && N >= 256 && M >= 256 && !omp_in_parallel() && omp_get_max_threads() > 1;
}

// oneDNN's sgemm is row-major like the calls above; a call it refuses goes to OpenBLAS. Inside the
// parallel region oneDNN runs each thread's rows on that thread alone.
void cpu_gemm_onednn(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                        int ldb, float beta, float *C, int ldc) {
    if (!split_rows(ta, tb, M, N, K)) {
        onednn_or_openblas(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
#pragma omp parallel
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        int m0 = (int)((long)M * t / nt), m1 = (int)((long)M * (t + 1) / nt);
        if (m1 > m0)
            onednn_or_openblas(0, 1, m1 - m0, N, K, alpha, A + (size_t)m0 * lda, lda, B, ldb, beta,
                               C + (size_t)m0 * ldc, ldc);
    }
}

typedef void (*gemm_fn)(int, int, int, int, int, float, const float *, int, const float *, int, float, float *, int);

static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// The best of 3 timed runs (after one untimed) of a linear layer's three GEMMs at a training step's
// shape (512 rows, 768 -> 2304: GPT-2's qkv projection): forward, input gradient, weight gradient;
// GFLOP/s.
enum { PROBE_N = 512, PROBE_IC = 768, PROBE_OC = 2304 };
static double probe(gemm_fn gemm, const float *x, const float *w, float *y, float *dx, float *dw) {
    const int N = PROBE_N, IC = PROBE_IC, OC = PROBE_OC;
    double best = 0;
    for (int rep = 0; rep < 4; rep++) {
        double t0 = seconds();
        gemm(0, 1, N, OC, IC, 1.0f, x, IC, w, IC, 0.0f, y, OC);   // y (N,OC) = x (N,IC) @ w^T
        gemm(0, 0, N, IC, OC, 1.0f, y, OC, w, IC, 0.0f, dx, IC);  // dx (N,IC) = dy (N,OC) @ w
        gemm(1, 0, OC, IC, N, 1.0f, y, OC, x, IC, 0.0f, dw, IC);  // dw (OC,IC) = dy^T @ x
        double rate = 6.0 * N * IC * OC / (seconds() - t0) / 1e9;
        if (rep > 0 && rate > best) best = rate;
    }
    return best;
}

static void choose(void) {
    int forced = sl_settings_get()->cpu_gemm;
    const char *core = openblas_get_corename();
    char openblas[96], version[32];
    int n = 0;
    sscanf(OPENBLAS_VERSION, " OpenBLAS %31s%n", version, &n);  // " OpenBLAS 0.3.21 "
    snprintf(openblas, sizeof openblas, "OpenBLAS %s (%s kernels)", n ? version : "?", core ? core : "unknown");
    const dnnl_version_t *v = dnnl_version();
    char onednn[64];
    snprintf(onednn, sizeof onednn, "oneDNN %d.%d.%d sgemm", v->major, v->minor, v->patch);
    if (forced != SL_GEMM_AUTO) {
        use_onednn = forced == SL_GEMM_ONEDNN;
        snprintf(description, sizeof description, "%s (SHARDLM_GEMM)", use_onednn ? onednn : openblas);
    } else if (sl_cpu_features_get()->avx2) {
        use_onednn = 1;
        snprintf(description, sizeof description, "%s (code for this CPU's AVX2 / AVX-512; %s with SHARDLM_GEMM)",
                 onednn, openblas);
    } else {
        snprintf(description, sizeof description, "%s", openblas);
    }
}

void sl_cpu_gemm_measure(double *openblas, double *onednn) {
    size_t nx = (size_t)PROBE_N * PROBE_IC, nw = (size_t)PROBE_OC * PROBE_IC, ny = (size_t)PROBE_N * PROBE_OC;
    float *x = malloc(nx * sizeof(float)), *w = malloc(nw * sizeof(float)), *y = malloc(ny * sizeof(float));
    float *dx = malloc(nx * sizeof(float)), *dw = malloc(nw * sizeof(float));
    *openblas = *onednn = 0;
    if (x && w && y && dx && dw) {
        for (size_t i = 0; i < nx; i++) x[i] = (float)(i % 13) * 0.01f - 0.06f;
        for (size_t i = 0; i < nw; i++) w[i] = (float)(i % 7) * 0.01f - 0.03f;
        *openblas = probe(cpu_gemm_openblas, x, w, y, dx, dw);
        *onednn = probe(cpu_gemm_onednn, x, w, y, dx, dw);
    }
    free(x);
    free(w);
    free(y);
    free(dx);
    free(dw);
}

void cpu_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
               float beta, float *C, int ldc) {
    pthread_once(&once, choose);
    (use_onednn ? cpu_gemm_onednn : cpu_gemm_openblas)(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

const char *sl_cpu_gemm_description(void) {
    pthread_once(&once, choose);
    return description;
}
