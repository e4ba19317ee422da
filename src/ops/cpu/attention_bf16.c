// attention_bf16.c: causal attention of cpu-bf16-onednn on its bf16 operands, every product a oneDNN
// bf16 matmul (onednn_matmul.c: AMX or AVX512_BF16, fp32 accumulation) instead of the emulation's
// staged fp32 attention. For each (batch, head) the queries are cut into blocks of QBLOCK rows; a block
// meets all its keys at once (the keys up to its last query, from its first window's start), so its
// scores are one matmul into fp32 scratch, the softmax is exact (no running rescale), and the block's
// output is P @ V with P rounded to bf16, as flash-attention and the GPU's tensor-core kernels round it
// (attention_tc.cu). The scores above the diagonal inside a block are computed and masked (at most
// QBLOCK - 1 keys per row: ~12% more score work than exact causal at T = 1024).
// Backward recomputes P from the log-sum-exp; dS = P * (dP - D) * scale is rounded to bf16 before its
// two products, as P is; dQ of a block is complete after the block (it meets every key once), and dK /
// dV sum in fp32 over the heads of their KV group and the query blocks in order, then are rounded once.
// The operands are first gathered into dense buffers (a query block's q and dO rows, a KV group's k
// and v): oneDNN 2.6 runs its AMX / brgemm kernels only on dense matrices, and falls back to a 16x
// slower GEMM on rows strided through the fused qkv.
// oneDNN spreads each product over the threads; the row-wise softmax loops are OpenMP loops with no
// reduction across threads, so results depend only on the shapes and the thread count (as the GEMMs).
// SHARDLM_ATTENTION=simt keeps the staged fp32 attention (the emulation's bits) on this table.
#include "ops/cpu/cpu_bf16.h"
#include "ops/cpu/vec_math.h"

#include <math.h>
#include <string.h>

#define QBLOCK 128

static inline sl_bf16 *bf16_of(sl_act *p) { return (sl_bf16 *)(void *)p; }
static inline const sl_bf16 *cbf16_of(const sl_act *p) { return (const sl_bf16 *)(const void *)p; }

// The keys a query block [q0, q0 + qn) meets: [first, q0 + qn), first = its first window's start.
static int first_key(int q0, int window) { return window > 0 && q0 - window + 1 > 0 ? q0 - window + 1 : 0; }

// Row i of a block's scores covers keys kb .. kb + kn - 1; query q0 + i sees [lo, hi] of them.
static inline void row_range(int q0, int i, int kb, int window, int *lo, int *hi) {
    int t = q0 + i;
    *hi = t - kb;
    *lo = window > 0 && t - window + 1 > kb ? t - window + 1 - kb : 0;
}

// scores (qn, kn) fp32 = q (qn, HD) @ k (kn, HD)^T, unscaled; both dense (rows ld = HD apart)
static int scores(float *s, const sl_bf16 *q, const sl_bf16 *k, int ld, int qn, int kn, int HD) {
    return cpu_gemm_bf16("attention (scores)", 0, 1, qn, kn, HD, q, ld, k, ld, NULL, s, 1, 0);
}

// Forward softmax of a block: s (qn, kn) raw scores -> p (bf16, normalised, 0 outside the row's keys),
// lse[i] = log-sum-exp of the row's scaled scores; s is overwritten (e^(scaled score - row max)).
static void softmax_rows(float *s, sl_bf16 *p, float *lse, int q0, int qn, int kb, int kn, float scale,
                         int window) {
#pragma omp parallel for schedule(static) if((size_t)qn * kn >= SL_PAR_MIN_WORK)
    for (int i = 0; i < qn; i++) {
        float *row = s + (size_t)i * kn;
        sl_bf16 *prow = p + (size_t)i * kn;
        int lo, hi;
        row_range(q0, i, kb, window, &lo, &hi);
        float mx = -INFINITY, sum = 0.0f;
#pragma omp simd reduction(max : mx)
        for (int j = lo; j <= hi; j++) mx = row[j] * scale > mx ? row[j] * scale : mx;
#pragma omp simd reduction(+ : sum)
        for (int j = lo; j <= hi; j++) sum += (row[j] = vexpf(row[j] * scale - mx));  // the scores become e^(s - max)
        float inv = 1.0f / sum;
        for (int j = 0; j < lo; j++) prow[j] = 0;
#pragma omp simd
        for (int j = lo; j <= hi; j++) prow[j] = sl_bf16_round(row[j] * inv);
        for (int j = hi + 1; j < kn; j++) prow[j] = 0;
        lse[i] = mx + logf(sum);
    }
}

// n rows of HD values, ld apart in src, into dense dst (n, HD).
static void gather_rows(sl_bf16 *dst, const sl_bf16 *src, size_t ld, int n, int HD) {
    for (int i = 0; i < n; i++) memcpy(dst + (size_t)i * HD, src + (size_t)i * ld, sizeof(sl_bf16) * (size_t)HD);
}

static sl_bf16 *bf16_scratch(int slot, size_t n) { return (sl_bf16 *)cpu_bf16_scratch(slot, (n + 1) / 2); }

// Rows (n, HD) of fp32 scratch rounded into bf16 storage rows ld apart.
static void store_rows(sl_bf16 *dst, size_t ld, const float *src, int n, int HD) {
#pragma omp parallel for schedule(static) if((size_t)n * HD >= SL_PAR_MIN_WORK)
    for (int i = 0; i < n; i++)
        for (int c = 0; c < HD; c++) dst[(size_t)i * ld + c] = sl_bf16_round(src[(size_t)i * HD + c]);
}

void cpu_bf16_attention_forward(sl_act *out_, float *lse, const sl_act *qkv_, int B, int T, int NH, int NKV, int HD,
                                int window) {
    if (cpu_bf16_failed()) return;
    sl_bf16 *out = bf16_of(out_);
    const sl_bf16 *qkv = cbf16_of(qkv_);
    int W = (NH + 2 * NKV) * HD, os = NH * HD, group = NH / NKV;
    int rows = T < QBLOCK ? T : QBLOCK;
    float scale = 1.0f / sqrtf((float)HD);
    float *s = cpu_bf16_scratch(0, (size_t)rows * T), *o = cpu_bf16_scratch(1, (size_t)rows * HD);
    sl_bf16 *p = bf16_scratch(2, (size_t)rows * T), *qd = bf16_scratch(3, (size_t)rows * HD);
    sl_bf16 *kd = bf16_scratch(4, (size_t)T * HD), *vd = bf16_scratch(5, (size_t)T * HD);
    if (!s || !o || !p || !qd || !kd || !vd) return;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const sl_bf16 *base = qkv + (size_t)b * T * W;
            if (h % group == 0) {  // the group's keys and values, dense
                gather_rows(kd, base + (size_t)(NH + h / group) * HD, (size_t)W, T, HD);
                gather_rows(vd, base + (size_t)(NH + NKV + h / group) * HD, (size_t)W, T, HD);
            }
            for (int q0 = 0; q0 < T; q0 += QBLOCK) {
                int qn = T - q0 < QBLOCK ? T - q0 : QBLOCK, kb = first_key(q0, window), kn = q0 + qn - kb;
                gather_rows(qd, base + (size_t)q0 * W + (size_t)h * HD, (size_t)W, qn, HD);
                if (scores(s, qd, kd + (size_t)kb * HD, HD, qn, kn, HD)) goto failed;
                softmax_rows(s, p, lse + ((size_t)b * NH + h) * T + q0, q0, qn, kb, kn, scale, window);
                // o (qn, HD) = p (qn, kn) @ v (kn, HD)
                if (cpu_gemm_bf16("attention (p @ v)", 0, 0, qn, HD, kn, p, kn, vd + (size_t)kb * HD, HD, NULL, o, 1, 0))
                    goto failed;
                store_rows(out + ((size_t)b * T + q0) * os + (size_t)h * HD, (size_t)os, o, qn, HD);
            }
        }
    return;
failed:
    cpu_bf16_record_failure();
}

// Backward of a block after dp (qn, kn) = dO @ v^T: s (raw scores) becomes p = exp(scale s - lse) and
// dp becomes ds = p (dp - D) scale, both rounded to bf16 into pb / dsb (0 outside the row's keys).
static void softmax_backward_rows(const float *s, const float *dp, sl_bf16 *pb, sl_bf16 *dsb, const float *lse,
                                  const float *d, int q0, int qn, int kb, int kn, float scale, int window) {
#pragma omp parallel for schedule(static) if((size_t)qn * kn >= SL_PAR_MIN_WORK)
    for (int i = 0; i < qn; i++) {
        const float *srow = s + (size_t)i * kn, *dprow = dp + (size_t)i * kn;
        sl_bf16 *prow = pb + (size_t)i * kn, *dsrow = dsb + (size_t)i * kn;
        int lo, hi;
        row_range(q0, i, kb, window, &lo, &hi);
        float li = lse[i], di = d[i];
        for (int j = 0; j < lo; j++) prow[j] = dsrow[j] = 0;
#pragma omp simd
        for (int j = lo; j <= hi; j++) {
            float pj = vexpf(srow[j] * scale - li);
            prow[j] = sl_bf16_round(pj);
            dsrow[j] = sl_bf16_round(pj * (dprow[j] - di) * scale);
        }
        for (int j = hi + 1; j < kn; j++) prow[j] = dsrow[j] = 0;
    }
}

void cpu_bf16_attention_backward(sl_act *dqkv_, const sl_act *dout_, const sl_act *qkv_, const sl_act *out_,
                                 const float *lse, int B, int T, int NH, int NKV, int HD, int window) {
    if (cpu_bf16_failed()) return;
    sl_bf16 *dqkv = bf16_of(dqkv_);
    const sl_bf16 *dout = cbf16_of(dout_), *qkv = cbf16_of(qkv_), *out = cbf16_of(out_);
    int W = (NH + 2 * NKV) * HD, os = NH * HD, group = NH / NKV;
    int rows = T < QBLOCK ? T : QBLOCK;
    float scale = 1.0f / sqrtf((float)HD);
    size_t tile = (size_t)rows * T;
    float *s = cpu_bf16_scratch(0, tile), *dp = cpu_bf16_scratch(1, tile), *dq = cpu_bf16_scratch(2, (size_t)rows * HD);
    float *dk = cpu_bf16_scratch(3, (size_t)T * HD), *dv = cpu_bf16_scratch(4, (size_t)T * HD);
    float *d = cpu_bf16_scratch(5, (size_t)rows);
    sl_bf16 *pb = bf16_scratch(6, tile), *dsb = bf16_scratch(7, tile), *qd = bf16_scratch(8, (size_t)rows * HD);
    sl_bf16 *dod = bf16_scratch(9, (size_t)rows * HD), *k = bf16_scratch(10, (size_t)T * HD);
    sl_bf16 *v = bf16_scratch(11, (size_t)T * HD);
    if (!s || !dp || !dq || !dk || !dv || !d || !pb || !dsb || !qd || !dod || !k || !v) return;
    for (int b = 0; b < B; b++)
        for (int g = 0; g < NKV; g++) {
            const sl_bf16 *base = qkv + (size_t)b * T * W;
            gather_rows(k, base + (size_t)(NH + g) * HD, (size_t)W, T, HD);  // the group's keys and values, dense
            gather_rows(v, base + (size_t)(NH + NKV + g) * HD, (size_t)W, T, HD);
            sl_bf16 *dbase = dqkv + (size_t)b * T * W;
            memset(dk, 0, sizeof(float) * (size_t)T * HD);
            memset(dv, 0, sizeof(float) * (size_t)T * HD);
            for (int h = g * group; h < (g + 1) * group; h++)
                for (int q0 = 0; q0 < T; q0 += QBLOCK) {
                    int qn = T - q0 < QBLOCK ? T - q0 : QBLOCK, kb = first_key(q0, window), kn = q0 + qn - kb;
                    const sl_bf16 *dO = dout + ((size_t)b * T + q0) * os + (size_t)h * HD;
                    gather_rows(qd, base + (size_t)q0 * W + (size_t)h * HD, (size_t)W, qn, HD);
                    gather_rows(dod, dO, (size_t)os, qn, HD);
                    const sl_bf16 *O = out + ((size_t)b * T + q0) * os + (size_t)h * HD;
                    const float *row_lse = lse + ((size_t)b * NH + h) * T + q0;
                    for (int i = 0; i < qn; i++) {  // D_i = dO_i . O_i (as stored)
                        float acc = 0.0f;
                        for (int c = 0; c < HD; c++)
                            acc += sl_bf16_widen(dO[(size_t)i * os + c]) * sl_bf16_widen(O[(size_t)i * os + c]);
                        d[i] = acc;
                    }
                    if (scores(s, qd, k + (size_t)kb * HD, HD, qn, kn, HD) ||
                        // dp (qn, kn) = dO (qn, HD) @ v^T
                        cpu_gemm_bf16("attention (dO @ v^T)", 0, 1, qn, kn, HD, dod, HD, v + (size_t)kb * HD, HD, NULL,
                                      dp, 1, 0))
                        goto failed;
                    softmax_backward_rows(s, dp, pb, dsb, row_lse, d, q0, qn, kb, kn, scale, window);
                    // dq (qn, HD) = ds @ k; dk[kb..] += ds^T @ q; dv[kb..] += p^T @ dO
                    if (cpu_gemm_bf16("attention (ds @ k)", 0, 0, qn, HD, kn, dsb, kn, k + (size_t)kb * HD, HD, NULL,
                                      dq, 1, 0) ||
                        cpu_gemm_bf16("attention (ds^T @ q)", 1, 0, kn, HD, qn, dsb, kn, qd, HD, NULL,
                                      dk + (size_t)kb * HD, 1, 1) ||
                        cpu_gemm_bf16("attention (p^T @ dO)", 1, 0, kn, HD, qn, pb, kn, dod, HD, NULL,
                                      dv + (size_t)kb * HD, 1, 1))
                        goto failed;
                    store_rows(dbase + (size_t)q0 * W + (size_t)h * HD, (size_t)W, dq, qn, HD);
                }
            store_rows(dbase + (size_t)(NH + g) * HD, (size_t)W, dk, T, HD);
            store_rows(dbase + (size_t)(NH + NKV + g) * HD, (size_t)W, dv, T, HD);
        }
    return;
failed:
    cpu_bf16_record_failure();
}
