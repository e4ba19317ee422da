// engine.h: the training step, DeepSpeed-style. The engine owns gradient accumulation, clipping,
// the learning-rate schedule, the optimizer and its state, and checkpoints of all of it:
//   sl_engine_init(engine, model, config)
//   sl_engine_forward_backward(engine, inputs, targets, B, T, &loss)   once per micro-batch
//   sl_engine_step(engine)                                              once per optimizer step
//   sl_engine_save(engine, root, tag, client_state) / sl_engine_load(engine, path, &client_state)
// The model never learns how it is being trained; the next issue's parallel strategies live here.
#ifndef SHARDLM_ENGINE_H
#define SHARDLM_ENGINE_H

#include <stdint.h>
#include "shardlm/comm.h"
#include "shardlm/ddp.h"
#include "shardlm/loss_scaler.h"
#include "shardlm/model.h"
#include "shardlm/optim.h"
#include "shardlm/optim_8bit.h"
#include "shardlm/schedule.h"
#include "shardlm/zero.h"

#define SL_CKPT_STAGE_FLOATS ((size_t)1 << 22)  // 16 MiB of host memory

typedef struct {
    int micro_batch;          // train_micro_batch_size_per_gpu
    int grad_accum_steps;     // gradient_accumulation_steps
    float gradient_clipping;  // max global norm; 0 = off
    sl_optim_config optim;
    sl_schedule schedule;
    // data parallelism (DDP); dp NULL or of size 1 = a single process. A model on a GPU exchanges
    // through an "nccl" group only (refused otherwise, naming --comm-backend nccl), which runs the
    // DDP / ZeRO code even at size 1; an "nccl" group with a CPU model is refused too.
    sl_comm *dp;
    size_t reduce_bucket_size;   // elements per gradient bucket (DeepSpeed's reduce_bucket_size)
    size_t first_bucket_size;    // the small first bucket (the head's end of the buffer)
    int overlap_comm;            // start each bucket's all-reduce as soon as backward has finished it
    int zero_stage;              // 0: every rank holds everything; 1, 2, 3: ZeRO stages (zero.h)
    int prefetch;                // ZeRO-3: gather the next unit while the current one computes
    // DeepSpeed "fp16" / "bf16": with either, the model computes with 16-bit parameters and
    // gradients (rounded to that format) while the optimizer updates fp32 master weights; fp16
    // scales the loss (dynamic by default) and skips steps whose gradients overflow.
    sl_loss_scaler_config precision;
    // sl_engine_load checks every checkpoint file's size and checksum against its manifest.json
    // first; 1 skips that (`--no-verify`): the files are read as they are.
    int skip_verify;
} sl_engine_config;

typedef struct {
    sl_model *model;
    sl_engine_config cfg;
    sl_decay_mask decay_mask;
    float *optim_state[2];    // exp_avg / exp_avg_sq (Adam), momentum_buffer (SGD), as needed
    int n_optim_state;
    // AdamW8bit (optim_8bit.h): the plan of this rank's state range (its shard clipped to the
    // parameters, or everything) and the 8-bit state, in host memory (CPU backends only)
    sl_adam8_plan adam8_plan;
    sl_adam8_state adam8;
    int64_t step;             // optimizer steps completed
    int micro_step;           // micro-batches accumulated toward the next step
    double loss_sum;          // sum of micro-batch losses since the last step
    float last_loss;          // mean micro-batch loss of the last completed step
    float last_lr;
    float last_grad_norm;     // before clipping
    int distributed;          // dp group with more than one rank, or an nccl group of any size
    sl_ddp ddp;
    int ddp_active;           // this backward reduces its gradients through ddp (last micro-batch)
    // ZeRO (stage >= 1, with a dp group of any size): this rank owns [shard_begin, shard_begin +
    // shard_size) of the flat buffer, padded to shard_size * dp ranks; its optimizer state holds only
    // that slice. Without ZeRO the "slice" is the whole buffer.
    int sharded;
    sl_zero zero;
    size_t shard_begin, shard_size, padded_total;
    size_t state_numel;       // elements per optimizer state buffer on this rank
    int detached;             // sl_engine_detach_model was called: no more steps
    // Checkpoint data moves between the engine's buffers and the files through a host buffer of this
    // many floats (the optimizer state a chunk at a time); 0 (as init leaves it): SL_CKPT_STAGE_FLOATS.
    size_t ckpt_stage_floats;
    // mixed precision (engine_precision.c). `step` counts every step taken, skipped ones included
    // (DeepSpeed's global_steps); the learning-rate schedule and the optimizer's step number advance
    // only on applied steps: step - scaler.skipped_steps.
    sl_loss_scaler scaler;
    float *master;            // (shard_size) fp32 master weights of this rank's slice; NULL in fp32, and
                              // under bf16 with bf16 activation storage and no ZeRO (model->params is the master)
    int last_step_skipped;    // the last step found non-finite gradients and changed nothing
    double last_step_scale;   // the loss scale the last step's gradients were computed with
    int step_sumsq_known;     // this step's overflow check left the local gradient sum of squares in
    double step_sumsq;        // step_sumsq (unscaled gradients: bf16), so clipping does not read them again
    int training_noted;       // counted by sl_attention_training (SHARDLM_ATTENTION=auto: cuDNN in training)
} sl_engine;

// DeepSpeed's zero_to_fp32: turns a checkpoint saved at any world size / ZeRO stage (a root, using
// its latest, or a tag directory) into OUT_DIR with one Hugging Face model.safetensors + config.json,
// and with `with_optimizer` the whole optimizer state as optimizer.safetensors. Every file is
// verified against the manifest first; OUT_DIR appears only when complete and must not exist.
int sl_checkpoint_consolidate(const char *path, const char *out_dir, int with_optimizer);

// Bytes this rank allocated for parameters, gradients and optimizer state (params: the fp32 buffer
// the model and ZeRO work on; under bf16 activation storage without ZeRO it is the master itself);
// under mixed precision also the separate fp32 master slice (0 when model->params is the master)
// and the bf16 parameter copy the model computes with (its whole-model copy, or its ZeRO-3
// windows' bf16 twins).
// With LoRA adapters attached (model->lora): params is the frozen base, adapters the trained
// adapters' parameters, and grads and optim hold the adapters' only.
typedef struct { size_t params, grads, optim, master, param_copy, adapters; } sl_engine_memory;
sl_engine_memory sl_engine_memory_use(const sl_engine *e);

// The one rule for comm backends and devices: NCCL moves GPU memory only (a CPU run cannot use it) and
// puts each process on GPU LOCAL_RANK (so it takes "cuda", not "cuda:N"), and a GPU run that exchanges
// buffers (several ranks, or any ZeRO stage) needs NCCL (Open MPI as packaged is not CUDA-aware; self
// copies host memory). -1 with a message naming the flag to pass. The engine checks it at init.
int sl_engine_check_comm(int on_gpu, const char *device, sl_comm_backend backend, int world_size, int zero_stage);
// The same rule before any process group or GPU exists, for a run on `device` ("cpu", "cuda", "cuda:N")
// whose world sl_comm_init_world will create with backend_name (the backend and world size of
// sl_comm_choose_backend; its errors too). `shardlm train` calls it once, first.
int sl_engine_check_comm_plan(const char *device, const char *backend_name, int zero_stage);

int sl_engine_init(sl_engine *e, sl_model *model, const sl_engine_config *cfg);
void sl_engine_free(sl_engine *e);

// Collective. After training: leaves full parameters in model->params on rank 0 (every rank when
// `everywhere`) and unhooks the model, so it can generate text. ZeRO-3 gathers the slices; other
// stages already hold everything. The engine takes no more steps.
int sl_engine_detach_model(sl_engine *e, int everywhere);

// With a data-parallel group, init broadcasts rank 0's parameters and checks every rank holds the
// same bits; save has every rank write its optimizer slice and rank 0 the weights and manifest;
// load reads the weights on rank 0 and hands them out, each rank reading its own optimizer slice.
// Forward + backward of one micro-batch; gradients accumulate scaled by 1/grad_accum_steps. On the
// last micro-batch of a step the gradients are reduced over the data-parallel group while backward
// runs (DDP buckets, or ZeRO-1 per-unit reduce-scatter); earlier micro-batches communicate nothing,
// except at ZeRO stages 2-3, which reduce every micro-batch (zero.h).
int sl_engine_forward_backward(sl_engine *e, const int *inputs, const int *targets, int B, int T, float *loss);

// True when grad_accum_steps micro-batches have been accumulated and a step is due.
int sl_engine_step_due(const sl_engine *e);

// Checks the gradients for overflow (fp16, and bf16 unless check_grad_overflow is false; agreed
// across ranks) and updates the loss scale; on overflow skips the update (last_step_skipped = 1).
// Otherwise unscales, clips, applies the optimizer at the scheduled lr (to the fp32 master weights
// under fp16/bf16, then rounds them into the model). Zeroes gradients and advances the step.
int sl_engine_step(sl_engine *e);

// Writes ROOT/<tag>/ {model.safetensors, config.json (Hugging Face), optimizer.safetensors,
// trainer_state.json (step, optimizer/schedule settings, and client_state: any JSON object the
// caller wants back, e.g. loader position and resolved config)}, atomically, then moves ROOT/latest.
// The engine's buffers are downloaded into host memory and written from there; a failed copy is an
// error naming the checkpoint, the step and what was being copied, and commits nothing.
int sl_engine_save(sl_engine *e, const char *root, const char *tag, const char *client_state_json);

// Loads a checkpoint root (its latest) or a tag directory into an engine built for the same model
// shape, uploading into the engine's buffers in place. *client_state_json (malloc'd, may be NULL)
// returns what save was given. After a failure the engine may hold part of the checkpoint.
int sl_engine_load(sl_engine *e, const char *path, char **client_state_json);

#endif
