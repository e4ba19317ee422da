// optim.h: optimizers over flat fp32 buffers (AdamW, Adam with L2 decay, SGD), the DeepSpeed
// "optimizer" config block, the weight-decay mask, and global-norm gradient clipping.
//
// Buffers: parameters, gradients and optimizer state are flat float buffers in the layout's order
// (layout.h). A step works on a sub-range [begin, end) of the flat buffer, so a ZeRO rank can update
// only its own shard: every pointer passed to a step function points at element `begin` (it holds
// end - begin floats), while the decay mask speaks absolute flat offsets. Calling with begin = 0,
// end = layout->total and the full buffers updates everything.
//
// Arithmetic follows torch.optim.AdamW / Adam / SGD (foreach=False) operation by operation: scalar
// coefficients are computed in double, as Python floats are, then used in float32 element maths.
#ifndef SHARDLM_OPTIM_H
#define SHARDLM_OPTIM_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>

#include "shardlm/layout.h"
#include "shardlm/ops.h"

typedef enum {
    SL_OPTIM_ADAMW = 0,   // DeepSpeed "AdamW", or "Adam" with adam_w_mode true (the default)
    SL_OPTIM_ADAM = 1,    // DeepSpeed "Adam" with "adam_w_mode": false: L2 decay added to the gradient
    SL_OPTIM_SGD = 2,     // torch.optim.SGD: momentum, dampening, nesterov, L2 weight decay
    SL_OPTIM_ADAMW8BIT = 3, // bitsandbytes.optim.AdamW8bit: moments in blockwise 8-bit (optim_8bit.h)
} sl_optim_type;

typedef struct {
    sl_optim_type type;
    // Hyperparameters are doubles, as Python floats are in torch/DeepSpeed, so derived scalars
    // (1 - beta1, 1 - lr*wd, lr / bias_correction1) round exactly as torch's do.
    double lr;            // params.lr (default 1e-3); a scheduler may override it per step
    double beta1, beta2;  // params.betas (default [0.9, 0.999])
    double eps;           // params.eps (default 1e-8)
    double weight_decay;  // params.weight_decay (default 0)
    double momentum;      // SGD params.momentum (default 0)
    double dampening;     // SGD params.dampening (default 0)
    int nesterov;         // SGD params.nesterov (default false; needs momentum > 0, dampening 0)
    int decay_all;        // params.decay_all (shardlm extension): decay norms/biases/embeddings too
    long long min_8bit_size; // AdamW8bit params.min_8bit_size (default 4096, as bitsandbytes): smaller
                             // tensors keep 32-bit state
    char warning[256];    // after sl_optim_parse: unknown params keys, "" when none
} sl_optim_config;

// Defaults: AdamW, lr 1e-3, betas (0.9, 0.999), eps 1e-8, no weight decay.
void sl_optim_defaults(sl_optim_config *cfg);

// Parses DeepSpeed's block {"type": "AdamW"|"Adam"|"SGD"|"AdamW8bit", "params": {...}} (type names are
// case-insensitive, as in DeepSpeed). NULL block -> defaults. Wrong types or values are errors that
// name `where` and the key; unknown keys in params are not errors but are listed in cfg->warning.
int sl_optim_parse(sl_optim_config *cfg, const cJSON *optimizer_block, const char *where);

// Switches to the optimizer `name` names (case-insensitive: "adamw"; "adam", Adam with L2 decay as
// DeepSpeed's adam_w_mode false; "sgd"; "adamw8bit", bitsandbytes' AdamW8bit), as a config block
// giving only the type would, except that lr, weight_decay, min_8bit_size and, between Adam kinds,
// the betas stay: every other setting returns to its default. -1 naming `flag` when the name is none
// of these.
int sl_optim_select(sl_optim_config *cfg, const char *name, const char *flag);

// "AdamW", "Adam", "SGD" or "AdamW8bit".
const char *sl_optim_name(sl_optim_type type);

// Number of state buffers (each `n` floats, zero-initialised by the caller) the optimizer needs:
// 2 for Adam/AdamW (exp_avg, exp_avg_sq), 1 for SGD with momentum (momentum_buffer), else 0 (AdamW8bit
// keeps its state in an sl_adam8_state instead: optim_8bit.h).
int sl_optim_num_state_buffers(const sl_optim_config *cfg);

// ---- weight-decay mask -------------------------------------------------------------------------

typedef struct { size_t begin, end; } sl_range;  // [begin, end) in floats of the flat buffer

// Sorted, disjoint, merged ranges of the flat buffer that receive weight decay.
typedef struct {
    sl_range *ranges;
    int n;
} sl_decay_mask;

// Ranges of every tensor with weight_decay == 1 (or every tensor when decay_all). Adjacent ranges
// are merged. Free with sl_decay_mask_free.
int sl_decay_mask_from_layout(sl_decay_mask *mask, const sl_param_layout *layout, int decay_all);
// The same from any offsets table (LoRA's adapters: lora.h).
int sl_decay_mask_from_tensors(sl_decay_mask *mask, const sl_tensor_info *tensors, int n_tensors, int decay_all);
void sl_decay_mask_free(sl_decay_mask *mask);

// ---- steps -------------------------------------------------------------------------------------
// `step` is this step's number, counting from 1 (torch's state["step"] after its increment).
// `mask` NULL means every element decays. Elements in [begin, end) not covered by the mask do not
// decay (ZeRO padding past layout->total included).

// The same steps as scalars + segments, for a backend's multi-tensor pass (ops.h adam_step /
// sgd_step): the scalars of step `step` at `lr`, and the segments of [begin, end) (offsets relative
// to begin; *segs malloc'd, free it) with decay marked as the mask and weight_decay say.
void sl_adam_args_make(const sl_optim_config *cfg, double lr, int64_t step, sl_adam_args *a);
void sl_sgd_args_make(const sl_optim_config *cfg, double lr, int64_t step, sl_sgd_args *a);
int sl_optim_segments(const sl_optim_config *cfg, const sl_decay_mask *mask, size_t begin, size_t end,
                      sl_segment **segs, int *n_segs);

// One optimizer step over [begin, end) of params, dispatched on cfg->type: torch.optim.AdamW
// (decoupled: p *= 1 - lr*wd) or torch.optim.Adam (L2: g += wd*p) with state[0] = exp_avg and
// state[1] = exp_avg_sq; torch.optim.SGD with state[0] the momentum buffer (none when momentum is 0;
// on step 1 it is set to the decayed gradient, as torch creates it). Returns -1 (with a message) when
// a needed state buffer is NULL, step < 1, begin > end, or the segments cannot be allocated.
int sl_optim_step(const sl_optim_config *cfg, double lr, int64_t step, float *params, const float *grads,
                  float *const *state, const sl_decay_mask *mask, size_t begin, size_t end);

// The same step run by a backend's passes (ops->adam_step / sgd_step: one multi-tensor launch on a
// GPU); params, grads and state are that backend's buffers. With sl_ops_cpu, grad_coef 1 and no
// storage it is sl_optim_step. grad_coef: Adam / AdamW take every gradient times it (gradient
// clipping's coefficient) inside their pass, the same bits as scaling the gradients first; storage_bf16
// (NULL: none): Adam / AdamW also write each updated parameter rounded to bf16 there, at the
// parameter's index, as a to_storage pass after the step would (sl_adam_args). The other optimizers
// take only 1 and NULL (-1 otherwise: their caller scales the gradients and converts the parameters).
int sl_optim_step_on(const sl_ops *ops, const sl_optim_config *cfg, double lr, int64_t step, float *params,
                     const float *grads, float grad_coef, void *storage_bf16, float *const *state,
                     const sl_decay_mask *mask, size_t begin, size_t end);

// ---- gradient norm and clipping (DeepSpeed "gradient_clipping", torch clip_grad_norm_) ----------

// The global norm is sqrt of a backend's sumsq (ops.h: deterministic, independent of the thread
// count); for a sharded buffer add the ranks' sums (allreduce) first.
// max_norm / (norm + 1e-6) when that is < 1, else 1 (no clipping). max_norm <= 0 disables: 1.
double sl_clip_coef(double norm, float max_norm);

// Whole-buffer convenience on the CPU: norm = sqrt(sumsq), clip by sl_clip_coef. Returns the norm
// before clipping (what DeepSpeed and torch report).
double sl_clip_grad_norm(float *g, size_t n, float max_norm);

#endif
