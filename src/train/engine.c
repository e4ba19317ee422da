// engine.c: the training step. sl_engine_init sets a model up for DDP or ZeRO with its optimizer
// state; sl_engine_forward_backward runs one micro-batch, reducing gradients as backward finishes each
// unit (the model's unit hook); sl_engine_step checks for overflow, unscales, clips, updates this
// rank's slice and hands the new parameters out; sl_engine_detach_model ends training. Checkpoints
// live in engine_ckpt.c, mixed precision in engine_precision.c.
// Invariants: grads hold the sum over the micro-batches of this step, each scaled by
// 1/grad_accum_steps; grads are zero whenever micro_step == 0; `step` counts the steps taken,
// skipped ones included.
#include "engine_internal.h"
#include "shardlm/error.h"
#include "shardlm/fileio.h"
#include "shardlm/attention_choice.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

// FNV-1a over the parameter bytes: equal on every rank iff the parameters are bit-identical.
static long long params_hash(const float *p, size_t n) {
    return (long long)(sl_fnv1a64(SL_FNV1A64_INIT, p, n * sizeof(float)) >> 1);
}

// Rank 0's parameters to every rank, then a check that all ranks hold the same bits (hashed on the
// host: a device model's parameters are downloaded for it once).
static int sync_parameters(sl_engine *e) {
    const sl_ops *ops = e->model->ops;
    size_t n = engine_total(e);
    float *params = engine_params(e);  // with LoRA the adapters (every rank loaded the same base)
    if (sl_comm_order_after(e->cfg.dp, ops->stream()) || sl_comm_broadcast(e->cfg.dp, params, n, SL_DTYPE_F32, 0))
        return -1;
    float *host = ops->on_device ? sl_malloc(n * sizeof(float), "parameters to hash") : params;
    if (!host) return -1;
    if (host != params) ops->download(host, params, n * sizeof(float));
    long long mine = params_hash(host, n);
    if (host != params) free(host);
    int world = sl_comm_size(e->cfg.dp);
    long long *all = sl_calloc((size_t)world, sizeof(long long), "parameter hashes");
    if (!all) return -1;
    int rc = sl_comm_allgather(e->cfg.dp, &mine, all, 1, SL_DTYPE_I64);
    for (int r = 0; rc == 0 && r < world; r++)
        if (all[r] != all[0]) rc = sl_errorf("data-parallel rank %d holds different parameters from rank 0 after the "
                                             "broadcast", r);
    free(all);
    return rc;
}

// The model's unit hook: ZeRO handles every event; plain data parallelism starts each gradient
// bucket once backward has finished everything above the finished unit.
static int engine_unit_hook(void *ctx, sl_unit_event event, int unit, int next_unit) {
    sl_engine *e = ctx;
    // 16-bit gradients: a unit's are rounded once backward has finished them, before they are reduced
    const sl_lora *lora = e->model->lora;  // with adapters: unit u's are [unit_begin[u], unit_begin[u + 1]) of theirs
    if (event == SL_GRADS_PUT && engine_mixed(e)) {
        if (lora) engine_round_grads(e, lora->grad_view[unit], lora->unit_begin[unit + 1] - lora->unit_begin[unit]);
        else engine_round_grads(e, e->model->grad_view[unit], sl_layout_unit_size(&e->model->layout, unit));
    }
    if (e->sharded) return sl_zero_hook(&e->zero, event, unit, next_unit);
    if (e->ddp_active && event == SL_GRADS_PUT) {
        return sl_ddp_grad_ready(&e->ddp, lora ? lora->unit_begin[unit] : e->model->layout.unit_begin[unit]);
    }
    return 0;
}

int sl_engine_check_comm(int on_gpu, const char *device, sl_comm_backend backend, int world_size, int zero_stage) {
    if (backend == SL_COMM_NCCL && !on_gpu)
        return sl_errorf("--comm-backend nccl moves GPU memory: it needs --device cuda (this run has --device %s); "
                         "on the CPU use --comm-backend mpi or auto", device);
    if (backend == SL_COMM_NCCL && strncmp(device, "cuda:", 5) == 0)
        return sl_errorf("--comm-backend nccl puts every process on GPU LOCAL_RANK (modulo the visible GPUs), so it "
                         "takes --device cuda, not --device %s (choose the GPUs with CUDA_VISIBLE_DEVICES)", device);
    if (!on_gpu || backend == SL_COMM_NCCL) return 0;
    const char *name = backend == SL_COMM_MPI ? "mpi" : "self";
    if (world_size > 1)
        return sl_errorf("--device %s with %d ranks needs the nccl comm backend (the %s backend moves host memory "
                         "only): pass --comm-backend nccl, e.g. shardlm launch --nproc-per-node %d train --device "
                         "cuda --comm-backend nccl ...", device, world_size, name, world_size);
    if (zero_stage >= 1)
        return sl_errorf("--device %s with ZeRO stage %d needs the nccl comm backend (the %s backend moves host memory "
                         "only): pass --comm-backend nccl (one process works too)", device, zero_stage, name);
    return 0;
}

int sl_engine_check_comm_plan(const char *device, const char *backend_name, int zero_stage) {
    sl_comm_backend backend;
    int world;
    if (sl_comm_choose_backend(backend_name, &backend, &world)) return -1;
    int on_gpu = !strcmp(device, "cuda") || !strncmp(device, "cuda:", 5);
    return sl_engine_check_comm(on_gpu, device, backend, world, zero_stage);
}

int sl_engine_init(sl_engine *e, sl_model *model, const sl_engine_config *cfg) {
    memset(e, 0, sizeof *e);
    e->model = model;
    e->cfg = *cfg;
    if (cfg->micro_batch <= 0 || cfg->grad_accum_steps <= 0)
        return sl_errorf("engine: micro batch (%d) and gradient accumulation steps (%d) must be positive",
                         cfg->micro_batch, cfg->grad_accum_steps);
    if (cfg->zero_stage < 0 || cfg->zero_stage > 3)
        return sl_errorf("engine: ZeRO stage %d is not one of 0, 1, 2, 3", cfg->zero_stage);
    // An NCCL group exchanges even alone: one GPU runs the code path of N (and tests it).
    int nccl = cfg->dp && sl_comm_backend_of(cfg->dp) == SL_COMM_NCCL;
    if (model->lora) {  // the adapters are what trains (and what ZeRO partitions); the base stays frozen
        if (sl_lora_alloc_grads(model->lora)) return -1;
    } else if (!model->params || !model->grads) {
        return sl_errorf("engine: the model's buffers belong to another engine (ZeRO-2/3 took them)");
    }
    e->distributed = cfg->dp && (sl_comm_size(cfg->dp) > 1 || nccl);
    if (cfg->dp && sl_engine_check_comm(model->ops->on_device, model->ops->name, sl_comm_backend_of(cfg->dp),
                                        sl_comm_size(cfg->dp), cfg->zero_stage))
        return sl_error_context("engine");
    if (model->lora ? sl_decay_mask_from_tensors(&e->decay_mask, model->lora->tensors, model->lora->n_tensors,
                                                 cfg->optim.decay_all)
                    : sl_decay_mask_from_layout(&e->decay_mask, &model->layout, cfg->optim.decay_all))
        return -1;
    e->sharded = cfg->dp && cfg->zero_stage >= 1;
    sl_model_zero_grad(model);
    if (e->distributed && sync_parameters(e)) { sl_engine_free(e); return -1; }
    size_t total = engine_total(e);
    e->padded_total = e->shard_size = total;
    e->shard_begin = 0;
    if (e->sharded) {
        if (sl_zero_init(&e->zero, model, cfg->dp, cfg->zero_stage, cfg->prefetch)) { sl_engine_free(e); return -1; }
        e->shard_size = e->zero.shard_size;
        e->padded_total = e->zero.padded_total;
        e->shard_begin = e->zero.shard_begin;
    } else if (e->distributed) {
        size_t bucket = cfg->reduce_bucket_size ? cfg->reduce_bucket_size : 500000000;
        if (sl_ddp_init(&e->ddp, cfg->dp, model->ops, engine_grads(e), total, bucket, cfg->first_bucket_size,
                        cfg->overlap_comm)) {
            sl_engine_free(e);
            return -1;
        }
    }
    e->state_numel = e->shard_size;
    e->n_optim_state = sl_optim_num_state_buffers(&cfg->optim);
    for (int i = 0; i < e->n_optim_state; i++) {
        e->optim_state[i] = model->ops->alloc(e->state_numel * sizeof(float), "optimizer state");
        if (!e->optim_state[i]) { sl_engine_free(e); return -1; }
    }
    if (cfg->optim.type == SL_OPTIM_ADAMW8BIT) {
        if (!model->ops->adam8_step || model->ops->on_device) {
            sl_errorf("engine: optimizer AdamW8bit runs on the CPU only (the %s backend has no 8-bit optimizer "
                      "kernel yet): use --device cpu, or optimizer AdamW", model->ops->name);
            sl_engine_free(e);
            return -1;
        }
        int n_tensors;
        const sl_tensor_info *tensors = engine_tensors(e, &n_tensors);
        if (sl_adam8_plan_build(&e->adam8_plan, tensors, n_tensors, total, &cfg->optim, e->shard_begin,
                                e->shard_begin + e->shard_size) ||
            sl_adam8_state_alloc(&e->adam8, &e->adam8_plan)) {
            sl_engine_free(e);
            return -1;
        }
    }
    if (engine_precision_init(e) || sl_model_params_changed(model)) { sl_engine_free(e); return -1; }
    if (e->sharded || e->distributed || engine_mixed(e)) {
        model->unit_hook = engine_unit_hook;
        model->unit_hook_ctx = e;
    }
    sl_attention_training(1);  // SHARDLM_ATTENTION=auto: cuDNN's fused attention while this engine lives
    e->training_noted = 1;
    return 0;
}

void sl_engine_free(sl_engine *e) {
    if (!e->model) return;
    if (e->training_noted) sl_attention_training(0);
    e->training_noted = 0;
    engine_precision_free(e);
    for (int i = 0; i < 2; i++)
        if (e->optim_state[i]) e->model->ops->dealloc(e->optim_state[i]);
    sl_decay_mask_free(&e->decay_mask);
    sl_adam8_plan_free(&e->adam8_plan);
    sl_adam8_state_free(&e->adam8);
    if (e->model && e->model->unit_hook_ctx == e) {
        e->model->unit_hook = NULL;
        e->model->unit_hook_ctx = NULL;
    }
    if (e->sharded) sl_zero_free(&e->zero);
    else if (e->distributed) sl_ddp_free(&e->ddp);
    memset(e, 0, sizeof *e);
}

int sl_engine_forward_backward(sl_engine *e, const int *inputs, const int *targets, int B, int T, float *loss) {
    float l;
    if (e->detached) return sl_errorf("engine: the model was detached for inference; no more training");
    int last_micro = e->micro_step + 1 == e->cfg.grad_accum_steps;
    float grad_scale = 1.0f / (float)e->cfg.grad_accum_steps;
    if (engine_loss_scale(e) != 1.0f) grad_scale *= engine_loss_scale(e);  // fp16: the scaled loss
    sl_model_expect_backward(e->model, grad_scale);  // the loss and its gradient in one pass (fused classifier)
    if (sl_model_forward(e->model, inputs, targets, B, T, &l)) return -1;
    if (e->sharded) sl_zero_begin_backward(&e->zero, last_micro);
    e->ddp_active = !e->sharded && e->distributed && last_micro;
    int rc = sl_model_backward(e->model, grad_scale);
    if (rc == 0 && e->sharded) rc = sl_zero_finish_backward(&e->zero);
    if (rc == 0 && e->ddp_active) rc = sl_ddp_finish(&e->ddp);
    e->ddp_active = 0;
    if (rc) return -1;
    e->loss_sum += l;
    e->micro_step++;
    if (loss) *loss = l;
    return 0;
}

int sl_engine_step_due(const sl_engine *e) { return e->micro_step >= e->cfg.grad_accum_steps; }

float *engine_step_params(sl_engine *e) {
    return e->sharded ? sl_zero_step_params(&e->zero) : engine_params(e);
}

// This step's gradient slice (ZeRO: the reduced slice, averaged; else the whole buffer, which DDP
// already averaged).
static int step_grads(sl_engine *e, float **g, size_t *n) {
    if (!e->sharded) {
        *g = engine_grads(e);
        *n = engine_total(e);
        return 0;
    }
    sl_zero *z = &e->zero;
    if (sl_zero_before_step(z)) return -1;
    *g = z->shard_grads;
    *n = e->shard_size;
    e->model->ops->scale(*g, *n, 1.0f / (float)z->world);
    return 0;
}

static void zero_grads(sl_engine *e) {
    if (e->sharded) sl_zero_zero_grads(&e->zero);
    else sl_model_zero_grad(e->model);
}

// Unscale, clip by the global norm (ZeRO: the ranks' sums of squares added), update this rank's
// slice (the fp32 master under mixed precision), then hand the new parameters out.
static int apply_step(sl_engine *e, float *g, size_t n, double used_scale) {
    const sl_ops *ops = e->model->ops;
    if (used_scale != 1.0) ops->scale(g, n, (float)(1.0 / used_scale));  // powers of two: exact
    // the overflow check's sum when it made one over these same (unscaled) gradients
    double sumsq = e->step_sumsq_known && used_scale == 1.0 ? e->step_sumsq : ops->sumsq(g, n);
    if (e->sharded && e->zero.world > 1 && sl_comm_allreduce(e->cfg.dp, &sumsq, 1, SL_DTYPE_F64, SL_OP_SUM))
        return -1;
    double norm = sqrt(sumsq), coef = sl_clip_coef(norm, e->cfg.gradient_clipping);
    // Adam / AdamW multiply by the coefficient inside their pass (the same bits, one pass over the
    // gradients fewer); SGD and the 8-bit AdamW take them scaled. When they update the model's own
    // buffer (no master slice, no ZeRO, no adapters), they also write its bf16 weight copy in that
    // pass instead of a to_storage pass after it.
    const int coef_in_step = e->cfg.optim.type == SL_OPTIM_ADAM || e->cfg.optim.type == SL_OPTIM_ADAMW;
    sl_model *m = e->model;
    void *storage = coef_in_step && !e->master && !e->sharded && !m->lora && m->weights_bf16 && m->params ?
                    m->weights_bf16 : NULL;
    if (coef != 1.0 && !coef_in_step) ops->scale(g, n, (float)coef);
    e->last_grad_norm = (float)norm;
    int64_t applied = e->step - e->scaler.skipped_steps;
    int rc = e->cfg.optim.type == SL_OPTIM_ADAMW8BIT
                 ? sl_adam8_step(ops, &e->cfg.optim, &e->adam8_plan, &e->adam8, e->last_lr, applied + 1,
                                 engine_update_target(e), g, e->sharded ? e->cfg.dp : NULL)
                 : sl_optim_step_on(ops, &e->cfg.optim, e->last_lr, applied + 1, engine_update_target(e), g,
                                    coef_in_step ? (float)coef : 1.0f, storage,
                                    e->optim_state, &e->decay_mask, e->shard_begin, e->shard_begin + n);
    if (rc) return -1;
    engine_publish_master(e);
    if (e->sharded) {
        if (sl_zero_after_step(&e->zero)) return -1;
    } else {
        sl_model_zero_grad(e->model);
    }
    // the GEMMs' bf16 weight copy (bf16 activation storage), unless the optimizer's pass wrote it
    return storage ? 0 : sl_model_params_changed(e->model);
}

int sl_engine_step(sl_engine *e) {
    if (e->micro_step == 0) return sl_errorf("engine: step called with no accumulated micro-batches");
    e->last_lr = sl_schedule_lr(&e->cfg.schedule, e->step - e->scaler.skipped_steps);
    float *g;
    size_t n;
    int overflow;
    e->step_sumsq_known = 0;
    if (step_grads(e, &g, &n) || engine_check_overflow(e, g, n, &overflow)) return -1;
    double used_scale = e->scaler.scale;
    int skip = sl_loss_scaler_update(&e->scaler, overflow);
    if (skip < 0) return sl_error_context("step %lld", (long long)e->step + 1);
    e->last_step_skipped = skip;
    e->last_step_scale = used_scale;
    if (skip) zero_grads(e);  // DeepSpeed: the overflowing gradients are dropped, nothing moves
    else if (apply_step(e, g, n, used_scale)) return -1;
    // a kernel or library call of this step that failed on the backend (recorded there, first one
    // wins) stops training here, named, instead of going unnoticed
    if (e->model->ops->synchronize())
        return sl_error_context("step %lld on the %s backend", (long long)e->step + 1, e->model->ops->name);
    double loss_sum = e->loss_sum;
    if (e->distributed) {
        if (sl_comm_allreduce(e->cfg.dp, &loss_sum, 1, SL_DTYPE_F64, SL_OP_SUM)) return -1;
        loss_sum /= sl_comm_size(e->cfg.dp);
    }
    e->last_loss = (float)(loss_sum / e->micro_step);
    e->loss_sum = 0.0;
    e->micro_step = 0;
    e->step++;
    return 0;
}

int sl_engine_detach_model(sl_engine *e, int everywhere) {
    sl_model *m = e->model;
    const sl_ops *ops = m->ops;
    if (e->sharded && e->zero.stage == 3) {
        // the trained buffer whole again (the model's, or its adapters'; the backend's memory), filled
        // through a host copy on a GPU
        int root_only = !everywhere && e->zero.rank != 0;
        size_t bytes = e->padded_total * sizeof(float);
        float *full = root_only ? NULL : ops->alloc(bytes, "parameters");
        float *host = full && ops->on_device ? sl_malloc(bytes, "parameters (host copy)") : full;
        if (!root_only && !host) {
            if (full) ops->dealloc(full);
            return -1;
        }
        int rc = sl_zero_gather_params(&e->zero, host);
        if (rc == 0 && host != full) ops->upload(full, host, bytes);
        if (host != full) free(host);
        if (rc) {
            if (full) ops->dealloc(full);
            return -1;
        }
        *e->zero.buf.params = full;
        *e->zero.buf.capacity = full ? e->padded_total : 0;
    }
    m->unit_hook = NULL;
    m->unit_hook_ctx = NULL;
    sl_model_bind_views(m);
    if (m->lora) sl_lora_bind_views(m->lora);
    e->detached = 1;
    if (e->training_noted) sl_attention_training(0);  // training is over: generation keeps auto's mma
    e->training_noted = 0;
    return 0;
}

sl_engine_memory sl_engine_memory_use(const sl_engine *e) {
    const sl_lora *lora = e->model->lora;
    sl_engine_memory mem = {.params = e->model->capacity * sizeof(float),
                            .grads = lora ? lora->capacity * sizeof(float) : e->model->capacity * sizeof(float),
                            .adapters = lora ? lora->capacity * sizeof(float) : 0,
                            .optim = (size_t)e->n_optim_state * e->state_numel * sizeof(float) +
                                     (e->adam8.q1 ? sl_adam8_state_bytes(&e->adam8_plan) : 0)};
    // ZeRO's buffers: the adapters' with LoRA (the base stays whole), else the model's
    if (e->sharded) sl_zero_memory(&e->zero, lora ? &mem.adapters : &mem.params, &mem.grads);
    if (e->master) mem.master = e->shard_size * sizeof(float);
    // bf16 copies: the model's whole (the frozen base's with LoRA), the adapters', ZeRO-3 windows' twins
    if (e->model->weights_bf16) mem.param_copy = e->model->layout.total * sizeof(sl_bf16);
    if (lora && lora->weights_bf16) mem.param_copy += lora->total * sizeof(sl_bf16);
    if (e->model->ops->act_bf16 && e->sharded && e->zero.stage == 3)
        mem.param_copy += sl_zero_window_floats(e->zero.buf.n_units, e->zero.buf.unit_begin) * sizeof(sl_bf16);
    return mem;
}
