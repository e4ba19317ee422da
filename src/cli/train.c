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
#include "shardlm/json_get.h"
#include "shardlm/loader.h"
#include "shardlm/manifest.h"
#include "shardlm/metrics.h"
#include "shardlm/model_source.h"
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
        "  --optimizer NAME        adamw | adam | sgd (default adamw, betas 0.9/0.95)\n"
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
        "                          warms up over at least 2)\n"
        "run control:\n"
        "  --seed S                (default 1337)\n"
        "  --threads N             CPU threads (default OMP_NUM_THREADS or all cores)\n"
        "  --precision P           fp32 | bf16 | fp16 (DeepSpeed's bf16 / fp16 blocks: fp32 master weights,\n"
        "                          16-bit parameters and gradients; fp16 with dynamic loss scaling)\n"
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

typedef struct {
    char schedule_kind[32];
    int warmup_steps;       // -1 = steps/10
    char optimizer[16];
    float lr, weight_decay, momentum;
    int decay_all;
    int given;              // DeepSpeed batch triple bits (1 train_batch_size, 2 micro, 4 accum)
    int lr_given, wd_given, momentum_given;
    char precision[16];     // --precision, "" = the config's
    char comm_backend[16];  // --comm-backend (sl_comm_init_world's name), default "auto"
} flag_extras;

// Parses flags into c (after the JSON config, so flags win). Returns 0, 1 for --help, -1 on error.
static int parse_flags(int argc, char **argv, sl_train_config *c, flag_extras *x) {
    char config_path[SL_PATH_MAX] = "";
    // the config file applies first, wherever --config stands
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return 1;
        if (!strncmp(argv[i], "--config=", 9)) snprintf(config_path, sizeof config_path, "%s", argv[i] + 9);
        else if (!strcmp(argv[i], "--config") && i + 1 < argc) snprintf(config_path, sizeof config_path, "%s", argv[i + 1]);
    }
    if (config_path[0]) {
        if (sl_train_config_load_json(c, config_path)) return -1;
        x->given |= (c->train_batch_size ? 1 : 0) | (c->micro_batch ? 2 : 0) | (c->grad_accum ? 4 : 0);
    }
    sl_args a = {argc, argv, 1, NULL, 0};
    int steps = -1, seed = -1;  // -1: not given (both flags allow only values >= 0)
    for (; a.i < argc && !a.error; a.i++) {
        if (sl_arg_str(&a, "--config", config_path, sizeof config_path)) continue;
        if (sl_arg_str(&a, "--model", c->model, sizeof c->model)) continue;
        if (sl_arg_str(&a, "--data", c->data, sizeof c->data)) continue;
        if (sl_arg_str(&a, "--tokenizer", c->tokenizer, sizeof c->tokenizer)) continue;
        if (sl_arg_int(&a, "--seq-len", 1, SL_NO_MAX, &c->seq_len)) continue;
        if (sl_arg_int(&a, "--batch-size", 1, SL_NO_MAX, &c->micro_batch)) { x->given |= 2; continue; }
        if (sl_arg_int(&a, "--grad-accum", 1, SL_NO_MAX, &c->grad_accum)) { x->given |= 4; continue; }
        if (sl_arg_int(&a, "--train-batch-size", 1, SL_NO_MAX, &c->train_batch_size)) { x->given |= 1; continue; }
        if (sl_arg_int(&a, "--steps", 0, SL_NO_MAX, &steps)) continue;
        if (sl_arg_str(&a, "--optimizer", x->optimizer, sizeof x->optimizer)) continue;
        if (sl_arg_float(&a, "--lr", 0, SL_FLOAT_MAX, 0, &x->lr)) { x->lr_given = 1; continue; }
        if (sl_arg_float(&a, "--weight-decay", 0, SL_FLOAT_MAX, 0, &x->weight_decay)) { x->wd_given = 1; continue; }
        if (sl_arg_float(&a, "--momentum", 0, SL_FLOAT_MAX, 0, &x->momentum)) { x->momentum_given = 1; continue; }
        if (sl_arg_switch(&a, "--decay-all")) { x->decay_all = 1; continue; }
        if (sl_arg_float(&a, "--grad-clip", 0, SL_FLOAT_MAX, 0, &c->gradient_clipping)) continue;
        if (sl_arg_str(&a, "--lr-schedule", x->schedule_kind, sizeof x->schedule_kind)) continue;
        if (sl_arg_int(&a, "--warmup-steps", 1, SL_NO_MAX, &x->warmup_steps)) continue;
        if (sl_arg_int(&a, "--seed", 0, SL_NO_MAX, &seed)) continue;
        if (sl_arg_int(&a, "--threads", 0, SL_NO_MAX, &c->threads)) continue;
        if (sl_arg_str(&a, "--precision", x->precision, sizeof x->precision)) continue;
        if (sl_arg_str(&a, "--device", c->device, sizeof c->device)) continue;
        if (sl_arg_str(&a, "--comm-backend", x->comm_backend, sizeof x->comm_backend)) continue;
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
    if (a.error) return -1;
    if (steps >= 0) c->steps = steps;
    if (seed >= 0) c->seed = (uint64_t)seed;
    if (x->optimizer[0]) {
        cJSON *blk = cJSON_CreateObject();
        cJSON_AddStringToObject(blk, "type", !strcasecmp(x->optimizer, "sgd") ? "SGD"
                                            : !strcasecmp(x->optimizer, "adam") ? "Adam" : x->optimizer);
        cJSON *p = cJSON_AddObjectToObject(blk, "params");
        if (!strcasecmp(x->optimizer, "adam")) cJSON_AddFalseToObject(p, "adam_w_mode");
        sl_optim_config keep = c->optim;
        int rc = sl_optim_parse(&c->optim, blk, "--optimizer");
        cJSON_Delete(blk);
        if (rc) return -1;
        c->optim.lr = keep.lr;
        c->optim.weight_decay = keep.weight_decay;
        if (c->optim.type != SL_OPTIM_SGD) { c->optim.beta1 = keep.beta1; c->optim.beta2 = keep.beta2; }
    }
    if (x->lr_given) c->optim.lr = x->lr;
    if (x->wd_given) c->optim.weight_decay = x->weight_decay;
    if (x->momentum_given) c->optim.momentum = x->momentum;
    if (x->decay_all) c->optim.decay_all = 1;
    if (x->precision[0]) {
        if (!strcmp(x->precision, "fp32")) c->precision.precision = SL_PRECISION_FP32;
        else if (!strcmp(x->precision, "bf16")) c->precision.precision = SL_PRECISION_BF16;
        else if (!strcmp(x->precision, "fp16")) c->precision.precision = SL_PRECISION_FP16;
        else {
            fprintf(stderr, "error: --precision must be fp32, bf16 or fp16 (got '%s')\n", x->precision);
            return -1;
        }
    }
    if (!c->scheduler_block && !x->schedule_kind[0]) snprintf(x->schedule_kind, sizeof x->schedule_kind, "cosine");
    if (x->schedule_kind[0] && strcmp(x->schedule_kind, "constant") != 0) {
        int warmup = x->warmup_steps >= 0 ? x->warmup_steps : (int)(c->steps / 10);
        if (warmup < 1) warmup = 1;
        cJSON *blk = cJSON_CreateObject(), *p;
        if (!strcmp(x->schedule_kind, "cosine")) {
            cJSON_AddStringToObject(blk, "type", "WarmupCosineLR");
            p = cJSON_AddObjectToObject(blk, "params");
            cJSON_AddNumberToObject(p, "total_num_steps", (double)(c->steps > warmup ? c->steps : warmup + 1));
            cJSON_AddNumberToObject(p, "warmup_num_steps", warmup);
            cJSON_AddNumberToObject(p, "cos_min_ratio", 0.1);
            cJSON_AddStringToObject(p, "warmup_type", "linear");
        } else if (!strcmp(x->schedule_kind, "linear") || !strcmp(x->schedule_kind, "warmup")) {
            int decay = !strcmp(x->schedule_kind, "linear");
            cJSON_AddStringToObject(blk, "type", decay ? "WarmupDecayLR" : "WarmupLR");
            p = cJSON_AddObjectToObject(blk, "params");
            if (decay) cJSON_AddNumberToObject(p, "total_num_steps", (double)(c->steps > warmup ? c->steps : warmup + 1));
            cJSON_AddNumberToObject(p, "warmup_min_lr", 0.0);
            cJSON_AddNumberToObject(p, "warmup_max_lr", c->optim.lr);
            cJSON_AddNumberToObject(p, "warmup_num_steps", warmup);
            cJSON_AddStringToObject(p, "warmup_type", "linear");
        } else {
            cJSON_Delete(blk);
            fprintf(stderr, "error: --lr-schedule must be constant, cosine, linear or warmup (got '%s')\n", x->schedule_kind);
            return -1;
        }
        cJSON_Delete(c->scheduler_block);
        c->scheduler_block = blk;
    } else if (x->schedule_kind[0]) {
        cJSON_Delete(c->scheduler_block);
        c->scheduler_block = NULL;
    }
    return 0;
}

static int is_gpu_device(const char *device) { return !strcmp(device, "cuda") || !strncmp(device, "cuda:", 5); }

// Before any process group exists (NCCL would fail first on a machine without a GPU, saying less):
// the nccl comm backend moves GPU memory, on GPU LOCAL_RANK of every process.
static int check_comm_backend_flag(const sl_train_config *c, const char *backend) {
    if (strcmp(backend, "nccl") != 0) return 0;
    if (sl_engine_check_comm(is_gpu_device(c->device), c->device, SL_COMM_NCCL, 0, c->zero_stage)) return -1;
    if (strcmp(c->device, "cuda") != 0)
        return sl_errorf("--comm-backend nccl puts every process on GPU LOCAL_RANK (modulo the visible GPUs), so it "
                         "takes --device cuda, not --device %s (choose the GPUs with CUDA_VISIBLE_DEVICES)", c->device);
    return 0;
}

// Once the world exists, before the GPU is touched: a GPU run that exchanges gradients (several
// ranks) or shards (ZeRO) needs NCCL, since the mpi backend moves host memory only (Open MPI as
// packaged is not CUDA-aware) and self copies with memmove.
static int check_gpu_exchange(const sl_train_config *c, sl_comm *world) {
    return sl_engine_check_comm(is_gpu_device(c->device), c->device, sl_comm_backend_of(world), sl_comm_size(world),
                                c->zero_stage);
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

// What this rank allocated for model states, next to the ZeRO paper's formula (zero.h).
static void print_memory(const sl_engine *e, int world) {
    sl_engine_memory mem = sl_engine_memory_use(e);
    int stage = e->sharded ? e->zero.stage : 0;
    sl_zero_estimate est = sl_zero_memory_estimate(&e->model->layout, world, stage, e->n_optim_state);
    sl_zero_estimate zero0 = sl_zero_memory_estimate(&e->model->layout, world, 0, e->n_optim_state);
    size_t total = mem.params + mem.grads + mem.optim;
    printf("memory per rank (ZeRO stage %d, %d ranks): parameters %.2f MB, gradients %.2f MB, optimizer state "
           "%.2f MB; total %.2f MB = %zu bytes\n  formula %s with P=%.0f S=%.0f W=%.0f K=%g: %.0f bytes; "
           "stage 0 would hold %.0f bytes\n",
           stage, world, mem.params / 1e6, mem.grads / 1e6, mem.optim / 1e6, total / 1e6, total, est.formula, est.P,
           est.S, est.W, est.K, est.params + est.grads + est.optim, zero0.params + zero0.grads + zero0.optim);
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

static double json_num(const cJSON *o, const char *key, double dflt) {
    const cJSON *v = o ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
    return cJSON_IsNumber(v) ? v->valuedouble : cJSON_IsBool(v) ? (double)cJSON_IsTrue(v) : dflt;
}

// Restores the loader position saved in a checkpoint's client state, after checking that this run
// reads the same data the same way. The position counts windows of micro_batch x seq_len tokens
// per rank; a run may change its number of ranks (and micro-batch, when not shuffling) as long as
// the same global window sequence continues, so the position is rescaled to this run's shape.
static int restore_loader(sl_loader *train, const char *client, const sl_train_config *c) {
    cJSON *root = client ? cJSON_Parse(client) : NULL;
    const cJSON *ld = root ? cJSON_GetObjectItemCaseSensitive(root, "loader") : NULL;
    const cJSON *cfg = root ? cJSON_GetObjectItemCaseSensitive(root, "config") : NULL;
    const cJSON *own = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "shardlm") : NULL;
    const cJSON *data = own ? cJSON_GetObjectItemCaseSensitive(own, "data") : NULL;
    int rc = 0;
    sl_loader_position pos;
    char *s = ld ? cJSON_PrintUnformatted(ld) : NULL;
    if (!ld || !own) rc = sl_errorf("checkpoint has no saved loader position and configuration");
    else if (!s || sl_loader_position_from_json(s, &pos)) rc = -1;
    free(s);
    // the saved batch shape rescales the position: integers in range, or the checkpoint is refused
    int64_t mbi = 0, gai = 1, tbsi = 0;
    const char *w = "trainer_state.json client_state.config";
    if (rc == 0 && (sl_json_get_i64(cfg, "train_micro_batch_size_per_gpu", &mbi, 1, 1, 1000000000, w) ||
                    sl_json_get_i64(cfg, "gradient_accumulation_steps", &gai, 0, 1, 1000000000, w) ||
                    sl_json_get_i64(cfg, "train_batch_size", &tbsi, 1, 1, 1000000000, w)))
        rc = -1;
    if (rc == 0) {
        double mb = (double)mbi, ga = (double)gai, tbs = (double)tbsi, world = tbs / (mb * ga);
        double seq = json_num(own, "seq_len", 0), seed = json_num(own, "seed", -1), shuffle = json_num(own, "shuffle", 1);
        double old_windows = world * mb, new_windows = (double)c->world_size * c->micro_batch;
        if (seq != c->seq_len) rc = sl_errorf("checkpoint was trained with seq_len %g, this run uses %d", seq, c->seq_len);
        else if (seed != (double)c->seed) rc = sl_errorf("checkpoint was trained with seed %g, this run uses %llu", seed,
                                                       (unsigned long long)c->seed);
        else if (shuffle != c->shuffle) rc = sl_errorf("checkpoint was trained with%s shuffling, this run %s", shuffle ? "" : "out",
                                                     c->shuffle ? "shuffles" : "does not");
        else if (!cJSON_IsString(data) || strcmp(data->valuestring, c->data) != 0)
            rc = sl_errorf("checkpoint was trained on data %s, this run reads %s", cJSON_IsString(data) ? data->valuestring : "?",
                           c->data);
        else if (c->shuffle && mb != c->micro_batch)
            rc = sl_errorf("checkpoint was trained with micro batch %g, this run uses %d (with shuffling the window "
                           "order depends on it; keep it, or change ranks/accumulation instead)", mb, c->micro_batch);
        else if (fmod((double)pos.batch * old_windows, new_windows) != 0.0)
            rc = sl_errorf("the checkpoint's data position (%lld batches of %g windows) is not a whole number of this "
                           "run's batches of %g windows", (long long)pos.batch, old_windows, new_windows);
        else if ((double)pos.batch * old_windows / new_windows >= (double)sl_loader_batches_per_epoch(train))
            rc = sl_errorf("the checkpoint's data position (batch %lld of %g windows) lies past this run's epoch of "
                           "%lld batches of %g windows", (long long)pos.batch, old_windows,
                           (long long)sl_loader_batches_per_epoch(train), new_windows);
        if (rc == 0) {
            pos.batch = (int64_t)((double)pos.batch * old_windows / new_windows);
            if (tbs != c->train_batch_size && is_rank0)
                fprintf(stderr, "warning: train_batch_size changes from %g to %d on resume\n", tbs, c->train_batch_size);
            if (json_num(own, "threads", 0) != c->threads && is_rank0)
                fprintf(stderr, "warning: thread count differs from the checkpoint's run: results will not be "
                                "bit-identical to an uninterrupted run\n");
            rc = sl_loader_seek(train, &pos);
        }
    }
    cJSON_Delete(root);
    return rc;
}

static int run(sl_train_config *c, sl_comm *world) {
    int rc = -1;
    sl_model model;
    sl_lora lora;
    sl_engine engine;
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
    if (sl_model_create(&model, &src.cfg, ops)) goto done;
    have_model = 1;
    if (src.has_weights) {
        if ((!c->no_verify && sl_manifest_verify_weights_dir(src.weights_dir)) || load_weights(&model, src.weights_dir))
            goto done;
    } else if (sl_model_init_weights(&model, c->seed)) {
        goto done;
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
    if (is_rank0 && model.lora) train_lora_print_memory(&engine);
    else if (is_rank0) print_memory(&engine, c->world_size);
    if (is_rank0 && !model.ops->on_device) {
        char isa[256];
        sl_cpu_features_describe(isa, sizeof isa);
        printf("cpu: %s; GEMM %s\n", isa, sl_cpu_gemm_description());
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
        int prompt = sl_tokenizer_eot_id(tok) >= 0 ? sl_tokenizer_eot_id(tok) : 0;
        sl_generate_config gc = {c->sample_tokens, {1.0f, 40, 1.0f}, c->seed, 0};
        if (c->sample_tokens > sl_config_context(&model.cfg) - 1) gc.max_new_tokens = sl_config_context(&model.cfg) - 1;
        printf("sample (%d tokens, temperature 1.0, top-k 40):\n---\n", gc.max_new_tokens);
        // token-by-token decoding runs on the CPU in fp32: a GPU model (or one with bf16 activation
        // storage) hands its weights to a host copy
        lora.training = 0;
        sl_model host_model, *sm = &model;
        if (model.ops->on_device || model.ops->act_bf16) {
            if (sl_model_create(&host_model, &model.cfg, &sl_ops_cpu)) goto done;
            model.ops->download(host_model.params, model.params, model.layout.total * sizeof(float));
            sm = &host_model;
        }
        int grc = sl_generate(sm, tok, &prompt, 1, &gc, NULL, NULL, stdout);
        if (sm != &model) sl_model_free(&host_model);
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
    sl_loader_close(train);
    sl_loader_close(val);
    sl_tokenizer_free(tok);
    return rc;
}

int cmd_train(int argc, char **argv) {
    sl_train_config c;
    sl_train_config_defaults(&c);
    flag_extras x;
    memset(&x, 0, sizeof x);
    x.warmup_steps = -1;
    snprintf(x.comm_backend, sizeof x.comm_backend, "auto");
    x.weight_decay = c.optim.weight_decay;
    int p = parse_flags(argc, argv, &c, &x);
    if (p == 1) { usage(stdout); sl_train_config_free(&c); return 0; }
    int rc = p;
    sl_comm *world = NULL;
    if (rc == 0) rc = check_comm_backend_flag(&c, x.comm_backend);
    if (rc == 0) rc = sl_comm_init_world(&world, x.comm_backend, NULL, NULL);
    if (rc == 0) {
        c.world_size = sl_comm_size(world);
        is_rank0 = sl_comm_rank(world) == 0;
        rc = sl_train_config_resolve(&c, x.given);
    }
    if (rc == 0) rc = check_gpu_exchange(&c, world);
    // under `shardlm launch`: a background heartbeat so the launcher can tell a hung rank from a slow one
    if (rc == 0 && sl_heartbeat_start() != 0) fprintf(stderr, "warning: no heartbeat for the launcher: %s\n", sl_error());
    if (rc == 0) {
        sl_ops_cpu_set_threads(c.threads);
        rc = run(&c, world);
    }
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
