// gemv.c: matrix-vector products for the linear layers at one row (decode at batch 1): y (OC) =
// W (OC, IC) @ x (IC) (+ bias), W row-major as nn.Linear stores it, fp32 accumulation. At one row a
// linear layer reads every weight once and does two FLOPs with it, so its speed is the memory's: the
// kernels stream each weight row once, keep x in L1, and split the rows over the threads in one
// parallel region, in chunks of rows (a GEMM library's blocking and packing cost more than they save at N = 1).
//
// Summation order (the invariant every path keeps): a row's dot product runs in GEMV_LANES lane
// accumulators, lane j taking the products of elements k with k % GEMV_LANES == j in increasing k
// (element pairs (2j, 2j+1) of a 32-element block for bf16, the odd one first, as vdpbf16ps adds
// them); the lanes are then summed by a fixed pairwise tree, then the bias is added. Each output is
// computed by one thread, so results are the same for any thread count; the fp32 path is plain C the
// compiler vectorises (lanes are independent, so vector width does not change a bit). The bf16 path
// runs on AVX512_BF16's vdpbf16ps where the CPU has it (sl_cpu_features_get, checked at run time, the
// code compiled for it by a target attribute whatever the build's -march) and a portable loop
// otherwise; bf16 products are exact in fp32, so both compute the same sums, except that vdpbf16ps
// flushes denormal inputs and results to zero (tests/unit/test_gemv.c bounds the difference).
#include "ops/cpu/cpu_bf16.h"
#include "shardlm/cpu_features.h"

#include <string.h>

#define GEMV_LANES 32

// Below this many weights a product runs on the calling thread (waking the team costs more).
#define GEMV_PAR_MIN ((size_t)1 << 16)

// Rows are handed to the threads in chunks of about this many bytes of weights, first come first
// served (schedule(dynamic)): a thread the OS descheduled for a while no longer holds up a fixed
// half of the rows, and each chunk is one stream long enough for the hardware prefetcher. Which
// thread computes a row never changes its bits.
#define GEMV_CHUNK_BYTES ((size_t)64 << 10)
static inline int chunk_rows(int IC, size_t elem) {
    size_t r = GEMV_CHUNK_BYTES / ((size_t)IC * elem + 1);
    return r < 1 ? 1 : (int)r;
}

// The lanes summed by a fixed pairwise tree.
static inline float sum_lanes(float *acc) {
    for (int w = GEMV_LANES / 2; w >= 1; w /= 2)
        for (int j = 0; j < w; j++) acc[j] += acc[j + w];
    return acc[0];
}

// GCC's vector extension: 16 floats, lowered to whatever the build's -march offers (zmm, two ymm, ...);
// element-wise adds and multiplies, never fused by GCC in C17 mode (-ffp-contract=off), so any width
// gives the same bits. Loaded through memcpy (the rows are not 64-byte aligned), never passed or returned
// by value (that would change the ABI on a build without AVX-512).
typedef float v16f __attribute__((vector_size(64)));

// One row: two 16-lane accumulators (lanes 0..15 take k % 32 < 16, lanes 16..31 the rest). A row at a
// time, streamed start to end: interleaving 2 or 4 rows (sharing x's loads) measured 2-4x slower on the
// AMD EPYC (AVX512_BF16) this was written on (presumably its prefetcher losing the interleaved streams).
static float dot_f32(const float *w, const float *x, int n) {
    v16f a0 = {0}, a1 = {0};
    int k = 0;
    for (; k + GEMV_LANES <= n; k += GEMV_LANES) {
        v16f w0, w1, x0, x1;
        memcpy(&w0, w + k, sizeof w0);
        memcpy(&w1, w + k + 16, sizeof w1);
        memcpy(&x0, x + k, sizeof x0);
        memcpy(&x1, x + k + 16, sizeof x1);
        a0 += w0 * x0;
        a1 += w1 * x1;
    }
    float acc[GEMV_LANES];
    memcpy(acc, &a0, sizeof a0);
    memcpy(acc + 16, &a1, sizeof a1);
    for (int j = 0; k + j < n; j++) acc[j] += w[k + j] * x[k + j];
    return sum_lanes(acc);
}

void cpu_gemv_f32(float *y, const float *W, const float *x, const float *bias, int OC, int IC) {
#pragma omp parallel for schedule(dynamic, chunk_rows(IC, sizeof(float))) if((size_t)OC * IC >= GEMV_PAR_MIN)
    for (int o = 0; o < OC; o++) {
        float s = dot_f32(W + (size_t)o * IC, x, IC);
        y[o] = bias ? s + bias[o] : s;
    }
}

// ---- bf16 weights and input -------------------------------------------------------------------------

static inline float widen(sl_bf16 h) {
    unsigned int u = (unsigned int)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

// Lane j (0..15) of a 32-element block takes elements 2j+1 then 2j, as lane j of a vdpbf16ps does; even
// blocks go to lanes 0..15, odd ones to lanes 16..31 (the AVX512_BF16 kernel's two registers).
static inline void dot_bf16_block(float *a, const sl_bf16 *w, const sl_bf16 *x) {
    for (int j = 0; j < GEMV_LANES / 2; j++)
        a[j] = (a[j] + widen(w[2 * j + 1]) * widen(x[2 * j + 1])) + widen(w[2 * j]) * widen(x[2 * j]);
}

static float dot_bf16_portable(const sl_bf16 *w, const sl_bf16 *x, int n) {
    float acc[GEMV_LANES] = {0};
    int k = 0, half = 0;
    for (; k + GEMV_LANES <= n; k += GEMV_LANES, half ^= 1)
        dot_bf16_block(acc + half * (GEMV_LANES / 2), w + k, x + k);
    if (k < n) {  // the tail, zero-padded to a block
        sl_bf16 wt[GEMV_LANES] = {0}, xt[GEMV_LANES] = {0};
        memcpy(wt, w + k, sizeof(sl_bf16) * (size_t)(n - k));
        memcpy(xt, x + k, sizeof(sl_bf16) * (size_t)(n - k));
        dot_bf16_block(acc + half * (GEMV_LANES / 2), wt, xt);
    }
    return sum_lanes(acc);
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define HAVE_DPBF16 1

// The same lanes in two zmm accumulators (64 elements a step, then a masked tail: zeros add nothing).
__attribute__((target("avx512f,avx512bw,avx512bf16"))) static float dot_bf16_avx512(const sl_bf16 *w,
                                                                                   const sl_bf16 *x, int n) {
    __m512 a[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    int k = 0;
    for (; k + 64 <= n; k += 64) {
        a[0] = _mm512_dpbf16_ps(a[0], (__m512bh)_mm512_loadu_si512(w + k), (__m512bh)_mm512_loadu_si512(x + k));
        a[1] = _mm512_dpbf16_ps(a[1], (__m512bh)_mm512_loadu_si512(w + k + 32),
                                (__m512bh)_mm512_loadu_si512(x + k + 32));
    }
    for (int half = 0; k < n; k += 32, half ^= 1) {
        int left = n - k;
        __mmask32 m = left >= 32 ? 0xffffffffu : (__mmask32)((1u << left) - 1);
        a[half] = _mm512_dpbf16_ps(a[half], (__m512bh)_mm512_maskz_loadu_epi16(m, w + k),
                                   (__m512bh)_mm512_maskz_loadu_epi16(m, x + k));
    }
    float acc[GEMV_LANES];
    _mm512_storeu_ps(acc, a[0]);
    _mm512_storeu_ps(acc + 16, a[1]);
    return sum_lanes(acc);
}
#else
#define HAVE_DPBF16 0
#endif

int cpu_gemv_bf16_native(void) {
#if HAVE_DPBF16
    return sl_cpu_features_get()->avx512_bf16;
#else
    return 0;
#endif
}

void cpu_gemv_bf16_path(float *y, const sl_bf16 *W, const sl_bf16 *x, const sl_bf16 *bias, int OC, int IC,
                        int native) {
    float (*dot)(const sl_bf16 *, const sl_bf16 *, int) = dot_bf16_portable;
#if HAVE_DPBF16
    if (native && cpu_gemv_bf16_native()) dot = dot_bf16_avx512;
#else
    (void)native;
#endif
#pragma omp parallel for schedule(dynamic, chunk_rows(IC, sizeof(sl_bf16))) if((size_t)OC * IC >= GEMV_PAR_MIN)
    for (int o = 0; o < OC; o++) {
        float s = dot(W + (size_t)o * IC, x, IC);
        y[o] = bias ? s + widen(bias[o]) : s;
    }
}

void cpu_gemv_bf16(float *y, const sl_bf16 *W, const sl_bf16 *x, const sl_bf16 *bias, int OC, int IC) {
    cpu_gemv_bf16_path(y, W, x, bias, OC, IC, 1);
}
