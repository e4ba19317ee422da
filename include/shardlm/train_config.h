// train_config.h: the one path configuration takes for `shardlm train`:
//   built-in defaults  <-  JSON config (DeepSpeed's keys where DeepSpeed has them)  <-  flags.
// DeepSpeed keys read: train_batch_size, train_micro_batch_size_per_gpu,
// gradient_accumulation_steps (batch = micro x accumulation x data-parallel size; any two infer
// the third), optimizer, scheduler, gradient_clipping, steps_per_print; transformers'
// quantization_config (BitsAndBytesConfig's words, quant_config.h). shardlm's own settings
// live under the key "shardlm" (model, data, seq_len, steps, adapter, ...), LoRA's under "lora" in
// PEFT's LoraConfig words (r, lora_alpha, lora_dropout, target_modules, use_rslora, bias). Unknown
// keys are warned about.
// The resolved configuration serialises back to the same JSON shape (saved with checkpoints).
#ifndef SHARDLM_TRAIN_CONFIG_H
#define SHARDLM_TRAIN_CONFIG_H

#include <stdint.h>
#include <cjson/cJSON.h>
#include "shardlm/lora.h"
#include "shardlm/loss_scaler.h"
#include "shardlm/optim.h"
#include "shardlm/quant_config.h"
#include "shardlm/schedule.h"

#define SL_PATH_MAX 1024

typedef struct {
    // model and data
    char model[SL_PATH_MAX];      // preset name, config.json, or Hugging Face directory (weights loaded)
    char data[SL_PATH_MAX];       // prepared data directory (train_*.bin, val_*.bin, tokenizer/)
    char tokenizer[SL_PATH_MAX];  // "" = DATA/tokenizer
    int seq_len;                  // T
    // batch (DeepSpeed's rule)
    int train_batch_size;         // micro_batch x grad_accum x world
    int micro_batch;              // train_micro_batch_size_per_gpu
    int grad_accum;               // gradient_accumulation_steps
    int world_size;               // data-parallel size (1 in a single process)
    // optimisation
    int64_t steps;                // optimizer steps to train for
    float gradient_clipping;
    sl_optim_config optim;
    cJSON *scheduler_block;       // the JSON config's "scheduler" block (owned, saved as given), NULL = none
    int lr_schedule;              // --lr-schedule: an sl_schedule_type that replaces the block, or -1: the
                                  // block's; with neither, WarmupCosineLR (sl_train_config_resolve)
    int warmup_steps;             // --warmup-steps of that schedule, >= 1; -1 = max(1, steps / 10)
    sl_schedule schedule;         // resolved
    // run control
    uint64_t seed;
    int threads;                  // 0 = OMP_NUM_THREADS / all cores
    int steps_per_print;
    int eval_interval, eval_batches;
    int save_interval;            // 0 = only at the end
    char save_dir[SL_PATH_MAX];
    char resume[SL_PATH_MAX];     // "" = fresh start; a checkpoint root or tag directory
    char metrics[SL_PATH_MAX];    // JSON-lines file; "" = SAVE_DIR/metrics.jsonl
    int sample_tokens;            // tokens generated after training (0 = none)
    int no_save;                  // 1 = never write checkpoints (benchmarks)
    int shuffle;                  // shuffle training windows (default 1)
    int no_verify;                // 1 = load checkpoints without checking them against manifest.json
    // DeepSpeed "zero_optimization" block
    int zero_stage;               // stage (0 = plain data parallelism)
    size_t reduce_bucket_size;    // elements per gradient bucket (default 25 MiB of fp32, as PyTorch DDP)
    size_t first_bucket_size;     // the first (small) bucket, elements (default 262144 = 1 MiB of fp32)
    size_t allgather_bucket_size; // ZeRO parameter gathers (default 5e8)
    int overlap_comm;             // overlap gradient reduction with backward (default 1)
    int contiguous_gradients;     // accepted for compatibility: gradients are always contiguous here
    size_t stage3_prefetch_bucket_size; // ZeRO-3: 0 turns prefetching the next unit off (default 5e7)
    // DeepSpeed "fp16" / "bf16" blocks: the training precision and the fp16 loss scaler
    sl_loss_scaler_config precision;
    char device[32];              // --device: "cpu" (default), "cuda", "cuda:N"
    // LoRA ("lora" block in PEFT's words, --lora-* flags): train adapters on a frozen base
    int lora_enabled;
    sl_lora_config lora;
    char adapter[SL_PATH_MAX];    // "" or a PEFT adapter directory to start from (its settings win)
    // "quantization_config" (transformers' BitsAndBytesConfig words) / --quantize: a quantised frozen
    // base, which only LoRA adapters can train on (QLoRA); type NONE by default
    sl_quant_config quant;
} sl_train_config;

void sl_train_config_defaults(sl_train_config *c);
void sl_train_config_free(sl_train_config *c);

// Applies a JSON config file. Unknown keys produce a warning line on stderr naming them.
int sl_train_config_load_json(sl_train_config *c, const char *path);
int sl_train_config_apply_json(sl_train_config *c, const cJSON *root, const char *where);

// Flags are applied after the JSON config by writing the struct's fields; three of them name a choice
// and go through these (errors name the flag, as "--precision must be fp32, bf16 or fp16 (got 'x')"):
//   --optimizer NAME     sl_optim_select: adamw | adam | sgd (lr, weight_decay and the betas stay)
//   --precision NAME     fp32 | bf16 | fp16
//   --lr-schedule KIND   constant | cosine (WarmupCosineLR) | linear (WarmupDecayLR) | warmup (WarmupLR)
//   --quantize TYPE      nf4 | fp4 | int8 | none (sl_quant_config_from_flag)
int sl_train_config_set_optimizer(sl_train_config *c, const char *name);
int sl_train_config_set_precision(sl_train_config *c, const char *name);
int sl_train_config_set_lr_schedule(sl_train_config *c, const char *kind);
int sl_train_config_set_quantize(sl_train_config *c, const char *type);
// What a quantised base (c->quant) trains with: LoRA adapters (QLoRA; any ZeRO stage, which shards the
// adapters alone), fp32 or bf16 (its
// bnb_4bit_compute_dtype: "float32" under fp32, "bfloat16" under bf16), the CPU; -1 with a message
// naming the setting otherwise (sl_train_config_resolve calls it; so does train when the model
// directory itself turns out to be a bitsandbytes one).
int sl_train_config_check_quant(const sl_train_config *c);
// bf16 training computes the quantised linears in bf16: sets c->quant.compute_dtype to bfloat16 then
// (as torch.autocast does to bitsandbytes' float32 compute); called before sl_train_config_check_quant.
void sl_train_config_quant_compute(sl_train_config *c);

// Resolves the batch rule and the schedule once flags have been applied; errors say what is impossible.
// `given` flags mark which of train_batch_size / micro / accum the user set (bit 0, 1, 2).
int sl_train_config_resolve(sl_train_config *c, int given);

// The resolved configuration as JSON text (malloc'd).
char *sl_train_config_to_json(const sl_train_config *c);

#endif
