// profile_ops.c: the profiling ops table of ops_profile.h. Each wrapper reads the monotonic clock,
// calls the inner op, and adds the elapsed time to its op's slot (and, for matmuls, to its shape's
// slot); on a device backend the clock is read after the queue drains (see tick). Slots are filled
// in first-call order, so a report lists ops in the order a step runs them. Memory functions and
// optimizer passes are the inner table's own, and so is set_precision (nothing to time).
//
// FLOP counts ("useful" work, as FLOP counters for training usually count it):
//   matmul_forward   2*N*IC*OC
//   matmul_backward  2*N*IC*OC for dweight, plus the same again when dinp is requested
//   matmul_gelu_forward / matmul_gelu_backward: as matmul_forward / matmul_backward (the GELU and its
//                    gradient are elementwise and not counted)
//   attention_forward   4*HD per causal (query, key) pair per head: q.k and p*v
//   attention_backward  8*HD per pair (twice the forward; recomputing the scores is not counted)
#include "shardlm/ops_profile.h"

#include <stdint.h>
#include <string.h>
#include <time.h>

#define MAX_OPS 32
#define MAX_SHAPES 64
#define SHAPE_NAME_LEN 96

static const sl_ops *g_inner;
static sl_ops g_table;

static sl_op_stat g_ops[MAX_OPS];
static int g_n_ops;

typedef struct {
    int backward, N, IC, OC, with_dinp, gelu;
} shape_key;
static sl_op_stat g_shapes[MAX_SHAPES];
static shape_key g_shape_keys[MAX_SHAPES];
static char g_shape_names[MAX_SHAPES][SHAPE_NAME_LEN];
static int g_n_shapes;

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

// The slot of op `name` (a string literal, compared by content), created on first use.
static sl_op_stat *op_slot(const char *name) {
    for (int i = 0; i < g_n_ops; i++)
        if (strcmp(g_ops[i].name, name) == 0) return &g_ops[i];
    if (g_n_ops == MAX_OPS) return NULL;
    sl_op_stat *s = &g_ops[g_n_ops++];
    memset(s, 0, sizeof *s);
    s->name = name;
    return s;
}

static void record(const char *name, double seconds, double flops) {
    sl_op_stat *s = op_slot(name);
    if (!s) return;
    s->seconds += seconds;
    s->calls++;
    s->flops += flops;
}

static void record_shape(int backward, int N, int IC, int OC, int with_dinp, int gelu, double seconds,
                         double flops) {
    shape_key k = {backward, N, IC, OC, with_dinp, gelu};
    int i = 0;
    for (; i < g_n_shapes; i++)
        if (memcmp(&g_shape_keys[i], &k, sizeof k) == 0) break;
    if (i == g_n_shapes) {
        if (g_n_shapes == MAX_SHAPES) return;
        g_n_shapes++;
        g_shape_keys[i] = k;
        snprintf(g_shape_names[i], SHAPE_NAME_LEN, "%s%s N=%d IC=%d OC=%d%s", gelu ? "matmul_gelu" : "matmul",
                 backward ? "_backward" : "_forward", N, IC, OC,
                 backward && !with_dinp ? " (no dinp)" : "");
        memset(&g_shapes[i], 0, sizeof g_shapes[i]);
        g_shapes[i].name = g_shape_names[i];
    }
    g_shapes[i].seconds += seconds;
    g_shapes[i].calls++;
    g_shapes[i].flops += flops;
}

// The clock after the inner backend's queued work has finished: a device backend's ops return at
// once, so each wrapper waits for its op (this serialises the device's queue: profile separately
// from timed runs).
static double tick(void) {
    if (g_inner->on_device) g_inner->synchronize();
    return now_seconds();
}

// ---- wrappers: one per op, same signature as the inner op ---------------------------------------

static void p_encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B, int T, int C) {
    double t0 = tick();
    g_inner->encoder_forward(out, inp, wte, wpe, B, T, C);
    record("encoder_forward", tick() - t0, 0);
}

static void p_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B, int T, int C) {
    double t0 = tick();
    g_inner->encoder_backward(dwte, dwpe, dout, inp, B, T, C);
    record("encoder_backward", tick() - t0, 0);
}

static void p_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N, int IC,
                             int OC) {
    double t0 = tick();
    g_inner->matmul_forward(out, inp, weight, bias, N, IC, OC);
    double dt = tick() - t0, fl = 2.0 * N * (double)IC * OC;
    record("matmul_forward", dt, fl);
    record_shape(0, N, IC, OC, 1, 0, dt, fl);
}

static void p_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                              const float *weight, int N, int IC, int OC) {
    double t0 = tick();
    g_inner->matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
    double dt = tick() - t0, fl = 2.0 * N * (double)IC * OC * (dinp ? 2 : 1);
    record("matmul_backward", dt, fl);
    record_shape(1, N, IC, OC, dinp != NULL, 0, dt, fl);
}

static void p_matmul_gelu_forward(float *out, float *pre, const float *inp, const float *weight, const float *bias,
                                  int N, int IC, int OC) {
    double t0 = tick();
    g_inner->matmul_gelu_forward(out, pre, inp, weight, bias, N, IC, OC);
    double dt = tick() - t0, fl = 2.0 * N * (double)IC * OC;
    record("matmul_gelu_forward", dt, fl);
    record_shape(0, N, IC, OC, 1, 1, dt, fl);
}

static void p_matmul_gelu_backward(float *dinp, float *dweight, float *dbias, float *dout, const float *pre,
                                   const float *inp, const float *weight, int N, int IC, int OC) {
    double t0 = tick();
    g_inner->matmul_gelu_backward(dinp, dweight, dbias, dout, pre, inp, weight, N, IC, OC);
    double dt = tick() - t0, fl = 2.0 * N * (double)IC * OC * (dinp ? 2 : 1);
    record("matmul_gelu_backward", dt, fl);
    record_shape(1, N, IC, OC, dinp != NULL, 1, dt, fl);
}

static void p_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b,
                                int N, int C, float eps) {
    double t0 = tick();
    g_inner->layernorm_forward(out, mean, rstd, inp, w, b, N, C, eps);
    record("layernorm_forward", tick() - t0, 0);
}

static void p_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                                 const float *w, const float *mean, const float *rstd, int N, int C) {
    double t0 = tick();
    g_inner->layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    record("layernorm_backward", tick() - t0, 0);
}

static void p_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps) {
    double t0 = tick();
    g_inner->rmsnorm_forward(out, rstd, inp, w, N, C, eps);
    record("rmsnorm_forward", tick() - t0, 0);
}

static void p_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                               const float *rstd, int N, int C) {
    double t0 = tick();
    g_inner->rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
    record("rmsnorm_backward", tick() - t0, 0);
}

static void p_residual_forward(float *out, const float *a, const float *b, size_t n) {
    double t0 = tick();
    g_inner->residual_forward(out, a, b, n);
    record("residual_forward", tick() - t0, 0);
}

static void p_residual_layernorm_forward(float *resid, float *out, float *mean, float *rstd, const float *a,
                                        const float *b, const float *w, const float *bias, int N, int C, float eps) {
    double t0 = tick();
    g_inner->residual_layernorm_forward(resid, out, mean, rstd, a, b, w, bias, N, C, eps);
    record("residual_layernorm_forward", tick() - t0, 0);
}

static void p_residual_rmsnorm_forward(float *resid, float *out, float *rstd, const float *a, const float *b,
                                      const float *w, int N, int C, float eps) {
    double t0 = tick();
    g_inner->residual_rmsnorm_forward(resid, out, rstd, a, b, w, N, C, eps);
    record("residual_rmsnorm_forward", tick() - t0, 0);
}

static void p_gelu_forward(float *out, const float *inp, size_t n) {
    double t0 = tick();
    g_inner->gelu_forward(out, inp, n);
    record("gelu_forward", tick() - t0, 0);
}

static void p_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
    double t0 = tick();
    g_inner->gelu_backward(dinp, inp, dout, n);
    record("gelu_backward", tick() - t0, 0);
}

static void p_swiglu_forward(float *out, const float *inp, int N, int I) {
    double t0 = tick();
    g_inner->swiglu_forward(out, inp, N, I);
    record("swiglu_forward", tick() - t0, 0);
}

static void p_swiglu_backward(float *dinp, const float *inp, const float *dout, int N, int I) {
    double t0 = tick();
    g_inner->swiglu_backward(dinp, inp, dout, N, I);
    record("swiglu_backward", tick() - t0, 0);
}

static void p_rope_forward(float *qkv, const float *cos, const float *sin, int B, int T, int NH, int NKV, int HD,
                           int pos0) {
    double t0 = tick();
    g_inner->rope_forward(qkv, cos, sin, B, T, NH, NKV, HD, pos0);
    record("rope_forward", tick() - t0, 0);
}

static void p_rope_backward(float *dqkv, const float *cos, const float *sin, int B, int T, int NH, int NKV, int HD) {
    double t0 = tick();
    g_inner->rope_backward(dqkv, cos, sin, B, T, NH, NKV, HD);
    record("rope_backward", tick() - t0, 0);
}

// Causal (query, key) pairs over all heads and batch rows (each query sees min(t + 1, window) keys).
static double causal_pairs(int B, int T, int NH, int window) {
    double w = window > 0 && window < T ? window : T;
    return (double)B * NH * (w * (w + 1) / 2.0 + ((double)T - w) * w);
}

static void p_attention_forward(float *out, float *lse, const float *qkv, int B, int T, int NH, int NKV, int HD,
                                int window) {
    double t0 = tick();
    g_inner->attention_forward(out, lse, qkv, B, T, NH, NKV, HD, window);
    record("attention_forward", tick() - t0, 4.0 * HD * causal_pairs(B, T, NH, window));
}

static void p_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse,
                                 int B, int T, int NH, int NKV, int HD, int window) {
    double t0 = tick();
    g_inner->attention_backward(dqkv, dout, qkv, out, lse, B, T, NH, NKV, HD, window);
    record("attention_backward", tick() - t0, 8.0 * HD * causal_pairs(B, T, NH, window));
}

static void p_attention_decode(float *out, const float *q, const float *k_cache, const float *v_cache, int n_ctx,
                               int NH, int NKV, int HD) {
    double t0 = tick();
    g_inner->attention_decode(out, q, k_cache, v_cache, n_ctx, NH, NKV, HD);
    record("attention_decode", tick() - t0, 4.0 * HD * (double)n_ctx * NH);
}

static double p_crossentropy_forward(float *lse, const float *logits, const int *targets, int N, int V, int Vp) {
    double t0 = tick();
    double r = g_inner->crossentropy_forward(lse, logits, targets, N, V, Vp);
    record("crossentropy_forward", tick() - t0, 0);
    return r;
}

static void p_crossentropy_backward(float *logits, const float *lse, const int *targets, int N, int V, int Vp,
                                    float dloss) {
    double t0 = tick();
    g_inner->crossentropy_backward(logits, lse, targets, N, V, Vp, dloss);
    record("crossentropy_backward", tick() - t0, 0);
}

// ---- public ---------------------------------------------------------------------------------------

void sl_ops_profile_reset(void) {
    g_n_ops = 0;
    g_n_shapes = 0;
}

#define WRAP(field) g_table.field = inner->field ? p_##field : NULL

const sl_ops *sl_ops_profile_wrap(const sl_ops *inner) {
    g_inner = inner;
    g_table = *inner;  // memory, optimizer passes and anything not wrapped go straight through
    g_table.name = "profile";
    WRAP(encoder_forward);
    WRAP(encoder_backward);
    WRAP(matmul_forward);
    WRAP(matmul_backward);
    WRAP(matmul_gelu_forward);
    WRAP(matmul_gelu_backward);
    WRAP(layernorm_forward);
    WRAP(layernorm_backward);
    WRAP(rmsnorm_forward);
    WRAP(rmsnorm_backward);
    WRAP(residual_forward);
    WRAP(residual_layernorm_forward);
    WRAP(residual_rmsnorm_forward);
    WRAP(gelu_forward);
    WRAP(gelu_backward);
    WRAP(swiglu_forward);
    WRAP(swiglu_backward);
    WRAP(rope_forward);
    WRAP(rope_backward);
    WRAP(attention_forward);
    WRAP(attention_backward);
    WRAP(attention_decode);
    WRAP(crossentropy_forward);
    WRAP(crossentropy_backward);
    sl_ops_profile_reset();
    return &g_table;
}

#undef WRAP

const sl_op_stat *sl_ops_profile_ops(int *n) {
    *n = g_n_ops;
    return g_ops;
}

const sl_op_stat *sl_ops_profile_matmul_shapes(int *n) {
    *n = g_n_shapes;
    return g_shapes;
}

double sl_ops_profile_total_seconds(void) {
    double s = 0;
    for (int i = 0; i < g_n_ops; i++) s += g_ops[i].seconds;
    return s;
}

static void report_rows(FILE *f, const sl_op_stat *rows, int n, int steps, double total) {
    for (int i = 0; i < n; i++) {
        const sl_op_stat *s = &rows[i];
        fprintf(f, "  %-52s %10.2f %8.1f %6.1f%%", s->name, 1e3 * s->seconds / steps, (double)s->calls / steps,
                total > 0 ? 100.0 * s->seconds / total : 0.0);
        if (s->flops > 0 && s->seconds > 0) fprintf(f, " %8.1f", s->flops / s->seconds / 1e9);
        fputc('\n', f);
    }
}

void sl_ops_profile_report(FILE *f, int steps) {
    if (steps < 1) steps = 1;
    double total = sl_ops_profile_total_seconds();
    fprintf(f, "  %-52s %10s %8s %7s %8s\n", "op", "ms/step", "calls", "share", "GFLOP/s");
    report_rows(f, g_ops, g_n_ops, steps, total);
    fprintf(f, "  %-52s %10.2f\n", "total in ops", 1e3 * total / steps);
    if (g_n_shapes > 0) {
        fprintf(f, "  matmul shapes:\n");
        report_rows(f, g_shapes, g_n_shapes, steps, total);
    }
}
