// train_lora.c: LoRA for `shardlm train` (train_lora.h). The flags fill the config's "lora" block
// (PEFT's words, so flags and JSON are one setting); the adapters are built here and attached to the
// model, after which the engine trains them alone.
#include "cli/train_lora.h"
#include "shardlm/error.h"
#include "shardlm/memory_estimate.h"
#include "shardlm/peft_adapter.h"
#include "shardlm/rng.h"

#include <stdio.h>
#include <string.h>

int train_lora_flag(sl_args *a, sl_train_config *c) {
    char targets[SL_LORA_TARGETS_MAX];
    float alpha;
    if (sl_arg_switch(a, "--lora-rslora")) {
        c->lora.use_rslora = 1;
    } else if (sl_arg_int(a, "--lora-r", 1, SL_NO_MAX, &c->lora.r) ||
               sl_arg_float(a, "--lora-dropout", 0, 1, SL_OPEN_HI, &c->lora.lora_dropout) ||
               sl_arg_str(a, "--adapter", c->adapter, sizeof c->adapter)) {
    } else if (sl_arg_float(a, "--lora-alpha", -SL_FLOAT_MAX, SL_FLOAT_MAX, 0, &alpha)) {
        c->lora.lora_alpha = alpha;
    } else if (sl_arg_str(a, "--lora-targets", targets, sizeof targets)) {
        if (sl_lora_config_set_targets(&c->lora, targets, "--lora-targets")) {
            fprintf(stderr, "error: %s\n", sl_error());
            a->error = 1;
        }
    } else {
        return 0;
    }
    c->lora_enabled = 1;
    return 1;
}

int train_lora_attach(sl_lora *lora, sl_model *model, sl_train_config *c) {
    if (!c->lora_enabled) return 0;
    if (c->sample_tokens > 0 && (model->ops->on_device || model->ops->act_bf16))
        return sl_errorf("the sample after a LoRA run decodes on the CPU in fp32 only: pass --sample-tokens 0");
    int rc = c->adapter[0] ? sl_peft_load(c->adapter, &model->cfg, model->ops, lora)
                           : sl_lora_create(lora, &model->cfg, &c->lora, model->ops);
    if (rc) return -1;
    if ((!c->adapter[0] && sl_lora_init_weights(lora, c->seed)) || sl_model_attach_lora(model, lora)) {
        sl_lora_free(lora);
        return -1;
    }
    snprintf(lora->base_model, sizeof lora->base_model, "%s", c->model);
    c->lora = lora->cfg;  // what runs (an adapter's settings, PEFT's default targets) is what the config says
    return 0;
}

uint64_t train_lora_dropout_seed(uint64_t seed, int rank, int64_t step, int k) {
    sl_rng rng = sl_rng_make(seed, (uint64_t)rank, (uint64_t)step * 65536u + (uint64_t)k, SL_RNG_DROPOUT);
    return sl_rng_u64(&rng);
}

// The ZeRO formula of the adapters' buffer: the stage's formula with its P read as A.
static void adapter_formula(const char *formula, char *out, size_t cap) {
    size_t i = 0;
    for (; formula[i] && i + 1 < cap; i++) out[i] = formula[i] == 'P' ? 'A' : formula[i];
    out[i] = '\0';
}

void train_lora_print_memory(const sl_engine *e, const sl_train_config *c) {
    sl_engine_memory mem = sl_engine_memory_use(e);
    const sl_lora *lo = e->model->lora;
    sl_memory_setup setup = sl_memory_setup_of(c, e->model->ops->act_bf16), full = setup;
    full.lora = NULL;
    sl_memory_estimate est, whole;
    if (sl_memory_estimate_for(&e->model->cfg, &setup, &est) || sl_memory_estimate_for(&e->model->cfg, &full, &whole)) {
        fprintf(stderr, "warning: no memory estimate: %s\n", sl_error());
        return;
    }
    char formula[64];
    adapter_formula(est.formula, formula, sizeof formula);
    size_t total = mem.params + mem.adapters + mem.grads + mem.optim;
    printf("memory per rank (LoRA r=%d, %d adapters on %s; ZeRO stage %d, %d ranks): base frozen %.2f MB (no "
           "gradients, no optimizer state); adapters %.0f parameters: %.2f MB, gradients %.2f MB, optimizer state "
           "%.2f MB; total %.2f MB = %zu bytes\n"
           "  formula 4P + %s with P=%.0f A=%.0f S=%.0f W=%.0f K=%g: %.0f bytes; full fine-tuning would hold %.0f "
           "bytes\n",
           lo->cfg.r, lo->n_adapters, lo->cfg.all_linear ? "all-linear" : lo->cfg.target_modules, setup.zero_stage,
           setup.world_size, mem.params / 1e6, (double)lo->total, mem.adapters / 1e6, mem.grads / 1e6,
           mem.optim / 1e6, total / 1e6, total, formula, est.frozen, est.P, est.S, est.W, est.K,
           est.params + est.adapters + est.grads + est.optim, whole.params + whole.grads + whole.optim);
    if (mem.master || mem.param_copy)
        printf("  mixed precision adds: the adapters' fp32 master weights %.2f MB, bf16 copies of the base and the "
               "adapters %.2f MB\n", mem.master / 1e6, mem.param_copy / 1e6);
}
