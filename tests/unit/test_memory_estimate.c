// test_memory_estimate.c: the model-state estimate (memory_estimate.h) against figures worked out by
// hand for a 3-block gpt2-tiny, and against what an engine really allocates (sl_engine_memory_use)
// for every ZeRO stage, fp32 and bf16, with and without bf16 activation storage, AdamW and AdamW8bit,
// training the whole model or LoRA adapters on a frozen base.
#include "test.h"

#include "shardlm/comm.h"
#include "shardlm/engine.h"
#include "shardlm/error.h"
#include "shardlm/memory_estimate.h"

#include <string.h>

// gpt2-tiny (C = 32, 64 positions, vocabulary 100 padded to 128) with 3 blocks:
//   embeddings 128*32 + 64*32 = 6144; a block 2*64 (norms) + 96*32 + 96 (qkv) + 32*32 + 32 (proj)
//   + 128*32 + 128 (fc) + 32*128 + 32 (proj) = 12704; final norm 64.
//   P = 6144 + 3*12704 + 64 = 44320; windows W = 6144 + 64 + 2*12704 = 31616.
//   At 3 ranks S = ceil(P/3) = 14774 and the padded buffer 3S = 44322. Adam: K = 8.
static sl_model_config tiny3(void) {
    sl_model_config cfg;
    CHECK(sl_config_preset(&cfg, "gpt2-tiny") == 0);
    cfg.n_layer = 3;
    CHECK_MSG(sl_config_validate(&cfg, "test") == 0, "%s", sl_error());
    return cfg;
}

static sl_memory_estimate estimate(int world, int stage, int buffers, sl_precision p, int act_bf16) {
    sl_model_config cfg = tiny3();
    sl_memory_setup s = {world, stage, buffers, p, act_bf16, 0, 0, NULL};
    sl_memory_estimate e;
    CHECK_MSG(sl_memory_estimate_for(&cfg, &s, &e) == 0, "%s", sl_error());
    return e;
}

#define CHECK_BYTES(e, p, g, o, m, c)                                                                        \
    CHECK_MSG((e).params == (p) && (e).grads == (g) && (e).optim == (o) && (e).master == (m) &&             \
                  (e).param_copy == (c) && (e).total == (double)(p) + (g) + (o) + (m) + (c),                 \
              "got %.0f %.0f %.0f %.0f %.0f", (e).params, (e).grads, (e).optim, (e).master, (e).param_copy)

TEST(zero_stages_match_hand_computed_figures) {
    sl_memory_estimate e = estimate(3, 0, 2, SL_PRECISION_FP32, 0);
    CHECK(e.P == 44320 && e.S == 44320 && e.K == 8);
    CHECK_BYTES(e, 4 * 44320, 4 * 44320, 8 * 44320, 0, 0);  // 4P + 4P + KP
    e = estimate(3, 1, 2, SL_PRECISION_FP32, 0);
    CHECK(e.S == 14774 && strcmp(e.formula, "4P + 4(P+S) + KS") == 0);
    CHECK_BYTES(e, 4 * 44322, 4 * (44322 + 14774), 8 * 14774, 0, 0);
    e = estimate(3, 2, 2, SL_PRECISION_FP32, 0);
    CHECK(e.W == 31616);
    CHECK_BYTES(e, 4 * 44322, 4 * (14774 + 31616), 8 * 14774, 0, 0);
    e = estimate(3, 3, 2, SL_PRECISION_FP32, 0);
    CHECK_BYTES(e, 4 * (14774 + 31616), 4 * (14774 + 31616), 8 * 14774, 0, 0);
    e = estimate(3, 3, 0, SL_PRECISION_FP32, 0);  // SGD without momentum keeps no state
    CHECK(e.K == 0 && e.optim == 0);
}

TEST(mixed_precision_terms_match_hand_computed_figures) {
    sl_memory_estimate e = estimate(3, 2, 2, SL_PRECISION_BF16, 0);  // a master slice of S floats
    CHECK_BYTES(e, 4 * 44322, 4 * (14774 + 31616), 8 * 14774, 4 * 14774, 0);
    e = estimate(1, 0, 2, SL_PRECISION_FP16, 0);  // the whole master
    CHECK_BYTES(e, 4 * 44320, 4 * 44320, 8 * 44320, 4 * 44320, 0);
    e = estimate(1, 0, 2, SL_PRECISION_BF16, 1);  // fp32 parameters are the master; a bf16 model copy
    CHECK_BYTES(e, 4 * 44320, 4 * 44320, 8 * 44320, 0, 2 * 44320);
    e = estimate(3, 3, 2, SL_PRECISION_BF16, 1);  // ZeRO-3: master slice, bf16 twins of the windows
    CHECK_BYTES(e, 4 * (14774 + 31616), 4 * (14774 + 31616), 8 * 14774, 4 * 14774, 2 * 31616);
}

TEST(bad_setups_are_refused) {
    sl_model_config cfg = tiny3();
    sl_memory_estimate e;
    sl_memory_setup s = {0, 0, 2, SL_PRECISION_FP32, 0, 0, 0, NULL};
    CHECK(sl_memory_estimate_for(&cfg, &s, &e) == -1 && strstr(sl_error(), "world size 0"));
    s = (sl_memory_setup){1, 4, 2, SL_PRECISION_FP32, 0, 0, 0, NULL};
    CHECK(sl_memory_estimate_for(&cfg, &s, &e) == -1 && strstr(sl_error(), "ZeRO stage 4"));
}

// LoRA r=4 on c_attn of the same model: a block's adapters are A (4, 32) + B (96, 4) = 512 floats,
// A = 1536 over units [0, 0, 512, 1024, 1536, 1536]; at 3 ranks S = 512 and the windows W = 2*512. The
// frozen base keeps its 4P = 4*44320 bytes on every rank whatever the stage.
static sl_lora_config c_attn_r4(void) {
    sl_lora_config lc;
    sl_lora_config_defaults(&lc);
    lc.r = 4;
    CHECK(sl_lora_config_set_targets(&lc, "c_attn", "test") == 0);
    return lc;
}

TEST(lora_adapter_terms_match_hand_computed_figures) {
    sl_model_config cfg = tiny3();
    sl_lora_config lc = c_attn_r4();
    sl_memory_estimate e;
    sl_memory_setup s = {3, 0, 2, SL_PRECISION_FP32, 0, 0, 0, &lc};
    CHECK_MSG(sl_memory_estimate_for(&cfg, &s, &e) == 0, "%s", sl_error());
    CHECK(e.P == 1536 && e.frozen == 44320 && e.adapters == 4 * 1536);
    CHECK(e.params == 4 * 44320 && e.grads == 4 * 1536 && e.optim == 8 * 1536 && e.master == 0 && e.param_copy == 0);
    CHECK(e.total == 4 * 44320 + 16 * 1536);
    s.zero_stage = 3;
    CHECK(sl_memory_estimate_for(&cfg, &s, &e) == 0);
    CHECK(e.S == 512 && e.W == 1024 && e.adapters == 4 * (512 + 1024));
    CHECK(e.params == 4 * 44320 && e.grads == 4 * (512 + 1024) && e.optim == 8 * 512);
    s.precision = SL_PRECISION_BF16;  // bf16 storage: the base's copy, the adapter windows' twins, a master slice
    s.act_bf16 = 1;
    CHECK(sl_memory_estimate_for(&cfg, &s, &e) == 0);
    CHECK(e.master == 4 * 512 && e.param_copy == 2 * 44320 + 2 * 1024);
    CHECK(e.total == e.params + e.adapters + e.grads + e.optim + e.master + e.param_copy);
}

// The estimate is what an engine on one rank allocates, stage by stage (with LoRA: the adapters'
// buffers and the frozen base's).
TEST(estimate_equals_engine_allocation) {
    sl_model_config cfg = tiny3();
    sl_comm *world = NULL;
    CHECK_MSG(sl_comm_init_world(&world, "self", NULL, NULL) == 0, "%s", sl_error());
    if (!world) return;
    const sl_ops *tables[2] = {&sl_ops_cpu, &sl_ops_cpu_bf16};
    for (int t = 0; t < 2; t++) {
        for (int p = 0; p < 2; p++) {
            sl_precision prec = p ? SL_PRECISION_BF16 : SL_PRECISION_FP32;
            if (tables[t]->act_bf16 && prec != SL_PRECISION_BF16) continue;  // bf16 storage runs bf16 only
            for (int stage = 0; stage <= 3; stage++)
              for (int o8 = 0; o8 < 4; o8++) {  // AdamW, AdamW8bit (min_8bit_size 64: both kinds of state); then LoRA
                sl_model m;
                sl_engine e;
                sl_lora lora;
                sl_lora_config lc = c_attn_r4();
                int with_lora = o8 >= 2;
                memset(&lora, 0, sizeof lora);
                CHECK_MSG(sl_model_create(&m, &cfg, tables[t]) == 0, "%s", sl_error());
                if (with_lora)
                    CHECK_MSG(sl_lora_create(&lora, &cfg, &lc, tables[t]) == 0 && sl_model_attach_lora(&m, &lora) == 0,
                              "%s", sl_error());
                sl_engine_config ec = {.micro_batch = 1, .grad_accum_steps = 1, .dp = world, .zero_stage = stage,
                                       .reduce_bucket_size = 1 << 20, .first_bucket_size = 1 << 16, .overlap_comm = 1};
                sl_optim_defaults(&ec.optim);
                if (o8 % 2) {
                    ec.optim.type = SL_OPTIM_ADAMW8BIT;
                    ec.optim.min_8bit_size = 64;
                }
                sl_schedule_constant(&ec.schedule, ec.optim.lr);
                sl_loss_scaler_defaults(&ec.precision);
                ec.precision.precision = prec;
                int rc = sl_engine_init(&e, &m, &ec);
                CHECK_MSG(rc == 0, "%s", sl_error());
                if (rc == 0) {
                    sl_engine_memory mem = sl_engine_memory_use(&e);
                    sl_memory_setup s = {1, stage, e.n_optim_state, prec, tables[t]->act_bf16, o8 % 2, 64,
                                         with_lora ? &lc : NULL};
                    sl_memory_estimate est;
                    CHECK(sl_memory_estimate_for(&cfg, &s, &est) == 0);
                    CHECK_MSG(est.params == mem.params && est.grads == mem.grads && est.optim == mem.optim &&
                                  est.master == mem.master && est.param_copy == mem.param_copy &&
                                  est.adapters == mem.adapters,
                              "%s %s stage %d%s%s: estimate %.0f %.0f %.0f %.0f %.0f %.0f, engine %zu %zu %zu %zu %zu %zu",
                              tables[t]->name, sl_precision_name(prec), stage, o8 % 2 ? " AdamW8bit" : "",
                              with_lora ? " LoRA" : "", est.params, est.grads, est.optim, est.master, est.param_copy,
                              est.adapters, mem.params, mem.grads, mem.optim, mem.master, mem.param_copy, mem.adapters);
                    sl_engine_free(&e);
                }
                sl_model_free(&m);
                sl_lora_free(&lora);
            }
        }
    }
    sl_comm_free(world);
}

TEST_MAIN()
