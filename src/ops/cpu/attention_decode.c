// attention_decode.c: one query position against the KV cache (ops_list.h attention_decode), the
// attention of a decode step, for fp32 storage (sl_ops_cpu) and bf16 storage (cpu-bf16-onednn). The
// bf16 version widens each cached key and value as it reads it, instead of staging the whole cache
// (n_ctx x NKV x HD, twice, every layer of every token) into fp32 scratch first; it computes exactly
// what the fp32 op computes on the widened values, in the same order, and rounds the output once, so
// it gives the staged op's bits (tests/unit/test_cpu_bf16_native.c). Parallel over query heads; each
// head's result is one thread's, so any thread count gives the same bits.
// Head sizes that are multiples of 16 (64, 128: every preset) take a vector path: a position's score
// is 16 lanes of products, and 16 positions' lanes are summed at once by a transposed tree of
// shuffles (sum16) instead of one horizontal sum per position; the output accumulates in registers.
// GPT-2 124M, bf16, 1 thread, positions 128..191: 2.2-4.5 ms per token before, 0.9-1.7 after (a
// loaded machine, interleaved runs; the rest is the cache's reads).
#include "ops/cpu/cpu_bf16.h"
#include "ops/cpu/vec_math.h"
#include "shardlm/error.h"

#ifdef __AVX512F__
#include <immintrin.h>
#endif
#include <math.h>
#include <stdlib.h>
#include <string.h>

// Element i of fp32 (bf16 = 0) or bf16 (bf16 = 1) storage, as fp32.
__attribute__((always_inline)) static inline float load(const void *p, size_t i, int bf16) {
    if (!bf16) return ((const float *)p)[i];
    unsigned int u = (unsigned int)((const sl_bf16 *)p)[i] << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

// GCC's vector extension (gemv.c's type): 16 floats, lowered to whatever the build's -march offers;
// element-wise adds and multiplies, never fused (-ffp-contract=off in C17 mode).
typedef float v16f __attribute__((vector_size(64)));
typedef unsigned int v16u __attribute__((vector_size(64)));
typedef unsigned short v16h __attribute__((vector_size(32)));

// Elements i..i+15 of fp32 or bf16 storage, as fp32, into *r. Vectors go through pointers, never by
// value (that would change the ABI on a build without AVX-512).
__attribute__((always_inline)) static inline void load16(v16f *r, const void *p, size_t i, int bf16) {
    if (!bf16) {
        memcpy(r, (const float *)p + i, sizeof *r);
        return;
    }
#ifdef __AVX512F__  // one vpmovzxwd: GCC lowers the generic conversion below to four instructions
    __m512i u = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const void *)((const sl_bf16 *)p + i))), 16);
#else
    v16h h;
    memcpy(&h, (const sl_bf16 *)p + i, sizeof h);
    v16u u = __builtin_convertvector(h, v16u) << 16;
#endif
    memcpy(r, &u, sizeof *r);
}

// One level of the transposed lane sums: two vectors whose lanes form groups of g partial sums
// become one whose groups of g/2 hold the pairwise sums (lane j + lane j + g/2 of each group),
// a's and b's groups alternating.
// (__builtin_shufflevector: GCC 12+ and clang, which builds the fuzz targets.)
#define FOLD(a, b, lo, hi) (__builtin_shufflevector((a), (b), lo) + __builtin_shufflevector((a), (b), hi))
#define LO8 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23
#define HI8 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31
#define LO4 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27
#define HI4 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31
#define LO2 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29
#define HI2 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31
#define LO1 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30
#define HI1 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31

// The lane sums of 16 vectors at once: lane j of the result is the sum of v[j]'s lanes, by the
// pairwise tree (l + l+8, then +4, +2, +1), whatever the vector width. The folds leave vector k's sum
// in lane bitrev4(k), so the vectors go in bit-reversed order.
static inline void sum16(v16f *out, const v16f *v) {
    static const int rev[16] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};
    v16f a[8], b[4], c[2];
    for (int i = 0; i < 8; i++) a[i] = FOLD(v[rev[2 * i]], v[rev[2 * i + 1]], LO8, HI8);
    for (int i = 0; i < 4; i++) b[i] = FOLD(a[2 * i], a[2 * i + 1], LO4, HI4);
    for (int i = 0; i < 2; i++) c[i] = FOLD(b[2 * i], b[2 * i + 1], LO2, HI2);
    *out = FOLD(c[0], c[1], LO1, HI1);
}

// Largest head size of the vector path (its output accumulators live in registers).
#define VEC_MAX_HD 256

// Query head h: o (HD, fp32) = softmax(q_h k^T / sqrt(HD)) v over the n_ctx cached positions of its kv
// head; q, k_cache, v_cache in the storage `bf16` says (a constant after inlining: each caller's loops
// are compiled for its storage). p: n_ctx floats of scratch (16 more on the vector path).
// Orders: a score sums q_c k_c in 16 lanes (lane l takes c = l mod 16, c increasing), the lanes by
// sum16's tree, when HD is a multiple of 16 up to VEC_MAX_HD; otherwise c by c. The output sums the
// positions in increasing order. Each head is one thread's, so no order depends on the thread count.
__attribute__((always_inline)) static inline void decode_head(float *o, float *p, const void *q, const void *k_cache,
                                                              const void *v_cache, int h, int n_ctx, int NH, int NKV,
                                                              int HD, int bf16) {
    size_t kv0 = (size_t)(h / (NH / NKV)) * HD, q0 = (size_t)h * HD, stride = (size_t)NKV * HD;
    float scale = 1.0f / sqrtf((float)HD), mx = -INFINITY, sum = 0.0f;
    int vec = HD % 16 == 0 && HD <= VEC_MAX_HD, nv = HD / 16;
    if (vec) {
        v16f qv[VEC_MAX_HD / 16], part[16];
        for (int k = 0; k < nv; k++) load16(&qv[k], q, q0 + 16 * (size_t)k, bf16);
        for (int j0 = 0; j0 < n_ctx; j0 += 16) {
            for (int i = 0; i < 16; i++) {
                v16f s = {0}, kv;
                if (j0 + i < n_ctx) {
                    size_t kj = kv0 + (size_t)(j0 + i) * stride;
                    load16(&kv, k_cache, kj, bf16);
                    s = qv[0] * kv;
                    for (int k = 1; k < nv; k++) {
                        load16(&kv, k_cache, kj + 16 * (size_t)k, bf16);
                        s += qv[k] * kv;
                    }
                }
                part[i] = s;
            }
            v16f s;
            sum16(&s, part);
            s *= scale;
            memcpy(p + j0, &s, sizeof s);  // p has room for a whole last block
        }
        for (int j = 0; j < n_ctx; j++) mx = p[j] > mx ? p[j] : mx;
    } else {
        for (int j = 0; j < n_ctx; j++) {
            float s = 0.0f;
            size_t kj = kv0 + (size_t)j * stride;
            for (int c = 0; c < HD; c++) s += load(q, q0 + c, bf16) * load(k_cache, kj + c, bf16);
            p[j] = s * scale;
            mx = p[j] > mx ? p[j] : mx;
        }
    }
    for (int j = 0; j < n_ctx; j++) sum += (p[j] = vexpf(p[j] - mx));
    if (vec) {
        v16f acc[VEC_MAX_HD / 16];
        for (int k = 0; k < nv; k++) acc[k] = (v16f){0};
        for (int j = 0; j < n_ctx; j++) {
            float pj = p[j] / sum;
            size_t vj = kv0 + (size_t)j * stride;
            for (int k = 0; k < nv; k++) {
                v16f vv;
                load16(&vv, v_cache, vj + 16 * (size_t)k, bf16);
                acc[k] += pj * vv;
            }
        }
        for (int k = 0; k < nv; k++) memcpy(o + 16 * k, &acc[k], sizeof acc[k]);
        return;
    }
    for (int c = 0; c < HD; c++) o[c] = 0.0f;
    for (int j = 0; j < n_ctx; j++) {
        float pj = p[j] / sum;
        size_t vj = kv0 + (size_t)j * stride;
#pragma omp simd
        for (int c = 0; c < HD; c++) o[c] += pj * load(v_cache, vj + c, bf16);
    }
}

// Every head of out (NH*HD, fp32), in parallel over heads (the common head sizes compiled for their
// size, so the vector path's accumulators stay in registers). A macro, not a function: GCC outlines an
// OpenMP region where it is written, before inlining, so a region in a shared function would test
// the storage type inside its loops.
#define DECODE_HEADS(out, q, k_cache, v_cache, n_ctx, NH, NKV, HD, BF16)                                   \
    _Pragma("omp parallel if((size_t)(n_ctx) * (NH) * (HD) >= SL_PAR_MIN_WORK)") {                        \
        float *p_ = malloc(sizeof(float) * ((size_t)(n_ctx) + 16));                                         \
        if (!p_) _Pragma("omp critical(attention_failure)") {                                               \
                sl_errorf("out of memory for %d attention scores", (int)(n_ctx));                           \
                cpu_record_failure("attention_decode");                                                     \
            }                                                                                               \
        _Pragma("omp for schedule(static)") for (int h = 0; h < (NH); h++) if (p_) {                        \
            float *o_ = (out) + (size_t)h * (HD);                                                           \
            if ((HD) == 64) decode_head(o_, p_, q, k_cache, v_cache, h, n_ctx, NH, NKV, 64, BF16);           \
            else if ((HD) == 128) decode_head(o_, p_, q, k_cache, v_cache, h, n_ctx, NH, NKV, 128, BF16);    \
            else decode_head(o_, p_, q, k_cache, v_cache, h, n_ctx, NH, NKV, HD, BF16);                      \
        }                                                                                                   \
        free(p_);                                                                                           \
    }

void cpu_attention_decode(sl_act *out, const sl_act *q, const sl_act *k_cache, const sl_act *v_cache, int n_ctx,
                          int NH, int NKV, int HD) {
    float *o = cpu_f32(out);
    DECODE_HEADS(o, q, k_cache, v_cache, n_ctx, NH, NKV, HD, 0)
}

void cpu_bf16_attention_decode(sl_act *out, const sl_act *q, const sl_act *k_cache, const sl_act *v_cache,
                               int n_ctx, int NH, int NKV, int HD) {
    size_t n = (size_t)NH * HD;
    float *o = cpu_bf16_failed() ? NULL : cpu_bf16_scratch(0, n);
    if (!o) return;
    DECODE_HEADS(o, q, k_cache, v_cache, n_ctx, NH, NKV, HD, 1)
    sl_f32_to_bf16_array(o, (sl_bf16 *)(void *)out, n);
}
