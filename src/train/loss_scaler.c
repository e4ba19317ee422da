// loss_scaler.c: DeepSpeed's dynamic / static loss scaler, the "fp16" / "bf16" block parser, and the
// overflow check and unscale passes over flat fp32 gradient buffers (see loss_scaler.h).
// Invariants: sl_loss_scaler_update is DeepSpeed 0.19.8's DynamicLossScaler.update_scale statement
// for statement (the scale is a double, as the Python float is, and is only ever halved, doubled or
// clamped to min_loss_scale); a failed update (-1) changes nothing; the overflow check's answer
// depends only on the data, never on the thread count.
#include "shardlm/loss_scaler.h"
#include "shardlm/ops.h"
#include "shardlm/error.h"
#include "shardlm/json_get.h"
#include "shardlm/optim.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

// Loops shorter than this run on one thread (OpenMP start-up costs more than the work).
#define SL_OMP_MIN 32768

// ---- config ------------------------------------------------------------------------------------

void sl_loss_scaler_defaults(sl_loss_scaler_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->precision = SL_PRECISION_FP32;
    cfg->loss_scale = 0.0;
    cfg->initial_scale_power = 16;
    cfg->loss_scale_window = 1000;
    cfg->hysteresis = 2;
    cfg->consecutive_hysteresis = 0;
    cfg->min_loss_scale = 1.0;
    cfg->raise_error_at_min_scale = 1;
    cfg->bf16_check_grad_overflow = 1;
}

// Appends a + b + c to cfg->warning, "; "-separated from what is there, silently truncating.
static void add_warning(sl_loss_scaler_config *cfg, const char *a, const char *b, const char *c) {
    size_t used = strlen(cfg->warning), cap = sizeof cfg->warning - 1;
    const char *parts[4] = {used ? "; " : "", a, b, c};
    for (int i = 0; i < 4; i++)
        for (const char *p = parts[i]; *p && used < cap; p++) cfg->warning[used++] = *p;
    cfg->warning[used] = '\0';
}

// Lists keys of `block` not in `known` into cfg->warning.
static void warn_unknown(sl_loss_scaler_config *cfg, const cJSON *block, const char *const *known,
                         const char *where) {
    char list[200];
    if (sl_json_unknown_keys(block, known, list, sizeof list))
        add_warning(cfg, where, ": unknown keys ignored: ", list);
}

static const char *const FP16_KEYS[] = {"enabled", "auto_cast", "loss_scale", "initial_scale_power",
                                        "loss_scale_window", "hysteresis", "consecutive_hysteresis",
                                        "min_loss_scale", "fp16_master_weights_and_grads", NULL};
static const char *const BF16_KEYS[] = {"enabled", "immediate_grad_update", "check_grad_overflow",
                                        "bf16_master_weights_and_grads", "bf16_optimizer_states", NULL};

int sl_loss_scaler_parse(sl_loss_scaler_config *cfg, const cJSON *fp16_block, const char *where) {
    if (!fp16_block || cJSON_IsNull(fp16_block)) return 0;
    if (!cJSON_IsObject(fp16_block)) return sl_errorf("%s: must be an object", where);
    warn_unknown(cfg, fp16_block, FP16_KEYS, where);
    int enabled = 0, auto_cast = 0, master16 = 0;
    if (sl_json_get_bool(fp16_block, "enabled", &enabled, where) ||
        sl_json_get_bool(fp16_block, "auto_cast", &auto_cast, where) ||
        sl_json_get_bool(fp16_block, "fp16_master_weights_and_grads", &master16, where) ||
        sl_json_get_bool(fp16_block, "consecutive_hysteresis", &cfg->consecutive_hysteresis, where))
        return -1;
    const cJSON *ls = cJSON_GetObjectItemCaseSensitive(fp16_block, "loss_scale");
    if (ls && !cJSON_IsNull(ls)) {
        if (!cJSON_IsNumber(ls) || !isfinite(ls->valuedouble) || ls->valuedouble < 0.0)
            return sl_errorf("%s: \"loss_scale\" must be a finite number >= 0 (0 = dynamic loss scaling)", where);
        cfg->loss_scale = ls->valuedouble;
    }
    // The window and floor are checked below, only where dynamic scaling uses them (as DeepSpeed does).
    int min_scale = (int)cfg->min_loss_scale;
    if (sl_json_get_int(fp16_block, "initial_scale_power", &cfg->initial_scale_power, 0, 0, where) ||
        sl_json_get_int(fp16_block, "loss_scale_window", &cfg->loss_scale_window, 0, INT_MIN, where) ||
        sl_json_get_int(fp16_block, "hysteresis", &cfg->hysteresis, 0, 1, where) ||
        sl_json_get_int(fp16_block, "min_loss_scale", &min_scale, 0, INT_MIN, where))
        return -1;
    cfg->min_loss_scale = min_scale;
    if (cfg->initial_scale_power > 64)
        return sl_errorf("%s: \"initial_scale_power\" must be at most 64 (got %d)", where, cfg->initial_scale_power);
    if (enabled && cfg->loss_scale == 0.0) {
        if (cfg->loss_scale_window < 1)
            return sl_errorf("%s: \"loss_scale_window\" must be >= 1 with dynamic loss scaling (got %d)", where,
                             cfg->loss_scale_window);
        if (cfg->min_loss_scale < 1)
            return sl_errorf("%s: \"min_loss_scale\" must be >= 1 with dynamic loss scaling (got %g)", where,
                             cfg->min_loss_scale);
    }
    if (auto_cast) add_warning(cfg, where, ": auto_cast is not supported and is ignored", "");
    if (master16) add_warning(cfg, where, ": fp16_master_weights_and_grads is not supported and is ignored", "");
    if (enabled) cfg->precision = SL_PRECISION_FP16;
    return 0;
}

static int parse_bf16(sl_loss_scaler_config *cfg, const cJSON *block, const char *where) {
    if (!block || cJSON_IsNull(block)) return 0;
    if (!cJSON_IsObject(block)) return sl_errorf("%s: must be an object", where);
    warn_unknown(cfg, block, BF16_KEYS, where);
    int enabled = 0, ignored = 0, master = 0, states = 0;
    if (sl_json_get_bool(block, "enabled", &enabled, where) ||
        sl_json_get_bool(block, "immediate_grad_update", &ignored, where) ||
        sl_json_get_bool(block, "check_grad_overflow", &cfg->bf16_check_grad_overflow, where) ||
        sl_json_get_bool(block, "bf16_master_weights_and_grads", &master, where) ||
        sl_json_get_bool(block, "bf16_optimizer_states", &states, where))
        return -1;
    if (master || states)
        add_warning(cfg, where, ": bf16 master weights / optimizer states are not supported; fp32 is kept", "");
    if (enabled) {
        if (cfg->precision == SL_PRECISION_FP16)
            return sl_errorf("%s: bf16 and fp16 cannot both be enabled", where);
        cfg->precision = SL_PRECISION_BF16;
    }
    return 0;
}

int sl_precision_parse(sl_loss_scaler_config *cfg, const cJSON *root, const char *where) {
    sl_loss_scaler_defaults(cfg);
    if (!cJSON_IsObject(root)) return sl_errorf("%s: expected a JSON object", where);
    char w[1200];
    snprintf(w, sizeof w, "%s: fp16", where);
    if (sl_loss_scaler_parse(cfg, cJSON_GetObjectItemCaseSensitive(root, "fp16"), w)) return -1;
    const char *name = "bf16";
    const cJSON *bf16 = cJSON_GetObjectItemCaseSensitive(root, name);
    if (!bf16) bf16 = cJSON_GetObjectItemCaseSensitive(root, name = "bfloat16");
    snprintf(w, sizeof w, "%s: %s", where, name);
    return parse_bf16(cfg, bf16, w);
}

// ---- the scaler --------------------------------------------------------------------------------

int sl_loss_scaler_init(sl_loss_scaler *s, const sl_loss_scaler_config *cfg) {
    memset(s, 0, sizeof *s);
    s->last_overflow_iter = -1;
    s->scale = 1.0;
    s->hysteresis = s->cur_hysteresis = 1;
    s->window = 1;
    s->min_scale = 1.0;
    if (cfg->precision != SL_PRECISION_FP16) return 0;  // bf16 / fp32: static scale 1
    if (!(cfg->loss_scale >= 0.0) || !isfinite(cfg->loss_scale))
        return sl_errorf("fp16: loss_scale must be a finite number >= 0 (got %g)", cfg->loss_scale);
    if (cfg->loss_scale > 0.0) {
        s->scale = cfg->loss_scale;
        return 0;
    }
    if (cfg->initial_scale_power < 0 || cfg->initial_scale_power > 64 || cfg->loss_scale_window < 1 ||
        cfg->hysteresis < 1 || !(cfg->min_loss_scale > 0.0))
        return sl_errorf("fp16: invalid dynamic loss scaling settings (initial_scale_power %d, loss_scale_window %d, "
                         "hysteresis %d, min_loss_scale %g)", cfg->initial_scale_power, cfg->loss_scale_window,
                         cfg->hysteresis, cfg->min_loss_scale);
    s->dynamic = 1;
    s->scale = ldexp(1.0, cfg->initial_scale_power);
    s->hysteresis = s->cur_hysteresis = cfg->hysteresis;
    s->consecutive_hysteresis = cfg->consecutive_hysteresis;
    s->window = cfg->loss_scale_window;
    s->min_scale = cfg->min_loss_scale;
    s->raise_error_at_min_scale = cfg->raise_error_at_min_scale;
    return 0;
}

int sl_loss_scaler_update(sl_loss_scaler *s, int overflow) {
    if (!s->dynamic) {
        s->iter++;
        if (overflow) s->skipped_steps++;
        return overflow ? 1 : 0;
    }
    if (overflow) {
        if (s->hysteresis == 1 || s->cur_hysteresis == 1) {
            if (s->scale == s->min_scale && s->raise_error_at_min_scale)
                return sl_errorf("fp16: gradients overflow at iteration %lld with the loss scale already at "
                                 "min_loss_scale %g: cannot decrease it further (DeepSpeed stops the run here)",
                                 (long long)s->iter, s->min_scale);
            double next = s->scale / 2.0;
            s->scale = next > s->min_scale ? next : s->min_scale;
            s->scale_decreases++;
        } else {
            s->cur_hysteresis--;
        }
        s->last_overflow_iter = s->iter;
        s->skipped_steps++;
    } else {
        if (s->consecutive_hysteresis) s->cur_hysteresis = s->hysteresis;
        int64_t stable = s->iter - s->last_overflow_iter - 1;
        if (stable > 0 && stable % s->window == 0) {
            if (!s->consecutive_hysteresis) s->cur_hysteresis = s->hysteresis;
            s->scale *= 2.0;
            s->scale_increases++;
        }
    }
    s->iter++;
    return overflow ? 1 : 0;
}

// ---- gradient passes ---------------------------------------------------------------------------

void sl_loss_scaler_unscale(const sl_loss_scaler *s, float *g, size_t n) {
    if (s->scale == 1.0) return;
    sl_ops_cpu.scale(g, n, (float)(1.0 / s->scale));
}
