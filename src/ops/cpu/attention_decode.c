// attention_decode.c: one query position against the KV cache (ops_list.h attention_decode), the
// attention of a decode step, for fp32 storage (sl_ops_cpu) and bf16 storage (cpu-bf16-onednn). The
// bf16 version widens each cached key and value as it reads it, instead of staging the whole cache
// (n_ctx x NKV x HD, twice, every layer of every token) into fp32 scratch first; it computes exactly
// what the fp32 op computes on the widened values, in the same order, and rounds the output once, so
// it gives the staged op's bits (tests/unit/test_cpu_bf16_native.c). Parallel over query heads; each
// head's result is one thread's, so any thread count gives the same bits.
#include "ops/cpu/cpu_bf16.h"
#include "ops/cpu/vec_math.h"

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

// Query head h: o (HD, fp32) = softmax(q_h k^T / sqrt(HD)) v over the n_ctx cached positions of its kv
// head; q, k_cache, v_cache in the storage `bf16` says (a constant after inlining: each caller's loops
// are compiled for its storage). p: n_ctx floats of scratch.
__attribute__((always_inline)) static inline void decode_head(float *o, float *p, const void *q, const void *k_cache,
                                                              const void *v_cache, int h, int n_ctx, int NH, int NKV,
                                                              int HD, int bf16) {
    size_t kv0 = (size_t)(h / (NH / NKV)) * HD, q0 = (size_t)h * HD, stride = (size_t)NKV * HD;
    float scale = 1.0f / sqrtf((float)HD), mx = -INFINITY, sum = 0.0f;
    for (int j = 0; j < n_ctx; j++) {
        float s = 0.0f;
        size_t kj = kv0 + (size_t)j * stride;
#pragma omp simd reduction(+ : s)
        for (int c = 0; c < HD; c++) s += load(q, q0 + c, bf16) * load(k_cache, kj + c, bf16);
        p[j] = s * scale;
        mx = p[j] > mx ? p[j] : mx;
    }
    for (int j = 0; j < n_ctx; j++) sum += (p[j] = vexpf(p[j] - mx));
    for (int c = 0; c < HD; c++) o[c] = 0.0f;
    for (int j = 0; j < n_ctx; j++) {
        float pj = p[j] / sum;
        size_t vj = kv0 + (size_t)j * stride;
#pragma omp simd
        for (int c = 0; c < HD; c++) o[c] += pj * load(v_cache, vj + c, bf16);
    }
}

// Every head of out (NH*HD, fp32), in parallel over heads. A macro, not a function: GCC outlines an
// OpenMP region where it is written, before inlining, so a region in a shared function would test
// the storage type inside its loops.
#define DECODE_HEADS(out, q, k_cache, v_cache, n_ctx, NH, NKV, HD, BF16)                                   \
    _Pragma("omp parallel if((size_t)(n_ctx) * (NH) * (HD) >= SL_PAR_MIN_WORK)") {                        \
        float *p_ = malloc(sizeof(float) * (size_t)(n_ctx));                                               \
        _Pragma("omp for schedule(static)") for (int h = 0; h < (NH); h++) if (p_)                          \
            decode_head((out) + (size_t)h * (HD), p_, q, k_cache, v_cache, h, n_ctx, NH, NKV, HD, BF16);     \
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
