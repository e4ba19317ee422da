// engine.c: the single-process training step and its checkpoints (see engine.h).
// Invariants: grads hold the sum over the micro-batches of this step, each scaled by
// 1/grad_accum_steps; grads are zero whenever micro_step == 0; `step` counts applied steps.
#include "shardlm/engine.h"
#include "shardlm/checkpoint.h"
#include "shardlm/error.h"
#include "shardlm/fault.h"
#include "shardlm/fileio.h"
#include "shardlm/hf_weights.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// FNV-1a over the parameter bytes: equal on every rank iff the parameters are bit-identical.
static long long params_hash(const float *p, size_t n) {
    return (long long)(sl_fnv1a64(SL_FNV1A64_INIT, p, n * sizeof(float)) >> 1);
}

// Rank 0's parameters to every rank, then a check that all ranks hold the same bits.
static int sync_parameters(sl_engine *e) {
    sl_model *m = e->model;
    if (sl_comm_broadcast(e->cfg.dp, m->params, m->layout.total, SL_DTYPE_F32, 0)) return -1;
    int world = sl_comm_size(e->cfg.dp);
    long long mine = params_hash(m->params, m->layout.total);
    long long *all = sl_calloc((size_t)world, sizeof(long long), "parameter hashes");
    if (!all) return -1;
    int rc = sl_comm_allgather(e->cfg.dp, &mine, all, 1, SL_DTYPE_I64);
    for (int r = 0; rc == 0 && r < world; r++)
        if (all[r] != all[0]) rc = sl_errorf("data-parallel rank %d holds different parameters from rank 0 after the "
                                             "broadcast", r);
    free(all);
    return rc;
}

int sl_engine_init(sl_engine *e, sl_model *model, const sl_engine_config *cfg) {
    memset(e, 0, sizeof *e);
    e->model = model;
    e->cfg = *cfg;
    if (cfg->micro_batch <= 0 || cfg->grad_accum_steps <= 0)
        return sl_errorf("engine: micro batch (%d) and gradient accumulation steps (%d) must be positive",
                         cfg->micro_batch, cfg->grad_accum_steps);
    if (sl_decay_mask_from_layout(&e->decay_mask, &model->layout, cfg->optim.decay_all)) return -1;
    if (cfg->zero_stage < 0 || cfg->zero_stage > 1)
        return sl_errorf("engine: ZeRO stage %d is not available (stages 0 and 1 are)", cfg->zero_stage);
    e->distributed = cfg->dp && sl_comm_size(cfg->dp) > 1;
    e->sharded = e->distributed && cfg->zero_stage >= 1;
    size_t total = model->layout.total;
    e->padded_total = total;
    e->shard_begin = 0;
    e->shard_size = total;
    if (e->sharded) {
        size_t world = (size_t)sl_comm_size(cfg->dp);
        e->shard_size = (total + world - 1) / world;
        e->padded_total = e->shard_size * world;
        e->shard_begin = e->shard_size * (size_t)sl_comm_rank(cfg->dp);
        if (sl_model_reserve(model, e->padded_total)) { sl_engine_free(e); return -1; }
    }
    e->state_numel = e->shard_size;
    e->n_optim_state = sl_optim_num_state_buffers(&cfg->optim);
    for (int i = 0; i < e->n_optim_state; i++) {
        e->optim_state[i] = sl_calloc(e->state_numel, sizeof(float), "optimizer state");
        if (!e->optim_state[i]) { sl_engine_free(e); return -1; }
    }
    sl_model_zero_grad(model);
    if (e->distributed) {
        size_t bucket = cfg->reduce_bucket_size ? cfg->reduce_bucket_size : 500000000;
        if (sync_parameters(e) ||
            sl_ddp_init(&e->ddp, cfg->dp, model->grads, model->layout.total, bucket, cfg->first_bucket_size,
                        cfg->overlap_comm)) {
            sl_engine_free(e);
            return -1;
        }
    }
    return 0;
}

void sl_engine_free(sl_engine *e) {
    for (int i = 0; i < 2; i++) free(e->optim_state[i]);
    sl_decay_mask_free(&e->decay_mask);
    if (e->distributed) sl_ddp_free(&e->ddp);
    memset(e, 0, sizeof *e);
}

int sl_engine_forward_backward(sl_engine *e, const int *inputs, const int *targets, int B, int T, float *loss) {
    float l;
    int last_micro = e->micro_step + 1 == e->cfg.grad_accum_steps;
    if (sl_model_forward(e->model, inputs, targets, B, T, &l)) return -1;
    if (e->distributed && last_micro) {
        e->model->grad_ready = sl_ddp_grad_ready;
        e->model->grad_ready_ctx = &e->ddp;
    }
    int rc = sl_model_backward(e->model, 1.0f / (float)e->cfg.grad_accum_steps);
    e->model->grad_ready = NULL;
    if (rc == 0 && e->distributed && last_micro) rc = sl_ddp_finish(&e->ddp);
    if (rc) return -1;
    e->loss_sum += l;
    e->micro_step++;
    if (loss) *loss = l;
    return 0;
}

int sl_engine_step_due(const sl_engine *e) { return e->micro_step >= e->cfg.grad_accum_steps; }

int sl_engine_step(sl_engine *e) {
    sl_model *m = e->model;
    if (e->micro_step == 0) return sl_errorf("engine: step called with no accumulated micro-batches");
    size_t n = m->layout.total;
    e->last_grad_norm = (float)sl_clip_grad_norm(m->grads, n, e->cfg.gradient_clipping);
    e->last_lr = sl_schedule_lr(&e->cfg.schedule, e->step);
    size_t b = e->shard_begin, end = e->shard_begin + e->shard_size;
    if (sl_optim_step(&e->cfg.optim, e->last_lr, e->step + 1, m->params + b, m->grads + b, e->optim_state,
                      &e->decay_mask, b, end))
        return -1;
    // ZeRO-1: every rank updated its own slice; gather the others' (in place)
    if (e->sharded && sl_comm_allgather(e->cfg.dp, m->params + b, m->params, e->shard_size, SL_DTYPE_F32)) return -1;
    double loss_sum = e->loss_sum;
    if (e->distributed) {
        if (sl_comm_allreduce(e->cfg.dp, &loss_sum, 1, SL_DTYPE_F64, SL_OP_SUM)) return -1;
        loss_sum /= sl_comm_size(e->cfg.dp);
    }
    e->last_loss = (float)(loss_sum / e->micro_step);
    e->loss_sum = 0.0;
    e->micro_step = 0;
    e->step++;
    sl_model_zero_grad(m);
    return 0;
}

sl_engine_memory sl_engine_memory_use(const sl_engine *e) {
    sl_engine_memory mem = {e->model->capacity * sizeof(float), e->model->capacity * sizeof(float),
                            (size_t)e->n_optim_state * e->state_numel * sizeof(float)};
    return mem;
}
