// engine_precision.c: mixed precision in the engine, DeepSpeed's "fp16" / "bf16" training.
// Under fp16 or bf16 the model computes with 16-bit parameters and produces 16-bit gradients; the
// optimizer updates fp32 master weights of this rank's slice, and the model's copy is the master
// rounded (round to nearest even) after every applied step. This file keeps that logic
// backend-independent: storage precision is emulated by rounding fp32 buffers through the ops
// table's round_to (on the CPU the values are 16-bit values held in floats), so CI tests exactly
// the master-weight, loss-scaling and skipped-step behaviour a GPU run has.
// Invariants:
//   - under fp16/bf16, engine_step_params(e)[i] == round(master[i]) after init, load and every step;
//     except with bf16 activation storage and no ZeRO (engine_params_are_master), where the model's
//     fp32 parameters are the master and its bf16 copy holds round(master[i]);
//   - every rank takes the same skip decision (the overflow flag is all-reduced with MAX);
//   - a skipped step changes no parameter, optimizer state, or learning-rate / optimizer step count.
#include "engine_internal.h"
#include "shardlm/error.h"
#include "shardlm/json_get.h"
#include "shardlm/fault.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int engine_mixed(const sl_engine *e) { return e->cfg.precision.precision != SL_PRECISION_FP32; }

// bf16 with bf16 activation storage and no ZeRO: the model reads its parameters only through its bf16
// copy (ops.h act_bf16), so its fp32 buffer can itself be the master: no separate master copy (4
// bytes per parameter less), the optimizer updates model->params, and sl_model_params_changed
// rounds them into the bf16 copy after every step. ZeRO keeps a master slice (its fp32 buffers are
// gathered and hold rounded values).
int engine_params_are_master(const sl_engine *e) {
    return e->cfg.precision.precision == SL_PRECISION_BF16 && e->model->ops->act_bf16 && !e->sharded;
}

static int rank_of(const sl_engine *e) { return e->distributed ? sl_comm_rank(e->cfg.dp) : 0; }

int engine_precision_init(sl_engine *e) {
    if (sl_loss_scaler_init(&e->scaler, &e->cfg.precision)) return -1;
    e->last_step_scale = e->scaler.scale;
    // the model's values are 16-bit under mixed precision: the backend may compute its GEMMs in it
    e->model->precision = e->cfg.precision.precision;
    // LoRA: the frozen base computes with 16-bit values too, rounded once here (its bf16 copy, with
    // bf16 activation storage, was made when the adapters were attached)
    if (engine_mixed(e) && e->model->lora)
        e->model->ops->round_to(e->model->params, e->model->capacity, e->cfg.precision.precision);
    if (!engine_mixed(e) || engine_params_are_master(e)) return 0;
    e->master = e->model->ops->alloc(e->shard_size * sizeof(float), "fp32 master weights");
    if (!e->master) return -1;
    engine_capture_master(e);
    return 0;
}

void engine_precision_free(sl_engine *e) {
    if (e->master) e->model->ops->dealloc(e->master);
    e->master = NULL;
}

void engine_capture_master(sl_engine *e) {
    if (!e->master) return;
    const sl_ops *ops = e->model->ops;
    int p = e->cfg.precision.precision;
    ops->copy(e->master, engine_step_params(e), e->shard_size * sizeof(float));
    if (e->sharded && e->zero.stage == 3) ops->round_to(e->zero.shard_params, e->shard_size, p);
    else if (e->model->lora) ops->round_to(engine_params(e), engine_total(e), p);
    else ops->round_to(e->model->params, e->model->capacity, p);
}

float engine_loss_scale(const sl_engine *e) { return (float)e->scaler.scale; }

void engine_round_grads(sl_engine *e, float *g, size_t n) {
    if (engine_mixed(e) && g) e->model->ops->round_to(g, n, e->cfg.precision.precision);
}

int engine_check_overflow(sl_engine *e, const float *g, size_t n, int *overflow) {
    const sl_loss_scaler_config *pc = &e->cfg.precision;
    int check = pc->precision == SL_PRECISION_FP16 || (pc->precision == SL_PRECISION_BF16 && pc->bf16_check_grad_overflow);
    *overflow = 0;
    if (!check) return 0;
    if (n > 0 && sl_fault_fires(rank_of(e), e->step + 1, "overflow")) {
        float inf = INFINITY;  // what an fp16 overflow leaves in a gradient
        e->model->ops->upload((float *)g, &inf, sizeof inf);
    }
    if (e->scaler.scale == 1.0) {
        e->step_sumsq = e->model->ops->sumsq(g, n);
        e->step_sumsq_known = 1;
        *overflow = !isfinite(e->step_sumsq);
    } else {
        *overflow = e->model->ops->nonfinite(g, n);
    }
    if (e->distributed && sl_comm_allreduce(e->cfg.dp, overflow, 1, SL_DTYPE_I32, SL_OP_MAX))
        return sl_error_context("agreeing on gradient overflow across data-parallel ranks");
    return 0;
}

float *engine_update_target(sl_engine *e) { return e->master ? e->master : engine_step_params(e); }

void engine_publish_master(sl_engine *e) {
    if (!e->master) return;
    const sl_ops *ops = e->model->ops;
    float *dst = engine_step_params(e);
    ops->copy(dst, e->master, e->shard_size * sizeof(float));
    ops->round_to(dst, e->shard_size, e->cfg.precision.precision);
}

// ---- the scaler in checkpoints -------------------------------------------------------------------

// The scaler's state as 7 numbers, in SCALER_KEYS order (checkpoint keys and broadcast layout).
static const char *const SCALER_KEYS[7] = {"cur_scale", "cur_iter", "last_overflow_iter", "cur_hysteresis",
                                           "skipped_steps", "scale_decreases", "scale_increases"};

static void scaler_pack(const sl_loss_scaler *s, double v[7]) {
    v[0] = s->scale;
    v[1] = (double)s->iter;
    v[2] = (double)s->last_overflow_iter;
    v[3] = s->cur_hysteresis;
    v[4] = (double)s->skipped_steps;
    v[5] = (double)s->scale_decreases;
    v[6] = (double)s->scale_increases;
}

static void scaler_unpack(sl_loss_scaler *s, const double v[7]) {
    s->scale = v[0];
    s->iter = (int64_t)v[1];
    s->last_overflow_iter = (int64_t)v[2];
    s->cur_hysteresis = (int)v[3];
    s->skipped_steps = (int64_t)v[4];
    s->scale_decreases = (int64_t)v[5];
    s->scale_increases = (int64_t)v[6];
}

void engine_scaler_to_json(const sl_engine *e, void *cjson_root) {
    const sl_loss_scaler *s = &e->scaler;
    cJSON *o = cJSON_AddObjectToObject((cJSON *)cjson_root, "loss_scaler");
    cJSON_AddStringToObject(o, "precision", sl_precision_name(e->cfg.precision.precision));
    cJSON_AddBoolToObject(o, "dynamic", s->dynamic);
    double v[7];
    scaler_pack(s, v);
    for (int i = 0; i < 7; i++) cJSON_AddNumberToObject(o, SCALER_KEYS[i], v[i]);
}

// Reads the checkpoint's scaler state when it was saved in this run's precision. A checkpoint from
// another precision (or from before mixed precision) keeps this run's fresh scaler, but its
// skipped-step count carries over so the schedule stays where it was. A static scaler keeps this
// run's configured scale.
int engine_scaler_from_json(sl_engine *e, const void *cjson_root, const char *file) {
    const cJSON *o = cJSON_GetObjectItemCaseSensitive((const cJSON *)cjson_root, "loss_scaler");
    if (!o) return 0;
    double v[7];
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, SCALER_KEYS[0]);
    if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble) || !(x->valuedouble > 0.0))
        return sl_errorf("%s: loss_scaler.cur_scale must be a finite number > 0", file);
    v[0] = x->valuedouble;
    // the counters, each range-checked before it becomes an integer (skipped steps: at most the step)
    const int64_t lo[7] = {0, 0, -1, 0, 0, 0, 0};
    const int64_t hi[7] = {0, SL_JSON_INT_EXACT, SL_JSON_INT_EXACT, INT32_MAX, e->step, SL_JSON_INT_EXACT,
                           SL_JSON_INT_EXACT};
    char where[4200];
    snprintf(where, sizeof where, "%s: loss_scaler", file);
    for (int i = 1; i < 7; i++) {
        int64_t n;
        if (sl_json_get_i64(o, SCALER_KEYS[i], &n, 1, lo[i], hi[i], where)) return -1;
        v[i] = (double)n;
    }
    sl_loss_scaler *s = &e->scaler;
    const cJSON *prec = cJSON_GetObjectItemCaseSensitive(o, "precision");
    const cJSON *dyn = cJSON_GetObjectItemCaseSensitive(o, "dynamic");
    int same = cJSON_IsString(prec) && !strcmp(prec->valuestring, sl_precision_name(e->cfg.precision.precision)) &&
               cJSON_IsBool(dyn) && cJSON_IsTrue(dyn) == s->dynamic;
    if (!same) {
        s->skipped_steps = (int64_t)v[4];
        return 0;
    }
    if (!s->dynamic) {  // the configured static scale stands
        v[0] = s->scale;
        v[3] = s->cur_hysteresis;
    }
    scaler_unpack(s, v);
    return 0;
}

int engine_scaler_broadcast(sl_engine *e) {
    if (!e->distributed) return 0;
    double v[7];
    scaler_pack(&e->scaler, v);
    if (sl_comm_broadcast(e->cfg.dp, v, 7, SL_DTYPE_F64, 0)) return -1;
    scaler_unpack(&e->scaler, v);
    return 0;
}
