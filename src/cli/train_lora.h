// train_lora.h: what `shardlm train` adds for LoRA (train_lora.c): the --lora-* and --adapter flags,
// the adapters built (or loaded) and attached to the model, and the memory line of a LoRA run.
#ifndef SHARDLM_CLI_TRAIN_LORA_H
#define SHARDLM_CLI_TRAIN_LORA_H

#include "cli/args.h"
#include "shardlm/engine.h"
#include "shardlm/lora.h"
#include "shardlm/quant_base.h"
#include "shardlm/train_config.h"

// Usage lines for the flags.
#define TRAIN_LORA_USAGE                                                                                     \
    "  --lora-r R              train LoRA adapters of rank R on a frozen base (PEFT's r; default 8 with any\n" \
    "                          --lora-* flag)\n"                                                               \
    "  --lora-alpha A          lora_alpha (default 8): the adapters' output is scaled by A / R\n"             \
    "  --lora-dropout P        lora_dropout on the adapters' input while training (default 0)\n"             \
    "  --lora-targets LIST     target_modules, e.g. c_attn,c_proj,c_fc or q_proj,v_proj or all-linear (also\n"  \
    "                          lm_head of an untied model, and the embedding: wte / embed_tokens)\n"        \
    "                          (default: PEFT's for the architecture: c_attn / q_proj,v_proj)\n"               \
    "  --lora-rslora           use_rslora: scale by A / sqrt(R)\n"                                            \
    "  --lora-dora             use_dora: DoRA, a trained magnitude per output row (CPU backend only)\n"      \
    "  --lora-init MODE        init_lora_weights: true (PEFT's default: B zero), gaussian (A ~ N(0, 1/R^2)),\n"  \
    "                          false (B random too: the run does not start from the base's outputs)\n"       \
    "  --lora-modules-to-save LIST  modules_to_save: train whole copies of these modules next to the\n"       \
    "                          adapters (PEFT's: a module whose path ends with a name), e.g. lm_head,wte or\n"    \
    "                          embed_tokens,lm_head,norm: embeddings, norms and the head (CPU backend only)\n"  \
    "  --lora-trainable-tokens IDS  trainable_token_indices: train these rows of the embedding whole (new\n"  \
    "                          tokens' embeddings; a tied head reads them too), e.g. 50257,50258\n"          \
    "  --lora-bias MODE        bias: none (default), all (every bias of the model trained), lora_only (the\n"  \
    "                          adapted linears' biases trained)\n"                                              \
    "  --lora-b-bias           lora_bias: each lora_B carries a trained bias, zero at first (not with\n"        \
    "                          --lora-dora; merging needs a base bias; CPU backend only)\n"                      \
    "  --adapter DIR           start from a PEFT adapter directory (its adapter_config.json settings)\n"

// Consumes one LoRA flag into c (1), or returns 0 when argv[a->i] is none of them.
int train_lora_flag(sl_args *a, sl_train_config *c);

// With c->lora_enabled: the adapters for model (loaded from c->adapter, or PEFT's initialisation from
// c->seed), attached to it (the base frozen), and c->lora set to their resolved settings. Nothing
// otherwise. -1 with the error.
int train_lora_attach(sl_lora *lora, sl_model *model, sl_train_config *c);

// For the sample of a run whose model is copied to the host (a GPU model, bf16 activation storage):
// host_lora, a CPU fp32 copy of the trained adapters (lora's settings and current weights), attached
// to host (the model's host copy). -1 with the error (host_lora then freed).
int train_lora_host_copy(sl_lora *host_lora, const sl_lora *lora, sl_model *host);

// The dropout masks of micro-batch k of step `step` on `rank`: a pure function of them and the seed,
// so a resumed run draws the same masks.
uint64_t train_lora_dropout_seed(uint64_t seed, int rank, int64_t step, int k);

// The memory line of a LoRA run: the frozen base, the adapters' parameters, gradients and optimizer
// state on this rank, against the estimate (memory_estimate.h): 4P for the base plus the ZeRO
// formula over the adapters' A parameters (4A + 4A + KA at stage 0); with a quantised base (qb, else
// NULL) its codes and block statistics too, against 4P + Q + (8 + K)A.
void train_lora_print_memory(const sl_engine *e, const sl_train_config *c, const sl_quant_base *qb);

#endif
