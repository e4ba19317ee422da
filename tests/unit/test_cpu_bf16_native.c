// test_cpu_bf16_native.c: real bf16 on the CPU (sl_ops_cpu_bf16_native, "cpu-bf16-onednn") against its
// oracle, the emulation sl_ops_cpu_bf16:
//   * which table `--precision bf16 --device cpu` gets, under each switch (SHARDLM_BF16_STORAGE,
//     SHARDLM_CPU_BF16, SHARDLM_EMULATE_BF16_STORAGE), and that the CPU's bf16 instructions decide it;
//   * the GEMM ops at N = 1, 7, 33, 1023 rows (IC 75, OC 130), with and without bias, dinp NULL or
//     not, and the fused GEMM + GELU pair. Both tables multiply the same bf16 values exactly and sum
//     in fp32, in different orders, then round once; so every storage element is within one rounding
//     of each side of the emulation's, |got - want| <= 2^-8 (|got| + |want|), plus the worst case of
//     the two fp32 sums' difference, K 2^-23 sum_k |a_k b_k| (K the summed length); fp32 weight
//     gradients within (K + 2) 2^-23 (sum |a b| + |start|); the bias gradient bit for bit (the CPU's
//     order); every GEMM deterministic;
//   * every other op: the emulation's bits (both stage the same fp32 CPU op, or, for attention_decode,
//     the native table computes what it computes on the bf16 cache read in place); attention with
//     SHARDLM_ATTENTION=simt (by default it runs on oneDNN's bf16 matmuls: test_attention_bf16.c);
//   * a failing oneDNN call: reported by synchronize() naming the op and its shape, later ops skipped;
//   * gpt2-tiny and llama-tiny: loss, logits and gradients near the emulation's (bounds measured, with
//     margin, in the comments at check_model) and near fp32; bit-identical run to run.
#include "test.h"

#include <math.h>

#include "ops/cpu/cpu_bf16.h"
#include "shardlm/cpu_features.h"
#include "shardlm/error.h"
#include "shardlm/model.h"
#include "shardlm/precision.h"
#include "shardlm/rng.h"
#include "shardlm/rope.h"
#include "shardlm/settings.h"

static const sl_ops *const nat = &sl_ops_cpu_bf16_native, *const emu = &sl_ops_cpu_bf16;

// n bf16 values, normal with standard deviation scale / 3, as storage (freed by the caller).
static sl_bf16 *bf16_values(size_t n, uint64_t seed, float scale) {
    sl_bf16 *x = malloc((n ? n : 1) * sizeof(sl_bf16));
    sl_rng r = sl_rng_make(seed, 0, 0, SL_RNG_TEST);
    for (size_t i = 0; i < n; i++) x[i] = sl_f32_to_bf16(scale * (float)sl_rng_normal(&r) / 3.0f);
    return x;
}

static float *f32_values(size_t n, uint64_t seed, float scale) {
    float *x = malloc((n ? n : 1) * sizeof(float));
    sl_rng r = sl_rng_make(seed, 1, 0, SL_RNG_TEST);
    for (size_t i = 0; i < n; i++) x[i] = scale * (float)sl_rng_normal(&r);
    return x;
}

static sl_bf16 *bf16_copy(const sl_bf16 *x, size_t n) {
    sl_bf16 *y = malloc((n ? n : 1) * sizeof(sl_bf16));
    memcpy(y, x, n * sizeof(sl_bf16));
    return y;
}

static float *f32_copy(const float *x, size_t n) {
    float *y = malloc((n ? n : 1) * sizeof(float));
    memcpy(y, x, n * sizeof(float));
    return y;
}

static double w(sl_bf16 h) { return (double)sl_bf16_to_f32(h); }

// s[i * cols + j] = sum_k |op(A)[i,k] op(B)[k,j]| (+ |bias[j]|) over K terms, in double: what bounds the
// difference of two fp32 sums of the same products. op(A)[i,k] = ta ? A[k*lda+i] : A[i*lda+k], likewise B.
static double *abs_products(int ta, int tb, int rows, int cols, int K, const sl_bf16 *A, int lda, const sl_bf16 *B,
                            int ldb, const sl_bf16 *bias) {
    double *s = calloc((size_t)rows * cols, sizeof(double));
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) {
            double t = bias ? fabs(w(bias[j])) : 0;
            for (int k = 0; k < K; k++)
                t += fabs(w(ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k]) *
                          w(tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j]));
            s[(size_t)i * cols + j] = t;
        }
    return s;
}

// Storage got against want (n elements): |got - want| <= 2^-8 (|got| + |want|) + K 2^-23 s[i] (gain: how
// much the fp32 difference can grow on its way, e.g. through GELU). The worst ratio of difference to
// bound goes to *worst (<= 1 passes).
static int storage_close(const sl_bf16 *got, const sl_bf16 *want, const double *s, int K, double gain, size_t n,
                         double *worst) {
    *worst = 0;
    for (size_t i = 0; i < n; i++) {
        double g = w(got[i]), e = w(want[i]);
        double bound = ldexp(fabs(g) + fabs(e), -8) + gain * K * ldexp(s[i], -23) + 1e-30;
        if (fabs(g - e) / bound > *worst) *worst = fabs(g - e) / bound;
    }
    return *worst <= 1.0;
}

// fp32 accumulated gradients: |got - want| <= (K + 2) 2^-23 (s[i] + |start[i]|).
static int grad_close(const float *got, const float *want, const double *s, const float *start, int K, size_t n,
                      double *worst) {
    *worst = 0;
    for (size_t i = 0; i < n; i++) {
        double bound = (K + 2) * ldexp(s[i] + fabs(start[i]), -23) + 1e-30;
        double r = fabs((double)got[i] - want[i]) / bound;
        if (r > *worst) *worst = r;
    }
    return *worst <= 1.0;
}

static void set_env(const char *name, const char *value) {
    if (value) setenv(name, value, 1);
    else unsetenv(name);
    CHECK(sl_settings_load() == 0);  // the environment is read once; again after changing it
}

TEST(bf16_on_the_cpu_picks_the_table_the_cpu_can_run) {
    CHECK(nat->act_bf16 == 1 && nat->on_device == 0 && !strcmp(nat->name, "cpu-bf16-onednn"));
    CHECK(nat->alloc == sl_ops_cpu.alloc && nat->adam_step == sl_ops_cpu.adam_step && nat->to_storage);
    const sl_cpu_features *f = sl_cpu_features_get();
    char why[256];
    int usable = sl_ops_cpu_bf16_native_usable(why, sizeof why);
    printf("  bf16 on this CPU: %s (%s)\n", usable ? "native" : "emulated", why);
    // oneDNN 2.6 has bf16 matmul kernels for both instruction sets
    CHECK_MSG(usable == (f->avx512_bf16 || f->amx_bf16), "usable %d: %s", usable, why);
    const sl_ops *bf16 = usable ? nat : emu;
    CHECK(sl_ops_for_precision(&sl_ops_cpu, SL_PRECISION_BF16) == bf16);
    CHECK(sl_ops_for_precision(&sl_ops_cpu, SL_PRECISION_FP32) == &sl_ops_cpu);
    CHECK(sl_ops_for_precision(&sl_ops_cpu, SL_PRECISION_FP16) == &sl_ops_cpu);
    set_env("SHARDLM_BF16_STORAGE", "0");  // fp32 activations, bf16-rounded parameters and gradients
    CHECK(sl_ops_for_precision(&sl_ops_cpu, SL_PRECISION_BF16) == &sl_ops_cpu);
    set_env("SHARDLM_BF16_STORAGE", NULL);
    set_env("SHARDLM_CPU_BF16", "0");  // as on a CPU without bf16 instructions: the emulation
    CHECK(!sl_ops_cpu_bf16_native_usable(why, sizeof why) && strstr(why, "SHARDLM_CPU_BF16=0"));
    CHECK(sl_ops_for_precision(&sl_ops_cpu, SL_PRECISION_BF16) == emu);
    setenv("SHARDLM_CPU_BF16", "no", 1);  // malformed: an error naming it
    CHECK(sl_settings_load() == -1 && strstr(sl_error(), "SHARDLM_CPU_BF16"));
    set_env("SHARDLM_CPU_BF16", NULL);
    set_env("SHARDLM_EMULATE_BF16_STORAGE", "1");  // the emulation asked for stays
    CHECK(sl_ops_for_device("cpu", 0) == emu && sl_ops_for_precision(emu, SL_PRECISION_BF16) == emu);
    set_env("SHARDLM_EMULATE_BF16_STORAGE", NULL);
}

// The GEMM ops at N rows, IC 75, OC 130, against the emulation; with bias or not, dinp or NULL.
static void check_gemms(int N, int with_bias, int with_dinp) {
    const int IC = 75, OC = 130;
    size_t ni = (size_t)N * IC, no = (size_t)N * OC, nw = (size_t)OC * IC;
    sl_bf16 *inp = bf16_values(ni, 1 + N, 1.0f), *wt = bf16_values(nw, 2, 0.3f), *dout = bf16_values(no, 3 + N, 0.5f);
    sl_bf16 *bias = with_bias ? bf16_values(OC, 4, 0.2f) : NULL;
    sl_bf16 *o1 = calloc(no, 2), *o2 = calloc(no, 2), *p1 = calloc(no, 2), *p2 = calloc(no, 2);
    double worst, *s_fwd = abs_products(0, 1, N, OC, IC, inp, IC, wt, IC, bias);
    char what[96];
    snprintf(what, sizeof what, "N=%d bias=%d dinp=%d", N, with_bias, with_dinp);
    // forward
    nat->matmul_forward(ACT((void *)o1), ACT((void *)inp), ACT((void *)wt), bias ? ACT((void *)bias) : NULL, N, IC, OC);
    emu->matmul_forward(ACT((void *)o2), ACT((void *)inp), ACT((void *)wt), bias ? ACT((void *)bias) : NULL, N, IC, OC);
    CHECK_MSG(storage_close(o1, o2, s_fwd, IC, 1.0, no, &worst), "%s forward: %.3g of the bound", what, worst);
    // fused GEMM + GELU forward: pre as the plain forward; out = gelu(pre) in fp32 (gelu' < 1.2)
    nat->matmul_gelu_forward(ACT((void *)o1), ACT((void *)p1), ACT((void *)inp), ACT((void *)wt),
                             bias ? ACT((void *)bias) : NULL, N, IC, OC);
    emu->matmul_gelu_forward(ACT((void *)o2), ACT((void *)p2), ACT((void *)inp), ACT((void *)wt),
                             bias ? ACT((void *)bias) : NULL, N, IC, OC);
    CHECK_MSG(storage_close(p1, p2, s_fwd, IC, 1.0, no, &worst), "%s gelu pre: %.3g", what, worst);
    CHECK_MSG(storage_close(o1, o2, s_fwd, IC, 1.2, no, &worst), "%s gelu out: %.3g", what, worst);
    // backward: dinp (storage) overwritten, dweight / dbias fp32 accumulating from the same start
    float *dw0 = f32_values(nw, 5, 0.1f), *db0 = f32_values(OC, 6, 0.1f);
    float *dw1 = f32_copy(dw0, nw), *dw2 = f32_copy(dw0, nw), *db1 = f32_copy(db0, OC), *db2 = f32_copy(db0, OC);
    sl_bf16 *di1 = with_dinp ? calloc(ni, 2) : NULL, *di2 = with_dinp ? calloc(ni, 2) : NULL;
    double *s_dinp = abs_products(0, 0, N, IC, OC, dout, OC, wt, IC, NULL);
    double *s_dw = abs_products(1, 0, OC, IC, N, dout, OC, inp, IC, NULL);
    nat->matmul_backward(di1 ? ACT((void *)di1) : NULL, dw1, with_bias ? db1 : NULL, ACT((void *)dout), ACT((void *)inp),
                         ACT((void *)wt), N, IC, OC);
    emu->matmul_backward(di2 ? ACT((void *)di2) : NULL, dw2, with_bias ? db2 : NULL, ACT((void *)dout), ACT((void *)inp),
                         ACT((void *)wt), N, IC, OC);
    if (with_dinp) CHECK_MSG(storage_close(di1, di2, s_dinp, OC, 1.0, ni, &worst), "%s dinp: %.3g", what, worst);
    CHECK_MSG(grad_close(dw1, dw2, s_dw, dw0, N, nw, &worst), "%s dweight: %.3g", what, worst);
    CHECK_MSG(!memcmp(db1, db2, OC * sizeof(float)), "%s dbias differs", what);
    if (!with_bias) CHECK(!memcmp(db1, db0, OC * sizeof(float)));  // NULL dbias: nothing written
    // fused backward: dout overwritten with the stored pre-GELU gradient (the emulation's bits), then
    // the backward above on it (pre: the emulation's, so both start from the same stored values)
    sl_bf16 *g1 = bf16_copy(dout, no), *g2 = bf16_copy(dout, no);
    nat->matmul_gelu_backward(di1 ? ACT((void *)di1) : NULL, dw1, db1, ACT((void *)g1), ACT((void *)p2),
                              ACT((void *)inp), ACT((void *)wt), N, IC, OC);
    emu->matmul_gelu_backward(di2 ? ACT((void *)di2) : NULL, dw2, db2, ACT((void *)g2), ACT((void *)p2),
                              ACT((void *)inp), ACT((void *)wt), N, IC, OC);
    CHECK_MSG(!memcmp(g1, g2, no * sizeof(sl_bf16)), "%s gelu backward's dpre differs", what);
    double *s_dinp2 = abs_products(0, 0, N, IC, OC, g2, OC, wt, IC, NULL);
    double *s_dw2 = abs_products(1, 0, OC, IC, N, g2, OC, inp, IC, NULL);
    for (size_t i = 0; i < nw; i++) s_dw2[i] += s_dw[i];  // two accumulations from dw0
    if (with_dinp) CHECK_MSG(storage_close(di1, di2, s_dinp2, OC, 1.0, ni, &worst), "%s gelu dinp: %.3g", what, worst);
    CHECK_MSG(grad_close(dw1, dw2, s_dw2, dw0, 2 * N, nw, &worst), "%s gelu dweight: %.3g", what, worst);
    // deterministic: the same call again gives the same bits
    sl_bf16 *o3 = calloc(no, 2);
    float *dw3 = f32_copy(dw0, nw), *dw4 = f32_copy(dw0, nw);
    nat->matmul_forward(ACT((void *)o3), ACT((void *)inp), ACT((void *)wt), bias ? ACT((void *)bias) : NULL, N, IC, OC);
    nat->matmul_forward(ACT((void *)o2), ACT((void *)inp), ACT((void *)wt), bias ? ACT((void *)bias) : NULL, N, IC, OC);
    nat->matmul_backward(NULL, dw3, NULL, ACT((void *)dout), ACT((void *)inp), ACT((void *)wt), N, IC, OC);
    nat->matmul_backward(NULL, dw4, NULL, ACT((void *)dout), ACT((void *)inp), ACT((void *)wt), N, IC, OC);
    CHECK_MSG(!memcmp(o2, o3, no * 2) && !memcmp(dw3, dw4, nw * 4), "%s not deterministic", what);
    CHECK(nat->synchronize() == 0);
    free(inp); free(wt); free(dout); free(bias); free(o1); free(o2); free(o3); free(p1); free(p2); free(s_fwd);
    free(dw0); free(db0); free(dw1); free(dw2); free(dw3); free(dw4); free(db1); free(db2); free(di1); free(di2);
    free(s_dinp); free(s_dw); free(g1); free(g2); free(s_dinp2); free(s_dw2);
}

TEST(gemm_ops_track_the_emulation_at_odd_shapes) {
    const int rows[] = {1, 7, 33, 1023};
    for (int r = 0; r < 4; r++) {
        check_gemms(rows[r], 1, 1);
        check_gemms(rows[r], 0, 0);
    }
    check_gemms(33, 1, 0);
    check_gemms(33, 0, 1);
}

TEST(other_ops_give_the_emulations_bits) {
    int B = 2, T = 8, NH = 4, NKV = 2, HD = 8, C = 48, V = 30, Vp = 32, N = B * T;
    size_t nq = (size_t)N * (NH + 2 * NKV) * HD, no = (size_t)N * NH * HD, nc = (size_t)N * C;
    sl_bf16 *qkv = bf16_values(nq, 21, 1.0f), *q1 = bf16_copy(qkv, nq), *q2 = bf16_copy(qkv, nq);
    float cos[8 * 4], sin[8 * 4], lse1[64], lse2[64], st1[64], st2[64];
    sl_rope_tables(cos, sin, T, HD, 10000.0f);
    nat->rope_forward(ACT((void *)q1), cos, sin, B, T, NH, NKV, HD, 0);
    emu->rope_forward(ACT((void *)q2), cos, sin, B, T, NH, NKV, HD, 0);
    CHECK(!memcmp(q1, q2, nq * 2));
    sl_bf16 *a1 = calloc(no, 2), *a2 = calloc(no, 2), *d1 = calloc(nq, 2), *d2 = calloc(nq, 2);
    sl_bf16 *dout = bf16_values(no, 22, 0.5f);
    setenv("SHARDLM_ATTENTION", "simt", 1);  // the staged attention (default: oneDNN's, test_attention_bf16.c)
    CHECK(sl_settings_load() == 0);
    nat->attention_forward(ACT((void *)a1), lse1, ACT((void *)q1), B, T, NH, NKV, HD, 0);
    emu->attention_forward(ACT((void *)a2), lse2, ACT((void *)q2), B, T, NH, NKV, HD, 0);
    CHECK(!memcmp(a1, a2, no * 2) && !memcmp(lse1, lse2, (size_t)B * NH * T * 4));
    nat->attention_backward(ACT((void *)d1), ACT((void *)dout), ACT((void *)q1), ACT((void *)a1), lse1, B, T, NH, NKV,
                            HD, 0);
    emu->attention_backward(ACT((void *)d2), ACT((void *)dout), ACT((void *)q2), ACT((void *)a2), lse2, B, T, NH, NKV,
                            HD, 0);
    CHECK(!memcmp(d1, d2, nq * 2));
    unsetenv("SHARDLM_ATTENTION");
    CHECK(sl_settings_load() == 0);
    // one query against a KV cache long enough to run in parallel (read in place, not staged)
    int n_ctx = 1500;
    size_t nkv = (size_t)n_ctx * NKV * HD;
    sl_bf16 *kc = bf16_values(nkv, 32, 1.0f), *vc = bf16_values(nkv, 33, 1.0f);
    nat->attention_decode(ACT((void *)a1), ACT((void *)qkv), ACT((void *)kc), ACT((void *)vc), n_ctx, NH, NKV, HD);
    emu->attention_decode(ACT((void *)a2), ACT((void *)qkv), ACT((void *)kc), ACT((void *)vc), n_ctx, NH, NKV, HD);
    CHECK_MSG(!memcmp(a1, a2, (size_t)NH * HD * 2), "attention_decode");
    free(kc); free(vc);
    {  // the vector path (head size 64), a partial last block of 16 positions
        int hd = 64, nh = 4, nkv = 2, ctx = 37;
        size_t nq64 = (size_t)nh * hd, nc64 = (size_t)ctx * nkv * hd;
        sl_bf16 *q64 = bf16_values(nq64, 34, 1.0f), *k64 = bf16_values(nc64, 35, 1.0f), *v64 = bf16_values(nc64, 36, 1.0f);
        sl_bf16 *o1 = calloc(nq64, 2), *o2 = calloc(nq64, 2);
        nat->attention_decode(ACT((void *)o1), ACT((void *)q64), ACT((void *)k64), ACT((void *)v64), ctx, nh, nkv, hd);
        emu->attention_decode(ACT((void *)o2), ACT((void *)q64), ACT((void *)k64), ACT((void *)v64), ctx, nh, nkv, hd);
        CHECK_MSG(!memcmp(o1, o2, nq64 * 2), "attention_decode, head size 64");
        free(q64); free(k64); free(v64); free(o1); free(o2);
    }
    // fused residual + layernorm in place (resid == a), then its backward accumulating into dinp
    sl_bf16 *x1 = bf16_values(nc, 23, 2.0f), *x2 = bf16_copy(x1, nc), *y = bf16_values(nc, 24, 1.0f);
    sl_bf16 *lw = bf16_values(C, 25, 1.0f), *lb = bf16_values(C, 26, 0.3f), *n1 = calloc(nc, 2), *n2 = calloc(nc, 2);
    nat->residual_layernorm_forward(ACT((void *)x1), ACT((void *)n1), st1, lse1, ACT((void *)x1), ACT((void *)y),
                                    ACT((void *)lw), ACT((void *)lb), N, C, 1e-5f);
    emu->residual_layernorm_forward(ACT((void *)x2), ACT((void *)n2), st2, lse2, ACT((void *)x2), ACT((void *)y),
                                    ACT((void *)lw), ACT((void *)lb), N, C, 1e-5f);
    CHECK(!memcmp(x1, x2, nc * 2) && !memcmp(n1, n2, nc * 2) && !memcmp(st1, st2, (size_t)N * 4));
    float *dw1 = calloc(C, 4), *dw2 = calloc(C, 4), *db1 = calloc(C, 4), *db2 = calloc(C, 4);
    sl_bf16 *g1 = bf16_values(nc, 27, 0.5f), *g2 = bf16_copy(g1, nc);
    nat->layernorm_backward(ACT((void *)g1), dw1, db1, ACT((void *)y), ACT((void *)x1), ACT((void *)lw), st1, lse1, N, C);
    emu->layernorm_backward(ACT((void *)g2), dw2, db2, ACT((void *)y), ACT((void *)x2), ACT((void *)lw), st2, lse2, N, C);
    CHECK(!memcmp(g1, g2, nc * 2) && !memcmp(dw1, dw2, C * 4) && !memcmp(db1, db2, C * 4));
    // fused residual + rmsnorm out of place, SwiGLU
    nat->residual_rmsnorm_forward(ACT((void *)n1), ACT((void *)g1), st1, ACT((void *)x1), ACT((void *)y),
                                  ACT((void *)lw), N, C, 1e-6f);
    emu->residual_rmsnorm_forward(ACT((void *)n2), ACT((void *)g2), st2, ACT((void *)x2), ACT((void *)y),
                                  ACT((void *)lw), N, C, 1e-6f);
    CHECK(!memcmp(n1, n2, nc * 2) && !memcmp(g1, g2, nc * 2) && !memcmp(st1, st2, (size_t)N * 4));
    nat->swiglu_forward(ACT((void *)n1), ACT((void *)x1), N, C / 2);
    emu->swiglu_forward(ACT((void *)n2), ACT((void *)x2), N, C / 2);
    CHECK(!memcmp(n1, n2, nc));  // N * C/2 elements
    // embeddings with and without positions; cross-entropy forward and its in-place backward
    int inp[16], tg[16];
    for (int i = 0; i < N; i++) { inp[i] = (i * 7 + 3) % V; tg[i] = i == 5 ? -1 : (i * 11 + 1) % V; }
    sl_bf16 *wte = bf16_values((size_t)V * C, 28, 0.1f), *wpe = bf16_values((size_t)T * C, 29, 0.1f);
    for (int pos = 0; pos < 2; pos++) {
        nat->encoder_forward(ACT((void *)n1), inp, ACT((void *)wte), pos ? ACT((void *)wpe) : NULL, B, T, C);
        emu->encoder_forward(ACT((void *)n2), inp, ACT((void *)wte), pos ? ACT((void *)wpe) : NULL, B, T, C);
        CHECK_MSG(!memcmp(n1, n2, nc * 2), "encoder_forward with%s wpe", pos ? "" : "out");
    }
    size_t nl = (size_t)N * Vp;
    sl_bf16 *l1 = bf16_values(nl, 30, 4.0f), *l2 = bf16_copy(l1, nl);
    double c1 = nat->crossentropy_forward(lse1, ACT((void *)l1), tg, N, V, Vp);
    double c2 = emu->crossentropy_forward(lse2, ACT((void *)l2), tg, N, V, Vp);
    CHECK(c1 == c2 && !memcmp(lse1, lse2, (size_t)N * 4));
    nat->crossentropy_backward(ACT((void *)l1), lse1, tg, N, V, Vp, 0.25f);
    emu->crossentropy_backward(ACT((void *)l2), lse2, tg, N, V, Vp, 0.25f);
    CHECK(!memcmp(l1, l2, nl * 2));
    // a vocabulary large enough that the native table stages the logits in blocks of rows
    int NB = 150, VB = 30000, VBp = 30080, tb[150];
    for (int i = 0; i < NB; i++) tb[i] = i % 7 == 3 ? -1 : (i * 7919) % VB;
    size_t nb = (size_t)NB * VBp;
    sl_bf16 *b1 = bf16_values(nb, 31, 4.0f), *b2 = bf16_copy(b1, nb), *b3 = bf16_copy(b1, nb);
    float *bl1 = malloc(NB * 4), *bl2 = malloc(NB * 4), *bl3 = malloc(NB * 4);
    c1 = nat->crossentropy_forward(bl1, ACT((void *)b1), tb, NB, VB, VBp);
    c2 = emu->crossentropy_forward(bl2, ACT((void *)b2), tb, NB, VB, VBp);
    CHECK_MSG(c1 == c2 && !memcmp(bl1, bl2, NB * 4), "blocked cross-entropy %.17g vs %.17g", c1, c2);
    nat->crossentropy_backward(ACT((void *)b1), bl1, tb, NB, VB, VBp, 1.0f / 150);
    emu->crossentropy_backward(ACT((void *)b2), bl2, tb, NB, VB, VBp, 1.0f / 150);
    CHECK(!memcmp(b1, b2, nb * 2));
    // both in one call, blocked the same way: the same loss, lse and gradient
    double c3 = nat->crossentropy_fused(bl3, ACT((void *)b3), tb, NB, VB, VBp, 1.0f / 150);
    CHECK_MSG(c3 == c1 && !memcmp(bl3, bl1, NB * 4) && !memcmp(b3, b1, nb * 2), "fused cross-entropy %.17g vs %.17g",
              c3, c1);
    free(b1); free(b2); free(b3); free(bl1); free(bl2); free(bl3);
    CHECK(nat->synchronize() == 0);
    free(qkv); free(q1); free(q2); free(a1); free(a2); free(d1); free(d2); free(dout); free(x1); free(x2); free(y);
    free(lw); free(lb); free(n1); free(n2); free(dw1); free(dw2); free(db1); free(db2); free(g1); free(g2);
    free(wte); free(wpe); free(l1); free(l2);
}

// residual_forward, add_columns and take_columns read and write bf16 in place (elementwise_bf16.c):
// the staged emulation's bits, also for Inf, NaN, overflow to Inf and sums that tie between two bf16
// values; add_columns leaves the columns outside its slice alone, at sizes below and above the
// parallel threshold.
static void special_values(sl_bf16 *x, size_t n) {
    static const float sp[] = {INFINITY, -INFINITY, NAN, 3.3e38f, -3.3e38f, 1.0f, 0x1.01p0f, 1e-40f, 0.0f, -0.0f};
    for (size_t i = 0; i < n && i < 10 * 37; i += 37) x[i] = sl_f32_to_bf16(sp[i / 37]);
}

TEST(in_place_elementwise_ops_give_the_emulations_bits) {
    for (int big = 0; big < 2; big++) {
        size_t n = big ? 70001 : 777;
        sl_bf16 *a = bf16_values(n, 40 + big, 3.0f), *b = bf16_values(n, 42 + big, 3.0f);
        special_values(a, n);
        special_values(b + 5, n - 5);
        for (size_t i = 400; i < 420; i++) b[i] = sl_f32_to_bf16(0x1p-8f), a[i] = sl_f32_to_bf16(1.0f);  // ties
        sl_bf16 *o1 = calloc(n, 2), *o2 = calloc(n, 2);
        nat->residual_forward(ACT((void *)o1), ACT((void *)a), ACT((void *)b), n);
        emu->residual_forward(ACT((void *)o2), ACT((void *)a), ACT((void *)b), n);
        CHECK_MSG(!memcmp(o1, o2, n * 2), "residual_forward, n %zu", n);
        sl_bf16 *a1 = bf16_copy(a, n), *a2 = bf16_copy(a, n);  // in place: out == a
        nat->residual_forward(ACT((void *)a1), ACT((void *)a1), ACT((void *)b), n);
        emu->residual_forward(ACT((void *)a2), ACT((void *)a2), ACT((void *)b), n);
        CHECK_MSG(!memcmp(a1, a2, n * 2) && !memcmp(a1, o1, n * 2), "residual_forward in place, n %zu", n);
        int N = big ? 333 : 33, W = 24, ld = big ? 240 : 80, col0 = 16;
        size_t ny = (size_t)N * ld, nd = (size_t)N * W;
        sl_bf16 *y = bf16_values(ny, 44 + big, 2.0f), *d = bf16_values(nd, 46 + big, 2.0f);
        special_values(y + col0, ny - col0);
        special_values(d, nd);
        sl_bf16 *y1 = bf16_copy(y, ny), *y2 = bf16_copy(y, ny);
        nat->add_columns(ACT((void *)y1), ACT((void *)d), 0.37f, N, W, ld, col0);
        emu->add_columns(ACT((void *)y2), ACT((void *)d), 0.37f, N, W, ld, col0);
        CHECK_MSG(!memcmp(y1, y2, ny * 2), "add_columns, N %d", N);
        int outside_kept = 1;
        for (int r = 0; r < N; r++)
            for (int c = 0; c < ld; c++)
                if ((c < col0 || c >= col0 + W) && y1[(size_t)r * ld + c] != y[(size_t)r * ld + c]) outside_kept = 0;
        CHECK_MSG(outside_kept, "add_columns touched columns outside its slice");
        sl_bf16 *t1 = calloc(nd, 2), *t2 = calloc(nd, 2);
        nat->take_columns(ACT((void *)t1), ACT((void *)y), -1.75f, N, W, ld, col0);
        emu->take_columns(ACT((void *)t2), ACT((void *)y), -1.75f, N, W, ld, col0);
        CHECK_MSG(!memcmp(t1, t2, nd * 2), "take_columns, N %d", N);
        CHECK(nat->synchronize() == 0);
        free(a); free(b); free(o1); free(o2); free(a1); free(a2); free(y); free(d); free(y1); free(y2); free(t1);
        free(t2);
    }
}

// GELU and SwiGLU with their gradients read and write bf16 in place (elementwise_bf16.c): the staged
// emulation's bits, special values included, below and above the parallel threshold, and with the
// gradient written over the output gradient (the fused GEMM's backward does that).
TEST(activations_give_the_emulations_bits) {
    for (int big = 0; big < 2; big++) {
        int N = big ? 301 : 7, I = 96;
        size_t n = (size_t)N * I, n2 = 2 * n;
        sl_bf16 *x = bf16_values(n2, 60 + big, 4.0f), *d = bf16_values(n2, 62 + big, 2.0f);
        special_values(x, n2);
        special_values(d + 3, n2 - 3);
        sl_bf16 *o1 = calloc(n2, 2), *o2 = calloc(n2, 2);
        nat->gelu_forward(ACT((void *)o1), ACT((void *)x), n2);
        emu->gelu_forward(ACT((void *)o2), ACT((void *)x), n2);
        CHECK_MSG(!memcmp(o1, o2, n2 * 2), "gelu_forward, n %zu", n2);
        nat->gelu_backward(ACT((void *)o1), ACT((void *)x), ACT((void *)d), n2);
        emu->gelu_backward(ACT((void *)o2), ACT((void *)x), ACT((void *)d), n2);
        CHECK_MSG(!memcmp(o1, o2, n2 * 2), "gelu_backward, n %zu", n2);
        sl_bf16 *d1 = bf16_copy(d, n2), *d2 = bf16_copy(d, n2);  // in place: dinp == dout
        nat->gelu_backward(ACT((void *)d1), ACT((void *)x), ACT((void *)d1), n2);
        emu->gelu_backward(ACT((void *)d2), ACT((void *)x), ACT((void *)d2), n2);
        CHECK_MSG(!memcmp(d1, d2, n2 * 2) && !memcmp(d1, o1, n2 * 2), "gelu_backward in place, n %zu", n2);
        nat->swiglu_forward(ACT((void *)o1), ACT((void *)x), N, I);
        emu->swiglu_forward(ACT((void *)o2), ACT((void *)x), N, I);
        CHECK_MSG(!memcmp(o1, o2, n * 2), "swiglu_forward, N %d", N);
        nat->swiglu_backward(ACT((void *)o1), ACT((void *)x), ACT((void *)d), N, I);
        emu->swiglu_backward(ACT((void *)o2), ACT((void *)x), ACT((void *)d), N, I);
        CHECK_MSG(!memcmp(o1, o2, n2 * 2), "swiglu_backward, N %d", N);
        CHECK(nat->synchronize() == 0);
        free(x); free(d); free(o1); free(o2); free(d1); free(d2);
    }
}

// The norms and RoPE are staged a block of rows at a time (about 64K floats an argument): over several
// blocks, a partial last one, and RoPE from a later position, the bits are still the emulation's (the
// weight gradients' column sums add the rows in the same order).
TEST(row_blocked_ops_give_the_emulations_bits) {
    int N = 3001, C = 48;  // 1365 rows a block: three blocks, the last partial
    size_t nc = (size_t)N * C;
    sl_bf16 *x = bf16_values(nc, 70, 2.0f), *g = bf16_values(nc, 71, 0.5f), *w = bf16_values(C, 72, 1.0f);
    sl_bf16 *b = bf16_values(C, 73, 0.3f), *o1 = calloc(nc, 2), *o2 = calloc(nc, 2);
    sl_bf16 *d1 = bf16_values(nc, 74, 0.25f), *d2 = bf16_copy(d1, nc);
    float *m1 = malloc(N * 4), *m2 = malloc(N * 4), *r1 = malloc(N * 4), *r2 = malloc(N * 4);
    float *dw1 = calloc(C, 4), *dw2 = calloc(C, 4), *db1 = calloc(C, 4), *db2 = calloc(C, 4);
    nat->layernorm_forward(ACT((void *)o1), m1, r1, ACT((void *)x), ACT((void *)w), ACT((void *)b), N, C, 1e-5f);
    emu->layernorm_forward(ACT((void *)o2), m2, r2, ACT((void *)x), ACT((void *)w), ACT((void *)b), N, C, 1e-5f);
    CHECK(!memcmp(o1, o2, nc * 2) && !memcmp(m1, m2, N * 4) && !memcmp(r1, r2, N * 4));
    nat->layernorm_backward(ACT((void *)d1), dw1, db1, ACT((void *)g), ACT((void *)x), ACT((void *)w), m1, r1, N, C);
    emu->layernorm_backward(ACT((void *)d2), dw2, db2, ACT((void *)g), ACT((void *)x), ACT((void *)w), m2, r2, N, C);
    CHECK(!memcmp(d1, d2, nc * 2) && !memcmp(dw1, dw2, C * 4) && !memcmp(db1, db2, C * 4));
    nat->layernorm_backward(ACT((void *)d1), NULL, NULL, ACT((void *)g), ACT((void *)x), ACT((void *)w), m1, r1, N, C);
    emu->layernorm_backward(ACT((void *)d2), NULL, NULL, ACT((void *)g), ACT((void *)x), ACT((void *)w), m2, r2, N, C);
    CHECK_MSG(!memcmp(d1, d2, nc * 2), "layernorm_backward with frozen weights");
    nat->rmsnorm_forward(ACT((void *)o1), r1, ACT((void *)x), ACT((void *)w), N, C, 1e-6f);
    emu->rmsnorm_forward(ACT((void *)o2), r2, ACT((void *)x), ACT((void *)w), N, C, 1e-6f);
    CHECK(!memcmp(o1, o2, nc * 2) && !memcmp(r1, r2, N * 4));
    nat->rmsnorm_backward(ACT((void *)d1), dw1, ACT((void *)g), ACT((void *)x), ACT((void *)w), r1, N, C);
    emu->rmsnorm_backward(ACT((void *)d2), dw2, ACT((void *)g), ACT((void *)x), ACT((void *)w), r2, N, C);
    CHECK(!memcmp(d1, d2, nc * 2) && !memcmp(dw1, dw2, C * 4));
    // RoPE: W = 64 per row, 1024 rows a block; two sequences of 1500 positions from position 7
    int B = 2, T = 1500, NH = 2, NKV = 1, HD = 16, pos0 = 7, half = HD / 2;
    size_t nq = (size_t)B * T * (NH + 2 * NKV) * HD;
    float *cos = malloc((size_t)(T + pos0) * half * 4), *sin = malloc((size_t)(T + pos0) * half * 4);
    sl_rope_tables(cos, sin, T + pos0, HD, 10000.0f);
    sl_bf16 *q1 = bf16_values(nq, 75, 1.0f), *q2 = bf16_copy(q1, nq);
    nat->rope_forward(ACT((void *)q1), cos, sin, B, T, NH, NKV, HD, pos0);
    emu->rope_forward(ACT((void *)q2), cos, sin, B, T, NH, NKV, HD, pos0);
    CHECK_MSG(!memcmp(q1, q2, nq * 2), "rope_forward");
    nat->rope_backward(ACT((void *)q1), cos, sin, B, T, NH, NKV, HD);
    emu->rope_backward(ACT((void *)q2), cos, sin, B, T, NH, NKV, HD);
    CHECK_MSG(!memcmp(q1, q2, nq * 2), "rope_backward");
    CHECK(nat->synchronize() == 0);
    free(x); free(g); free(w); free(b); free(o1); free(o2); free(d1); free(d2); free(m1); free(m2); free(r1);
    free(r2); free(dw1); free(dw2); free(db1); free(db2); free(cos); free(sin); free(q1); free(q2);
}

TEST(a_failing_gemm_is_reported_by_synchronize) {
    sl_bf16 x[8] = {0}, wt[8] = {0}, out[8] = {0}, o2[8];
    CHECK(nat->synchronize() == 0);
    nat->matmul_forward(ACT((void *)out), ACT((void *)x), ACT((void *)wt), NULL, 2, -3, 4);  // K < 0: refused
    CHECK(nat->synchronize() == -1);
    CHECK_MSG(strstr(sl_error(), "matmul_forward") && strstr(sl_error(), "M=2 N=4 K=-3") &&
              strstr(sl_error(), "oneDNN"), "%s", sl_error());
    CHECK(nat->synchronize() == 0);  // reported once
    // after a failure the ops do nothing until synchronize()
    nat->matmul_forward(ACT((void *)out), ACT((void *)x), ACT((void *)wt), NULL, 2, -3, 4);
    for (int i = 0; i < 8; i++) o2[i] = out[i] = 0x3F80;
    nat->gelu_forward(ACT((void *)out), ACT((void *)x), 8);
    CHECK(!memcmp(out, o2, sizeof out));
    CHECK(nat->synchronize() == -1 && nat->synchronize() == 0);
}

// Empty sums (IC = 0: out = bias; 0 rows: the weight gradient unchanged) as the emulation gives them,
// without reaching oneDNN, which divides by K while planning.
TEST(empty_products_equal_the_emulation) {
    sl_bf16 b[3] = {0x3F80, 0xC000, 0x3E00}, o1[6], o2[6], x[1] = {0};
    float dw[6] = {1, 2, 3, 4, 5, 6}, dw2[6];
    memcpy(dw2, dw, sizeof dw);
    for (int bias = 0; bias < 2; bias++) {
        memset(o1, 0xFF, sizeof o1);
        memset(o2, 0xFF, sizeof o2);
        nat->matmul_forward(ACT((void *)o1), ACT((void *)x), ACT((void *)x), bias ? ACT((void *)b) : NULL, 2, 0, 3);
        emu->matmul_forward(ACT((void *)o2), ACT((void *)x), ACT((void *)x), bias ? ACT((void *)b) : NULL, 2, 0, 3);
        CHECK(!memcmp(o1, o2, sizeof o1));
    }
    nat->matmul_backward(NULL, dw, NULL, ACT((void *)x), ACT((void *)x), ACT((void *)x), 0, 2, 3);
    CHECK(!memcmp(dw, dw2, sizeof dw));
    CHECK(nat->synchronize() == 0);
}

// Relative distance: max |a - b| over max |b|.
static double rel_max(const float *a, const float *b, size_t n) {
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        m = fmax(m, fabs((double)b[i]));
    }
    return m > 0 ? d / m : d;
}

// The same weights and batch through the native table, the emulation and fp32. The native GEMMs round
// where the emulation does but sum in another order, so an activation may land one bf16 step (2^-8
// relative) away and that propagates: the bounds are bf16's. Measured here (gpt2-tiny / llama-tiny):
// loss vs emulation ~1e-4 relative, logits ~1e-2 of their largest, gradients ~2e-2 of each tensor's largest.
static void check_model(const char *preset) {
    sl_model_config cfg;
    CHECK(sl_config_preset(&cfg, preset) == 0);
    sl_model n, e, f;
    CHECK(sl_model_create(&n, &cfg, nat) == 0 && sl_model_create(&e, &cfg, emu) == 0 &&
          sl_model_create(&f, &cfg, &sl_ops_cpu) == 0);
    CHECK(sl_model_init_weights(&n, 9) == 0 && sl_model_init_weights(&e, 9) == 0 && sl_model_init_weights(&f, 9) == 0);
    int B = 4, T = 32, in[128], tg[128];
    for (int i = 0; i < B * T; i++) { in[i] = (i * 37 + 11) % cfg.vocab_size; tg[i] = (i * 53 + 5) % cfg.vocab_size; }
    float ln = 0, le = 0, lf = 0;
    CHECK(sl_model_forward(&n, in, tg, B, T, &ln) == 0 && sl_model_forward(&e, in, tg, B, T, &le) == 0 &&
          sl_model_forward(&f, in, tg, B, T, &lf) == 0);
    size_t nlog = (size_t)B * T * cfg.vocab_size;
    float *gn = malloc(nlog * 4), *ge = malloc(nlog * 4);
    CHECK(sl_model_logits(&n, 0, B * T, gn) == 0 && sl_model_logits(&e, 0, B * T, ge) == 0);
    double logit_rel = rel_max(gn, ge, nlog);
    CHECK(sl_model_backward(&n, 1.0f) == 0 && sl_model_backward(&e, 1.0f) == 0);
    double worst = 0;
    const char *where = "";
    for (int t = 0; t < n.layout.n_tensors; t++) {
        const sl_tensor_info *ti = &n.layout.tensors[t];
        double r = rel_max(n.grads + ti->offset, e.grads + ti->offset, ti->numel);
        if (r > worst) { worst = r; where = ti->name; }
    }
    double rel_e = fabs((double)ln - le) / fabs((double)le), rel_f = fabs((double)ln - lf) / fabs((double)lf);
    printf("  %s: loss native %.6f emulation %.6f (rel %.2e) fp32 %.6f (rel %.2e); logits %.2e; gradients %.2e (%s)\n",
           preset, ln, le, rel_e, lf, rel_f, logit_rel, worst, where);
    CHECK_MSG(rel_e < 2e-3, "%s loss vs emulation %.3g", preset, rel_e);
    CHECK_MSG(rel_f < 2e-2, "%s loss vs fp32 %.3g", preset, rel_f);
    CHECK_MSG(logit_rel < 5e-2, "%s logits vs emulation %.3g", preset, logit_rel);
    CHECK_MSG(worst < 1e-1, "%s gradient %s vs emulation %.3g", preset, where, worst);
    CHECK(n.act_elem == 2 && n.act_bytes == e.act_bytes);
    // run to run: the same bits
    float *g1 = f32_copy(n.grads, n.layout.total), l2 = 0;
    n.ops->memzero(n.grads, n.layout.total * sizeof(float));
    CHECK(sl_model_forward(&n, in, tg, B, T, &l2) == 0 && sl_model_backward(&n, 1.0f) == 0);
    CHECK(l2 == ln && !memcmp(g1, n.grads, n.layout.total * sizeof(float)));
    free(gn); free(ge); free(g1);
    sl_model_free(&n);
    sl_model_free(&e);
    sl_model_free(&f);
}

TEST(gpt2_tiny_native_bf16_tracks_the_emulation) { check_model("gpt2-tiny"); }
TEST(llama_tiny_native_bf16_tracks_the_emulation) { check_model("llama-tiny"); }

TEST_MAIN()
