// test_mixed_precision.c: the engine's fp16 / bf16 training on the CPU, with 16-bit storage
// emulated by rounding: fp32 master weights, rounded model parameters and gradients, loss scaling,
// overflow skips that change nothing, and the schedule counting only applied steps.
#include "test.h"
#include "shardlm/engine.h"
#include "shardlm/precision.h"
#include "shardlm/settings.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    sl_model model;
    sl_engine engine;
    int in[64], tg[64];
} rig;

static int setup(rig *r, sl_precision p, int scale_power, int hysteresis) {
    memset(r, 0, sizeof *r);
    sl_model_config cfg;
    if (sl_config_preset(&cfg, "gpt2-tiny") || sl_model_create(&r->model, &cfg, &sl_ops_cpu)) return -1;
    sl_model_init_weights(&r->model, 11);
    for (int i = 0; i < 64; i++) {
        r->in[i] = (i * 37 + 11) % cfg.vocab_size;
        r->tg[i] = (i * 53 + 5) % cfg.vocab_size;
    }
    sl_engine_config ec = {.micro_batch = 2, .grad_accum_steps = 2, .gradient_clipping = 1.0f};
    sl_optim_defaults(&ec.optim);
    ec.optim.lr = 1e-3;
    ec.optim.weight_decay = 0.1;
    sl_schedule_constant(&ec.schedule, ec.optim.lr);
    sl_loss_scaler_defaults(&ec.precision);
    ec.precision.precision = p;
    ec.precision.initial_scale_power = scale_power;
    ec.precision.hysteresis = hysteresis;
    return sl_engine_init(&r->engine, &r->model, &ec);
}

static int one_step(rig *r) {
    for (int k = 0; k < 2; k++)
        if (sl_engine_forward_backward(&r->engine, r->in + 32 * k, r->tg + 32 * k, 2, 16, NULL)) return -1;
    return sl_engine_step(&r->engine);
}

static void teardown(rig *r) {
    sl_engine_free(&r->engine);
    sl_model_free(&r->model);
}

// every parameter is its master weight rounded; the master keeps what rounding drops
static void check_params_are_rounded_master(rig *r, sl_precision p, const char *what) {
    size_t n = r->model.layout.total, bad = 0, differ = 0;
    for (size_t i = 0; i < n; i++) {
        float want = p == SL_PRECISION_BF16 ? sl_round_to_bf16(r->engine.master[i]) : sl_round_to_fp16(r->engine.master[i]);
        if (memcmp(&want, &r->model.params[i], sizeof want)) bad++;
        differ += r->model.params[i] != r->engine.master[i];
    }
    CHECK_MSG(bad == 0, "%s: %zu of %zu parameters are not the rounded master", what, bad, n);
    CHECK_MSG(differ > n / 2, "%s: only %zu of %zu master weights carry bits below the 16-bit value", what, differ, n);
}

TEST(bf16_parameters_are_rounded_fp32_master_weights) {
    rig r;
    CHECK(setup(&r, SL_PRECISION_BF16, 16, 2) == 0);
    CHECK(r.engine.master != NULL);
    check_params_are_rounded_master(&r, SL_PRECISION_BF16, "after init");
    CHECK(r.engine.scaler.scale == 1.0);  // bf16 needs no loss scaling
    for (int s = 0; s < 3; s++) CHECK(one_step(&r) == 0);
    check_params_are_rounded_master(&r, SL_PRECISION_BF16, "after 3 steps");
    CHECK(r.engine.scaler.skipped_steps == 0);
    teardown(&r);
}

// A tiny learning rate moves every weight by far less than half a bf16 ulp: the model's bf16
// weights stay put while the fp32 master accumulates the updates (the reason master weights exist).
TEST(updates_below_bf16_resolution_accumulate_in_the_master) {
    rig r;
    CHECK(setup(&r, SL_PRECISION_BF16, 16, 2) == 0);
    sl_schedule_constant(&r.engine.cfg.schedule, 1e-7);
    size_t n = r.model.layout.total;
    float *p0 = malloc(n * sizeof(float)), *m0 = malloc(n * sizeof(float));
    memcpy(p0, r.model.params, n * sizeof(float));
    memcpy(m0, r.engine.master, n * sizeof(float));
    for (int s = 0; s < 3; s++) CHECK(one_step(&r) == 0);
    size_t moved_master = 0, moved_param = 0;
    for (size_t i = 0; i < n; i++) {
        moved_master += r.engine.master[i] != m0[i];
        moved_param += r.model.params[i] != p0[i];
    }
    CHECK_MSG(moved_master > n / 2, "master moved at %zu of %zu", moved_master, n);
    CHECK_MSG(moved_param < moved_master / 10, "bf16 weights moved at %zu (master at %zu)", moved_param, moved_master);
    check_params_are_rounded_master(&r, SL_PRECISION_BF16, "after tiny steps");
    free(p0);
    free(m0);
    teardown(&r);
}

// fp16: gradients are computed for the scaled loss and stored in fp16 (every value representable).
TEST(fp16_gradients_are_scaled_and_fp16_valued) {
    rig r;
    CHECK(setup(&r, SL_PRECISION_FP16, 8, 2) == 0);
    CHECK(r.engine.scaler.scale == 256.0);
    CHECK(sl_engine_forward_backward(&r.engine, r.in, r.tg, 2, 16, NULL) == 0);
    size_t n = r.model.layout.total, bad = 0;
    double sumsq = 0;
    for (size_t i = 0; i < n; i++) {
        float g = r.model.grads[i];
        bad += sl_round_to_fp16(g) != g;
        sumsq += (double)g * g;
    }
    CHECK_MSG(bad == 0, "%zu gradients are not fp16 values", bad);
    // the same micro-batch in fp32 gives gradients 256x smaller (up to fp16 rounding)
    rig f;
    CHECK(setup(&f, SL_PRECISION_FP32, 0, 2) == 0);
    CHECK(sl_engine_forward_backward(&f.engine, f.in, f.tg, 2, 16, NULL) == 0);
    double ref = 0;
    for (size_t i = 0; i < n; i++) ref += (double)f.model.grads[i] * f.model.grads[i];
    double ratio = sqrt(sumsq / ref);
    CHECK_MSG(fabs(ratio - 256.0) < 256.0 * 1e-2, "scaled gradient norm ratio %.4f, expected 256", ratio);
    teardown(&f);
    teardown(&r);
}

// A scale of 2^40 makes the fp16 gradients overflow: steps are skipped (nothing moves, the schedule
// does not advance) and the scale halves after each hysteresis is used up, until a step applies.
TEST(fp16_overflow_skips_steps_and_lowers_the_scale) {
    rig r;
    CHECK(setup(&r, SL_PRECISION_FP16, 40, 2) == 0);
    size_t n = r.model.layout.total;
    float *p0 = malloc(n * sizeof(float)), *m0 = malloc(n * sizeof(float)), *s0 = malloc(n * sizeof(float));
    memcpy(p0, r.model.params, n * sizeof(float));
    memcpy(m0, r.engine.master, n * sizeof(float));
    memcpy(s0, r.engine.optim_state[0], n * sizeof(float));
    CHECK(one_step(&r) == 0);
    CHECK(r.engine.last_step_skipped == 1);
    CHECK(r.engine.scaler.skipped_steps == 1);
    CHECK(r.engine.step == 1);
    CHECK(r.engine.scaler.scale == ldexp(1.0, 40));  // hysteresis 2: the first overflow only uses it up
    CHECK(memcmp(p0, r.model.params, n * sizeof(float)) == 0);
    CHECK(memcmp(m0, r.engine.master, n * sizeof(float)) == 0);
    CHECK(memcmp(s0, r.engine.optim_state[0], n * sizeof(float)) == 0);
    for (size_t i = 0; i < n; i++) CHECK(r.model.grads[i] == 0.0f);  // the overflowing gradients are dropped
    int guard = 0;
    while (r.engine.last_step_skipped && guard++ < 60) CHECK(one_step(&r) == 0);
    CHECK(!r.engine.last_step_skipped);
    int64_t skipped = r.engine.scaler.skipped_steps;
    CHECK_MSG(skipped >= 10, "only %lld skipped steps from 2^40", (long long)skipped);
    CHECK_MSG(r.engine.scaler.scale < ldexp(1.0, 30) && r.engine.scaler.scale >= 1.0, "scale %g", r.engine.scaler.scale);
    CHECK(r.engine.scaler.scale_decreases == skipped - 1);
    CHECK(r.engine.step == skipped + 1);
    CHECK(memcmp(m0, r.engine.master, n * sizeof(float)) != 0);  // the applied step moved the master
    check_params_are_rounded_master(&r, SL_PRECISION_FP16, "after the first applied step");
    printf("  %lld skipped steps before the scale fell from 2^40 to 2^%g\n", (long long)skipped,
           log2(r.engine.scaler.scale));
    free(p0);
    free(m0);
    free(s0);
    teardown(&r);
}

// The applied fp16 step equals an fp32 step on the unscaled gradients: with plain SGD (the update
// is linear in the gradient) and no clipping, the master's update matches the fp32 run's to fp16
// precision; a gradient left scaled by 2^12 would make it 4096 times too big.
static void use_sgd(rig *r) {
    r->engine.cfg.optim.type = SL_OPTIM_SGD;
    r->engine.cfg.optim.weight_decay = 0.0;
    r->engine.cfg.gradient_clipping = 0.0f;
    sl_schedule_constant(&r->engine.cfg.schedule, 1e-2);
}

TEST(fp16_step_unscales_before_the_update) {
    rig h, f;
    CHECK(setup(&h, SL_PRECISION_FP16, 12, 2) == 0);
    CHECK(setup(&f, SL_PRECISION_FP32, 0, 2) == 0);
    use_sgd(&h);
    use_sgd(&f);
    size_t n = h.model.layout.total;
    float *p0 = malloc(n * sizeof(float));
    memcpy(p0, f.model.params, n * sizeof(float));
    CHECK(memcmp(p0, h.engine.master, n * sizeof(float)) == 0);
    CHECK(one_step(&h) == 0 && one_step(&f) == 0);
    CHECK(!h.engine.last_step_skipped);
    double diff = 0, ref = 0;
    for (size_t i = 0; i < n; i++) {
        double dh = (double)h.engine.master[i] - p0[i], df = (double)f.model.params[i] - p0[i];
        diff += (dh - df) * (dh - df);
        ref += df * df;
    }
    double rel = sqrt(diff / ref);
    CHECK_MSG(rel < 2e-2, "fp16 update differs from the fp32 one by %.3g relative (norms %g vs %g)", rel,
              h.engine.last_grad_norm, f.engine.last_grad_norm);
    printf("  fp16 (scale 2^12) SGD update vs fp32: %.2e relative; grad norm %.6f vs %.6f\n", rel,
           h.engine.last_grad_norm, f.engine.last_grad_norm);
    free(p0);
    teardown(&h);
    teardown(&f);
}

// SHARDLM_FAULT=RANK:STEP:overflow makes exactly that step overflow.
TEST(injected_overflow_skips_exactly_that_step) {
    rig r;
    CHECK(setup(&r, SL_PRECISION_BF16, 16, 2) == 0);
    setenv("SHARDLM_FAULT", "0:3:overflow", 1);
    unsetenv("SHARDLM_RESTART_COUNT");
    CHECK(sl_settings_load() == 0);  // the environment is read once; again after changing it
    int skipped_at[6] = {0};
    for (int s = 0; s < 6; s++) {
        CHECK(one_step(&r) == 0);
        skipped_at[s] = r.engine.last_step_skipped;
    }
    unsetenv("SHARDLM_FAULT");
    CHECK(sl_settings_load() == 0);
    for (int s = 0; s < 6; s++) CHECK_MSG(skipped_at[s] == (s == 2), "step %d skipped=%d", s + 1, skipped_at[s]);
    CHECK(r.engine.scaler.skipped_steps == 1);
    teardown(&r);
}

// bf16 (no loss scale) checks for Inf / NaN through the gradients' sum of squares, the one clipping
// uses: the same steps, bit for bit, as without the check; a NaN or an Inf anywhere skips the step.
TEST(bf16_overflow_check_is_the_clipping_sum) {
    rig a, b;
    CHECK(setup(&a, SL_PRECISION_BF16, 16, 2) == 0);
    CHECK(setup(&b, SL_PRECISION_BF16, 16, 2) == 0);
    CHECK(a.engine.scaler.scale == 1.0 && a.engine.cfg.precision.bf16_check_grad_overflow);
    b.engine.cfg.precision.bf16_check_grad_overflow = 0;
    for (int s = 0; s < 4; s++) {
        CHECK(one_step(&a) == 0 && one_step(&b) == 0);
        CHECK(a.engine.step_sumsq_known && !b.engine.step_sumsq_known);
        CHECK_MSG(a.engine.last_grad_norm == b.engine.last_grad_norm, "step %d: grad norm %.9g against %.9g", s + 1,
                  a.engine.last_grad_norm, b.engine.last_grad_norm);
    }
    size_t n = a.model.layout.total;
    CHECK(memcmp(a.model.params, b.model.params, n * sizeof(float)) == 0);
    CHECK(memcmp(a.engine.master ? a.engine.master : a.model.params, b.engine.master ? b.engine.master : b.model.params,
                 n * sizeof(float)) == 0);
    float *before = malloc(n * sizeof(float));
    CHECK(before != NULL);
    const float bad[2] = {NAN, -INFINITY};
    for (int k = 0; k < 2 && before; k++) {
        memcpy(before, a.model.params, n * sizeof(float));
        for (int m = 0; m < 2; m++)
            CHECK(sl_engine_forward_backward(&a.engine, a.in + 32 * m, a.tg + 32 * m, 2, 16, NULL) == 0);
        a.model.grads[n / 3 + (size_t)k] = bad[k];
        CHECK(sl_engine_step(&a.engine) == 0);
        CHECK_MSG(a.engine.last_step_skipped, "a %s gradient did not skip the step", k ? "-Inf" : "NaN");
        CHECK(memcmp(before, a.model.params, n * sizeof(float)) == 0);
    }
    CHECK(one_step(&a) == 0 && !a.engine.last_step_skipped);  // and the next clean step applies
    free(before);
    teardown(&a);
    teardown(&b);
}

// fp32 keeps no master copy and never checks for overflow: training is what it was before.
TEST(fp32_has_no_master_and_no_scaling) {
    rig r;
    CHECK(setup(&r, SL_PRECISION_FP32, 16, 2) == 0);
    CHECK(r.engine.master == NULL);
    CHECK(r.engine.scaler.scale == 1.0);
    CHECK(one_step(&r) == 0);
    CHECK(!r.engine.last_step_skipped);
    teardown(&r);
}

TEST_MAIN()
