// ops_cpu_bf16.c: sl_ops_cpu_bf16, a test backend emulating the GPU's bf16 activation storage
// (ops.h, act_bf16 = 1) on the CPU. Each op widens its storage-typed inputs from bf16 into fp32
// temporaries, runs sl_ops_cpu's op on them, and rounds its storage-typed outputs back to bf16
// (nearest even, as sl_f32_to_bf16). In-place arguments (rope's qkv, crossentropy_backward's logits,
// matmul_gelu_backward's dout) and accumulating ones (the norms' backward dinp) are widened, updated
// and rounded back. The parameters an op reads (weights, biases, norm weights, wte / wpe) are the
// model's bf16 shadow and are widened too; fp32 arguments (parameter gradients, statistics) pass
// straight through.
// Memory functions and optimizer passes are the CPU's. Slow (two conversions and a heap buffer per
// tensor per op): it exists so that CI runs the model's bf16 storage plumbing without a GPU.
#include "ops/cpu/cpu_ops.h"
#include "shardlm/precision.h"

#include "shardlm/error.h"

#include <stdio.h>
#include <stdlib.h>

static const sl_ops *const cpu = &sl_ops_cpu;

// A temporary that could not be allocated: the op does nothing more, and the first failure is
// reported by synchronize() (as a failed GPU call is), which the engine checks every step.
static int g_failed;
static char g_failure[160];

static int bf16_synchronize(void) {
    if (!g_failed) return 0;
    g_failed = 0;
    return sl_errorf("%s", g_failure);
}

// An fp32 temporary of n elements; NULL (failure recorded) when the heap is out.
static float *scratch(size_t n) {
    float *f = malloc((n ? n : 1) * sizeof(float));
    if (!f && !g_failed) {
        g_failed = 1;
        snprintf(g_failure, sizeof g_failure, "cpu-bf16: out of memory for a %zu-float temporary", n);
    }
    return f;
}

// bf16 storage (n elements) widened into a new fp32 temporary; NULL stays NULL.
static float *widen(const float *storage, size_t n) {
    if (!storage) return NULL;
    float *f = scratch(n);
    if (f) sl_bf16_to_f32_array((const sl_bf16 *)(const void *)storage, f, n);
    return f;
}

// The fp32 temporary f rounded into bf16 storage (n elements; none for NULL storage), then freed.
static void narrow(float *storage, float *f, size_t n) {
    if (storage && f && !g_failed) sl_f32_to_bf16_array(f, (sl_bf16 *)(void *)storage, n);
    free(f);
}

static size_t sz(int a, int b) { return (size_t)a * (size_t)b; }

// wte and wpe are bf16 (the parameters' shadow): the rows the batch reads are widened into a table
// of N rows that row n of the batch indexes (token ids 0..N-1), wpe whole.
static void encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B, int T, int C) {
    size_t N = sz(B, T), n = sz(B * T, C);
    float *rows = scratch(n), *o = scratch(n), *pe = widen(wpe, sz(T, C));
    int *ids = (int *)(void *)scratch(N);
    for (size_t r = 0; !g_failed && r < N; r++) {
        ids[r] = (int)r;
        sl_bf16_to_f32_array((const sl_bf16 *)(const void *)wte + (size_t)inp[r] * C, rows + r * C, (size_t)C);
    }
    if (!g_failed) cpu->encoder_forward(o, ids, rows, pe, B, T, C);
    narrow(out, o, n);
    free(rows);
    free(pe);
    free(ids);
}

static void encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B, int T, int C) {
    float *d = widen(dout, sz(B * T, C));
    if (!g_failed) cpu->encoder_backward(dwte, dwpe, d, inp, B, T, C);
    free(d);
}

static void matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N, int IC,
                           int OC) {
    float *i = widen(inp, sz(N, IC)), *w = widen(weight, sz(OC, IC)), *b = widen(bias, (size_t)OC);
    float *o = scratch(sz(N, OC));
    if (!g_failed) cpu->matmul_forward(o, i, w, b, N, IC, OC);
    narrow(out, o, sz(N, OC));
    free(i);
    free(w);
    free(b);
}

static void matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                            const float *weight, int N, int IC, int OC) {
    float *d = widen(dout, sz(N, OC)), *i = widen(inp, sz(N, IC)), *w = widen(weight, sz(OC, IC));
    float *di = dinp ? scratch(sz(N, IC)) : NULL;
    if (!g_failed) cpu->matmul_backward(di, dweight, dbias, d, i, w, N, IC, OC);
    narrow(dinp, di, sz(N, IC));
    free(d);
    free(i);
    free(w);
}

static void matmul_gelu_forward(float *out, float *pre, const float *inp, const float *weight, const float *bias,
                                int N, int IC, int OC) {
    float *i = widen(inp, sz(N, IC)), *w = widen(weight, sz(OC, IC)), *b = widen(bias, (size_t)OC);
    float *o = scratch(sz(N, OC)), *p = scratch(sz(N, OC));
    if (!g_failed) cpu->matmul_gelu_forward(o, p, i, w, b, N, IC, OC);
    narrow(out, o, sz(N, OC));
    narrow(pre, p, sz(N, OC));
    free(i);
    free(w);
    free(b);
}

static void gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);

// dout is overwritten with the pre-GELU gradient, stored (rounded); the GEMMs and the bias gradient
// then read it as stored, as the GPU's fused kernel and its unfused path both do.
static void matmul_gelu_backward(float *dinp, float *dweight, float *dbias, float *dout, const float *pre,
                                 const float *inp, const float *weight, int N, int IC, int OC) {
    gelu_backward(dout, pre, dout, sz(N, OC));
    matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
}

static void layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b,
                              int N, int C, float eps) {
    float *i = widen(inp, sz(N, C)), *o = scratch(sz(N, C)), *wf = widen(w, (size_t)C), *bf = widen(b, (size_t)C);
    if (!g_failed) cpu->layernorm_forward(o, mean, rstd, i, wf, bf, N, C, eps);
    narrow(out, o, sz(N, C));
    free(i);
    free(wf);
    free(bf);
}

static void layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w,
                               const float *mean, const float *rstd, int N, int C) {
    float *di = widen(dinp, sz(N, C)), *d = widen(dout, sz(N, C)), *i = widen(inp, sz(N, C)), *wf = widen(w, (size_t)C);
    if (!g_failed) cpu->layernorm_backward(di, dw, db, d, i, wf, mean, rstd, N, C);
    narrow(dinp, di, sz(N, C));  // accumulated into
    free(d);
    free(i);
    free(wf);
}

static void rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps) {
    float *i = widen(inp, sz(N, C)), *o = scratch(sz(N, C)), *wf = widen(w, (size_t)C);
    if (!g_failed) cpu->rmsnorm_forward(o, rstd, i, wf, N, C, eps);
    narrow(out, o, sz(N, C));
    free(i);
    free(wf);
}

static void rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                             const float *rstd, int N, int C) {
    float *di = widen(dinp, sz(N, C)), *d = widen(dout, sz(N, C)), *i = widen(inp, sz(N, C)), *wf = widen(w, (size_t)C);
    if (!g_failed) cpu->rmsnorm_backward(di, dw, d, i, wf, rstd, N, C);
    narrow(dinp, di, sz(N, C));  // accumulated into
    free(d);
    free(i);
    free(wf);
}

// The residual adds widen both addends before writing: out / resid may alias a or b.
static void residual_forward(float *out, const float *a, const float *b, size_t n) {
    float *x = widen(a, n), *y = widen(b, n), *o = scratch(n);
    if (!g_failed) cpu->residual_forward(o, x, y, n);
    narrow(out, o, n);
    free(x);
    free(y);
}

// The fused residual norms: resid is stored (rounded) first and the norm reads it back as stored,
// as the GPU's kernels do and as residual_forward followed by the norm's forward would.
static void residual_layernorm_forward(float *resid, float *out, float *mean, float *rstd, const float *a,
                                       const float *b, const float *w, const float *bias, int N, int C, float eps) {
    residual_forward(resid, a, b, sz(N, C));
    layernorm_forward(out, mean, rstd, resid, w, bias, N, C, eps);
}

static void residual_rmsnorm_forward(float *resid, float *out, float *rstd, const float *a, const float *b,
                                     const float *w, int N, int C, float eps) {
    residual_forward(resid, a, b, sz(N, C));
    rmsnorm_forward(out, rstd, resid, w, N, C, eps);
}

static void gelu_forward(float *out, const float *inp, size_t n) {
    float *i = widen(inp, n), *o = scratch(n);
    if (!g_failed) cpu->gelu_forward(o, i, n);
    narrow(out, o, n);
    free(i);
}

static void gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
    float *i = widen(inp, n), *d = widen(dout, n), *di = scratch(n);
    if (!g_failed) cpu->gelu_backward(di, i, d, n);
    narrow(dinp, di, n);
    free(i);
    free(d);
}

static void swiglu_forward(float *out, const float *inp, int N, int I) {
    float *i = widen(inp, sz(N, 2 * I)), *o = scratch(sz(N, I));
    if (!g_failed) cpu->swiglu_forward(o, i, N, I);
    narrow(out, o, sz(N, I));
    free(i);
}

static void swiglu_backward(float *dinp, const float *inp, const float *dout, int N, int I) {
    float *i = widen(inp, sz(N, 2 * I)), *d = widen(dout, sz(N, I)), *di = scratch(sz(N, 2 * I));
    if (!g_failed) cpu->swiglu_backward(di, i, d, N, I);
    narrow(dinp, di, sz(N, 2 * I));
    free(i);
    free(d);
}

static void rope_forward(float *qkv, const float *cos, const float *sin, int B, int T, int NH, int NKV, int HD,
                         int pos0) {
    size_t n = sz(B * T, (NH + 2 * NKV) * HD);
    float *q = widen(qkv, n);
    if (!g_failed) cpu->rope_forward(q, cos, sin, B, T, NH, NKV, HD, pos0);
    narrow(qkv, q, n);  // in place
}

static void rope_backward(float *dqkv, const float *cos, const float *sin, int B, int T, int NH, int NKV, int HD) {
    size_t n = sz(B * T, (NH + 2 * NKV) * HD);
    float *d = widen(dqkv, n);
    if (!g_failed) cpu->rope_backward(d, cos, sin, B, T, NH, NKV, HD);
    narrow(dqkv, d, n);  // in place
}

static void attention_forward(float *out, float *lse, const float *qkv, int B, int T, int NH, int NKV, int HD,
                              int window) {
    float *q = widen(qkv, sz(B * T, (NH + 2 * NKV) * HD)), *o = scratch(sz(B * T, NH * HD));
    if (!g_failed) cpu->attention_forward(o, lse, q, B, T, NH, NKV, HD, window);
    narrow(out, o, sz(B * T, NH * HD));
    free(q);
}

static void attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse,
                               int B, int T, int NH, int NKV, int HD, int window) {
    size_t nq = sz(B * T, (NH + 2 * NKV) * HD), no = sz(B * T, NH * HD);
    float *d = widen(dout, no), *q = widen(qkv, nq), *o = widen(out, no), *dq = scratch(nq);
    if (!g_failed) cpu->attention_backward(dq, d, q, o, lse, B, T, NH, NKV, HD, window);
    narrow(dqkv, dq, nq);
    free(d);
    free(q);
    free(o);
}

static void attention_decode(float *out, const float *q, const float *k_cache, const float *v_cache, int n_ctx,
                             int NH, int NKV, int HD) {
    float *qf = widen(q, sz(NH, HD)), *k = widen(k_cache, sz(n_ctx, NKV * HD)), *v = widen(v_cache, sz(n_ctx, NKV * HD));
    float *o = scratch(sz(NH, HD));
    if (!g_failed) cpu->attention_decode(o, qf, k, v, n_ctx, NH, NKV, HD);
    narrow(out, o, sz(NH, HD));
    free(qf);
    free(k);
    free(v);
}

static double crossentropy_forward(float *lse, const float *logits, const int *targets, int N, int V, int Vp) {
    float *l = widen(logits, sz(N, Vp));
    double loss = g_failed ? 0.0 : cpu->crossentropy_forward(lse, l, targets, N, V, Vp);
    free(l);
    return loss;
}

static void crossentropy_backward(float *logits, const float *lse, const int *targets, int N, int V, int Vp,
                                  float dloss) {
    float *l = widen(logits, sz(N, Vp));
    if (!g_failed) cpu->crossentropy_backward(l, lse, targets, N, V, Vp, dloss);
    narrow(logits, l, sz(N, Vp));  // dlogits, in place
}

const sl_ops sl_ops_cpu_bf16 = {
    .name = "cpu-bf16",
    .encoder_forward = encoder_forward,
    .encoder_backward = encoder_backward,
    .matmul_forward = matmul_forward,
    .matmul_backward = matmul_backward,
    .matmul_gelu_forward = matmul_gelu_forward,
    .matmul_gelu_backward = matmul_gelu_backward,
    .layernorm_forward = layernorm_forward,
    .layernorm_backward = layernorm_backward,
    .rmsnorm_forward = rmsnorm_forward,
    .rmsnorm_backward = rmsnorm_backward,
    .residual_forward = residual_forward,
    .residual_layernorm_forward = residual_layernorm_forward,
    .residual_rmsnorm_forward = residual_rmsnorm_forward,
    .gelu_forward = gelu_forward,
    .gelu_backward = gelu_backward,
    .swiglu_forward = swiglu_forward,
    .swiglu_backward = swiglu_backward,
    .rope_forward = rope_forward,
    .rope_backward = rope_backward,
    .attention_forward = attention_forward,
    .attention_backward = attention_backward,
    .attention_decode = attention_decode,
    .crossentropy_forward = crossentropy_forward,
    .crossentropy_backward = crossentropy_backward,
    .act_bf16 = 1,
    .sliding_window = 1,
    .synchronize = bf16_synchronize,
    SL_CPU_HOST_FNS,  // memory functions and optimizer passes are the CPU's
};
