// crossentropy.c: softmax cross-entropy and its gradient, in place over the logits: forward keeps
// only each row's log-sum-exp, backward turns the logits into their gradient in one pass, so the
// probabilities are never stored separately. Only the first V of Vp (padded) columns count.
// Per-row losses are summed serially in double so the result does not depend on thread timing.
#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/vec_math.h"

#include <math.h>
#include <stdlib.h>

double cpu_crossentropy_forward(float *lse, const sl_act *logits_, const int *targets, int N, int V, int Vp) {
    const float *logits = cpu_f32(logits_);
#pragma omp parallel for schedule(static) if((size_t)N * V >= SL_PAR_MIN_WORK)
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * Vp;
        float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
        for (int v = 0; v < V; v++) mx = x[v] > mx ? x[v] : mx;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int v = 0; v < V; v++) sum += vexpf(x[v] - mx);
        lse[n] = mx + logf(sum);
    }
    double total = 0.0;
    for (int n = 0; n < N; n++)
        if (targets[n] >= 0) total += (double)(lse[n] - logits[(size_t)n * Vp + targets[n]]);
    return total;
}

void cpu_crossentropy_backward(sl_act *logits_, const float *lse, const int *targets, int N, int V, int Vp,
                               float dloss) {
    float *logits = cpu_f32(logits_);
#pragma omp parallel for schedule(static) if((size_t)N * V >= SL_PAR_MIN_WORK)
    for (int n = 0; n < N; n++) {
        float *x = logits + (size_t)n * Vp;
        int target = targets[n];
        float scale = target >= 0 ? dloss : 0.0f, l = lse[n];
#pragma omp simd
        for (int v = 0; v < V; v++) x[v] = vexpf(x[v] - l) * scale;
        if (target >= 0) x[target] -= dloss;
        for (int v = V; v < Vp; v++) x[v] = 0.0f;
    }
}

// The two ops above in sequence (the CPU has no pass to save): the same bits as calling them.
double cpu_crossentropy_fused(float *lse, sl_act *logits, const int *targets, int N, int V, int Vp, float dloss) {
    double total = cpu_crossentropy_forward(lse, logits, targets, N, V, Vp);
    cpu_crossentropy_backward(logits, lse, targets, N, V, Vp, dloss);
    return total;
}
