// train.c: `shardlm train`: builds the resolved configuration (defaults <- --config JSON <- flags),
// the model (preset, config.json, Hugging Face directory or checkpoint), the loaders and the engine,
// then runs the loop: micro-batches -> engine step -> progress line + metrics JSON line, validation
// every eval_interval steps, checkpoints every save_interval steps and at the end, and a sample.
// SIGINT/SIGTERM finish the current step, save a checkpoint and exit non-zero.
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/train_lora.h"
#include "shardlm/cpu_features.h"
#include "shardlm/checkpoint.h"
#include "shardlm/comm.h"
#include "shardlm/engine.h"
#include "shardlm/launch_env.h"
#include "shardlm/error.h"
#include "shardlm/fault.h"
#include "shardlm/fileio.h"
#include "shardlm/generate.h"
#include "shardlm/heartbeat.h"
#include "shardlm/hf_weights.h"
#include "shardlm/loader.h"
#include "shardlm/manifest.h"
#include "shardlm/memory_estimate.h"
#include "shardlm/metrics.h"
#include "shardlm/model_source.h"
#include "shardlm/quant_base.h"
#include "shardlm/resume.h"
#include "shardlm/train_config.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static volatile sig_atomic_t stop_signal = 0;
static int is_rank0 = 1;  // only data-parallel rank 0 prints, writes metrics and samples
static void on_signal(int sig) { stop_signal = sig; }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void usage(FILE *f) {
    fprintf(f,
        "usage: shardlm train [--config ds_config.json] [flags]\n\n"
        "Trains a GPT-2 or LLaMA model on prepared token shards (see `shardlm prepare`).\n"
        "Configuration: built-in defaults <- --config (DeepSpeed keys + a \"shardlm\" block) <- flags.\n\n"
        "model and data:\n"
        "  --model SPEC            preset (gpt2, gpt2-medium, gpt2-large, gpt2-xl, gpt2-demo, gpt2-tiny,\n"
        "                          llama-demo, llama-tiny), a config.json, a Hugging Face directory or a\n"
        "                          checkpoint to start from (default gpt2-demo)\n"
        "  --data DIR              prepared data directory with train_*.bin / val_*.bin (default data/sotu)\n"
        "  --tokenizer DIR         tokenizer for the sample (default DATA/tokenizer)\n"
        "  --seq-len T             sequence length (default 128)\n"
        "batch (DeepSpeed's rule: train_batch_size = micro x accumulation x data-parallel size):\n"
        "  --batch-size B          train_micro_batch_size_per_gpu (default 8)\n"
        "  --grad-accum N          gradient_accumulation_steps (default 1)\n"
        "  --train-batch-size N    train_batch_size\n"
        "optimisation:\n"
        "  --steps N               optimizer steps (default 200)\n"
        "  --optimizer NAME        adamw | adam | sgd | adamw8bit (default adamw, betas 0.9/0.95)\n"
        "  --lr LR                 peak learning rate (default 1e-3)\n"
        "  --weight-decay WD       (default 0.1; linear weights only unless --decay-all)\n"
        "  --decay-all             also decay norms, biases and embeddings\n"
        "  --momentum M            SGD momentum\n"
        "  --grad-clip NORM        gradient_clipping, 0 = off (default 1.0; with --config, the file's value or 0)\n"
        "  --lr-schedule KIND      constant | cosine (WarmupCosineLR) | linear (WarmupDecayLR) | warmup (WarmupLR);\n"
        "                          replaces the config's scheduler block. Default, also with a --config that has\n"
        "                          no scheduler block: cosine: the lr rises linearly from 0 over the warmup, then\n"
        "                          falls along a cosine towards 0.1 x lr at the last step (constant: --lr always)\n"
        "  --warmup-steps N        warmup steps for --lr-schedule, >= 1 (default max(1, steps/10); DeepSpeed\n"
        "                          warms up over at least 2); with a config's scheduler block and no\n"
        "                          --lr-schedule, sets its params.warmup_num_steps\n"
        "run control:\n"
        "  --seed S                (default 1337)\n"
        "  --threads N             CPU threads (default OMP_NUM_THREADS or all cores)\n"
        "  --precision P           fp32 | bf16 | fp16 (DeepSpeed's bf16 / fp16 blocks: fp32 master weights,\n"
        "                          16-bit parameters and gradients; fp16 with dynamic loss scaling)\n"
        "  --quantize TYPE         nf4 | fp4 | int8: hold the frozen base quantised as bitsandbytes does (nf4 with\n"
        "                          double-quantised scales; transformers' quantization_config in the JSON config\n"
        "                          says the same) and train LoRA adapters on it (QLoRA; needs --lora-* flags;\n"
        "                          with --precision bf16 the tiles compute in bf16: compute dtype bfloat16)\n"
        "  --device D              cpu | cuda | cuda:N (default cpu; cuda uses GPU LOCAL_RANK)\n"
        "  --comm-backend B        auto | self | mpi | nccl (default auto: mpi when started as several ranks,\n"
        "                          else self); nccl (GPU memory, one GPU per local rank) is required by\n"
        "                          --device cuda with several ranks or ZeRO, and works with one process\n"
        "  --log-interval N        steps_per_print (default 1)\n"
        "  --eval-interval N       validation every N steps, 0 = never (default 50)\n"
        "  --eval-batches N        validation batches (default 8)\n"
        "  --save-dir DIR          checkpoint root (default runs/demo)\n"
        "  --save-interval N       checkpoint every N steps (default: only at the end)\n"
        "  --no-save               never write checkpoints\n"
        "  --no-shuffle            read training windows in file order (default: shuffled from the seed)\n"
        "  --no-verify             load checkpoints (--model, --resume) without checking their files' sizes and\n"
        "                          FNV-1a checksums against manifest.json (default: checked)\n"
        "  --no-overlap-comm       all-reduce gradients after backward instead of during it\n"
        "  --zero-stage N          ZeRO stage 0-3 (zero_optimization.stage)\n"
        "  --resume [PATH]         continue from PATH (a checkpoint root or tag); `--resume auto` or a bare\n"
        "                          --resume uses SAVE_DIR if it holds a checkpoint\n"
        "  --metrics FILE          JSON-lines metrics (default SAVE_DIR/metrics.jsonl)\n"
        "  --sample-tokens N       tokens to generate after training (default 64, 0 = none)\n"
        TRAIN_LORA_USAGE);
}

// What flags set besides the training configuration: which of the DeepSpeed batch triple were given
// (bits 1 train_batch_size, 2 micro, 4 accumulation: sl_train_config_resolve's `given`) and the comm
// backend the world is created with.
typedef struct {
    int batch_given;
    char comm_backend[16];  // sl_comm_init_world's name, default "auto"
} run_flags;

// The value of `--name V` / `--name=V` wherever it stands (the last one), or NULL: for the flags that
// apply before the others.
static const char *early_flag(int argc, char **argv, const char *name) {
    const char *v = NULL;
    size_t n = strlen(name);
    for (int i = 1; i < argc; i++) {
        if (!strncmp(argv[i], name, n) && argv[i][n] == '=') v = argv[i] + n + 1;
        else if (!strcmp(argv[i], name) && i + 1 < argc) v = argv[i + 1];
    }
    return v;
}

// A real-valued flag read as float32 (as the JSON reader's floats) into a double field.
static int arg_real(sl_args *a, const char *name, double *out) {
    float v;
    if (!sl_arg_float(a, name, 0, SL_FLOAT_MAX, 0, &v)) return 0;
    if (!a->error) *out = v;
    return 1;
}

// A choice flag handed to its setter (train_config.h); a refused value sets a->error (and sl_error,
// which cmd_train prints).
static int arg_choice(sl_args *a, const char *name, sl_train_config *c, int (*set)(sl_train_config *, const char *)) {
    char v[32];
    if (!sl_arg_str(a, name, v, sizeof v)) return 0;
    if (!a->error && set(c, v)) a->error = 1;
    return 1;
}

// Fills c: the JSON config first (wherever --config stands), then --optimizer (a type switch that
// keeps lr, weight decay and betas, so the optimizer's own flags apply after it wherever they stand),
// then every other flag straight into its field. Returns 0, 1 for --help, -1 on error (printed here
// for a malformed flag, else left in sl_error for cmd_train to print).
static int parse_flags(int argc, char **argv, sl_train_config *c, run_flags *r) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return 1;
    const char *config = early_flag(argc, argv, "--config"), *optimizer = early_flag(argc, argv, "--optimizer");
    if (config) {
        if (sl_train_config_load_json(c, config)) return -1;
        r->batch_given |= (c->train_batch_size ? 1 : 0) | (c->micro_batch ? 2 : 0) | (c->grad_accum ? 4 : 0);
    }
    if (optimizer && sl_train_config_set_optimizer(c, optimizer)) return -1;
    sl_args a = {argc, argv, 1, NULL, 0};
    char skip[SL_PATH_MAX];
    int v;  // an integer flag whose field is wider than int
    for (; a.i < argc && !a.error; a.i++) {
        if (sl_arg_str(&a, "--config", skip, sizeof skip) || sl_arg_str(&a, "--optimizer", skip, sizeof skip)) continue;
        if (sl_arg_str(&a, "--model", c->model, sizeof c->model)) continue;
        if (sl_arg_str(&a, "--data", c->data, sizeof c->data)) continue;
        if (sl_arg_str(&a, "--tokenizer", c->tokenizer, sizeof c->tokenizer)) continue;
        if (sl_arg_int(&a, "--seq-len", 1, SL_NO_MAX, &c->seq_len)) continue;
        if (sl_arg_int(&a, "--batch-size", 1, SL_NO_MAX, &c->micro_batch)) { r->batch_given |= 2; continue; }
        if (sl_arg_int(&a, "--grad-accum", 1, SL_NO_MAX, &c->grad_accum)) { r->batch_given |= 4; continue; }
        if (sl_arg_int(&a, "--train-batch-size", 1, SL_NO_MAX, &c->train_batch_size)) { r->batch_given |= 1; continue; }
        if (sl_arg_int(&a, "--steps", 0, SL_NO_MAX, &v)) { if (!a.error) c->steps = v; continue; }
        if (arg_real(&a, "--lr", &c->optim.lr)) continue;
        if (arg_real(&a, "--weight-decay", &c->optim.weight_decay)) continue;
        if (arg_real(&a, "--momentum", &c->optim.momentum)) continue;
        if (sl_arg_switch(&a, "--decay-all")) { c->optim.decay_all = 1; continue; }
        if (sl_arg_float(&a, "--grad-clip", 0, SL_FLOAT_MAX, 0, &c->gradient_clipping)) continue;
        if (arg_choice(&a, "--lr-schedule", c, sl_train_config_set_lr_schedule)) continue;
        if (sl_arg_int(&a, "--warmup-steps", 1, SL_NO_MAX, &c->warmup_steps)) continue;
        if (sl_arg_int(&a, "--seed", 0, SL_NO_MAX, &v)) { if (!a.error) c->seed = (uint64_t)v; continue; }
        if (sl_arg_int(&a, "--threads", 0, SL_NO_MAX, &c->threads)) continue;
        if (arg_choice(&a, "--precision", c, sl_train_config_set_precision)) continue;
        if (arg_choice(&a, "--quantize", c, sl_train_config_set_quantize)) continue;
        if (sl_arg_str(&a, "--device", c->device, sizeof c->device)) continue;
        if (sl_arg_str(&a, "--comm-backend", r->comm_backend, sizeof r->comm_backend)) continue;
        if (sl_arg_int(&a, "--log-interval", 0, SL_NO_MAX, &c->steps_per_print)) continue;
        if (sl_arg_int(&a, "--eval-interval", 0, SL_NO_MAX, &c->eval_interval)) continue;
        if (sl_arg_int(&a, "--eval-batches", 0, SL_NO_MAX, &c->eval_batches)) continue;
        if (sl_arg_str(&a, "--save-dir", c->save_dir, sizeof c->save_dir)) continue;
        if (sl_arg_int(&a, "--save-interval", 0, SL_NO_MAX, &c->save_interval)) continue;
        if (sl_arg_switch(&a, "--no-save")) { c->no_save = 1; continue; }
        if (sl_arg_switch(&a, "--no-shuffle")) { c->shuffle = 0; continue; }
        if (sl_arg_switch(&a, "--no-verify")) { c->no_verify = 1; continue; }
        if (sl_arg_switch(&a, "--no-overlap-comm")) { c->overlap_comm = 0; continue; }
        if (sl_arg_int(&a, "--zero-stage", 0, 3, &c->zero_stage)) continue;
        if (sl_arg_switch(&a, "--resume")) {
            // optional value: a following argument that is not a flag
            if (a.i + 1 < argc && strncmp(argv[a.i + 1], "--", 2) != 0) snprintf(c->resume, sizeof c->resume, "%s", argv[++a.i]);
            else snprintf(c->resume, sizeof c->resume, "auto");
            continue;
        }
        if (sl_arg_str(&a, "--resume", c->resume, sizeof c->resume)) continue;
        if (sl_arg_str(&a, "--metrics", c->metrics, sizeof c->metrics)) continue;
        if (sl_arg_int(&a, "--sample-tokens", 0, SL_NO_MAX, &c->sample_tokens)) continue;
        if (train_lora_flag(&a, c)) continue;
        fprintf(stderr, "error: unknown flag '%s' (see shardlm train --help)\n", argv[a.i]);
        return -1;
    }
    return a.error ? -1 : 0;
}

static int dir_has_checkpoint(const char *dir) {
    char p[SL_PATH_MAX + 16];
    struct stat st;
    snprintf(p, sizeof p, "%s/latest", dir);
    return stat(p, &st) == 0;
}

static int val_shards_exist(const char *data) {
    char p[SL_PATH_MAX + 32];
    struct stat st;
    snprintf(p, sizeof p, "%s/val_000000.bin", data);
    return stat(p, &st) == 0;
}

// Mean loss over n batches of the validation loader (from its start).
static int evaluate(sl_model *m, sl_comm *world, sl_loader *val, int n, int B, int T, int *in, int *tg, float *out) {
    sl_loader_reset(val);
    double sum = 0.0;
    // every rank runs the same number of forwards (ZeRO-3 gathers parameters collectively in each)
    long long avail = (long long)sl_loader_batches_per_epoch(val);
    if (sl_comm_allreduce(world, &avail, 1, SL_DTYPE_I64, SL_OP_MIN)) return -1;
    if (n > avail) n = (int)avail;
    for (int i = 0; i < n; i++) {
        float loss;
        if (sl_loader_next(val, in, tg) || sl_model_forward(m, in, tg, B, T, &loss)) return -1;
        sum += loss;
    }
    double totals[2] = {sum, (double)n};  // each rank evaluates its own slice of the validation set
    if (sl_comm_allreduce(world, totals, 2, SL_DTYPE_F64, SL_OP_SUM)) return -1;
    *out = totals[1] > 0 ? (float)(totals[0] / totals[1]) : NAN;
    return 0;
}

// Hugging Face weights into the model, through a host buffer when the model lives on a GPU.
static int load_weights(sl_model *m, const char *dir) {
    if (!m->ops->on_device) return sl_hf_load(dir, &m->layout, m->params);
    float *host = sl_calloc(m->layout.total, sizeof(float), "weights");
    int rc = !host || sl_hf_load(dir, &m->layout, host);
    if (!rc) m->ops->upload(m->params, host, m->layout.total * sizeof(float));
    free(host);
    return rc ? -1 : 0;
}

// AdamW8bit: this rank's state bytes against the formula (and what AdamW would hold).
static void print_adam8_state(const sl_engine *e) {
    if (e->cfg.optim.type != SL_OPTIM_ADAMW8BIT) return;
    const sl_adam8_plan *p = &e->adam8_plan;
    printf("  optimizer AdamW8bit state on this rank: 2 B x %zu (8-bit exp_avg + exp_avg_sq) + 8 B x %zu blocks "
           "of %d (absmax) + 8 B x %zu (32-bit state, tensors under min_8bit_size %lld) = %zu bytes; AdamW "
           "would hold 8 B x %zu = %zu\n", p->n8, p->n_blocks, SL_ADAM8_BLOCK, p->n32, e->cfg.optim.min_8bit_size,
           sl_adam8_state_bytes(p), p->end - p->begin, 8 * (p->end - p->begin));
}

// What this rank allocated for model states, next to the estimate from the configuration alone
// (memory_estimate.h: the ZeRO paper's formula) and what stage 0 would hold.
static void print_memory(const sl_engine *e, const sl_train_config *c, const sl_quant_base *qb) {
    if (e->model->lora) {
        train_lora_print_memory(e, c, qb);
        print_adam8_state(e);
        return;
    }
    sl_engine_memory mem = sl_engine_memory_use(e);
    sl_memory_setup setup = sl_memory_setup_of(c, e->model->ops->act_bf16), stage0 = setup;
    stage0.zero_stage = 0;
    sl_memory_estimate est, zero0;
    if (sl_memory_estimate_for(&e->model->cfg, &setup, &est) || sl_memory_estimate_for(&e->model->cfg, &stage0, &zero0)) {
        fprintf(stderr, "warning: no memory estimate: %s\n", sl_error());
        return;
    }
    size_t total = mem.params + mem.grads + mem.optim;
    printf("memory per rank (ZeRO stage %d, %d ranks): parameters %.2f MB, gradients %.2f MB, optimizer state "
           "%.2f MB; total %.2f MB = %zu bytes\n  formula %s with P=%.0f S=%.0f W=%.0f K=%g: %.0f bytes; "
           "stage 0 would hold %.0f bytes\n",
           setup.zero_stage, setup.world_size, mem.params / 1e6, mem.grads / 1e6, mem.optim / 1e6, total / 1e6, total,
           est.formula, est.P, est.S, est.W, est.K, est.params + est.grads + est.optim,
           zero0.params + zero0.grads + zero0.optim);
    print_adam8_state(e);
    if (mem.master || mem.param_copy)
        printf("  mixed precision adds: fp32 master weights %.2f MB, bf16 parameter copy %.2f MB (total %.2f MB)\n",
               mem.master / 1e6, mem.param_copy / 1e6, (total + mem.master + mem.param_copy) / 1e6);
}

static int save_checkpoint(sl_engine *e, const sl_train_config *c, sl_loader *train, sl_progress *prog) {
    char tag[64], pos[256], *cfg_json = sl_train_config_to_json(c);
    snprintf(tag, sizeof tag, "step_%08lld", (long long)e->step);
    sl_heartbeat_progress(e->step, "checkpoint save");
    sl_loader_position p = sl_loader_tell(train);
    sl_loader_position_to_json(&p, pos, sizeof pos);
    size_t need = strlen(pos) + (cfg_json ? strlen(cfg_json) : 4) + 128;
    char *client = malloc(need);
    if (!client) { free(cfg_json); return sl_errorf("out of memory"); }
    // RNG state: every stream is a pure function of (seed, rank, step, purpose), so the seed and the
    // step (saved by the engine) are the whole state
    snprintf(client, need, "{\"loader\": %s, \"rng\": {\"seed\": %llu, \"scheme\": \"counter-based\"}, "
             "\"config\": %s}", pos, (unsigned long long)c->seed, cfg_json ? cfg_json : "null");
    free(cfg_json);
    int rc = sl_engine_save(e, c->save_dir, tag, client);
    free(client);
    if (rc == 0 && is_rank0) {
        char line[SL_PATH_MAX + 128];
        snprintf(line, sizeof line, "saved checkpoint %s/%s", c->save_dir, tag);
        sl_progress_message(prog, line);
    }
    return rc;
}

// Restores the loader position saved in a checkpoint's client state, once the train layer has
// checked that this run reads the same data the same way (resume.h).
static int restore_loader(sl_loader *train, const char *client, const sl_train_config *c) {
    sl_resume_state saved;
    sl_resume_plan plan;
    if (sl_resume_state_parse(&saved, client) ||
        sl_resume_check(&saved, c, (int64_t)sl_loader_batches_per_epoch(train), &plan))
        return -1;
    for (int i = 0; i < plan.n_warnings && is_rank0; i++) fprintf(stderr, "warning: %s\n", plan.warnings[i]);
    return sl_loader_seek(train, &plan.position);
}

static int run(sl_train_config *c, sl_comm *world) {
    int rc = -1;
    sl_model model;
    sl_lora lora;
    sl_engine engine;
    sl_quant_base qbase = {0};   // QLoRA's quantised base (quant_base.h), when the run has one
    sl_loader *train = NULL, *val = NULL;
    sl_metrics *metrics = NULL;
    sl_tokenizer *tok = NULL;
    int *in = NULL, *tg = NULL, have_model = 0, have_engine = 0;
    memset(&model, 0, sizeof model);
    memset(&lora, 0, sizeof lora);
    sl_progress prog;
    sl_progress_init(&prog, stdout);

    sl_model_source src;
    if (sl_model_source_resolve(&src, c->model)) return -1;
    char tok_dir[SL_PATH_MAX + 16];
    if (c->tokenizer[0]) snprintf(tok_dir, sizeof tok_dir, "%s", c->tokenizer);
    else snprintf(tok_dir, sizeof tok_dir, "%s/tokenizer", c->data);
    struct stat st;
    if (sl_tokenizer_load_dir(&tok, tok_dir)) {
        // a tokenizer that is named or present but broken is an error; only a missing one is not
        if (c->tokenizer[0] || stat(tok_dir, &st) == 0) goto done;
        fprintf(stderr, "warning: no tokenizer (%s); training continues without a text sample\n", sl_error());
        tok = NULL;
    }
    // a preset adopts the data's vocabulary so the demo works with any tokenizer; a config.json, a
    // Hugging Face directory or a checkpoint states its vocab_size, which must be the tokenizer's
    sl_model_config preset;
    int is_preset = !src.has_weights && sl_config_preset(&preset, c->model) == 0;
    if (is_preset && tok && src.cfg.vocab_size != sl_tokenizer_vocab_size(tok)) {
        src.cfg.vocab_size = sl_tokenizer_vocab_size(tok);
        int eot = sl_tokenizer_eot_id(tok);
        if (eot >= 0) src.cfg.bos_token_id = src.cfg.eos_token_id = eot;
        if (sl_config_validate(&src.cfg, c->model)) goto done;
    }
    if (!is_preset && tok && sl_tokenizer_check_model_vocab(tok, tok_dir, src.cfg.vocab_size, c->model, src.has_weights))
        goto done;
    if (c->seq_len > sl_config_context(&src.cfg)) {
        sl_errorf("--seq-len %d exceeds the model's maximum positions %d", c->seq_len, sl_config_context(&src.cfg));
        goto done;
    }
    sl_launch_env env;
    int local_rank = sl_launch_env_detect(&env) == 0 ? env.local_rank : 0;
    const sl_ops *ops = sl_ops_for_device(c->device, local_rank);
    if (!ops) goto done;
    // bf16 on the GPU stores activations in bf16 (ops.h act_bf16; docs/precision.md)
    ops = sl_ops_for_precision(ops, c->precision.precision);
    if (src.has_weights && !c->no_verify && sl_manifest_verify_weights_dir(src.weights_dir)) goto done;
    // QLoRA: --quantize, or a bitsandbytes directory as the model (its quantisation then runs)
    int quantised = sl_quant_base_wanted(&src, &c->quant, &c->quant);
    if (quantised > 0) sl_train_config_quant_compute(c);
    if (quantised < 0 || (quantised && sl_train_config_check_quant(c))) goto done;
    if (quantised) {
        if (sl_quant_base_create(&qbase, &model, &src, &c->quant, ops, c->seed)) goto done;
        have_model = 1;
    } else {
        if (sl_model_create(&model, &src.cfg, ops)) goto done;
        have_model = 1;
        if (src.has_weights ? load_weights(&model, src.weights_dir) : sl_model_init_weights(&model, c->seed)) goto done;
    }
    if (train_lora_attach(&lora, &model, c)) goto done;

    int rank = sl_comm_rank(world);
    sl_loader_config lc = {c->data, "train", c->micro_batch, c->seq_len, rank, c->world_size, c->seed, c->shuffle,
                           src.cfg.vocab_size};
    if (sl_loader_open(&train, &lc)) goto done;
    if (c->eval_interval > 0 && val_shards_exist(c->data)) {
        // broken validation shards stop the run, as a bad token read from them later would
        sl_loader_config vc = {c->data, "val", c->micro_batch, c->seq_len, rank, c->world_size, c->seed, 0,
                               src.cfg.vocab_size};
        if (sl_loader_open(&val, &vc)) {
            sl_error_context("validation data %s/val_*.bin (--eval-interval 0 trains without validation)", c->data);
            goto done;
        }
    }

    sl_engine_config ec = {c->micro_batch, c->grad_accum, c->gradient_clipping, c->optim, c->schedule,
                           world, c->reduce_bucket_size, c->first_bucket_size, c->overlap_comm, c->zero_stage,
                           c->stage3_prefetch_bucket_size > 0, c->precision, c->no_verify};
    if (sl_engine_init(&engine, &model, &ec)) goto done;
    have_engine = 1;

    if (is_rank0 && !c->no_save && stat(c->save_dir, &st) == 0) {
        // a save killed before its commit leaves SAVE_DIR/.tmp-TAG-PID behind: remove what dead
        // processes left (never a running one's)
        int removed = sl_ckpt_clean_stale(c->save_dir);
        if (removed > 0)
            printf("note: removed %d stale temporary checkpoint entr%s from %s (left by an interrupted save)\n",
                   removed, removed == 1 ? "y" : "ies", c->save_dir);
        else if (removed < 0)
            fprintf(stderr, "warning: cleaning stale temporary checkpoints: %s\n", sl_error());
    }
    if (c->resume[0]) {
        const char *from = c->resume;
        if (!strcmp(from, "auto")) from = dir_has_checkpoint(c->save_dir) ? c->save_dir : NULL;
        if (from) {
            char *client = NULL;
            if (sl_engine_load(&engine, from, &client)) goto done;
            int lr = restore_loader(train, client, c);
            free(client);
            if (lr) { sl_error_context("resuming from %s", from); goto done; }
            if (is_rank0) printf("resumed from %s at step %lld\n", from, (long long)engine.step);
        } else {
            if (is_rank0) printf("no checkpoint in %s: starting fresh\n", c->save_dir);
        }
    }

    char *resolved = is_rank0 ? sl_train_config_to_json(c) : NULL;
    if (is_rank0) printf("model: %s (%s, %zu parameters, %d layers, %d heads, C=%d, vocab %d)\n", c->model,
           src.cfg.arch == SL_ARCH_GPT2 ? "GPT-2" : "LLaMA", sl_layout_num_parameters(&model.layout),
           src.cfg.n_layer, src.cfg.n_head, src.cfg.n_embd, src.cfg.vocab_size);
    if (is_rank0) printf("data: %s (%lld training tokens, %lld batches per epoch)\n", c->data,
           (long long)sl_loader_num_tokens(train), (long long)sl_loader_batches_per_epoch(train));
    if (is_rank0) print_memory(&engine, c, quantised ? &qbase : NULL);
    if (is_rank0 && !model.ops->on_device) {
        char isa[256];
        sl_cpu_features_describe(isa, sizeof isa);
        // the fp32 GEMM library; a bf16-storage table names itself (cpu-bf16-onednn: oneDNN's bf16 matmul)
        printf("cpu: %s; GEMM %s; ops %s\n", isa, sl_cpu_gemm_description(), model.ops->name);
    }
    if (is_rank0)
        printf("threads: %d per rank, data-parallel ranks: %d\nresolved config:\n%s\n", sl_ops_cpu_threads(),
               c->world_size, resolved ? resolved : "?");
    free(resolved);
    fflush(stdout);

    if (is_rank0) {
        char parent[SL_PATH_MAX];
        snprintf(parent, sizeof parent, "%s", c->metrics);
        char *slash = strrchr(parent, '/');
        if (slash) *slash = '\0';
        if (!slash || sl_mkdirs(parent) == 0) metrics = sl_metrics_open(c->metrics);
        if (!metrics) fprintf(stderr, "warning: no metrics file: %s\n", sl_error());
    }
    size_t BT = (size_t)c->micro_batch * c->seq_len;
    in = malloc(BT * sizeof(int));
    tg = malloc(BT * sizeof(int));
    if (!in || !tg) { sl_errorf("out of memory"); goto done; }

    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    double t_start = now_s(), t_last = t_start;
    int64_t first_step = engine.step;
    int64_t tokens_per_step = (int64_t)BT * c->grad_accum;
    while (engine.step < c->steps && !stop_signal) {
        for (int k = 0; k < c->grad_accum; k++) {
            if (model.lora) {  // dropout while training, its masks keyed by (seed, rank, step, micro-batch)
                lora.training = 1;
                lora.dropout_seed = train_lora_dropout_seed(c->seed, rank, engine.step, k);
            }
            if (sl_loader_next(train, in, tg) || sl_engine_forward_backward(&engine, in, tg, c->micro_batch, c->seq_len, NULL))
                goto done;
        }
        sl_heartbeat_progress(engine.step, "training");  // what a hang report names (launch --hang-timeout)
        sl_fault_point(rank, engine.step + 1, "step");
        if (sl_engine_step(&engine)) goto done;
        if (engine.last_step_skipped && is_rank0) {
            char line[256];
            snprintf(line, sizeof line, "step %lld | %s gradient overflow at loss scale %g: step skipped (%lld skipped "
                     "so far), loss scale now %g", (long long)engine.step, sl_precision_name(c->precision.precision),
                     engine.last_step_scale, (long long)engine.scaler.skipped_steps, engine.scaler.scale);
            sl_progress_message(&prog, line);
        }
        double t = now_s();
        double tok_s = (double)tokens_per_step / (t - t_last);
        t_last = t;
        if (!isfinite(engine.last_loss)) {
            sl_errorf("loss is %f at step %lld: training diverged", engine.last_loss, (long long)engine.step);
            goto done;
        }
        if (metrics) sl_metrics_log_train(metrics, engine.step, engine.last_loss, engine.last_lr, tok_s, t - t_start);
        if (is_rank0 && c->steps_per_print > 0 && (engine.step % c->steps_per_print == 0 || engine.step == c->steps)) {
            char line[256];
            double eta = sl_eta_seconds(engine.step - first_step, c->steps - first_step, t - t_start);
            sl_format_progress(line, sizeof line, engine.step, c->steps, engine.last_loss, engine.last_lr, tok_s, eta);
            sl_progress_update(&prog, line);
        }
        if (val && (engine.step % c->eval_interval == 0 || engine.step == c->steps)) {
            float vl;
            sl_heartbeat_progress(engine.step, "evaluation");
            lora.training = 0;
            if (evaluate(&model, world, val, c->eval_batches, c->micro_batch, c->seq_len, in, tg, &vl)) goto done;
            char line[128];
            snprintf(line, sizeof line, "step %lld | val loss %.4f", (long long)engine.step, vl);
            if (is_rank0) sl_progress_message(&prog, line);
            if (metrics) sl_metrics_log_val(metrics, engine.step, vl);
            t_last = now_s();  // evaluation time does not count against training throughput
        }
        if (!c->no_save && c->save_interval > 0 && engine.step % c->save_interval == 0 && engine.step < c->steps) {
            if (save_checkpoint(&engine, c, train, &prog)) goto done;
            t_last = now_s();
        }
    }
    if (is_rank0) sl_progress_finish(&prog);
    int saved = !c->no_save && engine.step > first_step;
    if (saved && save_checkpoint(&engine, c, train, &prog)) goto done;
    if (stop_signal) {
        sl_errorf("stopped by signal %d after step %lld (%s)", (int)stop_signal, (long long)engine.step,
                  saved ? "checkpoint saved" : "no checkpoint written");
        goto done;
    }
    if (c->sample_tokens > 0 && tok && sl_engine_detach_model(&engine, 0)) goto done;
    if (c->sample_tokens > 0 && tok && is_rank0) {
        int prompt = sl_tokenizer_bos_id(tok) >= 0 ? sl_tokenizer_bos_id(tok)
                     : sl_tokenizer_eot_id(tok) >= 0 ? sl_tokenizer_eot_id(tok) : 0;
        sl_generate_config gc = {c->sample_tokens, {1.0f, 40, 1.0f}, c->seed, 0, NULL, 0};
        if (c->sample_tokens > sl_config_context(&model.cfg) - 1) gc.max_new_tokens = sl_config_context(&model.cfg) - 1;
        printf("sample (%d tokens, temperature 1.0, top-k 40):\n---\n", gc.max_new_tokens);
        // token-by-token decoding runs on the CPU in fp32: a GPU model (or one with bf16 activation
        // storage) hands its weights, and its adapters, to a host copy; a quantised base (CPU only)
        // decodes on its own tables, as generate --quantize does
        lora.training = 0;
        sl_model host_model, *sm = &model;
        sl_lora host_lora;
        memset(&host_lora, 0, sizeof host_lora);
        if ((model.ops->on_device || model.ops->act_bf16) && !quantised) {
            if (sl_model_create(&host_model, &model.cfg, &sl_ops_cpu)) goto done;
            model.ops->download(host_model.params, model.params, model.layout.total * sizeof(float));
            if (c->lora_enabled && train_lora_host_copy(&host_lora, &lora, &host_model)) {
                sl_model_free(&host_model);
                goto done;
            }
            sm = &host_model;
        }
        int grc = sl_generate(sm, tok, &prompt, 1, &gc, NULL, NULL, stdout);
        if (sm != &model) sl_model_free(&host_model);
        sl_lora_free(&host_lora);
        if (grc) goto done;
        printf("\n---\n");
    }
    rc = 0;
done:
    if (rc && is_rank0) sl_progress_finish(&prog);
    free(in);
    free(tg);
    if (metrics) sl_metrics_close(metrics);
    if (have_engine) sl_engine_free(&engine);
    if (have_model) sl_model_free(&model);
    sl_lora_free(&lora);
    sl_quant_base_free(&qbase);
    sl_loader_close(train);
    sl_loader_close(val);
    sl_tokenizer_free(tok);
    return rc;
}

int cmd_train(int argc, char **argv) {
    sl_train_config c;
    sl_train_config_defaults(&c);
    run_flags r = {0, "auto"};
    int p = parse_flags(argc, argv, &c, &r);
    if (p == 1) { usage(stdout); sl_train_config_free(&c); return 0; }
    int rc = p;
    sl_comm *world = NULL;
    // the comm rule (engine.h) before MPI, NCCL or a GPU is touched, which would fail saying less
    if (rc == 0) rc = sl_engine_check_comm_plan(c.device, r.comm_backend, c.zero_stage);
    if (rc == 0) rc = sl_comm_init_world(&world, r.comm_backend, NULL, NULL);
    if (rc == 0) {
        c.world_size = sl_comm_size(world);
        is_rank0 = sl_comm_rank(world) == 0;
        rc = sl_train_config_resolve(&c, r.batch_given);
    }
    // under `shardlm launch`: a background heartbeat so the launcher can tell a hung rank from a slow one
    if (rc == 0 && sl_heartbeat_start() != 0) fprintf(stderr, "warning: no heartbeat for the launcher: %s\n", sl_error());
    if (rc == 0) rc = sl_ops_cpu_set_threads(c.threads);
    if (rc == 0) rc = run(&c, world);
    if (rc) {
        const char *msg = sl_error();
        if (msg[0] && world && sl_comm_size(world) > 1) fprintf(stderr, "error: [rank %d] %s\n", sl_comm_rank(world), msg);
        else if (msg[0]) fprintf(stderr, "error: %s\n", msg);
    }
    sl_heartbeat_stop();
    // a failed rank leaves without finalising, so the launcher stops the others instead of them hanging
    if (world && (rc == 0 || sl_comm_size(world) == 1)) sl_comm_free(world);
    sl_train_config_free(&c);
    return rc ? 1 : 0;
}
