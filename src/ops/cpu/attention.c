// attention.c: causal attention on the CPU in the flash-attention style: each query row streams
// over key tiles of ATT_TILE with an online softmax, so at most one tile of scores exists at a
// time. Forward saves the log-sum-exp per row; backward recomputes the probabilities from it.
// Forward is parallel over (batch, head); backward over (batch, kv-head group), because all query
// heads of a group write the same dk/dv rows.
#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/vec_math.h"

#include <math.h>
#include <string.h>

#define ATT_TILE 64
#define ATT_MAX_HD 512

static inline float dot(const float *a, const float *b, int n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static inline void axpy(float *y, float a, const float *x, int n) {
#pragma omp simd
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

// One query row q against keys/values 0..n_keys-1 (rows `stride` floats apart). Writes o (HD), returns lse.
static float attend_row(float *o, const float *q, const float *k, const float *v, size_t stride, int n_keys, int HD,
                        float scale) {
    float scores[ATT_TILE], acc[ATT_MAX_HD];
    float m = -INFINITY, l = 0.0f;
    memset(acc, 0, sizeof(float) * (size_t)HD);
    for (int j0 = 0; j0 < n_keys; j0 += ATT_TILE) {
        int jn = n_keys - j0 < ATT_TILE ? n_keys - j0 : ATT_TILE;
        float tile_max = -INFINITY;
        for (int j = 0; j < jn; j++) {
            scores[j] = dot(q, k + (size_t)(j0 + j) * stride, HD) * scale;
            if (scores[j] > tile_max) tile_max = scores[j];
        }
        float new_m = tile_max > m ? tile_max : m;
        float corr = vexpf(m - new_m);
        l *= corr;
        for (int i = 0; i < HD; i++) acc[i] *= corr;
        for (int j = 0; j < jn; j++) {
            float p = vexpf(scores[j] - new_m);
            l += p;
            axpy(acc, p, v + (size_t)(j0 + j) * stride, HD);
        }
        m = new_m;
    }
    float inv = 1.0f / l;
    for (int i = 0; i < HD; i++) o[i] = acc[i] * inv;
    return m + logf(l);
}

void cpu_attention_forward(float *out, float *lse, const float *qkv, int B, int T, int NH, int NKV, int HD) {
    size_t W = (size_t)(NH + 2 * NKV) * HD;
    int group = NH / NKV;
    float scale = 1.0f / sqrtf((float)HD);
#pragma omp parallel for collapse(2) schedule(static) if((size_t)B * NH * T * T * HD >= 2 * SL_PAR_MIN_WORK)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            int g = h / group;
            const float *base = qkv + (size_t)b * T * W;
            const float *k = base + (size_t)(NH + g) * HD, *v = base + (size_t)(NH + NKV + g) * HD;
            for (int t = 0; t < T; t++) {
                float *o = out + ((size_t)b * T + t) * NH * HD + (size_t)h * HD;
                lse[((size_t)b * NH + h) * T + t] =
                    attend_row(o, base + (size_t)t * W + (size_t)h * HD, k, v, W, t + 1, HD, scale);
            }
        }
}

void cpu_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse,
                            int B, int T, int NH, int NKV, int HD) {
    size_t W = (size_t)(NH + 2 * NKV) * HD;
    int group = NH / NKV;
    float scale = 1.0f / sqrtf((float)HD);
#pragma omp parallel for collapse(2) schedule(static) if((size_t)B * NH * T * T * HD >= 2 * SL_PAR_MIN_WORK)
    for (int b = 0; b < B; b++)
        for (int g = 0; g < NKV; g++) {
            const float *base = qkv + (size_t)b * T * W;
            float *dbase = dqkv + (size_t)b * T * W;
            const float *k = base + (size_t)(NH + g) * HD, *v = base + (size_t)(NH + NKV + g) * HD;
            float *dk = dbase + (size_t)(NH + g) * HD, *dv = dbase + (size_t)(NH + NKV + g) * HD;
            for (int t = 0; t < T; t++) {
                memset(dk + (size_t)t * W, 0, sizeof(float) * (size_t)HD);
                memset(dv + (size_t)t * W, 0, sizeof(float) * (size_t)HD);
                for (int h = g * group; h < (g + 1) * group; h++)
                    memset(dbase + (size_t)t * W + (size_t)h * HD, 0, sizeof(float) * (size_t)HD);
            }
            for (int h = g * group; h < (g + 1) * group; h++)
                for (int t = 0; t < T; t++) {
                    const float *q = base + (size_t)t * W + (size_t)h * HD;
                    const float *dO = dout + ((size_t)b * T + t) * NH * HD + (size_t)h * HD;
                    const float *O = out + ((size_t)b * T + t) * NH * HD + (size_t)h * HD;
                    float *dq = dbase + (size_t)t * W + (size_t)h * HD;
                    float row_lse = lse[((size_t)b * NH + h) * T + t];
                    float D = dot(dO, O, HD);  // sum_j p_j (dO . v_j)
                    for (int j = 0; j <= t; j++) {
                        const float *kj = k + (size_t)j * W, *vj = v + (size_t)j * W;
                        float p = vexpf(dot(q, kj, HD) * scale - row_lse);
                        float ds = p * (dot(dO, vj, HD) - D) * scale;
                        axpy(dq, ds, kj, HD);
                        axpy(dk + (size_t)j * W, ds, q, HD);
                        axpy(dv + (size_t)j * W, p, dO, HD);
                    }
                }
        }
}

void cpu_attention_decode(float *out, const float *q, const float *k_cache, const float *v_cache, int n_ctx, int NH,
                          int NKV, int HD) {
    int group = NH / NKV;
    float scale = 1.0f / sqrtf((float)HD);
    size_t stride = (size_t)NKV * HD;
#pragma omp parallel for schedule(static) if((size_t)n_ctx * NH * HD >= SL_PAR_MIN_WORK)
    for (int h = 0; h < NH; h++) {
        int g = h / group;
        attend_row(out + (size_t)h * HD, q + (size_t)h * HD, k_cache + (size_t)g * HD, v_cache + (size_t)g * HD,
                   stride, n_ctx, HD, scale);
    }
}
