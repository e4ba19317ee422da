// optimizer.c: the CPU backend's optimizer passes (ops.h adam_step, sgd_step, sumsq, scale, nonfinite)
// over flat fp32 buffers, beside src/ops/cuda/optimizer.cu. The element arithmetic is the sequence of
// float32 operations torch.optim performs (foreach=False) with the step's scalars from optim.c;
// cpu_sumsq's result depends only on the data, never on the thread count.
#include "ops/cpu/cpu_ops.h"
#include "shardlm/precision.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

// torch's CPU kernels for add(alpha=) and lerp use fused multiply-add (Vectorized::fmadd); fmaf()
// reproduces their rounding (the optimizer fixtures match only with it): one instruction with
// -march=native / -mfma, a slower libm call without. GCC vectorizes the Adam loop only under
// -fno-math-errno (sqrt of v >= 0 never sets errno, so no result changes).

// Loops shorter than this run on one thread (OpenMP start-up costs more than the work).
#define SL_OMP_MIN 32768

// ---- Adam / AdamW ------------------------------------------------------------------------------

// One branch-free loop over [lo, hi) (so it vectorizes); `lerp_low` is a constant at each call site.
// With l2 == 0 and decay_factor == 1 the decay operations are exact no-ops for finite parameters.
typedef struct {
    float *p; const float *g; float *m; float *v;
    sl_bf16 *storage;  // NULL, or the bf16 copy of p (sl_adam_args.storage_bf16)
    float decay_factor, l2, w1, beta2, omb2, bc2_sqrt, eps, neg_step, grad_coef;
} adam_args;

static inline __attribute__((always_inline)) void adam_loop(const adam_args *a, long lo, long hi, const int lerp_low) {
    float *restrict p = a->p, *restrict m = a->m, *restrict v = a->v;
    const float *restrict g = a->g;
    const float decay_factor = a->decay_factor, l2 = a->l2, w1 = a->w1, beta2 = a->beta2, omb2 = a->omb2;
    const float bc2_sqrt = a->bc2_sqrt, eps = a->eps, neg_step = a->neg_step, grad_coef = a->grad_coef;
    for (long i = lo; i < hi; i++) {
        float gc = g[i] * grad_coef;                           // clip_grad_norm_'s g *= coef (1: none)
        float gi = fmaf(l2, p[i], gc);                         // Adam: grad.add(param, alpha=wd)
        float pi = p[i] * decay_factor;                        // AdamW: param.mul_(1 - lr*wd)
        float mi = m[i];                                       // exp_avg.lerp_(grad, 1 - beta1)
        mi = lerp_low ? fmaf(w1, gi - mi, mi) : fmaf(w1 - 1.0f, gi - mi, gi);
        float vi = v[i] * beta2;                               // exp_avg_sq.mul_(beta2)
        vi = vi + omb2 * gi * gi;                              //   .addcmul_(grad, grad, 1 - beta2)
        float denom = sqrtf(vi) / bc2_sqrt + eps;              // (sqrt(v) / sqrt(bc2)).add_(eps)
        p[i] = pi + neg_step * (mi / denom);                   // param.addcdiv_(m, denom, -step_size)
        m[i] = mi;
        v[i] = vi;
    }
}

// With a bf16 copy to write, the range goes in blocks small enough that the rounding reads the block's
// new parameters back from L1 / L2 rather than from memory.
#define ADAM_STORAGE_BLOCK 4096

static void adam_range(const adam_args *a, long lo, long hi) {
    const long block = a->storage ? ADAM_STORAGE_BLOCK : hi - lo;
    for (long b = lo; b < hi; b += block) {
        const long e = hi - b > block ? b + block : hi;
        if (a->w1 < 0.5f) adam_loop(a, b, e, 1);
        else adam_loop(a, b, e, 0);
        if (a->storage)
            for (long i = b; i < e; i++) a->storage[i] = sl_bf16_round(a->p[i]);
    }
}

// Splits [0, n) evenly over the threads (elementwise work: the result does not depend on the split).
static void adam_parallel(const adam_args *a, long n) {
    if (n < SL_OMP_MIN) { adam_range(a, 0, n); return; }
#pragma omp parallel
    {
        long nt = omp_get_num_threads(), t = omp_get_thread_num();
        adam_range(a, n * t / nt, n * (t + 1) / nt);
    }
}

void cpu_adam_step(const sl_adam_args *a, float *p, const float *g, float *m, float *v, const sl_segment *segs,
                   int n_segs) {
    for (int s = 0; s < n_segs; s++) {
        size_t off = segs[s].begin;
        int decay = segs[s].decay;
        adam_args args = {
            .p = p + off, .g = g + off, .m = m + off, .v = v + off,
            .storage = a->storage_bf16 ? (sl_bf16 *)a->storage_bf16 + off : NULL,
            .decay_factor = decay ? a->decay_factor : 1.0f, .l2 = decay ? a->l2 : 0.0f,
            .w1 = a->w1, .beta2 = a->beta2, .omb2 = a->one_minus_beta2,
            .bc2_sqrt = a->bc2_sqrt, .eps = a->eps, .neg_step = a->neg_step, .grad_coef = a->grad_coef,
        };
        adam_parallel(&args, (long)(segs[s].end - segs[s].begin));
    }
}

// ---- SGD ---------------------------------------------------------------------------------------

void cpu_sgd_step(const sl_sgd_args *a, float *p, const float *g, float *buf, const sl_segment *segs, int n_segs) {
    const float mom = a->momentum, omd = a->one_minus_dampening, neg_lr = a->neg_lr;
    const int first = a->first, nesterov = a->nesterov;
    if (!a->has_buf) buf = NULL;
    for (int s = 0; s < n_segs; s++) {
        size_t off = segs[s].begin;
        long n = (long)(segs[s].end - segs[s].begin);
        const float wd = segs[s].decay ? a->wd : 0.0f;
        float *ps = p + off, *bs = buf ? buf + off : NULL;
        const float *gs = g + off;
#pragma omp parallel for schedule(static) if (n >= SL_OMP_MIN)
        for (long i = 0; i < n; i++) {
            float pi = ps[i];
            float gi = gs[i];
            if (wd != 0.0f) gi = fmaf(wd, pi, gi);                     // grad.add(param, alpha=wd)
            if (bs) {
                float bi = first ? gi : fmaf(omd, gi, bs[i] * mom);    // buf.mul_(momentum).add_(grad, 1-dampening)
                bs[i] = bi;
                gi = nesterov ? fmaf(mom, bi, gi) : bi;                // grad.add(buf, alpha=momentum)
            }
            ps[i] = fmaf(neg_lr, gi, pi);                              // param.add_(grad, alpha=-lr)
        }
    }
}

// ---- gradient passes ---------------------------------------------------------------------------

#define SUMSQ_BLOCKS 256

// Sum of squares of x[0..n) with 8 independent double lanes added in a fixed order.
static double sumsq_block(const float *x, size_t n) {
    double acc[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += (double)x[i + j] * (double)x[i + j];
    for (; i < n; i++) acc[i & 7] += (double)x[i] * (double)x[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

double cpu_sumsq(const float *g, size_t n) {
    if (n == 0) return 0.0;
    double partial[SUMSQ_BLOCKS];
    size_t block = (n + SUMSQ_BLOCKS - 1) / SUMSQ_BLOCKS;
    if (block < 1024) block = 1024;  // small buffers: fewer, longer blocks
    int nblocks = (int)((n + block - 1) / block);
#pragma omp parallel for schedule(static) if (n >= SL_OMP_MIN)
    for (int b = 0; b < nblocks; b++) {
        size_t a = (size_t)b * block;
        size_t e = a + block < n ? a + block : n;
        partial[b] = sumsq_block(g + a, e - a);
    }
    double total = 0.0;
    for (int b = 0; b < nblocks; b++) total += partial[b];
    return total;
}

void cpu_scale(float *g, size_t n, float coef) {
    if (coef == 1.0f) return;
    long len = (long)n;
#pragma omp parallel for schedule(static) if (len >= SL_OMP_MIN)
    for (long i = 0; i < len; i++) g[i] *= coef;
}

void cpu_add(float *x, const float *y, size_t n) {
    long len = (long)n;
#pragma omp parallel for simd schedule(static) if (len >= SL_OMP_MIN)
    for (long i = 0; i < len; i++) x[i] += y[i];
}

int cpu_nonfinite(const float *g, size_t n) {
    int bad = 0;
    // exponent all ones = Inf or NaN; an OR over the buffer does not depend on how it is split
#pragma omp parallel for schedule(static) reduction(| : bad) if (n >= SL_OMP_MIN)
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &g[i], sizeof u);
        bad |= (u & 0x7F800000u) == 0x7F800000u;
    }
    return bad;
}
