// test_schedule.c: LR schedules against DeepSpeed's own values (tests/fixtures/optim/schedules.json,
// made by tests/reference/make_optim_fixtures.py with deepspeed's lr_schedules), and parse errors.
#include "test.h"

#include "shardlm/error.h"
#include "shardlm/fileio.h"
#include "shardlm/schedule.h"

#include <cjson/cJSON.h>

static int parse_text(sl_schedule *s, const char *json, double lr) {
    cJSON *root = cJSON_Parse(json);
    if (!root) return sl_errorf("bad test JSON");
    int rc = sl_schedule_parse(s, root, lr, "test");
    cJSON_Delete(root);
    return rc;
}

TEST(schedules_match_deepspeed) {
    char *text = sl_read_text_file("tests/fixtures/optim/schedules.json", NULL);
    CHECK_MSG(text != NULL, "%s", sl_error());
    if (!text) return;
    cJSON *root = cJSON_Parse(text);
    free(text);
    CHECK(root != NULL);
    const cJSON *cases = cJSON_GetObjectItem(root, "cases");
    int n_cases = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        const cJSON *block = cJSON_GetObjectItem(c, "scheduler");
        double opt_lr = cJSON_GetObjectItem(c, "optimizer_lr")->valuedouble;
        sl_schedule s;
        int rc = sl_schedule_parse(&s, block, opt_lr, "fixture");
        CHECK_MSG(rc == 0, "%s", sl_error());
        CHECK(s.warning[0] == '\0');
        int step = 0;
        const cJSON *lr;
        cJSON_ArrayForEach(lr, cJSON_GetObjectItem(c, "lrs")) {
            double want = lr->valuedouble;
            double got = sl_schedule_lr(&s, step);
            double err = fabs((double)got - want);
            CHECK_MSG(err <= 1e-7 * fabs(want) || (want == 0.0 && got == 0.0),
                      "%s case %d step %d: got %.10g want %.10g", sl_schedule_name(s.type), n_cases, step,
                      (double)got, want);
            step++;
        }
        CHECK(step == 40);
        n_cases++;
    }
    CHECK(n_cases == 7);
    cJSON_Delete(root);
}

TEST(constant_when_no_block) {
    sl_schedule s;
    CHECK(sl_schedule_parse(&s, NULL, 3e-4, "test") == 0);
    CHECK(s.type == SL_SCHED_CONSTANT);
    CHECK(sl_schedule_lr(&s, 0) == 3e-4);
    CHECK(sl_schedule_lr(&s, 123456) == 3e-4);
    CHECK(parse_text(&s, "null", 1e-3) == 0 && s.type == SL_SCHED_CONSTANT);
}

TEST(deepspeed_indexing) {
    // First step uses iteration -1 (warmup_min_lr), second iteration 0 (also warmup_min_lr for both
    // warmup types), third iteration 1.
    sl_schedule s;
    CHECK(parse_text(&s, "{\"type\":\"WarmupLR\",\"params\":{\"warmup_min_lr\":0.0001,\"warmup_max_lr\":0.001,"
                         "\"warmup_num_steps\":10,\"warmup_type\":\"linear\"}}", 5e-4) == 0);
    CHECK_CLOSE(sl_schedule_lr(&s, 0), 1e-4, 1e-9);
    CHECK_CLOSE(sl_schedule_lr(&s, 1), 1e-4, 1e-9);
    CHECK_CLOSE(sl_schedule_lr(&s, 2), 1e-4 + 9e-4 * 0.1, 1e-9);
    CHECK_CLOSE(sl_schedule_lr(&s, 11), 1e-3, 1e-9);
    CHECK_CLOSE(sl_schedule_lr(&s, 1000000), 1e-3, 1e-9);
    CHECK_CLOSE(sl_schedule_lr_at_iteration(&s, -1), 1e-4, 1e-12);
    // WarmupDecayLR reaches 0 at iteration total_num_steps and stays there.
    CHECK(parse_text(&s, "{\"type\":\"WarmupDecayLR\",\"params\":{\"total_num_steps\":20,\"warmup_num_steps\":5}}",
                     5e-4) == 0);
    CHECK(s.warmup_max_lr == 0.001);  // DeepSpeed's WarmupDecayLR default, not the optimizer lr
    CHECK(sl_schedule_lr_at_iteration(&s, 20) == 0.0);
    CHECK(sl_schedule_lr_at_iteration(&s, 50) == 0.0);
    // WarmupCosineLR clamps at cos_min_ratio past the end.
    CHECK(parse_text(&s, "{\"type\":\"WarmupCosineLR\",\"params\":{\"total_num_steps\":20,\"warmup_num_steps\":5,"
                         "\"cos_min_ratio\":0.1}}", 1e-3) == 0);
    CHECK_CLOSE(sl_schedule_lr_at_iteration(&s, 19), 1e-4, 1e-12);
    CHECK_CLOSE(sl_schedule_lr_at_iteration(&s, 1000), 1e-4, 1e-12);
    CHECK(sl_schedule_lr(&s, 0) == 0.0);
}

TEST(parse_errors_name_the_key) {
    sl_schedule s;
    CHECK(parse_text(&s, "{\"type\":\"OneCycle\"}", 1e-3) == -1);
    CHECK(strstr(sl_error(), "OneCycle") != NULL);
    CHECK(parse_text(&s, "{\"params\":{}}", 1e-3) == -1);
    CHECK(strstr(sl_error(), "scheduler.type") != NULL);
    CHECK(parse_text(&s, "{\"type\":\"WarmupDecayLR\",\"params\":{\"warmup_num_steps\":5}}", 1e-3) == -1);
    CHECK(strstr(sl_error(), "total_num_steps") != NULL);
    CHECK(parse_text(&s, "{\"type\":\"WarmupLR\",\"params\":{\"warmup_num_steps\":2.5}}", 1e-3) == -1);
    CHECK(strstr(sl_error(), "warmup_num_steps") != NULL);
    CHECK(parse_text(&s, "{\"type\":\"WarmupLR\",\"params\":{\"warmup_num_steps\":0}}", 1e-3) == -1);
    CHECK(strstr(sl_error(), "warmup_num_steps") != NULL);
    CHECK(parse_text(&s, "{\"type\":\"WarmupLR\",\"params\":{\"warmup_max_lr\":\"big\"}}", 1e-3) == -1);
    CHECK(strstr(sl_error(), "warmup_max_lr") != NULL);
    CHECK(parse_text(&s, "{\"type\":\"WarmupLR\",\"params\":{\"warmup_type\":\"cubic\"}}", 1e-3) == -1);
    CHECK(strstr(sl_error(), "cubic") != NULL);
    CHECK(parse_text(&s, "{\"type\":\"WarmupLR\",\"params\":[]}", 1e-3) == -1);
    CHECK(strstr(sl_error(), "scheduler.params") != NULL);
    CHECK(parse_text(&s, "{\"type\":\"WarmupLR\",\"warmup_num_steps\":3}", 1e-3) == -1);
    CHECK(strstr(sl_error(), "warmup_num_steps") != NULL);
    CHECK(parse_text(&s, "[1]", 1e-3) == -1);
}

TEST(unknown_keys_warn) {
    sl_schedule s;
    CHECK(parse_text(&s, "{\"type\":\"WarmupCosineLR\",\"params\":{\"total_num_steps\":9,\"warmup_max_lr\":1,"
                         "\"foo\":2}}", 1e-3) == 0);
    CHECK(strstr(s.warning, "warmup_max_lr") != NULL);
    CHECK(strstr(s.warning, "foo") != NULL);
    CHECK(s.warmup_num_steps == 1000);
    CHECK(parse_text(&s, "{\"type\":\"WarmupLR\",\"params\":{\"warmup_num_steps\":1}}", 2e-4) == 0);
    CHECK(s.warning[0] == '\0');
    CHECK(s.warmup_num_steps == 2);       // DeepSpeed's max(2, warmup_num_steps)
    CHECK(s.warmup_max_lr == 2e-4);       // WarmupLR default: the optimizer's lr
}

// A step read from a hostile trainer_state.json (1e30 was cast to INT64_MIN) or any other int64:
// every schedule gives a finite rate within its range, with no signed overflow (UBSan build).
TEST(extreme_steps_are_safe) {
    const char *blocks[] = {
        "{\"type\": \"WarmupLR\", \"params\": {\"warmup_max_lr\": 0.01, \"warmup_num_steps\": 10}}",
        "{\"type\": \"WarmupDecayLR\", \"params\": {\"warmup_max_lr\": 0.01, \"warmup_num_steps\": 10, "
        "\"total_num_steps\": 100}}",
        "{\"type\": \"WarmupCosineLR\", \"params\": {\"warmup_num_steps\": 10, \"total_num_steps\": 100}}",
        NULL};
    const int64_t steps[] = {INT64_MIN, INT64_MIN + 1, -1, 0, 1, 1000000000000000000LL, INT64_MAX - 1, INT64_MAX};
    for (int b = 0; blocks[b]; b++) {
        sl_schedule s;
        CHECK_MSG(parse_text(&s, blocks[b], 0.01) == 0, "%s", sl_error());
        for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
            double lr = sl_schedule_lr(&s, steps[i]), at = sl_schedule_lr_at_iteration(&s, steps[i]);
            CHECK_MSG(isfinite(lr) && lr >= 0 && lr <= 0.01 + 1e-12, "block %d step %lld: lr %g", b, (long long)steps[i], lr);
            CHECK_MSG(isfinite(at) && at >= 0 && at <= 0.01 + 1e-12, "block %d it %lld: lr %g", b, (long long)steps[i], at);
        }
    }
}

// A schedule --lr-schedule names is the one its saved "scheduler" block parses to, field for field.
TEST(named_schedules_equal_their_blocks) {
    const sl_schedule_type types[] = {SL_SCHED_CONSTANT, SL_SCHED_WARMUP_LR, SL_SCHED_WARMUP_DECAY_LR,
                                      SL_SCHED_WARMUP_COSINE_LR};
    const int64_t warmups[] = {1, 2, 7}, totals[] = {3, 50};
    for (int t = 0; t < 4; t++)
        for (int w = 0; w < 3; w++)
            for (int n = 0; n < 2; n++) {
                sl_schedule typed, parsed;
                double lr = 3e-4;
                sl_schedule_warmup_linear(&typed, types[t], lr, warmups[w], totals[n]);
                cJSON *blk = sl_schedule_warmup_linear_block(types[t], lr, warmups[w], totals[n]);
                CHECK((blk == NULL) == (types[t] == SL_SCHED_CONSTANT));
                CHECK_MSG(sl_schedule_parse(&parsed, blk, lr, "block") == 0, "%s", sl_error());
                cJSON_Delete(blk);
                CHECK_MSG(memcmp(&typed, &parsed, sizeof typed) == 0, "%s warmup %lld total %lld",
                          sl_schedule_name(types[t]), (long long)warmups[w], (long long)totals[n]);
                for (int64_t step = 0; step < 60; step++) CHECK(sl_schedule_lr(&typed, step) == sl_schedule_lr(&parsed, step));
            }
}

TEST_MAIN()
