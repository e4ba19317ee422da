// test_engine_errors.c: a call that failed on the backend (recorded there and reported by
// ops->synchronize, as the CUDA backend and cpu-bf16 do) stops the engine's step and a checkpoint
// save with the backend's message, instead of going unnoticed.
#include "test.h"
#include "shardlm/engine.h"
#include "shardlm/error.h"

#include <unistd.h>

static int failing;  // the backend's recorded failure, reported once by synchronize
static int failing_synchronize(void) {
    if (!failing) return 0;
    failing = 0;
    return sl_errorf("matmul: cublasLtMatmul failed (CUBLAS_STATUS_EXECUTION_FAILED)");
}

TEST(a_failed_backend_call_stops_the_step_and_the_save) {
    sl_ops ops = sl_ops_cpu;
    ops.name = "failing-cpu";
    ops.synchronize = failing_synchronize;
    sl_model_config cfg;
    sl_model m;
    CHECK(sl_config_preset(&cfg, "llama-tiny") == 0 && sl_model_create(&m, &cfg, &ops) == 0);
    sl_model_init_weights(&m, 3);
    sl_engine_config ec = {.micro_batch = 2, .grad_accum_steps = 1, .gradient_clipping = 1.0f};
    sl_optim_defaults(&ec.optim);
    sl_schedule_constant(&ec.schedule, 1e-3);
    sl_loss_scaler_defaults(&ec.precision);
    sl_engine e;
    CHECK(sl_engine_init(&e, &m, &ec) == 0);
    int in[32], tg[32];
    for (int i = 0; i < 32; i++) in[i] = tg[i] = (i * 7 + 1) % cfg.vocab_size;
    CHECK(sl_engine_forward_backward(&e, in, tg, 2, 16, NULL) == 0 && sl_engine_step(&e) == 0);
    char root[] = "/tmp/sl_engine_errors_XXXXXX";
    CHECK(mkdtemp(root) != NULL);
    failing = 1;
    CHECK(sl_engine_save(&e, root, "step_00000001", "{}") == -1);
    CHECK_MSG(strstr(sl_error(), "cublasLtMatmul") != NULL, "%s", sl_error());
    char latest[160];
    snprintf(latest, sizeof latest, "%s/latest", root);
    CHECK_MSG(access(latest, F_OK) != 0, "a checkpoint was written after the failed transfer");
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    CHECK(system(cmd) == 0);
    failing = 1;
    CHECK(sl_engine_forward_backward(&e, in, tg, 2, 16, NULL) == 0);
    CHECK(sl_engine_step(&e) == -1);
    CHECK_MSG(strstr(sl_error(), "step 2") && strstr(sl_error(), "failing-cpu") && strstr(sl_error(), "cublasLtMatmul"),
              "%s", sl_error());
    sl_engine_free(&e);
    sl_model_free(&m);
}

TEST_MAIN()
