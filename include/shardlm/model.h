// model.h: the decoder-only transformer (GPT-2 or LLaMA family) with a hand-written forward and
// backward per layer (no autograd). Parameters and gradients are the flat layer-major buffers
// described by layout.h; activations are planned up front for a (B, T) and kept for backward.
// The model is told nothing about distribution; it computes with the ops table it is handed.
#ifndef SHARDLM_MODEL_H
#define SHARDLM_MODEL_H

#include <stdint.h>
#include "shardlm/config.h"
#include "shardlm/layout.h"
#include "shardlm/ops.h"

typedef struct {
    float *ln1, *ln1_mean, *ln1_rstd;  // (B,T,C), (B,T), (B,T); mean unused for RMSNorm
    float *qkv;                        // (B,T,(NH+2NKV)*HD), after RoPE for LLaMA
    float *att, *lse;                  // (B,T,C), (B,NH,T)
    float *resid2;                     // (B,T,C) residual after attention
    float *ln2, *ln2_mean, *ln2_rstd;
    float *fch;                        // (B,T,F) GPT-2 pre-GELU; (B,T,2F) LLaMA gate|up
    float *fch_act;                    // (B,T,F) after GELU / SwiGLU
    float *resid3;                     // (B,T,C) block output
} sl_layer_acts;

typedef struct {
    sl_model_config cfg;
    sl_param_layout layout;
    const sl_ops *ops;
    float *params;   // (layout.total)
    float *grads;    // (layout.total)
    size_t capacity; // floats allocated for params and grads (>= layout.total; the tail stays zero)
    float *rope_cos, *rope_sin;  // (max_seq_len, HD/2), LLaMA only

    // activations, allocated for up to act_B x act_T
    int act_B, act_T;
    float *act_memory;
    int *inputs, *targets;       // (B,T) copies of the last forward's batch
    float *encoded;              // (B,T,C)
    sl_layer_acts *layers;
    float *lnf, *lnf_mean, *lnf_rstd;
    float *logits;               // (B,T,Vp); holds dlogits after backward
    float *logits_lse;           // (B,T) log-sum-exp of each row's logits
    float *dresid, *dln, *dA, *dB;  // backward scratch
    // state of the last forward
    int B, T;
    int have_targets;
    int n_valid_targets;
    float loss;                  // mean loss of the last forward with targets
    // Optional: called during backward each time the gradients at flat offsets >= ready_from have
    // reached their final value for this micro-batch (after the head, after each block, and with 0
    // at the end), so a data-parallel engine can start reducing them while backward continues.
    void (*grad_ready)(void *ctx, size_t ready_from);
    void *grad_ready_ctx;
} sl_model;

int sl_model_create(sl_model *m, const sl_model_config *cfg, const sl_ops *ops);
void sl_model_free(sl_model *m);

// GPT-2 / LLaMA initialisation as transformers does it: N(0, 0.02) for linear weights and
// embeddings, residual output projections of GPT-2 scaled by 1/sqrt(2 n_layer), norms 1, biases 0.
// A pure function of (seed, tensor index).
void sl_model_init_weights(sl_model *m, uint64_t seed);

// Forward over inputs (B,T). With targets (B,T; -1 = ignore) it computes the mean loss into *loss.
// Logits stay in m->logits (B,T,Vp) until backward. Errors: T > max_seq_len, token id out of range.
int sl_model_forward(sl_model *m, const int *inputs, const int *targets, int B, int T, float *loss);

// Backward of the last forward (which must have had targets): ACCUMULATES into m->grads the
// gradient of grad_scale * mean loss (grad_scale = 1/accumulation steps for gradient accumulation).
int sl_model_backward(sl_model *m, float grad_scale);

void sl_model_zero_grad(sl_model *m);

// Grows the parameter and gradient buffers to `capacity` floats (>= layout.total), the tail zeroed,
// so a sharded engine can gather equal-sized shards in place.
int sl_model_reserve(sl_model *m, size_t capacity);

#endif
