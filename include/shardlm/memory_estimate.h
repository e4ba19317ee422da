// memory_estimate.h: what a training run's model states take on each data-parallel rank, from its
// configuration alone, before anything is allocated: parameters, gradients and optimizer state by
// the ZeRO paper's formula (zero.h, sl_zero_memory_estimate), plus what mixed precision adds (the
// fp32 master slice, the bf16 parameter copy). It gives the bytes the engine allocates for them
// (sl_engine_memory_use), which `shardlm train` prints beside it; `shardlm estimate` shares it.
// Activations and workspaces are not model states and are not counted.
// With LoRA the formula applies to the adapters' buffer (what trains, and what ZeRO partitions), and
// the frozen base adds its fp32 parameters, whole on every rank (and its bf16 copy under act_bf16).
#ifndef SHARDLM_MEMORY_ESTIMATE_H
#define SHARDLM_MEMORY_ESTIMATE_H

#include "shardlm/config.h"
#include "shardlm/lora.h"
#include "shardlm/precision.h"
#include "shardlm/train_config.h"

// The training settings the estimate depends on.
typedef struct {
    int world_size;           // data-parallel ranks
    int zero_stage;           // 0-3
    int optim_state_buffers;  // fp32 buffers per parameter: 2 Adam / AdamW, 1 SGD with momentum, 0 SGD
                              // and AdamW8bit
    sl_precision precision;   // fp16 / bf16 keep fp32 master weights
    int act_bf16;             // the ops table keeps activations and a parameter copy in bf16 (ops.h act_bf16)
    int adamw8bit;            // AdamW8bit: bitsandbytes' 8-bit state (optim_8bit.h) instead of buffers
    long long min_8bit_size;  // its threshold: smaller tensors keep 32-bit state
    const sl_lora_config *lora;  // LoRA adapters of this config train, the base frozen; NULL: the whole model
} sl_memory_setup;

// A resolved training config's setup (act_bf16: the ops table the run computes with).
sl_memory_setup sl_memory_setup_of(const sl_train_config *c, int act_bf16);

typedef struct {
    double params, grads, optim;  // bytes per rank: fp32 parameters, gradients, optimizer state (LoRA:
                                  // params is the frozen base, grads and optim the adapters')
    double adapters;              // LoRA: the adapters' fp32 parameters (0 otherwise)
    double master;                // fp32 master weights of this rank's slice (fp16 / bf16; 0 when the
                                  // fp32 parameters are the master: bf16 with act_bf16 and no ZeRO)
    double param_copy;            // the bf16 parameter copy with act_bf16: the whole model, or at ZeRO
                                  // stage 3 the windows' bf16 twins (LoRA: the base's whole copy plus
                                  // the adapters', or their windows' twins)
    double total;                 // the sum of the above
    double P, S, W, K;            // the formula's inputs (zero.h): parameters, slice, window floats,
                                  // optimizer bytes per parameter (AdamW8bit: the whole model's state
                                  // bytes / P, blocks' absmax and 32-bit tensors averaged in); with
                                  // LoRA all of the adapters' buffer
    double frozen;                // LoRA: the frozen base's parameters (0 otherwise)
    const char *formula;          // the stage's formula, e.g. "4P + 4(P+S) + KS"
} sl_memory_estimate;

// The estimate for `model` trained with `setup`. -1 with a message when the model's layout cannot be
// built (an invalid config) or the setup is out of range.
int sl_memory_estimate_for(const sl_model_config *model, const sl_memory_setup *setup, sl_memory_estimate *out);

// The frozen base of a QLoRA run (quant_base.h): the tensors kept in fp32 (embeddings, norms, biases,
// an untied head, plus one placeholder float per quantised weight: 4P bytes, P the quantised layout's
// floats) and the quantised linears' codes and block statistics (Q bytes: NF4 / FP4 n/2 + 4n/B, with
// double quantisation n/2 + n/B + 4n/(256B); int8 n + 4 per output row; n their elements, B the
// block size). With the adapters' (4 + 4 + K)A this is what `shardlm train --quantize` allocates.
typedef struct {
    double full_precision;   // 4P
    double quantised;        // Q
    double quantised_numel;  // n
    double P;
} sl_memory_quant_base;

int sl_memory_quant_base_for(const sl_model_config *model, const sl_quant_config *qc, sl_memory_quant_base *out);

#endif
