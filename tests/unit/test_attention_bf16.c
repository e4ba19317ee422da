// test_attention_bf16.c: the bf16 table's attention on oneDNN's bf16 matmuls (src/ops/cpu/attention_bf16.c)
// against the fp32 CPU attention on the same values widened, at T = 1 (one key), 7, 33, 200 and 300 (one
// and several query blocks of 128, the last one partial), head sizes 16 to 80, multi-head and grouped-query
// (NH 4 / NKV 2, NH 3 / NKV 1) and a sliding window. Only P and dS (and the stored results) are rounded to
// bf16, every product sums in fp32: the output within 1e-2 of its largest element, the log-sum-exp within
// 1e-4, each of dq, dk and dv within 3e-2 of its largest; the same bits run to run and on 1 thread as on
// all of them, and the table's entries run these kernels by default and the staged fp32 attention with
// SHARDLM_ATTENTION=simt.
#include "test.h"

#include <omp.h>

#include "ops/cpu/cpu_bf16.h"
#include "shardlm/error.h"
#include "shardlm/rng.h"
#include "shardlm/settings.h"
#include "shardlm/attention_choice.h"

static sl_bf16 *bf16_values(size_t n, uint64_t seed, float scale) {
    sl_bf16 *x = malloc(n * sizeof(sl_bf16));
    sl_rng r = sl_rng_make(seed, 0, 0, SL_RNG_TEST);
    for (size_t i = 0; i < n; i++) x[i] = sl_f32_to_bf16(scale * (float)sl_rng_normal(&r));
    return x;
}

static float *widened(const sl_bf16 *x, size_t n) {
    float *y = malloc(n * sizeof(float));
    sl_bf16_to_f32_array(x, y, n);
    return y;
}

// max |a - b| over max |b| of n values read every `stride` elements in runs of `run` (one head's columns)
static double rel_max(const float *a, const float *b, size_t rows, size_t stride, size_t col0, size_t run) {
    double d = 0, m = 0;
    for (size_t r = 0; r < rows; r++)
        for (size_t c = col0; c < col0 + run; c++) {
            d = fmax(d, fabs((double)a[r * stride + c] - b[r * stride + c]));
            m = fmax(m, fabs((double)b[r * stride + c]));
        }
    return m > 0 ? d / m : d;
}

static void check(int B, int T, int NH, int NKV, int HD, int window) {
    int W = (NH + 2 * NKV) * HD, os = NH * HD;
    size_t nq = (size_t)B * T * W, no = (size_t)B * T * os, nl = (size_t)B * NH * T;
    sl_bf16 *qkv = bf16_values(nq, 1 + (uint64_t)T, 1.5f), *dout = bf16_values(no, 2 + (uint64_t)T, 0.5f);
    sl_bf16 *out = calloc(no, 2), *out2 = calloc(no, 2), *dqkv = calloc(nq, 2), *dqkv2 = calloc(nq, 2);
    float *lse = malloc(nl * 4), *lse2 = malloc(nl * 4), *rlse = malloc(nl * 4);
    float *rqkv = widened(qkv, nq), *rdout = widened(dout, no), *rout = calloc(no, 4), *rd = calloc(nq, 4);
    cpu_bf16_attention_forward(ACT((void *)out), lse, ACT((void *)qkv), B, T, NH, NKV, HD, window);
    cpu_bf16_attention_backward(ACT((void *)dqkv), ACT((void *)dout), ACT((void *)qkv), ACT((void *)out), lse, B, T, NH,
                                NKV, HD, window);
    CHECK(!cpu_bf16_failed());
    sl_ops_cpu.attention_forward(ACT(rout), rlse, ACT(rqkv), B, T, NH, NKV, HD, window);
    sl_ops_cpu.attention_backward(ACT(rd), ACT(rdout), ACT(rqkv), ACT(rout), rlse, B, T, NH, NKV, HD, window);
    float *o = widened(out, no), *d = widened(dqkv, nq);
    double eo = rel_max(o, rout, (size_t)B * T, os, 0, os), el = 0;
    for (size_t i = 0; i < nl; i++) el = fmax(el, fabs((double)lse[i] - rlse[i]));
    double eq = rel_max(d, rd, (size_t)B * T, W, 0, os), ek = rel_max(d, rd, (size_t)B * T, W, os, (size_t)NKV * HD),
           ev = rel_max(d, rd, (size_t)B * T, W, os + (size_t)NKV * HD, (size_t)NKV * HD);
    printf("  B %d T %d NH %d NKV %d HD %d window %d: out %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n", B, T, NH, NKV, HD,
           window, eo, el, eq, ek, ev);
    CHECK_MSG(eo < 1e-2 && el < 1e-4, "T %d HD %d: out %.3g lse %.3g", T, HD, eo, el);
    CHECK_MSG(eq < 3e-2 && ek < 3e-2 && ev < 3e-2, "T %d HD %d: dq %.3g dk %.3g dv %.3g", T, HD, eq, ek, ev);
    // run to run, and through the table's entries (the default setting picks these kernels)
    sl_ops_cpu_bf16_native.attention_forward(ACT((void *)out2), lse2, ACT((void *)qkv), B, T, NH, NKV, HD, window);
    sl_ops_cpu_bf16_native.attention_backward(ACT((void *)dqkv2), ACT((void *)dout), ACT((void *)qkv),
                                              ACT((void *)out2), lse2, B, T, NH, NKV, HD, window);
    CHECK(!memcmp(out, out2, no * 2) && !memcmp(lse, lse2, nl * 4) && !memcmp(dqkv, dqkv2, nq * 2));
    // and on one thread: each (batch, head) is one thread's, every product on that thread alone
    int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    memset(out2, 0, no * 2);
    memset(dqkv2, 0, nq * 2);
    cpu_bf16_attention_forward(ACT((void *)out2), lse2, ACT((void *)qkv), B, T, NH, NKV, HD, window);
    cpu_bf16_attention_backward(ACT((void *)dqkv2), ACT((void *)dout), ACT((void *)qkv), ACT((void *)out2), lse2, B, T,
                                NH, NKV, HD, window);
    omp_set_num_threads(threads);
    CHECK_MSG(!memcmp(out, out2, no * 2) && !memcmp(lse, lse2, nl * 4) && !memcmp(dqkv, dqkv2, nq * 2),
              "T %d: 1 thread against %d", T, threads);
    CHECK(sl_ops_cpu_bf16_native.synchronize() == 0);
    free(qkv); free(dout); free(out); free(out2); free(dqkv); free(dqkv2); free(lse); free(lse2); free(rlse);
    free(rqkv); free(rdout); free(rout); free(rd); free(o); free(d);
}

TEST(one_and_few_positions) {
    check(2, 1, 4, 2, 16, 0);
    check(2, 7, 4, 4, 16, 0);
    check(1, 33, 3, 1, 64, 0);
}

TEST(several_query_blocks_grouped_query) {
    check(2, 200, 4, 2, 64, 0);
    check(1, 300, 2, 1, 80, 0);
}

TEST(sliding_window_across_blocks) {
    check(1, 300, 2, 2, 32, 50);
    check(2, 150, 4, 2, 16, 129);
}

TEST(simt_setting_keeps_the_staged_attention) {
    int B = 1, T = 20, NH = 2, NKV = 1, HD = 16, W = (NH + 2 * NKV) * HD;
    size_t nq = (size_t)B * T * W, no = (size_t)B * T * NH * HD;
    sl_bf16 *qkv = bf16_values(nq, 7, 1.0f), *a = calloc(no, 2), *b = calloc(no, 2);
    float lse_a[40], lse_b[40];
    setenv("SHARDLM_ATTENTION", "simt", 1);
    CHECK(sl_settings_load() == 0);
    sl_ops_cpu_bf16_native.attention_forward(ACT((void *)a), lse_a, ACT((void *)qkv), B, T, NH, NKV, HD, 0);
    sl_ops_cpu_bf16.attention_forward(ACT((void *)b), lse_b, ACT((void *)qkv), B, T, NH, NKV, HD, 0);
    CHECK(!memcmp(a, b, no * 2) && !memcmp(lse_a, lse_b, sizeof lse_a));
    unsetenv("SHARDLM_ATTENTION");
    CHECK(sl_settings_load() == 0);
    free(qkv); free(a); free(b);
}

// SHARDLM_ATTENTION takes auto (the default: cuDNN's fused attention in training on the GPU, the
// mma.sync kernels elsewhere; on the CPU the oneDNN kernels as with tc), mma, tc, simt and cudnn (the
// GPU's cuDNN path; on the CPU as tc); anything else is refused with a message naming the variable and
// the choices.
TEST(attention_setting_words) {
    static const struct { const char *word; int value; } words[] = {
        {"tc", SL_ATTENTION_TC}, {"simt", SL_ATTENTION_SIMT}, {"mma", SL_ATTENTION_MMA},
        {"cudnn", SL_ATTENTION_CUDNN}, {"auto", SL_ATTENTION_AUTO}};
    for (int i = 0; i < 5; i++) {
        setenv("SHARDLM_ATTENTION", words[i].word, 1);
        CHECK(sl_settings_load() == 0);
        CHECK_MSG(sl_settings_get()->attention == words[i].value, "%s gave %d", words[i].word,
                  sl_settings_get()->attention);
        CHECK(!strcmp(sl_attention_name(words[i].value), words[i].word));
    }
    setenv("SHARDLM_ATTENTION", "flash", 1);
    CHECK(sl_settings_load() != 0);
    CHECK_MSG(strstr(sl_error(), "SHARDLM_ATTENTION") && strstr(sl_error(), "auto, mma, cudnn, tc or simt"),
              "message: %s", sl_error());
    unsetenv("SHARDLM_ATTENTION");
    CHECK(sl_settings_load() == 0);
    CHECK(sl_settings_get()->attention == SL_ATTENTION_AUTO);
}

// auto resolves to cudnn while a training engine lives (counted: nested engines), to mma otherwise and
// for good once the cuDNN path said it cannot serve the process; a named choice is itself throughout.
TEST(attention_auto_resolves) {
    unsetenv("SHARDLM_ATTENTION");
    CHECK(sl_settings_load() == 0);
    CHECK(sl_attention_kind() == SL_ATTENTION_MMA);     // generation: no engine
    sl_attention_training(1);
    CHECK(sl_attention_kind() == SL_ATTENTION_CUDNN);   // training
    sl_attention_training(1);
    sl_attention_training(0);
    CHECK(sl_attention_kind() == SL_ATTENTION_CUDNN);   // one engine of two ended
    setenv("SHARDLM_ATTENTION", "mma", 1);
    CHECK(sl_settings_load() == 0);
    CHECK(sl_attention_kind() == SL_ATTENTION_MMA);     // named: itself
    unsetenv("SHARDLM_ATTENTION");
    CHECK(sl_settings_load() == 0);
    sl_attention_training(0);
    CHECK(sl_attention_kind() == SL_ATTENTION_MMA);     // both ended
    sl_attention_training(0);                           // one end too many: stays at none
    sl_attention_training(1);
    CHECK(sl_attention_kind() == SL_ATTENTION_CUDNN);
    sl_attention_cudnn_unusable();
    CHECK(sl_attention_kind() == SL_ATTENTION_MMA);     // cuDNN refused: mma from then on
    setenv("SHARDLM_ATTENTION", "cudnn", 1);
    CHECK(sl_settings_load() == 0);
    CHECK(sl_attention_kind() == SL_ATTENTION_CUDNN);   // named: itself (its failures are errors)
    unsetenv("SHARDLM_ATTENTION");
    CHECK(sl_settings_load() == 0);
    sl_attention_training(0);
    // what ran, as the benchmarks record it (the CPU's attention notes nothing: "" until a GPU call)
    CHECK(sl_attention_ran() == 0 && !strcmp(sl_attention_ran_name(), ""));
    sl_attention_note_ran(SL_ATTENTION_MMA);
    CHECK(!strcmp(sl_attention_ran_name(), "mma"));
    sl_attention_note_ran(SL_ATTENTION_CUDNN);
    sl_attention_note_ran(SL_ATTENTION_MMA);
    CHECK(!strcmp(sl_attention_ran_name(), "cudnn+mma"));
}

TEST_MAIN()
