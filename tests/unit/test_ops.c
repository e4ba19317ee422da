// test_ops.c: every op's backward against central finite differences of its forward, computed in
// double precision (the reference ops), and every CPU op (float) against the double reference,
// forward and backward. Finite differences probe a random subset of each input's elements. The
// fused ops (GEMM + GELU, residual + norm) against the ops they fuse, bit for bit.
#include "test.h"

#include "ops/cpu/cpu_ops.h"
#include "ops/ref/ref_ops.h"
#include "shardlm/error.h"
#include "shardlm/ops.h"
#include "shardlm/rope.h"
#include "shardlm/ops_profile.h"
#include "shardlm/quant_ops.h"
#include "shardlm/precision.h"
#include "shardlm/rng.h"

static sl_rng rng;

static double *drand_vec(size_t n, double scale) {
    double *v = malloc(sizeof(double) * n);
    for (size_t i = 0; i < n; i++) v[i] = scale * sl_rng_normal(&rng);
    return v;
}
static double *dzeros(size_t n) { return calloc(n, sizeof(double)); }
static float *to_f(const double *d, size_t n) {
    float *f = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) f[i] = (float)d[i];
    return f;
}
static float *fzeros(size_t n) { return calloc(n, sizeof(float)); }
static double dotd(const double *a, const double *b, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

// max |got - want| / max(|want|) over n values: a relative error of the whole tensor.
static double rel_err_f(const float *got, const double *want, size_t n) {
    double num = 0.0, den = 1e-30;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (d > num) num = d;
        if (fabs(want[i]) > den) den = fabs(want[i]);
    }
    return num / den;
}

// A scalar function of one double buffer: returns L = sum(r * forward(x)).
typedef double (*loss_fn)(void *ctx);

// Checks analytic gradient `grad` of L w.r.t. `x` (n elements) by central differences on
// up to `probes` random elements. Returns the worst relative error.
static double fd_check(loss_fn f, void *ctx, double *x, const double *grad, size_t n, int probes) {
    double worst = 0.0, h = 1e-5;
    for (int p = 0; p < probes; p++) {
        size_t i = (size_t)sl_rng_below(&rng, n);
        double orig = x[i];
        x[i] = orig + h;
        double lp = f(ctx);
        x[i] = orig - h;
        double lm = f(ctx);
        x[i] = orig;
        double num = (lp - lm) / (2 * h);
        double err = fabs(num - grad[i]) / fmax(1e-3, fabs(num) + fabs(grad[i]));
        if (err > worst) worst = err;
    }
    return worst;
}

#define FD_TOL 1e-6
#define F32_TOL 2e-5

// ---------------------------------------------------------------- matmul
typedef struct { double *inp, *w, *b, *r, *out; int N, IC, OC; } mm_ctx;
static double mm_loss(void *v) {
    mm_ctx *c = v;
    ref_matmul_forward(c->out, c->inp, c->w, c->b, c->N, c->IC, c->OC);
    return dotd(c->out, c->r, (size_t)c->N * c->OC);
}

TEST(matmul_backward_matches_finite_differences_and_cpu) {
    int N = 7, IC = 13, OC = 11;
    mm_ctx c = {drand_vec((size_t)N * IC, 1), drand_vec((size_t)OC * IC, 1), drand_vec(OC, 1),
                drand_vec((size_t)N * OC, 1), dzeros((size_t)N * OC), N, IC, OC};
    double *dinp = dzeros((size_t)N * IC), *dw = dzeros((size_t)OC * IC), *db = dzeros(OC);
    ref_matmul_backward(dinp, dw, db, c.r, c.inp, c.w, N, IC, OC);
    CHECK(fd_check(mm_loss, &c, c.inp, dinp, (size_t)N * IC, 40) < FD_TOL);
    CHECK(fd_check(mm_loss, &c, c.w, dw, (size_t)OC * IC, 40) < FD_TOL);
    CHECK(fd_check(mm_loss, &c, c.b, db, OC, 11) < FD_TOL);
    mm_loss(&c);
    float *fi = to_f(c.inp, (size_t)N * IC), *fw = to_f(c.w, (size_t)OC * IC), *fb = to_f(c.b, OC);
    float *fr = to_f(c.r, (size_t)N * OC), *fo = fzeros((size_t)N * OC);
    float *fdi = fzeros((size_t)N * IC), *fdw = fzeros((size_t)OC * IC), *fdb = fzeros(OC);
    cpu_matmul_forward(ACT(fo), ACT(fi), ACT(fw), ACT(fb), N, IC, OC);
    cpu_matmul_backward(ACT(fdi), fdw, fdb, ACT(fr), ACT(fi), ACT(fw), N, IC, OC);
    CHECK(rel_err_f(fo, c.out, (size_t)N * OC) < F32_TOL);
    CHECK(rel_err_f(fdi, dinp, (size_t)N * IC) < F32_TOL);
    CHECK(rel_err_f(fdw, dw, (size_t)OC * IC) < F32_TOL);
    CHECK(rel_err_f(fdb, db, OC) < F32_TOL);
    // gradients accumulate: a second backward doubles dweight
    cpu_matmul_backward(ACT(fdi), fdw, fdb, ACT(fr), ACT(fi), ACT(fw), N, IC, OC);
    for (int i = 0; i < OC * IC; i++) dw[i] *= 2;
    CHECK(rel_err_f(fdw, dw, (size_t)OC * IC) < F32_TOL);
    free(c.inp); free(c.w); free(c.b); free(c.r); free(c.out); free(dinp); free(dw); free(db);
    free(fi); free(fw); free(fb); free(fr); free(fo); free(fdi); free(fdw); free(fdb);
}

// ---------------------------------------------------------------- layernorm / rmsnorm
typedef struct { double *inp, *w, *b, *r, *out, *mean, *rstd; int N, C, rms; } ln_ctx;
static double ln_loss(void *v) {
    ln_ctx *c = v;
    if (c->rms) ref_rmsnorm_forward(c->out, c->rstd, c->inp, c->w, c->N, c->C, 1e-5);
    else ref_layernorm_forward(c->out, c->mean, c->rstd, c->inp, c->w, c->b, c->N, c->C, 1e-5);
    return dotd(c->out, c->r, (size_t)c->N * c->C);
}

static void check_norm(int rms) {
    int N = 6, C = 37;
    size_t n = (size_t)N * C;
    ln_ctx c = {drand_vec(n, 2), drand_vec(C, 1), drand_vec(C, 1), drand_vec(n, 1), dzeros(n), dzeros(N), dzeros(N), N, C, rms};
    ln_loss(&c);
    double *dinp = dzeros(n), *dw = dzeros(C), *db = dzeros(C);
    if (rms) ref_rmsnorm_backward(dinp, dw, c.r, c.inp, c.w, c.rstd, N, C);
    else ref_layernorm_backward(dinp, dw, db, c.r, c.inp, c.w, c.mean, c.rstd, N, C);
    CHECK(fd_check(ln_loss, &c, c.inp, dinp, n, 60) < FD_TOL);
    CHECK(fd_check(ln_loss, &c, c.w, dw, C, 20) < FD_TOL);
    if (!rms) CHECK(fd_check(ln_loss, &c, c.b, db, C, 20) < FD_TOL);
    ln_loss(&c);
    float *fi = to_f(c.inp, n), *fw = to_f(c.w, C), *fb = to_f(c.b, C), *fr = to_f(c.r, n), *fo = fzeros(n);
    float *fm = fzeros(N), *fs = fzeros(N), *fdi = fzeros(n), *fdw = fzeros(C), *fdb = fzeros(C);
    if (rms) {
        cpu_rmsnorm_forward(ACT(fo), fs, ACT(fi), ACT(fw), N, C, 1e-5f);
        cpu_rmsnorm_backward(ACT(fdi), fdw, ACT(fr), ACT(fi), ACT(fw), fs, N, C);
    } else {
        cpu_layernorm_forward(ACT(fo), fm, fs, ACT(fi), ACT(fw), ACT(fb), N, C, 1e-5f);
        cpu_layernorm_backward(ACT(fdi), fdw, fdb, ACT(fr), ACT(fi), ACT(fw), fm, fs, N, C);
        CHECK(rel_err_f(fdb, db, C) < F32_TOL);
    }
    CHECK(rel_err_f(fo, c.out, n) < F32_TOL);
    CHECK(rel_err_f(fdi, dinp, n) < F32_TOL);
    CHECK(rel_err_f(fdw, dw, C) < F32_TOL);
    free(c.inp); free(c.w); free(c.b); free(c.r); free(c.out); free(c.mean); free(c.rstd); free(dinp); free(dw); free(db);
    free(fi); free(fw); free(fb); free(fr); free(fo); free(fm); free(fs); free(fdi); free(fdw); free(fdb);
}

TEST(layernorm_backward_matches_finite_differences_and_cpu) { check_norm(0); }
TEST(rmsnorm_backward_matches_finite_differences_and_cpu) { check_norm(1); }

// ---------------------------------------------------------------- gelu / swiglu
typedef struct { double *inp, *r, *out; int N, I, swiglu; } act_ctx;
static double act_loss(void *v) {
    act_ctx *c = v;
    if (c->swiglu) ref_swiglu_forward(c->out, c->inp, c->N, c->I);
    else ref_gelu_forward(c->out, c->inp, (size_t)c->N * c->I);
    return dotd(c->out, c->r, (size_t)c->N * c->I);
}

static void check_activation(int swiglu) {
    int N = 5, I = 29;
    size_t nin = (size_t)N * I * (swiglu ? 2 : 1), nout = (size_t)N * I;
    act_ctx c = {drand_vec(nin, 3), drand_vec(nout, 1), dzeros(nout), N, I, swiglu};
    act_loss(&c);
    double *dinp = dzeros(nin);
    if (swiglu) ref_swiglu_backward(dinp, c.inp, c.r, N, I);
    else ref_gelu_backward(dinp, c.inp, c.r, nout);
    CHECK(fd_check(act_loss, &c, c.inp, dinp, nin, 60) < FD_TOL);
    float *fi = to_f(c.inp, nin), *fr = to_f(c.r, nout), *fo = fzeros(nout), *fdi = fzeros(nin);
    if (swiglu) {
        cpu_swiglu_forward(ACT(fo), ACT(fi), N, I);
        cpu_swiglu_backward(ACT(fdi), ACT(fi), ACT(fr), N, I);
    } else {
        cpu_gelu_forward(ACT(fo), ACT(fi), nout);
        cpu_gelu_backward(ACT(fdi), ACT(fi), ACT(fr), nout);
    }
    CHECK(rel_err_f(fo, c.out, nout) < F32_TOL);
    CHECK(rel_err_f(fdi, dinp, nin) < F32_TOL);
    free(c.inp); free(c.r); free(c.out); free(dinp); free(fi); free(fr); free(fo); free(fdi);
}

// ---------------------------------------------------------------- LoRA's column slices, dropout
// add_columns and take_columns are each other's transpose (the one is the other's backward): with
// L = sum(r * add(x)) the gradient of x is take(r). Both against the reference; dropout keeps about
// 1 - p of the elements, scales them by 1 / (1 - p), and its backward applies the same mask.
TEST(lora_column_slices_and_dropout_match_reference) {
    int N = 7, W = 5, ld = 13, col0 = 6;
    double scale = 0.75;
    double *x = drand_vec((size_t)N * W, 1), *y = drand_vec((size_t)N * ld, 1), *r = drand_vec((size_t)N * ld, 1);
    double *want = malloc(sizeof(double) * N * ld), *dx = dzeros((size_t)N * W);
    memcpy(want, y, sizeof(double) * N * ld);
    ref_add_columns(want, x, scale, N, W, ld, col0);
    ref_take_columns(dx, r, scale, N, W, ld, col0);
    double lin = dotd(want, r, (size_t)N * ld) - dotd(y, r, (size_t)N * ld);  // L(x) - L(0): linear in x
    CHECK(fabs(lin - dotd(x, dx, (size_t)N * W)) < 1e-12 * (1 + fabs(lin)));
    float *fx = to_f(x, (size_t)N * W), *fy = to_f(y, (size_t)N * ld), *fr = to_f(r, (size_t)N * ld);
    float *fdx = fzeros((size_t)N * W);
    cpu_add_columns(ACT(fy), ACT(fx), (float)scale, N, W, ld, col0);
    cpu_take_columns(ACT(fdx), ACT(fr), (float)scale, N, W, ld, col0);
    CHECK(rel_err_f(fy, want, (size_t)N * ld) < F32_TOL);
    CHECK(rel_err_f(fdx, dx, (size_t)N * W) < F32_TOL);
    size_t n = 20000;
    double *d = drand_vec(n, 1), *dref = dzeros(n);
    float *fd = to_f(d, n), *fo = fzeros(n), *fb = fzeros(n);
    ref_dropout(dref, d, n, 0.25, 99);
    cpu_dropout_forward(ACT(fo), ACT(fd), n, 0.25f, 99);
    cpu_dropout_backward(ACT(fb), ACT(fd), n, 0.25f, 99);
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) kept += fo[i] != 0.0f;
    CHECK_MSG(fabs((double)kept / n - 0.75) < 0.02, "dropout kept %zu of %zu", kept, n);
    CHECK(rel_err_f(fo, dref, n) < F32_TOL && memcmp(fo, fb, n * sizeof(float)) == 0);
    cpu_dropout_forward(ACT(fb), ACT(fd), n, 0.25f, 100);  // another seed, another mask
    CHECK(memcmp(fo, fb, n * sizeof(float)) != 0);
    free(x); free(y); free(r); free(want); free(dx); free(fx); free(fy); free(fr); free(fdx);
    free(d); free(dref); free(fd); free(fo); free(fb);
}

TEST(gelu_backward_matches_finite_differences_and_cpu) { check_activation(0); }
TEST(swiglu_backward_matches_finite_differences_and_cpu) { check_activation(1); }

// ---------------------------------------------------------------- rope
typedef struct { double *inp, *work, *r, *cos, *sin; int B, T, NH, NKV, HD; size_t n; } rope_ctx;
static double rope_loss(void *v) {
    rope_ctx *c = v;
    memcpy(c->work, c->inp, sizeof(double) * c->n);
    ref_rope_forward(c->work, c->cos, c->sin, c->B, c->T, c->NH, c->NKV, c->HD, 0);
    return dotd(c->work, c->r, c->n);
}

TEST(rope_backward_matches_finite_differences_and_cpu) {
    int B = 2, T = 9, NH = 4, NKV = 2, HD = 8, half = HD / 2;
    size_t n = (size_t)B * T * (NH + 2 * NKV) * HD;
    float *fcos = malloc(sizeof(float) * T * half), *fsin = malloc(sizeof(float) * T * half);
    sl_rope_tables(fcos, fsin, T, HD, 10000.0f);
    double *dcos = malloc(sizeof(double) * T * half), *dsin = malloc(sizeof(double) * T * half);
    for (int i = 0; i < T * half; i++) { dcos[i] = fcos[i]; dsin[i] = fsin[i]; }
    rope_ctx c = {drand_vec(n, 1), dzeros(n), drand_vec(n, 1), dcos, dsin, B, T, NH, NKV, HD, n};
    double *dinp = malloc(sizeof(double) * n);
    memcpy(dinp, c.r, sizeof(double) * n);
    ref_rope_backward(dinp, dcos, dsin, B, T, NH, NKV, HD);
    CHECK(fd_check(rope_loss, &c, c.inp, dinp, n, 80) < FD_TOL);
    rope_loss(&c);
    float *fx = to_f(c.inp, n), *fd = to_f(c.r, n);
    cpu_rope_forward(ACT(fx), fcos, fsin, B, T, NH, NKV, HD, 0);
    cpu_rope_backward(ACT(fd), fcos, fsin, B, T, NH, NKV, HD);
    CHECK(rel_err_f(fx, c.work, n) < F32_TOL);
    CHECK(rel_err_f(fd, dinp, n) < F32_TOL);
    // v heads are untouched
    CHECK(fx[(NH + NKV) * HD] == (float)c.inp[(NH + NKV) * HD]);
    // the tables match transformers' float32 formula at a known point: t=1, i=1 -> angle 10000^(-2/8)
    CHECK_CLOSE(fcos[half + 1], cos(pow(10000.0, -0.25)), 1e-6);
    free(fcos); free(fsin); free(dcos); free(dsin); free(c.inp); free(c.work); free(c.r); free(dinp); free(fx); free(fd);
}

// ---------------------------------------------------------------- attention
typedef struct { double *qkv, *r, *out; int B, T, NH, NKV, HD, window; } att_ctx;
static double att_loss(void *v) {
    att_ctx *c = v;
    ref_attention_forward(c->out, c->qkv, c->B, c->T, c->NH, c->NKV, c->HD, c->window);
    return dotd(c->out, c->r, (size_t)c->B * c->T * c->NH * c->HD);
}

static void check_attention(int B, int T, int NH, int NKV, int HD, int window, int probes) {
    size_t nq = (size_t)B * T * (NH + 2 * NKV) * HD, no = (size_t)B * T * NH * HD;
    att_ctx c = {drand_vec(nq, 1), drand_vec(no, 1), dzeros(no), B, T, NH, NKV, HD, window};
    att_loss(&c);
    double *dqkv = dzeros(nq);
    ref_attention_backward(dqkv, c.r, c.qkv, B, T, NH, NKV, HD, window);
    if (probes) CHECK(fd_check(att_loss, &c, c.qkv, dqkv, nq, probes) < FD_TOL);
    float *fq = to_f(c.qkv, nq), *fr = to_f(c.r, no), *fo = fzeros(no), *flse = fzeros((size_t)B * NH * T);
    float *fdq = malloc(sizeof(float) * nq);
    for (size_t i = 0; i < nq; i++) fdq[i] = 1e9f;  // backward must overwrite every element
    cpu_attention_forward(ACT(fo), flse, ACT(fq), B, T, NH, NKV, HD, window);
    cpu_attention_backward(ACT(fdq), ACT(fr), ACT(fq), ACT(fo), flse, B, T, NH, NKV, HD, window);
    CHECK_MSG(rel_err_f(fo, c.out, no) < F32_TOL, "forward rel err %g", rel_err_f(fo, c.out, no));
    CHECK_MSG(rel_err_f(fdq, dqkv, nq) < F32_TOL, "backward rel err %g", rel_err_f(fdq, dqkv, nq));
    // decode: the last position of batch 0 against a cache of its keys/values (the window's part of it)
    int W = (NH + 2 * NKV) * HD, first = window > 0 && T > window ? T - window : 0;
    float *kc = malloc(sizeof(float) * T * NKV * HD), *vc = malloc(sizeof(float) * T * NKV * HD);
    for (int t = 0; t < T; t++) {
        memcpy(kc + (size_t)t * NKV * HD, fq + (size_t)t * W + NH * HD, sizeof(float) * NKV * HD);
        memcpy(vc + (size_t)t * NKV * HD, fq + (size_t)t * W + (NH + NKV) * HD, sizeof(float) * NKV * HD);
    }
    float *dec = fzeros((size_t)NH * HD);
    cpu_attention_decode(ACT(dec), ACT(fq + (size_t)(T - 1) * W), ACT(kc + (size_t)first * NKV * HD), ACT(vc + (size_t)first * NKV * HD),
                         T - first, NH, NKV, HD);
    CHECK(rel_err_f(dec, c.out + (size_t)(T - 1) * NH * HD, (size_t)NH * HD) < F32_TOL);
    free(c.qkv); free(c.r); free(c.out); free(dqkv); free(fq); free(fr); free(fo); free(flse); free(fdq);
    free(kc); free(vc); free(dec);
}

TEST(attention_backward_matches_finite_differences_and_cpu) { check_attention(2, 11, 2, 2, 4, 0, 120); }
TEST(attention_gqa_matches_finite_differences_and_cpu) { check_attention(2, 9, 4, 2, 4, 0, 120); }
// longer than one key tile (64): the online softmax crosses tile boundaries
TEST(attention_multi_tile_matches_reference) { check_attention(1, 150, 4, 1, 8, 0, 0); }
// Mistral's sliding window: short windows inside one tile, a window crossing tile boundaries (rows whose
// whole first key tile is outside their window), and a window as long as the sequence (plain causal)
TEST(attention_sliding_window_matches_finite_differences) { check_attention(2, 13, 4, 2, 4, 5, 120); }
// decode's vector path (head sizes that are multiples of 16, compiled apart for 64 and 128) and its
// scalar path, over caches of 1, 7, 33 and 1023 positions (blocks of 16 positions, partial last blocks)
TEST(attention_decode_head_sizes_match_reference) {
    check_attention(1, 1, 2, 1, 64, 0, 0);
    check_attention(1, 7, 2, 2, 16, 0, 0);
    check_attention(1, 33, 4, 2, 64, 0, 0);
    check_attention(1, 33, 2, 1, 128, 0, 0);
    check_attention(1, 33, 2, 1, 48, 0, 0);
    check_attention(1, 33, 2, 1, 24, 0, 0);
    check_attention(1, 1023, 2, 1, 64, 0, 0);
    check_attention(1, 40, 2, 1, 32, 17, 0);
}
// a cache long enough for the heads to run in parallel: the same bits at 1 and 2 threads
TEST(attention_decode_does_not_depend_on_thread_count) {
    int n_ctx = 300, NH = 4, NKV = 2, HD = 64;
    size_t nkv = (size_t)n_ctx * NKV * HD, no = (size_t)NH * HD;
    double *dq = drand_vec(no, 5), *dk = drand_vec(nkv, 6), *dv = drand_vec(nkv, 7);
    float *q = to_f(dq, no), *k = to_f(dk, nkv), *v = to_f(dv, nkv), *o[2];
    for (int t = 0; t < 2; t++) {
        sl_ops_cpu_set_threads(t + 1);
        o[t] = fzeros(no);
        cpu_attention_decode(ACT(o[t]), ACT(q), ACT(k), ACT(v), n_ctx, NH, NKV, HD);
    }
    sl_ops_cpu_set_threads(2);
    CHECK(!memcmp(o[0], o[1], sizeof(float) * no));
    free(dq); free(dk); free(dv); free(q); free(k); free(v); free(o[0]); free(o[1]);
}
TEST(attention_sliding_window_multi_tile_matches_reference) {
    check_attention(1, 200, 4, 1, 8, 7, 0);
    check_attention(1, 150, 2, 2, 8, 70, 0);
    check_attention(1, 150, 2, 1, 8, 64, 0);
    check_attention(1, 40, 2, 1, 8, 40, 0);
    // T < 512: 64-query blocks against 256-key tiles (att_ktile), whole and with windows across them
    check_attention(1, 300, 2, 1, 8, 0, 0);
    check_attention(1, 300, 2, 2, 8, 70, 0);
    check_attention(1, 450, 2, 1, 8, 256, 0);
    // T >= 512: tiles of 128 (att_tile), a window across them and one of exactly a tile
    check_attention(1, 600, 2, 1, 8, 200, 0);
    check_attention(1, 530, 2, 2, 8, 128, 0);
}

// ---------------------------------------------------------------- encoder
typedef struct { double *wte, *wpe, *r, *out; int *inp; int B, T, C; } enc_ctx;
static double enc_loss(void *v) {
    enc_ctx *c = v;
    ref_encoder_forward(c->out, c->inp, c->wte, c->wpe, c->B, c->T, c->C);
    return dotd(c->out, c->r, (size_t)c->B * c->T * c->C);
}

TEST(encoder_backward_matches_finite_differences_and_cpu) {
    int B = 2, T = 5, C = 6, V = 7;
    int inp[10] = {1, 3, 3, 0, 6, 3, 1, 1, 2, 5};  // repeated tokens accumulate
    enc_ctx c = {drand_vec((size_t)V * C, 1), drand_vec((size_t)T * C, 1), drand_vec((size_t)B * T * C, 1),
                 dzeros((size_t)B * T * C), inp, B, T, C};
    double *dwte = dzeros((size_t)V * C), *dwpe = dzeros((size_t)T * C);
    ref_encoder_backward(dwte, dwpe, c.r, inp, B, T, C);
    CHECK(fd_check(enc_loss, &c, c.wte, dwte, (size_t)V * C, 40) < FD_TOL);
    CHECK(fd_check(enc_loss, &c, c.wpe, dwpe, (size_t)T * C, 30) < FD_TOL);
    enc_loss(&c);
    float *fte = to_f(c.wte, (size_t)V * C), *fpe = to_f(c.wpe, (size_t)T * C), *fr = to_f(c.r, (size_t)B * T * C);
    float *fo = fzeros((size_t)B * T * C), *fdte = fzeros((size_t)V * C), *fdpe = fzeros((size_t)T * C);
    cpu_encoder_forward(ACT(fo), inp, ACT(fte), ACT(fpe), B, T, C);
    cpu_encoder_backward(fdte, fdpe, ACT(fr), inp, B, T, C);
    CHECK(rel_err_f(fo, c.out, (size_t)B * T * C) < F32_TOL);
    CHECK(rel_err_f(fdte, dwte, (size_t)V * C) < F32_TOL);
    CHECK(rel_err_f(fdpe, dwpe, (size_t)T * C) < F32_TOL);
    free(c.wte); free(c.wpe); free(c.r); free(c.out); free(dwte); free(dwpe);
    free(fte); free(fpe); free(fr); free(fo); free(fdte); free(fdpe);
}

// ---------------------------------------------------------------- cross-entropy
typedef struct { double *logits; int *targets; int N, V, Vp; } ce_ctx;
static double ce_loss(void *v) {
    ce_ctx *c = v;
    return ref_crossentropy(NULL, c->logits, c->targets, c->N, c->V, c->Vp);
}

TEST(crossentropy_backward_matches_finite_differences_and_cpu) {
    int N = 6, V = 19, Vp = 24;
    int targets[6] = {3, 18, -1, 0, 7, 7};  // -1 is ignored
    ce_ctx c = {drand_vec((size_t)N * Vp, 3), targets, N, V, Vp};
    double *dl = dzeros((size_t)N * Vp);
    double loss = ref_crossentropy(dl, c.logits, targets, N, V, Vp);
    CHECK(fd_check(ce_loss, &c, c.logits, dl, (size_t)N * Vp, 80) < FD_TOL);
    float *fl = to_f(c.logits, (size_t)N * Vp), *fused = to_f(c.logits, (size_t)N * Vp), lse[6], lse_fused[6];
    double total = cpu_crossentropy_forward(lse, ACT(fl), targets, N, V, Vp);
    CHECK_CLOSE(total / 5.0, loss, 1e-6);
    cpu_crossentropy_backward(ACT(fl), lse, targets, N, V, Vp, 1.0f / 5.0f);
    CHECK(rel_err_f(fl, dl, (size_t)N * Vp) < F32_TOL);
    // the fused op: forward's loss and lse, backward's gradient, bit for bit
    CHECK(cpu_crossentropy_fused(lse_fused, ACT(fused), targets, N, V, Vp, 1.0f / 5.0f) == total);
    CHECK(!memcmp(lse_fused, lse, sizeof lse) && !memcmp(fused, fl, sizeof(float) * (size_t)N * Vp));
    free(c.logits); free(dl); free(fl); free(fused);
}

TEST(thread_count_does_not_change_results) {
    // attention and layernorm backward with 1 and 2 threads give identical bits; the sizes are large
    // enough that both ops really run in parallel (above SL_PAR_MIN_WORK)
    int B = 2, T = 200, NH = 4, NKV = 2, HD = 8, N = 256, C = 256;
    size_t nq = (size_t)B * T * (NH + 2 * NKV) * HD, no = (size_t)B * T * NH * HD, nc = (size_t)N * C;
    double *dq = drand_vec(nq, 1), *dr = drand_vec(no, 1), *dx = drand_vec(nc, 1), *dy = drand_vec(nc, 1);
    double *dw = drand_vec(C, 1), *db = drand_vec(C, 1);
    float *q = to_f(dq, nq), *r = to_f(dr, no), *x = to_f(dx, nc), *y = to_f(dy, nc), *w = to_f(dw, C), *b = to_f(db, C);
    float *o[2], *lse[2], *g[2], *ln[2], *mean[2], *rstd[2], *dlx[2], *dlw[2], *dlb[2];
    for (int k = 0; k < 2; k++) {
        sl_ops_cpu_set_threads(k + 1);
        o[k] = fzeros(no); lse[k] = fzeros((size_t)B * NH * T); g[k] = fzeros(nq);
        cpu_attention_forward(ACT(o[k]), lse[k], ACT(q), B, T, NH, NKV, HD, 0);
        cpu_attention_backward(ACT(g[k]), ACT(r), ACT(q), ACT(o[k]), lse[k], B, T, NH, NKV, HD, 0);
        ln[k] = fzeros(nc); mean[k] = fzeros(N); rstd[k] = fzeros(N); dlx[k] = fzeros(nc); dlw[k] = fzeros(C); dlb[k] = fzeros(C);
        cpu_layernorm_forward(ACT(ln[k]), mean[k], rstd[k], ACT(x), ACT(w), ACT(b), N, C, 1e-5f);
        cpu_layernorm_backward(ACT(dlx[k]), dlw[k], dlb[k], ACT(y), ACT(x), ACT(w), mean[k], rstd[k], N, C);
    }
    sl_ops_cpu_set_threads(2);
    CHECK(memcmp(o[0], o[1], sizeof(float) * no) == 0);
    CHECK(memcmp(g[0], g[1], sizeof(float) * nq) == 0);
    CHECK(memcmp(ln[0], ln[1], sizeof(float) * nc) == 0);
    CHECK(memcmp(dlx[0], dlx[1], sizeof(float) * nc) == 0);
    CHECK(memcmp(dlw[0], dlw[1], sizeof(float) * C) == 0 && memcmp(dlb[0], dlb[1], sizeof(float) * C) == 0);
    for (int k = 0; k < 2; k++) {
        free(o[k]); free(lse[k]); free(g[k]); free(ln[k]); free(mean[k]); free(rstd[k]); free(dlx[k]); free(dlw[k]); free(dlb[k]);
    }
    free(dq); free(dr); free(dx); free(dy); free(dw); free(db); free(q); free(r); free(x); free(y); free(w); free(b);
}

// ---------------------------------------------------------------- fused ops == the ops they fuse
// The CPU's fused ops (through the table, as the model calls them) give exactly the bits of the
// separate ops run one after another.
static int same_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, sizeof(float) * n) == 0; }
static float *fcopy(const float *x, size_t n) {
    float *y = malloc(sizeof(float) * n);
    memcpy(y, x, sizeof(float) * n);
    return y;
}
static float *frand_f(size_t n, double scale) {
    double *d = drand_vec(n, scale);
    float *f = to_f(d, n);
    free(d);
    return f;
}

static void check_matmul_gelu(const sl_ops *ops, int N, int IC, int OC, int with_bias) {
    size_t ni = (size_t)N * IC, nw = (size_t)OC * IC, no = (size_t)N * OC;
    float *inp = frand_f(ni, 1), *w = frand_f(nw, 0.05), *b = with_bias ? frand_f(OC, 0.1) : NULL;
    float *dout = frand_f(no, 1);
    // separate: matmul, gelu; gelu backward, matmul backward
    float *pre0 = fzeros(no), *out0 = fzeros(no), *dpre0 = fzeros(no);
    float *dinp0 = fzeros(ni), *dw0 = frand_f(nw, 1), *db0 = with_bias ? frand_f(OC, 1) : NULL;
    cpu_matmul_forward(ACT(pre0), ACT(inp), ACT(w), ACT(b), N, IC, OC);
    cpu_gelu_forward(ACT(out0), ACT(pre0), no);
    cpu_gelu_backward(ACT(dpre0), ACT(pre0), ACT(dout), no);
    float *dw1 = fcopy(dw0, nw), *db1 = with_bias ? fcopy(db0, OC) : NULL, *dw_nodinp = fcopy(dw0, nw);
    cpu_matmul_backward(ACT(dinp0), dw0, db0, ACT(dpre0), ACT(inp), ACT(w), N, IC, OC);
    // fused, through the table
    float *pre1 = fzeros(no), *out1 = fzeros(no), *dinp1 = fzeros(ni), *d1 = fcopy(dout, no);
    ops->matmul_gelu_forward(ACT(out1), ACT(pre1), ACT(inp), ACT(w), ACT(b), N, IC, OC);
    ops->matmul_gelu_backward(ACT(dinp1), dw1, db1, ACT(d1), ACT(pre1), ACT(inp), ACT(w), N, IC, OC);
    CHECK_MSG(same_bits(pre1, pre0, no) && same_bits(out1, out0, no), "%s forward N=%d IC=%d OC=%d bias=%d", ops->name,
              N, IC, OC, with_bias);
    CHECK_MSG(same_bits(d1, dpre0, no), "%s: dout is not overwritten with the pre-GELU gradient", ops->name);
    CHECK_MSG(same_bits(dinp1, dinp0, ni) && same_bits(dw1, dw0, nw), "%s backward N=%d IC=%d OC=%d", ops->name, N, IC,
              OC);
    if (with_bias) CHECK_MSG(same_bits(db1, db0, OC), "%s dbias N=%d IC=%d OC=%d", ops->name, N, IC, OC);
    // without dinp: the parameter gradients alone, and accumulated (+=) on top of what was there
    memcpy(d1, dout, sizeof(float) * no);
    float *dw_ref = fcopy(dw_nodinp, nw);
    cpu_matmul_backward(NULL, dw_ref, NULL, ACT(dpre0), ACT(inp), ACT(w), N, IC, OC);
    ops->matmul_gelu_backward(NULL, dw_nodinp, NULL, ACT(d1), ACT(pre1), ACT(inp), ACT(w), N, IC, OC);
    CHECK(same_bits(dw_nodinp, dw_ref, nw) && same_bits(d1, dpre0, no));
    free(inp); free(w); free(b); free(dout); free(pre0); free(out0); free(dpre0); free(dinp0); free(dw0); free(db0);
    free(dw1); free(db1); free(dw_nodinp); free(pre1); free(out1); free(dinp1); free(d1); free(dw_ref);
}

TEST(matmul_gelu_equals_matmul_then_gelu_bit_for_bit) {
    const sl_ops *prof = sl_ops_profile_wrap(&sl_ops_cpu);  // the profiling table forwards the same op
    for (int k = 0; k < 2; k++) {
        const sl_ops *ops = k ? prof : &sl_ops_cpu;
        check_matmul_gelu(ops, 7, 13, 11, 1);     // odd shapes
        check_matmul_gelu(ops, 7, 13, 11, 0);
        check_matmul_gelu(ops, 64, 768, 3072, 1);  // GPT-2 124M's c_fc (threads in play)
        check_matmul_gelu(ops, 64, 768, 3072, 0);
    }
    int n = 0, found = 0;
    const sl_op_stat *st = sl_ops_profile_ops(&n);
    for (int i = 0; i < n; i++) found += !strcmp(st[i].name, "matmul_gelu_forward") && st[i].flops > 0;
    CHECK_MSG(found == 1, "the profile table did not count matmul_gelu_forward's FLOPs");
}

// matmul_backward_gelu: the c_proj backward whose input was gelu(pre); dinp is d(pre).
static void check_matmul_backward_gelu(const sl_ops *ops, int N, int IC, int OC, int with_bias, int with_dinp) {
    size_t ni = (size_t)N * IC, nw = (size_t)OC * IC, no = (size_t)N * OC;
    float *pre = frand_f(ni, 2), *inp = fzeros(ni), *w = frand_f(nw, 0.05), *dout = frand_f(no, 1);
    cpu_gelu_forward(ACT(inp), ACT(pre), ni);
    // separate: matmul_backward, then gelu_backward over dinp
    float *dinp0 = fzeros(ni), *dw0 = frand_f(nw, 1), *db0 = with_bias ? frand_f(OC, 1) : NULL;
    float *dw1 = fcopy(dw0, nw), *db1 = with_bias ? fcopy(db0, OC) : NULL, *dinp1 = frand_f(ni, 1);
    cpu_matmul_backward(with_dinp ? ACT(dinp0) : NULL, dw0, db0, ACT(dout), ACT(inp), ACT(w), N, IC, OC);
    if (with_dinp) cpu_gelu_backward(ACT(dinp0), ACT(pre), ACT(dinp0), ni);
    ops->matmul_backward_gelu(with_dinp ? ACT(dinp1) : NULL, dw1, db1, ACT(dout), ACT(inp), ACT(w), ACT(pre), N, IC,
                              OC);
    if (with_dinp) CHECK_MSG(same_bits(dinp1, dinp0, ni), "%s dinp N=%d IC=%d OC=%d", ops->name, N, IC, OC);
    CHECK_MSG(same_bits(dw1, dw0, nw), "%s dweight N=%d IC=%d OC=%d", ops->name, N, IC, OC);
    if (with_bias) CHECK_MSG(same_bits(db1, db0, OC), "%s dbias N=%d IC=%d OC=%d", ops->name, N, IC, OC);
    // d(pre) against the double-precision chain rule on a few elements
    for (size_t i = 0; with_dinp && i < ni; i += ni / 7 + 1) {
        size_t n = i / IC, c = i % IC;
        double g = 0.0;
        for (int o = 0; o < OC; o++) g += (double)dout[n * OC + o] * w[(size_t)o * IC + c];
        double x = pre[i], u = 0.7978845608028654 * (x + 0.044715 * x * x * x), th = tanh(u);
        double d = 0.5 * (1 + th) + 0.5 * x * (1 - th * th) * 0.7978845608028654 * (1 + 3 * 0.044715 * x * x);
        CHECK_MSG(fabs(dinp1[i] - g * d) <= 1e-4 * (1 + fabs(g * d)), "dinp[%zu] %g, expected %g", i, dinp1[i], g * d);
    }
    free(pre); free(inp); free(w); free(dout); free(dinp0); free(dw0); free(db0); free(dw1); free(db1); free(dinp1);
}

TEST(matmul_backward_gelu_equals_matmul_backward_then_gelu_backward) {
    const sl_ops *tables[] = {&sl_ops_cpu, sl_ops_profile_wrap(&sl_ops_cpu), &sl_ops_cpu_quant};
    for (int k = 0; k < 3; k++) {
        check_matmul_backward_gelu(tables[k], 7, 13, 11, 1, 1);    // odd shapes
        check_matmul_backward_gelu(tables[k], 7, 13, 11, 0, 0);
        check_matmul_backward_gelu(tables[k], 64, 3072, 768, 1, 1);  // GPT-2 124M's c_proj (threads in play)
    }
    int n = 0, found = 0;
    const sl_op_stat *sh = sl_ops_profile_matmul_shapes(&n);
    for (int i = 0; i < n; i++) found += !strcmp(sh[i].name, "matmul_backward_gelu N=64 IC=3072 OC=768");
    CHECK_MSG(found == 1, "the profile table did not name matmul_backward_gelu's shape");
}

static void check_residual_norm(int rms, int N, int C, int in_place) {
    size_t n = (size_t)N * C;
    float *a = frand_f(n, 1), *b = frand_f(n, 1), *w = frand_f(C, 1), *bias = frand_f(C, 0.1);
    for (size_t i = 0; i < n; i++) a[i] += 0.5f;  // a non-zero mean
    // separate: residual_forward then the norm
    float *r0 = fzeros(n), *o0 = fzeros(n), *m0 = fzeros(N), *s0 = fzeros(N);
    cpu_residual_forward(ACT(r0), ACT(a), ACT(b), n);
    if (rms) cpu_rmsnorm_forward(ACT(o0), s0, ACT(r0), ACT(w), N, C, 1e-6f);
    else cpu_layernorm_forward(ACT(o0), m0, s0, ACT(r0), ACT(w), ACT(bias), N, C, 1e-5f);
    // fused, in place (resid = a, as the model calls it) or into its own buffer
    float *ac = fcopy(a, n), *r1 = in_place ? ac : fzeros(n), *o1 = fzeros(n), *m1 = fzeros(N), *s1 = fzeros(N);
    if (rms) sl_ops_cpu.residual_rmsnorm_forward(ACT(r1), ACT(o1), s1, ACT(ac), ACT(b), ACT(w), N, C, 1e-6f);
    else sl_ops_cpu.residual_layernorm_forward(ACT(r1), ACT(o1), m1, s1, ACT(ac), ACT(b), ACT(w), ACT(bias), N, C, 1e-5f);
    CHECK_MSG(same_bits(r1, r0, n) && same_bits(o1, o0, n) && same_bits(s1, s0, N) && same_bits(m1, m0, N),
              "%s N=%d C=%d in_place=%d", rms ? "rmsnorm" : "layernorm", N, C, in_place);
    free(a); free(b); free(w); free(bias); free(r0); free(o0); free(m0); free(s0);
    free(ac); free(o1); free(m1); free(s1);
    if (!in_place) free(r1);
}

TEST(residual_norm_equals_residual_then_norm_bit_for_bit) {
    for (int rms = 0; rms < 2; rms++)
        for (int in_place = 0; in_place < 2; in_place++) {
            check_residual_norm(rms, 6, 37, in_place);
            check_residual_norm(rms, 256, 768, in_place);  // GPT-2 width, above the parallel threshold
        }
    // and for one thread and two (rows split differently between threads)
    for (int t = 1; t <= 2; t++) {
        sl_ops_cpu_set_threads(t);
        check_residual_norm(0, 200, 256, 1);
        check_residual_norm(1, 200, 256, 1);
    }
    sl_ops_cpu_set_threads(2);
}

TEST(cpu_set_precision_changes_nothing) {
    int N = 9, IC = 17, OC = 12;
    float *inp = frand_f((size_t)N * IC, 1), *w = frand_f((size_t)OC * IC, 1), *o0 = fzeros((size_t)N * OC),
          *o1 = fzeros((size_t)N * OC);
    CHECK(sl_ops_cpu.set_precision != NULL);
    cpu_matmul_forward(ACT(o0), ACT(inp), ACT(w), NULL, N, IC, OC);
    sl_ops_cpu.set_precision(SL_PRECISION_BF16);
    sl_ops_cpu.matmul_forward(ACT(o1), ACT(inp), ACT(w), NULL, N, IC, OC);
    sl_ops_cpu.set_precision(SL_PRECISION_FP32);
    CHECK(same_bits(o0, o1, (size_t)N * OC));
    free(inp); free(w); free(o0); free(o1);
}

int main(void) {
    rng = sl_rng_make(1234, 0, 0, SL_RNG_TEST);
    int failed = 0;
    for (int i = 0; i < test_count; i++) {
        test_failed_checks = 0;
        test_cases[i].fn();
        printf("%s %s\n", test_failed_checks ? "FAIL" : "PASS", test_cases[i].name);
        failed += test_failed_checks != 0;
    }
    return failed ? 1 : 0;
}

// An fp32 op that cannot finish (no memory for its scratch) records its failure; the synchronize() of
// every CPU table reports it once, naming the op, as a failed device call is reported.
TEST(a_recorded_cpu_failure_is_reported_once_by_every_cpu_table) {
    const sl_ops *tables[] = {&sl_ops_cpu, &sl_ops_cpu_bf16, &sl_ops_cpu_bf16_native, &sl_ops_cpu_quant};
    for (size_t t = 0; t < sizeof tables / sizeof tables[0]; t++) {
        CHECK(tables[t]->synchronize() == 0);
        sl_errorf("out of memory for a thread's attention scratch (head dim %d)", 64);
        cpu_record_failure("attention_forward");
        sl_errorf("a later failure");
        cpu_record_failure("attention_backward");  // the first one is what is reported
        CHECK_MSG(tables[t]->synchronize() == -1, "table %s", tables[t]->name);
        CHECK_MSG(strstr(sl_error(), "attention_forward: out of memory") != NULL, "%s", sl_error());
        CHECK(tables[t]->synchronize() == 0);  // reported once
    }
}
