// test_loss_scaler.c: the loss scaler against DeepSpeed's DynamicLossScaler, the "fp16" / "bf16"
// block parser, and the overflow check and unscale passes.
// Expected scale sequences come from running deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler
// (DeepSpeed 0.19.8, update_scale as quoted in loss_scaler.h) over the same overflow patterns and
// pasting its cur_scale / cur_hysteresis after each update; they also follow by hand from that code.
#include "test.h"

#include "shardlm/error.h"
#include "shardlm/loss_scaler.h"
#include "shardlm/ops.h"

#include <cjson/cJSON.h>
#include <stdint.h>

static sl_loss_scaler_config dyn_config(int power, int window, int hysteresis, int consecutive, double min_scale) {
    sl_loss_scaler_config c;
    sl_loss_scaler_defaults(&c);
    c.precision = SL_PRECISION_FP16;
    c.initial_scale_power = power;
    c.loss_scale_window = window;
    c.hysteresis = hysteresis;
    c.consecutive_hysteresis = consecutive;
    c.min_loss_scale = min_scale;
    return c;
}

// Runs `pattern` ('1' = overflow) and compares scale and hysteresis after each update.
static void run_pattern(const sl_loss_scaler_config *c, const char *pattern, const double *scales, const int *hyst,
                        int raise_at) {
    sl_loss_scaler s;
    CHECK(sl_loss_scaler_init(&s, c) == 0);
    int64_t skipped = 0;
    for (int i = 0; pattern[i]; i++) {
        int ov = pattern[i] == '1';
        double before = s.scale;
        int rc = sl_loss_scaler_update(&s, ov);
        if (i == raise_at) {
            CHECK_MSG(rc == -1, "iteration %d: expected DeepSpeed's min-scale error, got %d", i, rc);
            CHECK(strstr(sl_error(), "min_loss_scale") != NULL);
            CHECK(s.scale == before && s.iter == i);  // nothing changed
            return;
        }
        CHECK_MSG(rc == ov, "iteration %d: update returned %d", i, rc);
        skipped += ov;
        CHECK_MSG(s.scale == scales[i], "iteration %d: scale %g, DeepSpeed %g", i, s.scale, scales[i]);
        CHECK_MSG(s.cur_hysteresis == hyst[i], "iteration %d: hysteresis %d, DeepSpeed %d", i, s.cur_hysteresis,
                  hyst[i]);
    }
    CHECK(raise_at < 0);
    CHECK(s.skipped_steps == skipped);
    CHECK(s.iter == (int64_t)strlen(pattern));
}

static const char *const PATTERN_A = "000000010000110000001010000000111000";

TEST(dynamic_matches_deepspeed) {
    // DynamicLossScaler(init_scale=16, scale_window=3, min_scale=1, delayed_shift=2,
    //                   consecutive_hysteresis=False, raise_error_at_min_scale=False)
    static const double scales[] = {16, 16, 16, 32, 32, 32, 64, 64, 64, 64, 64, 128, 128, 64, 64, 64, 64, 128,
                                    128, 128, 128, 128, 64, 64, 64, 64, 128, 128, 128, 256, 256, 128, 64, 64, 64, 64};
    static const int hyst[] = {2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 2, 1, 1, 1, 1, 1, 2,
                               2, 2, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1};
    sl_loss_scaler_config c = dyn_config(4, 3, 2, 0, 1);
    c.raise_error_at_min_scale = 0;
    run_pattern(&c, PATTERN_A, scales, hyst, -1);
}

TEST(consecutive_hysteresis_matches_deepspeed) {
    // as above with consecutive_hysteresis=True: every clean step refills the counter
    static const double scales[] = {16,  16,  16,  32,  32,  32,  64,  64,  64,  64,  64,  128,
                                    128, 64,  64,  64,  64,  128, 128, 128, 128, 128, 128, 128,
                                    128, 128, 256, 256, 256, 512, 512, 256, 128, 128, 128, 128};
    static const int hyst[] = {2, 2, 2, 2, 2, 2, 2, 1, 2, 2, 2, 2, 1, 1, 2, 2, 2, 2,
                               2, 2, 1, 2, 1, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 2, 2, 2};
    sl_loss_scaler_config c = dyn_config(4, 3, 2, 1, 1);
    run_pattern(&c, PATTERN_A, scales, hyst, -1);
}

TEST(min_loss_scale_floor) {
    // DynamicLossScaler(init_scale=64, scale_window=100, min_scale=4, delayed_shift=1,
    //                   raise_error_at_min_scale=False): halves to the floor and stays there
    static const double scales[] = {32, 16, 8, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4};
    static const int hyst[] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    sl_loss_scaler_config c = dyn_config(6, 100, 1, 0, 4);
    c.raise_error_at_min_scale = 0;
    run_pattern(&c, "1111111000011", scales, hyst, -1);
    // the same with raise_error_at_min_scale=True (DeepSpeed's default): raises at iteration 4
    c.raise_error_at_min_scale = 1;
    run_pattern(&c, "1111111000011", scales, hyst, 4);
    // delayed_shift=3: two overflows absorbed, then halving, raising at iteration 6
    static const double scales3[] = {64, 64, 32, 16, 8, 4};
    static const int hyst3[] = {2, 1, 1, 1, 1, 1};
    c = dyn_config(6, 100, 3, 0, 4);
    run_pattern(&c, "1111111000011", scales3, hyst3, 6);
    // a floor that is not a power-of-two step away is reached exactly (max(scale / 2, min))
    c = dyn_config(4, 100, 1, 0, 5);
    c.raise_error_at_min_scale = 0;
    sl_loss_scaler s;
    CHECK(sl_loss_scaler_init(&s, &c) == 0);
    sl_loss_scaler_update(&s, 1);
    CHECK(s.scale == 8);
    sl_loss_scaler_update(&s, 1);
    CHECK(s.scale == 5);
    sl_loss_scaler_update(&s, 1);
    CHECK(s.scale == 5 && s.skipped_steps == 3 && s.scale_decreases == 3);
}

TEST(defaults_grow_every_window) {
    // DeepSpeed defaults (2^16, window 1000, hysteresis 2): over 3005 updates with one overflow at
    // iteration 1500, DynamicLossScaler changes the scale exactly at iteration 1000 (-> 131072) and
    // 2501 (-> 262144); the overflow only uses up one unit of hysteresis.
    sl_loss_scaler_config c;
    sl_loss_scaler_defaults(&c);
    c.precision = SL_PRECISION_FP16;
    sl_loss_scaler s;
    CHECK(sl_loss_scaler_init(&s, &c) == 0);
    CHECK(s.dynamic && s.scale == 65536.0);
    int changes = 0;
    for (int i = 0; i < 3005; i++) {
        double before = s.scale;
        int rc = sl_loss_scaler_update(&s, i == 1500);
        CHECK(rc == (i == 1500));
        if (s.scale != before) {
            changes++;
            CHECK_MSG((i == 1000 && s.scale == 131072.0) || (i == 2501 && s.scale == 262144.0),
                      "unexpected change at %d to %g", i, s.scale);
        }
    }
    CHECK(changes == 2);
    CHECK(s.skipped_steps == 1 && s.last_overflow_iter == 1500 && s.cur_hysteresis == 2);
}

TEST(static_scale_never_changes) {
    sl_loss_scaler_config c;
    sl_loss_scaler_defaults(&c);
    c.precision = SL_PRECISION_FP16;
    c.loss_scale = 128;
    sl_loss_scaler s;
    CHECK(sl_loss_scaler_init(&s, &c) == 0);
    CHECK(!s.dynamic && s.scale == 128);
    for (int i = 0; i < 3000; i++) CHECK(sl_loss_scaler_update(&s, i % 7 == 0) == (i % 7 == 0));
    CHECK(s.scale == 128 && s.skipped_steps == 429 && s.iter == 3000);
    // bf16 and fp32: static scale 1, whatever the fp16 settings say
    c.precision = SL_PRECISION_BF16;
    c.loss_scale = 0;
    CHECK(sl_loss_scaler_init(&s, &c) == 0);
    CHECK(!s.dynamic && s.scale == 1.0);
    CHECK(sl_loss_scaler_update(&s, 1) == 1 && s.scale == 1.0 && s.skipped_steps == 1);
    c.precision = SL_PRECISION_FP32;
    CHECK(sl_loss_scaler_init(&s, &c) == 0 && s.scale == 1.0 && !s.dynamic);
}

TEST(overflow_check_and_unscale) {
    size_t n = 100001;
    float *g = calloc(n, sizeof *g);
    CHECK(g != NULL);
    if (!g) return;
    for (size_t i = 0; i < n; i++) g[i] = (float)((int)(i % 2001) - 1000) * 3.0e34f;  // large but finite
    CHECK(sl_ops_cpu.nonfinite(g, n) == 0);
    CHECK(sl_ops_cpu.nonfinite(g, 0) == 0);
    const float bad[] = {INFINITY, -INFINITY, NAN, -NAN};
    const size_t where[] = {0, 77, n / 2, n - 1};
    for (int b = 0; b < 4; b++)
        for (int w = 0; w < 4; w++) {
            float keep = g[where[w]];
            g[where[w]] = bad[b];
            CHECK_MSG(sl_ops_cpu.nonfinite(g, n) == 1, "value %d at %zu not found", b, where[w]);
            CHECK(sl_ops_cpu.nonfinite(g, where[w]) == 0);  // a prefix without it is clean
            g[where[w]] = keep;
        }
    float tiny = 1e-45f;  // subnormals are finite
    CHECK(sl_ops_cpu.nonfinite(&tiny, 1) == 0);
    // unscale: g * (1 / 65536), exact for a power-of-two scale
    sl_loss_scaler_config c;
    sl_loss_scaler_defaults(&c);
    c.precision = SL_PRECISION_FP16;
    sl_loss_scaler s;
    CHECK(sl_loss_scaler_init(&s, &c) == 0);
    for (size_t i = 0; i < n; i++) g[i] = (float)i;
    sl_loss_scaler_unscale(&s, g, n);
    int wrong = 0;
    for (size_t i = 0; i < n; i++) wrong += g[i] != (float)i / 65536.0f;
    CHECK(wrong == 0);
    // static non-power-of-two scale: multiplies by (float)(1.0 / scale), as torch's mul_(1. / scale)
    c.loss_scale = 3.0;
    CHECK(sl_loss_scaler_init(&s, &c) == 0);
    float v[3] = {3.0f, 1.0f, -7.5f};
    sl_loss_scaler_unscale(&s, v, 3);
    const float inv = (float)(1.0 / 3.0);
    CHECK(v[0] == 3.0f * inv && v[1] == inv && v[2] == -7.5f * inv);
    free(g);
}

// ---- parsing -----------------------------------------------------------------------------------

static int parse_root(sl_loss_scaler_config *c, const char *json) {
    cJSON *root = cJSON_Parse(json);
    if (!root) return sl_errorf("bad test JSON");
    int rc = sl_precision_parse(c, root, "cfg.json");
    cJSON_Delete(root);
    return rc;
}

// Expects a parse error whose message names `key` (and the file).
#define CHECK_PARSE_ERROR(json, key)                                                               \
    do {                                                                                           \
        sl_loss_scaler_config c_;                                                                  \
        int rc_ = parse_root(&c_, json);                                                           \
        CHECK_MSG(rc_ == -1, "accepted %s", json);                                                 \
        CHECK_MSG(strstr(sl_error(), key) && strstr(sl_error(), "cfg.json"), "message: %s", sl_error()); \
    } while (0)

TEST(parse_values) {
    sl_loss_scaler_config c;
    CHECK(parse_root(&c, "{}") == 0);
    CHECK(c.precision == SL_PRECISION_FP32 && c.loss_scale == 0 && c.initial_scale_power == 16 &&
          c.loss_scale_window == 1000 && c.hysteresis == 2 && !c.consecutive_hysteresis && c.min_loss_scale == 1 &&
          c.raise_error_at_min_scale && c.warning[0] == '\0');
    CHECK(parse_root(&c, "{\"fp16\": {\"enabled\": true, \"loss_scale\": 0, \"initial_scale_power\": 12,"
                         "\"loss_scale_window\": 500, \"hysteresis\": 4, \"consecutive_hysteresis\": true,"
                         "\"min_loss_scale\": 8}}") == 0);
    CHECK(c.precision == SL_PRECISION_FP16 && c.initial_scale_power == 12 && c.loss_scale_window == 500 &&
          c.hysteresis == 4 && c.consecutive_hysteresis == 1 && c.min_loss_scale == 8);
    sl_loss_scaler s;
    CHECK(sl_loss_scaler_init(&s, &c) == 0 && s.dynamic && s.scale == 4096.0 && s.min_scale == 8);
    CHECK(parse_root(&c, "{\"fp16\": {\"enabled\": true, \"loss_scale\": 1024.5}}") == 0);
    CHECK(c.loss_scale == 1024.5 && sl_loss_scaler_init(&s, &c) == 0 && !s.dynamic && s.scale == 1024.5);
    // static scaling does not use the window or the floor, so DeepSpeed does not check them
    CHECK(parse_root(&c, "{\"fp16\": {\"enabled\": true, \"loss_scale\": 128, \"loss_scale_window\": 0,"
                         "\"min_loss_scale\": 0}}") == 0);
    // fp16 block present but disabled: fp32
    CHECK(parse_root(&c, "{\"fp16\": {\"enabled\": false, \"initial_scale_power\": 8}}") == 0);
    CHECK(c.precision == SL_PRECISION_FP32);
    CHECK(parse_root(&c, "{\"bf16\": {\"enabled\": true}}") == 0 && c.precision == SL_PRECISION_BF16);
    CHECK(c.bf16_check_grad_overflow == 1);
    CHECK(parse_root(&c, "{\"bfloat16\": {\"enabled\": true, \"check_grad_overflow\": false}}") == 0);
    CHECK(c.precision == SL_PRECISION_BF16 && c.bf16_check_grad_overflow == 0);
    CHECK(parse_root(&c, "{\"fp16\": {\"enabled\": false}, \"bf16\": {\"enabled\": true}}") == 0);
    CHECK(c.precision == SL_PRECISION_BF16);
    CHECK(parse_root(&c, "{\"fp16\": null, \"bf16\": null}") == 0 && c.precision == SL_PRECISION_FP32);
    // unknown and unsupported keys are warnings, not errors
    CHECK(parse_root(&c, "{\"fp16\": {\"enabled\": true, \"loss_scael\": 3, \"auto_cast\": true}}") == 0);
    CHECK_MSG(strstr(c.warning, "loss_scael") && strstr(c.warning, "auto_cast"), "warning: %s", c.warning);
}

TEST(parse_errors) {
    CHECK_PARSE_ERROR("{\"fp16\": {\"enabled\": true, \"bf16\": 1}, \"bf16\": {\"enabled\": true}}", "bf16");
    CHECK_PARSE_ERROR("{\"fp16\": {\"enabled\": true}, \"bf16\": {\"enabled\": true}}", "cannot both be enabled");
    CHECK_PARSE_ERROR("{\"fp16\": 1}", "fp16");
    CHECK_PARSE_ERROR("{\"bf16\": true}", "bf16");
    CHECK_PARSE_ERROR("{\"fp16\": {\"enabled\": 1}}", "enabled");
    CHECK_PARSE_ERROR("{\"bf16\": {\"enabled\": \"yes\"}}", "enabled");
    CHECK_PARSE_ERROR("{\"fp16\": {\"loss_scale\": -1}}", "loss_scale");
    CHECK_PARSE_ERROR("{\"fp16\": {\"loss_scale\": \"dynamic\"}}", "loss_scale");
    CHECK_PARSE_ERROR("{\"fp16\": {\"loss_scale\": true}}", "loss_scale");
    CHECK_PARSE_ERROR("{\"fp16\": {\"initial_scale_power\": 1.5}}", "initial_scale_power");
    CHECK_PARSE_ERROR("{\"fp16\": {\"initial_scale_power\": -1}}", "initial_scale_power");
    CHECK_PARSE_ERROR("{\"fp16\": {\"initial_scale_power\": 65}}", "initial_scale_power");
    CHECK_PARSE_ERROR("{\"fp16\": {\"enabled\": true, \"loss_scale_window\": 0}}", "loss_scale_window");
    CHECK_PARSE_ERROR("{\"fp16\": {\"loss_scale_window\": \"10\"}}", "loss_scale_window");
    CHECK_PARSE_ERROR("{\"fp16\": {\"hysteresis\": 0}}", "hysteresis");
    CHECK_PARSE_ERROR("{\"fp16\": {\"consecutive_hysteresis\": 1}}", "consecutive_hysteresis");
    CHECK_PARSE_ERROR("{\"fp16\": {\"enabled\": true, \"min_loss_scale\": 0}}", "min_loss_scale");
    CHECK_PARSE_ERROR("{\"fp16\": {\"min_loss_scale\": 0.5}}", "min_loss_scale");
    CHECK_PARSE_ERROR("{\"bf16\": {\"check_grad_overflow\": 0}}", "check_grad_overflow");
    sl_loss_scaler_config c;
    CHECK(parse_root(&c, "[1]") == -1);
    // the block parser alone
    sl_loss_scaler_defaults(&c);
    CHECK(sl_loss_scaler_parse(&c, NULL, "x") == 0 && c.precision == SL_PRECISION_FP32);
    cJSON *block = cJSON_Parse("{\"enabled\": true, \"hysteresis\": -3}");
    CHECK(sl_loss_scaler_parse(&c, block, "my.json: fp16") == -1);
    CHECK_MSG(strstr(sl_error(), "my.json: fp16") && strstr(sl_error(), "hysteresis"), "%s", sl_error());
    cJSON_Delete(block);
}

TEST_MAIN()
