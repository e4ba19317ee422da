// norm.c: LayerNorm (GPT-2) and RMSNorm (LLaMA), forward and backward, and the forwards fused with
// the residual add before them. Rows are parallel; the weight/bias gradients are column sums computed
// by column blocks, so results do not depend on the thread count.
// The forward of one row is a function kept out of line (noinline): the plain and the fused forwards
// call the same machine code on the same row values, so fused == residual_forward + norm, bit for bit.
#include "ops/cpu/cpu_ops.h"

#include <math.h>

// y (C) = (x - mean) * rstd * w + b for one row; *mean, *rstd receive the row's statistics.
__attribute__((noinline)) static void layernorm_row(float *y, float *mean, float *rstd, const float *x,
                                                    const float *w, const float *b, int C, float eps) {
    float m = 0.0f;
#pragma omp simd reduction(+ : m)
    for (int c = 0; c < C; c++) m += x[c];
    m /= (float)C;
    float v = 0.0f;
#pragma omp simd reduction(+ : v)
    for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
    v /= (float)C;
    float r = 1.0f / sqrtf(v + eps);
#pragma omp simd
    for (int c = 0; c < C; c++) y[c] = (x[c] - m) * r * w[c] + b[c];
    *mean = m;
    *rstd = r;
}

// y (C) = w * (x * rstd) for one row; *rstd receives 1/sqrt(mean(x^2) + eps).
__attribute__((noinline)) static void rmsnorm_row(float *y, float *rstd, const float *x, const float *w, int C,
                                                  float eps) {
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int c = 0; c < C; c++) ss += x[c] * x[c];
    float r = 1.0f / sqrtf(ss / (float)C + eps);
    // transformers computes (x * rstd) first, then multiplies by the weight
#pragma omp simd
    for (int c = 0; c < C; c++) y[c] = w[c] * (x[c] * r);
    *rstd = r;
}

// resid (C) = a + b for one row (resid may be a or b), as residual_forward computes it.
static inline void residual_row(float *resid, const float *a, const float *b, int C) {
#pragma omp simd
    for (int c = 0; c < C; c++) resid[c] = a[c] + b[c];
}

void cpu_layernorm_forward(sl_act *out_, float *mean, float *rstd, const sl_act *inp_, const sl_act *w_,
                           const sl_act *b_, int N, int C, float eps) {
    float *out = cpu_f32(out_);
    const float *inp = cpu_f32(inp_);
    const float *w = cpu_f32(w_);
    const float *b = cpu_f32(b_);
#pragma omp parallel for schedule(static) if((size_t)N * C >= SL_PAR_MIN_WORK)
    for (int n = 0; n < N; n++)
        layernorm_row(out + (size_t)n * C, mean + n, rstd + n, inp + (size_t)n * C, w, b, C, eps);
}

void cpu_residual_layernorm_forward(sl_act *resid_, sl_act *out_, float *mean, float *rstd, const sl_act *a_,
                                    const sl_act *b_, const sl_act *w_, const sl_act *bias_, int N, int C,
                                    float eps) {
    float *resid = cpu_f32(resid_);
    float *out = cpu_f32(out_);
    const float *a = cpu_f32(a_);
    const float *b = cpu_f32(b_);
    const float *w = cpu_f32(w_);
    const float *bias = cpu_f32(bias_);
#pragma omp parallel for schedule(static) if((size_t)N * C >= SL_PAR_MIN_WORK)
    for (int n = 0; n < N; n++) {
        size_t row = (size_t)n * C;
        residual_row(resid + row, a + row, b + row, C);
        layernorm_row(out + row, mean + n, rstd + n, resid + row, w, bias, C, eps);
    }
}

void cpu_layernorm_backward(sl_act *dinp_, float *dw, float *db, const sl_act *dout_, const sl_act *inp_,
                            const sl_act *w_, const float *mean, const float *rstd, int N, int C) {
    float *dinp = cpu_f32(dinp_);
    const float *dout = cpu_f32(dout_);
    const float *inp = cpu_f32(inp_);
    const float *w = cpu_f32(w_);
#pragma omp parallel for schedule(static) if((size_t)N * C >= SL_PAR_MIN_WORK)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C, *dy = dout + (size_t)n * C;
        float *dx = dinp + (size_t)n * C;
        float m = mean[n], r = rstd[n], mean_dnorm = 0.0f, mean_dnorm_xhat = 0.0f;
#pragma omp simd reduction(+ : mean_dnorm, mean_dnorm_xhat)
        for (int c = 0; c < C; c++) {
            float dnorm = dy[c] * w[c];
            mean_dnorm += dnorm;
            mean_dnorm_xhat += dnorm * (x[c] - m) * r;
        }
        mean_dnorm /= (float)C;
        mean_dnorm_xhat /= (float)C;
#pragma omp simd
        for (int c = 0; c < C; c++) dx[c] += (dy[c] * w[c] - mean_dnorm - (x[c] - m) * r * mean_dnorm_xhat) * r;
    }
    if (!dw && !db) return;  // frozen weights (LoRA): only the input's gradient (LoRA's bias "all": db alone)
#pragma omp parallel if((size_t)N * C >= SL_PAR_MIN_WORK)
    {
        size_t c0, c1;
        cpu_thread_range((size_t)C, &c0, &c1);
        for (int n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * C, *dy = dout + (size_t)n * C;
            float m = mean[n], r = rstd[n];
            if (dw)
                for (size_t c = c0; c < c1; c++) dw[c] += dy[c] * (x[c] - m) * r;
            if (db)
                for (size_t c = c0; c < c1; c++) db[c] += dy[c];
        }
    }
}

void cpu_rmsnorm_forward(sl_act *out_, float *rstd, const sl_act *inp_, const sl_act *w_, int N, int C, float eps) {
    float *out = cpu_f32(out_);
    const float *inp = cpu_f32(inp_);
    const float *w = cpu_f32(w_);
#pragma omp parallel for schedule(static) if((size_t)N * C >= SL_PAR_MIN_WORK)
    for (int n = 0; n < N; n++) rmsnorm_row(out + (size_t)n * C, rstd + n, inp + (size_t)n * C, w, C, eps);
}

void cpu_residual_rmsnorm_forward(sl_act *resid_, sl_act *out_, float *rstd, const sl_act *a_, const sl_act *b_,
                                  const sl_act *w_, int N, int C, float eps) {
    float *resid = cpu_f32(resid_);
    float *out = cpu_f32(out_);
    const float *a = cpu_f32(a_);
    const float *b = cpu_f32(b_);
    const float *w = cpu_f32(w_);
#pragma omp parallel for schedule(static) if((size_t)N * C >= SL_PAR_MIN_WORK)
    for (int n = 0; n < N; n++) {
        size_t row = (size_t)n * C;
        residual_row(resid + row, a + row, b + row, C);
        rmsnorm_row(out + row, rstd + n, resid + row, w, C, eps);
    }
}

// dx (C) += RMSNorm's input gradient of one row. Out of line: the bf16 table's in-place backward
// (norm_bf16.c) calls the same machine code on the same row values, so both give the same bits.
__attribute__((noinline)) void cpu_rmsnorm_backward_row(float *dx, const float *dy, const float *x, const float *w,
                                                        float r, int C) {
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int c = 0; c < C; c++) dot += dy[c] * w[c] * x[c];
    float k = dot * r * r * r / (float)C;
#pragma omp simd
    for (int c = 0; c < C; c++) dx[c] += dy[c] * w[c] * r - x[c] * k;
}

// dw (n) += one row's share of RMSNorm's weight gradient; out of line as the row above.
__attribute__((noinline)) void cpu_rmsnorm_weight_grad_row(float *dw, const float *dy, const float *x, float r, int n) {
    for (int c = 0; c < n; c++) dw[c] += dy[c] * x[c] * r;
}

void cpu_rmsnorm_backward(sl_act *dinp_, float *dw, const sl_act *dout_, const sl_act *inp_, const sl_act *w_,
                          const float *rstd, int N, int C) {
    float *dinp = cpu_f32(dinp_);
    const float *dout = cpu_f32(dout_);
    const float *inp = cpu_f32(inp_);
    const float *w = cpu_f32(w_);
#pragma omp parallel for schedule(static) if((size_t)N * C >= SL_PAR_MIN_WORK)
    for (int n = 0; n < N; n++)
        cpu_rmsnorm_backward_row(dinp + (size_t)n * C, dout + (size_t)n * C, inp + (size_t)n * C, w, rstd[n], C);
    if (!dw) return;  // frozen weight (LoRA): only the input's gradient
#pragma omp parallel if((size_t)N * C >= SL_PAR_MIN_WORK)
    {
        size_t c0, c1;
        cpu_thread_range((size_t)C, &c0, &c1);
        for (int n = 0; n < N; n++)
            cpu_rmsnorm_weight_grad_row(dw + c0, dout + (size_t)n * C + c0, inp + (size_t)n * C + c0, rstd[n],
                                        (int)(c1 - c0));
    }
}
