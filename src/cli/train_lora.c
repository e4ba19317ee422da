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

// The flags whose value is a list or a word of PEFT's config, each with its setter.
static const struct {
    const char *flag;
    int (*set)(sl_lora_config *cfg, const char *value, const char *where);
} word_flags[] = {
    {"--lora-targets", sl_lora_config_set_targets},
    {"--lora-modules-to-save", sl_lora_config_set_modules_to_save},
    {"--lora-trainable-tokens", sl_lora_config_set_tokens},
    {"--lora-bias", sl_lora_bias_parse},
    {"--lora-init", sl_lora_init_parse},
};

int train_lora_flag(sl_args *a, sl_train_config *c) {
    char value[SL_LORA_TARGETS_MAX];
    value[0] = '\0';  // a value sl_arg_str refuses (too long) leaves it unwritten, with a->error set
    float alpha;
    if (sl_arg_switch(a, "--lora-rslora")) {
        c->lora.use_rslora = 1;
    } else if (sl_arg_switch(a, "--lora-dora")) {
        c->lora.use_dora = 1;
    } else if (sl_arg_switch(a, "--lora-b-bias")) {
        c->lora.lora_bias = 1;
    } else if (sl_arg_int(a, "--lora-r", 1, SL_NO_MAX, &c->lora.r) ||
               sl_arg_float(a, "--lora-dropout", 0, 1, SL_OPEN_HI, &c->lora.lora_dropout) ||
               sl_arg_str(a, "--adapter", c->adapter, sizeof c->adapter)) {
    } else if (sl_arg_float(a, "--lora-alpha", -SL_FLOAT_MAX, SL_FLOAT_MAX, 0, &alpha)) {
        c->lora.lora_alpha = alpha;
    } else {
        size_t k = 0, n = sizeof word_flags / sizeof word_flags[0];
        while (k < n && !sl_arg_str(a, word_flags[k].flag, value, sizeof value)) k++;
        if (k == n) return 0;
        if (!a->error && word_flags[k].set(&c->lora, value, word_flags[k].flag))
            a->error = 1;  // the message stays in sl_error, which cmd_train prints
    }
    c->lora_enabled = 1;
    return 1;
}

int train_lora_attach(sl_lora *lora, sl_model *model, sl_train_config *c) {
    if (!c->lora_enabled) return 0;
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

int train_lora_host_copy(sl_lora *host_lora, const sl_lora *lora, sl_model *host) {
    memset(host_lora, 0, sizeof *host_lora);
    if (sl_lora_create(host_lora, &lora->model_cfg, &lora->cfg, &sl_ops_cpu)) return -1;
    lora->ops->download(host_lora->params, lora->params, lora->total * sizeof(float));
    if (sl_model_attach_lora(host, host_lora)) {
        sl_lora_free(host_lora);
        return -1;
    }
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

// The quantised base's line: the formula of memory_estimate.h (4P + Q for the base) from the config alone,
// plus the adapters' part: (4 + 4 + K)A at stage 0, the stage's ZeRO formula over A (`formula`) above it.
static void print_quant_base(const sl_engine *e, const sl_quant_base *qb, const sl_memory_estimate *lo,
                             int zero_stage, const char *formula) {
    sl_memory_quant_base est;
    char desc[96], adapters[160];
    if (sl_memory_quant_base_for(&e->model->cfg, &qb->qm.qc, &est)) {
        fprintf(stderr, "warning: no memory estimate: %s\n", sl_error());
        return;
    }
    if (zero_stage == 0) snprintf(adapters, sizeof adapters, "(4 + 4 + K)A with");
    else snprintf(adapters, sizeof adapters, "%s with A=%.0f S=%.0f W=%.0f K=%g,", formula, lo->P, lo->S, lo->W, lo->K);
    printf("  formula 4P + Q + %s P=%.0f (full-precision floats) Q=%.0f (%s over n=%.0f weights): "
           "%.0f bytes; in fp32 the n weights would take %.0f bytes (%.1fx Q)\n", adapters,
           est.P, est.quantised, sl_quant_config_describe(&qb->qm.qc, desc, sizeof desc), est.quantised_numel,
           est.full_precision + est.quantised + lo->adapters + lo->grads + lo->optim, 4.0 * est.quantised_numel,
           est.quantised > 0 ? 4.0 * est.quantised_numel / est.quantised : 0.0);
}

void train_lora_print_memory(const sl_engine *e, const sl_train_config *c, const sl_quant_base *qb) {
    sl_engine_memory mem = sl_engine_memory_use(e);
    const sl_lora *lo = e->model->lora;
    sl_memory_setup setup = sl_memory_setup_of(c, e->model->ops->act_bf16), full = setup;
    full.lora = NULL;
    sl_memory_estimate est, whole;
    if (sl_memory_estimate_for(&e->model->cfg, &setup, &est) || sl_memory_estimate_for(&e->model->cfg, &full, &whole)) {
        fprintf(stderr, "warning: no memory estimate: %s\n", sl_error());
        return;
    }
    char formula[64], base[160];
    adapter_formula(est.formula, formula, sizeof formula);
    size_t quant = qb ? sl_quant_base_bytes(qb) : 0;
    size_t total = mem.params + quant + mem.adapters + mem.grads + mem.optim;
    if (qb) snprintf(base, sizeof base, "%s linears %.2f MB (codes + block statistics) + full-precision tensors %.2f MB",
                     sl_quant_name(qb->qm.qc.type), quant / 1e6, mem.params / 1e6);
    else snprintf(base, sizeof base, "%.2f MB", mem.params / 1e6);
    char ranks[96];
    sl_lora_describe(lo, 0, ranks, sizeof ranks);
    printf("memory per rank (%s %s, %d adapters on %s; ZeRO stage %d, %d ranks): base frozen %s (no "
           "gradients, no optimizer state); adapters %.0f parameters: %.2f MB, gradients %.2f MB, optimizer state "
           "%.2f MB; total %.2f MB = %zu bytes\n",
           qb ? "QLoRA" : "LoRA", ranks, lo->n_adapters + (lo->embed_A >= 0),  // the embedding's adapter counts too
           lo->cfg.all_linear ? "all-linear" : lo->cfg.target_modules,
           setup.zero_stage, setup.world_size, base, (double)lo->total, mem.adapters / 1e6, mem.grads / 1e6,
           mem.optim / 1e6, total / 1e6, total);
    char saved[1024];
    size_t saved_numel = sl_lora_saved_describe(lo, saved, sizeof saved);
    if (saved_numel)
        printf("  trained copies (modules_to_save, bias, tokens): %zu of the adapters' parameters, of %s\n",
               saved_numel, saved);
    if (lo->tokens_weight)  // not in the total: the embedding the lookup (and a tied head) reads
        printf("  trainable tokens: the model reads a copy of the embedding with the trained rows written in, "
               "%.2f MB more\n", (double)lo->model_cfg.padded_vocab_size * lo->model_cfg.n_embd *
               (e->model->ops->act_bf16 ? 2 : 4) / 1e6);
    if (qb) print_quant_base(e, qb, &est, setup.zero_stage, formula);
    else
        printf("  formula 4P + %s with P=%.0f A=%.0f S=%.0f W=%.0f K=%g: %.0f bytes; full fine-tuning would hold %.0f "
               "bytes\n",
               formula, est.frozen, est.P, est.S, est.W, est.K, est.params + est.adapters + est.grads + est.optim,
               whole.params + whole.grads + whole.optim);
    if (mem.master || mem.param_copy)
        printf("  mixed precision adds: the adapters' fp32 master weights %.2f MB, bf16 copies of the base and the "
               "adapters %.2f MB\n", mem.master / 1e6, mem.param_copy / 1e6);
}
