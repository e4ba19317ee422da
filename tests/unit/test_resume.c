// test_resume.c: resume compatibility (resume.h): the client state `shardlm train` saves read back as
// typed fields, each refusal naming the field with the checkpoint's and this run's values, and the
// data position rescaled when the number of ranks changes.
#include "test.h"

#include "shardlm/error.h"
#include "shardlm/resume.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// A run's resolved config at `world` ranks and micro batch `mb`, as `shardlm train` builds it.
static void run_config(sl_train_config *c, int world, int mb) {
    sl_train_config_defaults(c);
    c->world_size = world;
    c->micro_batch = mb;
    snprintf(c->data, sizeof c->data, "data/sotu");
    CHECK_MSG(sl_train_config_resolve(c, 2) == 0, "%s", sl_error());
}

// The client state train.c saves for config c at loader batch `batch`.
static char *client_state(const sl_train_config *c, int64_t batch) {
    char *cfg = sl_train_config_to_json(c), pos[256];
    sl_loader_position p = {0, batch, 0, 0};
    sl_loader_position_to_json(&p, pos, sizeof pos);
    size_t n = strlen(cfg) + strlen(pos) + 64;
    char *out = malloc(n);
    snprintf(out, n, "{\"loader\": %s, \"config\": %s}", pos, cfg);
    free(cfg);
    return out;
}

// Saves a run of `old`, checks `now` against it; returns sl_resume_check's result.
static int check(const sl_train_config *old, int64_t batch, const sl_train_config *now, int64_t epoch_batches,
                 sl_resume_plan *plan) {
    char *client = client_state(old, batch);
    sl_resume_state s;
    int rc = sl_resume_state_parse(&s, client);
    free(client);
    CHECK_MSG(rc == 0, "%s", sl_error());
    return rc ? -1 : sl_resume_check(&s, now, epoch_batches, plan);
}

static int error_has(const char *text) {
    int ok = strstr(sl_error(), text) != NULL;
    if (!ok) fprintf(stderr, "  message was: %s\n  expected it to contain: %s\n", sl_error(), text);
    return ok;
}

TEST(same_run_resumes_at_the_same_batch) {
    sl_train_config a, b;
    run_config(&a, 1, 4);
    run_config(&b, 1, 4);
    sl_resume_plan plan;
    CHECK_MSG(check(&a, 7, &b, 100, &plan) == 0, "%s", sl_error());
    CHECK(plan.position.batch == 7);
    CHECK(plan.n_warnings == 0);
    sl_train_config_free(&a);
    sl_train_config_free(&b);
}

TEST(each_mismatch_names_the_field_and_both_values) {
    sl_train_config a, b;
    sl_resume_plan plan;
    run_config(&a, 1, 4);
    run_config(&b, 1, 4);
    b.seq_len = 64;
    CHECK(check(&a, 1, &b, 100, &plan) == -1 && error_has("checkpoint was trained with seq_len 128, this run uses 64"));
    run_config(&b, 1, 4);
    b.seed = 7;
    CHECK(check(&a, 1, &b, 100, &plan) == -1 && error_has("checkpoint was trained with seed 1337, this run uses 7"));
    run_config(&b, 1, 4);
    b.shuffle = 0;
    CHECK(check(&a, 1, &b, 100, &plan) == -1 && error_has("checkpoint was trained with shuffling, this run does not"));
    run_config(&b, 1, 4);
    snprintf(b.data, sizeof b.data, "data/other");
    CHECK(check(&a, 1, &b, 100, &plan) == -1 &&
          error_has("checkpoint was trained on data data/sotu, this run reads data/other"));
    run_config(&b, 1, 8);
    CHECK(check(&a, 1, &b, 100, &plan) == -1 && error_has("checkpoint was trained with micro batch 4, this run uses 8"));
    sl_train_config_free(&a);
    sl_train_config_free(&b);
}

TEST(position_rescales_to_other_ranks) {
    sl_train_config a, b;
    sl_resume_plan plan;
    run_config(&a, 2, 4);  // 8 windows per batch
    run_config(&b, 1, 4);  // 4
    CHECK_MSG(check(&a, 3, &b, 100, &plan) == 0, "%s", sl_error());
    CHECK(plan.position.batch == 6);
    CHECK(plan.n_warnings == 1 && strstr(plan.warnings[0], "train_batch_size changes from 8 to 4"));
    run_config(&b, 8, 4);  // 32 windows: 3 x 8 = 24 is not a whole number of them
    CHECK(check(&a, 3, &b, 100, &plan) == -1 &&
          error_has("(3 batches of 8 windows) is not a whole number of this run's batches of 32 windows"));
    run_config(&b, 1, 4);  // batch 6 of an epoch of 5
    CHECK(check(&a, 3, &b, 5, &plan) == -1 && error_has("lies past this run's epoch of 5 batches of 4 windows"));
    sl_train_config_free(&a);
    sl_train_config_free(&b);
}

TEST(other_thread_count_warns) {
    sl_train_config a, b;
    sl_resume_plan plan;
    run_config(&a, 1, 4);
    run_config(&b, 1, 4);
    b.threads = 3;
    CHECK_MSG(check(&a, 2, &b, 100, &plan) == 0, "%s", sl_error());
    CHECK(plan.n_warnings == 1 && strstr(plan.warnings[0], "thread count differs"));
    sl_train_config_free(&a);
    sl_train_config_free(&b);
}

TEST(missing_or_bad_fields_are_named) {
    sl_resume_state s;
    CHECK(sl_resume_state_parse(&s, NULL) == -1 && error_has("no saved loader position and configuration"));
    CHECK(sl_resume_state_parse(&s, "{\"loader\": {\"epoch\": 0, \"batch\": 1}, \"config\": {\"shardlm\": {}}}") == -1 &&
          error_has("train_micro_batch_size_per_gpu"));
    const char *no_seq = "{\"loader\": {\"epoch\": 0, \"batch\": 1}, \"config\": {\"train_micro_batch_size_per_gpu\": 2, "
                         "\"train_batch_size\": 2, \"shardlm\": {\"seed\": 1, \"data\": \"d\"}}}";
    CHECK(sl_resume_state_parse(&s, no_seq) == -1 && error_has("client_state.config.shardlm") && error_has("seq_len"));
    const char *big = "{\"loader\": {\"epoch\": 0, \"batch\": 1}, \"config\": {\"train_micro_batch_size_per_gpu\": 1e30, "
                      "\"train_batch_size\": 2, \"shardlm\": {\"seq_len\": 8, \"seed\": 1, \"data\": \"d\"}}}";
    CHECK(sl_resume_state_parse(&s, big) == -1 && error_has("\"train_micro_batch_size_per_gpu\" must be an integer"));
    const char *no_data = "{\"loader\": {\"epoch\": 0, \"batch\": 1}, \"config\": {\"train_micro_batch_size_per_gpu\": 2, "
                          "\"train_batch_size\": 2, \"shardlm\": {\"seq_len\": 8, \"seed\": 1}}}";
    CHECK(sl_resume_state_parse(&s, no_data) == -1 && error_has("\"data\" must be the data directory"));
}

TEST_MAIN()
