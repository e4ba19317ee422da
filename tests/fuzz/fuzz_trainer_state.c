// fuzz_trainer_state.c: a checkpoint's trainer_state.json, read by a resume (sl_engine_load). A tiny
// LLaMA trains one step and saves a real checkpoint once; each input replaces its trainer_state.json
// and the engine loads the checkpoint with manifest verification off (or the changed file would be
// refused before it is parsed).
#include "fuzz_common.h"
#include "shardlm/engine.h"
#include "shardlm/error.h"

static sl_model model;
static sl_engine engine;
static char tag_dir[256];

static void setup(void) {
    sl_model_config cfg;
    if (sl_config_preset(&cfg, "llama-tiny") || sl_model_create(&model, &cfg, &sl_ops_cpu)) abort();
    sl_model_init_weights(&model, 1);
    sl_engine_config ec = {.micro_batch = 1, .grad_accum_steps = 1, .skip_verify = 1};
    sl_optim_defaults(&ec.optim);
    sl_schedule_constant(&ec.schedule, 1e-3);
    sl_loss_scaler_defaults(&ec.precision);
    int in[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    char root[200];
    snprintf(root, sizeof root, "%s/run", fuzz_tmpdir());
    if (sl_engine_init(&engine, &model, &ec) || sl_engine_forward_backward(&engine, in, in, 1, 8, NULL) ||
        sl_engine_step(&engine) || sl_engine_save(&engine, root, "step_00000001", "{\"loader\": {\"pos\": 3}}")) {
        fprintf(stderr, "fuzz_trainer_state setup: %s\n", sl_error());
        abort();
    }
    snprintf(tag_dir, sizeof tag_dir, "%s/step_00000001", root);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!tag_dir[0]) setup();
    char path[300];
    snprintf(path, sizeof path, "%s/trainer_state.json", tag_dir);
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size)) abort();
    fclose(f);
    char *client = NULL;
    (void)sl_engine_load(&engine, tag_dir, &client);
    free(client);
    return 0;
}
