// elementwise_bf16.c: the elementwise ops of cpu-bf16-onednn that read and write bf16 storage in place
// instead of being staged (ops_cpu_bf16_native.c): residual_forward, GELU and SwiGLU with their
// gradients, RoPE and its transpose, and LoRA's add_columns / take_columns. Staging widens every
// argument whole into fp32 scratch, runs the CPU op and rounds what it wrote back: for GELU's backward
// at GPT-2's MLP width that is five passes over fp32 copies of the activations where one over the bf16
// ones does; for add_columns it is the whole fused q|k|v or gate|up output (N x ld) to touch one
// adapter's W columns, three or two times per block. These widen each element as they read it, compute
// the CPU op's fp32 expression in its order (-ffp-contract=off: no fused multiply-add) and round once
// to nearest even, so they give the staged op's bits; untouched columns are not rewritten (staging
// rewrote them with their own bits). No reductions: the same bits for any thread count.
#include "ops/cpu/cpu_bf16.h"
#include "ops/cpu/vec_math.h"

void cpu_bf16_residual_forward(sl_act *out_, const sl_act *a_, const sl_act *b_, size_t n) {
    if (cpu_bf16_failed()) return;
    sl_bf16 *out = bf16_of(out_);
    const sl_bf16 *a = cbf16_of(a_), *b = cbf16_of(b_);
#pragma omp parallel for simd schedule(static) if(n >= SL_PAR_MIN_WORK)
    for (size_t i = 0; i < n; i++) out[i] = sl_bf16_round(sl_bf16_widen(a[i]) + sl_bf16_widen(b[i]));
}

void cpu_bf16_add_columns(sl_act *out_, const sl_act *inp_, float scale, int N, int W, int ld, int col0) {
    if (cpu_bf16_failed()) return;
    sl_bf16 *out = bf16_of(out_);
    const sl_bf16 *inp = cbf16_of(inp_);
#pragma omp parallel for schedule(static) if((size_t)N * W >= SL_PAR_MIN_WORK)
    for (int n = 0; n < N; n++) {
        sl_bf16 *o = out + (size_t)n * ld + col0;
        const sl_bf16 *x = inp + (size_t)n * W;
#pragma omp simd
        for (int j = 0; j < W; j++) o[j] = sl_bf16_round(sl_bf16_widen(o[j]) + scale * sl_bf16_widen(x[j]));
    }
}

void cpu_bf16_take_columns(sl_act *out_, const sl_act *inp_, float scale, int N, int W, int ld, int col0) {
    if (cpu_bf16_failed()) return;
    sl_bf16 *out = bf16_of(out_);
    const sl_bf16 *inp = cbf16_of(inp_);
#pragma omp parallel for schedule(static) if((size_t)N * W >= SL_PAR_MIN_WORK)
    for (int n = 0; n < N; n++) {
        sl_bf16 *o = out + (size_t)n * W;
        const sl_bf16 *x = inp + (size_t)n * ld + col0;
#pragma omp simd
        for (int j = 0; j < W; j++) o[j] = sl_bf16_round(scale * sl_bf16_widen(x[j]));
    }
}

void cpu_bf16_gelu_forward(sl_act *out_, const sl_act *inp_, size_t n) {
    if (cpu_bf16_failed()) return;
    sl_bf16 *out = bf16_of(out_);
    const sl_bf16 *inp = cbf16_of(inp_);
#pragma omp parallel for simd schedule(static) if(n >= SL_PAR_MIN_WORK)
    for (size_t i = 0; i < n; i++) out[i] = sl_bf16_round(gelu_value(sl_bf16_widen(inp[i])));
}

// dinp may be dout (the fused GEMM's backward overwrites its output gradient): each element is read
// before it is written.
void cpu_bf16_gelu_backward(sl_act *dinp_, const sl_act *inp_, const sl_act *dout_, size_t n) {
    if (cpu_bf16_failed()) return;
    sl_bf16 *dinp = bf16_of(dinp_);
    const sl_bf16 *inp = cbf16_of(inp_), *dout = cbf16_of(dout_);
#pragma omp parallel for simd schedule(static) if(n >= SL_PAR_MIN_WORK)
    for (size_t i = 0; i < n; i++) dinp[i] = sl_bf16_round(gelu_grad(sl_bf16_widen(inp[i]), sl_bf16_widen(dout[i])));
}

void cpu_bf16_swiglu_forward(sl_act *out_, const sl_act *inp_, int N, int I) {
    if (cpu_bf16_failed()) return;
    sl_bf16 *out = bf16_of(out_);
    const sl_bf16 *inp = cbf16_of(inp_);
#pragma omp parallel for schedule(static) if((size_t)N * I >= SL_PAR_MIN_WORK)
    for (int n = 0; n < N; n++) {
        const sl_bf16 *g = inp + (size_t)n * 2 * I, *u = g + I;
        sl_bf16 *o = out + (size_t)n * I;
#pragma omp simd
        for (int i = 0; i < I; i++) o[i] = sl_bf16_round(swiglu_value(sl_bf16_widen(g[i]), sl_bf16_widen(u[i])));
    }
}

void cpu_bf16_swiglu_backward(sl_act *dinp_, const sl_act *inp_, const sl_act *dout_, int N, int I) {
    if (cpu_bf16_failed()) return;
    sl_bf16 *dinp = bf16_of(dinp_);
    const sl_bf16 *inp = cbf16_of(inp_), *dout = cbf16_of(dout_);
#pragma omp parallel for schedule(static) if((size_t)N * I >= SL_PAR_MIN_WORK)
    for (int n = 0; n < N; n++) {
        const sl_bf16 *g = inp + (size_t)n * 2 * I, *u = g + I, *d = dout + (size_t)n * I;
        sl_bf16 *dg = dinp + (size_t)n * 2 * I, *du = dg + I;
#pragma omp simd
        for (int i = 0; i < I; i++) {
            float a, b;
            swiglu_grad(sl_bf16_widen(g[i]), sl_bf16_widen(u[i]), sl_bf16_widen(d[i]), &a, &b);
            dg[i] = sl_bf16_round(a);
            du[i] = sl_bf16_round(b);
        }
    }
}

// RoPE on the q and k heads of each row, vec_math.h's rotation as elementwise.c's rope_apply uses it
// (sign -1: the transpose, for the backward); v is not touched (staging rewrote the whole fused row).
// One (row, head) pair per iteration: a row's position is row % T.
static void rope_apply_bf16(sl_bf16 *qkv, const float *cos_t, const float *sin_t, int B, int T, int NH, int NKV,
                            int HD, int pos0, float sign) {
    size_t W = (size_t)(NH + 2 * NKV) * HD, heads = (size_t)NH + NKV, pairs = (size_t)B * T * heads;
    int half = HD / 2;
#pragma omp parallel for schedule(static) if(pairs * HD >= SL_PAR_MIN_WORK)
    for (size_t p = 0; p < pairs; p++) {
        size_t row = p / heads;
        size_t at = (size_t)pos0 + row % (size_t)T;
        const float *c = cos_t + at * half, *s = sin_t + at * half;
        sl_bf16 *lo = qkv + row * W + (p % heads) * HD, *hi = lo + half;
#pragma omp simd
        for (int i = 0; i < half; i++) {
            float y1, y2;
            rope_rotate(sl_bf16_widen(lo[i]), sl_bf16_widen(hi[i]), c[i], sign * s[i], &y1, &y2);
            lo[i] = sl_bf16_round(y1);
            hi[i] = sl_bf16_round(y2);
        }
    }
}

void cpu_bf16_rope_forward(sl_act *qkv, const float *cos_t, const float *sin_t, int B, int T, int NH, int NKV, int HD,
                           int pos0) {
    if (cpu_bf16_failed()) return;
    rope_apply_bf16(bf16_of(qkv), cos_t, sin_t, B, T, NH, NKV, HD, pos0, 1.0f);
}

void cpu_bf16_rope_backward(sl_act *dqkv, const float *cos_t, const float *sin_t, int B, int T, int NH, int NKV,
                            int HD) {
    if (cpu_bf16_failed()) return;
    rope_apply_bf16(bf16_of(dqkv), cos_t, sin_t, B, T, NH, NKV, HD, 0, -1.0f);
}
