// lora_cols.c: the elementwise ops LoRA adds on the CPU: a scaled column slice added into a fused
// linear's output (add_columns) and taken out of its gradient (take_columns), and inverted dropout
// (dropout_forward / dropout_backward) with the counter-based mask of ops.h (sl_dropout_keep).
// No reductions: every op gives the same bits for any thread count.
#include "ops/cpu/cpu_ops.h"

void cpu_add_columns(sl_act *out_, const sl_act *inp_, float scale, int N, int W, int ld, int col0) {
    float *out = cpu_f32(out_);
    const float *inp = cpu_f32(inp_);
#pragma omp parallel for schedule(static) if((size_t)N * W >= SL_PAR_MIN_WORK)
    for (int n = 0; n < N; n++) {
        float *o = out + (size_t)n * ld + col0;
        const float *x = inp + (size_t)n * W;
#pragma omp simd
        for (int j = 0; j < W; j++) o[j] += scale * x[j];
    }
}

void cpu_take_columns(sl_act *out_, const sl_act *inp_, float scale, int N, int W, int ld, int col0) {
    float *out = cpu_f32(out_);
    const float *inp = cpu_f32(inp_);
#pragma omp parallel for schedule(static) if((size_t)N * W >= SL_PAR_MIN_WORK)
    for (int n = 0; n < N; n++) {
        float *o = out + (size_t)n * W;
        const float *x = inp + (size_t)n * ld + col0;
#pragma omp simd
        for (int j = 0; j < W; j++) o[j] = scale * x[j];
    }
}

// out = inp * keep / (1 - p) (out may be inp): the forward and the backward are the same map.
static void dropout_apply(float *out, const float *inp, size_t n, float p, uint64_t seed) {
    float k = 1.0f / (1.0f - p);
#pragma omp parallel for schedule(static) if(n >= SL_PAR_MIN_WORK)
    for (size_t i = 0; i < n; i++) out[i] = sl_dropout_keep(seed, i, p) ? inp[i] * k : 0.0f;
}

void cpu_dropout_forward(sl_act *out, const sl_act *inp, size_t n, float p, uint64_t seed) {
    dropout_apply(cpu_f32(out), cpu_f32(inp), n, p, seed);
}

void cpu_dropout_backward(sl_act *dinp, const sl_act *dout, size_t n, float p, uint64_t seed) {
    dropout_apply(cpu_f32(dinp), cpu_f32(dout), n, p, seed);
}
