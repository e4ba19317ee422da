// crossentropy.c: fused softmax + cross-entropy + its gradient, in place over the logits, so the
// probabilities are never stored separately. Only the first V of Vp (padded) columns count.
// Per-row losses are summed serially in double so the result does not depend on thread timing.
#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/vec_math.h"

#include <math.h>
#include <stdlib.h>

double cpu_crossentropy_forward_backward(float *logits, const int *targets, int N, int V, int Vp, float dloss) {
    float *row_loss = malloc(sizeof(float) * (size_t)(N > 0 ? N : 1));
#pragma omp parallel for schedule(static) if((size_t)N * V >= SL_PAR_MIN_WORK)
    for (int n = 0; n < N; n++) {
        float *x = logits + (size_t)n * Vp;
        int target = targets[n];
        float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
        for (int v = 0; v < V; v++) mx = x[v] > mx ? x[v] : mx;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int v = 0; v < V; v++) sum += vexpf(x[v] - mx);
        float lse = mx + logf(sum);
        float row = target >= 0 ? lse - x[target] : 0.0f;
        if (row_loss) row_loss[n] = row;
        if (dloss == 0.0f) continue;
        float scale = target >= 0 ? dloss : 0.0f;
#pragma omp simd
        for (int v = 0; v < V; v++) x[v] = vexpf(x[v] - lse) * scale;
        if (target >= 0) x[target] -= dloss;
        for (int v = V; v < Vp; v++) x[v] = 0.0f;
    }
    double total = 0.0;
    if (!row_loss) return NAN;  // out of memory: the caller sees a NaN loss
    for (int n = 0; n < N; n++) total += row_loss[n];
    free(row_loss);
    return total;
}
