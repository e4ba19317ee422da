// attention.c: causal attention on the CPU, flash-attention style with GEMM tiles. For each
// (batch, head) the queries are cut into blocks of `tile` rows and the keys into tiles of `ktile`
// (att_tile x att_ktile: 64 x 256 below T = 512, 128 x 128 from there); a block meets each key tile
// at or before it through small sgemm calls (single-threaded inside our parallel region), with an
// online softmax between tiles. At most one tile x ktile block of scores exists per thread. Forward
// stores the log-sum-exp of each row; backward recomputes the probabilities from it. Forward is
// parallel over (batch, head); backward over (batch, kv-head group), because every query head of a
// group writes the same dk/dv.
// A sliding window (window > 0) also masks keys at or before query - window and skips whole key
// tiles that lie before every query of a block's window.
#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/vec_math.h"
#include "shardlm/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

// Tile edges (queries x keys): 64 x 256 up to T = 511, where a query block then meets every key
// before it in one or two score products (against 64 x 64: forward 10-20% and backward 5-10% faster
// at T = 256 and 384); 128 x 128 from T = 512 (10-15% faster than 64 x 64 at T = 1024; 64 x 256,
// 64 x 512, 128 x 256 and 128 x 512 were no better there). Measured on an AMX Xeon with 2 threads.
static int att_tile(int T) { return T >= 512 ? 128 : 64; }
static int att_ktile(int T) { return T >= 512 ? 128 : 256; }

// Per-thread scratch: scores / probabilities and their gradient for one tile, plus the block's
// accumulators. Allocated once per parallel region.
typedef struct {
    int tile;             // the query tile edge (att_tile)
    int ktile;            // the key tile edge (att_ktile), and the row stride of s and dp
    float *s, *dp;        // (tile, ktile)
    float *acc;           // (tile, HD) output accumulator
    float *m, *l, *d;     // (tile) running max, running sum, rowsum(dO * O)
} att_scratch;

static int scratch_alloc(att_scratch *w, int HD, int edge, int kedge) {
    size_t tile = (size_t)edge * kedge;
    float *p = malloc(sizeof(float) * (2 * tile + (size_t)edge * HD + 3 * (size_t)edge));
    if (!p) return sl_errorf("out of memory for a thread's attention scratch (head dim %d)", HD);
    w->tile = edge;
    w->ktile = kedge;
    w->s = p;
    w->dp = p + tile;
    w->acc = p + 2 * tile;
    w->m = w->acc + (size_t)edge * HD;
    w->l = w->m + edge;
    w->d = w->l + edge;
    return 0;
}

// s (qn, kn) = scale * q (qn, HD; rows ld apart) @ k^T (kn, HD; rows ld apart), causally masked
// (-inf) where key position k0+j > query position q0+i, or (window > 0) k0+j <= q0+i - window.
static void tile_scores(float *s, int lds, const float *q, const float *k, size_t ld, int q0, int qn, int k0, int kn,
                        int HD, float scale, int window) {
    cpu_sgemm(0, 1, qn, kn, HD, scale, q, (int)ld, k, (int)ld, 0.0f, s, lds);
    int windowed = window > 0 && k0 <= q0 + qn - 1 - window;  // some key of the tile is out of some row's window
    if (k0 + kn - 1 <= q0 && !windowed) return;                // tile entirely in the past and in every window
    for (int i = 0; i < qn; i++) {
        float *row = s + (size_t)i * lds;
        for (int j = q0 + i - k0 + 1; j < kn; j++)
            if (j >= 0) row[j] = -INFINITY;
        if (windowed)
            for (int j = 0; j < kn && k0 + j <= q0 + i - window; j++) row[j] = -INFINITY;
    }
}

// The first key tile a query block [q0, q0+qn) meets: 0, or the tile holding its first window's start.
static int first_key_tile(int q0, int window, int tile) {
    int first_key = window > 0 && q0 - window + 1 > 0 ? q0 - window + 1 : 0;
    return first_key / tile * tile;
}

// One block of qn query rows of head h against key tiles 0..q0+qn-1: writes out rows and lse.
static void forward_block(att_scratch *w, float *out, float *lse, const float *q, const float *k, const float *v,
                          size_t W, size_t out_stride, int q0, int qn, int HD, float scale, int window) {
    for (int i = 0; i < qn; i++) { w->m[i] = -INFINITY; w->l[i] = 0.0f; }
    memset(w->acc, 0, sizeof(float) * (size_t)qn * HD);
    const int kedge = w->ktile;
    for (int k0 = first_key_tile(q0, window, kedge); k0 < q0 + qn; k0 += kedge) {
        int kn = q0 + qn - k0 < kedge ? q0 + qn - k0 : kedge;
        tile_scores(w->s, kedge, q, k + (size_t)k0 * W, W, q0, qn, k0, kn, HD, scale, window);
        for (int i = 0; i < qn; i++) {
            float *row = w->s + (size_t)i * kedge, mx = w->m[i];
#pragma omp simd reduction(max : mx)
            for (int j = 0; j < kn; j++) mx = row[j] > mx ? row[j] : mx;
            if (mx == -INFINITY) {  // every key of this tile is outside the row's window: nothing to add
                memset(row, 0, sizeof(float) * (size_t)kn);
                continue;
            }
            float corr = vexpf(w->m[i] - mx), sum = 0.0f;
#pragma omp simd reduction(+ : sum)
            for (int j = 0; j < kn; j++) sum += (row[j] = vexpf(row[j] - mx));
            w->l[i] = w->l[i] * corr + sum;
            w->m[i] = mx;
            float *a = w->acc + (size_t)i * HD;
#pragma omp simd
            for (int c = 0; c < HD; c++) a[c] *= corr;
        }
        // acc (qn, HD) += p (qn, kn) @ v (kn, HD)
        cpu_sgemm(0, 0, qn, HD, kn, 1.0f, w->s, kedge, v + (size_t)k0 * W,
                    (int)W, 1.0f, w->acc, HD);
    }
    for (int i = 0; i < qn; i++) {
        float inv = 1.0f / w->l[i], *o = out + (size_t)(q0 + i) * out_stride;
        const float *a = w->acc + (size_t)i * HD;
        for (int c = 0; c < HD; c++) o[c] = a[c] * inv;
        lse[q0 + i] = w->m[i] + logf(w->l[i]);
    }
}

void cpu_attention_forward(sl_act *out_, float *lse, const sl_act *qkv_, int B, int T, int NH, int NKV, int HD,
                           int window) {
    float *out = cpu_f32(out_);
    const float *qkv = cpu_f32(qkv_);
    size_t W = (size_t)(NH + 2 * NKV) * HD, out_stride = (size_t)NH * HD;
    int group = NH / NKV, edge = att_tile(T), n_blocks = (T + edge - 1) / edge;
    float scale = 1.0f / sqrtf((float)HD);
#pragma omp parallel if((size_t)B * NH * T * T * HD >= 2 * SL_PAR_MIN_WORK)
    {
        att_scratch w = {0};
        int ok = scratch_alloc(&w, HD, edge, att_ktile(T)) == 0;
        if (!ok)
#pragma omp critical(attention_failure)
            cpu_record_failure("attention_forward");  // synchronize() reports it; the output is not written
#pragma omp for collapse(3) schedule(dynamic, 1)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < NH; h++)
                for (int blk = 0; blk < n_blocks; blk++) {
                    if (!ok) continue;
                    int g = h / group, q0 = blk * edge, qn = T - q0 < edge ? T - q0 : edge;
                    const float *base = qkv + (size_t)b * T * W;
                    forward_block(&w, out + (size_t)b * T * out_stride + (size_t)h * HD, lse + ((size_t)b * NH + h) * T,
                                  base + (size_t)q0 * W + (size_t)h * HD, base + (size_t)(NH + g) * HD,
                                  base + (size_t)(NH + NKV + g) * HD, W, out_stride, q0, qn, HD, scale, window);
                }
        if (ok) free(w.s);
    }
}

void cpu_attention_backward(sl_act *dqkv_, const sl_act *dout_, const sl_act *qkv_, const sl_act *out_,
                            const float *lse, int B, int T, int NH, int NKV, int HD, int window) {
    float *dqkv = cpu_f32(dqkv_);
    const float *dout = cpu_f32(dout_);
    const float *qkv = cpu_f32(qkv_);
    const float *out = cpu_f32(out_);
    size_t W = (size_t)(NH + 2 * NKV) * HD, os = (size_t)NH * HD;
    int group = NH / NKV, edge = att_tile(T);
    float scale = 1.0f / sqrtf((float)HD);
#pragma omp parallel if((size_t)B * NH * T * T * HD >= 2 * SL_PAR_MIN_WORK)
    {
        att_scratch w = {0};
        const int kedge = att_ktile(T);
        int ok = scratch_alloc(&w, HD, edge, kedge) == 0;
        if (!ok)
#pragma omp critical(attention_failure)
            cpu_record_failure("attention_backward");
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
            for (int g = 0; g < NKV; g++) {
                if (!ok) continue;
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
                    for (int q0 = 0; q0 < T; q0 += edge) {
                        int qn = T - q0 < edge ? T - q0 : edge;
                        const float *q = base + (size_t)q0 * W + (size_t)h * HD;
                        const float *dO = dout + ((size_t)b * T + q0) * os + (size_t)h * HD;
                        const float *O = out + ((size_t)b * T + q0) * os + (size_t)h * HD;
                        float *dq = dbase + (size_t)q0 * W + (size_t)h * HD;
                        const float *row_lse = lse + ((size_t)b * NH + h) * T + q0;
                        for (int i = 0; i < qn; i++) {  // D_i = sum_j p_ij (dO_i . v_j) = dO_i . O_i
                            float s = 0.0f;
                            const float *x = dO + (size_t)i * os, *y = O + (size_t)i * os;
#pragma omp simd reduction(+ : s)
                            for (int c = 0; c < HD; c++) s += x[c] * y[c];
                            w.d[i] = s;
                        }
                        for (int k0 = first_key_tile(q0, window, kedge); k0 < q0 + qn; k0 += kedge) {
                            int kn = q0 + qn - k0 < kedge ? q0 + qn - k0 : kedge;
                            tile_scores(w.s, kedge, q, k + (size_t)k0 * W, W, q0, qn, k0, kn, HD, scale, window);
                            // dp (qn, kn) = dO (qn, HD) @ v^T
                            cpu_sgemm(0, 1, qn, kn, HD, 1.0f, dO, (int)os,
                                        v + (size_t)k0 * W, (int)W, 0.0f, w.dp, kedge);
                            for (int i = 0; i < qn; i++) {
                                float *p = w.s + (size_t)i * kedge, *ds = w.dp + (size_t)i * kedge;
                                float li = row_lse[i], di = w.d[i];
#pragma omp simd
                                for (int j = 0; j < kn; j++) {
                                    p[j] = vexpf(p[j] - li);
                                    ds[j] = p[j] * (ds[j] - di) * scale;
                                }
                            }
                            // dq += ds @ k ; dk += ds^T @ q ; dv += p^T @ dO
                            cpu_sgemm(0, 0, qn, HD, kn, 1.0f, w.dp, kedge,
                                        k + (size_t)k0 * W, (int)W, 1.0f, dq, (int)W);
                            cpu_sgemm(1, 0, kn, HD, qn, 1.0f, w.dp, kedge, q,
                                        (int)W, 1.0f, dk + (size_t)k0 * W, (int)W);
                            cpu_sgemm(1, 0, kn, HD, qn, 1.0f, w.s, kedge, dO,
                                        (int)os, 1.0f, dv + (size_t)k0 * W, (int)W);
                        }
                    }
            }
        if (ok) free(w.s);
    }
}
