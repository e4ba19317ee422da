// test_bf16_storage.c: bf16 activation storage (ops.h act_bf16) through the CPU's emulating table
// sl_ops_cpu_bf16:
//   * each op equals sl_ops_cpu's op applied to the bf16 inputs widened, its outputs rounded to bf16
//     (bit for bit; fp32 outputs such as parameter gradients and statistics unrounded);
//   * gpt2-tiny and llama-tiny with bf16 activations give the fp32 model's loss within 2e-2 relative
//     and its gradients within a measured bound;
//   * the activation arena takes about half the bytes of the fp32 one;
//   * the bf16 weight shadow equals bf16(params) bit for bit after sl_model_params_changed, and an
//     fp32 model has none.
#include "test.h"

#include "shardlm/engine.h"
#include "shardlm/model.h"
#include "shardlm/ops.h"
#include "shardlm/rope.h"
#include "shardlm/settings.h"
#include "shardlm/error.h"
#include "shardlm/precision.h"
#include "shardlm/rng.h"

static const sl_ops *const ref = &sl_ops_cpu, *const emu = &sl_ops_cpu_bf16;

// n bf16-representable values uniform in [-scale, scale), as floats.
static float *values(size_t n, uint64_t seed, float scale) {
    float *x = malloc(n * sizeof(float));
    sl_rng r = sl_rng_make(seed, 0, 0, SL_RNG_TEST);
    for (size_t i = 0; i < n; i++) x[i] = sl_round_to_bf16(scale * (2.0f * sl_rng_normal(&r) / 6.0f));
    return x;
}

// The same values as bf16 storage, typed as the ops' float pointers.
static float *storage(const float *x, size_t n) {
    sl_bf16 *s = malloc(n * sizeof(sl_bf16));
    sl_f32_to_bf16_array(x, s, n);
    return (float *)(void *)s;
}

// Storage s equals fp32 x rounded to bf16, element for element.
static int same_storage(const float *s, const float *x, size_t n) {
    const sl_bf16 *b = (const sl_bf16 *)(const void *)s;
    for (size_t i = 0; i < n; i++)
        if (b[i] != sl_f32_to_bf16(x[i])) return 0;
    return 1;
}

static int same_f32(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

TEST(tables_declare_their_storage) {
    CHECK(sl_ops_cpu.act_bf16 == 0);
    CHECK(sl_ops_cpu_bf16.act_bf16 == 1);
    CHECK(sl_ops_cpu_bf16.on_device == 0);
    unsetenv("SHARDLM_EMULATE_BF16_STORAGE");
    CHECK(sl_settings_load() == 0);  // the environment is read once; again after changing it
    CHECK(sl_ops_for_device("cpu", 0) == &sl_ops_cpu);
    setenv("SHARDLM_EMULATE_BF16_STORAGE", "1", 1);
    CHECK(sl_settings_load() == 0);
    CHECK(sl_ops_for_device("cpu", 0) == &sl_ops_cpu_bf16);
    setenv("SHARDLM_EMULATE_BF16_STORAGE", "yes", 1);  // malformed: an error naming it, the default kept
    CHECK(sl_settings_load() == -1 && strstr(sl_error(), "SHARDLM_EMULATE_BF16_STORAGE") != NULL);
    CHECK(sl_ops_for_device("cpu", 0) == &sl_ops_cpu);
    unsetenv("SHARDLM_EMULATE_BF16_STORAGE");
    CHECK(sl_settings_load() == 0);
}

TEST(to_storage_rounds_to_nearest_even) {
    float x[6] = {1.0f, 1.00390625f, 1.01171875f, -3.3f, INFINITY, NAN};  // ties at 1 + 2^-8 and 1 + 3*2^-8
    sl_bf16 got[6];
    sl_ops_cpu.to_storage(got, x, 6);
    for (int i = 0; i < 6; i++) CHECK_MSG(got[i] == sl_f32_to_bf16(x[i]), "element %d: %04x", i, got[i]);
    CHECK(got[1] == 0x3F80 && got[2] == 0x3F82);
}

TEST(matmul_ops_equal_fp32_on_rounded_inputs) {
    int N = 24, IC = 40, OC = 36;
    float *inp = values((size_t)N * IC, 1, 1.0f), *w = values((size_t)OC * IC, 2, 0.2f), *b = values(OC, 3, 0.1f);
    float *dout = values((size_t)N * OC, 4, 0.5f);
    float *s_inp = storage(inp, (size_t)N * IC), *s_w = storage(w, (size_t)OC * IC), *s_dout = storage(dout, (size_t)N * OC);
    float *s_b = storage(b, OC);  // the bias comes from the bf16 shadow too
    float *out = calloc((size_t)N * OC, 4), *s_out = calloc((size_t)N * OC, 2);
    ref->matmul_forward(ACT(out), ACT(inp), ACT(w), ACT(b), N, IC, OC);
    emu->matmul_forward(ACT(s_out), ACT(s_inp), ACT(s_w), ACT(s_b), N, IC, OC);
    CHECK(same_storage(s_out, out, (size_t)N * OC));
    // backward: dinp storage, dweight / dbias fp32 accumulating from the same start
    float *dinp = calloc((size_t)N * IC, 4), *s_dinp = calloc((size_t)N * IC, 2);
    float *dw = values((size_t)OC * IC, 5, 0.1f), *dw2 = malloc((size_t)OC * IC * 4), *db = calloc(OC, 4), *db2 = calloc(OC, 4);
    memcpy(dw2, dw, (size_t)OC * IC * 4);
    ref->matmul_backward(ACT(dinp), dw, db, ACT(dout), ACT(inp), ACT(w), N, IC, OC);
    emu->matmul_backward(ACT(s_dinp), dw2, db2, ACT(s_dout), ACT(s_inp), ACT(s_w), N, IC, OC);
    CHECK(same_storage(s_dinp, dinp, (size_t)N * IC));
    CHECK(same_f32(dw, dw2, (size_t)OC * IC) && same_f32(db, db2, OC));
    // fused GEMM + GELU: pre and out storage; backward overwrites dout (storage) with dpre
    float *pre = calloc((size_t)N * OC, 4), *s_pre = calloc((size_t)N * OC, 2);
    ref->matmul_gelu_forward(ACT(out), ACT(pre), ACT(inp), ACT(w), ACT(b), N, IC, OC);
    emu->matmul_gelu_forward(ACT(s_out), ACT(s_pre), ACT(s_inp), ACT(s_w), ACT(s_b), N, IC, OC);
    CHECK(same_storage(s_out, out, (size_t)N * OC) && same_storage(s_pre, pre, (size_t)N * OC));
    float *pre_r = malloc((size_t)N * OC * 4);  // what backward reads: pre as stored
    sl_bf16_to_f32_array((const sl_bf16 *)(const void *)s_pre, pre_r, (size_t)N * OC);
    // dpre is stored (rounded) before the GEMMs and the bias gradient read it, as on the GPU
    ref->gelu_backward(ACT(dout), ACT(pre_r), ACT(dout), (size_t)N * OC);
    for (size_t k = 0; k < (size_t)N * OC; k++) dout[k] = sl_round_to_bf16(dout[k]);
    ref->matmul_backward(ACT(dinp), dw, db, ACT(dout), ACT(inp), ACT(w), N, IC, OC);
    emu->matmul_gelu_backward(ACT(s_dinp), dw2, db2, ACT(s_dout), ACT(s_pre), ACT(s_inp), ACT(s_w), N, IC, OC);
    CHECK(same_storage(s_dinp, dinp, (size_t)N * IC) && same_storage(s_dout, dout, (size_t)N * OC));
    CHECK(same_f32(dw, dw2, (size_t)OC * IC) && same_f32(db, db2, OC));
    free(inp); free(w); free(b); free(s_b); free(dout); free(s_inp); free(s_w); free(s_dout); free(out); free(s_out);
    free(dinp); free(s_dinp); free(dw); free(dw2); free(db); free(db2); free(pre); free(s_pre); free(pre_r);
}

TEST(norm_ops_equal_fp32_on_rounded_inputs) {
    int N = 12, C = 48;
    size_t n = (size_t)N * C;
    float *a = values(n, 11, 2.0f), *b = values(n, 12, 1.0f), *w = values(C, 13, 1.0f), *bias = values(C, 14, 0.3f);
    float *s_a = storage(a, n), *s_b = storage(b, n);
    float *s_w = storage(w, C), *s_bias = storage(bias, C);  // the norm's parameters: the bf16 shadow
    float mean[12], rstd[12], mean2[12], rstd2[12];
    float *resid = malloc(n * 4), *out = malloc(n * 4), *s_out = malloc(n * 2);
    // fused residual + layernorm, in place on a (resid == a) as the model calls it: the norm reads
    // the sum as stored, rounded to bf16
    float *x = malloc(n * 4);  // the stored resid, widened: what the norm and backward read
    ref->residual_forward(ACT(resid), ACT(a), ACT(b), n);
    for (size_t i = 0; i < n; i++) x[i] = sl_round_to_bf16(resid[i]);
    ref->layernorm_forward(ACT(out), mean, rstd, ACT(x), ACT(w), ACT(bias), N, C, 1e-5f);
    emu->residual_layernorm_forward(ACT(s_a), ACT(s_out), mean2, rstd2, ACT(s_a), ACT(s_b), ACT(s_w), ACT(s_bias), N, C, 1e-5f);
    CHECK(same_storage(s_a, resid, n) && same_storage(s_out, out, n));
    CHECK(same_f32(mean, mean2, N) && same_f32(rstd, rstd2, N));
    // layernorm backward ACCUMULATES into the storage-typed dinp
    ref->layernorm_forward(ACT(out), mean, rstd, ACT(x), ACT(w), ACT(bias), N, C, 1e-5f);
    emu->layernorm_forward(ACT(s_out), mean2, rstd2, ACT(s_a), ACT(s_w), ACT(s_bias), N, C, 1e-5f);
    CHECK(same_storage(s_out, out, n) && same_f32(rstd, rstd2, N));
    float *dout = values(n, 15, 0.5f), *s_dout = storage(dout, n), *dinp = values(n, 16, 0.5f), *s_dinp = storage(dinp, n);
    float *dw = calloc(C, 4), *db = calloc(C, 4), *dw2 = calloc(C, 4), *db2 = calloc(C, 4);
    ref->layernorm_backward(ACT(dinp), dw, db, ACT(dout), ACT(x), ACT(w), mean, rstd, N, C);
    emu->layernorm_backward(ACT(s_dinp), dw2, db2, ACT(s_dout), ACT(s_a), ACT(s_w), mean, rstd, N, C);
    CHECK(same_storage(s_dinp, dinp, n) && same_f32(dw, dw2, C) && same_f32(db, db2, C));
    sl_bf16_to_f32_array((const sl_bf16 *)(const void *)s_dinp, dinp, n);  // accumulate onward from the stored one
    // rmsnorm forward / backward
    ref->rmsnorm_forward(ACT(out), rstd, ACT(x), ACT(w), N, C, 1e-6f);
    emu->rmsnorm_forward(ACT(s_out), rstd2, ACT(s_a), ACT(s_w), N, C, 1e-6f);
    CHECK(same_storage(s_out, out, n) && same_f32(rstd, rstd2, N));
    ref->rmsnorm_backward(ACT(dinp), dw, ACT(dout), ACT(x), ACT(w), rstd, N, C);
    emu->rmsnorm_backward(ACT(s_dinp), dw2, ACT(s_dout), ACT(s_a), ACT(s_w), rstd, N, C);
    CHECK(same_storage(s_dinp, dinp, n) && same_f32(dw, dw2, C));
    // fused residual + rmsnorm, out of place: resid stored first, the norm reads it back
    float *s_a2 = storage(a, n), *s_resid = malloc(n * 2);
    ref->residual_forward(ACT(resid), ACT(a), ACT(b), n);
    for (size_t i = 0; i < n; i++) x[i] = sl_round_to_bf16(resid[i]);
    ref->rmsnorm_forward(ACT(out), rstd, ACT(x), ACT(w), N, C, 1e-6f);
    emu->residual_rmsnorm_forward(ACT(s_resid), ACT(s_out), rstd2, ACT(s_a2), ACT(s_b), ACT(s_w), N, C, 1e-6f);
    CHECK(same_storage(s_resid, resid, n) && same_storage(s_out, out, n) && same_f32(rstd, rstd2, N));
    free(s_a2); free(s_resid); free(s_w); free(s_bias);
    free(a); free(b); free(w); free(bias); free(s_a); free(s_b); free(resid); free(out); free(s_out); free(x);
    free(dout); free(s_dout); free(dinp); free(s_dinp); free(dw); free(db); free(dw2); free(db2);
}

TEST(attention_rope_and_activations_equal_fp32_on_rounded_inputs) {
    int B = 2, T = 8, NH = 4, NKV = 2, HD = 8, I = 20;
    size_t nq = (size_t)B * T * (NH + 2 * NKV) * HD, no = (size_t)B * T * NH * HD;
    float *qkv = values(nq, 21, 1.0f), *s_qkv = storage(qkv, nq);
    float cos[8 * 4], sin[8 * 4];
    sl_rope_tables(cos, sin, T, HD, 10000.0f);
    ref->rope_forward(ACT(qkv), cos, sin, B, T, NH, NKV, HD, 0);
    emu->rope_forward(ACT(s_qkv), cos, sin, B, T, NH, NKV, HD, 0);
    CHECK(same_storage(s_qkv, qkv, nq));
    sl_bf16_to_f32_array((const sl_bf16 *)(const void *)s_qkv, qkv, nq);  // as stored
    float *out = malloc(no * 4), *s_out = malloc(no * 2), lse[2 * 4 * 8], lse2[2 * 4 * 8];
    ref->attention_forward(ACT(out), lse, ACT(qkv), B, T, NH, NKV, HD, 0);
    emu->attention_forward(ACT(s_out), lse2, ACT(s_qkv), B, T, NH, NKV, HD, 0);
    CHECK(same_storage(s_out, out, no) && same_f32(lse, lse2, (size_t)B * NH * T));
    sl_bf16_to_f32_array((const sl_bf16 *)(const void *)s_out, out, no);
    float *dout = values(no, 22, 0.5f), *s_dout = storage(dout, no), *dqkv = malloc(nq * 4), *s_dqkv = malloc(nq * 2);
    ref->attention_backward(ACT(dqkv), ACT(dout), ACT(qkv), ACT(out), lse, B, T, NH, NKV, HD, 0);
    emu->attention_backward(ACT(s_dqkv), ACT(s_dout), ACT(s_qkv), ACT(s_out), lse, B, T, NH, NKV, HD, 0);
    CHECK(same_storage(s_dqkv, dqkv, nq));
    // SwiGLU and GELU
    size_t ni = (size_t)B * T * I;
    float *g = values(2 * ni, 23, 2.0f), *s_g = storage(g, 2 * ni), *h = malloc(ni * 4), *s_h = malloc(ni * 2);
    ref->swiglu_forward(ACT(h), ACT(g), B * T, I);
    emu->swiglu_forward(ACT(s_h), ACT(s_g), B * T, I);
    CHECK(same_storage(s_h, h, ni));
    float *dg = malloc(2 * ni * 4), *s_dg = malloc(2 * ni * 2), *dh = values(ni, 24, 1.0f), *s_dh = storage(dh, ni);
    ref->swiglu_backward(ACT(dg), ACT(g), ACT(dh), B * T, I);
    emu->swiglu_backward(ACT(s_dg), ACT(s_g), ACT(s_dh), B * T, I);
    CHECK(same_storage(s_dg, dg, 2 * ni));
    ref->gelu_forward(ACT(h), ACT(g), ni);
    emu->gelu_forward(ACT(s_h), ACT(s_g), ni);
    CHECK(same_storage(s_h, h, ni));
    free(qkv); free(s_qkv); free(out); free(s_out); free(dout); free(s_dout); free(dqkv); free(s_dqkv);
    free(g); free(s_g); free(h); free(s_h); free(dg); free(s_dg); free(dh); free(s_dh);
}

TEST(lora_ops_equal_fp32_on_rounded_inputs) {
    int N = 6, W = 5, ld = 12, col0 = 4;
    size_t nw = (size_t)N * W, nl = (size_t)N * ld;
    float *x = values(nw, 31, 1.0f), *s_x = storage(x, nw), *y = values(nl, 32, 1.0f), *s_y = storage(y, nl);
    ref->add_columns(ACT(y), ACT(x), 0.5f, N, W, ld, col0);
    emu->add_columns(ACT(s_y), ACT(s_x), 0.5f, N, W, ld, col0);
    CHECK(same_storage(s_y, y, nl));
    sl_bf16_to_f32_array((const sl_bf16 *)(const void *)s_y, y, nl);
    ref->take_columns(ACT(x), ACT(y), 2.0f, N, W, ld, col0);
    emu->take_columns(ACT(s_x), ACT(s_y), 2.0f, N, W, ld, col0);
    CHECK(same_storage(s_x, x, nw));
    float *d = malloc(nl * 4), *s_d = malloc(nl * 2);
    ref->dropout_forward(ACT(d), ACT(y), nl, 0.3f, 5);
    emu->dropout_forward(ACT(s_d), ACT(s_y), nl, 0.3f, 5);
    CHECK(same_storage(s_d, d, nl));
    ref->dropout_backward(ACT(d), ACT(y), nl, 0.3f, 5);
    emu->dropout_backward(ACT(s_d), ACT(s_y), nl, 0.3f, 5);
    CHECK(same_storage(s_d, d, nl));
    free(x); free(s_x); free(y); free(s_y); free(d); free(s_d);
}

TEST(encoder_and_crossentropy_equal_fp32_on_rounded_inputs) {
    int B = 2, T = 4, C = 16, V = 30, Vp = 32, N = B * T;
    float *wte = values((size_t)V * C, 31, 0.1f), *wpe = values((size_t)T * C, 32, 0.1f);
    int inp[8] = {1, 5, 7, 29, 0, 3, 3, 12}, tg[8] = {5, 7, -1, 2, 3, 3, 12, 0};
    float *out = malloc((size_t)N * C * 4), *s_out = malloc((size_t)N * C * 2);
    float *s_wte = storage(wte, (size_t)V * C), *s_wpe = storage(wpe, (size_t)T * C);  // the bf16 shadow
    ref->encoder_forward(ACT(out), inp, ACT(wte), ACT(wpe), B, T, C);
    emu->encoder_forward(ACT(s_out), inp, ACT(s_wte), ACT(s_wpe), B, T, C);
    CHECK(same_storage(s_out, out, (size_t)N * C));
    ref->encoder_forward(ACT(out), inp, ACT(wte), NULL, B, T, C);  // LLaMA: no wpe
    emu->encoder_forward(ACT(s_out), inp, ACT(s_wte), NULL, B, T, C);
    CHECK(same_storage(s_out, out, (size_t)N * C));
    free(s_wte);
    free(s_wpe);
    float *dwte = calloc((size_t)V * C, 4), *dwte2 = calloc((size_t)V * C, 4), *dout = values((size_t)N * C, 33, 1.0f);
    float *s_dout = storage(dout, (size_t)N * C);
    ref->encoder_backward(dwte, NULL, ACT(dout), inp, B, T, C);
    emu->encoder_backward(dwte2, NULL, ACT(s_dout), inp, B, T, C);
    CHECK(same_f32(dwte, dwte2, (size_t)V * C));
    float *logits = values((size_t)N * Vp, 34, 4.0f), *s_logits = storage(logits, (size_t)N * Vp), lse[8], lse2[8];
    float *s_fused = storage(logits, (size_t)N * Vp), lse3[8];
    double l3 = emu->crossentropy_fused(lse3, ACT(s_fused), tg, N, V, Vp, 0.25f);  // forward + backward in one
    double l1 = ref->crossentropy_forward(lse, ACT(logits), tg, N, V, Vp);
    double l2 = emu->crossentropy_forward(lse2, ACT(s_logits), tg, N, V, Vp);
    CHECK(l1 == l2 && same_f32(lse, lse2, N));
    ref->crossentropy_backward(ACT(logits), lse, tg, N, V, Vp, 0.25f);
    emu->crossentropy_backward(ACT(s_logits), lse2, tg, N, V, Vp, 0.25f);  // dlogits in place, rounded
    CHECK(same_storage(s_logits, logits, (size_t)N * Vp));
    CHECK(l3 == l2 && same_f32(lse3, lse2, N) && same_storage(s_fused, logits, (size_t)N * Vp));
    free(s_fused);
    free(wte); free(wpe); free(out); free(s_out); free(dwte); free(dwte2); free(dout); free(s_dout); free(logits);
    free(s_logits);
}

// The bf16 weight shadow is bf16(params), bit for bit.
static int shadow_matches(const sl_model *m) {
    for (size_t i = 0; i < m->layout.total; i++)
        if (m->weights_bf16[i] != sl_f32_to_bf16(m->params[i])) return 0;
    return 1;
}

TEST(weight_shadow_follows_the_parameters) {
    sl_model_config cfg;
    CHECK(sl_config_preset(&cfg, "gpt2-tiny") == 0);
    sl_model f, b;
    CHECK(sl_model_create(&f, &cfg, &sl_ops_cpu) == 0 && sl_model_create(&b, &cfg, &sl_ops_cpu_bf16) == 0);
    CHECK(f.weights_bf16 == NULL && sl_model_params_changed(&f) == 0);  // fp32: nothing
    CHECK(sl_model_init_weights(&b, 5) == 0 && shadow_matches(&b));
    for (size_t i = 0; i < b.layout.total; i++) b.params[i] = b.params[i] * 1.37f + 1e-3f;
    CHECK(!shadow_matches(&b));
    CHECK(sl_model_params_changed(&b) == 0 && shadow_matches(&b));
    sl_model_free(&f);
    sl_model_free(&b);
}

// bf16 training through the engine: AdamW writes the shadow in its own pass (the model's buffer is the
// master), SGD through a to_storage pass after the step: either way the shadow is bf16(params) after
// every step, and AdamW's shadow was written (most of it moved from its first value).
TEST(engine_steps_keep_the_shadow) {
    for (int sgd = 0; sgd < 2; sgd++) {
        sl_model_config cfg;
        CHECK(sl_config_preset(&cfg, "gpt2-tiny") == 0);
        sl_model b;
        sl_engine e;
        CHECK(sl_model_create(&b, &cfg, &sl_ops_cpu_bf16) == 0 && sl_model_init_weights(&b, 5) == 0);
        sl_engine_config ec = {.micro_batch = 2, .grad_accum_steps = 1, .gradient_clipping = 0.05f};
        sl_optim_defaults(&ec.optim);
        ec.optim.type = sgd ? SL_OPTIM_SGD : SL_OPTIM_ADAMW;
        ec.optim.lr = 1e-2;
        sl_schedule_constant(&ec.schedule, ec.optim.lr);
        sl_loss_scaler_defaults(&ec.precision);
        ec.precision.precision = SL_PRECISION_BF16;
        CHECK(sl_engine_init(&e, &b, &ec) == 0 && e.master == NULL);
        sl_bf16 *first = malloc(b.layout.total * sizeof(sl_bf16));
        CHECK(first != NULL);
        if (!first) return;
        memcpy(first, b.weights_bf16, b.layout.total * sizeof(sl_bf16));
        int in[32], tg[32];
        for (int i = 0; i < 32; i++) { in[i] = (i * 37 + 11) % cfg.vocab_size; tg[i] = (i * 53 + 5) % cfg.vocab_size; }
        for (int s = 0; s < 3; s++) {
            CHECK(sl_engine_forward_backward(&e, in, tg, 2, 16, NULL) == 0 && sl_engine_step(&e) == 0);
            CHECK_MSG(shadow_matches(&b), "%s step %d: the bf16 shadow is not bf16(params)", sgd ? "SGD" : "AdamW",
                      s + 1);
        }
        size_t moved = 0;
        for (size_t i = 0; i < b.layout.total; i++) moved += b.weights_bf16[i] != first[i];
        CHECK_MSG(sgd || moved > b.layout.total / 4, "AdamW moved %zu of %zu bf16 weights", moved, b.layout.total);
        free(first);
        sl_engine_free(&e);
        sl_model_free(&b);
    }
}

// Relative L2 distance of a from b.
static double rel_l2(const float *a, const float *b, size_t n) {
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        s += (double)b[i] * b[i];
    }
    return sqrt(d / (s > 0 ? s : 1));
}

// The same weights and batch through fp32 and bf16 activation storage.
static void check_model(const char *preset, double grad_bound) {
    sl_model_config cfg;
    CHECK(sl_config_preset(&cfg, preset) == 0);
    sl_model f, b;
    CHECK(sl_model_create(&f, &cfg, &sl_ops_cpu) == 0 && sl_model_create(&b, &cfg, &sl_ops_cpu_bf16) == 0);
    CHECK(sl_model_init_weights(&f, 9) == 0 && sl_model_init_weights(&b, 9) == 0);
    int B = 4, T = 32, in[128], tg[128];
    for (int i = 0; i < B * T; i++) { in[i] = (i * 37 + 11) % cfg.vocab_size; tg[i] = (i * 53 + 5) % cfg.vocab_size; }
    float lf = 0, lb = 0;
    CHECK(sl_model_forward(&f, in, tg, B, T, &lf) == 0 && sl_model_forward(&b, in, tg, B, T, &lb) == 0);
    CHECK(sl_model_backward(&f, 1.0f) == 0 && sl_model_backward(&b, 1.0f) == 0);
    double loss_rel = fabs((double)lb - lf) / fabs((double)lf), g_rel = rel_l2(b.grads, f.grads, f.layout.total);
    double ratio = (double)b.act_bytes / (double)f.act_bytes;
    printf("  %s: loss fp32 %.6f bf16 %.6f (rel %.2e); gradients rel L2 %.2e; activation arena %zu -> %zu bytes "
           "(%.3f)\n", preset, lf, lb, loss_rel, g_rel, f.act_bytes, b.act_bytes, ratio);
    CHECK_MSG(loss_rel < 2e-2, "%s loss rel %.3g", preset, loss_rel);
    CHECK_MSG(g_rel < grad_bound, "%s gradient rel L2 %.3g >= %.3g", preset, g_rel, grad_bound);
    CHECK(lb != lf);  // the storage is really bf16
    CHECK(f.act_elem == 4 && b.act_elem == 2);
    CHECK_MSG(ratio > 0.45 && ratio < 0.55, "%s arena ratio %.3f", preset, ratio);
    sl_model_free(&f);
    sl_model_free(&b);
}

TEST(gpt2_tiny_bf16_storage_tracks_fp32) { check_model("gpt2-tiny", 2e-2); }
TEST(llama_tiny_bf16_storage_tracks_fp32) { check_model("llama-tiny", 2e-2); }

TEST_MAIN()
