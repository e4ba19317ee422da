// elementwise.c: embeddings, residual add, GELU, SwiGLU and rotary embeddings on the CPU.
#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/vec_math.h"

#include <math.h>
#include <string.h>

void cpu_encoder_forward(sl_act *out_, const int *inp, const sl_act *wte_, const sl_act *wpe_, int B, int T,
                         int C) {
    float *out = cpu_f32(out_);
    const float *wte = cpu_f32(wte_);
    const float *wpe = cpu_f32(wpe_);
#pragma omp parallel for schedule(static) if((size_t)B * T * C >= SL_PAR_MIN_WORK)
    for (int n = 0; n < B * T; n++) {
        float *o = out + (size_t)n * C;
        const float *e = wte + (size_t)inp[n] * C;
        if (!wpe) {
            memcpy(o, e, sizeof(float) * (size_t)C);
            continue;
        }
        const float *p = wpe + (size_t)(n % T) * C;
#pragma omp simd
        for (int c = 0; c < C; c++) o[c] = e[c] + p[c];
    }
}

void cpu_encoder_backward(float *dwte, float *dwpe, const sl_act *dout_, const int *inp, int B, int T, int C) {
    const float *dout = cpu_f32(dout_);
    // each thread owns a block of columns, so repeated tokens never race and order is fixed
#pragma omp parallel if((size_t)B * T * C >= SL_PAR_MIN_WORK)
    {
        size_t c0, c1;
        cpu_thread_range((size_t)C, &c0, &c1);
        for (int n = 0; n < B * T; n++) {
            const float *d = dout + (size_t)n * C;
            if (dwte) {
                float *e = dwte + (size_t)inp[n] * C;
                for (size_t c = c0; c < c1; c++) e[c] += d[c];
            }
            if (dwpe) {
                float *p = dwpe + (size_t)(n % T) * C;
                for (size_t c = c0; c < c1; c++) p[c] += d[c];
            }
        }
    }
}

void cpu_residual_forward(sl_act *out_, const sl_act *a_, const sl_act *b_, size_t n) {
    float *out = cpu_f32(out_);
    const float *a = cpu_f32(a_);
    const float *b = cpu_f32(b_);
#pragma omp parallel for simd schedule(static) if(n >= SL_PAR_MIN_WORK)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void cpu_gelu_forward(sl_act *out_, const sl_act *inp_, size_t n) {
    float *out = cpu_f32(out_);
    const float *inp = cpu_f32(inp_);
#pragma omp parallel for simd schedule(static) if(n >= SL_PAR_MIN_WORK)
    for (size_t i = 0; i < n; i++) out[i] = gelu_value(inp[i]);
}

void cpu_gelu_backward(sl_act *dinp_, const sl_act *inp_, const sl_act *dout_, size_t n) {
    float *dinp = cpu_f32(dinp_);
    const float *inp = cpu_f32(inp_);
    const float *dout = cpu_f32(dout_);
#pragma omp parallel for simd schedule(static) if(n >= SL_PAR_MIN_WORK)
    for (size_t i = 0; i < n; i++) dinp[i] = gelu_grad(inp[i], dout[i]);
}

void cpu_swiglu_forward(sl_act *out_, const sl_act *inp_, int N, int I) {
    float *out = cpu_f32(out_);
    const float *inp = cpu_f32(inp_);
#pragma omp parallel for schedule(static) if((size_t)N * I >= SL_PAR_MIN_WORK)
    for (int n = 0; n < N; n++) {
        const float *g = inp + (size_t)n * 2 * I, *u = g + I;
        float *o = out + (size_t)n * I;
#pragma omp simd
        for (int i = 0; i < I; i++) o[i] = swiglu_value(g[i], u[i]);
    }
}

void cpu_swiglu_backward(sl_act *dinp_, const sl_act *inp_, const sl_act *dout_, int N, int I) {
    float *dinp = cpu_f32(dinp_);
    const float *inp = cpu_f32(inp_);
    const float *dout = cpu_f32(dout_);
#pragma omp parallel for schedule(static) if((size_t)N * I >= SL_PAR_MIN_WORK)
    for (int n = 0; n < N; n++) {
        const float *g = inp + (size_t)n * 2 * I, *u = g + I, *d = dout + (size_t)n * I;
        float *dg = dinp + (size_t)n * 2 * I, *du = dg + I;
#pragma omp simd
        for (int i = 0; i < I; i++) swiglu_grad(g[i], u[i], d[i], &dg[i], &du[i]);
    }
}

// Rotates the q and k heads of each row by the angles of its position; sign -1 applies the transpose.
static void rope_apply(float *qkv, const float *cos_t, const float *sin_t, int B, int T, int NH, int NKV, int HD,
                       int pos0, float sign) {
    int W = (NH + 2 * NKV) * HD, half = HD / 2;
#pragma omp parallel for collapse(2) schedule(static) if((size_t)B * T * (NH + NKV) * HD >= SL_PAR_MIN_WORK)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float *c = cos_t + (size_t)(pos0 + t) * half, *s = sin_t + (size_t)(pos0 + t) * half;
            for (int h = 0; h < NH + NKV; h++) {
                float *x = qkv + ((size_t)b * T + t) * W + (size_t)h * HD;
#pragma omp simd
                for (int i = 0; i < half; i++) rope_rotate(x[i], x[i + half], c[i], sign * s[i], &x[i], &x[i + half]);
            }
        }
}

void cpu_rope_forward(sl_act *qkv_, const float *cos_t, const float *sin_t, int B, int T, int NH, int NKV, int HD,
                      int pos0) {
    float *qkv = cpu_f32(qkv_);
    rope_apply(qkv, cos_t, sin_t, B, T, NH, NKV, HD, pos0, 1.0f);
}

void cpu_rope_backward(sl_act *dqkv_, const float *cos_t, const float *sin_t, int B, int T, int NH, int NKV,
                       int HD) {
    float *dqkv = cpu_f32(dqkv_);
    rope_apply(dqkv, cos_t, sin_t, B, T, NH, NKV, HD, 0, -1.0f);
}
