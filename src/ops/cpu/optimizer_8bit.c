// optimizer_8bit.c: the CPU backend's 8-bit AdamW pass (ops.h adam8_step) and bitsandbytes' dynamic
// quantisation maps, beside optimizer.c. The arithmetic is that of bitsandbytes 0.50's CPU optimizer
// (backends/cpu/ops.py, csrc/cpu_ops.cpp), operation by operation in float32:
//   8-bit state, per block of 256: m, v = map[q] * absmax (dequantise); m = m*b1 + (1-b1)*g (the add
//   fused, as torch's add(alpha=)); v = v*b2 + (1-b2)*g*g; p *= 1 - lr*wd (decaying tensors);
//   p += -lr/bc1 * (m / (sqrt(v)/sqrt(bc2) + eps)); then absmax = max |new value| over the block and
//   q = the map entry a 65536-bin table assigns to value/absmax (bitsandbytes' quantize_cpu);
//   32-bit state (tensors under min_8bit_size): the same moments, p += (-lr*sqrt(bc2)/bc1) *
//   (m / (sqrt(v) + eps*sqrt(bc2))), the add fused.
// Blocks are independent, so the result does not depend on the thread count.
#include "ops/cpu/cpu_ops.h"

#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LUT_SIZE 65536
#define OMP_MIN_BLOCKS 64   // fewer blocks than this run on the calling thread

// ---- the dynamic maps ----------------------------------------------------------------------------

// torch.linspace(start, end, steps) in float32, element i: the first half counts up from start, the
// second down from end, each one fused multiply-add (as torch's CPU kernel rounds).
static float linspace_at(float start, float end, int steps, int i) {
    float step = (end - start) / (float)(steps - 1);
    return i < steps / 2 ? fmaf(step, (float)i, start) : fmaf(-step, (float)(steps - 1 - i), end);
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

void sl_dynamic_map(int is_signed, float map[256]) {
    int n = 0;
    // exponent i: 10^(i-6) times the midpoints of linspace(0.1, 1) with 2^i (signed) or 2^(i+1) steps
    for (int i = 0; i < 7; i++) {
        int items = is_signed ? (1 << i) + 1 : (1 << (i + 1)) + 1;
        double scale = pow(10.0, (double)(i - 6));
        for (int k = 0; k + 1 < items; k++) {
            float mean = (linspace_at(0.1f, 1.0f, items, k) + linspace_at(0.1f, 1.0f, items, k + 1)) / 2.0f;
            map[n++] = (float)scale * mean;
            if (is_signed) map[n++] = (float)-scale * mean;
        }
    }
    map[n++] = 0.0f;
    map[n++] = 1.0f;
    while (n < 256) map[n++] = 0.0f;
    qsort(map, 256, sizeof(float), cmp_float);
}

// [0]: unsigned (exp_avg_sq), [1]: signed (exp_avg); each map's quantisation table: value in [-1, 1]
// -> one of 65536 bins -> the map entry nearest the bin's value (bitsandbytes' build_quantize_lut).
static float g_map[2][256];
static unsigned char g_lut[2][LUT_SIZE];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void build_lut(const float *map, unsigned char *lut) {
    float mid[255];
    for (int i = 0; i < 255; i++) mid[i] = 0.5f * (map[i] + map[i + 1]);
    int c = 0;
    for (int i = 0; i < LUT_SIZE; i++) {
        float val = -1.0f + (2.0f * (float)i) / (float)(LUT_SIZE - 1);
        while (c < 255 && mid[c] < val) c++;
        lut[i] = (unsigned char)c;
    }
}

static void build_tables(void) {
    for (int s = 0; s < 2; s++) {
        sl_dynamic_map(s, g_map[s]);
        build_lut(g_map[s], g_lut[s]);
    }
}

static inline unsigned lut_index(float x) {
    x = x >= -1.0f ? x : -1.0f;  // NaN too: no undefined conversion
    x = x <= 1.0f ? x : 1.0f;
    return (unsigned)(int)((x + 1.0f) * 0.5f * (float)(LUT_SIZE - 1) + 0.5f);
}

// q[0..n) = x quantised against absmax (all zero codes for an all-zero block, as bitsandbytes).
static void quantize(const float *x, int n, float absmax, const unsigned char *lut, unsigned char *q) {
    if (absmax == 0.0f) {
        memset(q, 0, (size_t)n);
        return;
    }
    float inv = 1.0f / absmax;
    unsigned idx[SL_ADAM8_BLOCK];
    for (int i = 0; i < n; i++) idx[i] = lut_index(x[i] * inv);   // vectorised
    for (int i = 0; i < n; i++) q[i] = lut[idx[i]];
}

// ---- the step ------------------------------------------------------------------------------------

// n (<= 256) elements of one block: dequantise with the block's absmax, update the moments and (unless
// measuring) the parameters, then requantise with the new absmax, or with `whole` (the absmax over
// the whole block, for a cut block). Measuring stores this part's absmax in measured[2] and writes nothing.
static void block_step(const sl_adam8_args *a, float decay, float *p, const float *g, unsigned char *q1,
                       unsigned char *q2, float *absmax1, float *absmax2, int n, const float *whole, int measure,
                       float *measured) {
    float m[SL_ADAM8_BLOCK], v[SL_ADAM8_BLOCK];
    const float s1 = *absmax1, s2 = *absmax2, b1 = a->beta1, omb1 = a->one_minus_beta1, b2 = a->beta2,
                omb2 = a->one_minus_beta2;
    const float *restrict map1 = g_map[1], *restrict map0 = g_map[0];
    // separate simple loops, so the compiler vectorises each (the arithmetic per element is unchanged)
    for (int i = 0; i < n; i++) {
        float gi = g[i];
        m[i] = fmaf(gi, omb1, map1[q1[i]] * s1 * b1);         // mul_(b1).add_(g, alpha=1-b1)
        v[i] = map0[q2[i]] * s2 * b2 + omb2 * gi * gi;        // mul_(b2).addcmul_(g, g, value=1-b2)
    }
    // absmax as bitsandbytes takes it: the max of |x| from 0, NaN ignored (max is exact in any order)
    float mx1 = 0.0f, mx2 = 0.0f;
#pragma omp simd reduction(max : mx1, mx2)
    for (int i = 0; i < n; i++) {
        float x1 = fabsf(m[i]), x2 = fabsf(v[i]);
        x1 = x1 == x1 ? x1 : 0.0f;
        x2 = x2 == x2 ? x2 : 0.0f;
        mx1 = x1 > mx1 ? x1 : mx1;
        mx2 = x2 > mx2 ? x2 : mx2;
    }
    if (measure) {
        measured[0] = mx1;
        measured[1] = mx2;
        return;
    }
    const float bc2_sqrt = a->bc2_sqrt, eps = a->eps, neg_step = a->neg_step;
    for (int i = 0; i < n; i++) {
        float denom = sqrtf(v[i]) / bc2_sqrt + eps;
        p[i] = p[i] * decay + neg_step * m[i] / denom;        // addcdiv_: p + (value * m) / denom
    }
    if (whole) {
        mx1 = whole[0];
        mx2 = whole[1];
    }
    *absmax1 = mx1;
    *absmax2 = mx2;
    quantize(m, n, mx1, g_lut[1], q1);
    quantize(v, n, mx2, g_lut[0], q2);
}

static void quantized_segment(const sl_adam8_args *a, float *p, const float *g, const sl_adam8_state *st,
                              const sl_adam8_segment *s, sl_adam8_edges *edges, int measure) {
    const long len = (long)(s->end - s->begin), phase = s->phase;
    const long nb = (phase + len + SL_ADAM8_BLOCK - 1) / SL_ADAM8_BLOCK;
    const float decay = s->decay ? a->decay_factor : 1.0f;
#pragma omp parallel for schedule(static) if (!measure && nb >= OMP_MIN_BLOCKS)
    for (long j = 0; j < nb; j++) {
        long lo = j == 0 ? 0 : j * SL_ADAM8_BLOCK - phase;
        long hi = (j + 1) * SL_ADAM8_BLOCK - phase;
        if (hi > len) hi = len;
        int head = j == 0 && s->cut_head, tail = j == nb - 1 && s->cut_tail;
        if (measure && !head && !tail) continue;
        float *whole = head ? edges->head : tail ? edges->tail : NULL;
        size_t e = s->begin + (size_t)lo, k = s->state + (size_t)lo, b = s->block + (size_t)j;
        block_step(a, decay, p + e, g + e, st->q1 + k, st->q2 + k, st->absmax1 + b, st->absmax2 + b, (int)(hi - lo),
                   whole, measure, whole);
        if (measure && head && tail) memcpy(edges->tail, edges->head, sizeof edges->tail);
    }
}

static void float_segment(const sl_adam8_args *a, float *p, const float *g, const sl_adam8_state *st,
                          const sl_adam8_segment *s) {
    const long len = (long)(s->end - s->begin);
    const float decay = s->decay ? a->decay_factor : 1.0f;
    float *restrict ps = p + s->begin, *restrict m = st->m32 + s->state, *restrict v = st->v32 + s->state;
    const float *restrict gs = g + s->begin;
#pragma omp parallel for schedule(static) if (len >= OMP_MIN_BLOCKS * SL_ADAM8_BLOCK)
    for (long i = 0; i < len; i++) {
        float gi = gs[i];
        float mi = fmaf(gi, a->one_minus_beta1, m[i] * a->beta1);
        float vi = v[i] * a->beta2 + a->one_minus_beta2 * gi * gi;
        float update = mi / (sqrtf(vi) + a->eps32);
        ps[i] = fmaf(update, a->neg_step32, ps[i] * decay);   // p.add_(update, alpha=step_size)
        m[i] = mi;
        v[i] = vi;
    }
}

void cpu_adam8_step(const sl_adam8_args *a, float *p, const float *g, const sl_adam8_state *st,
                    const sl_adam8_segment *segs, int n_segs, sl_adam8_edges *edges, int measure) {
    pthread_once(&g_once, build_tables);
    for (int i = 0; i < n_segs; i++) {
        if (segs[i].quantized) quantized_segment(a, p, g, st, &segs[i], edges, measure);
        else if (!measure) float_segment(a, p, g, st, &segs[i]);
    }
}
