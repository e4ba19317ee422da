// gemm.c: the CPU backend's fp32 GEMM (cpu_sgemm) and the choice of library behind it. OpenBLAS is
// the default; oneDNN's sgemm is taken when it is clearly faster on this machine (Debian's OpenBLAS
// picks its kernels by CPU model and can miss: on a CPU it does not know it falls back to SSE3
// kernels, while oneDNN generates code for the instruction sets it finds). The choice is made once,
// at the first GEMM: SHARDLM_GEMM=openblas|onednn forces it; otherwise both libraries run the same
// two model-shaped products (a linear layer's forward, A @ B^T, and its weight gradient, A^T @ B)
// and oneDNN is chosen only when OpenBLAS takes over 1.5x its time. The margin keeps the choice
// stable from run to run on one machine (results are bit-reproducible only with the same library);
// `shardlm report` and the start-up lines print the choice and the measured rates.
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

#define ONEDNN_MARGIN 1.5

static int use_onednn;
static char description[256];
static pthread_once_t once = PTHREAD_ONCE_INIT;

void cpu_gemm_openblas(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                       int ldb, float beta, float *C, int ldc) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda,
                B, ldb, beta, C, ldc);
}

// oneDNN's sgemm is row-major like the calls above; a call it refuses goes to OpenBLAS.
void cpu_gemm_onednn(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                        int ldb, float beta, float *C, int ldc) {
    if (dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc) != dnnl_success)
        cpu_gemm_openblas(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

typedef void (*gemm_fn)(int, int, int, int, int, float, const float *, int, const float *, int, float, float *, int);

static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// The best of 3 timed runs (after one untimed) of a linear layer's two GEMM shapes; GFLOP/s.
static double probe(gemm_fn gemm, const float *x, const float *w, float *y, float *dw) {
    enum { N = 384, IC = 1024, OC = 768 };
    double best = 0;
    for (int rep = 0; rep < 4; rep++) {
        double t0 = seconds();
        gemm(0, 1, N, OC, IC, 1.0f, x, IC, w, IC, 0.0f, y, OC);   // y (N,OC) = x (N,IC) @ w^T
        gemm(1, 0, OC, IC, N, 1.0f, y, OC, x, IC, 0.0f, dw, IC);  // dw (OC,IC) = dy^T @ x
        double rate = 4.0 * N * IC * OC / (seconds() - t0) / 1e9;
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
        return;
    }
    size_t nx = 384 * 1024, nw = 768 * 1024, ny = 384 * 768;
    float *x = malloc(nx * sizeof(float)), *w = malloc(nw * sizeof(float)), *y = malloc(ny * sizeof(float));
    float *dw = malloc(nw * sizeof(float));
    if (!x || !w || !y || !dw) {
        snprintf(description, sizeof description, "%s (no memory to measure oneDNN against it)", openblas);
    } else {
        for (size_t i = 0; i < nx; i++) x[i] = (float)(i % 13) * 0.01f;
        for (size_t i = 0; i < nw; i++) w[i] = (float)(i % 7) * 0.01f;
        double r_blas = probe(cpu_gemm_openblas, x, w, y, dw), r_dnnl = probe(cpu_gemm_onednn, x, w, y, dw);
        use_onednn = r_dnnl > ONEDNN_MARGIN * r_blas;
        snprintf(description, sizeof description, "%s: measured %.0f GFLOP/s, %s %.0f GFLOP/s (%d threads)",
                 use_onednn ? onednn : openblas, use_onednn ? r_dnnl : r_blas, use_onednn ? openblas : onednn,
                 use_onednn ? r_blas : r_dnnl, omp_get_max_threads());
    }
    free(x);
    free(w);
    free(y);
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
