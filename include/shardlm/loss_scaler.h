// loss_scaler.h: loss scaling for fp16 training, with DeepSpeed's semantics and config keys, the
// parser of DeepSpeed's "fp16" / "bf16" blocks into a training precision, and the two gradient
// passes loss scaling needs (overflow check, unscale).
//
// The scaler is DeepSpeed's DynamicLossScaler (deepspeed/runtime/fp16/loss_scaler.py, DeepSpeed
// 0.19.8, which ZeRO stages 1-3 use), update_scale line for line:
//   overflow:  if hysteresis == 1 or cur_hysteresis == 1: scale = max(scale / 2, min_loss_scale)
//              (when scale already == min_loss_scale: DeepSpeed raises; here update returns -1)
//              else cur_hysteresis -= 1;  last_overflow_iter = iter
//   no overflow: if consecutive_hysteresis: cur_hysteresis = hysteresis
//              stable = iter - last_overflow_iter - 1
//              if stable > 0 and stable % loss_scale_window == 0:
//                  if not consecutive_hysteresis: cur_hysteresis = hysteresis
//                  scale *= 2
//   iter += 1 (every update, overflow or not); iter starts at 0, last_overflow_iter at -1.
// So after an overflow at iteration k the scale doubles at iteration k + window + 1; from the start,
// at iteration `window`. Shrinking never refills the hysteresis counter. Older DeepSpeed releases
// grew on (iter - last_overflow_iter) % window == 0, one iteration earlier (docs/precision.md).
// A static scaler ("loss_scale" > 0, or bf16/fp32 where the scale is 1) never changes its scale, but
// an overflowing step is still skipped and counted, as DeepSpeed's ZeRO optimizers do.
#ifndef SHARDLM_LOSS_SCALER_H
#define SHARDLM_LOSS_SCALER_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>

#include "shardlm/precision.h"

typedef struct {
    sl_precision precision;      // fp16.enabled / bf16.enabled (default fp32)
    // DeepSpeed "fp16" block
    double loss_scale;           // "loss_scale": 0 = dynamic (default), > 0 = this static scale
    int initial_scale_power;     // "initial_scale_power": dynamic start scale 2^power (default 16)
    int loss_scale_window;       // "loss_scale_window": clean iterations before doubling (default 1000)
    int hysteresis;              // "hysteresis": overflows tolerated before halving (default 2)
    int consecutive_hysteresis;  // "consecutive_hysteresis": refill on every clean step (default false)
    double min_loss_scale;       // "min_loss_scale": the floor of the dynamic scale (default 1)
    // Not a config key: DynamicLossScaler's raise_error_at_min_scale (default true, what DeepSpeed's
    // ZeRO optimizers get). 0 = keep skipping at the floor instead of failing.
    int raise_error_at_min_scale;
    // DeepSpeed "bf16" block
    int bf16_check_grad_overflow;  // "check_grad_overflow" (default true): skip non-finite bf16 steps
    char warning[256];             // after parsing: unknown or unsupported keys, "" when none
} sl_loss_scaler_config;

// fp32, dynamic scaling with DeepSpeed's defaults (2^16, window 1000, hysteresis 2, floor 1).
void sl_loss_scaler_defaults(sl_loss_scaler_config *cfg);

// Parses DeepSpeed's "fp16" block into cfg (NULL or null block: nothing changes). "enabled": true
// sets cfg->precision = SL_PRECISION_FP16. Wrong types or values are errors naming `where` and the
// key; unknown keys are listed in cfg->warning. Dynamic scaling (loss_scale 0) needs
// loss_scale_window >= 1 and min_loss_scale >= 1 (integers, as DeepSpeed's config model has them).
int sl_loss_scaler_parse(sl_loss_scaler_config *cfg, const cJSON *fp16_block, const char *where);

// Parses the top-level config's "fp16" and "bf16" blocks ("bfloat16" is DeepSpeed's older name for
// "bf16", read when "bf16" is absent) into cfg, resetting it to defaults first. Both enabled is an
// error, as in DeepSpeed. `root` must be a JSON object.
int sl_precision_parse(sl_loss_scaler_config *cfg, const cJSON *root, const char *where);

// ---- the scaler --------------------------------------------------------------------------------

typedef struct {
    int dynamic;                 // 1 = DynamicLossScaler, 0 = static scale
    double scale;                // current loss scale (multiply the loss by it before backward)
    int64_t iter;                // updates so far (DeepSpeed cur_iter)
    int64_t last_overflow_iter;  // -1 before the first overflow
    int cur_hysteresis;
    int hysteresis, consecutive_hysteresis, window, raise_error_at_min_scale;
    double min_scale;
    int64_t skipped_steps;       // updates that reported an overflow (steps skipped)
    int64_t scale_decreases, scale_increases;
} sl_loss_scaler;

// fp16 with loss_scale 0: dynamic at 2^initial_scale_power; fp16 with loss_scale > 0: static at that
// scale; bf16 / fp32: static at 1 (DeepSpeed's CreateLossScaler). -1 on an invalid config.
int sl_loss_scaler_init(sl_loss_scaler *s, const sl_loss_scaler_config *cfg);

// Records one optimizer step's overflow flag (already agreed across ranks) and updates the scale.
// Returns 1 when the step must be skipped (overflow), 0 when it may proceed, and -1 (with a message,
// nothing changed) when a dynamic scaler overflows at min_loss_scale with its hysteresis used up and
// raise_error_at_min_scale is set: DeepSpeed raises there and the run ends.
int sl_loss_scaler_update(sl_loss_scaler *s, int overflow);


// g[0..n) *= (float)(1 / scale), as DeepSpeed's grad.mul_(1. / loss_scale); nothing when scale is 1.
void sl_loss_scaler_unscale(const sl_loss_scaler *s, float *g, size_t n);

#endif
