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
// Threads: forward takes (batch, head) pairs, backward (batch, KV group) pairs, one thread each, every
// product on that thread alone (cpu_gemm_bf16_serial): products this small lose more to splitting
// across threads than they gain. So results are the same bits for any thread count.
// SHARDLM_ATTENTION=simt keeps the staged fp32 attention (the emulation's bits) on this table.
#include "ops/cpu/cpu_bf16.h"
#include "ops/cpu/vec_math.h"
#include "shardlm/error.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define QBLOCK 128
#define MAX_THREADS 256
#define N_BUFFERS 12

// ---- per-thread scratch and failures ---------------------------------------------------------------

// Each thread's buffers, kept and grown across calls (the table's ops run one at a time).
static struct {
    void *p;
    size_t cap;
} buffers[MAX_THREADS][N_BUFFERS];

static void *buffer(int slot, size_t bytes) {
    int t = omp_get_thread_num();
    if (t >= MAX_THREADS) return NULL;
    if (bytes > buffers[t][slot].cap) {
        free(buffers[t][slot].p);
        buffers[t][slot].cap = 0;
        if (!(buffers[t][slot].p = malloc(bytes))) return NULL;
        buffers[t][slot].cap = bytes;
    }
    return buffers[t][slot].p;
}

// ---- blocks ----------------------------------------------------------------------------------------

// The keys a query block [q0, q0 + qn) meets: [first, q0 + qn), first = its first window's start.
static int first_key(int q0, int window) { return window > 0 && q0 - window + 1 > 0 ? q0 - window + 1 : 0; }

// Row i of a block's scores covers keys kb .. kb + kn - 1; query q0 + i sees [lo, hi] of them.
static inline void row_range(int q0, int i, int kb, int window, int *lo, int *hi) {
    int t = q0 + i;
    *hi = t - kb;
    *lo = window > 0 && t - window + 1 > kb ? t - window + 1 - kb : 0;
}

// n rows of HD values, ld apart in src, into dense dst (n, HD).
static void gather_rows(sl_bf16 *dst, const sl_bf16 *src, size_t ld, int n, int HD) {
    for (int i = 0; i < n; i++) memcpy(dst + (size_t)i * HD, src + (size_t)i * ld, sizeof(sl_bf16) * (size_t)HD);
}

// Rows (n, HD) of fp32 scratch rounded into bf16 storage rows ld apart.
static void store_rows(sl_bf16 *dst, size_t ld, const float *src, int n, int HD) {
    for (int i = 0; i < n; i++)
#pragma omp simd
        for (int c = 0; c < HD; c++) dst[(size_t)i * ld + c] = sl_bf16_round(src[(size_t)i * HD + c]);
}

// scores (qn, kn) fp32 = q (qn, HD) @ k (kn, HD)^T, unscaled; both dense
static int scores(float *s, const sl_bf16 *q, const sl_bf16 *k, int qn, int kn, int HD) {
    return cpu_gemm_bf16_serial("attention (scores)", 0, 1, qn, kn, HD, q, HD, k, HD, NULL, s, 1, 0);
}

// The 16-aligned span [*a, *e) of a block row that covers its keys [lo, hi], clipped to the row's kn:
// the row loops below run over it whole, so they vectorise without a scalar remainder, and select 0
// for the keys outside [lo, hi] (whose scores are finite products, exp clamps them).
static inline void row_span(int lo, int hi, int kn, int *a, int *e) {
    *a = lo & ~15;
    *e = (hi + 16) & ~15;
    if (*e > kn) *e = kn;
}

// Forward softmax of a block: s (qn, kn) raw scores -> p (bf16, normalised, 0 outside the row's keys),
// lse[i] = log-sum-exp of the row's scaled scores; s is overwritten (e^(scaled score - row max)).
static void softmax_rows(float *s, sl_bf16 *p, float *lse, int q0, int qn, int kb, int kn, float scale,
                         int window) {
    for (int i = 0; i < qn; i++) {
        float *row = s + (size_t)i * kn;
        sl_bf16 *prow = p + (size_t)i * kn;
        int lo, hi, a, e;
        row_range(q0, i, kb, window, &lo, &hi);
        row_span(lo, hi, kn, &a, &e);
        float mx = -INFINITY, sum = 0.0f;
#pragma omp simd reduction(max : mx)
        for (int j = a; j < e; j++) {
            float v = row[j] * scale;
            mx = j >= lo && j <= hi && v > mx ? v : mx;
        }
#pragma omp simd reduction(+ : sum)
        for (int j = a; j < e; j++) {
            float x = vexpf(row[j] * scale - mx);
            x = j >= lo && j <= hi ? x : 0.0f;
            row[j] = x;
            sum += x;
        }
        float inv = 1.0f / sum;
        memset(prow, 0, sizeof(sl_bf16) * (size_t)a);
#pragma omp simd
        for (int j = a; j < e; j++) prow[j] = sl_bf16_round(row[j] * inv);
        memset(prow + e, 0, sizeof(sl_bf16) * (size_t)(kn - e));
        lse[i] = mx + logf(sum);
    }
}

// One (batch, head): out's rows of the head and its lse, from dense copies of its q blocks, k and v.
static int forward_head(sl_bf16 *out, float *lse, const sl_bf16 *q, const sl_bf16 *k, const sl_bf16 *v, int W, int os,
                        int T, int HD, float scale, int window) {
    int rows = T < QBLOCK ? T : QBLOCK;
    float *s = buffer(0, sizeof(float) * (size_t)rows * T), *o = buffer(1, sizeof(float) * (size_t)rows * HD);
    sl_bf16 *p = buffer(2, sizeof(sl_bf16) * (size_t)rows * T), *qd = buffer(3, sizeof(sl_bf16) * (size_t)rows * HD);
    sl_bf16 *kd = buffer(4, sizeof(sl_bf16) * (size_t)T * HD), *vd = buffer(5, sizeof(sl_bf16) * (size_t)T * HD);
    if (!s || !o || !p || !qd || !kd || !vd) return sl_errorf("attention_forward: out of memory for scratch");
    gather_rows(kd, k, (size_t)W, T, HD);
    gather_rows(vd, v, (size_t)W, T, HD);
    for (int q0 = 0; q0 < T; q0 += QBLOCK) {
        int qn = T - q0 < QBLOCK ? T - q0 : QBLOCK, kb = first_key(q0, window), kn = q0 + qn - kb;
        gather_rows(qd, q + (size_t)q0 * W, (size_t)W, qn, HD);
        if (scores(s, qd, kd + (size_t)kb * HD, qn, kn, HD)) return -1;
        softmax_rows(s, p, lse + q0, q0, qn, kb, kn, scale, window);
        // o (qn, HD) = p (qn, kn) @ v (kn, HD)
        if (cpu_gemm_bf16_serial("attention (p @ v)", 0, 0, qn, HD, kn, p, kn, vd + (size_t)kb * HD, HD, NULL, o, 1, 0))
            return -1;
        store_rows(out + (size_t)q0 * os, (size_t)os, o, qn, HD);
    }
    return 0;
}

void cpu_bf16_attention_forward(sl_act *out_, float *lse, const sl_act *qkv_, int B, int T, int NH, int NKV, int HD,
                                int window) {
    if (cpu_bf16_failed()) return;
    sl_bf16 *out = bf16_of(out_);
    const sl_bf16 *qkv = cbf16_of(qkv_);
    int W = (NH + 2 * NKV) * HD, os = NH * HD, group = NH / NKV;
    float scale = 1.0f / sqrtf((float)HD);
    cpu_bf16_region_failure f = {0};
#pragma omp parallel for collapse(2) schedule(dynamic, 1) if((size_t)B * NH * T * T * HD >= 2 * SL_PAR_MIN_WORK)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            if (cpu_bf16_region_failed(&f)) continue;
            const sl_bf16 *base = qkv + (size_t)b * T * W;
            int g = h / group;
            if (forward_head(out + (size_t)b * T * os + (size_t)h * HD, lse + ((size_t)b * NH + h) * T,
                             base + (size_t)h * HD, base + (size_t)(NH + g) * HD, base + (size_t)(NH + NKV + g) * HD, W,
                             os, T, HD, scale, window))
                cpu_bf16_region_fail(&f, sl_error());
        }
    cpu_bf16_region_report(&f);
}

// Backward of a block after dp (qn, kn) = dO @ v^T: s (raw scores) becomes p = exp(scale s - lse) and
// dp becomes ds = p (dp - D) scale, both rounded to bf16 into pb / dsb (0 outside the row's keys).
static void softmax_backward_rows(const float *s, const float *dp, sl_bf16 *pb, sl_bf16 *dsb, const float *lse,
                                  const float *d, int q0, int qn, int kb, int kn, float scale, int window) {
    for (int i = 0; i < qn; i++) {
        const float *srow = s + (size_t)i * kn, *dprow = dp + (size_t)i * kn;
        sl_bf16 *prow = pb + (size_t)i * kn, *dsrow = dsb + (size_t)i * kn;
        int lo, hi, a, e;
        row_range(q0, i, kb, window, &lo, &hi);
        row_span(lo, hi, kn, &a, &e);
        float li = lse[i], di = d[i];
        memset(prow, 0, sizeof(sl_bf16) * (size_t)a);
        memset(dsrow, 0, sizeof(sl_bf16) * (size_t)a);
#pragma omp simd
        for (int j = a; j < e; j++) {
            float pj = vexpf(srow[j] * scale - li);
            pj = j >= lo && j <= hi ? pj : 0.0f;
            prow[j] = sl_bf16_round(pj);
            dsrow[j] = sl_bf16_round(pj * (dprow[j] - di) * scale);
        }
        memset(prow + e, 0, sizeof(sl_bf16) * (size_t)(kn - e));
        memset(dsrow + e, 0, sizeof(sl_bf16) * (size_t)(kn - e));
    }
}

// Pointers of one (batch, KV group) into the activations.
typedef struct {
    const sl_bf16 *qkv, *dout, *out;  // this batch's rows
    sl_bf16 *dqkv;
    const float *lse;                 // this batch's (NH, T)
} batch_view;

// One (batch, KV group): dq of the group's heads, dk and dv of the group.
static int backward_group(const batch_view *bv, int g, int T, int NH, int NKV, int HD, float scale, int window) {
    int W = (NH + 2 * NKV) * HD, os = NH * HD, group = NH / NKV, rows = T < QBLOCK ? T : QBLOCK;
    size_t tile = (size_t)rows * T;
    float *s = buffer(0, sizeof(float) * tile), *dp = buffer(1, sizeof(float) * tile);
    float *dq = buffer(2, sizeof(float) * (size_t)rows * HD), *d = buffer(3, sizeof(float) * (size_t)rows);
    float *dk = buffer(4, sizeof(float) * (size_t)T * HD), *dv = buffer(5, sizeof(float) * (size_t)T * HD);
    sl_bf16 *pb = buffer(6, sizeof(sl_bf16) * tile), *dsb = buffer(7, sizeof(sl_bf16) * tile);
    sl_bf16 *qd = buffer(8, sizeof(sl_bf16) * (size_t)rows * HD), *dod = buffer(9, sizeof(sl_bf16) * (size_t)rows * HD);
    sl_bf16 *k = buffer(10, sizeof(sl_bf16) * (size_t)T * HD), *v = buffer(11, sizeof(sl_bf16) * (size_t)T * HD);
    if (!s || !dp || !dq || !d || !dk || !dv || !pb || !dsb || !qd || !dod || !k || !v)
        return sl_errorf("attention_backward: out of memory for scratch");
    gather_rows(k, bv->qkv + (size_t)(NH + g) * HD, (size_t)W, T, HD);
    gather_rows(v, bv->qkv + (size_t)(NH + NKV + g) * HD, (size_t)W, T, HD);
    memset(dk, 0, sizeof(float) * (size_t)T * HD);
    memset(dv, 0, sizeof(float) * (size_t)T * HD);
    for (int h = g * group; h < (g + 1) * group; h++)
        for (int q0 = 0; q0 < T; q0 += QBLOCK) {
            int qn = T - q0 < QBLOCK ? T - q0 : QBLOCK, kb = first_key(q0, window), kn = q0 + qn - kb;
            const sl_bf16 *dO = bv->dout + (size_t)q0 * os + (size_t)h * HD, *O = bv->out + (size_t)q0 * os + (size_t)h * HD;
            gather_rows(qd, bv->qkv + (size_t)q0 * W + (size_t)h * HD, (size_t)W, qn, HD);
            gather_rows(dod, dO, (size_t)os, qn, HD);
            for (int i = 0; i < qn; i++) {  // D_i = dO_i . O_i (as stored)
                const sl_bf16 *x = dod + (size_t)i * HD, *y = O + (size_t)i * os;
                float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
                for (int c = 0; c < HD; c++) acc += sl_bf16_widen(x[c]) * sl_bf16_widen(y[c]);
                d[i] = acc;
            }
            // dp (qn, kn) = dO (qn, HD) @ v^T
            if (scores(s, qd, k + (size_t)kb * HD, qn, kn, HD) ||
                cpu_gemm_bf16_serial("attention (dO @ v^T)", 0, 1, qn, kn, HD, dod, HD, v + (size_t)kb * HD, HD, NULL,
                                     dp, 1, 0))
                return -1;
            softmax_backward_rows(s, dp, pb, dsb, bv->lse + (size_t)h * T + q0, d, q0, qn, kb, kn, scale, window);
            // dq (qn, HD) = ds @ k; dk[kb..] += ds^T @ q; dv[kb..] += p^T @ dO
            if (cpu_gemm_bf16_serial("attention (ds @ k)", 0, 0, qn, HD, kn, dsb, kn, k + (size_t)kb * HD, HD, NULL, dq,
                                     1, 0) ||
                cpu_gemm_bf16_serial("attention (ds^T @ q)", 1, 0, kn, HD, qn, dsb, kn, qd, HD, NULL,
                                     dk + (size_t)kb * HD, 1, 1) ||
                cpu_gemm_bf16_serial("attention (p^T @ dO)", 1, 0, kn, HD, qn, pb, kn, dod, HD, NULL,
                                     dv + (size_t)kb * HD, 1, 1))
                return -1;
            store_rows(bv->dqkv + (size_t)q0 * W + (size_t)h * HD, (size_t)W, dq, qn, HD);
        }
    store_rows(bv->dqkv + (size_t)(NH + g) * HD, (size_t)W, dk, T, HD);
    store_rows(bv->dqkv + (size_t)(NH + NKV + g) * HD, (size_t)W, dv, T, HD);
    return 0;
}

void cpu_bf16_attention_backward(sl_act *dqkv_, const sl_act *dout_, const sl_act *qkv_, const sl_act *out_,
                                 const float *lse, int B, int T, int NH, int NKV, int HD, int window) {
    if (cpu_bf16_failed()) return;
    sl_bf16 *dqkv = bf16_of(dqkv_);
    const sl_bf16 *dout = cbf16_of(dout_), *qkv = cbf16_of(qkv_), *out = cbf16_of(out_);
    size_t W = (size_t)(NH + 2 * NKV) * HD, os = (size_t)NH * HD;
    float scale = 1.0f / sqrtf((float)HD);
    cpu_bf16_region_failure f = {0};
#pragma omp parallel for collapse(2) schedule(dynamic, 1) if((size_t)B * NH * T * T * HD >= 2 * SL_PAR_MIN_WORK)
    for (int b = 0; b < B; b++)
        for (int g = 0; g < NKV; g++) {
            if (cpu_bf16_region_failed(&f)) continue;
            batch_view bv = {qkv + (size_t)b * T * W, dout + (size_t)b * T * os, out + (size_t)b * T * os,
                             dqkv + (size_t)b * T * W, lse + (size_t)b * NH * T};
            if (backward_group(&bv, g, T, NH, NKV, HD, scale, window)) cpu_bf16_region_fail(&f, sl_error());
        }
    cpu_bf16_region_report(&f);
}
