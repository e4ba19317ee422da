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
#include "shardlm/precision.h"

// What the model tells its unit hook, in order, for one forward and one backward:
//   forward : PARAMS_GET u (then PARAMS_PUT u) for 0, 1 .. n_layer, n_layer+1 and, with a tied head, 0 again
//   backward: PARAMS_GET/GRADS_GET of the head's unit, the final norm's, then each block from the last;
//             GRADS_PUT u once u's gradients are final for this micro-batch (n_layer+1, n_layer .. 1, 0)
// `next_unit` is the unit whose parameters the model will ask for next (-1: none known), so an
// engine can start gathering it early (ZeRO-3 prefetch).
typedef enum { SL_PARAMS_GET, SL_PARAMS_PUT, SL_GRADS_GET, SL_GRADS_PUT } sl_unit_event;

// Activations are the ops table's storage (sl_act, ops.h: bf16 when ops->act_bf16, else fp32); the
// saved statistics (norm mean / rstd, lse) are always fp32.
typedef struct {
    sl_act *ln1;                       // (B,T,C)
    float *ln1_mean, *ln1_rstd;        // (B,T), (B,T); mean unused for RMSNorm
    sl_act *qkv;                       // (B,T,(NH+2NKV)*HD), after RoPE for LLaMA
    sl_act *att;                       // (B,T,NH*HD)
    float *lse;                        // (B,NH,T)
    sl_act *resid2;                    // (B,T,C) residual after attention
    sl_act *ln2;
    float *ln2_mean, *ln2_rstd;
    sl_act *fch;                       // (B,T,F) GPT-2 pre-GELU (matmul_gelu's pre); (B,T,2F) LLaMA gate|up
    sl_act *fch_act;                   // (B,T,F) after GELU / SwiGLU
    sl_act *resid3;                    // (B,T,C) block output (the add is fused into the next norm)
} sl_layer_acts;

typedef struct {
    sl_model_config cfg;
    sl_param_layout layout;
    const sl_ops *ops;
    // The training precision (sl_precision: fp32, bf16, fp16) whose rounded values the model computes
    // with; handed to ops->set_precision at the start of every forward and backward (the CUDA backend
    // picks its GEMMs' compute type from it). sl_model_create sets fp32; the engine sets its own.
    int precision;
    // Every buffer below lives where the ops table's backend keeps tensors (ops->on_device: GPU
    // memory for cuda); the host reaches them only through ops->upload / download.
    float *params;   // (layout.total)
    float *grads;    // (layout.total)
    size_t capacity; // floats allocated for params and grads (>= layout.total; the tail stays zero)
    float *rope_cos, *rope_sin;  // (sl_config_context, HD/2), LLaMA only (rope.h)
    int rope_len;                // the forward length the tables were built for (dynamic NTK RoPE)
    float *pad_row;              // (C) scratch keeping the padding token's embedding gradient (pad_token_id)
    // With ops->act_bf16: the parameters rounded to bf16 (layout.total elements of 2 bytes, flat
    // offsets as params): every parameter the ops read (ops.h); sl_model_params_changed
    // refreshes it. NULL otherwise, and under ZeRO-3, whose parameter windows carry their own bf16
    // copies (weight_view).
    sl_bf16 *weights_bf16;

    // activations, allocated for up to act_B x act_T in one arena: the storage-typed tensors
    // (act_elem bytes an element: 2 with ops->act_bf16, else 4), then the fp32 statistics
    int act_B, act_T;
    void *act_memory;
    size_t act_elem;             // bytes per activation element
    size_t act_bytes;            // bytes of the arena, statistics included
    int *inputs, *targets;       // (B,T) copies of the last forward's batch
    sl_act *encoded;             // (B,T,C)
    sl_layer_acts *layers;
    sl_act *lnf;                 // (B,T,C)
    float *lnf_mean, *lnf_rstd;
    sl_act *logits;              // (B,T,Vp); holds dlogits after backward, or after a forward told
                                 // sl_model_expect_backward (the fused classifier)
    float *logits_lse;           // (B,T) log-sum-exp of each row's logits
    sl_act *dresid, *dln, *dA, *dB;  // backward scratch
    // state of the last forward
    int B, T;
    int have_targets;
    int logits_rows;             // rows of logits the last forward computed (B*T; 1 with a KV cache; 0 after backward)
    int expect_backward;         // sl_model_expect_backward was called for the next forward
    float expected_grad_scale;   // ... with this grad_scale
    int logits_hold_grad;        // the last forward wrote dlogits for backward (the fused classifier)
    int n_valid_targets;
    float loss;                  // mean loss of the last forward with targets
    // Where each unit's parameters and gradients are (layout.h units): tensor t of unit u lives at
    // param_view[u] + (t.offset - unit_begin[u]). By default views point into params / grads; a
    // ZeRO-3 engine points them at gathered windows instead (params and grads may then be NULL).
    float **param_view, **grad_view;   // (layout.n_units)
    // With ops->act_bf16: unit u's bf16 copy, as param_view (into weights_bf16, or a ZeRO-3 window's).
    sl_bf16 **weight_view;              // (layout.n_units)
    int inference_only;                 // sl_model_for_inference was called: no gradients (nor fp32 params with bf16)
    // Optional: told before and after each use of a unit, in the order the model works (unit_hook.h
    // events). A non-zero return aborts the forward/backward with the hook's error.
    int (*unit_hook)(void *ctx, sl_unit_event event, int unit, int next_unit);
    void *unit_hook_ctx;
    // LoRA adapters (lora.h) the forward adds to their linears, or NULL. While attached the base is
    // frozen: grads is NULL and the backward computes the adapters' gradients only.
    struct sl_lora *lora;
} sl_model;

int sl_model_create(sl_model *m, const sl_model_config *cfg, const sl_ops *ops);
// A model whose block linear weights are held quantised outside its buffers (sl_layout_build_quantised:
// a one-float placeholder each): params and grads hold only the tensors that stay in full precision.
// quant_base.h fills the quantised weights and hands the model the table that computes with them.
int sl_model_create_quantised(sl_model *m, const sl_model_config *cfg, const sl_ops *ops);
void sl_model_free(sl_model *m);

// GPT-2 / LLaMA initialisation as transformers does it: N(0, 0.02) for linear weights and
// embeddings, residual output projections of GPT-2 scaled by 1/sqrt(2 n_layer), norms 1, biases 0.
// A pure function of (seed, tensor index), computed on the host and handed to the model's backend.
// -1 only when a device model's host staging buffer cannot be allocated.
int sl_model_init_weights(sl_model *m, uint64_t seed);
// Tensor i's initial values as sl_model_init_weights computes them (numel floats into host memory
// `out`), for a tensor held outside the buffer (a quantised weight: its placeholder is set to zero).
void sl_model_init_tensor(const sl_model *m, int i, uint64_t seed, float *out);

// Forward over inputs (B,T). With targets (B,T; -1 = ignore) it computes the mean loss into *loss.
// Logits stay in m->logits (B,T,Vp) until backward. Errors: T > max_seq_len, token id out of range.
int sl_model_forward(sl_model *m, const int *inputs, const int *targets, int B, int T, float *loss);

// Rows [row0, row0 + rows) of the last forward's logits, the first vocab_size of each, widened to
// fp32 into host memory `out` (rows x vocab_size floats). Valid until backward overwrites them.
int sl_model_logits(const sl_model *m, int row0, int rows, float *out);

// Backward of the last forward (which must have had targets): ACCUMULATES into m->grads the
// gradient of grad_scale * mean loss (grad_scale = 1/accumulation steps for gradient accumulation).
int sl_model_backward(sl_model *m, float grad_scale);

// Tells the model that the next forward (with targets) is a training step's, followed by
// sl_model_backward(m, grad_scale). That forward then computes the loss and the logits' gradient in
// one op (ops->crossentropy_fused: one pass over the logits on the GPU) instead of leaving the
// logits for backward: sl_model_logits has no rows until the next forward, and a backward with
// another grad_scale is refused. Holds for the next forward only; SHARDLM_FUSED_KERNELS=0 keeps the
// separate ops. Loss, gradients and logits' bits are those of the separate ops.
void sl_model_expect_backward(sl_model *m, float grad_scale);

// Zeroes the whole gradient buffer (nothing when the engine has taken it away).
void sl_model_zero_grad(sl_model *m);

// Points every unit's views into params / grads (after they move).
void sl_model_bind_views(sl_model *m);

// Tells the model its parameters changed (init, a step, a checkpoint load): with ops->act_bf16 the
// bf16 weight shadow is rewritten from params; without it, or when params is not the whole buffer
// (ZeRO-3 converts each window as it is gathered), nothing happens.
int sl_model_params_changed(sl_model *m);

// Inference from here on (generate): releases the gradient buffer and, with ops->act_bf16, the fp32
// parameters (the forward reads only their bf16 copy, already written by sl_model_params_changed), so
// the model holds its weights once. Backward is refused afterwards, and
// sl_model_params_changed has nothing to convert.
int sl_model_for_inference(sl_model *m);

// Attaches LoRA adapters built for this model's config on its backend and frees the base's gradient
// buffer (frozen from now on: no gradient, so no optimizer state, is ever kept for it). The base's
// bf16 copy (ops->act_bf16) is made here, once; sl_model_params_changed then refreshes the adapters'
// only. The adapters' activations are planned with the model's. The model does not own them
// (sl_lora_free after sl_model_free).
int sl_model_attach_lora(sl_model *m, struct sl_lora *lora);

#endif
