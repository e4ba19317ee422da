// engine_internal.h: what engine.c, engine_ckpt.c and engine_precision.c share and nobody else sees.
#ifndef SHARDLM_ENGINE_INTERNAL_H
#define SHARDLM_ENGINE_INTERNAL_H

#include "shardlm/engine.h"
#include "shardlm/lora.h"
#include "shardlm/safetensors.h"

// The flat buffer the engine trains: the model's parameters, or with LoRA adapters attached
// (model->lora) the adapters', the base frozen (no gradient, no optimizer state).
static inline float *engine_params(const sl_engine *e) {
    return e->model->lora ? e->model->lora->params : e->model->params;
}
static inline float *engine_grads(const sl_engine *e) {
    return e->model->lora ? e->model->lora->grads : e->model->grads;
}
static inline size_t engine_total(const sl_engine *e) {
    return e->model->lora ? e->model->lora->total : e->model->layout.total;
}
// Its tensor table (the optimizer's per-tensor state: AdamW8bit's blocks), n_tensors entries.
static inline const sl_tensor_info *engine_tensors(const sl_engine *e, int *n_tensors) {
    *n_tensors = e->model->lora ? e->model->lora->n_tensors : e->model->layout.n_tensors;
    return e->model->lora ? e->model->lora->tensors : e->model->layout.tensors;
}

// The parameters the optimizer updates on this rank: [shard_begin, shard_begin + shard_size) of the
// flat buffer (the whole buffer without ZeRO), in the model (stages 0-2) or the ZeRO-3 slice.
float *engine_step_params(sl_engine *e);

// ---- engine_precision.c ------------------------------------------------------------------------
// 1 under fp16 / bf16: the model computes with 16-bit-rounded copies of fp32 master weights.
int engine_mixed(const sl_engine *e);
// 1 for bf16 with bf16 activation storage and no ZeRO: model->params is the fp32 master itself
// (e->master stays NULL) and the model computes with its bf16 copy.
int engine_params_are_master(const sl_engine *e);
// Sets up the loss scaler and, under fp16/bf16, the master weights (from the model's parameters).
int engine_precision_init(sl_engine *e);
void engine_precision_free(sl_engine *e);
// After the model's parameters were (re)written in fp32 (init, checkpoint load): master = them, and
// the model's copy rounded to the training precision. Stages 1-2 round the whole buffer, which
// every rank holds identically.
void engine_capture_master(sl_engine *e);
// The loss-scale factor for backward (1 in fp32 / bf16).
float engine_loss_scale(const sl_engine *e);
// Under fp16 / bf16: rounds a unit's freshly finished gradients to the training precision.
void engine_round_grads(sl_engine *e, float *g, size_t n);
// The overflow decision for this step's gradient slice g (n): local check (and fault injection),
// agreed across the data-parallel group. *overflow = 1 when any rank saw Inf/NaN. At a loss scale of 1
// (bf16; fp16 with a static scale of 1) the local check is the sum of squares clipping needs anyway
// (in double it is finite exactly when every gradient is: a float's square is below 1.2e77), kept in
// e->step_sumsq for apply_step; at another scale (fp16) the gradients are unscaled before that sum,
// so the check is its own pass.
int engine_check_overflow(sl_engine *e, const float *g, size_t n, int *overflow);
// The update target of the optimizer: the master slice under fp16/bf16, else the parameters.
float *engine_update_target(sl_engine *e);
// After the optimizer updated the master slice: the model's slice = master rounded.
void engine_publish_master(sl_engine *e);
// Scaler state <-> trainer_state.json ("loss_scaler" object) and across ranks.
void engine_scaler_to_json(const sl_engine *e, void *cjson_root);
int engine_scaler_from_json(sl_engine *e, const void *cjson_root, const char *file);
int engine_scaler_broadcast(sl_engine *e);

// ---- engine_stage.c: checkpoint data between the backend's buffers and host memory ----------------
// Floats in one host staging buffer (ckpt_stage_floats, or SL_CKPT_STAGE_FLOATS).
size_t engine_stage_floats(const sl_engine *e);
// Writes the safetensors file sl_ckpt_save_tensors would (1-D tensors names[i] of numel[i] floats),
// downloading each src[i] (backend memory) a chunk at a time through one host buffer. A failed copy
// is reported as "WHAT: copying "NAME" to host memory: <backend error>" and leaves no file.
int engine_stage_write(const sl_engine *e, const char *path, int n, const char **names, const float *const *src,
                       const size_t *numel, const char *what);
// Elements [first, first + count) of tensor idx of f into dst (backend memory), a chunk at a time;
// a failed copy is reported as "WHAT: copying "NAME" to the BACKEND backend: <backend error>".
int engine_stage_read(const sl_engine *e, const sl_st_file *f, int idx, size_t first, size_t count, float *dst,
                      const char *what);
// Collective over the data-parallel group: every rank's backend finishes its queued work
// (ops->synchronize) and all learn whether every rank's succeeded; -1 everywhere when any failed,
// with the backend's message, or one naming another rank.
int engine_backend_agrees(sl_engine *e);
// The full fp32 weights for a checkpoint, downloaded into a HOST buffer on rank 0 (*full, malloc'd:
// free it; NULL on other ranks). Collective. Without ZeRO-3 or a sharded master they sit in one
// buffer (the master without ZeRO, else the model's fp32 parameters), which rank 0 downloads whole;
// ZeRO with a master (stages 1-2) all-gathers the downloaded slices in host memory on every rank,
// stage 3 gathers them unit by unit through its windows into rank 0's buffer.
int engine_weights_for_save(sl_engine *e, float **full);

// ---- engine_ckpt_8bit.c: AdamW8bit state files ----------------------------------------------------
// The six tensor names of a state file, in order: exp_avg.q8, exp_avg_sq.q8 (U8), exp_avg.absmax,
// exp_avg_sq.absmax, exp_avg.fp32, exp_avg_sq.fp32 (F32).
extern const char *const SL_ADAM8_TENSORS[6];
// Writes a plan's state as one safetensors file (atomically), with min_8bit_size in its metadata.
int engine_adam8_write(const sl_adam8_plan *plan, const sl_adam8_state *st, long long min_8bit_size,
                       const char *path);
// min_8bit_size from a state file's metadata; -1 (message) when it is not one.
long long engine_adam8_file_min_size(const sl_st_file *f);
// Fills dst (laid out by dst_plan) with the part of the state file `path` (the flat range [begin, end)
// of the buffer of the tensor table `tensors`, `total` floats) that overlaps it. min_8bit_size < 0:
// the file's; else it must equal the file's.
int engine_adam8_read(const sl_tensor_info *tensors, int n_tensors, size_t total, long long min_8bit_size,
                      const char *path, size_t begin, size_t end, const sl_adam8_plan *dst_plan, sl_adam8_state *dst);

#endif
