// train_config.c: defaults <- JSON (DeepSpeed keys + "shardlm" block) <- flags, the choices flags name,
// the batch rule and the schedule, and the resolved configuration as JSON.
#include "shardlm/train_config.h"
#include "shardlm/error.h"
#include "shardlm/fileio.h"
#include "shardlm/json_get.h"
#include "shardlm/quant.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sl_train_config_defaults(sl_train_config *c) {
    memset(c, 0, sizeof *c);
    sl_quant_config_default(&c->quant);
    snprintf(c->model, sizeof c->model, "gpt2-demo");
    snprintf(c->data, sizeof c->data, "data/sotu");
    snprintf(c->save_dir, sizeof c->save_dir, "runs/demo");
    c->seq_len = 128;
    c->world_size = 1;
    c->steps = 200;
    c->gradient_clipping = 1.0f;
    sl_optim_defaults(&c->optim);
    sl_loss_scaler_defaults(&c->precision);
    snprintf(c->device, sizeof c->device, "cpu");
    c->optim.lr = 1e-3f;
    c->optim.beta1 = 0.9f;
    c->optim.beta2 = 0.95f;
    c->optim.weight_decay = 0.1f;
    c->seed = 1337;
    c->steps_per_print = 1;
    c->eval_interval = 50;
    c->eval_batches = 8;
    c->sample_tokens = 64;
    c->shuffle = 1;
    c->reduce_bucket_size = 6553600;  // 25 MiB of fp32, PyTorch DDP's bucket_cap_mb (DeepSpeed: 5e8)
    c->first_bucket_size = 262144;
    c->allgather_bucket_size = 500000000;
    c->overlap_comm = 1;
    c->contiguous_gradients = 1;
    c->stage3_prefetch_bucket_size = 50000000;
    sl_lora_config_defaults(&c->lora);
    c->lr_schedule = -1;
    c->warmup_steps = -1;
}

void sl_train_config_free(sl_train_config *c) {
    cJSON_Delete(c->scheduler_block);
    c->scheduler_block = NULL;
}

static const char *const TOP_KEYS[] = {"train_batch_size", "train_micro_batch_size_per_gpu",
                                       "gradient_accumulation_steps", "optimizer", "scheduler",
                                       "gradient_clipping", "steps_per_print", "zero_optimization", "fp16", "bf16",
                                       "bfloat16", "shardlm", "quantization_config", "lora", NULL};
static const char *const ZERO_KEYS[] = {"stage", "reduce_bucket_size", "allgather_bucket_size", "overlap_comm",
                                        "contiguous_gradients", "stage3_prefetch_bucket_size", NULL};
static const char *const OWN_KEYS[] = {"model", "data", "tokenizer", "seq_len", "steps", "seed", "threads",
                                       "eval_interval", "eval_batches", "save_interval", "save_dir",
                                       "metrics", "sample_tokens", "shuffle", "adapter", NULL};

int sl_train_config_apply_json(sl_train_config *c, const cJSON *root, const char *where) {
    if (!cJSON_IsObject(root)) return sl_errorf("%s: expected a JSON object at the top level", where);
    sl_json_warn_unknown(root, TOP_KEYS, where);
    // DeepSpeed's own default for a key the file leaves out: no clipping
    c->gradient_clipping = 0.0f;
    if (sl_json_get_int(root, "train_batch_size", &c->train_batch_size, 0, 0, where) ||
        sl_json_get_int(root, "train_micro_batch_size_per_gpu", &c->micro_batch, 0, 0, where) ||
        sl_json_get_int(root, "gradient_accumulation_steps", &c->grad_accum, 0, 0, where) ||
        sl_json_get_float(root, "gradient_clipping", &c->gradient_clipping, where) ||
        sl_json_get_int(root, "steps_per_print", &c->steps_per_print, 0, 0, where))
        return -1;
    const cJSON *opt = cJSON_GetObjectItemCaseSensitive(root, "optimizer");
    if (opt) {
        char w[1200];
        snprintf(w, sizeof w, "%s: optimizer", where);
        if (sl_optim_parse(&c->optim, opt, w)) return -1;
        if (c->optim.warning[0]) fprintf(stderr, "warning: %s\n", c->optim.warning);
    }
    const cJSON *sched = cJSON_GetObjectItemCaseSensitive(root, "scheduler");
    if (sched) {
        cJSON_Delete(c->scheduler_block);
        c->scheduler_block = cJSON_IsNull(sched) ? NULL : cJSON_Duplicate(sched, 1);
    }
    const cJSON *zero = cJSON_GetObjectItemCaseSensitive(root, "zero_optimization");
    if (zero && !cJSON_IsNull(zero)) {
        char w[1200];
        snprintf(w, sizeof w, "%s: zero_optimization", where);
        if (!cJSON_IsObject(zero)) return sl_errorf("%s: must be an object", w);
        sl_json_warn_unknown(zero, ZERO_KEYS, w);
        int rbs = -1, abs_ = -1, pbs = -1;
        if (sl_json_get_int(zero, "stage", &c->zero_stage, 0, 0, w) ||
            sl_json_get_int(zero, "reduce_bucket_size", &rbs, 0, 1, w) ||
            sl_json_get_int(zero, "allgather_bucket_size", &abs_, 0, 1, w) ||
            sl_json_get_int(zero, "stage3_prefetch_bucket_size", &pbs, 0, 0, w) ||
            sl_json_get_bool(zero, "overlap_comm", &c->overlap_comm, w) ||
            sl_json_get_bool(zero, "contiguous_gradients", &c->contiguous_gradients, w))
            return -1;
        if (c->zero_stage > 3) return sl_errorf("%s: stage must be 0, 1, 2 or 3 (got %d)", w, c->zero_stage);
        if (rbs > 0) c->reduce_bucket_size = (size_t)rbs;
        if (abs_ > 0) c->allgather_bucket_size = (size_t)abs_;
        if (pbs >= 0) c->stage3_prefetch_bucket_size = (size_t)pbs;
        if (c->first_bucket_size > c->reduce_bucket_size) c->first_bucket_size = c->reduce_bucket_size;
    }
    if (cJSON_GetObjectItemCaseSensitive(root, "fp16") || cJSON_GetObjectItemCaseSensitive(root, "bf16") ||
        cJSON_GetObjectItemCaseSensitive(root, "bfloat16")) {
        if (sl_precision_parse(&c->precision, root, where)) return -1;
        if (c->precision.warning[0]) fprintf(stderr, "warning: %s\n", c->precision.warning);
    }
    const cJSON *lora = cJSON_GetObjectItemCaseSensitive(root, "lora");
    if (lora && !cJSON_IsNull(lora)) {
        char w[1200];
        snprintf(w, sizeof w, "%s: lora", where);
        if (sl_lora_config_parse(&c->lora, lora, w)) return -1;
        c->lora_enabled = 1;
    }
    const cJSON *qc = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
    if (qc) {
        char w[1200];
        snprintf(w, sizeof w, "%s: quantization_config", where);
        if (sl_quant_config_parse(qc, &c->quant, w)) return -1;
    }
    const cJSON *own = cJSON_GetObjectItemCaseSensitive(root, "shardlm");
    if (own) {
        char w[1200];
        snprintf(w, sizeof w, "%s: shardlm", where);
        if (!cJSON_IsObject(own)) return sl_errorf("%s: must be an object", w);
        sl_json_warn_unknown(own, OWN_KEYS, w);
        int steps = -1, seed = -1;
        if (sl_json_get_string(own, "model", c->model, sizeof c->model, w) ||
            sl_json_get_string(own, "data", c->data, sizeof c->data, w) ||
            sl_json_get_string(own, "tokenizer", c->tokenizer, sizeof c->tokenizer, w) ||
            sl_json_get_int(own, "seq_len", &c->seq_len, 0, 0, w) || sl_json_get_int(own, "steps", &steps, 0, 0, w) ||
            sl_json_get_int(own, "seed", &seed, 0, 0, w) || sl_json_get_int(own, "threads", &c->threads, 0, 0, w) ||
            sl_json_get_int(own, "eval_interval", &c->eval_interval, 0, 0, w) ||
            sl_json_get_int(own, "eval_batches", &c->eval_batches, 0, 0, w) ||
            sl_json_get_int(own, "save_interval", &c->save_interval, 0, 0, w) ||
            sl_json_get_string(own, "save_dir", c->save_dir, sizeof c->save_dir, w) ||
            sl_json_get_string(own, "metrics", c->metrics, sizeof c->metrics, w) ||
            sl_json_get_int(own, "sample_tokens", &c->sample_tokens, 0, 0, w) ||
            sl_json_get_bool(own, "shuffle", &c->shuffle, w) ||
            sl_json_get_string(own, "adapter", c->adapter, sizeof c->adapter, w))
            return -1;
        if (c->adapter[0]) c->lora_enabled = 1;
        if (steps >= 0) c->steps = steps;
        if (seed >= 0) c->seed = (uint64_t)seed;
    }
    return 0;
}

int sl_train_config_load_json(sl_train_config *c, const char *path) {
    cJSON *root = sl_json_read_strict(path);
    if (!root) return -1;
    int rc = sl_train_config_apply_json(c, root, path);
    cJSON_Delete(root);
    return rc;
}

int sl_train_config_set_optimizer(sl_train_config *c, const char *name) {
    return sl_optim_select(&c->optim, name, "--optimizer");
}

int sl_train_config_set_precision(sl_train_config *c, const char *name) {
    if (!strcmp(name, "fp32")) c->precision.precision = SL_PRECISION_FP32;
    else if (!strcmp(name, "bf16")) c->precision.precision = SL_PRECISION_BF16;
    else if (!strcmp(name, "fp16")) c->precision.precision = SL_PRECISION_FP16;
    else return sl_errorf("--precision must be fp32, bf16 or fp16 (got '%s')", name);
    return 0;
}

int sl_train_config_set_quantize(sl_train_config *c, const char *type) {
    return sl_quant_config_from_flag(type, &c->quant);
}

int sl_train_config_set_lr_schedule(sl_train_config *c, const char *kind) {
    if (!strcmp(kind, "constant")) c->lr_schedule = SL_SCHED_CONSTANT;
    else if (!strcmp(kind, "cosine")) c->lr_schedule = SL_SCHED_WARMUP_COSINE_LR;
    else if (!strcmp(kind, "linear")) c->lr_schedule = SL_SCHED_WARMUP_DECAY_LR;
    else if (!strcmp(kind, "warmup")) c->lr_schedule = SL_SCHED_WARMUP_LR;
    else return sl_errorf("--lr-schedule must be constant, cosine, linear or warmup (got '%s')", kind);
    return 0;
}

// The last step of a named schedule: the run's, or just past the warmup for a run that short.
static int64_t schedule_total_steps(const sl_train_config *c) {
    return c->steps > c->warmup_steps ? c->steps : (int64_t)c->warmup_steps + 1;
}

// --warmup-steps over the config's scheduler block: flags apply after the file, so the flag becomes the
// block's params.warmup_num_steps (saved with the run, as the user's file would have said it).
static int override_block_warmup(sl_train_config *c) {
    if (c->warmup_steps < 1 || !cJSON_IsObject(c->scheduler_block)) return 0;  // not an object: parse says so
    cJSON *params = cJSON_GetObjectItemCaseSensitive(c->scheduler_block, "params");
    if (params && !cJSON_IsNull(params) && !cJSON_IsObject(params))
        return sl_errorf("scheduler: scheduler.params must be an object");
    if (!params || cJSON_IsNull(params)) {
        cJSON_DeleteItemFromObjectCaseSensitive(c->scheduler_block, "params");
        params = cJSON_AddObjectToObject(c->scheduler_block, "params");
    }
    if (params) cJSON_DeleteItemFromObjectCaseSensitive(params, "warmup_num_steps");
    if (!params || !cJSON_AddNumberToObject(params, "warmup_num_steps", (double)c->warmup_steps))
        return sl_errorf("scheduler: out of memory setting warmup_num_steps from --warmup-steps");
    return 0;
}

// The schedule: one named by --lr-schedule, else the config's block (its warmup set by --warmup-steps
// when given), else WarmupCosineLR.
static int resolve_schedule(sl_train_config *c) {
    if (c->lr_schedule < 0 && !c->scheduler_block) c->lr_schedule = SL_SCHED_WARMUP_COSINE_LR;
    if (c->lr_schedule < 0) {
        if (override_block_warmup(c)) return -1;
        if (sl_schedule_parse(&c->schedule, c->scheduler_block, c->optim.lr, "scheduler")) return -1;
        if (c->schedule.warning[0]) fprintf(stderr, "warning: %s\n", c->schedule.warning);
        return 0;
    }
    if (c->warmup_steps < 0) c->warmup_steps = c->steps / 10 >= 1 ? (int)(c->steps / 10) : 1;
    sl_schedule_warmup_linear(&c->schedule, (sl_schedule_type)c->lr_schedule, c->optim.lr, c->warmup_steps,
                              schedule_total_steps(c));
    return 0;
}

int sl_train_config_check_quant(const sl_train_config *c) {
    if (c->quant.type == SL_QUANT_NONE) return 0;
    const char *q = sl_quant_name(c->quant.type);
    if (!c->lora_enabled)   // as PEFT + bitsandbytes: a 4-bit / 8-bit model trains only through adapters
        return sl_errorf("%s base weights (--quantize / quantization_config) are frozen: they train only under LoRA "
                         "adapters (QLoRA: add --lora-r R or a \"lora\" block); full fine-tuning needs the "
                         "full-precision weights", q);
    if (c->precision.precision == SL_PRECISION_FP16)
        return sl_errorf("--precision fp16 with a quantised (%s) base is not supported: the quantised linears compute "
                         "in float32 or bfloat16 (bnb_4bit_compute_dtype); use --precision bf16 or fp32", q);
    if (c->quant.compute_dtype == SL_QDT_BF16 && c->precision.precision != SL_PRECISION_BF16)
        return sl_errorf("bnb_4bit_compute_dtype \"bfloat16\" with a quantised (%s) base computes in bf16: it needs "
                         "--precision bf16 (or \"bf16\": {\"enabled\": true}); for fp32 training give \"float32\"", q);
    if (strncmp(c->device, "cpu", 3) != 0)
        return sl_errorf("--device %s with a quantised (%s) base is not supported: the quantised linears are a CPU "
                         "module (no CUDA kernels yet); use --device cpu", c->device, q);
    return 0;
}

void sl_train_config_quant_compute(sl_train_config *c) {
    if (c->quant.type != SL_QUANT_NONE && c->precision.precision == SL_PRECISION_BF16)
        c->quant.compute_dtype = SL_QDT_BF16;
}

int sl_train_config_resolve(sl_train_config *c, int given) {
    int tb = (given & 1) ? c->train_batch_size : 0, mb = (given & 2) ? c->micro_batch : 0;
    int ga = (given & 4) ? c->grad_accum : 0, W = c->world_size;
    if ((given & 1) && tb <= 0) return sl_errorf("train_batch_size must be positive (got %d)", tb);
    if ((given & 2) && mb <= 0) return sl_errorf("train_micro_batch_size_per_gpu must be positive (got %d)", mb);
    if ((given & 4) && ga <= 0) return sl_errorf("gradient_accumulation_steps must be positive (got %d)", ga);
    if (tb && mb && ga) {
        if ((long long)mb * ga * W != tb)
            return sl_errorf("train_batch_size %d != train_micro_batch_size_per_gpu %d x gradient_accumulation_steps "
                             "%d x data-parallel size %d", tb, mb, ga, W);
    } else if (tb && mb) {
        if (tb % (mb * W)) return sl_errorf("train_batch_size %d is not divisible by micro batch %d x data-parallel "
                                            "size %d", tb, mb, W);
        ga = tb / (mb * W);
    } else if (tb && ga) {
        if (tb % (ga * W)) return sl_errorf("train_batch_size %d is not divisible by gradient_accumulation_steps %d x "
                                            "data-parallel size %d", tb, ga, W);
        mb = tb / (ga * W);
    } else if (tb) {
        ga = 1;
        if (tb % W) return sl_errorf("train_batch_size %d is not divisible by data-parallel size %d", tb, W);
        mb = tb / W;
    } else {
        if (!mb) mb = 8;
        if (!ga) ga = 1;
    }
    if ((long long)mb * ga * W > 1000000000LL)
        return sl_errorf("train batch of %lld sequences (micro %d x accumulation %d x ranks %d) is implausibly large",
                         (long long)mb * ga * W, mb, ga, W);
    c->micro_batch = mb;
    c->grad_accum = ga;
    c->train_batch_size = mb * ga * W;
    if (c->seq_len <= 0) return sl_errorf("seq_len must be positive (got %d)", c->seq_len);
    if (c->zero_stage < 0 || c->zero_stage > 3)
        return sl_errorf("zero_optimization.stage must be 0, 1, 2 or 3 (got %d)", c->zero_stage);
    if (c->steps < 0) return sl_errorf("steps must be non-negative");
    if (c->eval_interval > 0 && c->eval_batches <= 0)
        return sl_errorf("eval_batches must be positive when eval_interval is set (got %d)", c->eval_batches);
    if (c->eval_interval < 0 || c->save_interval < 0 || c->sample_tokens < 0 || c->steps_per_print < 0)
        return sl_errorf("eval_interval, save_interval, sample_tokens and steps_per_print must be >= 0");
    if (!(c->gradient_clipping >= 0)) return sl_errorf("gradient_clipping must be >= 0 (got %g)", c->gradient_clipping);
    if (c->lora_enabled && sl_lora_config_check(&c->lora, "lora")) return -1;
    sl_train_config_quant_compute(c);
    if (sl_train_config_check_quant(c)) return -1;   // QLoRA: a frozen quantised base under trained adapters
    if (resolve_schedule(c)) return -1;
    if (!c->metrics[0]) snprintf(c->metrics, sizeof c->metrics, "%.900s/metrics.jsonl", c->save_dir);
    return 0;
}

char *sl_train_config_to_json(const sl_train_config *c) {
    cJSON *r = cJSON_CreateObject();
    cJSON_AddNumberToObject(r, "train_batch_size", c->train_batch_size);
    cJSON_AddNumberToObject(r, "train_micro_batch_size_per_gpu", c->micro_batch);
    cJSON_AddNumberToObject(r, "gradient_accumulation_steps", c->grad_accum);
    cJSON_AddNumberToObject(r, "gradient_clipping", c->gradient_clipping);
    cJSON_AddNumberToObject(r, "steps_per_print", c->steps_per_print);
    cJSON *opt = cJSON_AddObjectToObject(r, "optimizer");
    cJSON_AddStringToObject(opt, "type", sl_optim_name(c->optim.type));
    cJSON *p = cJSON_AddObjectToObject(opt, "params");
    cJSON_AddNumberToObject(p, "lr", c->optim.lr);
    cJSON_AddNumberToObject(p, "weight_decay", c->optim.weight_decay);
    if (c->optim.type == SL_OPTIM_SGD) {
        cJSON_AddNumberToObject(p, "momentum", c->optim.momentum);
        cJSON_AddNumberToObject(p, "dampening", c->optim.dampening);
        cJSON_AddBoolToObject(p, "nesterov", c->optim.nesterov);
    } else {
        cJSON *betas = cJSON_AddArrayToObject(p, "betas");
        cJSON_AddItemToArray(betas, cJSON_CreateNumber(c->optim.beta1));
        cJSON_AddItemToArray(betas, cJSON_CreateNumber(c->optim.beta2));
        cJSON_AddNumberToObject(p, "eps", c->optim.eps);
        if (c->optim.type == SL_OPTIM_ADAM) cJSON_AddFalseToObject(p, "adam_w_mode");
        if (c->optim.type == SL_OPTIM_ADAMW8BIT) cJSON_AddNumberToObject(p, "min_8bit_size", (double)c->optim.min_8bit_size);
    }
    if (c->optim.decay_all) cJSON_AddTrueToObject(p, "decay_all");
    cJSON *sched = c->lr_schedule >= 0 ? sl_schedule_warmup_linear_block((sl_schedule_type)c->lr_schedule, c->optim.lr,
                                                                          c->warmup_steps, schedule_total_steps(c))
                   : c->scheduler_block ? cJSON_Duplicate(c->scheduler_block, 1) : NULL;
    if (sched) cJSON_AddItemToObject(r, "scheduler", sched);
    cJSON *z = cJSON_AddObjectToObject(r, "zero_optimization");
    cJSON_AddNumberToObject(z, "stage", c->zero_stage);
    cJSON_AddNumberToObject(z, "reduce_bucket_size", (double)c->reduce_bucket_size);
    cJSON_AddNumberToObject(z, "allgather_bucket_size", (double)c->allgather_bucket_size);
    cJSON_AddBoolToObject(z, "overlap_comm", c->overlap_comm);
    cJSON_AddBoolToObject(z, "contiguous_gradients", c->contiguous_gradients);
    cJSON_AddNumberToObject(z, "stage3_prefetch_bucket_size", (double)c->stage3_prefetch_bucket_size);
    const sl_loss_scaler_config *pc = &c->precision;
    cJSON *f16 = cJSON_AddObjectToObject(r, "fp16");
    cJSON_AddBoolToObject(f16, "enabled", pc->precision == SL_PRECISION_FP16);
    cJSON_AddNumberToObject(f16, "loss_scale", pc->loss_scale);
    cJSON_AddNumberToObject(f16, "initial_scale_power", pc->initial_scale_power);
    cJSON_AddNumberToObject(f16, "loss_scale_window", pc->loss_scale_window);
    cJSON_AddNumberToObject(f16, "hysteresis", pc->hysteresis);
    cJSON_AddBoolToObject(f16, "consecutive_hysteresis", pc->consecutive_hysteresis);
    cJSON_AddNumberToObject(f16, "min_loss_scale", pc->min_loss_scale);
    cJSON *b16 = cJSON_AddObjectToObject(r, "bf16");
    cJSON_AddBoolToObject(b16, "enabled", pc->precision == SL_PRECISION_BF16);
    cJSON_AddBoolToObject(b16, "check_grad_overflow", pc->bf16_check_grad_overflow);
    if (c->quant.type != SL_QUANT_NONE) cJSON_AddItemToObject(r, "quantization_config", sl_quant_config_to_json(&c->quant));
    cJSON *s = cJSON_AddObjectToObject(r, "shardlm");
    cJSON_AddStringToObject(s, "model", c->model);
    cJSON_AddStringToObject(s, "data", c->data);
    if (c->tokenizer[0]) cJSON_AddStringToObject(s, "tokenizer", c->tokenizer);
    cJSON_AddNumberToObject(s, "seq_len", c->seq_len);
    cJSON_AddNumberToObject(s, "steps", (double)c->steps);
    cJSON_AddNumberToObject(s, "seed", (double)c->seed);
    cJSON_AddNumberToObject(s, "threads", c->threads);
    cJSON_AddNumberToObject(s, "eval_interval", c->eval_interval);
    cJSON_AddNumberToObject(s, "eval_batches", c->eval_batches);
    cJSON_AddNumberToObject(s, "save_interval", c->save_interval);
    cJSON_AddStringToObject(s, "save_dir", c->save_dir);
    cJSON_AddStringToObject(s, "metrics", c->metrics);
    cJSON_AddNumberToObject(s, "sample_tokens", c->sample_tokens);
    cJSON_AddBoolToObject(s, "shuffle", c->shuffle);
    if (c->adapter[0]) cJSON_AddStringToObject(s, "adapter", c->adapter);
    if (c->lora_enabled && sl_lora_config_to_json(&c->lora, cJSON_AddObjectToObject(r, "lora"))) {
        cJSON_Delete(r);
        return NULL;
    }
    char *out = cJSON_Print(r);
    cJSON_Delete(r);
    return out;
}
